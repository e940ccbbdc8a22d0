"""Route judgement as a pure function over recorded probe documents.

``h200/probe-torch.json`` was captured on a lent H200 machine (tests/fixtures/README.md).
Tests that need a probe nobody here can capture (a Windows python.exe, an Intel NPU) take a
real recorded document and change one fact, named in the test.
"""

from __future__ import annotations

import copy
import sys

import pytest
from recorded import load_fixture, load_json_fixture, materialize_sysfs

from xstage.host import hardware as hw
from xstage.host.wsl import WslInfo
from xstage.routes import HostInfo, InterpreterChoice, InterpreterSource, ReasonCode, evaluate, get_spec
from xstage.routes.probe import ProbeOutcome, ProbeRequest, run_probe

LINUX = HostInfo(platform="linux", cpu_vendor="intel")
WSL = HostInfo(
    platform="wsl", wsl=WslInfo(is_wsl=True, version=2, interop=True, distro="U"), cpu_vendor="amd"
)
H200 = load_json_fixture("h200", "probe-torch.json")


def _choice(path="/opt/torch/.venv/bin/python3"):
    return InterpreterChoice(path, InterpreterSource.ENV_VAR, "XSTAGE_PYTHON_X")


def _judge(name, data, host=LINUX, hardware=()):
    return evaluate(get_spec(name), _choice(), ProbeOutcome(ok=True, data=data), host=host, hardware=hardware)


@pytest.fixture(scope="module")
def h200_hardware(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("h200")
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(load_fixture("h200", "cpuinfo-head.txt"))
    (proc / "version").write_text("Linux version 6.18.44-fc-v657-gpu")
    return hw.discover(
        proc=proc,
        sys_pci=materialize_sysfs(load_fixture("h200", "sysfs-pci.txt"), tmp / "pci"),
        dev=tmp / "dev",
        nvidia_smi_text=load_fixture("h200", "nvidia-smi-query.txt"),
        wsl=False,
        run_tools=False,
    )


def test_torch_cuda_on_the_h200(h200_hardware):
    status = _judge("torch-cuda", H200, hardware=h200_hardware)
    assert status.resolved
    assert status.devices == ("gpu_discrete:nvidia:0",)  # matched to the sysfs row by PCI address
    assert status.device_details["gpu_discrete:nvidia:0"] == {
        "name": "NVIDIA H200",
        "memory_bytes": 150109880320,
        "available_bytes": 149557477376,
        "torch_index": 0,
    }
    assert status.versions["torch"] == "2.11.0+cu130" and status.versions["torch_cuda"] == "13.0"


def test_torch_cuda_device_id_without_hardware():
    assert _judge("torch-cuda", H200).devices == ("gpu_discrete:nvidia:0",)


def test_torch_cpu_on_the_h200():
    assert _judge("torch-cpu", H200).devices == ("cpu",)


def test_torch_dml_on_the_h200_probe_is_backend_not_importable():
    status = _judge("torch-dml", H200, host=WSL)
    assert status.reason_code is ReasonCode.BACKEND_NOT_IMPORTABLE


def test_ort_cuda_with_a_cpu_onnxruntime_is_ep_not_in_build(h200_hardware):
    status = _judge("ort-cuda", H200, hardware=h200_hardware)
    assert status.reason_code is ReasonCode.EP_NOT_IN_BUILD
    assert "(it has: AzureExecutionProvider, CPUExecutionProvider)" in status.reason


def test_ort_cuda_builtin_ep_takes_the_nvidia_rows(h200_hardware):
    """Changed fact: onnxruntime-gpu's provider list."""
    data = copy.deepcopy(H200)
    data["onnxruntime"]["providers"] = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    status = _judge("ort-cuda", data, hardware=h200_hardware)
    assert status.resolved and status.devices == ("gpu_discrete:nvidia:0",)
    assert status.ep_plugin["kind"] == "builtin" and status.ep_plugin["options"] == {"device_id": 0}


def test_ort_cuda_builtin_ep_without_a_gpu_is_ep_no_device():
    data = copy.deepcopy(H200)
    data["onnxruntime"]["providers"] = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    cpu_only = [hw.host_device(hw.CpuInfo("AuthenticAMD", "AMD EPYC", 2), total_bytes=1, available_bytes=1)]
    status = _judge("ort-cuda", data, hardware=cpu_only)
    assert status.reason_code is ReasonCode.EP_NO_DEVICE
    assert "no gpu_discrete:nvidia device it drives was found (this machine shows: cpu)" in status.reason


def _windows(data):
    data = copy.deepcopy(data)
    data["python"]["platform"] = "win32"
    data["python"]["system"] = "Windows"
    return data


def test_vitisai_needs_onnxruntime_125(py39_ort119_python):
    """A real onnxruntime 1.19.2 probe, as if its interpreter were a Windows python.exe."""
    data = _windows(run_probe(ProbeRequest(str(py39_ort119_python))).data)
    status = _judge("ort-vitisai", data, host=WSL)
    assert status.reason_code is ReasonCode.RUNTIME_VERSION_UNSUPPORTED
    assert status.reason == (
        "onnxruntime 1.19.2 at /opt/torch/.venv/bin/python3 is too old for VitisAIExecutionProvider: "
        "needs >= 1.25 (the VitisAI EP library requests ORT API 25 (onnxruntime >= 1.25), while "
        "onnxruntime-directml stops at 1.24.x, so ort-vitisai and ort-dml cannot share a venv)"
    )


def test_dml_stops_at_124():
    """The current onnxruntime's real probe, as if from Windows: >= 1.25 cannot be -directml."""
    data = _windows(run_probe(ProbeRequest(sys.executable)).data)
    status = _judge("ort-dml", data, host=WSL)
    assert status.reason_code is ReasonCode.RUNTIME_VERSION_UNSUPPORTED
    assert "is too new for DmlExecutionProvider: it ships only below 1.25" in status.reason
    assert (
        status.remedy
        == "use a separate interpreter with onnxruntime-directml<1.25, numpy: xstage env create ort-dml"
    )


def test_openvino_plugin_devices_map_to_device_ids(openvino_plugin_python):
    """Changed fact: the plugin lists CPU and NPU devices, as it does on an Intel Core Ultra."""
    data = copy.deepcopy(
        run_probe(ProbeRequest(str(openvino_plugin_python), plugins=("onnxruntime_ep_openvino",))).data
    )
    ort = data["onnxruntime"]
    base = {"ep_name": "OpenVINOExecutionProvider", "ep_vendor": "Intel", "ep_metadata": {}, "ep_options": {}}
    ort["ep_devices_after_plugins"] = ort["ep_devices_after_plugins"] + [
        {
            **base,
            "device_type": "CPU",
            "device_vendor": "Intel",
            "device_vendor_id": 0x8086,
            "device_id": 0,
            "device_metadata": {},
        },
        {
            **base,
            "device_type": "NPU",
            "device_vendor": "Intel",
            "device_vendor_id": 0x8086,
            "device_id": 0x7D1D,
            "device_metadata": {},
        },
    ]
    status = _judge("ort-openvino", data)
    assert status.resolved and status.devices == ("cpu", "npu:intel")
    assert status.ep_plugin["kind"] == "plugin"
    assert status.ep_plugin["module"] == "onnxruntime_ep_openvino"
    assert status.ep_plugin["registration_name"] == "OpenVINOExecutionProvider"
    assert status.ep_plugin["devices"]["npu:intel"]["device_id"] == 0x7D1D


def test_openvino_builtin_gpu_and_npu_device_types(openvino_python):
    """Changed fact: the built-in EP reports GPU and NPU device types."""
    data = copy.deepcopy(run_probe(ProbeRequest(str(openvino_python))).data)
    data["onnxruntime"]["openvino_device_ids"] = ["CPU", "GPU", "NPU"]
    status = _judge("ort-openvino", data)
    assert status.devices == ("cpu", "gpu_integrated:intel", "npu:intel")
    assert status.ep_plugin["device_options"]["npu:intel"] == {"device_type": "NPU"}


def test_probe_failure_keeps_the_stderr_tail():
    outcome = ProbeOutcome(
        ok=False, error="the probe exited with status 139", stderr_tail="Segmentation fault"
    )
    status = evaluate(get_spec("ort-cpu"), _choice("/x/python"), outcome, host=LINUX)
    assert status.reason_code is ReasonCode.INTERPRETER_FAILED
    assert status.reason == (
        "probing /x/python failed: the probe exited with status 139\n"
        "--- stderr (last lines) ---\nSegmentation fault"
    )
    assert status.probe is None and status.devices == ()


def test_to_dict_has_the_stable_fields():
    doc = _judge("torch-cuda", H200).to_dict()
    for key in ("name", "status", "reason_code", "reason", "remedy", "interpreter", "versions", "verified"):
        assert key in doc
    assert doc["status"] == "resolved" and doc["reason_code"] is None and doc["verified"] is True
