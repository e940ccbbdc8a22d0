"""Which interpreter serves a route: the precedence, first match wins, and nothing probed.

Interpreter precedence (first match wins; a configured interpreter that is missing is
*missing*, it never falls back to the next):

1. ``XSTAGE_PYTHON_<ROUTE>`` (``ort-openvino`` → ``XSTAGE_PYTHON_ORT_OPENVINO``)
2. ``./xstage.toml``: ``[routes.<route>] python = "..."``, once trusted (``config.project_config``)
3. the user config file (``xstage.routes.config.user_config_path``)
4. the environment ``xstage env create <route>`` made (``XSTAGE_HOME/envs/<route>/``)
5. the current interpreter (``sys.executable``), for routes on this OS's side
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from xstage.host import wsl
from xstage.host.info import HostInfo
from xstage.routes import config as cfg
from xstage.routes import envs
from xstage.routes.specs import RouteSpec
from xstage.routes.status import InterpreterChoice, InterpreterSource, ReasonCode

__all__ = ["choose_interpreter"]


def _check_exists(path: str, origin: str, spec: RouteSpec, fix: str) -> tuple[ReasonCode, str, str] | None:
    if not os.path.isfile(path):
        return (
            ReasonCode.INTERPRETER_NOT_FOUND,
            f"interpreter not found at {path} (set by {origin})",
            fix,
        )
    if not os.access(path, os.X_OK):
        return (
            ReasonCode.INTERPRETER_NOT_FOUND,
            f"{path} (set by {origin}) is not executable",
            fix,
        )
    return None


def _translate_windows_value(value: str, host: HostInfo) -> str:
    if host.platform == "wsl" and re.match(r"^[A-Za-z]:[\\/]", value):
        return wsl.to_wsl_path(value)
    return value


def choose_interpreter(
    spec: RouteSpec,
    *,
    host: HostInfo,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> InterpreterChoice:
    """Pick ``spec``'s interpreter by the precedence in the module docstring (no probing).

    From WSL, a Windows-side route's interpreter must be a Windows executable (``.exe``);
    anything else is ``wrong_os`` before it is ever started with Windows paths.
    """
    choice = _choose(spec, host=host, environ=environ, cwd=cwd)
    cross = spec.os_side == "windows" and host.platform == "wsl"
    if cross and choice.path and not choice.failure and not choice.path.lower().endswith(".exe"):
        return dataclasses.replace(
            choice,
            failure=(
                ReasonCode.WRONG_OS,
                f"{choice.path} (set by {choice.origin}) is not a Windows executable (.exe); "
                f"{spec.name} runs a Windows interpreter",
                f"point {spec.env_var} at a Windows python.exe (e.g. /mnt/c/.../Scripts/python.exe)",
            ),
        )
    return choice


def _choose(
    spec: RouteSpec,
    *,
    host: HostInfo,
    environ: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
) -> InterpreterChoice:
    env = os.environ if environ is None else environ
    base = Path(cwd if cwd is not None else os.getcwd())
    value = env.get(spec.env_var, "").strip()
    if value:
        path = cfg.resolve_python_value(_translate_windows_value(value, host), base=base)
        fix = f"point {spec.env_var} at an existing interpreter, or unset it"
        failure = _check_exists(path, spec.env_var, spec, fix)
        return InterpreterChoice(path, InterpreterSource.ENV_VAR, spec.env_var, failure)
    files = (
        (InterpreterSource.PROJECT_CONFIG, cfg.project_config(base)),  # only once trusted
        (InterpreterSource.USER_CONFIG, cfg.user_config(env)),
    )
    for source, loaded in files:
        config_path = loaded.path
        if loaded.error:
            return InterpreterChoice(
                None,
                source,
                str(config_path),
                (ReasonCode.CONFIG_INVALID, loaded.error, f"fix or remove {config_path}"),
            )
        try:
            raw = loaded.route_python(spec.name)
        except ValueError as exc:
            return InterpreterChoice(
                None, source, str(config_path), (ReasonCode.CONFIG_INVALID, str(exc), f"fix {config_path}")
            )
        if raw is not None:
            origin = f"{config_path} [routes.{spec.name}] python"
            path = cfg.resolve_python_value(_translate_windows_value(raw, host), base=config_path.parent)
            fix = f"fix or remove `python` under [routes.{spec.name}] in {config_path}"
            return InterpreterChoice(path, source, origin, _check_exists(path, origin, spec, fix))
    env_dir = envs.env_dir(spec.name)
    if env_dir.exists():
        path = str(envs.venv_python(env_dir))
        origin = f"xstage env create {spec.name} ({env_dir})"
        fix = f"rebuild it: xstage env create {spec.name} --force"
        return InterpreterChoice(
            path, InterpreterSource.ROUTE_ENV, origin, _check_exists(path, origin, spec, fix)
        )
    if spec.os_side == "windows" and host.platform != "windows":
        return InterpreterChoice(
            None,
            InterpreterSource.NONE,
            "",
            (
                ReasonCode.INTERPRETER_NOT_CONFIGURED,
                f"no Windows interpreter is configured for {spec.name} "
                f"({spec.env_var}, ./xstage.toml and the user config name none)",
                f"run `xstage env create {spec.name}` for the PowerShell commands that build one, "
                f"then set {spec.env_var}=/mnt/c/.../Scripts/python.exe",
            ),
        )
    return InterpreterChoice(sys.executable, InterpreterSource.CURRENT, "the current interpreter")
