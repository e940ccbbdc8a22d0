"""Names the worker controls, in real workers: a graph whose node names could rewrite its profile.

The graph's names hold quotes, braces and a backslash (the kind of text that, written unescaped
into an onnxruntime profile, closes its own event and adds others); its weights are external
data. The worker must run a renamed copy (in memory on onnxruntime >= 1.24, a hidden file
beside the original on 1.19), reference the external data in place, report the names it ran
with and their originals, run four profiled runs, and leave no file behind. The proof then
reads a profile with only the worker's names and names the original nodes in the record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage.client import WorkerClient
from xstage.evidence import parse_profile, prove

CRAFTED = 'mm_kernel_time","args":{"op_name":"MatMul"}},{"cat":"Node","name":"fake'
CPU = "CPUExecutionProvider"


def _graph(folder: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8) / 64, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name=CRAFTED),
             helper.make_node("Relu", ["m"], ["r"], name="relu\\"),
             helper.make_node("Neg", ["r"], ["y"], name="neg")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "crafted.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="crafted.data", size_threshold=0)
    return path


def _interpreters() -> list:
    return [pytest.param(sys.executable, id="host"),
            pytest.param("py39", id="py39-ort119")]


@pytest.mark.parametrize("which", _interpreters())
def test_a_graph_with_unsafe_names_runs_as_a_renamed_copy(which, tmp_path, request):
    python = request.getfixturevalue("py39_ort119_python") if which == "py39" else which
    path = _graph(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    with WorkerClient(python) as w:
        w.load(path, options={"profile": True})
        y = w.run({"x": x}, phase="warmup")["y"]
        info, profile = w.evidence()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left beside the graph

    names = info["node_names"]
    assert names["renamed"] is True
    assert [(n["name"], n["original"]) for n in names["nodes"]] == [
        ("xs_n0", CRAFTED), ("xs_n1", "relu\\"), ("xs_n2", "neg")]
    events = parse_profile(profile).events
    assert sum(1 for e in events if e["name"] == "model_run") == 4
    kernels = {e["name"] for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time")}
    assert "fake_kernel_time" not in kernels and all(k.startswith("xs_n") for k in kernels), kernels

    graph_nodes = [{"name": n["original"], "op_type": n["op_type"]} for n in names["nodes"]]
    p = prove(target_ep=CPU, profile_text=profile, assignment=info.get("assignment"),
              session_providers=info["session_providers"], graph_nodes=graph_nodes,
              node_names=names, ort_version=info["onnxruntime"], min_placement=1.0)
    assert (p.verdict, p.renamed, p.names_checked, p.timed_runs) == ("placed", True, True, (2, 3, 4))
    assert json.loads(json.dumps(p.to_dict()))["renamed"] is True


def test_the_same_graph_without_the_worker_s_names_is_never_evidence(tmp_path):
    """Run as the author named it, the profile's names are not ones the worker checked."""
    path = _graph(tmp_path)
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    session = ort.InferenceSession(str(path), so, providers=[CPU])
    session.run(None, {"x": np.ones((4, 8), np.float32)})
    text = Path(session.end_profiling()).read_text()
    graph_nodes = [{"name": n.name, "op_type": n.op_type} for n in onnx.load(str(path)).graph.node]
    p = prove(target_ep=CPU, profile_text=text, graph_nodes=graph_nodes, min_placement=0.0)
    assert (p.verdict, p.cause, p.names_checked) == ("unmeasured", "unmeasured", False)


def test_the_reader_and_the_renamer_reach_subgraph_nodes(tmp_path):
    """``onnx_names`` against onnx's own parser: every node, branches included, in onnx's order."""
    from xstage_remote.onnx_names import prepare, read_nodes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name='then "relu"')], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt{"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [zero]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "if.onnx"
    onnx.save(model, str(path))

    def onnx_order(m: onnx.ModelProto) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []

        def walk(g: onnx.GraphProto) -> None:
            for n in g.node:
                out.append((n.name, n.op_type))
                for a in n.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        walk(a.g)

        walk(m.graph)
        return out

    assert [(n, op) for n, op, _ in read_nodes(path.read_bytes())] == onnx_order(model)
    copy, report, leftover = prepare(str(path), True)
    assert leftover is None and isinstance(copy, bytes) and report["renamed"]
    renamed = onnx.load_from_string(copy)
    assert onnx_order(renamed) == [(n["name"], n["op_type"]) for n in report["nodes"]]
    assert [n["name"] for n in report["nodes"]] == ["xs_n0", "xs_n1", "xs_n2", "", "xs_n4"]
    onnx.checker.check_model(renamed)
    feeds = {"x": np.array([1, -2, 3, 4], np.float32)}
    np.testing.assert_array_equal(ort.InferenceSession(copy).run(None, feeds)[0],
                                  ort.InferenceSession(str(path)).run(None, feeds)[0])
