"""Route resolution: which interpreter serves each route, and does it work — never raising.

For each route: check the host can have it at all, pick its interpreter (``interpreters``),
probe that interpreter by running it (``probe``), and judge the probe against the spec (the
checks every route shares here, then its runtime's judge in ``judges``). The result is a
``RouteStatus`` (``status``): ``resolved`` with the devices it drives, or ``missing`` with a
``ReasonCode`` from a closed set, a reason naming what was found, and a remedy naming the
next command to run.

Check order (the first failing check names the reason): host platform (``wrong_os``),
WSL interop for Windows-side routes (``wsl_interop_unavailable``), the interpreter choice
(``config_invalid``, ``interpreter_not_found``, ``interpreter_not_configured``), the probe
(``interpreter_failed``; also a Python older than 3.9 or of the wrong OS), then the runtime
(``runtime_not_importable``, ``runtime_version_unsupported``, ``ep_not_in_build``,
``ep_no_device``, ``backend_not_importable``, ``device_not_available``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from xstage.errors import UsageError
from xstage.host import hardware as hw
from xstage.host import wsl
from xstage.host.info import HostInfo
from xstage.routes.interpreters import choose_interpreter
from xstage.routes.judges import JUDGES, Verdict, fail
from xstage.routes.probe import ProbeOutcome, ProbeRequest, probe_many
from xstage.routes.specs import ROUTES, RouteSpec, get_spec
from xstage.routes.status import InterpreterChoice, InterpreterSource, ReasonCode, RouteStatus

__all__ = [
    "HostInfo",
    "InterpreterChoice",
    "InterpreterSource",
    "ReasonCode",
    "RouteStatus",
    "choose_interpreter",
    "evaluate",
    "resolve",
    "resolve_all",
    "resolve_specs",
]

_MIN_PYTHON = (3, 9)


def _versions(data: Mapping[str, Any] | None) -> dict[str, str]:
    if not data:
        return {}
    out: dict[str, str] = {}
    py = data.get("python") or {}
    if py.get("version"):
        out["python"] = py["version"]
    numpy = data.get("numpy") or {}
    if numpy.get("version"):
        out["numpy"] = numpy["version"]
    ort = data.get("onnxruntime") or {}
    if ort.get("version"):
        out["onnxruntime"] = ort["version"]
        dists = ort.get("distributions") or {}
        if dists:
            out["onnxruntime_distribution"] = ",".join(sorted(dists))
    for module, plugin in (ort.get("plugins") or {}).items():
        if plugin.get("version"):
            out[module] = plugin["version"]
    torch = data.get("torch") or {}
    if torch.get("version"):
        out["torch"] = torch["version"]
        if torch.get("cuda_version"):
            out["torch_cuda"] = torch["cuda_version"]
        dml = torch.get("torch_directml") or {}
        if dml.get("version"):
            out["torch_directml"] = dml["version"]
    return out


def _pre_checks(spec: RouteSpec, host: HostInfo) -> tuple[ReasonCode, str, str] | None:
    if host.platform not in spec.platforms:
        if spec.platforms == ("darwin",):
            need, where = "macOS", "a Mac"
        elif set(spec.platforms) <= {"windows", "wsl"} and spec.os_side == "windows":
            need, where = "Windows (natively, or reached from WSL)", "Windows or in WSL on a Windows machine"
        elif set(spec.platforms) <= {"windows", "wsl"}:
            need = "Windows or WSL (DirectML reaches the GPU through /dev/dxg)"
            where = "Windows or in WSL on a Windows machine"
        else:
            need = where = " or ".join(spec.platforms)
        return (
            ReasonCode.WRONG_OS,
            f"{spec.name} needs {need}; this host is {host.label}",
            f"run xstage on {where} to use {spec.name}",
        )
    if spec.os_side == "windows" and host.platform == "wsl" and not host.wsl.interop:
        return (
            ReasonCode.WSL_INTEROP_UNAVAILABLE,
            f"{spec.name} runs a Windows interpreter, and WSL interop (starting Windows programs "
            f"from WSL) is not available here ({'; '.join(host.wsl.evidence) or 'no WSLInterop entry'})",
            "enable it: [interop] enabled=true in /etc/wsl.conf, then `wsl.exe --shutdown` from Windows",
        )
    return None


def _status(
    spec: RouteSpec,
    choice: InterpreterChoice | None,
    verdict: Verdict,
    outcome: ProbeOutcome | None,
) -> RouteStatus:
    data = outcome.data if outcome is not None and outcome.ok else None
    return RouteStatus(
        name=spec.name,
        spec=spec,
        status="missing" if verdict.code else "resolved",
        reason_code=verdict.code,
        reason=verdict.reason,
        remedy=verdict.remedy,
        interpreter=choice.path if choice else None,
        interpreter_source=(choice.source.value if choice else InterpreterSource.NONE.value),
        versions=_versions(data),
        verified=spec.verified,
        devices=tuple(verdict.devices) if not verdict.code else (),
        device_details=verdict.details if not verdict.code else {},
        probe=data,
        ep_plugin=verdict.ep_plugin if not verdict.code else None,
        probe_cached=bool(outcome and outcome.cached),
    )


def evaluate(
    spec: RouteSpec,
    choice: InterpreterChoice | None,
    outcome: ProbeOutcome | None,
    *,
    host: HostInfo,
    hardware: Sequence[hw.Device] = (),
) -> RouteStatus:
    """Judge one route from its choice and its probe (pure: no processes, no files)."""
    pre = _pre_checks(spec, host)
    if pre:
        # Name a configured interpreter (it tells the user what they set); not the fallback.
        shown = choice if choice and choice.source is not InterpreterSource.CURRENT else None
        return _status(spec, shown, fail(*pre), None)
    if choice is None or choice.failure is not None:
        failure = (
            choice.failure
            if choice and choice.failure
            else (ReasonCode.INTERPRETER_NOT_CONFIGURED, "no interpreter", f"set {spec.env_var}")
        )
        return _status(spec, choice, fail(*failure), None)
    if outcome is None or not outcome.ok or outcome.data is None:
        error = outcome.error if outcome else "no probe ran"
        tail = outcome.stderr_tail if outcome else ""
        return _status(
            spec,
            choice,
            fail(
                ReasonCode.INTERPRETER_FAILED,
                f"probing {choice.path} failed: {error}"
                + (f"\n--- stderr (last lines) ---\n{tail}" if tail else ""),
                f'run `{choice.path} -c "import sys; print(sys.version)"` to see what is wrong, '
                f"or point {spec.env_var} at a working Python >= 3.9",
            ),
            outcome,
        )
    data = outcome.data
    py = data.get("python") or {}
    info = tuple(py.get("version_info") or ())
    if info < _MIN_PYTHON:
        return _status(
            spec,
            choice,
            fail(
                ReasonCode.INTERPRETER_FAILED,
                f"{choice.path} is Python {py.get('version', '?')}; the worker needs Python >= 3.9",
                f"point {spec.env_var} at Python >= 3.9, or xstage env create {spec.name} --python 3.11",
            ),
            outcome,
        )
    is_windows_python = py.get("platform") == "win32"
    wants_windows = spec.os_side == "windows" or host.platform == "windows"
    if is_windows_python != wants_windows:
        kind = "a Windows" if is_windows_python else f"a {py.get('platform', '?')}"
        need = "a Windows interpreter" if wants_windows else f"an interpreter of this OS ({host.label})"
        return _status(
            spec,
            choice,
            fail(
                ReasonCode.WRONG_OS,
                f"{choice.path} (set by {choice.origin}) is {kind} Python; {spec.name} needs {need}",
                f"point {spec.env_var} at {need}",
            ),
            outcome,
        )
    judge = JUDGES[spec.runtime]
    return _status(spec, choice, judge(spec, choice, data, host, hardware), outcome)


# ---------------------------------------------------------------------------- orchestration


def _windows_root(host: HostInfo) -> str | None:
    from xstage.client import staging as remote_pkg

    return wsl.to_windows_path(str(remote_pkg.staged_root()), distro=host.wsl.distro)


def resolve_specs(
    specs: Sequence[RouteSpec],
    *,
    refresh: bool = False,
    host: HostInfo | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    hardware: Sequence[hw.Device] | None = None,
    timeout: float | None = None,
) -> list[RouteStatus]:
    """Resolve ``specs`` (any specs, not only the built-in ones); never raises.

    Interpreters shared by several routes are probed once, with what all of them need
    (torch if any torch route uses it, every plugin EP module), so ``resolve("ort-cpu")``
    and ``resolve_all()`` share cache entries.
    """
    host = host or HostInfo.current()
    hardware = list(hardware) if hardware is not None else hw.discover(refresh=refresh)
    every = list(dict.fromkeys([*specs, *ROUTES]))
    choices = {s.name: choose_interpreter(s, host=host, environ=environ, cwd=cwd) for s in every}
    plugins = tuple(sorted({s.plugin_module for s in every if s.plugin_module}))
    needs: dict[tuple[str, bool], set[str]] = {}
    for spec in every:
        choice = choices[spec.name]
        if choice.path is None or choice.failure or _pre_checks(spec, host):
            continue
        cross = spec.os_side == "windows" and host.platform == "wsl"
        needs.setdefault((choice.path, cross), set()).add(spec.runtime)
    requests: dict[tuple[str, bool], ProbeRequest] = {}
    root_error: str | None = None
    for (path, cross), runtimes in needs.items():
        windows_root = None
        if cross:
            try:
                windows_root = _windows_root(host)
            except wsl.WindowsPathError as exc:
                root_error = exc.message
                continue
        requests[(path, cross)] = ProbeRequest(
            interpreter=path, torch="torch" in runtimes, plugins=plugins, windows_root=windows_root
        )

    def key_of(spec: RouteSpec) -> tuple[str, bool]:
        return (choices[spec.name].path or "", spec.os_side == "windows" and host.platform == "wsl")

    wanted = [requests[key_of(spec)] for spec in specs if key_of(spec) in requests]
    outcomes = probe_many(wanted, refresh=refresh, timeout=timeout)
    statuses = []
    for spec in specs:
        choice = choices[spec.name]
        key = key_of(spec)
        outcome = outcomes.get(requests[key]) if key in requests else None
        if outcome is None and root_error and choice.path and not choice.failure:
            outcome = ProbeOutcome(ok=False, error=root_error)
        statuses.append(evaluate(spec, choice, outcome, host=host, hardware=hardware))
    return statuses


def resolve(
    name: str,
    *,
    refresh: bool = False,
    host: HostInfo | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    hardware: Sequence[hw.Device] | None = None,
    timeout: float | None = None,
) -> RouteStatus:
    """Resolve one route by name; never raises for anything about the route.

    The keyword arguments past ``refresh`` exist for tests and callers that already hold
    them (see ``resolve_specs``).

    Raises:
        UsageError: no route is called ``name`` (the message lists the routes).
    """
    try:
        spec = get_spec(name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0]), remedy="xstage devices lists every route") from None
    return resolve_specs(
        [spec], refresh=refresh, host=host, environ=environ, cwd=cwd, hardware=hardware, timeout=timeout
    )[0]


def resolve_all(
    *,
    refresh: bool = False,
    host: HostInfo | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    hardware: Sequence[hw.Device] | None = None,
    timeout: float | None = None,
) -> list[RouteStatus]:
    """Resolve every route, in the fixed route order, probing interpreters in parallel."""
    return resolve_specs(
        list(ROUTES), refresh=refresh, host=host, environ=environ, cwd=cwd, hardware=hardware, timeout=timeout
    )
