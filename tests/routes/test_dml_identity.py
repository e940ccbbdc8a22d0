"""DirectML's adapter chosen by identity, never ``device_id=0`` by default (docs/routes.md,
"DirectML: the adapter by identity").

Golden tests on two transcribed two-adapter inventories (tests/fixtures/README.md: the Windows
query and the probe's ``get_ep_devices()`` rows, ``synthetic: true``): a Radeon 890M iGPU beside
an RTX 4070 Laptop dGPU, and two AMD GPUs (780M iGPU, RX 7600S dGPU). In both, DXGI lists the
dGPU first, so ``device_id=0`` — what ort-dml sent before — ran ``--device gpu_integrated:amd`` on
the dGPU. The probe document around the rows is a real probe of this machine's interpreter with
the facts named changed (a Windows python, onnxruntime-directml 1.24.4, DirectML in its providers).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from xstage.evidence import attestation
from xstage.host import adapters as adapters_mod
from xstage.host import hardware as hw
from xstage.host.wsl import WslInfo
from xstage.routes import HostInfo, InterpreterChoice, InterpreterSource, ReasonCode, evaluate, get_spec
from xstage.routes.launch import load_options
from xstage.routes.probe import ProbeOutcome, ProbeRequest, run_probe

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WSL = HostInfo(platform="wsl", wsl=WslInfo(is_wsl=True, version=2, interop=True, distro="U"),
               cpu_vendor="amd")
SPEC = get_spec("ort-dml")
PY = "/mnt/c/Users/me/AppData/Local/xstage/envs/ort-dml/Scripts/python.exe"


def inventory(name: str) -> tuple[list[hw.Device], list[dict]]:
    doc = json.loads((FIXTURES / "dml" / f"ep-devices-{name}.json").read_text())
    assert doc["synthetic"] is True
    query = (FIXTURES / doc["windows_query"]).read_text()
    return hw.windows_devices(hw.parse_windows_query(query)), doc["ep_devices"]


@pytest.fixture(scope="module")
def real_probe():
    return run_probe(ProbeRequest(sys.executable)).data


def judge(real_probe, name: str, rows=None):
    hardware, ep_rows = inventory(name)
    data = copy.deepcopy(real_probe)
    data["python"].update(platform="win32", system="Windows")
    ort = data["onnxruntime"]
    ort.update(version="1.24.4", distributions={"onnxruntime-directml": "1.24.4"},
               providers=["DmlExecutionProvider", "CPUExecutionProvider"],
               ep_devices=ep_rows if rows is None else rows)
    choice = InterpreterChoice(PY, InterpreterSource.ENV_VAR, "XSTAGE_PYTHON_ORT_DML")
    return evaluate(SPEC, choice, ProbeOutcome(ok=True, data=data), host=WSL, hardware=hardware)


def bound_as_the_worker_reports(status, device: str) -> dict:
    """The ``bound_device`` the worker reports after binding the selected EP device."""
    select = load_options(status, device=device)["ep"]["plugin"]["select"]
    row = next(r for r in status.probe["onnxruntime"]["ep_devices"]
               if r["ep_name"] == "DmlExecutionProvider" and r["device_id"] == select["device_id"])
    return {"ep_name": "DmlExecutionProvider", "type": row["device_type"], "vendor": row["device_vendor"],
            "vendor_id": row["device_vendor_id"], "device_id": row["device_id"],
            "ep_metadata": row["ep_metadata"], "device_metadata": row["device_metadata"],
            "library": None, "onnxruntime": "1.24.4"}


def test_the_spec_sends_no_default_device_id():
    assert "device_id" not in SPEC.ep_options and SPEC.adapter_by_identity


def test_890m_beside_a_4070_binds_the_igpu(real_probe):
    status = judge(real_probe, "890m-4070")
    assert status.resolved and set(status.devices) == {"gpu_integrated:amd", "gpu_discrete:nvidia:0"}
    options = load_options(status, device="gpu_integrated:amd")
    plugin = options["ep"]["plugin"]
    assert plugin["builtin"] is True and "device_id" not in options["ep"]["options"]
    assert plugin["select"] == {"device_type": "GPU", "vendor_id": 0x1002, "device_id": 0x150E,
                                "device_metadata": {"DxgiAdapterNumber": "1"}}
    assert plugin["adapter"]["description"] == "AMD Radeon(TM) 890M Graphics"
    assert plugin["adapter"]["matched_by"] == "pci_id"
    assert options["notes"][-1] == (
        "adapter chosen by identity: AMD Radeon(TM) 890M Graphics (DXGI adapter 1, PCI 1002:150e, "
        "matched by pci_id), bound with add_provider_for_devices")
    dgpu = load_options(status, device="gpu_discrete:nvidia:0")["ep"]["plugin"]["select"]
    assert dgpu["device_metadata"] == {"DxgiAdapterNumber": "0"}


def test_the_record_names_the_adapter(real_probe):
    status = judge(real_probe, "890m-4070")
    att = attestation.attest(planned="gpu_integrated:amd", ep="DmlExecutionProvider",
                             ep_device=bound_as_the_worker_reports(status, "gpu_integrated:amd"))
    assert attestation.judge(att) is None
    record = att.to_dict()
    assert (record["observed"], record["source"]) == ("gpu_integrated:amd", "ep_device_api")
    assert record["ep_device"]["device_metadata"]["Description"] == "AMD Radeon(TM) 890M Graphics"
    assert record["ep_device"]["device_metadata"]["DxgiAdapterNumber"] == "1"
    assert "adapter 'AMD Radeon(TM) 890M Graphics'" in record["detail"]


def test_the_dgpu_bound_for_the_igpu_is_a_device_mismatch(real_probe):
    """What device_id=0 did: the 4070 ran a stage planned on the 890M."""
    status = judge(real_probe, "890m-4070")
    att = attestation.attest(planned="gpu_integrated:amd", ep="DmlExecutionProvider",
                             ep_device=bound_as_the_worker_reports(status, "gpu_discrete:nvidia:0"))
    assert attestation.judge(att) == "device_mismatch"


def test_two_amd_gpus_are_told_apart_by_class_and_pci_id(real_probe):
    status = judge(real_probe, "780m-7600s")
    assert status.resolved and set(status.devices) == {"gpu_integrated:amd", "gpu_discrete:amd:0"}
    igpu = load_options(status, device="gpu_integrated:amd")["ep"]["plugin"]
    assert igpu["select"]["device_metadata"] == {"DxgiAdapterNumber": "1"}
    assert igpu["adapter"]["description"] == "AMD Radeon(TM) 780M Graphics"
    dgpu = bound_as_the_worker_reports(status, "gpu_discrete:amd:0")
    att = attestation.attest(planned="gpu_integrated:amd", ep="DmlExecutionProvider", ep_device=dgpu)
    assert attestation.judge(att) == "device_mismatch"  # same vendor: the Discrete flag tells
    own = attestation.attest(planned="gpu_integrated:amd", ep="DmlExecutionProvider",
                             ep_device=bound_as_the_worker_reports(status, "gpu_integrated:amd"))
    assert attestation.judge(own) is None


def test_no_adapter_number_means_no_guess(real_probe):
    _, rows = inventory("890m-4070")
    for row in rows:
        row["device_metadata"].pop("DxgiAdapterNumber", None)
    status = judge(real_probe, "890m-4070", rows=rows)
    assert status.reason_code is ReasonCode.EP_NO_DEVICE
    assert "device_id=0 would be a guess" in status.reason
    assert "no DxgiAdapterNumber (DirectML would use adapter 0 for it)" in status.reason


def test_without_ep_devices_two_gpus_are_not_guessed_and_one_is_safe(real_probe):
    cpu_only = [r for r in inventory("890m-4070")[1] if r["ep_name"] != "DmlExecutionProvider"]
    assert judge(real_probe, "890m-4070", rows=cpu_only).reason_code is ReasonCode.EP_NO_DEVICE
    data = copy.deepcopy(real_probe)
    data["python"].update(platform="win32", system="Windows")
    data["onnxruntime"].update(version="1.24.4", providers=["DmlExecutionProvider", "CPUExecutionProvider"],
                               ep_devices=cpu_only)
    query = (FIXTURES / "windows" / "query-single-dgpu.txt").read_text()
    one = hw.windows_devices(hw.parse_windows_query(query))
    choice = InterpreterChoice(PY, InterpreterSource.ENV_VAR, "XSTAGE_PYTHON_ORT_DML")
    status = evaluate(SPEC, choice, ProbeOutcome(ok=True, data=data), host=WSL, hardware=one)
    assert status.resolved and status.devices == ("gpu_discrete:nvidia:0",)
    assert load_options(status)["ep"]["options"] == {"device_id": "0"}


def test_match_rules_in_order():
    hardware, rows = inventory("780m-7600s")
    adapters, skipped = adapters_mod.adapters_from_ep_devices(rows, "DmlExecutionProvider")
    assert [a.dxgi_index for a in adapters] == [0, 1] and skipped == []
    matches, unmatched = adapters_mod.match_adapters(adapters, hardware)
    assert [(m.device, m.how) for m in matches] == [("gpu_discrete:amd:0", "pci_id"),
                                                    ("gpu_integrated:amd", "pci_id")]
    matches, _ = adapters_mod.match_adapters(adapters, [])  # no hardware rows: ids from the class
    assert [(m.device, m.how) for m in matches] == [("gpu_discrete:amd:0", "adapter only"),
                                                    ("gpu_integrated:amd", "adapter only")]
