"""The split check judges the composed outputs by the numeric gate's rules, not by the tight
tier alone: a difference the gate admits (through its float64 tie-break) passes; one it does
not fails."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.bisect.graph import load_graph
from xstage.bisect.run import _check_split
from xstage.bisect.split import SplitRun

K = 4096


def _matmul(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, 64)).astype("f4")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, K))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (8, 64))],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = builtin_graphs.write(model, tmp_path / "mm.onnx")
    x = rng.standard_normal((8, K)).astype("f4")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    chunked = np.zeros_like(ref)  # the same sums in another order: fp32 reordering only
    for k in range(0, K, 512):
        chunked += x[:, k:k + 512] @ w[k:k + 512]
    return path, x, w, ref, chunked


def test_a_reordering_the_tight_tier_refuses_passes_through_the_tie_break(tmp_path):
    path, x, _, ref, chunked = _matmul(tmp_path)
    art = inspect_artifact(path)
    try:
        g = load_graph(art.path, art.format)
        check = _check_split(SplitRun({"y": chunked}, ()), {"y": ref}, g, art, {"x": x})
    finally:
        art.release()
    assert check["max_abs_diff"] > 0 and check["passed"] is True
    assert check["tiebreak"] == "passed", check  # the tight tier failed, float64 sided with it


def test_a_wrong_composition_fails_the_check(tmp_path):
    path, x, _, ref, _ = _matmul(tmp_path)
    art = inspect_artifact(path)
    try:
        g = load_graph(art.path, art.format)
        check = _check_split(SplitRun({"y": ref * 1.001}, ()), {"y": ref}, g, art, {"x": x})
    finally:
        art.release()
    assert check["passed"] is False
