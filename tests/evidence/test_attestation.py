"""Device attestation (DESIGN §4 layer 3, conflict case (c)): pure, from worker-shaped reports."""

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
    assert judge(attest(planned="gpu_discrete:nvidia:0", ep="CUDAExecutionProvider",
                        ep_options={"device_id": "0"})) is None
    other_card = attest(planned="gpu_discrete:nvidia:0", ep="CUDAExecutionProvider",
                        ep_options={"device_id": "1"})
    assert other_card.observed == "gpu:nvidia:1" and judge(other_card) == "device_mismatch"
