"""Route resolution: which interpreter serves each route, and does it work — never raising.

For each route: check the host can have it at all, pick its interpreter (first match wins),
probe that interpreter by running it, and judge the probe against the spec. The result is a
``RouteStatus``: ``resolved`` with the devices it drives, or ``missing`` with a
``ReasonCode`` from a closed set, a reason naming what was found, and a remedy naming the
next command to run.

Interpreter precedence (first match wins; a configured interpreter that is missing is
*missing*, it never falls back to the next):

1. ``XSTAGE_PYTHON_<ROUTE>`` (``ort-openvino`` → ``XSTAGE_PYTHON_ORT_OPENVINO``)
2. ``./xstage.toml``: ``[routes.<route>] python = "..."``
3. the user config file (``xstage.routes.config.user_config_path``)
4. the environment ``xstage env create <route>`` made (``XSTAGE_HOME/envs/<route>/``)
5. the current interpreter (``sys.executable``), for routes on this OS's side

Check order (the first failing check names the reason): host platform (``wrong_os``),
WSL interop for Windows-side routes (``wsl_interop_unavailable``), the interpreter choice
(``config_invalid``, ``interpreter_not_found``, ``interpreter_not_configured``), the probe
(``interpreter_failed``; also a Python older than 3.9 or of the wrong OS), then the runtime
(``runtime_not_importable``, ``runtime_version_unsupported``, ``ep_not_in_build``,
``ep_no_device``, ``backend_not_importable``, ``device_not_available``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from xstage.errors import UsageError
from xstage.host import hardware as hw
from xstage.host import wsl
from xstage.routes import config as cfg
from xstage.routes import envs
from xstage.routes.probe import ProbeOutcome, ProbeRequest, probe_many
from xstage.routes.specs import ROUTES, RouteSpec, get_spec

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


class ReasonCode(str, Enum):
    """Why a route is missing: a closed set. docs/routes.md gives each one's remedy."""

    #: the host platform cannot have this route (not Windows and not WSL; CoreML: not macOS)
    WRONG_OS = "wrong_os"
    #: a Windows-side route from WSL, and WSL interop (starting Windows programs) is off
    WSL_INTEROP_UNAVAILABLE = "wsl_interop_unavailable"
    #: ./xstage.toml or the user config file is unreadable or malformed
    CONFIG_INVALID = "config_invalid"
    #: a configured interpreter (env var, config, route env) does not exist or cannot run
    INTERPRETER_NOT_FOUND = "interpreter_not_found"
    #: a Windows-side route from WSL and no Windows interpreter is configured
    INTERPRETER_NOT_CONFIGURED = "interpreter_not_configured"
    #: the probe crashed, timed out, printed garbage, or the Python is < 3.9
    INTERPRETER_FAILED = "interpreter_failed"
    #: onnxruntime (or torch) does not import in that interpreter
    RUNTIME_NOT_IMPORTABLE = "runtime_not_importable"
    #: the runtime is too old or too new for the EP
    RUNTIME_VERSION_UNSUPPORTED = "runtime_version_unsupported"
    #: the EP is not in that onnxruntime build (and no plugin provides it)
    EP_NOT_IN_BUILD = "ep_not_in_build"
    #: the EP is there but lists no device of the classes this route drives
    EP_NO_DEVICE = "ep_no_device"
    #: torch imports but the route's backend module (torch_directml) does not
    BACKEND_NOT_IMPORTABLE = "backend_not_importable"
    #: torch imports but the device is not available (CUDA unavailable, no DirectML adapter)
    DEVICE_NOT_AVAILABLE = "device_not_available"


class InterpreterSource(str, Enum):
    """Where a route's interpreter came from (precedence order)."""

    ENV_VAR = "env_var"
    PROJECT_CONFIG = "project_config"
    USER_CONFIG = "user_config"
    ROUTE_ENV = "route_env"
    CURRENT = "current"
    NONE = "none"


@dataclass(frozen=True)
class HostInfo:
    """The client's host as routes see it.

    Attributes:
        platform: ``linux`` (not WSL), ``wsl``, ``windows`` or ``darwin``.
        wsl: WSL facts (interop, distro) — meaningful when ``platform == "wsl"``.
        cpu_vendor: ``intel``, ``amd``, … (decides the ort-openvino variant).
    """

    platform: str
    wsl: wsl.WslInfo = field(default_factory=lambda: wsl.WslInfo(is_wsl=False))
    cpu_vendor: str = "unknown"

    @classmethod
    def current(cls) -> HostInfo:
        """This machine."""
        info = wsl.current() if sys.platform.startswith("linux") else wsl.WslInfo(is_wsl=False)
        if sys.platform == "win32":
            platform = "windows"
        elif sys.platform == "darwin":
            platform = "darwin"
        else:
            platform = "wsl" if info.is_wsl else "linux"
        return cls(platform=platform, wsl=info, cpu_vendor=envs.host_cpu_vendor())

    @property
    def label(self) -> str:
        """How messages name this host."""
        return {"linux": "Linux (not WSL)", "wsl": "WSL", "windows": "Windows", "darwin": "macOS"}.get(
            self.platform, self.platform
        )


@dataclass(frozen=True)
class InterpreterChoice:
    """The interpreter a route will probe, or why there is none.

    Attributes:
        path: the interpreter to run (None when the choice failed).
        source: where it came from.
        origin: the same, for people (``XSTAGE_PYTHON_ORT_CPU``, ``/w/xstage.toml``, …).
        failure: (code, reason, remedy) when the choice itself already fails.
    """

    path: str | None
    source: InterpreterSource
    origin: str
    failure: tuple[ReasonCode, str, str] | None = None


@dataclass(frozen=True)
class RouteStatus:
    """One route's resolution: ``resolved``, or ``missing`` with a reason and a remedy.

    Attributes:
        name: the route.
        spec: its spec.
        status: ``resolved`` or ``missing``.
        reason_code: None when resolved.
        reason: what was found, for people (empty when resolved).
        remedy: the next thing to do (empty when resolved).
        interpreter: the interpreter probed (or configured), if any.
        interpreter_source: where it came from (``InterpreterSource`` value).
        versions: python, numpy, onnxruntime, its distribution, plugins, torch, ….
        verified: the spec's ``verified``.
        devices: concrete device ids this route drives here (empty when missing).
        device_details: per device id, what the probe said (name, memory, EP device).
        probe: the raw probe document, or None when no probe ran or it failed.
        ep_plugin: what a worker needs to ask onnxruntime for the EP: ``kind`` (``plugin``
            or ``builtin``), ``ep_name``, plugin ``module``/``registration_name``, and per
            device id the options or EP-device selector. None for torch or when missing.
    """

    name: str
    spec: RouteSpec
    status: str
    reason_code: ReasonCode | None
    reason: str
    remedy: str
    interpreter: str | None
    interpreter_source: str
    versions: Mapping[str, str]
    verified: bool
    devices: tuple[str, ...] = ()
    device_details: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    probe: Mapping[str, Any] | None = None
    ep_plugin: Mapping[str, Any] | None = None
    probe_cached: bool = False

    @property
    def resolved(self) -> bool:
        """Whether the route can be used."""
        return self.status == "resolved"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data with the stable field names of ``xstage devices --json``."""
        spec = self.spec
        return {
            "name": self.name,
            "status": self.status,
            "reason_code": self.reason_code.value if self.reason_code else None,
            "reason": self.reason,
            "remedy": self.remedy,
            "interpreter": self.interpreter,
            "interpreter_source": self.interpreter_source,
            "versions": dict(self.versions),
            "verified": self.verified,
            "devices": list(self.devices),
            "device_details": {k: dict(v) for k, v in self.device_details.items()},
            "ep_plugin": _plain(self.ep_plugin),
            "runtime": spec.runtime,
            "ep": spec.ep,
            "torch_device": spec.torch_device,
            "formats": list(spec.formats),
            "device_class": spec.device_class,
            "device_classes": list(spec.device_classes),
            "os_side": spec.os_side,
            "probe_cached": self.probe_cached,
        }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------- interpreter


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
        (InterpreterSource.PROJECT_CONFIG, cfg.project_config_path(base)),
        (InterpreterSource.USER_CONFIG, cfg.user_config_path(dict(env))),
    )
    for source, config_path in files:
        loaded = cfg.load(config_path)
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


# ---------------------------------------------------------------------------- evaluation


def _vt(version: str | None) -> tuple[int, ...]:
    """``1.24.1`` → (1, 24, 1); ``1.25.0.dev20250101`` → (1, 25, 0); junk → ()."""
    parts = []
    for piece in (version or "").split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


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


@dataclass
class _Verdict:
    code: ReasonCode | None = None
    reason: str = ""
    remedy: str = ""
    devices: list[str] = field(default_factory=list)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    ep_plugin: dict[str, Any] | None = None


def _fail(code: ReasonCode, reason: str, remedy: str) -> _Verdict:
    return _Verdict(code=code, reason=reason, remedy=remedy)


def _install_remedy(
    spec: RouteSpec, choice: InterpreterChoice, what: str, host: HostInfo | None = None
) -> str:
    if spec.runtime == "onnxruntime" and what != "onnxruntime":
        variant, _ = envs.default_variant(spec, host.cpu_vendor if host else "unknown")
        what = " ".join(spec.packages[variant])
    if choice.source in (InterpreterSource.CURRENT, InterpreterSource.ROUTE_ENV):
        if spec.runtime == "torch" and spec.name in ("torch-cpu", "torch-cuda"):
            return (
                f"install {what} into {choice.path} (`{choice.path} -m pip install torch==<version>`), "
                f"or build a separate env: `xstage env create {spec.name} --pin torch==<version>`"
            )
        return f"xstage env create {spec.name}" + (
            " --force" if choice.source == InterpreterSource.ROUTE_ENV else ""
        )
    return (
        f"install {what} into {choice.path} (set by {choice.origin}), or point that at another "
        f"interpreter, or remove it and run `xstage env create {spec.name}`"
    )


def _ep_device_id(row: Mapping[str, Any], hardware: Sequence[hw.Device], taken: set[str]) -> str | None:
    """A concrete device id for one EP device, matched to a hardware row where possible."""
    kind = str(row.get("device_type", "")).upper()
    if kind == "CPU":
        return "cpu"
    vendor = (
        hw.vendor_from_id(row.get("device_vendor_id"))
        or hw.vendor_from_name(row.get("device_vendor"))
        or f"{int(row.get('device_vendor_id') or 0):04x}"
    )
    if kind == "GPU":
        for dev in hardware:
            if dev.kind.startswith("gpu") and dev.vendor == vendor and dev.id not in taken:
                return dev.id
        return f"gpu_integrated:{vendor}"
    if kind == "NPU":
        return f"npu:{vendor}"
    return None


def _intel_gpu_id(index: int, hardware: Sequence[hw.Device]) -> str:
    gpus = sorted(
        (d for d in hardware if d.kind.startswith("gpu") and d.vendor == "intel"),
        key=lambda d: (d.kind != "gpu_integrated", d.id),
    )
    if index < len(gpus):
        return gpus[index].id
    return "gpu_integrated:intel" if index == 0 else f"gpu_discrete:intel:{index - 1}"


def _openvino_builtin(
    ort: Mapping[str, Any], hardware: Sequence[hw.Device]
) -> tuple[list[str], dict[str, Any]]:
    """Devices of the built-in OpenVINO EP, from the device types it says it can open."""
    devices: list[str] = []
    options: dict[str, Any] = {}
    for name in ort.get("openvino_device_ids") or []:
        upper = str(name).upper()
        if upper == "CPU":
            dev = "cpu"
        elif upper.startswith("GPU"):
            index = int(upper.split(".", 1)[1]) if "." in upper and upper.split(".", 1)[1].isdigit() else 0
            dev = _intel_gpu_id(index, hardware)
        elif upper.startswith("NPU"):
            dev = "npu:intel"
        else:
            continue
        if dev not in options:
            devices.append(dev)
            options[dev] = {"device_type": str(name)}
    return devices, options


def _hardware_for(spec: RouteSpec, hardware: Sequence[hw.Device]) -> list[hw.Device]:
    return [d for d in hardware if d.kind != "cpu" and spec.can_drive(d.kind, d.vendor)]


def _eval_onnxruntime(
    spec: RouteSpec,
    choice: InterpreterChoice,
    data: Mapping[str, Any],
    host: HostInfo,
    hardware: Sequence[hw.Device],
) -> _Verdict:
    ort = data.get("onnxruntime") or {}
    where = choice.path
    if not ort.get("importable"):
        return _fail(
            ReasonCode.RUNTIME_NOT_IMPORTABLE,
            f"onnxruntime is not importable by {where}: {ort.get('error', 'unknown error')}",
            _install_remedy(spec, choice, "onnxruntime"),
        )
    version = str(ort.get("version"))
    dist_map = ort.get("distributions") or {}
    dists = ", ".join(f"{k} {v}" for k, v in sorted(dist_map.items())) or "onnxruntime"
    build = f"onnxruntime {version}" + ("" if set(dist_map) <= {"onnxruntime"} else f" ({dists})")
    if spec.min_runtime and _vt(version) < _vt(spec.min_runtime):
        return _fail(
            ReasonCode.RUNTIME_VERSION_UNSUPPORTED,
            f"{build} at {where} is too old for {spec.ep}: needs >= "
            f"{spec.min_runtime}" + (f" ({spec.version_note})" if spec.version_note else ""),
            f"use a separate interpreter with onnxruntime>={spec.min_runtime}: xstage env create {spec.name}",
        )
    if spec.max_runtime and _vt(version) >= _vt(spec.max_runtime):
        return _fail(
            ReasonCode.RUNTIME_VERSION_UNSUPPORTED,
            f"{build} at {where} is too new for {spec.ep}: it ships only "
            f"below {spec.max_runtime}" + (f" ({spec.version_note})" if spec.version_note else ""),
            f"use a separate interpreter with {', '.join(spec.packages[spec.variants[0]])}: "
            f"xstage env create {spec.name}",
        )
    providers = list(ort.get("providers") or [])
    plugin = (ort.get("plugins") or {}).get(spec.plugin_module) if spec.plugin_module else None
    after = ort.get("ep_devices_after_plugins") or []
    plugin_rows = (
        [r for r in after if r.get("ep_name") == spec.ep] if plugin and plugin.get("registered") else []
    )
    verdict = _Verdict()
    if plugin_rows:
        taken: set[str] = set()
        selectors: dict[str, Any] = {}
        for row in plugin_rows:
            dev = _ep_device_id(row, hardware, taken)
            if dev is None or dev in taken:
                continue
            taken.add(dev)
            verdict.devices.append(dev)
            selectors[dev] = {
                "device_type": row.get("device_type"),
                "vendor_id": row.get("device_vendor_id"),
                "device_id": row.get("device_id"),
                "ep_metadata": row.get("ep_metadata"),
            }
            verdict.details[dev] = {"ep_device": dict(row)}
        verdict.ep_plugin = {
            "kind": "plugin",
            "ep_name": spec.ep,
            "module": spec.plugin_module,
            "registration_name": plugin.get("registration_name") if plugin else None,
            "library_path": plugin.get("library_path") if plugin else None,
            "version": plugin.get("version") if plugin else None,
            "devices": selectors,
            "options": dict(spec.ep_options),
        }
        return verdict
    if spec.ep in providers:
        devices: list[str] = []
        per_device: dict[str, Any] = {}
        if spec.ep == "CPUExecutionProvider":
            devices = ["cpu"]
        elif spec.ep == "OpenVINOExecutionProvider":
            devices, per_device = _openvino_builtin(ort, hardware)
        else:
            taken = set()
            for row in ort.get("ep_devices") or []:
                if row.get("ep_name") != spec.ep:
                    continue
                dev = _ep_device_id(row, hardware, taken)
                if dev and dev not in taken:
                    taken.add(dev)
                    devices.append(dev)
            if not devices and spec.name == "ort-coreml":
                machine = (data.get("python") or {}).get("machine", "")
                devices = ["npu:apple", "gpu_integrated:apple"] if machine == "arm64" else []
            if not devices:
                devices = [d.id for d in _hardware_for(spec, hardware)]
        if not devices:
            found = ", ".join(f"{d.id}" for d in hardware) or "nothing"
            classes = " or ".join(f"{k}{':' + v if v else ''}" for k, v in spec.drives)
            extra = ""
            if spec.ep == "OpenVINOExecutionProvider":
                extra = f"; get_available_openvino_device_ids() = {ort.get('openvino_device_ids')}"
            return _fail(
                ReasonCode.EP_NO_DEVICE,
                f"{spec.ep} is in {build} at {where}, but no {classes} device it "
                f"drives was found (this machine shows: {found}){extra}",
                "run on a machine with such a device, or check its driver (`xstage devices --refresh`)",
            )
        verdict.devices = devices
        verdict.details = {d: {"ep_options": per_device.get(d, {})} for d in devices}
        verdict.ep_plugin = {
            "kind": "builtin",
            "ep_name": spec.ep,
            "options": dict(spec.ep_options),
            "device_options": per_device,
        }
        return verdict
    if plugin and plugin.get("registered"):
        listed = ", ".join(
            f"{r.get('ep_name')} ({r.get('device_type')}, vendor {r.get('device_vendor')})" for r in after
        )
        cpu_vendor = (
            next((r.get("device_vendor") for r in after if str(r.get("device_type")).upper() == "CPU"), None)
            or host.cpu_vendor
        )
        remedy = (
            f"use the built-in EP: xstage env create {spec.name} --variant builtin"
            if "builtin" in spec.packages
            else "run on a machine with a device this EP supports"
        )
        return _fail(
            ReasonCode.EP_NO_DEVICE,
            f"the plugin {spec.plugin_module} {plugin.get('version') or ''} registered with onnxruntime "
            f"{version} at {where}, but listed no {spec.ep} device for this CPU (vendor {cpu_vendor}); "
            f"get_ep_devices() lists only: {listed or 'nothing'}",
            remedy,
        )
    reason = f"{spec.ep} is not in {build} at {where} (it has: {', '.join(providers) or 'none'})"
    if plugin is not None:
        if plugin.get("importable"):
            reason += (
                f"; the plugin {spec.plugin_module} is there but did not register: {plugin.get('error')}"
            )
        else:
            reason += f"; the plugin package {spec.plugin_module} is not importable there"
    remedy = _install_remedy(spec, choice, spec.ep or "the EP", host)
    if "cpu" not in spec.device_classes and not _hardware_for(spec, hardware):
        # Say so now rather than after a download: the next answer would be ep_no_device.
        classes = " or ".join(f"{k}{':' + v if v else ''}" for k, v in spec.drives)
        remedy += f" (on a machine with a {classes} device: this one shows none)"
    return _fail(ReasonCode.EP_NOT_IN_BUILD, reason, remedy)


def _torch_device_id(row: Mapping[str, Any], torch: Mapping[str, Any], hardware: Sequence[hw.Device]) -> str:
    vendor = "amd" if torch.get("hip_version") else "nvidia"
    pci = row.get("pci")
    if isinstance(pci, Mapping):
        address = (
            f"{int(pci.get('domain', 0)):04x}:{int(pci.get('bus', 0)):02x}:{int(pci.get('device', 0)):02x}.0"
        )
        for dev in hardware:
            if dev.pci_address == address:
                return dev.id
    return f"gpu_discrete:{vendor}:{int(row.get('index', 0))}"


def _eval_torch(
    spec: RouteSpec,
    choice: InterpreterChoice,
    data: Mapping[str, Any],
    host: HostInfo,
    hardware: Sequence[hw.Device],
) -> _Verdict:
    torch = data.get("torch")
    where = choice.path
    if not torch or not torch.get("importable"):
        error = (torch or {}).get("error", "the probe did not try torch")
        return _fail(
            ReasonCode.RUNTIME_NOT_IMPORTABLE,
            f"torch is not importable by {where}: {error}",
            _install_remedy(spec, choice, "torch"),
        )
    version = torch.get("version")
    if spec.backend_module:
        backend = torch.get(spec.backend_module) or {}
        if not backend.get("importable"):
            return _fail(
                ReasonCode.BACKEND_NOT_IMPORTABLE,
                f"torch {version} imports at {where} but {spec.backend_module} does not: "
                f"{backend.get('error', 'not probed')}",
                f"xstage env create {spec.name} ({spec.version_note}, so it needs an interpreter of its own)",
            )
        adapters = backend.get("adapters") or []
        if not adapters:
            return _fail(
                ReasonCode.DEVICE_NOT_AVAILABLE,
                f"{spec.backend_module} imports at {where} but lists no adapter"
                + (f" ({backend['error']})" if backend.get("error") else ""),
                "check the GPU driver on Windows and that /dev/dxg exists in WSL",
            )
        verdict = _Verdict()
        for adapter in adapters:
            vendor = hw.vendor_from_name(adapter.get("name")) or "unknown"
            match = next(
                (
                    d.id
                    for d in hardware
                    if d.kind.startswith("gpu") and d.vendor == vendor and d.id not in verdict.devices
                ),
                f"gpu_integrated:{vendor}",
            )
            if match not in verdict.devices:
                verdict.devices.append(match)
                verdict.details[match] = {"name": adapter.get("name"), "torch_index": adapter.get("index")}
        return verdict
    if spec.torch_device == "cpu":
        return _Verdict(devices=["cpu"])
    if spec.torch_device == "cuda":
        if not torch.get("cuda_available"):
            why = ""
            if not torch.get("cuda_version") and not torch.get("hip_version"):
                why = " (a CPU-only build: torch.version.cuda is None)"
            nvidia = [d.id for d in hardware if d.vendor == "nvidia"]
            seen = (
                f"; this machine shows NVIDIA GPUs {', '.join(nvidia)}"
                if nvidia
                else "; no NVIDIA GPU was found here"
            )
            if torch.get("cuda_error"):
                why += f" ({torch['cuda_error']})"
            return _fail(
                ReasonCode.DEVICE_NOT_AVAILABLE,
                f"torch {version} imports at {where} but torch.cuda.is_available() is False{why}{seen}",
                f"point {spec.env_var} at an interpreter with a CUDA build of torch on a machine with "
                "an NVIDIA GPU and driver",
            )
        verdict = _Verdict()
        for row in torch.get("cuda_devices") or []:
            dev = _torch_device_id(row, torch, hardware)
            verdict.devices.append(dev)
            verdict.details[dev] = {
                "name": row.get("name"),
                "memory_bytes": row.get("total_memory"),
                "available_bytes": row.get("free_memory"),
                "torch_index": row.get("index"),
            }
        return verdict
    return _fail(
        ReasonCode.DEVICE_NOT_AVAILABLE, f"unknown torch device {spec.torch_device!r}", "fix the spec"
    )


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
    verdict: _Verdict,
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
        return _status(spec, shown, _fail(*pre), None)
    if choice is None or choice.failure is not None:
        failure = (
            choice.failure
            if choice and choice.failure
            else (ReasonCode.INTERPRETER_NOT_CONFIGURED, "no interpreter", f"set {spec.env_var}")
        )
        return _status(spec, choice, _fail(*failure), None)
    if outcome is None or not outcome.ok or outcome.data is None:
        error = outcome.error if outcome else "no probe ran"
        tail = outcome.stderr_tail if outcome else ""
        return _status(
            spec,
            choice,
            _fail(
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
            _fail(
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
            _fail(
                ReasonCode.WRONG_OS,
                f"{choice.path} (set by {choice.origin}) is {kind} Python; {spec.name} needs {need}",
                f"point {spec.env_var} at {need}",
            ),
            outcome,
        )
    if spec.runtime == "onnxruntime":
        verdict = _eval_onnxruntime(spec, choice, data, host, hardware)
    else:
        verdict = _eval_torch(spec, choice, data, host, hardware)
    return _status(spec, choice, verdict, outcome)


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
