"""``xstage.stage.tiebreak``: the float64 evaluation, its limits, and each ``unavailable`` reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.parity import compare
from xstage.stage import tiebreak


def _failed_gate():
    r = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    y = r * np.float32(1.01)
    return compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu"), y, r


def test_the_mlp_in_float64_matches_onnxruntime_to_fp32_precision(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), tmp_path / "mlp.onnx")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    exact = tiebreak.evaluate_float64(path, {"x": x})
    (ref,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    assert exact["y"].dtype == np.float64
    assert np.max(np.abs(exact["y"] - ref)) < 1e-5 * max(1.0, float(np.max(np.abs(ref))))


def test_inference_batchnorm_of_opset_11_uses_the_running_statistics(tmp_path):
    """ReferenceEvaluator's own opset-9..13 BN used the batch's statistics (momentum is filled
    from the schema): the tie-break computes the one-output inference form, as onnxruntime."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in {
        "s": rng.uniform(0.5, 2, 4), "b": rng.standard_normal(4), "m": rng.standard_normal(4),
        "v": rng.uniform(0.5, 2, 4)}.items()]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5,
                            momentum=0.9)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])
    graph = helper.make_graph([node], "bn", [x_info], [y_info], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    path = tmp_path / "bn.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    assert np.max(np.abs(tiebreak.evaluate_float64(path, {"x": x})["y"] - ref)) < 1e-5


def test_the_time_limit_makes_it_unavailable(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), tmp_path / "mlp.onnx")
    with pytest.raises(tiebreak.Unavailable, match="passed its 0 s limit"):
        tiebreak.evaluate_float64(path, {"x": np.ones((8, 64), np.float32)}, time_limit_s=0.0)


def test_the_size_limit_makes_it_unavailable(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), tmp_path / "mlp.onnx")
    with pytest.raises(tiebreak.Unavailable, match="over the tie-break's 256 MiB limit"):
        tiebreak.evaluate_float64(path, {}, graph_bytes=tiebreak.MAX_GRAPH_BYTES + 1)


def test_a_torch_program_is_unavailable_with_its_reason(tmp_path):
    gate, y, r = _failed_gate()
    path = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), tmp_path / "mlp.onnx")
    art = replace(inspect_artifact(path), format="pt:fp32")
    settled = tiebreak.settle(gate, art, {}, {"y": y}, {"y": r})
    assert settled.verdict == "failed" and settled.tiebreak["status"] == "unavailable"
    assert "torch program" in settled.tiebreak["reason"]


def test_a_passed_gate_is_returned_unchanged(tmp_path):
    r = np.ones((2, 2), np.float32)
    gate = compare({"y": r}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert tiebreak.settle(gate, None, {}, {"y": r}, {"y": r}) is gate


def test_an_fp16_graph_is_widened_whole(tmp_path: Path):
    """fp16 initializers, inputs and outputs all come back float64."""
    half = builtin_graphs.mlp(width=32, depth=1)
    for init in half.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in (*half.graph.input, *half.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    path = builtin_graphs.write(half, tmp_path / "half.onnx")
    out = tiebreak.evaluate_float64(path, {"x": np.ones((8, 32), np.float16)})
    assert out["y"].dtype == np.float64


def test_layer_normalization_evaluates_in_float64(tmp_path):
    """Widening LayerNormalization's stash_type to double made ReferenceEvaluator refuse it
    (it implements stash_type 1 only, in the input's precision): every transformer graph's
    tie-break was ``unavailable``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in "sb"]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5, stash_type=1)
    graph = helper.make_graph([node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    exact = tiebreak.evaluate_float64(path, {"x": x})["y"]
    assert exact.dtype == np.float64 and np.max(np.abs(exact - ref)) < 1e-5
