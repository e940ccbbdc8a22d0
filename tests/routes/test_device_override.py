"""A device the EP is told to leave (docs/external.md §3): a user ``--ep-option`` that selects another
device than the planned one is a usage error, and a run whose attested device is not the
planned one is refused with ``device_mismatch`` — on a simulated Intel-GPU device table, the
way ``tests/test_plan.py`` builds reports, with a real OpenVINO worker behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from xstage import builtin_graphs, errors, open_stage
from xstage.device_table import DeviceReport, assemble
from xstage.host import hardware as hw
from xstage.record.io import validate_record
from xstage.record.summary import summary_rows
from xstage.routes import ROUTE_NAMES, HostInfo, ReasonCode, RouteStatus, get_spec
from xstage.routes.launch import load_options

IGPU = "gpu_integrated:intel"
OV = "OpenVINOExecutionProvider"


def _device(device_id: str) -> hw.Device:
    kind, _, rest = device_id.partition(":")
    memory = 16 << 30 if kind == "cpu" else 0
    return hw.Device(device_id, kind, rest.split(":")[0] or "intel", device_id, "host_ram",
                     memory, memory // 2)


def _openvino(python: str, igpu_device_type: str = "GPU") -> RouteStatus:
    """ort-openvino resolved on the CPU and an Intel iGPU (as its judge builds the built-in EP)."""
    spec = get_spec("ort-openvino")
    return RouteStatus(
        name=spec.name, spec=spec, status="resolved", reason_code=None, reason="", remedy="",
        interpreter=python, interpreter_source="env", versions={"onnxruntime": "1.24.1"},
        verified=spec.verified, devices=("cpu", IGPU),
        ep_plugin={"kind": "builtin", "ep_name": OV, "options": dict(spec.ep_options),
                   "device_options": {"cpu": {"device_type": "CPU"},
                                      IGPU: {"device_type": igpu_device_type}}})


def _ort_cpu() -> RouteStatus:
    from xstage.device_table import devices

    return devices().route("ort-cpu")


def _report(status: RouteStatus) -> DeviceReport:
    """Every route missing but ``status`` and ort-cpu, this interpreter's (the gate's reference
    arm runs in its worker)."""
    statuses = [status if n == status.name else _ort_cpu() if n == "ort-cpu" else RouteStatus(
        name=n, spec=get_spec(n), status="missing", reason_code=ReasonCode.EP_NOT_IN_BUILD,
        reason=f"{n} is missing", remedy=f"fix {n}", interpreter=None, interpreter_source="none",
        versions={}, verified=get_spec(n).verified) for n in ROUTE_NAMES]
    return DeviceReport(devices=assemble([_device("cpu"), _device(IGPU)], statuses),
                        routes=tuple(statuses), host=HostInfo(platform="linux", cpu_vendor="intel"))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("ov") / "mlp.onnx")


@pytest.mark.parametrize(("value", "device"), [("CPU", "--device cpu"), ("HETERO:GPU,CPU", "--device cpu")])
def test_an_ep_option_that_moves_openvino_off_the_igpu_is_a_usage_error(value, device):
    status = _openvino("/nonexistent/python")
    with pytest.raises(errors.UsageError) as caught:
        load_options(status, device=IGPU, ep_options={"device_type": value})
    text = f"{caught.value.message} {caught.value.remedy}"
    assert "--ep-option device_type" in text and device in text and IGPU in text


def test_an_ep_option_for_the_planned_device_is_kept():
    opts = load_options(_openvino("/nonexistent/python"), device=IGPU,
                        ep_options={"device_type": "GPU.0"})
    assert opts["ep"]["options"]["device_type"] == "GPU.0"


def test_open_stage_with_the_override_is_a_usage_error_before_any_worker(mlp):
    """planned gpu_integrated:intel, --ep-option device_type=CPU: exit 64, no record, before any
    candidate's worker starts (the reference arm's runs first)."""
    report = _report(_openvino("/nonexistent/python"))
    with pytest.raises(errors.UsageError) as caught:
        open_stage(mlp, device=IGPU, ep_options={"device_type": "CPU"}, report=report)
    assert getattr(caught.value, "record", None) is None
    assert "--device cpu" in caught.value.remedy


def test_a_run_attested_on_another_device_is_refused_device_mismatch(mlp, openvino_python):
    """The route's device map sends the iGPU's stage to OpenVINO's CPU (what a user option did
    before this check): the worker really runs there, the attestation says so, exit 2."""
    report = _report(_openvino(str(openvino_python), igpu_device_type="CPU"))
    with pytest.raises(errors.Refused) as caught:
        open_stage(mlp, device=IGPU, report=report)
    record = caught.value.record
    validate_record(record)
    refusal = record["outcome"]["refusals"][-1]
    assert (refusal["code"], refusal["cause"]) == ("execution_provider_declined_graph",
                                                   "device_mismatch")
    assert record["outcome"]["exit_code"] == 2
    assert record["device_attestation"] == {
        "planned": IGPU, "observed": "cpu", "source": "options_as_applied",
        "detail": "OpenVINO device_type=CPU"}
    assert "ran on cpu, not on gpu_integrated:intel" in refusal["message"]
    rows = dict(summary_rows(record))
    assert rows["device"].startswith("cpu (planned gpu_integrated:intel; options_as_applied")
