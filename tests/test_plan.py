"""The planner (``xstage.planner.make_plan``) over hand-built device reports: pure, nothing starts.

Reports are assembled the way ``xstage devices`` assembles them (``device_table.assemble``) from
``hardware.Device`` rows and ``RouteStatus`` values built directly (resolved: the devices the
route's probe would report; missing: a reason code, reason and remedy), plus one from the
recorded H200 probe through ``routes.evaluate``.
"""

from __future__ import annotations

import pytest
from recorded import load_json_fixture

from xstage import errors
from xstage.device_table import DeviceReport, assemble
from xstage.host import hardware as hw
from xstage.planner import make_plan
from xstage.refusal import RefusalCode
from xstage.routes import (
    ROUTE_NAMES,
    HostInfo,
    InterpreterChoice,
    InterpreterSource,
    ReasonCode,
    RouteStatus,
    evaluate,
    get_spec,
)
from xstage.routes.probe import ProbeOutcome

LINUX = HostInfo(platform="linux", cpu_vendor="intel")
UNREACHABLE = RefusalCode.DEVICE_UNREACHABLE.value
NO_GRAPH = RefusalCode.NO_EXPORTED_GRAPH.value


def _device(device_id: str, name: str = "") -> hw.Device:
    kind, _, rest = device_id.partition(":")
    vendor = rest.split(":")[0] if rest else "intel"
    pool = f"vram:{device_id}" if kind == "gpu_discrete" else "host_ram"
    memory = 16 << 30 if kind in ("cpu", "gpu_discrete") else 0
    return hw.Device(device_id, kind, vendor, name or device_id, pool, memory, memory // 2)


def _resolved(name: str, *devices: str) -> RouteStatus:
    spec = get_spec(name)
    return RouteStatus(name=name, spec=spec, status="resolved", reason_code=None, reason="", remedy="",
                       interpreter=f"/envs/{name}/bin/python", interpreter_source="route_env",
                       versions={"python": "3.11.7", "onnxruntime": "1.24.1"}, verified=spec.verified,
                       devices=devices)


def _missing(name: str, code: ReasonCode = ReasonCode.EP_NOT_IN_BUILD) -> RouteStatus:
    spec = get_spec(name)
    return RouteStatus(name=name, spec=spec, status="missing", reason_code=code,
                       reason=f"{name} is missing ({code.value})", remedy=f"fix {name}",
                       interpreter=None, interpreter_source="none", versions={},
                       verified=spec.verified)


def _report(devices: list[str], resolved: dict[str, tuple[str, ...]],
            missing: dict[str, ReasonCode] | None = None) -> DeviceReport:
    """Every route: resolved (with the devices it drives) or missing (default: ep_not_in_build)."""
    missing = missing or {}
    statuses = [_resolved(n, *resolved[n]) if n in resolved
                else _missing(n, missing.get(n, ReasonCode.EP_NOT_IN_BUILD)) for n in ROUTE_NAMES]
    hardware = [_device(d) for d in devices]
    return DeviceReport(devices=assemble(hardware, statuses), routes=tuple(statuses), host=LINUX)


def _pairs(plan) -> list[tuple[str, str]]:
    return [(c.device, c.route.name) for c in plan.candidates]


def _refusals(plan) -> list[tuple[str, str, str | None, str | None]]:
    return [(r.code.value, r.cause, r.device, r.route) for r in plan.refusals]


#: An Intel laptop with a CUDA card: OpenVINO drives the CPU, the iGPU and the NPU; CUDA the card.
LAPTOP = _report(
    ["cpu", "npu:intel", "gpu_integrated:intel", "gpu_discrete:nvidia:0"],
    {"ort-cpu": ("cpu",), "ort-openvino": ("cpu", "gpu_integrated:intel", "npu:intel"),
     "ort-cuda": ("gpu_discrete:nvidia:0",)},
    {"ort-vitisai": ReasonCode.WRONG_OS, "ort-dml": ReasonCode.WRONG_OS, "ort-qnn": ReasonCode.WRONG_OS,
     "ort-coreml": ReasonCode.WRONG_OS, "torch-cpu": ReasonCode.RUNTIME_NOT_IMPORTABLE,
     "torch-cuda": ReasonCode.RUNTIME_NOT_IMPORTABLE, "torch-dml": ReasonCode.WRONG_OS},
)

#: This project's VM: one AMD CPU, ort-cpu and ort-openvino resolved, nothing else.
VM = _report(["cpu"], {"ort-cpu": ("cpu",), "ort-openvino": ("cpu",)})


# -- default: the preference order, and the route order within a device -------------------------


def test_default_is_an_offload_npu_then_igpu_then_dgpu_then_cpu_the_reference_arm_last():
    """No selector is an offload: the same plan as ``offload=True``."""
    plan = make_plan(LAPTOP, "onnx:fp32")
    assert (plan.mode, plan.fall_through) == ("offload", True)
    assert _pairs(plan) == [
        ("npu:intel", "ort-openvino"),
        ("gpu_integrated:intel", "ort-openvino"),
        ("gpu_discrete:nvidia:0", "ort-cuda"),
        ("cpu", "ort-openvino"),
        ("cpu", "ort-cpu"),
    ]
    assert plan == make_plan(LAPTOP, "onnx:fp32", offload=True)
    assert plan.considered == ("npu:intel", "gpu_integrated:intel", "gpu_discrete:nvidia:0", "cpu")


def test_offload_moves_the_reference_arm_last_and_keeps_the_rest_in_plan_order():
    plan = make_plan(LAPTOP, "onnx:fp32", offload=True)
    assert (plan.mode, plan.fall_through) == ("offload", True)
    assert _pairs(plan) == [
        ("npu:intel", "ort-openvino"),
        ("gpu_integrated:intel", "ort-openvino"),
        ("gpu_discrete:nvidia:0", "ort-cuda"),
        ("cpu", "ort-openvino"),
        ("cpu", "ort-cpu"),
    ]
    assert plan.refusals == make_plan(LAPTOP, "onnx:fp32").refusals
    assert _pairs(make_plan(VM, "onnx:fp32", offload=True)) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]


def test_offload_with_only_the_reference_arm_still_has_it():
    only_cpu = _report(["cpu"], {"ort-cpu": ("cpu",)})
    assert _pairs(make_plan(only_cpu, "onnx:fp32", offload=True)) == [("cpu", "ort-cpu")]


@pytest.mark.parametrize("selector", [{"device": "cpu"}, {"prefer": ["cpu"]}, {"route": "ort-cpu"}])
def test_offload_chooses_the_routes_itself(selector):
    with pytest.raises(errors.UsageError, match="--offload chooses the routes itself"):
        make_plan(VM, "onnx:fp32", offload=True, **selector)


def test_default_keeps_every_missing_route_of_a_considered_device_as_a_refusal():
    """Routes that run fp32 and could drive the device but are missing; torch routes (pt
    formats) are not candidates for an ONNX artifact, so they are not refusals either."""
    plan = make_plan(LAPTOP, "onnx:fp32")
    assert _refusals(plan) == [
        (UNREACHABLE, "route_missing", "gpu_integrated:intel", "ort-dml"),
        (UNREACHABLE, "route_missing", "gpu_integrated:intel", "ort-plugin:webgpu"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-dml"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-tensorrt"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-plugin:webgpu"),
    ]
    dml = plan.refusals[0]
    assert dml.message.endswith("ort-dml is missing (wrong_os)") and dml.remedy == "fix ort-dml"
    assert dml.evidence["reason_code"] == "wrong_os"


def test_routes_within_a_device_keep_the_fixed_order_the_reference_arm_last():
    """ort-openvino before ort-cpu (the reference arm) on the cpu, whatever order the row lists
    them in, and whether the cpu was asked for or not."""
    plan = make_plan(VM, "onnx:fp32")
    assert _pairs(plan) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]
    row = VM.devices[0]
    shuffled = DeviceReport(devices=(type(row)(row.device, tuple(reversed(row.routes))),),
                            routes=VM.routes, host=LINUX)
    for report in (VM, shuffled):
        for selector in ({}, {"device": "cpu"}, {"prefer": ["cpu"]}):
            assert _pairs(make_plan(report, "onnx:fp32", **selector)) == [
                ("cpu", "ort-openvino"), ("cpu", "ort-cpu")], selector
    assert plan.refusals == ()


def test_a_resolved_route_that_does_not_report_the_device_is_not_a_candidate_for_it():
    """ort-openvino resolved on the CPU only (its probe listed no iGPU): the iGPU is refused."""
    report = _report(["cpu", "gpu_integrated:intel"], {"ort-cpu": ("cpu",), "ort-openvino": ("cpu",)},
                     {"ort-dml": ReasonCode.WRONG_OS})
    plan = make_plan(report, "onnx:fp32")
    assert _pairs(plan) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]
    assert ((UNREACHABLE, "route_missing", "gpu_integrated:intel", "ort-openvino")
            in _refusals(plan))


# -- --device: required, never substituted ---------------------------------------------------------


def test_device_is_required_and_prefixes_match():
    assert _pairs(make_plan(LAPTOP, "onnx:fp32", device="cpu")) == [("cpu", "ort-openvino"),
                                                                    ("cpu", "ort-cpu")]
    plan = make_plan(LAPTOP, "onnx:fp32", device="gpu_discrete:nvidia")
    assert _pairs(plan) == [("gpu_discrete:nvidia:0", "ort-cuda")]
    assert (plan.mode, plan.considered) == ("device", ("gpu_discrete:nvidia",))
    assert _pairs(make_plan(LAPTOP, "onnx:fp32", device="npu")) == [("npu:intel", "ort-openvino")]


def test_a_device_the_machine_lacks_is_refused_never_substituted():
    plan = make_plan(VM, "onnx:fp32", device="npu:intel")
    assert plan.candidates == ()
    assert _refusals(plan) == [(UNREACHABLE, "no_route", "npu:intel", None)]
    assert "it has: cpu" in plan.refusals[0].message
    assert plan.refusals[0].evidence == {"devices": ["cpu"]}


def test_a_device_whose_routes_are_all_missing_has_one_refusal_per_route():
    """A CUDA card with onnxruntime-gpu absent: DirectML, CUDA, TensorRT and WebGPU each say why."""
    report = _report(["cpu", "gpu_discrete:nvidia:0"], {"ort-cpu": ("cpu",)},
                     {"ort-dml": ReasonCode.WRONG_OS, "ort-cuda": ReasonCode.EP_NOT_IN_BUILD,
                      "ort-tensorrt": ReasonCode.RUNTIME_NOT_IMPORTABLE,
                      "ort-plugin:webgpu": ReasonCode.EP_LIBRARY_NOT_FOUND})
    plan = make_plan(report, "onnx:fp32", device="gpu_discrete:nvidia:0")
    assert plan.candidates == ()
    assert _refusals(plan) == [
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-dml"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-cuda"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-tensorrt"),
        (UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-plugin:webgpu"),
    ]
    assert [r.evidence["reason_code"] for r in plan.refusals] == [
        "wrong_os", "ep_not_in_build", "runtime_not_importable", "ep_library_not_found"]


def test_a_device_no_route_can_drive_at_all_is_no_route_not_a_format_problem():
    """An NPU of a vendor no route drives (a PCI processing accelerator from NVIDIA): the
    format is not the reason, the missing route is."""
    report = _report(["cpu", "npu:nvidia"], {"ort-cpu": ("cpu",)})
    assert report.device("npu:nvidia").routes == ()
    plan = make_plan(report, "onnx:a16w8", device="npu:nvidia")
    assert _refusals(plan) == [(UNREACHABLE, "no_route", "npu:nvidia", None)]


# -- --prefer: in order, falling through ----------------------------------------------------------


def test_prefer_tries_devices_in_the_given_order_and_falls_through():
    plan = make_plan(LAPTOP, "onnx:fp32", prefer=["gpu_discrete", "cpu", "npu"])
    assert (plan.mode, plan.fall_through) == ("prefer", True)
    assert _pairs(plan) == [
        ("gpu_discrete:nvidia:0", "ort-cuda"),
        ("cpu", "ort-openvino"),
        ("cpu", "ort-cpu"),  # the device's reference arm last within it, not last of all
        ("npu:intel", "ort-openvino"),
    ]


def test_prefer_skips_a_device_the_machine_lacks_with_a_refusal():
    plan = make_plan(VM, "onnx:fp32", prefer=["npu:amd", "gpu_integrated", "cpu"])
    assert _pairs(plan) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]
    assert _refusals(plan) == [(UNREACHABLE, "no_route", "npu:amd", None),
                               (UNREACHABLE, "no_route", "gpu_integrated", None)]


def test_prefer_does_not_repeat_a_candidate():
    plan = make_plan(VM, "onnx:fp32", prefer=["cpu", "cpu"])
    assert _pairs(plan) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]


def test_device_and_prefer_together_are_a_usage_error():
    with pytest.raises(errors.UsageError, match="mutually exclusive"):
        make_plan(VM, "onnx:fp32", device="cpu", prefer=["cpu"])


# -- --route: pinned --------------------------------------------------------------------------------


def test_pinned_route_is_the_only_candidate_and_does_not_fall_through():
    plan = make_plan(LAPTOP, "onnx:fp32", route="ort-openvino", device="npu:intel")
    assert _pairs(plan) == [("npu:intel", "ort-openvino")]
    assert (plan.mode, plan.fall_through, plan.refusals) == ("route", False, ())
    assert _pairs(make_plan(VM, "onnx:fp32", route="ort-openvino")) == [("cpu", "ort-openvino")]
    assert _pairs(make_plan(LAPTOP, "onnx:fp32", route="ort-cuda")) == [("gpu_discrete:nvidia:0", "ort-cuda")]


def test_pinned_route_with_a_device_prefix():
    assert _pairs(make_plan(LAPTOP, "onnx:fp32", route="ort-openvino", device="npu")) == [
        ("npu:intel", "ort-openvino")]
    assert _pairs(make_plan(LAPTOP, "onnx:fp32", route="ort-cuda", device="gpu_discrete:nvidia")) == [
        ("gpu_discrete:nvidia:0", "ort-cuda")]


def test_pinned_route_that_is_missing_is_refused():
    plan = make_plan(VM, "onnx:fp32", route="ort-cuda")
    assert plan.candidates == () and plan.mode == "route" and not plan.fall_through
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "gpu_discrete", "ort-cuda")]
    assert plan.refusals[0].remedy == "fix ort-cuda"
    assert plan.refusals[0].evidence["reason_code"] == "ep_not_in_build"


def test_pinned_route_that_is_missing_with_a_device_prefix_is_refused_not_a_usage_error():
    """ort-openvino can drive Intel NPUs: asking for "npu" while it is missing is a refusal
    (exit 2), like any missing pinned route, not "cannot drive" (exit 64)."""
    report = _report(["cpu", "npu:intel"], {"ort-cpu": ("cpu",)})
    plan = make_plan(report, "onnx:fp32", route="ort-openvino", device="npu")
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "npu", "ort-openvino")]
    plan = make_plan(report, "onnx:fp32", route="ort-cuda", device="gpu_discrete")
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "gpu_discrete", "ort-cuda")]


def test_pinned_route_resolved_but_not_driving_the_asked_device_is_no_route():
    plan = make_plan(VM, "onnx:fp32", route="ort-openvino", device="npu:intel")
    assert _refusals(plan) == [(UNREACHABLE, "no_route", "npu:intel", "ort-openvino")]
    assert plan.refusals[0].evidence == {"devices": ["cpu"]}


def test_pinned_route_that_does_not_run_the_format_is_no_exported_graph():
    plan = make_plan(LAPTOP, "onnx:fp32", route="ort-vitisai")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "npu", "ort-vitisai")]
    assert "onnx:a16w8" in plan.refusals[0].message and plan.candidates == ()


def test_pinned_route_that_cannot_drive_the_asked_device_is_a_usage_error():
    with pytest.raises(errors.UsageError, match="route ort-cpu cannot drive npu:amd") as info:
        make_plan(VM, "onnx:fp32", route="ort-cpu", device="npu:amd")
    assert "cpu" in info.value.remedy
    with pytest.raises(errors.UsageError, match="cannot drive cpu"):
        make_plan(LAPTOP, "onnx:fp32", route="ort-cuda", device="cpu")
    with pytest.raises(errors.UsageError, match="cannot drive gpu_discrete:amd:0"):
        make_plan(LAPTOP, "onnx:fp32", route="ort-cuda", device="gpu_discrete:amd:0")


def test_unknown_route_is_a_usage_error():
    with pytest.raises(errors.UsageError, match="unknown route 'ort-rocm'"):
        make_plan(VM, "onnx:fp32", route="ort-rocm")


# -- formats ---------------------------------------------------------------------------------------


def test_a16w8_on_a_machine_whose_only_routes_for_it_are_on_the_cpu():
    """An A16W8 artifact where the NPU's route (VitisAI) is missing: both CPU routes run it,
    the NPU stays in the record as a refusal naming the missing route."""
    report = _report(["cpu", "npu:amd"], {"ort-cpu": ("cpu",), "ort-openvino": ("cpu",)},
                     {"ort-vitisai": ReasonCode.WRONG_OS})
    plan = make_plan(report, "onnx:a16w8")
    assert _pairs(plan) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "npu:amd", "ort-vitisai")]
    assert _pairs(make_plan(VM, "onnx:a16w8")) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]


def test_fp32_on_an_a16w8_only_npu_is_no_exported_graph():
    """The default plan: the AMD NPU's only route takes A16W8, so an fp32 graph is refused there
    by format, and the plan falls to the CPU."""
    report = _report(["cpu", "npu:amd"], {"ort-cpu": ("cpu",), "ort-vitisai": ("npu:amd",)})
    plan = make_plan(report, "onnx:fp32")
    assert _pairs(plan) == [("cpu", "ort-cpu")]
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "npu:amd", None),
                               (UNREACHABLE, "route_missing", "cpu", "ort-openvino")]
    refusal = plan.refusals[0]
    assert refusal.evidence == {"format": "onnx:fp32", "formats_here": ["onnx:a16w8"]}
    assert "its routes run: onnx:a16w8" in refusal.message


def test_fp16_on_a_required_a16w8_only_npu_is_no_exported_graph():
    report = _report(["cpu", "npu:amd"], {"ort-cpu": ("cpu",), "ort-vitisai": ("npu:amd",)})
    plan = make_plan(report, "onnx:fp16", device="npu:amd")
    assert plan.candidates == ()
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "npu:amd", None)]


def test_a16w8_pinned_to_a_float_only_route_is_no_exported_graph():
    plan = make_plan(LAPTOP, "onnx:a16w8", route="ort-cuda")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "gpu_discrete", "ort-cuda")]
    plan = make_plan(LAPTOP, "onnx:a16w8", route="ort-dml", device="gpu_integrated:intel")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "gpu_integrated:intel", "ort-dml")]


def test_a16w8_on_a_float_only_device_is_no_exported_graph():
    """A CUDA card: TensorRT runs A16W8 (missing here, so refused by route), CUDA and DirectML do
    not (not candidates, not refusals: the route that runs it is the one named)."""
    plan = make_plan(LAPTOP, "onnx:a16w8", device="gpu_discrete:nvidia:0")
    assert plan.candidates == ()
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "gpu_discrete:nvidia:0", "ort-tensorrt")]
    report = _report(["cpu", "gpu_integrated:amd"], {"ort-cpu": ("cpu",), "ort-dml": ("gpu_integrated:amd",)})
    plan = make_plan(report, "onnx:a16w8", device="gpu_integrated:amd")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "gpu_integrated:amd", None)]


def test_a_torch_artifact_on_onnx_routes_is_no_exported_graph():
    plan = make_plan(VM, "pt:fp32", route="ort-cpu")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "cpu", "ort-cpu")]
    plan = make_plan(VM, "pt:fp32")
    assert plan.candidates == ()
    assert _refusals(plan) == [(UNREACHABLE, "route_missing", "cpu", "torch-cpu")]


def test_a_torch_artifact_on_the_recorded_h200_probe():
    """The H200's recorded torch probe, judged by ``evaluate``: a pt artifact goes to the GPU
    first (torch-cuda), then to the CPU (torch-cpu); the ONNX routes are neither."""
    data = load_json_fixture("h200", "probe-torch.json")
    choice = InterpreterChoice("/opt/torch/.venv/bin/python3", InterpreterSource.ENV_VAR, "X")
    host = hw.host_device(hw.CpuInfo("AuthenticAMD", "AMD EPYC", 16), total_bytes=128 << 30,
                          available_bytes=100 << 30)
    statuses = [evaluate(get_spec(n), choice, ProbeOutcome(ok=True, data=data),
                         host=HostInfo(platform="linux", cpu_vendor="amd"), hardware=[host])
                for n in ROUTE_NAMES]
    report = DeviceReport(devices=assemble([host], statuses), routes=tuple(statuses),
                          host=HostInfo(platform="linux", cpu_vendor="amd"))
    plan = make_plan(report, "pt:fp32")
    assert _pairs(plan)[0] == ("gpu_discrete:nvidia:0", "torch-cuda")
    assert all(name.startswith("torch-") for _, name in _pairs(plan))


# -- formats a device declines by its documented limit ----------------------------------------------


def test_a8w8_on_the_amd_npu_is_refused_by_name_with_the_format_it_takes():
    """XDNA2 declines A8W8 (ort-vitisai's ``declines``): ``format_not_accepted`` on that
    (device, route), not ``format_not_run_here``; the CPU routes run it."""
    report = _report(["cpu", "npu:amd"], {"ort-cpu": ("cpu",), "ort-vitisai": ("npu:amd",)})
    plan = make_plan(report, "onnx:a8w8")
    assert _pairs(plan) == [("cpu", "ort-cpu")]
    assert _refusals(plan)[0] == (NO_GRAPH, "format_not_accepted", "npu:amd", "ort-vitisai")
    refusal = plan.refusals[0]
    assert refusal.remedy.startswith("xstage quantize --scheme a16w8")
    assert refusal.evidence["formats_taken"] == ["onnx:a16w8"] and "A8W8" in refusal.message
    pinned = make_plan(report, "onnx:a8w8", route="ort-vitisai")
    assert _refusals(pinned) == [(NO_GRAPH, "format_not_accepted", "npu", "ort-vitisai")]
    required = make_plan(report, "onnx:a8w8", device="npu:amd")
    assert required.candidates == () and _refusals(required) == [
        (NO_GRAPH, "format_not_accepted", "npu:amd", "ort-vitisai")]


def test_a8w8_runs_on_the_cpu_ep_and_openvino_only():
    assert _pairs(make_plan(VM, "onnx:a8w8")) == [("cpu", "ort-openvino"), ("cpu", "ort-cpu")]
    plan = make_plan(LAPTOP, "onnx:a8w8", route="ort-cuda")
    assert _refusals(plan) == [(NO_GRAPH, "format_not_run_here", "gpu_discrete", "ort-cuda")]
