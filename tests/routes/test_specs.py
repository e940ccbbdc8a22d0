"""The route specs: every route present, as data, with the facts the issue fixes."""

from __future__ import annotations

import dataclasses

import pytest

from xstage.routes import specs
from xstage.routes.specs import DEVICE_CLASSES, FORMATS, ROUTES, get_spec

EXPECTED = [
    "ort-cpu",
    "ort-openvino",
    "ort-vitisai",
    "ort-dml",
    "ort-cuda",
    "ort-tensorrt",
    "ort-qnn",
    "ort-coreml",
    "torch-cpu",
    "torch-cuda",
    "torch-dml",
]


def test_every_route_in_fixed_order():
    assert list(specs.ROUTE_NAMES) == EXPECTED


def test_only_routes_this_project_ran_are_verified():
    assert {s.name for s in ROUTES if s.verified} == {"ort-cpu", "ort-openvino", "torch-cpu",
                                                     "torch-cuda"}


@pytest.mark.parametrize("spec", ROUTES, ids=lambda s: s.name)
def test_spec_is_consistent(spec):
    assert spec.runtime in ("onnxruntime", "torch")
    if spec.runtime == "onnxruntime":
        assert spec.ep and spec.ep.endswith("ExecutionProvider") and spec.torch_device is None
        assert all(f.startswith("onnx:") for f in spec.formats)
    else:
        assert spec.torch_device and spec.ep is None and spec.plugin_module is None
        assert all(f.startswith("pt:") for f in spec.formats)
    assert set(spec.formats) <= set(FORMATS)
    assert spec.device_class in DEVICE_CLASSES
    assert spec.device_class == spec.device_classes[0]
    assert set(spec.device_classes) <= set(DEVICE_CLASSES)
    assert spec.os_side in ("this", "windows")
    assert set(spec.platforms) <= {"linux", "wsl", "windows", "darwin"}
    assert spec.packages and all(spec.packages.values())


def test_specs_are_frozen():
    spec = get_spec("ort-cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.ep_options["device_type"] = "GPU"  # type: ignore[index]


def test_env_var_names():
    assert get_spec("ort-openvino").env_var == "XSTAGE_PYTHON_ORT_OPENVINO"
    assert get_spec("torch-cuda").env_var == "XSTAGE_PYTHON_TORCH_CUDA"


def test_openvino_plugin_and_builtin():
    spec = get_spec("ort-openvino")
    assert spec.plugin_module == "onnxruntime_ep_openvino"
    assert spec.ep == "OpenVINOExecutionProvider"
    assert dict(spec.ep_options) == {"device_type": "CPU"}
    assert spec.variants == ("plugin", "builtin")
    assert "onnxruntime-ep-openvino" in spec.packages["plugin"]
    assert spec.packages["builtin"] == ("onnxruntime-openvino", "numpy")
    # ort-openvino drives the CPU here and Intel iGPUs/NPUs elsewhere
    assert spec.device_classes == ("cpu", "gpu_integrated", "gpu_discrete", "npu")
    assert (
        spec.can_drive("cpu", "amd") and spec.can_drive("npu", "intel") and not spec.can_drive("npu", "amd")
    )


def test_version_constraints():
    vitisai, dml = get_spec("ort-vitisai"), get_spec("ort-dml")
    assert (vitisai.min_runtime, vitisai.max_runtime) == ("1.25", None)
    assert (dml.min_runtime, dml.max_runtime) == (None, "1.25")
    assert "cannot share a venv" in vitisai.version_note and "cannot share a venv" in dml.version_note
    assert dml.packages["default"][0] == "onnxruntime-directml<1.25"


def test_windows_side_routes():
    assert {s.name for s in ROUTES if s.os_side == "windows"} == {"ort-vitisai", "ort-dml", "ort-qnn"}
    assert get_spec("ort-coreml").platforms == ("darwin",)
    assert get_spec("torch-dml").platforms == ("windows", "wsl")


def test_route_order_within_cpu_and_preference():
    assert [s.name for s in specs.routes_for_class("cpu")] == ["ort-cpu", "ort-openvino", "torch-cpu"]
    assert specs.DEVICE_PREFERENCE == ("npu", "gpu_integrated", "gpu_discrete", "cpu")


def test_unknown_route_names_the_routes():
    with pytest.raises(KeyError, match="unknown route 'ort-foo'; routes: ort-cpu, ort-openvino"):
        get_spec("ort-foo")
