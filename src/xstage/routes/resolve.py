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

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xstage.errors import UsageError
from xstage.host import hardware as hw
from xstage.host import wsl
from xstage.host.info import HostInfo
from xstage.routes.interpreters import choose_interpreter
from xstage.routes.judges import JUDGES, Verdict, fail, judge_plugin_ep
from xstage.routes.plugins import (
    APPX_PACKAGE,
    RYZEN_AI_ENV,
    Location,
    all_specs,
    find_spec,
    locate_vitisai,
    wrong_library,
)
from xstage.routes.probe import ProbeOutcome, ProbeRequest, probe_many
from xstage.routes.specs import RouteSpec
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
    for plugin in (ort.get("plugin_eps") or {}).values():
        if plugin.get("version") and plugin.get("module"):
            out[plugin["module"]] = plugin["version"]
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
        steps=tuple(verdict.steps),
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
    location: Location | None = None,
) -> RouteStatus:
    """Judge one route from its choice and its probe (pure: no processes, no files).

    ``location`` is where the client located a plugin EP's library (``plugins.Location``).
    """
    pre = _pre_checks(spec, host)
    if pre:
        # Name a configured interpreter (it tells the user what they set); not the fallback.
        shown = choice if choice and choice.source is not InterpreterSource.CURRENT else None
        return _status(spec, shown, fail(*pre), None)
    if spec.plugin_ep is not None and spec.plugin_ep.error:
        return _status(spec, None, fail(
            ReasonCode.CONFIG_INVALID, spec.plugin_ep.error,
            f"fix the table in {spec.plugin_ep.source} (docs/routes.md, \"Plugin EPs\", lists its keys)"),
            None)
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
    if spec.plugin_ep is not None:
        return _status(spec, choice, judge_plugin_ep(spec, choice, data, host, hardware, location), outcome)
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
    named = {s.name for s in specs}
    by_name = {s.name: s for s in all_specs(cwd=cwd, environ=environ)}
    by_name.update((s.name, s) for s in specs)  # an asked-for spec's own fields win
    every = list(by_name.values())
    choices = {s.name: choose_interpreter(s, host=host, environ=environ, cwd=cwd) for s in every}
    plugins = tuple(sorted({s.plugin_module for s in every if s.plugin_module}))
    needs: dict[tuple[str, bool], set[str]] = {}
    plugin_eps: dict[tuple[str, bool], set[str]] = {}
    locations: dict[str, Location] = {}
    for spec in every:
        choice = choices[spec.name]
        if choice.path is None or choice.failure or _pre_checks(spec, host):
            continue
        cross = spec.os_side == "windows" and host.platform == "wsl"
        needs.setdefault((choice.path, cross), set()).add(spec.runtime)
        if spec.plugin_ep is not None and not spec.plugin_ep.error and spec.name in named:
            location = _locate(spec, host, environ)
            locations[spec.name] = location
            if location.failure is None:
                plugin_eps.setdefault((choice.path, cross), set()).add(_plugin_request(spec, location))
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
            interpreter=path, torch="torch" in runtimes, plugins=plugins, windows_root=windows_root,
            plugin_eps=tuple(sorted(plugin_eps.get((path, cross), ()))),
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
        statuses.append(evaluate(spec, choice, outcome, host=host, hardware=hardware,
                                 location=locations.get(spec.name)))
    return statuses


def _plugin_request(spec: RouteSpec, location: Location) -> str:
    """The probe's ``--plugin-ep`` argument for one plugin route (sorted keys: a cache key)."""
    plugin = spec.plugin_ep
    assert plugin is not None
    request: dict[str, Any] = {"key": spec.name, "ep_name": plugin.ep_name, "dll_dir": plugin.dll_dir}
    if location.path is not None:
        request["library"] = location.path
    elif plugin.module:
        request["module"] = plugin.module
    return json.dumps(request, sort_keys=True)


def _locate(spec: RouteSpec, host: HostInfo, environ: Mapping[str, str] | None) -> Location:
    """Step 1-2 on the client: where the library is (a table's path, or the VitisAI locator)."""
    plugin = spec.plugin_ep
    assert plugin is not None
    if plugin.locate == "vitisai":
        env = os.environ if environ is None else environ
        return locate_vitisai(plugin, environ=env, appx_json=_appx_json(host),
                              ryzen_ai_files=_ryzen_ai_files(env, host),
                              is_file=lambda p: _windows_is_file(p, host))
    if plugin.library is None:
        return Location(None, (f"locate: the package {plugin.module} names its library (asked in the "
                               "probe)",))
    steps = (f"locate: [plugins.{plugin.table}] library = {plugin.library}",)
    wrong = wrong_library(plugin, plugin.library)
    if wrong is not None:
        return Location(None, steps, wrong)
    if spec.os_side == "this" and not os.path.isfile(plugin.library):
        return Location(None, steps, (
            ReasonCode.EP_LIBRARY_NOT_FOUND,
            f"[plugins.{plugin.table}] library names {plugin.library}, which is not a file",
            f"fix library under [plugins.{plugin.table}] in {plugin.source}"))
    return Location(plugin.library, steps)


def _windows_is_file(path: str, host: HostInfo) -> bool:
    """Whether a Windows path names a file, read by its full path (``WindowsApps`` denies listing)."""
    local = wsl.to_wsl_path(path) if host.platform == "wsl" else path
    return os.path.isfile(local)


def _appx_json(host: HostInfo) -> str | None:
    """``Get-AppxPackage`` for the VitisAI EP package, as JSON (None where there is no PowerShell)."""
    if host.platform not in ("windows", "wsl"):
        return None
    from xstage.client.tools import run_tool

    exe = "powershell.exe"
    command = (f"Get-AppxPackage -Name '{APPX_PACKAGE}' | Select-Object Name, Version, InstallLocation "
               "| ConvertTo-Json -Compress")
    return run_tool([exe, "-NoProfile", "-NonInteractive", "-Command", command], 30, check=False)


def _ryzen_ai_files(environ: Mapping[str, str], host: HostInfo) -> list[str]:
    """The general VitisAI library under Ryzen AI's install folder (three levels deep at most)."""
    if host.platform not in ("windows", "wsl"):
        return []
    root = environ.get(RYZEN_AI_ENV, "").strip() or r"C:\Program Files\RyzenAI"
    local = wsl.to_wsl_path(root) if host.platform == "wsl" else root
    found = []
    for depth in ("*", "*/*", "*/*/*", "*/*/*/*"):
        for path in sorted(Path(local).glob(f"{depth}/onnxruntime_vitisai_ep.dll")):
            found.append(str(path) if host.platform == "windows" else _to_windows(str(path), host))
        if found:
            break
    return found


def _to_windows(path: str, host: HostInfo) -> str:
    try:
        return wsl.to_windows_path(path, distro=host.wsl.distro)
    except wsl.WindowsPathError:
        return path


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
        spec = find_spec(name, cwd=cwd, environ=environ)
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
    """Resolve every route, in the fixed route order (the plugin tables' routes last), probing
    interpreters in parallel."""
    return resolve_specs(
        list(all_specs(cwd=cwd, environ=environ)), refresh=refresh, host=host, environ=environ, cwd=cwd,
        hardware=hardware, timeout=timeout,
    )
