"""From a resolved route to a running worker: the load options a route's runtime needs.

A ``RouteStatus`` says what the probe found (a plugin EP to register and which EP device to
bind, or a built-in provider and its options); this module turns that into the worker's
``load`` options and starts the worker in the route's interpreter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xstage import errors
from xstage.client import Deadlines, WorkerClient
from xstage.routes import RouteStatus

__all__ = ["load_options", "open_worker"]


def load_options(
    status: RouteStatus,
    *,
    device: str | None = None,
    ep_options: Mapping[str, str] | None = None,
    session: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The worker's ``load`` options for ``status`` driving ``device`` (default: its first)."""
    if not status.resolved:
        raise errors.RouteMissing(
            f"route {status.name} is missing: {status.reason}",
            reason_code=status.reason_code.value if status.reason_code else "unknown",
            remedy=status.remedy,
        )
    if status.spec.runtime != "onnxruntime":
        raise errors.UsageError(f"route {status.name} runs {status.spec.runtime}, not ONNX graphs")
    device = device or (status.devices[0] if status.devices else None)
    if device is not None and status.devices and device not in status.devices:
        raise errors.UsageError(
            f"route {status.name} does not drive {device} here",
            remedy=f"it drives: {', '.join(status.devices)}",
        )
    info = dict(status.ep_plugin or {"kind": "builtin", "ep_name": status.spec.ep, "options": {}})
    options = dict(info.get("options") or {})
    ep: dict[str, Any] = {"name": info.get("ep_name") or status.spec.ep}
    if info.get("kind") == "plugin":
        ep["plugin"] = {
            "module": info["module"],
            "registration": info.get("registration_name") or info["module"],
            "select": dict((info.get("devices") or {}).get(device) or {}),
        }
    else:
        options.update((info.get("device_options") or {}).get(device) or {})
    options.update(ep_options or {})
    ep["options"] = {k: str(v) for k, v in options.items()}
    return {"ep": ep, "session": dict(session or {}), "route": status.name, "device": device}


def open_worker(status: RouteStatus, *, deadlines: Deadlines | None = None) -> WorkerClient:
    """A started worker in the route's interpreter (the caller closes it)."""
    if not status.resolved or not status.interpreter:
        raise errors.RouteMissing(
            f"route {status.name} is missing: {status.reason}",
            reason_code=status.reason_code.value if status.reason_code else "unknown",
            remedy=status.remedy,
        )
    client = WorkerClient(status.interpreter, route=status.name, deadlines=deadlines)
    client.start()
    return client
