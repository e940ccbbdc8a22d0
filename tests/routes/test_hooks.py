"""Golden tests of the per-route EP option hooks (``xstage.routes.hooks.ep_options_for``).

``ort-cpu`` and ``ort-openvino`` ran on this project's machines (``VERIFIED``); the other hooks
are option builders written from their EPs' documentation, and their tests say so: the expected
values below are what the documentation asks for, never something a session accepted here.
"""

from __future__ import annotations

import json

import pytest

from xstage.routes import ROUTE_NAMES, get_spec
from xstage.routes.hooks import VERIFIED, ep_options_for
from xstage.routes.option_hooks import DeviceOverride

ONNX_ROUTES = [n for n in ROUTE_NAMES if n.startswith("ort-")]
F32_CPU = json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}})
F32_GPU = json.dumps({"GPU": {"INFERENCE_PRECISION_HINT": "f32"}})


def _base(route: str) -> dict[str, object]:
    """The spec's default provider options (what a built-in EP starts from)."""
    return dict(get_spec(route).ep_options)


# -- the verified set ------------------------------------------------------------------------------


def test_verified_is_exactly_the_routes_run_here():
    assert VERIFIED == frozenset({"ort-cpu", "ort-openvino", "ort-plugin:webgpu"})
    assert {n for n in ONNX_ROUTES if get_spec(n).verified} == VERIFIED


@pytest.mark.parametrize("route", ONNX_ROUTES)
def test_every_route_returns_strings_and_leaves_its_arguments_alone(route):
    base, user = _base(route), {"extra": "1"}
    before = (dict(base), dict(user))
    opts, notes = ep_options_for(route, "onnx:fp32", None, base, user)
    assert (base, user) == before
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in opts.items())
    assert opts["extra"] == "1" and isinstance(notes, list)


@pytest.mark.parametrize("route", ONNX_ROUTES)
def test_user_options_always_win(route):
    """Whatever a hook fills in, ``--ep-option`` overrides it, key by key."""
    user = {"device_id": "7", "load_config": "{}", "device_type": "CPU", "cache_dir": "/c"}
    # A user option must select the planned device (test_device_override.py): OpenVINO's
    # device_type=CPU plans the CPU, CUDA's device_id=7 the eighth card.
    device = "cpu" if route == "ort-openvino" else "gpu_discrete:nvidia:7"
    opts, _ = ep_options_for(route, "onnx:fp32", device, _base(route), user)
    assert {k: opts[k] for k in user} == user


def test_cuda_device_id_for_another_card_is_refused_by_the_hook():
    with pytest.raises(DeviceOverride) as caught:
        ep_options_for("ort-cuda", "onnx:fp32", "gpu_discrete:nvidia:0", {}, {"device_id": "1"})
    assert caught.value.selects == ("gpu_discrete:nvidia:1",)
    opts, _ = ep_options_for("ort-cuda", "onnx:fp32", "gpu_discrete:nvidia:1", {}, {"device_id": "1"})
    assert opts["device_id"] == "1"


def test_openvino_device_type_for_another_device_is_refused_by_the_hook():
    with pytest.raises(DeviceOverride) as caught:
        ep_options_for("ort-openvino", "onnx:fp32", "gpu_integrated:intel", {}, {"device_type": "CPU"})
    assert caught.value.selects == ("cpu",) and caught.value.option == "device_type"


# -- ort-cpu (verified) ----------------------------------------------------------------------------


def test_cpu_adds_nothing():
    assert ep_options_for("ort-cpu", "onnx:fp32", "cpu", {}, None) == ({}, [])
    assert ep_options_for("ort-cpu", "onnx:fp16", "cpu", {"a": 1}, {"b": "2"}) == ({"a": "1", "b": "2"}, [])


# -- ort-openvino (verified) ------------------------------------------------------------------------


def test_openvino_asks_for_f32_on_an_fp32_artifact():
    opts, notes = ep_options_for("ort-openvino", "onnx:fp32", "cpu", _base("ort-openvino"), None)
    assert opts == {"device_type": "CPU", "load_config": F32_CPU}
    assert notes == ["INFERENCE_PRECISION_HINT=f32 on CPU for an fp32 artifact "
                     "(OpenVINO otherwise may compute in bf16)"]


def test_openvino_names_the_device_type_that_runs():
    """The hint is keyed by the OpenVINO device the session opens: GPU gets ``{"GPU": ...}``
    (its default precision is f16), whether the probe or the user chose GPU."""
    opts, notes = ep_options_for("ort-openvino", "onnx:fp32", "gpu_integrated:intel",
                                 {"device_type": "GPU"}, None)
    assert opts == {"device_type": "GPU", "load_config": F32_GPU} and "on GPU" in notes[0]
    opts, _ = ep_options_for("ort-openvino", "onnx:fp32", "gpu_integrated:intel",
                             {"device_type": "GPU.0"}, None)
    assert json.loads(opts["load_config"]) == {"GPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    opts, _ = ep_options_for("ort-openvino", "onnx:fp32", "gpu_integrated:intel",
                             _base("ort-openvino"), {"device_type": "GPU"})
    assert opts == {"device_type": "GPU", "load_config": F32_GPU}


def test_openvino_without_a_device_type_assumes_cpu():
    opts, _ = ep_options_for("ort-openvino", "onnx:fp32", None, {}, None)
    assert opts == {"load_config": F32_CPU}


@pytest.mark.parametrize("device, section", [("npu:intel:0", "NPU"), ("gpu_integrated:intel:0", "GPU"),
                                             ("gpu_discrete:intel:1", "GPU"), ("cpu", "CPU")])
def test_a_plugin_ep_without_a_device_type_gets_the_planned_devices_section(device, section):
    """The plugin EP is bound to its device by the EP-device API, so its options carry no
    ``device_type``: the hint goes to the planned device's section (it went to ``CPU``'s, which
    an NPU or GPU session never reads)."""
    opts, notes = ep_options_for("ort-openvino", "onnx:fp32", device, {}, None)
    assert json.loads(opts["load_config"]) == {section: {"INFERENCE_PRECISION_HINT": "f32"}}
    assert f"on {section}" in notes[0] and "device_type" not in opts


@pytest.mark.parametrize("fmt", ["onnx:fp16", "onnx:a16w8"])
def test_openvino_never_adds_a_hint_for_a_non_fp32_artifact(fmt):
    opts, notes = ep_options_for("ort-openvino", fmt, "cpu", _base("ort-openvino"), None)
    assert opts == {"device_type": "CPU"} and notes == []


@pytest.mark.parametrize("user", [
    {"load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "bf16"}})},
    {"precision": "FP16"},
    {"precision": "ACCURACY"},
])
def test_openvino_never_overrides_a_precision_the_user_chose(user):
    opts, notes = ep_options_for("ort-openvino", "onnx:fp32", "cpu", _base("ort-openvino"), user)
    assert opts == {"device_type": "CPU", **user} and notes == []


# -- ort-vitisai: written from documentation, not run ----------------------------------------------


def test_vitisai_on_a16w8_with_a_cache_says_nothing():
    """Written from documentation, not run: an A16W8 graph with a cache_dir is the good case."""
    user = {"cache_dir": "C:/xstage/vaip-cache", "cache_key": "stage"}
    assert ep_options_for("ort-vitisai", "onnx:a16w8", "npu:amd", {}, user) == (user, [])


def test_vitisai_notes_a_missing_cache_dir():
    """Written from documentation, not run: without cache_dir the NPU compiles on every start."""
    opts, notes = ep_options_for("ort-vitisai", "onnx:a16w8", "npu:amd", {}, None)
    assert opts == {} and notes == ["no cache_dir: the NPU compiles the graph on every start"]


@pytest.mark.parametrize("fmt", ["onnx:fp32", "onnx:fp16"])
def test_vitisai_notes_a_format_the_npu_declines(fmt):
    """Written from documentation, not run: XDNA2 takes A16W8 only; the note predicts the refusal."""
    opts, notes = ep_options_for("ort-vitisai", fmt, "npu:amd", {}, {"cache_dir": "/c"})
    assert opts == {"cache_dir": "/c"}
    assert notes == [f"VitisAI on XDNA2 declines {fmt} graphs (only A16W8 is taken): expect a refusal"]
    _, both = ep_options_for("ort-vitisai", fmt, "npu:amd", {}, None)
    assert len(both) == 2 and both[1].startswith("no cache_dir")


# -- ort-dml: written from documentation, not run --------------------------------------------------


def test_dml_with_an_adapter_index_says_nothing():
    """Written from documentation, not run: the probe's adapter index (device_options) is used."""
    assert ep_options_for("ort-dml", "onnx:fp32", "gpu_integrated:amd", {"device_id": 1}, None) == (
        {"device_id": "1"}, [])
    assert ep_options_for("ort-dml", "onnx:fp16", "gpu_integrated:amd", {}, {"device_id": "2"}) == (
        {"device_id": "2"}, ["--ep-option device_id=2 names a DXGI adapter by index, beside the adapter "
                             "chosen by identity for gpu_integrated:amd"])


def test_dml_adds_no_default_adapter_index():
    """The adapter is bound by identity (tests/routes/test_dml_identity.py), never 0."""
    assert ep_options_for("ort-dml", "onnx:fp32", "gpu_integrated:amd", {}, None) == ({}, [])


# -- ort-cuda / ort-tensorrt: written from documentation, not run ---------------------------------


@pytest.mark.parametrize("route", ["ort-cuda", "ort-tensorrt"])
def test_cuda_maps_the_device_index_to_device_id(route):
    """Written from documentation, not run: ``gpu_discrete:nvidia:<i>`` → ``device_id=<i>``."""
    assert ep_options_for(route, "onnx:fp32", "gpu_discrete:nvidia:1", _base(route), None) == (
        {"device_id": "1"}, [])
    assert ep_options_for(route, "onnx:fp16", "gpu_discrete:nvidia:0", {}, None) == ({"device_id": "0"}, [])


@pytest.mark.parametrize("route", ["ort-cuda", "ort-tensorrt"])
def test_cuda_keeps_the_default_without_an_index_and_the_users_device_id(route):
    """Written from documentation, not run: a device id without an index keeps device_id 0; the
    user's device_id is never replaced (one for another card than the planned one is a usage
    error: test_cuda_device_id_for_another_card_is_refused_by_the_hook)."""
    assert ep_options_for(route, "onnx:fp32", "gpu_discrete:nvidia", _base(route), None) == (
        {"device_id": "0"}, [])
    assert ep_options_for(route, "onnx:fp32", None, _base(route), None) == ({"device_id": "0"}, [])
    assert ep_options_for(route, "onnx:fp32", "gpu_discrete:nvidia", _base(route),
                          {"device_id": "3"}) == ({"device_id": "3"}, [])


# -- ort-qnn / ort-coreml: written from documentation, not run -------------------------------------


@pytest.mark.parametrize("route", ["ort-qnn", "ort-coreml"])
def test_qnn_and_coreml_pass_their_defaults_through(route):
    """Written from documentation, not run: no hook logic; the spec's defaults, stringified."""
    base = _base(route)
    assert ep_options_for(route, "onnx:a16w8", None, base, None) == (
        {k: str(v) for k, v in base.items()}, [])
    assert base  # QNN: backend_path=QnnHtp.dll; CoreML: MLComputeUnits=ALL


def test_an_unknown_route_gets_no_hook():
    assert ep_options_for("ort-future", "onnx:fp32", None, {"a": 1}, {"b": "2"}) == ({"a": "1", "b": "2"}, [])
