"""vLLM-Omni's external-stage call sites, unchanged, on ``xstage.integrations.vllm_omni``.

``vllm_omni_calls.py`` makes the engine's calls (written from reading its code: the same calls,
order, argument names and types) against the built-in tower ``vision-tower-tiny``. The engine
plans over the integrated GPU and the NPU only, and this machine has neither, so the engine's
scope refuses everything here; the placed case goes through a simulated iGPU row routed to
ort-openvino, which stands for this machine's CPU (``extra["xstage_device"] = "cpu"``): the
proof, the attestation and the report's ``device_name`` say ``cpu``. A second simulation is
``tests/adversarial``'s: an iGPU row added to xstage's own device table, ort-openvino driving it
with OpenVINO's CPU plugin; the engine's node count (156 of 156) would admit it, and xstage
refuses it (``device_mismatch``).

The same sequences run under Python 3.10 (the cached ``py310-cpu`` venv that
``tests/test_install.py`` builds) as a subprocess: ``vllm_omni_calls.py CONFIG.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xstage
from xstage import device_table
from xstage.builtin_graphs import builtin_artifact
from xstage.host import hardware as hw
from xstage.integrations import vllm_omni as vo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_omni_calls as calls  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GRAPH = str(builtin_artifact("vision-tower-tiny"))


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch, openvino_python: Path, py39_ort119_python: Path) -> None:
    """ort-openvino in its test env; ort-cpu on onnxruntime 1.19 (the engine names no ort-cpu here)."""
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(openvino_python))
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_CPU", str(py39_ort119_python))


def _placed_checks(record: dict) -> None:
    assert record["exit"] == 0, record.get("refused")
    report, plan = record["report"], record["plan"]
    assert plan["admitted"] and plan["device"]["device_id"] == "gpu_integrated:intel"
    assert plan["route"]["name"] == "ort-openvino" and plan["xstage_device"] == "cpu"
    assert report["fraction_on_target"] == 1.0 and report["target_nodes"] == report["total_nodes"] > 0
    assert report["session_create_s"] > 0 and report["warmup_s"] > 0
    assert report["device_name"] == "cpu"  # what ran it, not what the row is called
    assert "time fraction" in report["note"] and "reference same_graph_cpu" in report["note"]
    assert record["outputs"] == {"embeds": [4, 48]} and len(record["timings"]) == 3
    assert all(t["round_trip_s"] >= t["worker_s"] > 0 for t in record["timings"])
    stats = record["stats"]
    assert set(stats) == {"runs", "total_run_s", "rss_bytes", "peak_rss_bytes", "report"}
    assert stats["runs"] == 3 and stats["rss_bytes"] > 0 and stats["peak_rss_bytes"] >= stats["rss_bytes"]
    budget = {r["purpose"]: r for r in plan["reservations"]}
    assert budget["runtime"]["actual_upper_bound_bytes"] == report["rss_bytes"]
    assert Path(report["profile_path"]).is_file()


def _missing_npu_checks(record: dict) -> None:
    assert record["exit"] == 2 and not record["plan"]["admitted"]
    (refusal,) = record["plan"]["refusals"]
    assert refusal["code"] == "device_unreachable_from_this_process" and refusal["device_id"] == "npu:amd"


def _backend_checks(doc: dict) -> None:
    plan = doc["execution_plan"]
    assert plan["placement"]["fraction_on_target"] == 1.0
    assert plan["placement"]["node_counts"] == {"OpenVINOExecutionProvider": plan["placement"]["total_nodes"]}
    assert plan["route"]["ep"] == "openvino" and plan["worker"]["op"] == "hello"
    assert doc["outputs"] == {"embeds": [4, 48]} and doc["drained"] is True and doc["terminated_again"]


def test_external_sequence_placed_through_the_simulated_igpu(routes: None, tmp_path: Path) -> None:
    devices = [*vo.enumerate_devices(), calls.simulated_igpu_row(vo)]
    record = calls.external_sequence(vo, devices, GRAPH, profile_dir=str(tmp_path / "profiles"))
    _placed_checks(record)
    assert "REFUSED" not in record["summaries"][0]


def test_missing_npu_is_refused_with_the_seeds_code(routes: None) -> None:
    """``--device npu:amd`` on a machine with no NPU: refused at planning, ExternalStage raises."""
    record = calls.external_sequence(vo, vo.enumerate_devices(), GRAPH, require="npu:amd")
    _missing_npu_checks(record)
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    plan = vo.plan_external_stage(artifact, vo.enumerate_devices(), require="npu:amd")
    with pytest.raises(vo.PlacementRefused) as refused:
        vo.ExternalStage(plan)
    assert refused.value.refusal.code == "device_unreachable_from_this_process"
    # The engine's own row for an NPU it found and cannot reach (its enumerate_devices makes one).
    npu = vo.DeviceCapability(device_id="npu:amd", kind="npu", vendor="amd", name="XDNA2", backend=None,
                              runnable=False, memory_pool="host_ram", memory_bytes=0, compute_capability=None,
                              weight_formats=frozenset(), evidence="D", reason="ort-vitisai: no interpreter")
    plan = vo.plan_external_stage(artifact, [npu], require="npu:amd")
    (refusal,) = plan.refusals
    assert (refusal.code, refusal.cause, refusal.message) == (
        "device_unreachable_from_this_process", "route_missing", "ort-vitisai: no interpreter")


def test_engine_scope_refuses_the_cpu(routes: None) -> None:
    """The engine's kinds leave this machine's CPU out; ``kinds=`` widens them."""
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    rows = vo.enumerate_devices()
    assert not vo.plan_external_stage(artifact, rows).admitted
    wide = vo.plan_external_stage(artifact, rows, kinds=("gpu_integrated", "npu", "cpu"))
    assert wide.admitted and wide.device.device_id == "cpu" and wide.budget_bytes > 0
    # xstage's own selectors say the same scope: prefer the two classes, nothing else is tried.
    scoped = xstage.plan(GRAPH, prefer=list(vo.ENGINE_KINDS))
    assert scoped.candidates == () and scoped.considered == vo.ENGINE_KINDS
    assert {r.code.value for r in scoped.refusals} == {"device_unreachable_from_this_process"}


def test_budget_is_checked_at_planning(routes: None) -> None:
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    plan = vo.plan_external_stage(artifact, [calls.simulated_igpu_row(vo)], pool_capacity_bytes=1 << 20)
    (refusal,) = plan.refusals
    assert not plan.admitted and refusal.code == "budget_exceeds_device" and refusal.cause == "over_budget"


def _xstage_igpu(report: device_table.DeviceReport) -> device_table.DeviceReport:
    """``tests/adversarial``'s simulation: an iGPU row that ort-openvino drives with device_type CPU."""
    igpu = hw.Device(id="gpu_integrated:intel", kind="gpu_integrated", vendor="intel",
                     name="Intel(R) Graphics (simulated)", pool="host_ram", memory_bytes=0,
                     available_bytes=0, sources=("simulated by tests/integrations",))
    ov = report.route("ort-openvino")
    plugin = dict(ov.ep_plugin or {})
    plugin["device_options"] = {**dict(plugin.get("device_options") or {}), igpu.id: {"device_type": "CPU"}}
    ov = dataclasses.replace(ov, devices=(*ov.devices, igpu.id), ep_plugin=plugin)
    routes = tuple(ov if r.name == ov.name else r for r in report.routes)
    rows = device_table.assemble([row.device for row in report.devices] + [igpu], routes)
    return device_table.DeviceReport(devices=rows, routes=routes, host=report.host)


def test_an_igpu_that_is_the_cpu_is_refused_where_the_engine_would_admit(routes: None) -> None:
    table = _xstage_igpu(device_table.devices())
    rows = vo.enumerate_devices(table)
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    plan = vo.plan_external_stage(artifact, rows, require="gpu_integrated:intel", report=table)
    assert plan.admitted and plan.route.name == "ort-openvino"
    stage = vo.ExternalStage(plan)
    with pytest.raises(vo.PlacementRefused) as refused:
        stage.open(calls.synthetic_inputs(artifact.input_spec))
    stage.close()
    got = refused.value
    assert (got.refusal.code, got.refusal.cause) == ("execution_provider_declined_graph", "device_mismatch")
    assert got.report is not None and got.report.fraction_on_target == 1.0  # the engine's gate passes it
    assert vo.verify_placement(plan, got.report) is None
    assert plan.refusals[-1] == got.refusal


def test_backend_sequence(routes: None, tmp_path: Path) -> None:
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    manifest = calls.write_bundle(GRAPH, tmp_path / "bundle", calls.synthetic_inputs(artifact.input_spec))
    doc = calls.backend_sequence(vo, {"manifest": str(manifest), "route": "ort-openvino",
                                      "allowed_providers": ["OpenVINOExecutionProvider"],
                                      "profile_prefix": str(tmp_path / "prof" / "tower_")},
                                 reserved_bytes=1 << 30)
    _backend_checks(doc)
    assert (tmp_path / "prof" / "tower_placement.json").is_file()


def test_backend_refuses_a_bundle_that_does_not_hash_the_graph(routes: None, tmp_path: Path) -> None:
    artifact = vo.build_graph_artifact(GRAPH, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    manifest = calls.write_bundle(GRAPH, tmp_path / "bundle", calls.synthetic_inputs(artifact.input_spec))
    (manifest.parent / "graph.onnx").write_bytes(b"changed")
    with pytest.raises(ValueError, match="digest mismatch: graph.onnx"):
        vo.ArtifactManifest.read(manifest)
    worker = vo.ExternalWorker(vo.resolve_route("ort-openvino"), start_timeout_s=120.0,
                               max_payload_bytes=1 << 20)
    worker.start()
    with pytest.raises(ValueError, match="does not hash"):
        worker.load(GRAPH, artifact_files=[manifest])
    assert worker.terminate() is True


def test_backend_payload_limit(routes: None) -> None:
    worker = vo.ExternalWorker(vo.resolve_route("ort-openvino"), start_timeout_s=120.0,
                               max_payload_bytes=1024)
    worker.start()
    with pytest.raises(vo.WorkerStartError):
        worker.start()
    worker.load(GRAPH)  # no example inputs: xstage synthesizes them (the note says so)
    assert "synthesized" in worker.report.note
    with pytest.raises(vo.WorkerStartError, match="already holds a graph"):
        worker.load(GRAPH)
    with pytest.raises(vo.PayloadTooLarge):
        worker.run({"patches": np.zeros((16, 1536), np.float32)})
    assert worker.terminate() is True


def test_unavailable_route_raises_at_construction(routes: None) -> None:
    route = vo.resolve_route("ort-vitisai")
    assert not route.available and route.reason
    with pytest.raises(vo.WorkerStartError, match="ort-vitisai is not available"):
        vo.ExternalWorker(route, start_timeout_s=120.0, max_payload_bytes=8 << 20)


def _py310() -> Path:
    """The cached 3.10 venv tests/test_install.py uses, built here when this test runs first."""
    from tests.test_install import py310_venv

    return py310_venv()


def test_the_same_sequences_under_python310(routes: None, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"graph": GRAPH, "work": str(tmp_path / "work")}))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run([str(_py310()), str(Path(calls.__file__)), str(config)], capture_output=True,
                          text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["python"] == [3, 10]
    _placed_checks(doc["placed"])
    _missing_npu_checks(doc["missing_npu"])
    _backend_checks(doc["backend"])


@pytest.mark.parametrize("with_source", [True, False], ids=["fp32-source", "no-source"])
def test_quantized_artifact_note_names_the_reference(routes: None, tmp_path: Path, with_source: bool) -> None:
    """An A16W8 graph is gated as xstage gates it: against its fp32 source when its manifest
    names one, else against itself on the CPU; the report's note says which."""
    from xstage import builtin_graphs
    from xstage.export.quantize import quantize_a16w8

    fp32 = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2, batch=4), tmp_path / "mlp.onnx")
    quantized = tmp_path / "mlp.a16w8.onnx"
    quantize_a16w8(fp32, quantized, synthetic=8)
    if not with_source:
        manifests = list(tmp_path.glob("*.manifest.json"))
        assert manifests
        for manifest in manifests:
            manifest.unlink()
    row = dataclasses.replace(calls.simulated_igpu_row(vo), weight_formats=frozenset({"onnx:a16w8"}))
    artifact = vo.build_graph_artifact(str(quantized), fmt="onnx:a16w8", opset=21, source_model="-",
                                       component="mlp", exporter="xstage.export.quantize")
    plan = vo.plan_external_stage(artifact, [row])
    with vo.ExternalStage(plan) as stage:
        report = stage.open(calls.synthetic_inputs(artifact.input_spec))
    reference = "fp32_source" if with_source else "same_graph_cpu"
    assert f"reference {reference} at onnx:a16w8/{reference}" in report.note, report.note


def test_example_swaps_the_backend(routes: None) -> None:
    """``examples/vllm_omni_backend.py``: the engine's scope refused here (exit 2), widened to the CPU
    placed (exit 0), and the backend's worker drained."""
    example = REPO / "examples" / "vllm_omni_backend.py"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(example), *flags], capture_output=True, text=True,
                              env=env, timeout=600, stdin=subprocess.DEVNULL)

    refused = run()
    assert refused.returncode == 2 and "device_unreachable_from_this_process" in refused.stdout
    placed = run("--kinds", "gpu_integrated,npu,cpu", "--runs", "2")
    assert placed.returncode == 0, placed.stdout + placed.stderr
    assert "-> cpu via" in placed.stdout and "2 runs: device" in placed.stdout
    worker = run("--backend")
    assert worker.returncode == 0 and "drained: True" in worker.stdout, worker.stdout + worker.stderr
