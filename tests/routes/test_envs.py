"""Route environments: planning (pure), and what the real builds left on disk."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from xstage.errors import EnvError, UsageError
from xstage.routes import envs, get_spec


def test_merge_pins_replaces_same_named_packages():
    assert envs.merge_pins(("onnxruntime", "numpy"), ["onnxruntime==1.20.1"]) == (
        "onnxruntime==1.20.1",
        "numpy",
    )
    assert envs.merge_pins(("onnxruntime",), ["ml_dtypes==0.5.0"]) == ("onnxruntime", "ml_dtypes==0.5.0")
    assert envs.merge_pins(("onnxruntime-ep-openvino",), ["onnxruntime_ep_openvino==1.8.1"]) == (
        "onnxruntime_ep_openvino==1.8.1",
    )


def test_old_onnxruntime_pins_numpy_below_2():
    assert envs.merge_pins(("onnxruntime", "numpy"), ["onnxruntime==1.19.2"]) == (
        "onnxruntime==1.19.2",
        "numpy<2",
    )
    assert envs.merge_pins(("onnxruntime", "numpy"), ["onnxruntime==1.19.2", "numpy==1.24.4"]) == (
        "onnxruntime==1.19.2",
        "numpy==1.24.4",
    )


def test_rejects_a_pin_that_is_not_a_requirement():
    with pytest.raises(UsageError, match="not a package requirement"):
        envs.merge_pins(("numpy",), ["==1.0"])


def test_openvino_variant_follows_the_cpu_vendor():
    spec = get_spec("ort-openvino")
    assert envs.default_variant(spec, "intel")[0] == "plugin"
    variant, why = envs.default_variant(spec, "amd")
    assert variant == "builtin"
    assert why.startswith("this CPU is AMD, not Intel: the plugin EP onnxruntime-ep-openvino lists no")


def test_find_python_by_version():
    pyenv = list(Path.home().glob(".pyenv/versions/3.9.*/bin/python"))
    if not pyenv:
        pytest.skip("no pyenv CPython 3.9 here")
    path, version = envs.find_python("3.9")
    assert version.startswith("3.9.") and Path(path).is_file()


def test_find_python_current_and_missing():
    assert envs.find_python(None) == (sys.executable, ".".join(map(str, sys.version_info[:3])))
    with pytest.raises(EnvError, match=r"no Python 2\.5 found \(looked in: "):
        envs.find_python("2.5")
    with pytest.raises(UsageError, match="--python takes X.Y or a path"):
        envs.find_python("three")


def test_plan_windows_side_route_prints_powershell():
    plan = envs.plan("ort-dml", host_platform="wsl", cpu_vendor="amd")
    assert plan.action == "powershell"
    assert plan.powershell == (
        'py -3.12 -m venv "$env:LOCALAPPDATA\\xstage\\envs\\ort-dml"',
        '& "$env:LOCALAPPDATA\\xstage\\envs\\ort-dml\\Scripts\\python.exe" -m pip install --upgrade pip',
        '& "$env:LOCALAPPDATA\\xstage\\envs\\ort-dml\\Scripts\\python.exe" -m pip install '
        '"onnxruntime-directml<1.25" "numpy"',
        '& "$env:LOCALAPPDATA\\xstage\\envs\\ort-dml\\Scripts\\python.exe" -c '
        '"import onnxruntime as o; print(o.__version__, o.get_available_providers())"',
    )
    assert (
        "XSTAGE_PYTHON_ORT_DML=/mnt/c/Users/<you>/AppData/Local/xstage/envs/ort-dml/Scripts/python.exe"
        in (plan.message)
    )


def test_plan_windows_route_on_windows_builds():
    plan = envs.plan("ort-vitisai", host_platform="windows", cpu_vendor="amd")
    assert plan.action == "build" and plan.packages == ("onnxruntime>=1.25", "numpy")


def test_plan_refuses_a_route_this_host_cannot_have():
    with pytest.raises(EnvError, match=r"ort-coreml cannot run on this host \(linux\); it needs darwin"):
        envs.plan("ort-coreml", host_platform="linux", cpu_vendor="amd")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="this interpreter has torch")
def test_plan_refuses_unpinned_torch():
    with pytest.raises(EnvError, match="refusing to install an unpinned torch for torch-cpu") as err:
        envs.plan("torch-cpu", host_platform="linux", cpu_vendor="amd")
    assert err.value.remedy == "pin it: xstage env create torch-cpu --pin torch==<version>"
    plan = envs.plan("torch-cpu", pins=["torch==2.13.0"], host_platform="linux", cpu_vendor="amd")
    assert plan.action == "build" and plan.packages == ("torch==2.13.0", "numpy")


def test_plan_unknown_variant_and_route():
    with pytest.raises(UsageError, match="ort-openvino has no variant 'gpu'"):
        envs.plan("ort-openvino", variant="gpu", host_platform="linux", cpu_vendor="amd")
    with pytest.raises(UsageError, match="unknown route"):
        envs.plan("ort-nope", host_platform="linux", cpu_vendor="amd")


def test_the_py39_env_as_built(py39_ort119_python):
    """What envs.create left: a manifest, retargeted scripts, no half-built folder."""
    root = py39_ort119_python.parent.parent
    manifest = json.loads((root / envs.MANIFEST_NAME).read_text())
    assert manifest["route"] == "ort-cpu" and manifest["pins"] == ["onnxruntime==1.19.2"]
    assert manifest["packages"] == ["onnxruntime==1.19.2", "numpy<2"]
    assert manifest["installed"]["onnxruntime"] == "1.19.2"
    assert manifest["installed"]["numpy"].startswith("1.")
    assert manifest["python"] == str(py39_ort119_python)
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]
    pip_script = (root / "bin" / "pip").read_text().splitlines()[0]
    assert pip_script.startswith(f"#!{root}/bin/python")  # the final path, not the build folder


def test_create_refuses_to_overwrite_without_force(tmp_path):
    plan = envs.plan("ort-cpu", host_platform="linux", cpu_vendor="amd")
    plan.target.mkdir(parents=True)
    with pytest.raises(EnvError, match="already exists") as err:
        envs.create(plan)
    assert "--force" in err.value.remedy


@pytest.mark.network
@pytest.mark.timeout(900)  # pip resolving against the index, in the test's body
def test_failed_pip_leaves_nothing_behind():
    plan = envs.plan(
        "ort-cpu", pins=["xstage-no-such-package-anywhere==0.0.1"], host_platform="linux", cpu_vendor="amd"
    )
    with pytest.raises(EnvError) as err:
        envs.create(plan)
    assert err.value.message.startswith(
        "pip install onnxruntime numpy xstage-no-such-package-anywhere==0.0.1 failed"
    )
    assert "is ignored: it is neither a file nor a directory" not in err.value.message
    assert not plan.target.exists()
    assert list(plan.target.parent.iterdir()) == []


def test_list_and_remove(tmp_path):
    root = envs.env_dir("ort-cpu")
    (root / "bin").mkdir(parents=True)
    (root / envs.MANIFEST_NAME).write_text(json.dumps({"route": "ort-cpu", "variant": "default"}))
    (root.parent / ".ort-cpu-build-x").mkdir()  # a half-built folder is not listed
    (info,) = envs.list_envs()
    assert (info.route, info.ok, info.to_dict()["variant"]) == ("ort-cpu", False, "default")
    assert envs.remove("ort-cpu") == root and not root.exists()
    with pytest.raises(EnvError, match="no environment for ort-cpu"):
        envs.remove("ort-cpu")
