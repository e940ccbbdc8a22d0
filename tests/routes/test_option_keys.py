"""``--ep-option`` keys: each must be one a route of the run takes (docs/routes.md, "EP options")."""

from __future__ import annotations

import pytest

from xstage import errors
from xstage.routes import RouteStatus, get_spec
from xstage.routes.hooks import check_option_keys, option_keys
from xstage.routes.launch import load_options
from xstage.routes.specs import OPENVINO_EP_KEYS

_OV_BUILTIN = {"kind": "builtin", "ep_name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"},
               "device_options": {"cpu": {"device_type": "CPU"}}}
_OV_PLUGIN = {"kind": "plugin", "ep_name": "OpenVINOExecutionProvider", "module": "onnxruntime_ep_openvino"}


def _resolved(name: str, ep_plugin=None) -> RouteStatus:
    spec = get_spec(name)
    return RouteStatus(name=name, spec=spec, status="resolved", reason_code=None, reason="", remedy="",
                       interpreter="/usr/bin/python3", interpreter_source="current", versions={},
                       verified=spec.verified, devices=("cpu",), ep_plugin=ep_plugin)


def test_each_route_says_which_keys_it_takes_or_that_it_cannot_know():
    assert option_keys(_resolved("ort-cpu")) == frozenset()
    assert option_keys(_resolved("ort-openvino", _OV_BUILTIN)) == OPENVINO_EP_KEYS
    assert option_keys(_resolved("ort-openvino", _OV_PLUGIN)) is None  # the plugin library's own
    assert option_keys(_resolved("ort-dml")) is None  # not run here
    assert option_keys(_resolved("torch-cuda")) == {"cuda_graphs", "pinned_region", "device_tensors"}


def test_rejects_a_key_the_pinned_route_does_not_take():
    with pytest.raises(errors.UsageError) as caught:
        check_option_keys([_resolved("ort-cpu")], {"precision": "FP32"}, pinned=True)
    assert str(caught.value) == "--ep-option precision: route ort-cpu has no such option"
    assert caught.value.remedy == 'options taken: ort-cpu: none (docs/routes.md, "EP options")'


def test_rejects_a_key_no_route_of_an_offload_takes_naming_each_routes_keys():
    routes = [_resolved("ort-openvino", _OV_BUILTIN), _resolved("ort-cpu")]
    with pytest.raises(errors.UsageError) as caught:
        check_option_keys(routes, {"bogus": "1"})
    assert str(caught.value) == "--ep-option bogus: no route of this run (ort-openvino, ort-cpu) takes it"
    assert "ort-openvino: cache_dir, context," in caught.value.remedy
    assert "; ort-cpu: none" in caught.value.remedy


def test_a_key_one_route_takes_is_left_out_of_the_others_with_a_note():
    routes = [_resolved("ort-openvino", _OV_BUILTIN), _resolved("ort-cpu")]
    check_option_keys(routes, {"precision": "FP32"})  # ort-openvino takes it
    cpu = load_options(routes[1], ep_options={"precision": "FP32"}, fmt="onnx:fp32")
    assert cpu["ep"]["options"] == {}
    assert "--ep-option precision is not an option of ort-cpu: not passed to it" in cpu["notes"]
    ov = load_options(routes[0], ep_options={"precision": "FP32"}, fmt="onnx:fp32")
    assert ov["ep"]["options"]["precision"] == "FP32"


def test_a_route_whose_keys_are_unknown_takes_any_key_and_says_so():
    plugin = _resolved("ort-openvino", _OV_PLUGIN)
    check_option_keys([plugin, _resolved("ort-cpu")], {"weights": "f32"})
    check_option_keys([plugin], {"weights": "f32"}, pinned=True)
    with pytest.raises(errors.UsageError):  # the known route alone still checks
        check_option_keys([_resolved("ort-cpu")], {"weights": "f32"})


def test_serving_switches_keep_their_own_checks():
    """``cuda_graphs=off`` on torch-cpu is a note there (launch.serving_switches), not this check."""
    check_option_keys([_resolved("torch-cpu")], {"cuda_graphs": "off"}, pinned=True)
    check_option_keys([_resolved("ort-cpu")], {"device_tensors": "off"}, pinned=True)
