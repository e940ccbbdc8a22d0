"""The planner: device table + routes + artifact format → ordered candidates and refusals.

Pure over the device report: it starts nothing. Every route of a considered device that runs
the artifact's format becomes a candidate; one that cannot be used stays in the plan as a
refusal with code, cause, message and remedy, so the record shows every road not taken.

``--device`` requires that device and never substitutes; ``--prefer`` tries devices in order
and falls through; ``--route`` pins a route. With none of them the plan is an offload: devices
in the default preference (npu, integrated GPU, discrete GPU, cpu), every route but the
reference arm first in that order, and the reference arm last (``--offload`` asks for the same
explicitly). Within any device the reference arm is that device's last route: the reference
arm runs the numeric gate's reference, so a stage placed there proves no offload (the record
says so: ``plan.on_reference_arm``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xstage import errors
from xstage.device_table import DeviceReport, DeviceRow
from xstage.ledger import HOST_POOL
from xstage.refusal import Refusal, RefusalCode
from xstage.routes import DEVICE_PREFERENCE, ROUTE_NAMES, RouteSpec, RouteStatus, get_spec
from xstage.routes.hooks import check_option_keys

__all__ = ["Candidate", "Plan", "check_ep_options", "make_plan", "match_device", "plan"]


@dataclass(frozen=True)
class Candidate:
    """One (device, route) the stage may be opened on, in the order to try.

    ``pool`` and ``kind`` come from the device's row (host RAM and ``cpu`` when the table has
    no row for it), so admission needs nothing more from the device table.
    """

    device: str
    route: RouteStatus
    pool: str = HOST_POOL
    kind: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        """The candidate as JSON: device id and route name."""
        return {"device": self.device, "route": self.route.name}


@dataclass(frozen=True)
class Plan:
    """What to try, in order, and what was ruled out before trying (with why)."""

    candidates: tuple[Candidate, ...]
    refusals: tuple[Refusal, ...]
    mode: str  # "device", "prefer", "route" or "offload" ("default" in records before the offload default)
    fall_through: bool
    considered: tuple[str, ...] = field(default_factory=tuple)


def match_device(report: DeviceReport, wanted: str) -> list[DeviceRow]:
    """Rows for an id: exact, or a prefix.

    ``gpu_discrete:nvidia`` matches ``...:nvidia:0``, ``npu`` matches any NPU.
    """
    rows = list(report.devices)
    exact = [r for r in rows if r.device.id == wanted]
    if exact:
        return exact
    return [r for r in rows if r.device.id.startswith(wanted + ":") or r.device.kind == wanted]


def _routes_for(row: DeviceRow, fmt: str, only: str | None) -> tuple[list[Candidate], list[Refusal]]:
    device = row.device.id
    cands: list[Candidate] = []
    refusals: list[Refusal] = []
    order = {name: i for i, name in enumerate(ROUTE_NAMES)}  # a plugin table's route goes last
    # The device's reference arm after its other routes (a plugin route included).
    ordered = sorted(row.routes, key=lambda r: (r.spec.reference_arm, order.get(r.name, len(order))))
    for status in ordered:
        if only and status.name != only:
            continue
        if fmt not in status.spec.formats:
            continue
        if status.resolved and device in status.devices:
            cands.append(Candidate(device, status, row.device.pool, row.device.kind))
        else:
            refusals.append(Refusal(
                code=RefusalCode.DEVICE_UNREACHABLE, cause="route_missing", device=device,
                route=status.name,
                message=f"{device} could be driven by {status.name}, which is missing here: "
                f"{status.reason or 'it does not drive this device'}",
                remedy=status.remedy or f"xstage devices --refresh (see the {status.name} row)",
                evidence={"reason_code": status.reason_code.value if status.reason_code else None,
                          "interpreter": status.interpreter},
            ))
    return cands, refusals


def _no_format(device: str, fmt: str, row: DeviceRow | None) -> Refusal:
    runs = sorted({f for r in (row.routes if row else ()) for f in r.spec.formats})
    return Refusal(
        code=RefusalCode.NO_EXPORTED_GRAPH, cause="format_not_run_here", device=device, route=None,
        message=f"no route of {device} runs {fmt} artifacts"
        + (f" (its routes run: {', '.join(runs)})" if runs else ""),
        remedy="export the stage in a format this device runs (e.g. onnx:a16w8 for NPUs)",
        evidence={"format": fmt, "formats_here": runs},
    )


def _format_declined(device: str, fmt: str, spec: RouteSpec) -> Refusal:
    """A format the route's device declines by its documented limit (``RouteSpec.declines``)."""
    limit = spec.declines[fmt]
    return Refusal(
        code=RefusalCode.NO_EXPORTED_GRAPH, cause="format_not_accepted", device=device,
        route=spec.name, message=f"{device} does not accept {fmt} through {spec.name}: {limit}",
        remedy=spec.declines_remedy or f"export the stage as {' or '.join(spec.formats)}",
        evidence={"format": fmt, "limit": limit, "formats_taken": list(spec.formats)},
    )


def _plan_device(report: DeviceReport, wanted: str, fmt: str, only: str | None
                 ) -> tuple[list[Candidate], list[Refusal]]:
    rows = match_device(report, wanted)
    if not rows:
        have = ", ".join(r.device.id for r in report.devices) or "nothing"
        return [], [Refusal(
            code=RefusalCode.DEVICE_UNREACHABLE, cause="no_route", device=wanted, route=None,
            message=f"this machine shows no device {wanted} (it has: {have})",
            remedy="pick a device `xstage devices` lists, or run on a machine that has it",
            evidence={"devices": [r.device.id for r in report.devices]},
        )]
    cands: list[Candidate] = []
    refusals: list[Refusal] = []
    for row in rows:
        if not row.routes:  # no route can drive it at all: not a format problem
            refusals.append(Refusal(
                code=RefusalCode.DEVICE_UNREACHABLE, cause="no_route", device=row.device.id,
                route=None, message=f"no route drives {row.device.id} ({row.device.name})",
                remedy="xstage devices lists the routes; none is written for this device",
                evidence={}))
            continue
        declining = [r.spec for r in row.routes if fmt in r.spec.declines
                     and (not only or r.name == only)]
        refusals += [_format_declined(row.device.id, fmt, spec) for spec in declining]
        if not any(fmt in r.spec.formats for r in row.routes if not only or r.name == only):
            if not declining:
                refusals.append(_no_format(row.device.id, fmt, row))
            continue
        c, r = _routes_for(row, fmt, only)
        cands += c
        refusals += r
        if not c and not r:
            refusals.append(Refusal(
                code=RefusalCode.DEVICE_UNREACHABLE, cause="no_route", device=row.device.id,
                route=only, message=f"no route drives {row.device.id} from here",
                remedy="xstage devices shows which routes exist for it", evidence={}))
    return cands, refusals


def _check_device_class(wanted: str) -> None:
    """Check that a device id's class is one xstage knows (a closed set).

    A known class this machine lacks is a refusal later, not a usage error.

    Raises:
        UsageError: an unknown class, naming the known ones.
    """
    kind = wanted.split(":", 1)[0]
    if kind not in DEVICE_PREFERENCE:
        raise errors.UsageError(
            f"unknown device class {kind!r} (in {wanted!r})",
            remedy=f"device classes: {', '.join(DEVICE_PREFERENCE)}; xstage devices lists this "
            "machine's devices")


def check_ep_options(plan: Plan, ep_options: Mapping[str, str] | None, *, pinned: bool) -> None:
    """Every ``--ep-option`` key must be one a route of ``plan`` takes, before any worker starts.

    ``routes.hooks.check_option_keys`` on the plan's candidates; ``pinned``: the user named the
    route.

    Raises:
        UsageError: a key no candidate route takes, naming the keys each takes.
    """
    check_option_keys([c.route for c in plan.candidates], ep_options, pinned=pinned)


def make_plan(
    report: DeviceReport,
    fmt: str,
    *,
    device: str | None = None,
    prefer: Sequence[str] | None = None,
    route: str | None = None,
    offload: bool = False,
) -> Plan:
    """Candidates and refusals for an artifact of format ``fmt``.

    Modes: a pinned ``route``; one ``device`` (never substituted); ``prefer`` (devices in
    order, falling through); and, with none of them (or ``offload``), the offload: every device
    by ``DEVICE_PREFERENCE`` with every reference-arm route moved last, so the stage goes
    anywhere but the reference first and falls through to it. In every mode a device's
    reference arm is its last route.

    Raises:
        UsageError: conflicting selectors, an unknown route, or a pinned route that cannot
            drive the asked device.
    """
    for wanted in ([device] if device else []) + list(prefer or ()):
        _check_device_class(wanted)
    if offload and (device or prefer or route):
        raise errors.UsageError(
            "--offload chooses the routes itself: it cannot be combined with --device, "
            "--prefer or --route", remedy="drop one of them")
    if device and prefer:
        raise errors.UsageError("--device and --prefer are mutually exclusive",
                                remedy="--device requires one device; --prefer lists several")
    if route is not None:
        return _plan_route(report, fmt, route, device)
    if device is not None:
        cands, refusals = _plan_device(report, device, fmt, None)
        return Plan(tuple(cands), tuple(refusals), "device", True, (device,))
    if prefer:
        all_c: list[Candidate] = []
        all_r: list[Refusal] = []
        for wanted in prefer:
            c, r = _plan_device(report, wanted, fmt, None)
            all_c += [x for x in c if x not in all_c]
            all_r += r
        return Plan(tuple(all_c), tuple(all_r), "prefer", True, tuple(prefer))
    order = sorted(report.devices, key=lambda r: (DEVICE_PREFERENCE.index(r.device.kind)
                                                  if r.device.kind in DEVICE_PREFERENCE else 99))
    all_c, all_r = [], []
    for row in order:
        c, r = _plan_device(report, row.device.id, fmt, None)
        all_c += c
        all_r += r
    first = [c for c in all_c if not c.route.spec.reference_arm]
    all_c = first + [c for c in all_c if c.route.spec.reference_arm]
    return Plan(tuple(all_c), tuple(all_r), "offload", True, tuple(r.device.id for r in order))


def _plan_route(report: DeviceReport, fmt: str, route: str, device: str | None) -> Plan:
    """A pinned route: one candidate (its most preferred device, or the one asked), or why not.

    Raises:
        UsageError: an unknown route, or one that cannot drive the asked device.
    """
    known = [r.name for r in report.routes] or list(ROUTE_NAMES)
    if route not in known:
        raise errors.UsageError(f"unknown route {route!r}", remedy=f"routes: {', '.join(known)}")
    spec = report.route(route).spec if report.routes else get_spec(route)
    if fmt in spec.declines:
        return Plan((), (_format_declined(device or spec.device_class, fmt, spec),), "route", False)
    if fmt not in spec.formats:
        refusal = Refusal(
            code=RefusalCode.NO_EXPORTED_GRAPH, cause="format_not_run_here",
            device=device or spec.device_class,
            route=route, message=f"route {route} does not run {fmt} artifacts "
            f"(it runs: {', '.join(spec.formats)})",
            remedy="export the stage in one of those formats, or pick another route",
            evidence={"format": fmt})
        return Plan((), (refusal,), "route", False)
    status = report.route(route)
    asked = device
    if device is None:  # name the device it would have driven, for the record
        device = next((r.device.id for r in report.devices
                       if spec.can_drive(r.device.kind, r.device.vendor)), spec.device_class)
    if asked is not None:
        kind = device.split(":")[0]
        vendor = device.split(":")[1] if ":" in device else None
        # a bare class ("npu") asks for any vendor: fine if the route drives one of them
        drives = spec.can_drive(kind, vendor) or (vendor is None and kind in spec.device_classes)
        if not drives and not (
                status.resolved and any(d == device or d.startswith(device + ":")
                                        for d in status.devices)):
            raise errors.UsageError(
                f"route {route} cannot drive {device}",
                remedy=f"it drives: {', '.join(f'{k}:{v}' if v else k for k, v in spec.drives)}")
    if not status.resolved:
        refusal = Refusal(
            code=RefusalCode.DEVICE_UNREACHABLE, cause="route_missing", device=device,
            route=route, message=f"route {route} is missing: {status.reason}",
            remedy=status.remedy,
            evidence={"reason_code": status.reason_code.value if status.reason_code else None,
                      "interpreter": status.interpreter})
        return Plan((), (refusal,), "route", False)
    targets = [d for d in status.devices
               if asked is None or d == asked or d.startswith(asked + ":")]
    # A pinned route with no device goes to its most preferred device (npu first).
    targets.sort(key=lambda d: DEVICE_PREFERENCE.index(d.split(":")[0])
                 if d.split(":")[0] in DEVICE_PREFERENCE else len(DEVICE_PREFERENCE))
    if not targets:
        refusal = Refusal(
            code=RefusalCode.DEVICE_UNREACHABLE, cause="no_route", device=device, route=route,
            message=f"route {route} resolved but drives {', '.join(status.devices) or 'nothing'} "
            f"here, not {device}", remedy="xstage devices shows what each route drives",
            evidence={"devices": list(status.devices)})
        return Plan((), (refusal,), "route", False)
    row = report.device(targets[0])
    cand = (Candidate(targets[0], status, row.device.pool, row.device.kind) if row
            else Candidate(targets[0], status))
    return Plan((cand,), (), "route", False)


def plan(
    artifact: str | Any,
    *,
    device: str | None = None,
    prefer: Sequence[str] | None = None,
    route: str | None = None,
    offload: bool = False,
    fmt: str | None = None,
    report: DeviceReport | None = None,
) -> Plan:
    """The plan for an artifact on this machine: what ``open_stage`` would try, in order.

    Starts nothing but the route probes ``xstage.devices()`` runs (cached).

    Args:
        artifact: the stage's graph (a path), as ``open_stage`` takes it.
        device: require this device (never substituted).
        prefer: devices in order, falling through.
        route: pin one route.
        offload: every route but the reference arm first, the reference arm last (what no
            selector at all also plans).
        fmt: the artifact's declared format (inferred when None).
        report: the device table to plan against (default: ``xstage.devices()``).

    Returns:
        The ``Plan``: candidates in order and the refusals decided before trying.

    Raises:
        UsageError: conflicting selectors, an unknown device class or route.
        ArtifactError: the artifact cannot be read.
    """
    from xstage.artifact import inspect_artifact
    from xstage.device_table import devices

    art = inspect_artifact(artifact, fmt=fmt)
    art.release()  # only its format is needed
    return make_plan(report or devices(), art.format, device=device, prefer=prefer, route=route,
                     offload=offload)
