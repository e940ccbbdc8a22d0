"""The float64 evaluator's checked table: every row against onnxruntime's fp32 CPU kernel at its
version, the graphs it must cover, and a node outside it making the tie-break ``unavailable``.

The cases are ``f64_cases``'s: the onnx wheel's node cases at the row's version, and cases built
for the versions no node case reaches. The default run takes up to :data:`FAST` cases a row;
the ``slow`` sweep takes every case of every row.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from stage import f64_cases
from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.parity import compare
from xstage.stage import f64_table, tiebreak

REPO = Path(__file__).resolve().parents[2]
ROWS = sorted(f64_table.CHECKED)
#: Cases per row in the default run (the node cases first, then the built ones).
FAST = 2
LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                                      "light", "*.onnx")))


def _check_row(row: tuple[str, str, int], folder: Path, limit: int | None) -> None:
    checked, failed, skipped = [], [], []
    for case in f64_cases.cases(row, limit=limit):
        why = f64_cases.check(case, folder)
        if why is None:
            checked.append(f"{case.name} ({case.how})")
        elif why.startswith("skip: "):
            skipped.append(f"{case.name}: {why}")
        else:
            failed.append(f"{case.name} ({case.how}): {why}")
    assert not failed, (f"{row}: the float64 answer differs from onnxruntime's fp32 kernel:\n"
                        + "\n".join(failed))
    assert checked, f"{row}: no case checks this row (skipped: {skipped})"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[1]}-{r[2]}")
def test_each_row_matches_onnxruntime_at_its_version(row, tmp_path):
    """Up to FAST cases a row, each at the row's version: the evaluator's float64 answer is
    onnxruntime's fp32 CPU output to fp32's rounding (f64_cases.RTOL)."""
    _check_row(row, tmp_path, FAST)


@pytest.mark.slow(reason="every case of every row: the default run takes up to FAST a row")
@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[1]}-{r[2]}")
def test_each_row_on_every_case(row, tmp_path):
    """The sweep: every node case of the op that reaches the row's version, and every built one."""
    _check_row(row, tmp_path, None)


def _missing(paths: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in paths:
        model = onnx.load(path, load_external_data=False)
        outside = f64_table.unchecked(model)
        if outside:
            out[os.path.basename(path)] = outside
    return out


def test_the_table_covers_the_light_zoo_and_the_builtins():
    """Every (op, version) of the onnx wheel's light model zoo (opset 9), the shipped built-ins
    and the code-built ones is a checked row."""
    assert len(LIGHT) == 9
    shipped = sorted(glob.glob(str(REPO / "src" / "xstage" / "builtins" / "*.onnx")))
    assert shipped
    assert _missing(LIGHT + shipped) == {}
    for model in (builtin_graphs.mlp(), builtin_graphs.matmul_chain(2, 4), builtin_graphs.slice_graph(8, 4),
                  builtin_graphs.accumulator()):
        assert f64_table.unchecked(model) == []


def test_the_table_covers_the_thirdparty_graphs(thirdparty_graphs):
    """Every (op, version) of the third-party test graphs (tests/thirdparty.py), fetched into
    the test cache first where a cold cache lacks them."""
    assert _missing([str(p) for p in thirdparty_graphs.values()]) == {}


def test_a_subgraph_node_outside_the_table_is_named(tmp_path):
    """An If whose branch holds an opset-11 Hardmax (no row: it coerces to 2-D, and onnx's
    kernel reads it as Hardmax-13): the evaluation is unavailable, naming it."""
    then = helper.make_graph([helper.make_node("Hardmax", ["x"], ["t"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "if", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(path))
    with pytest.raises(tiebreak.Unavailable, match=r"not been checked on Hardmax-11 'inner'") as caught:
        tiebreak.evaluate_float64(path, {"c": np.array(True), "x": np.ones((2, 3), np.float32)})
    assert caught.value.code == "unchecked_op"


def test_an_op_at_a_version_outside_the_table_is_named(tmp_path):
    """Relu is checked at 6 and 14; an opset-1 Relu (since_version 1) is not."""
    node = helper.make_node("Relu", ["x"], ["y"], name="old")
    graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 5)], ir_version=3)
    assert f64_table.unchecked(model) == ["Relu-1 'old'"]


def test_opset9_softmax_is_evaluated_with_opset9_semantics():
    """The light SqueezeNet (opset 9, Softmax on (1, 1000, 1, 1), axis default 1, coerced to 2-D):
    its float64 answer is onnxruntime's output to fp32 rounding, where the opset-13 reading
    (axis -1, one element per softmax) made every element 1."""
    path = Path(next(p for p in LIGHT if p.endswith("light_squeezenet.onnx")))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"data_0": x})
    exact = tiebreak.evaluate_float64(path, {"data_0": x})["softmaxout_1"]
    assert exact.shape == (1, 1000, 1, 1)
    assert abs(float(exact.sum()) - 1.0) < 1e-12
    assert float(np.max(np.abs(exact - ref))) < 1e-6 * float(np.max(ref))


def test_a_graph_outside_the_table_leaves_the_fp32_verdict_standing(tmp_path):
    """settle() on a graph with an unchecked op: ``unavailable`` with reason_code
    ``unchecked_op``, never a pass (the stage here is 1% off: refused at the noise tier too)."""
    node = helper.make_node("Hardmax", ["x"], ["y"], name="hm")
    graph = helper.make_graph([node], "hm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])])
    path = tmp_path / "hm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(path))
    r = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    y = r * np.float32(1.01)
    gate = compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    settled = tiebreak.settle(gate, inspect_artifact(path), {"x": r}, {"y": y}, {"y": r})
    assert settled.verdict == "failed"
    assert settled.tiebreak["status"] == "unavailable" and settled.tiebreak["reason_code"] == "unchecked_op"
    assert "Hardmax-11 'hm'" in settled.tiebreak["reason"]
