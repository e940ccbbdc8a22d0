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


def test_the_memory_limit_makes_it_unavailable(tmp_path):
    """The float64 copy must fit in half the available memory: 3x a 1 GiB graph does not fit
    in 4 GiB's half; the same graph fits beside 8 GiB."""
    path = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), tmp_path / "mlp.onnx")
    with pytest.raises(tiebreak.Unavailable, match=r"needs ~3072 MiB \(3x the graph's 1024 MiB\), "
                       r"over 50% of the 4096 MiB available"):
        tiebreak.evaluate_float64(path, {}, graph_bytes=2**30, available=4 * 2**30)
    tiebreak.memory_check(2**30, available=8 * 2**30)


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


def _two_scale_graph(path: Path, n: int = 64, width: int = 256, small: int = 4) -> Path:
    """A detector-like head: 1e4·(x @ W1) (large values, a 256-long sum each) concatenated
    with x @ W2 (scale 1, ``small`` of ``width + small`` columns, ~1.5% of the elements)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((64, width)) * 1e4 / 8).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((64, small)) / 8).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["big"]),
             helper.make_node("MatMul", ["x", "w2"], ["little"]),
             helper.make_node("Concat", ["big", "little"], ["y"], axis=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, width + small])
    graph = helper.make_graph(nodes, "head", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_a_bf16_block_beside_large_values_is_refused_through_the_real_float64_path(tmp_path):
    """The headline case of docs/external.md §4 end to end in the stage layer: the graph's float64 answer, a
    reference from onnxruntime, a stage that sums the large part in another order (fp32
    reordering noise, which the tie-break passes) and, in the second case, stores the small
    block in bf16 (which it refuses, naming the block's magnitude band)."""
    import ml_dtypes

    path = _two_scale_graph(tmp_path / "head.onnx")
    art = inspect_artifact(path)
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    w1, w2 = (numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer)
    big = np.zeros((64, 256), np.float32)
    for i in range(64):  # another summation order: one rank-1 update at a time
        big += np.outer(x[:, i], w1[i]).astype(np.float32)
    clean = np.concatenate([big, x @ w2], axis=1)
    fmt = {"fmt": "onnx:fp32", "reference_kind": "same_graph_cpu"}
    gate = compare({"y": clean}, {"y": ref}, **fmt)
    assert gate.cause == "elementwise"  # reordering beyond 1e-7·rms: float64 decides
    passed = tiebreak.settle(gate, art, {"x": x}, {"y": clean}, {"y": ref})
    assert passed.passed and passed.tiebreak["evaluator"] == tiebreak.EVALUATOR

    blocked = clean.copy()
    blocked[:, 256:] = blocked[:, 256:].astype(ml_dtypes.bfloat16).astype(np.float32)
    gate = compare({"y": blocked}, {"y": ref}, **fmt)
    assert gate.cause == "elementwise"
    assert compare({"y": blocked}, {"y": ref}, **fmt, tolerance={"elem_a": 1e-5}).passed  # the old a
    refused = tiebreak.settle(gate, art, {"x": x}, {"y": blocked}, {"y": ref})
    (row,) = refused.tiebreak["outputs"]
    assert refused.verdict == "failed" and refused.tiebreak["status"] == "failed"
    assert row["worst_band"]["magnitude"][1] < 8 and row["worst_band"]["ratio"] > 100
    assert "worst magnitude band" in refused.summary


# --- the noise tier: what decides when the tie-break is unavailable ---------------------------


def _reordered_head(tmp_path: Path) -> tuple:
    """The two-scale head of the test above: its graph, the CPU EP's output, and a stage that
    sums the large part in another order (fp32 noise beyond 1e-7·rms, within 1e-5·rms)."""
    path = _two_scale_graph(tmp_path / "head.onnx")
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    w1, w2 = (numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer)
    big = np.zeros((64, 256), np.float32)
    for i in range(64):
        big += np.outer(x[:, i], w1[i]).astype(np.float32)
    return inspect_artifact(path), x, np.concatenate([big, x @ w2], axis=1), ref


def test_a_stage_failing_only_the_tight_tier_passes_at_the_noise_tier(tmp_path, monkeypatch):
    """The tie-break made unavailable by its memory limit (forced to nothing): the fp32
    reordering that the float64 answer would have passed passes at the noise tier, and the
    record says which tier decided and why."""
    art, x, stage, ref = _reordered_head(tmp_path)
    fmt = {"fmt": "onnx:fp32", "reference_kind": "same_graph_cpu"}
    gate = compare({"y": stage}, {"y": ref}, **fmt)
    assert gate.cause == "elementwise"
    monkeypatch.setattr(tiebreak, "MEMORY_SHARE", 0.0)
    settled = tiebreak.settle(gate, art, {"x": x}, {"y": stage}, {"y": ref})
    assert settled.passed and settled.tiebreak["status"] == "unavailable"
    assert "its float64 copy needs" in settled.tiebreak["reason"]
    assert settled.tier["decided"] == "noise" and settled.tier["elem_a"] == 1e-5
    assert settled.tier["why"] == f"the float64 tie-break was unavailable: {settled.tiebreak['reason']}"
    doc = settled.to_dict()
    assert doc["tier"]["verdict"] == "passed" and doc["tolerance"]["elem_a"] == 1e-7


def test_a_stage_failing_the_noise_tier_stays_refused_with_unavailable(tmp_path, monkeypatch):
    art, x, stage, ref = _reordered_head(tmp_path)
    stage = stage.copy()
    stage[:2, :128] *= np.float32(1 + 3e-4)  # 1% of the elements 3e-4 relative off
    gate = compare({"y": stage}, {"y": ref}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    monkeypatch.setattr(tiebreak, "MEMORY_SHARE", 0.0)
    settled = tiebreak.settle(gate, art, {"x": x}, {"y": stage}, {"y": ref})
    assert settled.verdict == "failed" and settled.cause == "elementwise"
    assert settled.tiebreak["status"] == "unavailable" and settled.tier["verdict"] == "failed"


def test_an_explicit_elem_a_is_kept_when_the_tiebreak_is_unavailable(tmp_path, monkeypatch):
    art, x, stage, ref = _reordered_head(tmp_path)
    gate = compare({"y": stage}, {"y": ref}, fmt="onnx:fp32", reference_kind="same_graph_cpu",
                   tolerance={"elem_a": 1e-7})
    monkeypatch.setattr(tiebreak, "MEMORY_SHARE", 0.0)
    settled = tiebreak.settle(gate, art, {"x": x}, {"y": stage}, {"y": ref})
    assert settled.verdict == "failed" and settled.tiebreak["status"] == "unavailable"
    assert settled.tier is None and "tier" not in settled.to_dict()


def test_an_op_the_evaluator_lacks_decides_at_the_noise_tier(tmp_path):
    """A com.microsoft op (FusedMatMul), outside the evaluator's checked table: the tie-break
    is unavailable naming it, and the noise tier decides a reordering-sized difference
    (2e-6·rms on every element: the 12-block tower's measured size)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 64)).astype(np.float32), "w")
    node = helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=1.0)
    graph = helper.make_graph([node], "fused",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 64])], [w])
    path = tmp_path / "fused.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)],
                                ir_version=8), str(path))
    x = rng.standard_normal((32, 256)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    noise = rng.standard_normal(ref.shape) * 2e-6 * rms  # a deep graph's reordering, 2e-6·rms
    stage = (ref + noise).astype(np.float32)
    gate = compare({"y": stage}, {"y": ref}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert gate.cause == "elementwise"
    settled = tiebreak.settle(gate, inspect_artifact(path), {"x": x}, {"y": stage}, {"y": ref})
    assert settled.tiebreak["reason_code"] == "unchecked_op"
    assert "FusedMatMul (com.microsoft) 'FusedMatMul'" in settled.tiebreak["reason"]
    assert settled.passed and settled.tier["decided"] == "noise"


def test_quantized_outputs_names_only_the_outputs_of_a_quantizelinear(tmp_path):
    """A QDQ graph with a Q output and an ArgMax output: only the Q's is dequantized."""
    from xstage.stage.reference import quantized_outputs

    inits = [numpy_helper.from_array(np.array(1e-3, np.float32), "s"),
             numpy_helper.from_array(np.array(32768, np.uint16), "z"),
             numpy_helper.from_array(np.eye(4, dtype=np.int8), "w"),  # A16W8: an 8-bit weight
             numpy_helper.from_array(np.array(1.0, np.float32), "ws")]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"], name="dq"),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wdq"], name="dq_w"),
             helper.make_node("MatMul", ["x", "wdq"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"], name="q_y"),
             helper.make_node("ArgMax", ["r"], ["i"], axis=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("xq", TensorProto.UINT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT16, [2, 4]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [2, 1])], inits)
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    art = inspect_artifact(path)
    assert art.format == "onnx:a16w8"
    found = quantized_outputs(art)
    assert list(found) == ["y"] and found["y"]["node"] == "q_y"
    assert float(found["y"]["scale"]) == np.float32(1e-3)
    assert quantized_outputs(inspect_artifact(_two_scale_graph(tmp_path / "fp32.onnx"))) == {}


def test_a_stateful_stage_failing_only_the_tight_tier_passes_at_the_noise_tier(tmp_path):
    """A stateful stage (docs/serving.md, "State that stays in the worker"): no float64
    evaluation carries state between the gate's two calls, so the tie-break is unavailable for
    that reason and the noise tier decides, both calls named as the gate names them."""
    _, _, stage, ref = _reordered_head(tmp_path)
    ours, theirs = {"y": stage, "y (call 2)": stage}, {"y": ref, "y (call 2)": ref}
    gate = compare(ours, theirs, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert gate.cause == "elementwise"
    settled = tiebreak.settle_stateful(gate, ours, theirs)
    assert settled.passed and settled.tiebreak["status"] == "unavailable"
    assert settled.tiebreak["reason"] == ("a stateful stage: the float64 evaluation does not "
                                          "carry state between the gate's two calls")
    assert settled.tier["decided"] == "noise"
    worse = {k: v * np.float32(1 + 3e-4) for k, v in ours.items()}  # beyond the noise tier too
    failed = tiebreak.settle_stateful(compare(worse, theirs, fmt="onnx:fp32",
                                              reference_kind="same_graph_cpu"), worse, theirs)
    assert failed.verdict == "failed" and failed.tier["verdict"] == "failed"
