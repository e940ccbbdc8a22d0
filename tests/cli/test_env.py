"""``xstage env create|list|remove`` through the CLI, in both output modes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from xstage.cli.main import main
from xstage.routes import envs

PYENV39 = list(Path.home().glob(".pyenv/versions/3.9.*/bin/python"))


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_env_list_empty(capsys):
    doc = _json(capsys, "env", "list", "--json")
    assert doc == {"envs": [], "envs_dir": str(envs.env_dir("x").parent)}
    assert main(["env", "list"]) == 0
    assert "no route environments under" in capsys.readouterr().out


def test_env_create_windows_side_route_prints_powershell(capsys):
    assert main(["env", "create", "ort-vitisai", "--python", "3.13"]) == 0
    out = capsys.readouterr().out
    assert "ort-vitisai lives on the Windows side; run these in PowerShell on Windows:" in out
    assert 'py -3.13 -m venv "$env:LOCALAPPDATA\\xstage\\envs\\ort-vitisai"' in out
    assert '-m pip install "onnxruntime>=1.25" "numpy"' in out
    assert not envs.env_dir("ort-vitisai").exists()


def test_env_create_unknown_route_is_usage(capsys):
    assert main(["env", "create", "ort-nope"]) == 64
    assert "unknown route 'ort-nope'" in capsys.readouterr().err


def test_env_create_unknown_variant_is_usage(capsys):
    assert main(["env", "create", "ort-openvino", "--variant", "gpu"]) == 64
    err = capsys.readouterr().err
    assert "ort-openvino has no variant 'gpu'" in err and "variants of ort-openvino: plugin, builtin" in err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="this interpreter has torch")
def test_env_create_unpinned_torch_is_refused(capsys):
    assert main(["env", "create", "torch-cpu"]) == 1
    err = capsys.readouterr().err
    assert "refusing to install an unpinned torch for torch-cpu" in err
    assert "xstage env create torch-cpu --pin torch==<version>" in err


def test_env_create_missing_python_version(capsys):
    assert main(["env", "create", "ort-cpu", "--python", "2.5"]) == 1
    assert "no Python 2.5 found" in capsys.readouterr().err


def test_env_remove_missing(capsys):
    assert main(["env", "remove", "ort-cpu"]) == 1
    assert "no environment for ort-cpu" in capsys.readouterr().err


def test_env_without_verb_shows_help(capsys):
    assert main(["env"]) == 64


@pytest.mark.slow(reason="env create builds a pinned CPython 3.9 venv: minutes of pip")
@pytest.mark.timeout(1800)  # the pip install of a venv, in the test's body
@pytest.mark.skipif(not PYENV39, reason="no pyenv CPython 3.9 here")
def test_env_create_py39_pinned_then_devices_then_remove(capsys):
    """The issue's example end to end: build, list, resolve, remove."""
    assert main(["env", "create", "ort-cpu", "--python", "3.9", "--pin", "onnxruntime==1.19.2"]) == 0
    out = capsys.readouterr().out
    assert "created ort-cpu:" in out and "onnxruntime 1.19.2" in out
    (listed,) = _json(capsys, "env", "list", "--json")["envs"]
    assert listed["route"] == "ort-cpu" and listed["python_version"].startswith("3.9.")
    assert listed["packages"] == ["onnxruntime==1.19.2", "numpy<2"]
    route = {r["name"]: r for r in _json(capsys, "devices", "--json")["routes"]}["ort-cpu"]
    assert route["status"] == "resolved" and route["interpreter_source"] == "route_env"
    assert route["versions"]["onnxruntime"] == "1.19.2" and route["versions"]["python"].startswith("3.9.")
    assert main(["env", "create", "ort-cpu", "--python", "3.9"]) == 1  # exists: needs --force
    assert "already exists" in capsys.readouterr().err
    assert main(["env", "remove", "ort-cpu"]) == 0
    assert "removed ort-cpu" in capsys.readouterr().out
    assert _json(capsys, "env", "list", "--json")["envs"] == []


def test_env_create_exist_ok_keeps_an_existing_env(capsys, tmp_path):
    """`--exist-ok` makes the README's main command re-runnable; without it, a clear error."""
    import sys

    target = envs.env_dir("ort-cpu")
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").symlink_to(sys.executable)
    assert main(["env", "create", "ort-cpu", "--exist-ok"]) == 0
    assert "ort-cpu exists" in capsys.readouterr().out
    assert main(["env", "create", "ort-cpu"]) == 1
    assert "already exists" in capsys.readouterr().err
