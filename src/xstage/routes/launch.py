"""From a resolved route to a running worker: the load options a route's runtime needs.

A ``RouteStatus`` says what the probe found (a plugin EP to register and which EP device to
bind, or a built-in provider and its options); this module turns that into the worker's
``load`` options and starts the worker in the route's interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from xstage import compile_cache, errors
from xstage.client import Deadlines, WorkerClient
from xstage.client.tools import run_tool
from xstage.host import wsl as wsl_mod
from xstage.host.wsl import WslInfo
from xstage.routes import RouteStatus
from xstage.routes.hooks import ep_options_for, options_taken
from xstage.routes.option_hooks import DeviceOverride
from xstage.routes.specs import OPT_IN_SWITCHES, ROUTES, SWITCH_OFF, RouteSpec

__all__ = ["load_options", "open_worker", "serving_switches", "windows_side_options"]


def _missing(status: RouteStatus) -> errors.RouteMissing:
    return errors.RouteMissing(
        f"route {status.name} is missing: {status.reason}",
        reason_code=status.reason_code.value if status.reason_code else "unknown",
        remedy=status.remedy,
    )


def load_options(
    status: RouteStatus,
    *,
    device: str | None = None,
    ep_options: Mapping[str, str] | None = None,
    session: Mapping[str, Any] | None = None,
    fmt: str = "onnx:fp32",
    profile: bool = False,
    output_names: Sequence[str] = (),
    compile_cache_of: Any = None,
) -> dict[str, Any]:
    """The worker's ``load`` options for ``status`` driving ``device`` (default: its first).

    The route's hook (``xstage.routes.hooks``) fills what the user left unsaid for this format;
    its notes travel in ``notes``. ``profile`` makes the first run the profiled warm-up.
    ``compile_cache_of``: the artifact whose compile cache to prepare (``xstage.compile_cache``):
    its EP options then point at the entry, and ``compile_cache`` holds the ``Entry`` (the
    caller takes it out before the options travel, and seals it after the warm-up).
    """
    if not status.resolved:
        raise _missing(status)
    _check_opt_in(status.spec, ep_options or {})
    if status.spec.runtime == "torch":
        options = _torch_options(status, device=device, profile=profile, output_names=output_names,
                                 fmt=fmt, switches=ep_options or {})
        if compile_cache_of is not None:  # none for a torch program (the entry says so)
            options["compile_cache"] = compile_cache.prepare(status, compile_cache_of, options)
        return options
    if status.spec.runtime != "onnxruntime":
        raise errors.UsageError(f"route {status.name} runs {status.spec.runtime}, not ONNX graphs")
    ep_options = {k: v for k, v in (ep_options or {}).items() if k not in OPT_IN_SWITCHES}
    ep_options, dropped = options_taken(status, ep_options)
    device = device or (status.devices[0] if status.devices else None)
    if device is not None and status.devices and device not in status.devices:
        raise errors.UsageError(
            f"route {status.name} does not drive {device} here",
            remedy=f"it drives: {', '.join(status.devices)}",
        )
    info = dict(status.ep_plugin or {"kind": "builtin", "ep_name": status.spec.ep, "options": {}})
    options = dict(info.get("options") or {})
    ep: dict[str, Any] = {"name": info.get("ep_name") or status.spec.ep}
    if info.get("kind") == "ep_device":  # a built-in EP bound to the EP device of its adapter
        adapter = dict((info.get("adapters") or {}).get(device) or {})
        ep["plugin"] = {"builtin": True, "select": dict((info.get("devices") or {}).get(device) or {}),
                        "adapter": adapter}
    elif info.get("kind") == "plugin":
        ep["plugin"] = {
            "module": info.get("module"),
            "library": info.get("library"),
            "registration": info.get("registration_name") or info.get("module"),
            "select": dict((info.get("devices") or {}).get(device) or {}),
            "dll_dir": bool(info.get("dll_dir", True)),
            "report": info.get("report"),
        }
    else:
        options.update((info.get("device_options") or {}).get(device) or {})
    try:
        merged, notes = ep_options_for(status.spec, fmt, device, options, ep_options)
    except DeviceOverride as over:
        raise _override_error(status, info, over) from None
    ep["options"] = merged
    notes = [*dropped, *notes]
    adapter = (ep.get("plugin") or {}).get("adapter")
    if adapter:
        notes = [*notes, f"adapter chosen by identity: {adapter.get('description')} (DXGI adapter "
                 f"{adapter.get('dxgi_adapter_number')}, PCI {adapter.get('pci_id')}, matched by "
                 f"{adapter.get('matched_by')}), bound with add_provider_for_devices"]
    session, defaults = _with_session_defaults(status.spec, session)
    notes = [*notes, *defaults]
    options = {"ep": ep, "session": session, "route": status.name, "device": device,
               "profile": profile, "notes": notes, "device_memory": status.spec.device_memory}
    if compile_cache_of is not None:
        options["compile_cache"] = compile_cache.prepare(status, compile_cache_of, options)
    return options


def _with_session_defaults(spec: RouteSpec, session: Mapping[str, Any] | None
                           ) -> tuple[dict[str, Any], list[str]]:
    """The worker's session options with the route's own config entries under the user's
    (a key the user gave is kept as given), and a note for each entry the route added."""
    session = dict(session or {})
    given = dict(session.get("config") or {})
    added = {k: v for k, v in spec.session_defaults.items() if k not in given}
    if not added:
        return session, []
    session["config"] = {**added, **given}
    return session, [f"session config {k}={v}: the route's default (docs/throughput.md, \"Session "
                     f"config\"); --session-config {k}=... sets another" for k, v in added.items()]


def _override_error(status: RouteStatus, info: Mapping[str, Any],
                    over: DeviceOverride) -> errors.UsageError:
    """A user EP option moved the EP off the planned device: name the flag and the ``--device``
    that selects the device it names (no re-planning: the plan, budget and proof are the
    planned device's)."""
    per_device = dict(info.get("device_options") or {})
    for dev, sel in (info.get("devices") or {}).items():  # a plugin EP: its device selectors
        per_device.setdefault(dev, {"device_type": str((sel or {}).get("device_type") or "")})
    wanted = {k.lower() for k in over.selects}
    named = [d for d in status.devices if d in over.selects]  # it names an xstage device
    named += [dev for dev, opts in per_device.items()
             if str((opts or {}).get(over.option, "")).split(".")[0].lower() in wanted]
    if not named:
        named = [d for d in status.devices if (d.split(":")[0].replace("gpu_integrated", "gpu")
                                               .replace("gpu_discrete", "gpu")) in wanted]
    if not named and "cpu" in wanted:
        named = ["cpu"]
    listed = bool(named)
    if not named:  # a device this machine does not list: the ids the route's spec could drive
        named = [f"{kind}:{vendor}" if vendor else kind for kind, vendor in status.spec.drives
                 if kind.split("_")[0] in wanted]
    choice = (f"--device {' or --device '.join(dict.fromkeys(named or over.selects))}"
              + ("" if listed else " (this machine lists no such device: xstage devices shows "
                 "what it has)"))
    return errors.UsageError(
        f"--ep-option {over.option}={over.value} makes {status.spec.ep} run on "
        f"{', '.join(over.selects)}, but the plan put the stage on {over.planned}: the record, "
        "budget and proof would name a device that did not run it",
        remedy=f"drop --ep-option {over.option}, or ask for that device with {choice}")


_ON = ("on", "1", "true", "yes")
_OFF = SWITCH_OFF


def _check_opt_in(spec: Any, given: Mapping[str, str]) -> None:
    """An opt-in serving switch (``OPT_IN_SWITCHES``) turned on for a route without it.

    Raises:
        UsageError: naming the routes that have it.
    """
    for name in OPT_IN_SWITCHES:
        if name in given and name not in spec.serving_switches \
                and str(given[name]).strip().lower() not in SWITCH_OFF:
            takes = ", ".join(r.name for r in ROUTES if name in r.serving_switches)
            raise errors.UsageError(
                f"--ep-option {name}={given[name]}: route {spec.name} has no {name}",
                remedy=f"routes that have it: {takes} (a .pt2 stage on a CUDA GPU); or leave "
                f"the option out")


def serving_switches(spec: Any, given: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """A torch route's ``--ep-option NAME=on|off`` values (``RouteSpec.serving_switches``),
    each as ``on`` or ``off``, and a note for each one turned off.

    Raises:
        UsageError: an option the route does not take, or a value that is not on or off.
    """
    known = dict(spec.serving_switches)
    out: dict[str, str] = {}
    notes = []
    elsewhere = {k for other in ROUTES for k in other.serving_switches}
    for name, value in given.items():
        if name not in known and name in elsewhere:
            notes.append(f"--ep-option {name} is not an option of {spec.name}: ignored here")
            continue
        if name not in known:
            takes = ", ".join(f"{k}=on|off" for k in sorted(known)) or "none"
            raise errors.UsageError(
                f"--ep-option {name}: route {spec.name} has no such option",
                remedy=f"its options: {takes}")
        text = str(value).strip().lower()
        if text not in _ON + _OFF:
            raise errors.UsageError(f"--ep-option {name}={value}: expected on or off",
                                    remedy=f"--ep-option {name}=off turns off {known[name]}")
        out[name] = "on" if text in _ON else "off"
        if out[name] == "off":
            notes.append(f"{name} off (--ep-option {name}=off): no {known[name].split(',')[0]}")
    return out, notes


def _torch_options(status: RouteStatus, *, device: str | None, profile: bool,
                   output_names: Sequence[str], fmt: str = "pt:fp32",
                   switches: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A torch route's options: the torch device for the xstage device id, the names the
    program's outputs take (from the manifest; a .pt2 names none of its own), and the
    route's serving switches (``serving_switches``)."""
    device = device or (status.devices[0] if status.devices else "cpu")
    kind = status.spec.torch_device or "cpu"
    if kind == "cpu":
        torch_device = "cpu"
    else:
        last = device.rsplit(":", 1)[-1]
        index = int(last) if last.isdigit() else 0
        torch_device = f"{kind}:{index}"
    notes = []
    strict = fmt.endswith("fp32") and bool(status.spec.fp32_strict_note)
    if strict:  # an fp32 artifact computes in fp32, as the OpenVINO hook asks of its EP
        notes.append(status.spec.fp32_strict_note)
    chosen, off = serving_switches(status.spec, switches or {})
    notes.extend(off)
    out = {"runtime": "torch", "device": torch_device, "xstage_device": device,
           "route": status.name, "profile": profile, "output_names": list(output_names),
           "fp32_strict": strict, "notes": notes, **chosen}
    if status.spec.adapter_by_name:  # DirectML: the adapter by name, never by index
        details = dict(status.device_details.get(device, {}))
        out["adapter_name"] = details.get("name") or device
    return out


def windows_side_options(
    *,
    wsl: WslInfo,
    wsl_conf: str | None,
    networking_mode: str,
    ip_route: str,
    kill: Callable[[list[str]], object],
) -> dict[str, Any]:
    """``WorkerClient`` keywords for a Windows interpreter started from WSL (pure but ``kill``).

    The same launch code as a Linux worker, with the four differences ``routes.wsl`` names:
    a TCP connect-back instead of inherited sockets, Windows paths for the staged package and
    every graph, the address a Windows process reaches this VM on, and ``taskkill /T`` on the
    Windows pid the worker reports, because the process WSL shows is only the interop relay.

    Raises:
        RouteMissing: this is not WSL with interop (``wsl_interop_unavailable``).
    """
    if not (wsl.is_wsl and wsl.interop):
        raise errors.RouteMissing(
            "a Windows interpreter can only be started from WSL with interop enabled",
            reason_code="wsl_interop_unavailable",
            remedy="enable [interop] in /etc/wsl.conf and restart WSL (wsl --shutdown)",
        )
    back = wsl_mod.connect_back(networking_mode=networking_mode, ip_route=ip_route)
    root = wsl_mod.automount_root(wsl_conf)

    def to_windows(path: str) -> str:
        return wsl_mod.to_windows_path(os.path.abspath(path), distro=wsl.distro, mount_root=root)

    return {
        "transport": "tcp",
        "listen_host": back.bind_host,
        "connect_host": back.connect_host,
        "worker_path": to_windows,
        "end_tree": lambda pid: kill(wsl_mod.kill_tree_argv(pid)),
    }


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _output(argv: list[str]) -> str:
    return run_tool(argv, 10, check=False) or ""


def open_worker(status: RouteStatus, *, deadlines: Deadlines | None = None, depth: int = 1,
                generation: int = 1, first_id: int = 1, concurrency: int = 1) -> WorkerClient:
    """A started worker in the route's interpreter (the caller closes it).

    ``depth`` slot sets (requests in flight), up to ``concurrency`` of them computed at once
    where the runtime can; ``generation`` and ``first_id`` continue a stage's count when a
    worker replaces another.
    """
    if not status.resolved or not status.interpreter:
        raise _missing(status)
    extra: dict[str, Any] = {}
    if status.spec.os_side == "windows" and sys.platform != "win32":
        extra = windows_side_options(
            wsl=wsl_mod.current(),
            wsl_conf=_read("/etc/wsl.conf"),
            networking_mode=wsl_mod.parse_networking_mode(_output(["wslinfo", "--networking-mode"])),
            ip_route=_output(["ip", "route"]),
            kill=lambda argv: run_tool(argv, 30, check=False),
        )
    client = WorkerClient(status.interpreter, route=status.name, deadlines=deadlines, depth=depth,
                          generation=generation, first_id=first_id, concurrency=concurrency, **extra)
    client.start()
    return client
