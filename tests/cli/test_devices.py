"""``xstage devices``: the assembled table (pure), and the command in both output modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from recorded import load_json_fixture

from xstage.cli.main import main
from xstage.device_table import assemble
from xstage.host import hardware as hw
from xstage.routes import (
    ROUTE_NAMES,
    ROUTES,
    HostInfo,
    InterpreterChoice,
    InterpreterSource,
    envs,
    evaluate,
    get_spec,
)
from xstage.routes.probe import ProbeOutcome

LINUX = HostInfo(platform="linux", cpu_vendor="amd")
HOST = hw.host_device(
    hw.CpuInfo("AuthenticAMD", "AMD EPYC", 2), total_bytes=24 << 30, available_bytes=20 << 30
)


def _devices_json(capsys, *args):
    assert main(["devices", "--json", *args]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def _statuses(hardware):
    data = load_json_fixture("h200", "probe-torch.json")
    choice = InterpreterChoice("/opt/torch/.venv/bin/python3", InterpreterSource.ENV_VAR, "X")
    outcome = ProbeOutcome(ok=True, data=data)
    return [evaluate(get_spec(n), choice, outcome, host=LINUX, hardware=hardware) for n in ROUTE_NAMES]


def test_assemble_adds_devices_only_a_probe_reported():
    """Rule 2: the H200 probe's CUDA device appears even though the hardware list lacks it."""
    rows = assemble([HOST], _statuses([HOST]))
    assert [r.device.id for r in rows] == ["cpu", "gpu_discrete:nvidia:0"]
    gpu = rows[1].device
    assert (gpu.memory_bytes, gpu.available_bytes, gpu.pool) == (
        150109880320,
        149557477376,
        "vram:gpu_discrete:nvidia:0",
    )
    assert gpu.sources == ("probe:torch-cuda",)
    assert [r.name for r in rows[1].routes] == [
        "ort-dml",
        "ort-cuda",
        "ort-tensorrt",
        "ort-plugin:webgpu",
        "torch-cuda",
        "torch-dml",
    ]
    assert [r.name for r in rows[1].resolved_routes] == ["torch-cuda"]


def test_assemble_keeps_devices_without_routes_and_orders_by_preference():
    """Rules 1 and 4: an AMD NPU and iGPU with no route on Linux are still rows."""
    npu = hw.Device("npu:amd", "npu", "amd", "NPU", "host_ram", 0, 0)
    igpu = hw.Device("gpu_integrated:amd", "gpu_integrated", "amd", "890M", "host_ram", 0, 0)
    rows = assemble([igpu, HOST, npu], _statuses([HOST]))
    assert [r.device.id for r in rows][:3] == ["cpu", "npu:amd", "gpu_integrated:amd"]
    npu_row = rows[1]
    assert [r.name for r in npu_row.routes] == ["ort-vitisai"] and npu_row.resolved_routes == ()
    assert npu_row.to_dict()["routes"] == [
        {"name": "ort-vitisai", "status": "missing", "reason_code": "wrong_os", "verified": False}
    ]


def test_assemble_cpu_route_order():
    rows = assemble([HOST], _statuses([HOST]))
    assert [r.name for r in rows[0].routes] == ["ort-cpu", "ort-openvino", "torch-cpu"]


def test_devices_json_stable_fields(capsys):
    doc = _devices_json(capsys)
    assert doc["schema"] == 1 and doc["preference"] == ["npu", "gpu_integrated", "gpu_discrete", "cpu"]
    cpu = doc["devices"][0]
    assert (cpu["id"], cpu["pool"]) == ("cpu", "host_ram")
    assert cpu["memory_bytes"] > 0 and 0 < cpu["available_bytes"] <= cpu["memory_bytes"]
    for device in doc["devices"]:
        for key in ("id", "pool", "memory_bytes", "available_bytes", "routes"):
            assert key in device
    assert [r["name"] for r in doc["routes"]] == list(ROUTE_NAMES)  # every route, never dropped
    host = next(p for p in doc["pools"] if p["name"] == "host_ram")  # the pools stages draw on
    assert host["capacity_bytes"] == cpu["available_bytes"] and "cpu" in host["devices"]
    assert all(set(p) == {"name", "capacity_bytes", "source", "devices"} for p in doc["pools"])
    assert [r["name"] for r in doc["routes"] if r["reference_arm"]] == ["ort-cpu", "torch-cpu"]
    for route in doc["routes"]:
        for key in (
            "name",
            "status",
            "reason_code",
            "reason",
            "remedy",
            "interpreter",
            "versions",
            "verified",
            "reference_arm",
        ):
            assert key in route, key
        assert route["status"] in ("resolved", "missing")
        if route["status"] == "missing":
            assert route["reason_code"] and route["reason"] and route["remedy"]
        else:
            assert route["reason_code"] is None and route["devices"]
    by_name = {r["name"]: r for r in doc["routes"]}
    assert by_name["ort-cpu"]["status"] == "resolved" and by_name["ort-cpu"]["interpreter"] == sys.executable
    # each route's spec says whether it is verified (tests/routes/test_specs.py pins which are)
    assert {n for n, r in by_name.items() if not r["verified"]} == {s.name for s in ROUTES if not s.verified}
    assert {"ort-cuda", "torch-dml"} <= {n for n, r in by_name.items() if not r["verified"]}


def test_devices_human(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps table cells at the terminal width
    assert main(["devices"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Devices")
    for name in ROUTE_NAMES:
        assert name in captured.out
    assert "ort-vitisai *" in captured.out  # unverified routes are marked
    assert "Missing routes, why, and what to do:" in captured.out
    assert "remedy:" in captured.out


def test_ort_openvino_resolves_after_env_create(capsys, openvino_python):
    """Before: missing. After `xstage env create ort-openvino` (its cached build): resolved."""
    before = {r["name"]: r for r in _devices_json(capsys)["routes"]}["ort-openvino"]
    assert before["status"] == "missing"
    target = envs.env_dir("ort-openvino")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(openvino_python.parent.parent)
    after = {r["name"]: r for r in _devices_json(capsys)["routes"]}["ort-openvino"]
    assert after["status"] == "resolved", after["reason"]
    assert after["interpreter_source"] == "route_env"
    assert after["interpreter"] == str(envs.venv_python(target))
    assert (
        after["devices"] == ["cpu"]
        and after["versions"]["onnxruntime_distribution"] == "onnxruntime-openvino"
    )


def test_refresh_probes_again(capsys):
    first = {r["name"]: r for r in _devices_json(capsys)["routes"]}["ort-cpu"]
    second = {r["name"]: r for r in _devices_json(capsys)["routes"]}["ort-cpu"]
    third = {r["name"]: r for r in _devices_json(capsys, "--refresh")["routes"]}["ort-cpu"]
    assert (first["probe_cached"], second["probe_cached"], third["probe_cached"]) == (False, True, False)


def test_a_fresh_process_reads_the_warm_probe_cache(xstage_home):
    """The whole command in a fresh process, twice: the second run probes nothing.

    How long it takes is ``benchmarks/devices_cached.py``'s figure (target: under a second).
    """
    argv = [sys.executable, "-m", "xstage", "devices", "--json"]
    runs = [subprocess.run(argv, env=dict(os.environ), capture_output=True, check=True, timeout=300)
            for _ in range(2)]
    cpu = [{r["name"]: r for r in json.loads(done.stdout)["routes"]}["ort-cpu"] for done in runs]
    assert (cpu[0]["probe_cached"], cpu[1]["probe_cached"]) == (False, True)


@pytest.mark.parametrize("flag", ["--bogus", "--refresh=3"])
def test_bad_flags_are_usage_errors(flag, capsys):
    with pytest.raises(SystemExit) as err:
        main(["devices", flag])
    assert err.value.code == 64
