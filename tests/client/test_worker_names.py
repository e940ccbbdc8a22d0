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
