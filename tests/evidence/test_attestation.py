"""Device attestation (docs/design.md §5 layer 3, conflict case (c)): pure, from worker-shaped reports."""

from __future__ import annotations

import pytest

from xstage.evidence.attestation import FALLBACK_MARK, attest, device_class, judge, openvino_devices

OV = "OpenVINOExecutionProvider"


def test_device_ids_reduce_to_class_and_vendor():
    assert device_class("gpu_integrated:intel") == ("gpu", "intel")
    assert device_class("gpu_discrete:nvidia:0") == ("gpu", "nvidia")
    assert device_class("npu:amd") == ("npu", "amd")
    assert device_class("cpu") == ("cpu", None)


@pytest.mark.parametrize(("device_type", "kinds"), [
    ("CPU", ("cpu",)), ("GPU.1", ("gpu",)), ("NPU", ("npu",)),
    ("HETERO:GPU,CPU", ("gpu", "cpu")), ("AUTO:NPU,CPU", ("npu", "cpu"))])
def test_openvino_device_types(device_type, kinds):
    assert openvino_devices(device_type) == kinds


def test_openvino_on_the_planned_igpu_is_attested_by_its_options():
    att = attest(planned="gpu_integrated:intel", ep=OV, ep_options={"device_type": "GPU.0"})
    assert (att.observed, att.source) == ("gpu", "options_as_applied") and judge(att) is None


def test_openvino_on_the_cpu_for_a_planned_igpu_is_a_device_mismatch():
    att = attest(planned="gpu_integrated:intel", ep=OV, ep_options={"device_type": "CPU"})
    assert att.observed == "cpu" and judge(att) == "device_mismatch"
    hetero = attest(planned="gpu_integrated:intel", ep=OV,
                    ep_options={"device_type": "HETERO:GPU,CPU"})
    assert judge(hetero) == "device_mismatch"


def test_the_runtime_s_own_fallback_warning_beats_the_options():
    """OpenVINO recompiles a failed NPU model on its CPU plugin and only logs it."""
    log = ("[W:onnxruntime:, backend_manager.cc] Model compilation failed at OV NPU."
           f"{FALLBACK_MARK} for execution")
    att = attest(planned="npu:intel", ep=OV, ep_options={"device_type": "NPU"}, runtime_log=log)
    assert (att.observed, att.source) == ("cpu", "runtime") and judge(att) == "device_mismatch"


def test_the_ep_device_api_names_type_and_vendor():
    bound = {"type": "GPU", "vendor": "Intel Corporation", "vendor_id": 0x8086}
    att = attest(planned="gpu_integrated:intel", ep=OV, ep_device=bound,
                 ep_options={"device_type": "CPU"})
    assert (att.observed, att.source) == ("gpu:intel", "ep_device_api") and judge(att) is None
    other = attest(planned="gpu_integrated:intel", ep=OV,
                   ep_device={"type": "GPU", "vendor": "NVIDIA"})
    assert judge(other) == "device_mismatch"


def test_unattested_is_unmeasured_off_the_cpu_and_allowed_on_it():
    npu = attest(planned="npu:amd", ep="VitisAIExecutionProvider", ep_options={})
    assert (npu.observed, npu.source) == (None, "unattested") and judge(npu) == "unmeasured"
    cpu = attest(planned="cpu", ep="XnnpackExecutionProvider")
    assert cpu.source == "unattested" and judge(cpu) is None
    assert cpu.to_dict() == {"planned": "cpu", "observed": None, "source": "unattested",
                             "detail": cpu.detail}


def test_the_cpu_ep_and_torch_attest_by_the_runtime():
    assert attest(planned="cpu", ep="CPUExecutionProvider").source == "runtime"
    cuda = attest(planned="gpu_discrete:nvidia:0", torch_devices=["cuda:0"])
    assert (cuda.observed, cuda.source, judge(cuda)) == ("gpu", "runtime", None)
    split = attest(planned="gpu_discrete:nvidia:0", torch_devices=["cuda:0", "cpu"])
    assert judge(split) == "device_mismatch"
    by_id = {"device_id_picks_gpu": True, "gpu_vendor": "nvidia"}  # ort-cuda's spec says so
    assert judge(attest(planned="gpu_discrete:nvidia:0", ep="CUDAExecutionProvider",
                        ep_options={"device_id": "0"}, **by_id)) is None
    other_card = attest(planned="gpu_discrete:nvidia:0", ep="CUDAExecutionProvider",
                        ep_options={"device_id": "1"}, **by_id)
    assert other_card.observed == "gpu:nvidia:1" and judge(other_card) == "device_mismatch"


def test_the_device_id_attests_only_where_the_route_spec_says_it_picks_the_gpu():
    """The EP name alone decides nothing: the facts are the route spec's."""
    plain = attest(planned="gpu_discrete:nvidia:0", ep="CUDAExecutionProvider", ep_options={"device_id": "1"})
    assert plain.source == "unattested"
    any_vendor = attest(planned="gpu_discrete:amd:0", ep="SomeNewGpuExecutionProvider",
                        ep_options={"device_id": "0"}, device_id_picks_gpu=True)
    assert (any_vendor.observed, any_vendor.source) == ("gpu", "options_as_applied")
    amd = attest(planned="gpu_discrete:amd:0", ep="MIGraphXExecutionProvider", ep_options={"device_id": "0"},
                 device_id_picks_gpu=True, gpu_vendor="amd")
    assert amd.observed == "gpu:amd:0" and judge(amd) is None


# The WebGPU EP's EP device as onnxruntime 1.30 listed it on the lent H100 (vendor name empty,
# PCI ids and bus id in its metadata), and the worker's NVML report of its own process.
WEBGPU = "WebGpuExecutionProvider"
H100 = "gpu_discrete:nvidia:0"
WEBGPU_DEVICE = {"ep_name": WEBGPU, "type": "OrtHardwareDeviceType.GPU", "vendor": "",
                 "vendor_id": 0x10DE, "device_id": 0x2330,
                 "device_metadata": {"Discrete": "1", "pci_bus_id": "0000:00:06.0"}}


def _nvml(*buses: str) -> dict:
    return {"source": "nvml", "process_used": 32 << 20, "devices": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "pci_address": bus,
         "lists": ["compute", "graphics"], "process_used": 32 << 20} for i, bus in enumerate(buses)]}


def test_the_gpu_the_worker_holds_memory_on_attests_the_adapter():
    att = attest(planned=H100, ep=WEBGPU, ep_device=WEBGPU_DEVICE, gpu_memory=_nvml("0000:00:06.0"),
                 planned_pci="0000:00:06.0", twins=2)
    assert (att.observed, att.source, att.adapter) == (H100, "runtime", "attested")
    assert judge(att) is None and att.to_dict()["adapter"] == "attested"


def test_memory_on_another_gpu_is_a_device_mismatch():
    att = attest(planned=H100, ep=WEBGPU, ep_device=WEBGPU_DEVICE, gpu_memory=_nvml("0000:00:07.0"),
                 planned_pci="0000:00:06.0")
    assert att.source == "runtime" and judge(att) == "device_mismatch"


def test_memory_on_several_gpus_attests_none():
    att = attest(planned=H100, ep=WEBGPU, gpu_memory=_nvml("0000:00:06.0", "0000:00:07.0"),
                 planned_pci="0000:00:06.0")
    assert att.observed is None and judge(att) == "unmeasured"


def test_an_ep_that_picks_its_own_adapter_attests_class_and_vendor_only():
    """With no memory report: one GPU of that model places; identical twins are unmeasured."""
    alone = attest(planned=H100, ep=WEBGPU, ep_device=WEBGPU_DEVICE, planned_pci="0000:00:06.0")
    assert (alone.observed, alone.source) == ("gpu_discrete:nvidia", "ep_device_api")
    assert alone.adapter == "unattested"
    assert judge(alone) is None and "unattested" in alone.detail
    twins = attest(planned=H100, ep=WEBGPU, ep_device=WEBGPU_DEVICE, planned_pci="0000:00:06.0", twins=2)
    assert judge(twins) == "unmeasured"


def test_an_ep_device_on_another_pci_address_is_a_device_mismatch():
    att = attest(planned=H100, ep=WEBGPU, ep_device=WEBGPU_DEVICE, planned_pci="0000:00:07.0")
    assert judge(att) == "device_mismatch"
