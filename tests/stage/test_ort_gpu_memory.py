"""Device memory for the ORT GPU routes: the worker's NVML (and DXGI) reader and the ledger.

The CUDA and TensorRT EPs keep their tensors on an NVIDIA GPU, so the ORT worker reports the
memory NVML attributes to its process after the warm-up (``xstage_remote.nvml``), as the
torch-cuda worker does; the ledger charges it against the GPU's pool. There is no CUDA build
of onnxruntime here, so admission is replayed on NVML output recorded on the lent H200
(``scripts/nvml_record.py`` → ``tests/fixtures/h200/nvml/``); the report's rules are tested on
small inputs of NVML's documented shape. Both routes stay ``verified=False``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.ledger import budget as budget_mod
from xstage.ledger import footprint
from xstage.ledger.measured import check_measured
from xstage.routes.launch import load_options
from xstage.routes.specs import ROUTES, get_spec
from xstage.routes.status import RouteStatus
from xstage.stage import admit
from xstage_remote import dxgi, nvml, ort_runtime

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "nvml"
GiB = 1 << 30


def _raw(*processes, error=None, pid=4242):
    return {"source": "nvml", "pid": pid, "driver": "580.0", "error": error,
            "devices": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-x", "total": 150 * GiB,
                         "used": 3 * GiB, "processes": list(processes)}]}


def test_the_process_figure_is_what_nvml_attributes_to_this_pid():
    out = nvml.report(_raw({"pid": 7, "used": GiB}, {"pid": 4242, "used": 600 << 20}))
    assert out["process_used"] == 600 << 20 and out["why"] is None
    assert out["devices"][0]["name"] == "NVIDIA H200" and out["devices"][0]["total"] == 150 * GiB


def test_a_pid_nvml_does_not_list_gets_no_figure_and_says_why():
    out = nvml.report(_raw({"pid": 7, "used": GiB}))
    assert out["process_used"] is None
    assert "no compute or graphics process with pid 4242" in out["why"] and "[7]" in out["why"]


def test_memory_nvml_hides_per_process_is_not_guessed():
    out = nvml.report(_raw({"pid": 4242, "used": None}))
    assert out["process_used"] is None and "MIG" in out["why"]


def test_no_library_is_a_reason_not_an_exception():
    out = nvml.report({"source": "nvml", "pid": 1, "devices": [], "error": "libnvidia-ml not loadable: x"})
    assert out["process_used"] is None and out["why"].startswith("libnvidia-ml not loadable")


def test_the_live_reader_never_raises_here():
    raw = nvml.read()
    assert raw["pid"] == os.getpid() and isinstance(raw["devices"], list)
    if raw["error"]:
        assert nvml.report(raw)["why"]


def test_dxgi_off_windows_is_a_reason():
    out = dxgi.process_memory()
    if os.name != "nt":
        assert out["process_used"] is None and "Windows-only" in out["why"]


def test_dxgi_report_sums_this_processs_local_usage_on_hardware_adapters():
    raw = {"source": "dxgi", "pid": 9, "error": None, "adapters": [
        {"index": 0, "name": "AMD Radeon 890M", "software": False, "luid": "0:1",
         "local": {"budget": 4 * GiB, "current_usage": 700 << 20, "current_reservation": 0},
         "non_local": {"budget": 8 * GiB, "current_usage": 30 << 20, "current_reservation": 0}},
        {"index": 1, "name": "Microsoft Basic Render Driver", "software": True,
         "local": {"budget": GiB, "current_usage": 5 << 20, "current_reservation": 0}}]}
    out = dxgi.report(raw)
    assert out["process_used"] == 700 << 20 and [a["name"] for a in out["adapters"]] == ["AMD Radeon 890M"]
    assert out["adapters"][0]["non_local_used"] == 30 << 20


def test_only_the_gpu_routes_name_a_reader_and_the_worker_has_each(monkeypatch):
    """The route spec names the reader, the worker module holds it (docs/architecture.md,
    "Adding a GPU route with its own memory reader")."""
    assert get_spec("ort-cpu").device_memory is None and get_spec("ort-openvino").device_memory is None
    assert ort_runtime.device_memory(None) is None
    assert ort_runtime.device_memory("a_reader_this_worker_lacks") is None
    readers = ort_runtime.DEVICE_MEMORY_READERS
    for spec in ROUTES:
        assert spec.device_memory is None or spec.device_memory in readers, spec.name
    monkeypatch.setattr(nvml, "read", lambda: _raw({"pid": 4242, "used": 900 << 20}))
    for route in ("ort-cuda", "ort-tensorrt"):
        assert ort_runtime.device_memory(get_spec(route).device_memory)["peak"] == 900 << 20


def test_a_reader_added_to_the_worker_is_used_by_the_route_that_names_it(monkeypatch):
    """The recipe's two places: a spec that names ``fake_smi``, a reader under that name."""
    monkeypatch.setitem(ort_runtime.DEVICE_MEMORY_READERS, "fake_smi", lambda: {"process_used": 7 << 20})
    spec = replace(get_spec("ort-cuda"), name="ort-fake", device_memory="fake_smi")
    assert ort_runtime.device_memory(spec.device_memory) == {"process_used": 7 << 20, "peak": 7 << 20}


def _resolved(route: str, device: str) -> RouteStatus:
    return RouteStatus(name=route, spec=get_spec(route), status="resolved", reason_code=None, reason="",
                       remedy="", interpreter=None, interpreter_source="current", versions={},
                       verified=False, devices=(device,))


def test_the_load_options_carry_the_routes_reader():
    assert load_options(_resolved("ort-cuda", "gpu_discrete:nvidia:0"))["device_memory"] == "nvml"
    assert load_options(_resolved("ort-cpu", "cpu"))["device_memory"] is None


def _recordings():
    return sorted(RECORDED.glob("*.json")) if RECORDED.is_dir() else []


def _budget(route: str, pool: str) -> int:
    art = inspect_artifact(builtin_graphs.builtin_stage())
    spec = get_spec(route)
    shapes = {i.name: tuple(int(d) for d in i.shape) for i in art.inputs}
    return budget_mod.make_budget(footprint.reservations(art, spec.memory_cost(), pool, shapes, route=route),
                                  pool=pool).budget_bytes


@pytest.mark.parametrize("route,ep", [("ort-cuda", "CUDAExecutionProvider"),
                                      ("ort-tensorrt", "TensorrtExecutionProvider")])
def test_admission_on_recorded_nvml_output_charges_the_workers_own_figure(monkeypatch, route, ep):
    recordings = _recordings()
    if not recordings:
        pytest.skip("no NVML recording in tests/fixtures/h200/nvml/ yet: run scripts/nvml_record.py "
                    "on the H200 (its docstring has the command) and copy context.json and "
                    "alloc-2gib.json there")
    pool = "vram:gpu_discrete:nvidia:0"
    budget = _budget(route, pool)
    for path in recordings:
        raw = json.loads(path.read_text())
        monkeypatch.setattr(nvml, "read", lambda raw=raw: raw)
        device = ort_runtime.device_memory(get_spec(route).device_memory)  # the worker's evidence
        expected = nvml.report(raw)["process_used"]
        assert expected and device["peak"] == expected, (path.name, device)
        smi = raw.get("cross_check", {}).get("nvidia_smi_compute_apps") or []
        mine = [int(line.split(",")[1]) << 20 for line in smi
                if line.split(",")[0].strip() == str(raw["pid"])]
        if mine:  # nvidia-smi's MiB figure for the same process, read a moment later
            assert abs(mine[0] - expected) <= 64 << 20, (path.name, mine, expected)
        peak = admit._measured_peak(pool, {"peak": 1}, {"peak": 1}, {"device_memory": device})
        assert peak == expected
        verdict = check_measured(budget, peak)
        assert verdict.verdict == ("within" if expected <= budget else "over"), (path.name, budget, expected)
        assert verdict.cause == (None if expected <= budget else "peak_over_budget")


def test_a_webgpu_worker_is_read_from_both_of_nvmls_lists(monkeypatch):
    """Recorded on an H100 (``scripts/webgpu_check.sh``): a WebGPU (Vulkan) worker after its
    warm-up is in NVML's compute list and its graphics list, once each; the worker's figure is
    that process's, counted once, and it is what the webgpu route's admission charges."""
    raw = json.loads((RECORDED.parent.parent / "h100" / "nvml" / "webgpu-vulkan.json").read_text())
    (proc,) = raw["devices"][0]["processes"]
    assert proc["pid"] == raw["pid"] and proc["lists"] == ["compute", "graphics"]
    monkeypatch.setattr(nvml, "read", lambda: raw)
    device = ort_runtime.device_memory(get_spec("ort-plugin:webgpu").device_memory)
    assert device["peak"] == nvml.report(raw)["process_used"] == proc["used"] == 32432128
    peak = admit._measured_peak("vram:gpu_discrete:nvidia:0", {"peak": 1}, {"peak": 1},
                                {"device_memory": device})
    assert peak == proc["used"]


def test_a_users_gpu_plugin_table_is_read_by_nvml_and_an_npu_table_by_nothing(tmp_path):
    from xstage.routes import plugins

    def spec(**table):
        return plugins.table_spec(plugins.parse_table("mine", {"module": "m", "ep_name": "MyEP", **table},
                                                      tmp_path / "xstage.toml"))

    assert spec(device_type="GPU").device_memory == "nvml"  # NVML says why on another vendor's
    assert spec(device_type="GPU", vendor="nvidia").device_memory == "nvml"
    assert spec(device_type="GPU", vendor="amd").device_memory is None
    assert spec(device_type="NPU").device_memory is None
