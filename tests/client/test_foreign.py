"""The worker package in foreign interpreters: Python 3.9, onnxruntime 1.19.2, OpenVINO."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from xstage.client import WorkerClient
from xstage.client.staging import staged_root


def test_python39_worker_says_hello_with_its_versions_and_computes(py39_ort119_python, graphs):
    """A real second interpreter: 3.9 + onnxruntime 1.19.2 (the legacy paths), same numbers."""
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(py39_ort119_python) as w:
        versions = w.hello["worker"]["versions"]
        assert versions["python"].startswith("3.9.") and versions["onnxruntime"] == "1.19.2"
        w.load(graphs["mlp"])
        y = w.run({"x": x})["y"]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_worker_package_imports_nothing_from_xstage(py39_ort119_python):
    """Alone on a 3.9 path with only numpy and onnxruntime, every module imports."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import xstage_remote, xstage_remote.wire, xstage_remote.shm, xstage_remote.worker,"
        " xstage_remote.ort_runtime, xstage_remote.onnx_names, xstage_remote.probe, xstage_remote.__main__;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'xstage'))"
    )
    out = subprocess.run([py39_ort119_python, "-E", "-s", "-c", code, str(staged_root())],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_openvino_worker_runs_a_graph_on_the_openvino_ep(openvino_python, graphs, monkeypatch):
    """The ort-openvino environment: the session really holds the OpenVINO EP."""
    from xstage.routes import resolve

    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(openvino_python))
    status = resolve("ort-openvino")
    assert status.resolved, status.reason
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    from xstage.routes.launch import load_options

    with WorkerClient(openvino_python, route="ort-openvino") as w:
        loaded = w.load(graphs["mlp"], options=load_options(status))
        assert loaded["info"]["providers"][0] == "OpenVINOExecutionProvider"
        y = w.run({"x": x})["y"]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(sys.platform != "linux", reason="pyenv layout")
def test_worker_sources_compile_under_python39():
    """Python 3.9 syntax, checked by a 3.9 compiler where pyenv has one."""
    import glob
    import os

    pythons = sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python"))
    if not pythons:
        pytest.skip("no Python 3.9 here")
    root = staged_root() / "xstage_remote"
    files = [str(p) for p in root.glob("*.py")]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([pythons[0], "-m", "py_compile", *files], check=True, env=env)
