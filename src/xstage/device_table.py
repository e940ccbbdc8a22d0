"""The device table: hardware rows joined with every route's status.

``devices()`` is what ``xstage devices`` prints: each device the machine shows (and each
one a resolved route's probe reports that the machine did not), with the routes that drive
or could drive it in their fixed order, then every route — resolved or missing with its
reason and remedy. A route never disappears, and neither does a device without a route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from xstage import ledger
from xstage._version import __version__
from xstage.host import hardware as hw
from xstage.host.info import HostInfo
from xstage.routes import RouteStatus, resolve_all
from xstage.routes.specs import DEVICE_PREFERENCE, ROUTE_NAMES

__all__ = ["DeviceReport", "DeviceRow", "REPORT_SCHEMA", "assemble", "devices"]

#: Version of the ``xstage devices --json`` document.
REPORT_SCHEMA = 1


@dataclass(frozen=True)
class DeviceRow:
    """One device and the routes that drive it (resolved) or could (any status)."""

    device: hw.Device
    routes: tuple[RouteStatus, ...]

    @property
    def resolved_routes(self) -> tuple[RouteStatus, ...]:
        """Routes that drive this device here, in the fixed route order."""
        return tuple(r for r in self.routes if r.resolved and self.device.id in r.devices)

    def to_dict(self) -> dict[str, Any]:
        """The device's JSON fields plus ``routes``: name, status, reason_code, verified."""
        doc = self.device.to_dict()
        doc["routes"] = [
            {
                "name": r.name,
                "status": "resolved" if (r.resolved and self.device.id in r.devices) else "missing",
                "reason_code": r.reason_code.value if r.reason_code else None,
                "verified": r.verified,
            }
            for r in self.routes
        ]
        return doc


@dataclass(frozen=True)
class DeviceReport:
    """Everything ``xstage devices`` shows."""

    devices: tuple[DeviceRow, ...]
    routes: tuple[RouteStatus, ...]
    host: HostInfo

    def device(self, device_id: str) -> DeviceRow | None:
        """The row of ``device_id``, or None."""
        return next((row for row in self.devices if row.device.id == device_id), None)

    def pools(self) -> list[dict[str, Any]]:
        """Each memory pool with its capacity now and the devices that draw on it.

        The host's available RAM for ``host_ram`` (CPU, integrated GPU and NPU rows), each discrete
        GPU's own memory. (Reservations live in the process that holds a ledger: see ``external``.)
        """
        host = next((r.device for r in self.devices if r.device.kind == "cpu"), None)
        found = ledger.pools_from_devices(
            [r.device for r in self.devices],
            host_available=host.available_bytes if host and host.available_bytes else None,
            host_source="available RAM now" if host and host.available_bytes
            else "available RAM could not be read")
        return [{**pool.to_dict(),
                 "devices": [r.device.id for r in self.devices if r.device.pool == name]}
                for name, pool in found.items()]

    def route(self, name: str) -> RouteStatus:
        """The status of route ``name``.

        Raises:
            KeyError: no such route.
        """
        for status in self.routes:
            if status.name == name:
                return status
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """One JSON document with stable fields (docs/routes.md)."""
        return {
            "schema": REPORT_SCHEMA,
            "xstage_version": __version__,
            "host": {
                "platform": self.host.platform,
                "cpu_vendor": self.host.cpu_vendor,
                "wsl": {
                    "is_wsl": self.host.wsl.is_wsl,
                    "version": self.host.wsl.version,
                    "interop": self.host.wsl.interop,
                    "distro": self.host.wsl.distro,
                },
            },
            "preference": list(DEVICE_PREFERENCE),
            "devices": [row.to_dict() for row in self.devices],
            "pools": self.pools(),
            "routes": [status.to_dict() for status in self.routes],
        }


def _probe_device(device_id: str, details: dict[str, Any], route: str) -> hw.Device:
    """A row for a device only a probe reported (a GPU sysfs and nvidia-smi did not show)."""
    kind, _, rest = device_id.partition(":")
    vendor = rest.split(":")[0] if rest else "unknown"
    discrete = kind == "gpu_discrete"
    memory = int(details.get("memory_bytes") or 0) if discrete else 0
    available = int(details.get("available_bytes") or 0) if discrete else 0
    return hw.Device(
        id=device_id,
        kind=kind if kind in ("cpu", "gpu_integrated", "gpu_discrete", "npu") else "npu",
        vendor=vendor,
        name=str(details.get("name") or device_id),
        pool=f"vram:{device_id}" if discrete else "host_ram",
        memory_bytes=memory,
        available_bytes=available,
        sources=(f"probe:{route}",),
    )


def _sort_key(device: hw.Device) -> tuple[int, str]:
    order = ("cpu", *DEVICE_PREFERENCE)
    return (order.index(device.kind) if device.kind in order else len(order), device.id)


def assemble(hardware: Sequence[hw.Device], routes: Sequence[RouteStatus]) -> tuple[DeviceRow, ...]:
    """Join hardware rows and route statuses (pure).

    Rules:
        1. Every hardware row is kept, with or without a route.
        2. A device a resolved route reports that hardware did not show is added
           (source ``probe:<route>``); a discrete GPU row without memory gets the probe's.
        3. A row lists every route whose spec can drive its kind and vendor, plus every
           resolved route that reports it, in the fixed route order.
        4. Rows are ordered host first, then by the default preference (npu, integrated
           GPU, discrete GPU), then by id.
    """
    rows = {d.id: d for d in hardware}
    for status in routes:
        if not status.resolved:
            continue
        for device_id in status.devices:
            details = dict(status.device_details.get(device_id, {}))
            if device_id not in rows:  # Rule 2
                rows[device_id] = _probe_device(device_id, details, status.name)
            elif rows[device_id].kind == "gpu_discrete" and not rows[device_id].memory_bytes:
                if details.get("memory_bytes"):
                    old = rows[device_id]
                    rows[device_id] = replace(
                        old,
                        memory_bytes=int(details["memory_bytes"]),
                        available_bytes=int(details.get("available_bytes") or 0),
                        sources=old.sources + (f"probe:{status.name}",),
                    )
    order = {name: i for i, name in enumerate(ROUTE_NAMES)}
    out = []
    for device in sorted(rows.values(), key=_sort_key):  # Rule 4
        related = [
            s
            for s in routes
            if s.spec.can_drive(device.kind, device.vendor) or (s.resolved and device.id in s.devices)
        ]
        related.sort(key=lambda s: order.get(s.name, len(order)))  # Rule 3
        out.append(DeviceRow(device=device, routes=tuple(related)))
    return tuple(out)


def devices(*, refresh: bool = False) -> DeviceReport:
    """Discover the hardware, resolve every route, and join them; never raises for a route."""
    host = HostInfo.current()
    hardware = hw.discover(wsl=host.platform == "wsl", refresh=refresh)
    statuses = resolve_all(refresh=refresh, host=host, hardware=hardware)
    return DeviceReport(devices=assemble(hardware, statuses), routes=tuple(statuses), host=host)
