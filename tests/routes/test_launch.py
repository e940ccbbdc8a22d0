"""``load_options``: a resolved route's worker options, read from its spec (hook, torch facts)."""

from __future__ import annotations

import json

from xstage.routes import RouteStatus, get_spec
from xstage.routes.launch import load_options


def _resolved(name: str, devices: tuple[str, ...], details=None, ep_plugin=None) -> RouteStatus:
    spec = get_spec(name)
    return RouteStatus(name=name, spec=spec, status="resolved", reason_code=None, reason="", remedy="",
                       interpreter="/usr/bin/python3", interpreter_source="current", versions={},
                       verified=spec.verified, devices=devices, device_details=details or {},
                       ep_plugin=ep_plugin)


def test_torch_cuda_turns_tf32_off_for_fp32_only():
    status = _resolved("torch-cuda", ("gpu_discrete:nvidia:1",))
    fp32 = load_options(status, fmt="pt:fp32", output_names=["y"])
    assert fp32["device"] == "cuda:1" and fp32["xstage_device"] == "gpu_discrete:nvidia:1"
    assert fp32["fp32_strict"] and fp32["notes"] == [get_spec("torch-cuda").fp32_strict_note]
    fp16 = load_options(status, fmt="pt:fp16")
    assert not fp16["fp32_strict"] and fp16["notes"] == []
    assert "adapter_name" not in fp32


def test_torch_cpu_is_plain():
    out = load_options(_resolved("torch-cpu", ("cpu",)), fmt="pt:fp32", output_names=["y"])
    assert out == {"runtime": "torch", "device": "cpu", "xstage_device": "cpu", "route": "torch-cpu",
                   "profile": False, "output_names": ["y"], "fp32_strict": False, "notes": []}


def test_torch_dml_names_its_adapter():
    status = _resolved("torch-dml", ("gpu_integrated:amd",),
                       details={"gpu_integrated:amd": {"name": "AMD Radeon 890M", "torch_index": 0}})
    out = load_options(status, fmt="pt:fp32")
    assert out["device"] == "privateuseone:0" and out["adapter_name"] == "AMD Radeon 890M"
    assert not out["fp32_strict"]


def test_an_onnx_route_runs_its_specs_hook():
    plugin = {"kind": "builtin", "ep_name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"},
              "device_options": {"cpu": {"device_type": "CPU"}}}
    out = load_options(_resolved("ort-openvino", ("cpu",), ep_plugin=plugin), fmt="onnx:fp32")
    assert json.loads(out["ep"]["options"]["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    assert out["notes"] and out["route"] == "ort-openvino"


def test_torch_cuda_serving_switches_travel_as_on_or_off():
    import pytest

    from xstage import errors

    status = _resolved("torch-cuda", ("gpu_discrete:nvidia:0",))
    out = load_options(status, fmt="pt:fp32", ep_options={"cuda_graphs": "0", "pinned_region": "On"})
    assert out["cuda_graphs"] == "off" and out["pinned_region"] == "on"
    assert any(n.startswith("cuda_graphs off (--ep-option cuda_graphs=off)") for n in out["notes"])
    default = load_options(status, fmt="pt:fp32")
    assert "cuda_graphs" not in default and "pinned_region" not in default  # the worker's default: on
    with pytest.raises(errors.UsageError) as bad:
        load_options(status, fmt="pt:fp32", ep_options={"cuda_graphs": "sometimes"})
    assert "expected on or off" in str(bad.value) and "cuda_graphs=off" in bad.value.remedy
    with pytest.raises(errors.UsageError) as unknown:
        load_options(status, fmt="pt:fp32", ep_options={"device_id": "1"})
    assert "no such option" in str(unknown.value)
    assert "cuda_graphs=on|off" in unknown.value.remedy and "pinned_region=on|off" in unknown.value.remedy


def test_a_cuda_switch_given_to_torch_cpu_is_noted_not_applied():
    """A plan that falls back from torch-cuda to torch-cpu carries the user's switches along."""
    out = load_options(_resolved("torch-cpu", ("cpu",)), fmt="pt:fp32",
                       ep_options={"cuda_graphs": "off"})
    assert "cuda_graphs" not in out
    assert out["notes"] == ["--ep-option cuda_graphs is not an option of torch-cpu: ignored here"]


def test_device_tensors_are_opt_in_and_only_torch_cuda_has_them():
    import pytest

    from xstage import errors

    status = _resolved("torch-cuda", ("gpu_discrete:nvidia:0",))
    assert "device_tensors" not in load_options(status, fmt="pt:fp32")  # the worker's default: off
    assert load_options(status, fmt="pt:fp32", ep_options={"device_tensors": "on"})[
        "device_tensors"] == "on"
    for other, fmt in (("torch-cpu", "pt:fp32"), ("ort-cpu", "onnx:fp32")):
        with pytest.raises(errors.UsageError) as bad:
            load_options(_resolved(other, ("cpu",)), fmt=fmt, ep_options={"device_tensors": "on"})
        assert f"route {other} has no device_tensors" in str(bad.value)
        assert "torch-cuda" in bad.value.remedy
    off = load_options(_resolved("ort-cpu", ("cpu",)), fmt="onnx:fp32",
                       ep_options={"device_tensors": "off"})
    assert "device_tensors" not in off["ep"]["options"]  # never handed to onnxruntime


def test_ort_openvino_turns_the_pools_spinning_off_unless_the_user_says_otherwise():
    plugin = {"kind": "builtin", "ep_name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"},
              "device_options": {"cpu": {"device_type": "CPU"}}}
    status = _resolved("ort-openvino", ("cpu",), ep_plugin=plugin)
    out = load_options(status, fmt="onnx:fp32", session={"intra_op_num_threads": 2})
    assert out["session"] == {"intra_op_num_threads": 2,
                              "config": {"session.intra_op.allow_spinning": "0"}}
    assert any(n.startswith("session config session.intra_op.allow_spinning=0: the route's default")
               for n in out["notes"])
    given = {"config": {"session.intra_op.allow_spinning": "1", "session.x": "y"}}
    out = load_options(status, fmt="onnx:fp32", session=given)
    assert out["session"] == given and given == {"config": {"session.intra_op.allow_spinning": "1",
                                                            "session.x": "y"}}
    assert not any("the route's default" in n for n in out["notes"])
    # ort-cpu keeps onnxruntime's own default: its pool is what runs the graph
    cpu = load_options(_resolved("ort-cpu", ("cpu",)), fmt="onnx:fp32")
    assert cpu["session"] == {}
