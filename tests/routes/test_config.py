"""Interpreter precedence: env var > ./xstage.toml > user config > route env > current."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from xstage.host.wsl import WslInfo
from xstage.routes import HostInfo, InterpreterSource, ReasonCode, choose_interpreter, envs, get_spec
from xstage.routes import config as cfg

LINUX = HostInfo(platform="linux")
SPEC = get_spec("ort-openvino")


@pytest.fixture
def interpreters(fake_python):
    """Four distinct executables standing in for interpreters (choice does not run them)."""
    return {
        name: fake_python("exit 0", name=f"python-{name}") for name in ("env", "project", "user", "routeenv")
    }


@pytest.fixture
def layers(tmp_path, interpreters, xstage_home, monkeypatch, trusted_toml):
    """Every layer configured: env var, ./xstage.toml, user config, route env."""
    project = tmp_path / "project"
    project.mkdir()
    user = tmp_path / "user.toml"
    user.write_text(f'[routes.ort-openvino]\npython = "{interpreters["user"]}"\n')
    monkeypatch.setenv("XSTAGE_CONFIG", str(user))
    trusted_toml(project, f'[routes.ort-openvino]\npython = "{interpreters["project"]}"\n')
    env_python = envs.venv_python(envs.env_dir("ort-openvino"))
    env_python.parent.mkdir(parents=True)
    env_python.symlink_to(interpreters["routeenv"])
    return {"cwd": project, "environ": {"XSTAGE_PYTHON_ORT_OPENVINO": str(interpreters["env"])}}


def _choose(layers, *, environ=None, host=LINUX, spec=SPEC):
    import os

    env = dict(os.environ)
    env.pop("XSTAGE_PYTHON_ORT_OPENVINO", None)
    env.update(layers["environ"] if environ is None else environ)
    return choose_interpreter(spec, host=host, environ=env, cwd=layers["cwd"])


def test_env_var_wins(layers, interpreters):
    choice = _choose(layers)
    assert (choice.path, choice.source, choice.failure) == (
        str(interpreters["env"]),
        InterpreterSource.ENV_VAR,
        None,
    )


def test_project_config_is_second(layers, interpreters):
    choice = _choose(layers, environ={})
    assert (choice.path, choice.source) == (str(interpreters["project"]), InterpreterSource.PROJECT_CONFIG)


def test_user_config_is_third(layers, interpreters):
    (layers["cwd"] / "xstage.toml").unlink()
    choice = _choose(layers, environ={})
    assert (choice.path, choice.source) == (str(interpreters["user"]), InterpreterSource.USER_CONFIG)


def test_route_env_is_fourth(layers, monkeypatch, tmp_path):
    (layers["cwd"] / "xstage.toml").unlink()
    monkeypatch.setenv("XSTAGE_CONFIG", str(tmp_path / "absent.toml"))
    choice = _choose(layers, environ={})
    assert choice.source is InterpreterSource.ROUTE_ENV
    assert choice.path == str(envs.venv_python(envs.env_dir("ort-openvino")))


def test_current_interpreter_is_last(tmp_path):
    choice = choose_interpreter(SPEC, host=LINUX, environ={}, cwd=tmp_path)
    assert (choice.path, choice.source) == (sys.executable, InterpreterSource.CURRENT)


def test_a_missing_configured_interpreter_does_not_fall_back(layers, tmp_path):
    missing = tmp_path / "gone" / "python"
    choice = _choose(layers, environ={"XSTAGE_PYTHON_ORT_OPENVINO": str(missing)})
    assert choice.failure[0] is ReasonCode.INTERPRETER_NOT_FOUND
    assert choice.path == str(missing)


def test_a_broken_route_env_is_not_found_not_skipped(tmp_path):
    envs.env_dir("ort-openvino").mkdir(parents=True)
    choice = choose_interpreter(SPEC, host=LINUX, environ={}, cwd=tmp_path)
    assert choice.source is InterpreterSource.ROUTE_ENV
    assert choice.failure[0] is ReasonCode.INTERPRETER_NOT_FOUND
    assert choice.failure[2] == "rebuild it: xstage env create ort-openvino --force"


def test_relative_paths_are_relative_to_the_toml(tmp_path, fake_python, trusted_toml):
    python = fake_python("exit 0")
    trusted_toml(tmp_path, f'[routes.ort-openvino]\npython = "{python.relative_to(tmp_path)}"\n')
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    choice = choose_interpreter(SPEC, host=LINUX, environ={}, cwd=tmp_path)
    assert choice.path == str(python) and choice.failure is None


def test_bare_names_come_from_path(tmp_path):
    import shutil

    choice = choose_interpreter(SPEC, host=LINUX, environ={SPEC.env_var: "python3"}, cwd=tmp_path)
    assert choice.path == shutil.which("python3")


def test_a_windows_value_is_translated_under_wsl(tmp_path):
    wsl_host = HostInfo(platform="wsl", wsl=WslInfo(is_wsl=True, interop=True, distro="U"))
    spec = get_spec("ort-dml")
    choice = choose_interpreter(
        spec, host=wsl_host, environ={spec.env_var: "C:\\venvs\\dml\\Scripts\\python.exe"}, cwd=tmp_path
    )
    assert choice.path == "/mnt/c/venvs/dml/Scripts/python.exe"
    assert choice.failure[0] is ReasonCode.INTERPRETER_NOT_FOUND


def test_user_config_path(monkeypatch, tmp_path):
    monkeypatch.setenv("XSTAGE_CONFIG", str(tmp_path / "c.toml"))
    assert cfg.user_config_path() == tmp_path / "c.toml"
    monkeypatch.delenv("XSTAGE_CONFIG")
    import platformdirs

    assert cfg.user_config_path() == Path(platformdirs.user_config_dir("xstage")) / "config.toml"


def test_load_reports_problems_as_data(tmp_path):
    assert cfg.load(tmp_path / "none.toml").exists is False
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    assert cfg.load(bad).error.startswith(f"{bad} is not valid TOML")
    odd = tmp_path / "odd.toml"
    odd.write_text("routes = 3\n")
    with pytest.raises(ValueError, match=r"\[routes\] must be a table"):
        cfg.load(odd).route_python("ort-cpu")
