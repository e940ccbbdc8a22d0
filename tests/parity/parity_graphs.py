"""Graphs and helpers for the numeric-gate tests: real graphs, run by real onnxruntimes.

Imported by the tests as ``parity_graphs`` (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs


@dataclass(frozen=True)
class SigmoidMap:
    """A Conv→Add→Relu→Conv→Add→Sigmoid map whose outputs all sit near 1e-7..4e-6."""

    model: bytes
    x: np.ndarray
    weights: dict[str, np.ndarray]


def sigmoid_map(bias: float = -14.0, channels: int = 16, size: int = 32, seed: int = 0) -> SigmoidMap:
    """A sparse sigmoid map: every pre-activation is very negative (``bias`` dominates).

    The explicit ``Add`` after each ``Conv`` is what onnxruntime fuses into the Conv at
    ``ORT_ENABLE_ALL`` (and not at ``ORT_DISABLE_ALL``): the bias is then added inside the
    convolution's accumulation, which changes the last bits of the pre-activations.
    """
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    b1 = (rng.standard_normal((1, channels, 1, 1)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((1, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    b2 = np.array([bias], np.float32)
    weights = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "b2"], ["a2"]),
        helper.make_node("Sigmoid", ["a2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "sparse_sigmoid_map",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, size, size])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", builtin_graphs.OPSET)],
        ir_version=builtin_graphs.IR_VERSION,
    )
    onnx.checker.check_model(model)
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    return SigmoidMap(model.SerializeToString(), x, weights)


def run_cpu(
    model: bytes | str, feeds: dict[str, np.ndarray], level: str = "ORT_ENABLE_ALL"
) -> list[np.ndarray]:
    """Run on this interpreter's onnxruntime CPU EP at an optimization level, one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def mlp_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same MLP with fp16 weights and fp16 inputs/outputs (an ``onnx:fp16`` artifact)."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    for init in half.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in list(half.graph.input) + list(half.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return half


def mlp_input(width: int = 256, batch: int = 8) -> np.ndarray:
    """An input for the built-in MLP (standard normal, fixed seed)."""
    return np.random.default_rng(1).standard_normal((batch, width)).astype(np.float32)


def rel_l2(y: np.ndarray, r: np.ndarray) -> float:
    """‖y−r‖/‖r‖ in float64, independently of xstage.parity (to cross-check it)."""
    y64, r64 = np.asarray(y, np.float64), np.asarray(r, np.float64)
    return float(np.linalg.norm(y64 - r64) / np.linalg.norm(r64))
