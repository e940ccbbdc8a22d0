"""What resolution says about a route: its status, the reason codes, where its interpreter came from.

Plain data, shared by the interpreter choice (``interpreters``), the judges (``judges``) and
the orchestration (``resolve``); ``xstage devices --json`` writes ``RouteStatus.to_dict()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from xstage.routes.specs import RouteSpec

__all__ = ["InterpreterChoice", "InterpreterSource", "ReasonCode", "RouteStatus"]


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
    #: a plugin EP's library was not found (its package not importable, its path not a file,
    #: no step of the VitisAI locator found it)
    EP_LIBRARY_NOT_FOUND = "ep_library_not_found"
    #: the library found is one known to register and then run nothing (VitisAI's light DLL)
    EP_LIBRARY_WRONG = "ep_library_wrong"
    #: the library is there, but a library it depends on does not load (not on the search path)
    EP_DEPENDENCY_NOT_LOADABLE = "ep_dependency_not_loadable"
    #: onnxruntime refused to register the library for another reason (its message is kept)
    EP_REGISTRATION_FAILED = "ep_registration_failed"
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
        probe_cached: the probe came from the cache.
        steps: a plugin EP's bring-up, step by step (where its library was looked for and
            found, registered, which EP devices it listed); shown by ``xstage devices``.
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
    steps: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        """Whether the route can be used."""
        return self.status == "resolved"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data with the stable field names of ``xstage devices --json``
        (``reference_arm``: the route the numeric gate's reference runs on)."""
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
            "reference_arm": spec.reference_arm,
            "steps": list(self.steps),
        }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
