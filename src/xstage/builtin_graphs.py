"""Small ONNX graphs built in code, so the main job and the tests need no user files.

Written with IR version 8 and opset 17: every onnxruntime from 1.19 (Python 3.9's newest)
to today, and the OpenVINO builds, load them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["IR_VERSION", "OPSET", "accumulator", "builtin_stage", "matmul_chain", "mlp",
           "slice_graph", "write"]

IR_VERSION = 8
OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
        producer_name="xstage",
    )
    onnx.checker.check_model(model)
    return model


def mlp(width: int = 256, depth: int = 4, batch: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A small MLP (MatMul + Add + Relu, then Tanh): compute an EP will take whole."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    nodes.append(helper.make_node("Tanh", [prev], ["y"]))
    graph = helper.make_graph(
        nodes, "xstage_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
        inits,
    )
    return _model(graph)


def matmul_chain(depth: int, n: int, name: str = "chain", seed: int = 1) -> onnx.ModelProto:
    """``depth`` MatMuls of an n×n input by one fixed n×n weight: compute of a chosen length
    with almost no transport, for the benchmarks' stages and the fault tests' calls that must
    still be running when a worker is killed.

    The weight is scaled by 1/sqrt(n), which keeps the values' rms from layer to layer. Scaled
    by 1/n (as it was), they shrank by sqrt(n) per layer into denormals, and on the H200 host's
    Xeon a chain calibrated to 10 ms took 188 ms: denormal arithmetic, not the chain's length.
    """
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), "w")
    nodes, prev = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"]))
        prev = f"m{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    return _model(graph)


def slice_graph(n_in: int, n_out: int, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """``y = x[:n_out]``: moves n_in elements in and n_out out with almost no compute.

    The transport benchmark's stage: the worker's own time is one copy inside onnxruntime,
    reported separately, so what is left of a round trip is the transport.
    """
    if not 0 < n_out <= n_in:
        raise ValueError("need 0 < n_out <= n_in")
    starts = numpy_helper.from_array(np.array([0], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([n_out], np.int64), "ends")
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends"], ["y"])], "xstage_slice",
        [helper.make_tensor_value_info("x", dtype, [n_in])],
        [helper.make_tensor_value_info("y", dtype, [n_out])],
        [starts, ends],
    )
    return _model(graph)


def accumulator(n: int = 4, state_out: int | None = None) -> onnx.ModelProto:
    """``h_out = h_in + x; y = h_out``: the smallest stage with a state pair (``h_in`` fed back
    from ``h_out``, docs/serving.md). ``state_out`` declares ``h_out`` with another length (a
    pair whose shapes disagree, for the refusal's tests)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["h_in", "x"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y"])], "accumulator",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [state_out or n])])
    return _model(graph)


def write(model: onnx.ModelProto, path: str | Path) -> Path:
    """Save atomically (a unique temp name beside ``path``, then one rename) and return the
    path: two processes writing it at once each rename a complete graph."""
    from xstage.home import atomic_write

    return atomic_write(path, model.SerializeToString())


def builtin_stage() -> Path:
    """The built-in stage ``xstage external`` runs without ``--graph``: an MLP of 6 layers,
    512 wide, on a batch of 64 (about 0.1 GFLOP, a few milliseconds on one CPU core), written
    once into the cache."""
    from xstage.home import cache_dir, locked

    path = cache_dir() / "builtin" / "mlp-512x6-b64.onnx"
    if not path.exists():
        with locked(path.with_name(f".{path.name}.lock")):  # one process builds, the rest wait
            if not path.exists():
                write(mlp(width=512, depth=6, batch=64, seed=7), path)
    return path


#: Artifacts shipped as package data, made by ``xstage export`` (their manifests say how;
#: ``tests/export`` re-exports them and checks they still match). KB-sized, so the main job
#: needs neither torch nor transformers.
SHIPPED = {
    "vision-tower-tiny": "the Qwen3.5 vision tower, tiny config (3 blocks, 32 wide), one "
                         "64x64 image: patches [16, 1536] -> embeds [4, 48]",
    "code2wav-tiny": "Qwen3-Omni code2wav, tiny config (2 layers, 4 quantizers), 50 frames: "
                     "codes [1, 4, 50] -> wav [1, 1, 394]",
    "code2wav-stream-tiny": "the same code2wav as a streaming window: 8 new frames after 50 of "
                            "context (its receptive field, measured) kept in the worker: codes "
                            "[1, 4, 8] -> wav [1, 1, 58] (xstage.integrations.stream)",
}


def builtin_artifact(name: str) -> Path:
    """The shipped artifact ``name`` (its manifest sits beside it).

    Raises:
        UsageError: an unknown name (the message lists the known ones).
    """
    from importlib import resources

    from xstage import errors

    if name == "mlp-512x6-b64":
        return builtin_stage()
    if name not in SHIPPED:
        raise errors.UsageError(
            f"--builtin {name!r} is not one of: mlp-512x6-b64, {', '.join(SHIPPED)}")
    path = Path(str(resources.files("xstage") / "builtins" / f"{name}.onnx"))
    if not path.is_file():
        raise errors.ArtifactError(f"the built-in {name} is missing from this installation ({path})",
                                   remedy="reinstall xstage")
    return path
