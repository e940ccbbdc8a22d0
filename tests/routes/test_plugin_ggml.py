"""The plugin-EP family run live: onnxruntime-ggml through ``ort-plugin:ggml`` (docs/routes.md, "Plugin EPs").

The route comes from the ``[plugins.ggml]`` table of ``tests/fixtures/plugins/ggml.toml`` (the
same text as docs/routes.md shows), its env from ``env create``'s code (fixture ``ggml_python``,
marked ``network`` on a cache miss). An MLP of ops ggml has is placed with the proof and the
numeric gate; the same MLP plus ``Hardmax``, which ggml lacks, is refused as declined: ggml then
claims nothing, the session still lists it, and every node runs on the CPU EP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xstage.routes import HostInfo, ReasonCode, resolve

REPO = Path(__file__).resolve().parents[2]
LINUX = HostInfo(platform="linux", cpu_vendor="amd")
ROUTE = "ort-plugin:ggml"
ENV = "XSTAGE_PYTHON_ORT_PLUGIN_GGML"


def mlp(extra: str | None = None) -> onnx.ModelProto:
    """MatMul, Add, Relu, MatMul, Add (named), and optionally one more op on the output."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 8)), ("b2", (8,)))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="add1"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu1"),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"], name="mm2"),
        helper.make_node("Add", ["h4", "b2"], ["y" if extra is None else "h5"], name="add2"),
    ]
    if extra is not None:
        nodes.append(helper.make_node(extra, ["h5"], ["y"], name="extra"))
    graph = helper.make_graph(nodes, "mlp" if extra is None else f"mlp_{extra.lower()}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _library(python: Path) -> Path:
    return next(Path(python).parent.parent.glob("lib/python*/site-packages/onnxruntime_ggml/lib/*.so"))


def _external(project: Path, python: Path, graph: Path, record: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, ENV: str(python), "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "xstage", "external", "--graph", str(graph), "--route", ROUTE,
         "--runs", "3", "--warmup", "1", "--json", str(record)],
        cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_the_docs_show_the_table_the_tests_run():
    table = (REPO / "tests" / "fixtures" / "plugins" / "ggml.toml").read_text()
    body = "\n".join(line for line in table.splitlines() if not line.startswith("#"))
    assert body.strip() in (REPO / "docs" / "routes.md").read_text()


def test_ggml_resolves_step_by_step(ggml_project, ggml_python):
    status = resolve(ROUTE, host=LINUX, environ={ENV: str(ggml_python)}, cwd=ggml_project, hardware=[])
    assert status.resolved, status.reason
    assert status.devices == ("cpu",) and status.verified is False
    info = status.ep_plugin
    assert info["kind"] == "plugin" and info["ep_name"] == "ggml" and info["onnxruntime"].startswith("1.30.")
    assert info["library"].endswith("onnxruntime_ggml/lib/libonnxruntime_ggml.so")
    assert info["devices"]["cpu"]["device_type"] == "CPU"
    assert [step.split(":")[0] for step in status.steps] == [
        "locate", "located", "search path", "registered", "EP devices", "bind"]
    assert status.versions["onnxruntime_ggml"] == "0.2.0"


def test_an_mlp_of_supported_ops_is_placed_with_proof_and_gate(tmp_path, ggml_project, ggml_python):
    graph = tmp_path / "mlp.onnx"
    onnx.save(mlp(), graph)
    done = _external(ggml_project, ggml_python, graph, tmp_path / "placed.json")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "placed.json").read_text())
    assert record["plan"]["chosen"] == {"device": "cpu", "route": ROUTE}
    proof = record["proof"]
    assert (proof["verdict"], proof["basis"], proof["target_ep"]) == ("placed", "plan", "ggml")
    assert proof["node_fraction"] == 1.0 and proof["time_fraction"] == 1.0
    assert record["parity"]["verdict"] == "passed"
    attested = record["device_attestation"]
    assert (attested["planned"], attested["source"]) == ("cpu", "ep_device_api")
    ep_device = attested["ep_device"]  # which library, which EP device, which onnxruntime
    assert ep_device["library"].endswith("libonnxruntime_ggml.so") and ep_device["type"] == "CPU"
    assert ep_device["onnxruntime"].startswith("1.30.") and ep_device["ep_metadata"]["backend"] == "ggml"
    assert "weights=f32 for an onnx:fp32 artifact" in " ".join(record["worker"]["notes"])
    runtime = record["worker"]["runtime"]  # the bind is timed apart: a compile cache cannot skip it
    assert 0 < runtime["ep_bind_s"] < runtime["load_s"]


def test_the_same_mlp_plus_an_op_ggml_lacks_is_declined(tmp_path, ggml_project, ggml_python):
    graph = tmp_path / "mlp_hardmax.onnx"
    onnx.save(mlp("Hardmax"), graph)
    done = _external(ggml_project, ggml_python, graph, tmp_path / "declined.json")
    assert done.returncode == 2, done.stdout + done.stderr
    record = json.loads((tmp_path / "declined.json").read_text())
    (refusal,) = record["outcome"]["refusals"]
    assert (refusal["code"], refusal["cause"], refusal["route"]) == (
        "execution_provider_declined_graph", "declined", ROUTE)
    proof = refusal["evidence"]
    assert proof["verdict"] == "declined" and proof["fraction"] == 0.0
    assert proof["session_providers"] == ["ggml", "CPUExecutionProvider"]  # listed, and took nothing
    assert set(proof["cpu_nodes"]) == {"Gemm", "Relu", "Hardmax"}


def test_a_table_naming_the_library_by_path(tmp_path, ggml_python, trusted_toml):
    library = _library(ggml_python)
    trusted_toml(tmp_path,
        f'[plugins.ggml-path]\nlibrary = "{library}"\nep_name = "ggml"\nonnxruntime = ">=1.29,<1.31"\n')
    environ = {"XSTAGE_PYTHON_ORT_PLUGIN_GGML_PATH": str(ggml_python)}
    status = resolve("ort-plugin:ggml-path", host=LINUX, environ=environ, cwd=tmp_path, hardware=[])
    assert status.resolved, status.reason
    assert status.ep_plugin["library"] == str(library)


def test_a_dependency_that_does_not_load_is_named(tmp_path, ggml_python, trusted_toml):
    """The ggml library copied away from the libgomp its RPATH points at: step 3 fails for real."""
    library = _library(ggml_python)
    copy = tmp_path / "alone" / library.name
    copy.parent.mkdir()
    shutil.copyfile(library, copy)
    trusted_toml(tmp_path,
        f'[plugins.alone]\nlibrary = "{copy}"\nep_name = "ggml"\nonnxruntime = ">=1.29,<1.31"\n')
    environ = {"XSTAGE_PYTHON_ORT_PLUGIN_ALONE": str(ggml_python)}
    status = resolve("ort-plugin:alone", host=LINUX, environ=environ, cwd=tmp_path, hardware=[])
    assert status.reason_code is ReasonCode.EP_DEPENDENCY_NOT_LOADABLE
    assert re.search(r"libgomp-[0-9a-f]+\.so\.1\.0\.0: cannot open shared object file", status.reason)
    assert status.steps[-1].startswith("register: ")


def test_a_route_that_asks_for_the_eps_report_is_unmeasured_without_one(tmp_path, ggml_python, trusted_toml):
    """The report plumbing for real: the worker points XLNX_ONNX_EP_REPORT_FILE into its scratch
    folder and reads it back; ggml writes none, so a route whose table asks for the VitisAI
    report is refused as unmeasured (rule 7a), though onnxruntime's layers show it placed."""
    trusted_toml(tmp_path,
        '[plugins.ggml-report]\nmodule = "onnxruntime_ggml"\nep_name = "ggml"\nonnxruntime = ">=1.29,<1.31"\n'
        'formats = ["onnx:fp32"]\nreport = "vitisai"\n[plugins.ggml-report.options]\ndevice = "cpu"\n'
        '[plugins.ggml-report.format_options."onnx:fp32"]\nweights = "f32"\n')
    graph = tmp_path / "mlp.onnx"
    onnx.save(mlp(), graph)
    env = {**os.environ, "XSTAGE_PYTHON_ORT_PLUGIN_GGML_REPORT": str(ggml_python),
           "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "xstage", "external", "--graph", str(graph),
         "--route", "ort-plugin:ggml-report", "--runs", "1", "--warmup", "0",
         "--json", str(tmp_path / "r.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    (refusal,) = json.loads((tmp_path / "r.json").read_text())["outcome"]["refusals"]
    assert (refusal["code"], refusal["cause"]) == ("execution_provider_declined_graph", "unmeasured")
    proof = refusal["evidence"]
    assert proof["node_fraction"] == 1.0  # onnxruntime's layers alone would have placed it
    assert proof["ep_report"]["problems"] == ["the EP wrote no report"]
    assert any("vitisai_ep_report.json" in note for note in proof["notes"])
