"""The route specs: every route present, as data, with the facts the issue fixes."""

from __future__ import annotations

import dataclasses

import pytest

from xstage.artifact import RUNTIMES, runtime_of
from xstage.routes import specs
from xstage.routes.specs import DEVICE_CLASSES, FORMATS, ROUTES, get_spec

EXPECTED = [
    "ort-cpu",
    "ort-openvino",
    "ort-vitisai",
    "ort-dml",
    "ort-cuda",
    "ort-tensorrt",
    "ort-plugin:webgpu",
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
                                                     "torch-cuda", "ort-plugin:webgpu"}


@pytest.mark.parametrize("spec", ROUTES, ids=lambda s: s.name)
def test_spec_is_consistent(spec):
    assert spec.runtime in RUNTIMES.values()
    assert all(runtime_of(f) == spec.runtime for f in spec.formats)  # the artifact's runtime family
    if spec.runtime == "onnxruntime":
        assert spec.ep and spec.ep.endswith("ExecutionProvider") and spec.torch_device is None
    else:
        assert spec.torch_device and spec.ep is None and spec.plugin_module is None
    assert set(spec.formats) <= set(FORMATS)
    assert spec.device_class in DEVICE_CLASSES
    assert spec.device_class == spec.device_classes[0]
    assert set(spec.device_classes) <= set(DEVICE_CLASSES)
    assert spec.os_side in ("this", "windows")
    assert set(spec.platforms) <= {"linux", "wsl", "windows", "darwin"}
    assert spec.packages and all(spec.packages.values())
    gpu_vendors = {v for cls, v in spec.drives if cls.startswith("gpu")}
    assert spec.gpu_vendor is None or gpu_vendors == {spec.gpu_vendor}  # per-EP facts agree with drives
    assert not spec.device_id_picks_gpu or gpu_vendors


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


# -- per-route facts on the spec (routes as data: docs/design.md §2) -------------------------------


def test_unverified_routes_say_their_constants_are_not_measured():
    """Moved from tests/ledger/test_footprint.py with the costs (``ROUTE_COSTS`` → ``spec.cost``)."""
    for spec in ROUTES:
        for cost in (spec.cost, spec.gpu_build_cost):
            if cost is not None:
                assert cost.measured == ("not measured" not in cost.basis), spec.name
    assert get_spec("ort-cpu").cost.measured and get_spec("ort-openvino").cost.measured
    assert not get_spec("ort-cuda").cost.measured


def test_a_spec_without_a_cost_still_gets_a_budget(tmp_path):
    """Moved from tests/ledger/test_footprint.py: an unknown route reserves the fallback."""
    from xstage import builtin_graphs
    from xstage.artifact import inspect_artifact
    from xstage.ledger import footprint

    spec = dataclasses.replace(get_spec("ort-cpu"), name="ort-future", cost=specs.UNKNOWN_COST)
    path = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "m.onnx")
    res = footprint.reservations(inspect_artifact(path), spec.memory_cost(), "host_ram", {"x": (8, 256)},
                                 route=spec.name)
    assert res[0].purpose == "runtime" and "unknown route" in res[0].basis
    assert res[0].basis.startswith("ort-future: ")


def test_a_cuda_build_of_torch_costs_more_on_the_cpu_route():
    cpu = get_spec("torch-cpu")
    assert cpu.memory_cost({"torch": "2.13.0"}) is cpu.cost
    assert cpu.memory_cost({"torch": "2.11.0+cu130"}) is cpu.gpu_build_cost
    assert cpu.memory_cost({"torch": "2.4.0+rocm6.1"}) is cpu.gpu_build_cost
    assert cpu.gpu_build_cost.base_bytes > cpu.cost.base_bytes
    assert get_spec("torch-cuda").memory_cost({"torch": "2.11.0+cu130"}) is get_spec("torch-cuda").cost


def test_the_reference_arms_are_flags_on_the_specs():
    assert [s.name for s in ROUTES if s.reference_arm] == ["ort-cpu", "torch-cpu"]
    assert specs.reference_spec("onnxruntime").name == "ort-cpu"
    assert specs.reference_spec("torch").name == "torch-cpu"
    with pytest.raises(KeyError):
        specs.reference_spec("tvm")


def test_the_variant_policy_lives_on_the_spec():
    ov = get_spec("ort-openvino")
    assert ov.default_variant("intel")[0] == "plugin"
    assert ov.default_variant("amd")[0] == "builtin"
    assert get_spec("ort-cpu").default_variant("amd") == ("default", "ort-cpu has one package set")


def test_the_torch_options_live_on_the_spec():
    assert "TF32" in get_spec("torch-cuda").fp32_strict_note
    assert not get_spec("torch-cpu").fp32_strict_note
    assert get_spec("torch-dml").adapter_by_name and not get_spec("torch-cuda").adapter_by_name
