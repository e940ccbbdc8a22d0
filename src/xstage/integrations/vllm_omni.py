"""vLLM-Omni's external-stage API, backed by xstage: the engine's call sites run unchanged.

vLLM-Omni's local engine places one stage on a device it does not drive through two call
sequences (docs/engines.md has the mapping, call by call, and what differs):

* the planner and the stage: ``plan_external_stage(artifact, devices, …) -> StagePlan``
  (starts no process; the budget is checked), ``ExternalStage(plan)`` (raises
  ``PlacementRefused`` when the plan admitted nothing), ``.open(example_inputs) -> LoadReport``,
  ``.run(inputs) -> (outputs, RunTiming)``, ``.stats()``, ``.close()``, and
  ``verify_placement(plan, report) -> Refusal | None``;
* the graph backend's worker: ``ExternalWorker(route, start_timeout_s=, max_payload_bytes=)``
  with ``.start()``, ``.hello``, ``.load(path, example_inputs=, …) -> LoadReport``,
  ``.run(inputs)`` and ``.terminate() -> drained``, fed by an ``ArtifactManifest`` bundle.

The names, signatures, field names and exceptions are the engine's; what runs behind them is
xstage's: the planner (``xstage.planner.make_plan``), the budget (``xstage.ledger`` and the
process-wide ``Ledger``), and ``open_stage``'s admission (the proof, the device attestation,
the numeric gate, the measured peak). Rules:

1. **The engine's scope.** ``plan_external_stage`` considers the rows whose ``kind`` is in
   ``kinds`` (default ``ENGINE_KINDS``: the integrated GPU and the NPU, as the engine does);
   xstage's own default plan considers every device.
2. **The fraction.** ``LoadReport.fraction_on_target`` is the proof's fraction: the lower of
   the node fraction and the kernel-time fraction. xstage requires both to reach the
   threshold, attests the device and gates the numbers; the engine's own gate counts nodes
   only. Each report's ``note`` says which of these decided and which reference the numeric
   gate compared against (a quantized artifact without an fp32 source is gated as xstage
   gates it: against its own graph on the CPU, at that format's tolerance).
3. **A refusal is raised where the engine expects one.** ``ExternalStage.open`` raises
   ``PlacementRefused`` for every refusal xstage makes (the engine's gate raises it for the
   placement alone); ``ExternalWorker.load`` raises it too, where the engine's worker returns
   a report for its caller to judge: an xstage refusal leaves no worker to run.
4. **The backend's threshold.** ``ExternalWorker.load`` places at ``min_fraction_on_target``
   1.0 by default, the graph backend's default; ``plan_external_stage`` at 0.5, the planner's.
5. **Rows stand for xstage devices.** A ``DeviceCapability`` names the xstage device behind
   it in ``extra["xstage_device"]`` (default: its own ``device_id``) and its route in
   ``extra["worker_route"]``; ``enumerate_devices`` builds the rows from xstage's table.
6. **Codes.** Every ``Refusal.code`` is one of xstage's five (docs/design.md §7); a required device
   that is not among the rows is ``device_unreachable_from_this_process`` (``cause``
   ``no_route``), where the engine says ``no_runnable_device``.

Nothing here is imported by ``import xstage``; it imports numpy and xstage only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors
from xstage.refusal import RefusalCode

if TYPE_CHECKING:
    from xstage.device_table import DeviceReport
    from xstage.stage.handle import Stage

__all__ = [
    "BACKEND_MIN_FRACTION",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ENGINE_KINDS",
    "MIN_FRACTION_ON_TARGET",
    "ArtifactManifest",
    "DeviceCapability",
    "ExternalStage",
    "ExternalWorker",
    "GraphArtifact",
    "LoadReport",
    "MemoryReservation",
    "PayloadTooLarge",
    "PlacementRefused",
    "Refusal",
    "Route",
    "RunTiming",
    "StagePlan",
    "WorkerStartError",
    "build_graph_artifact",
    "enumerate_devices",
    "file_digest",
    "plan_external_stage",
    "resolve_route",
    "verify_placement",
]

MiB = 2**20

#: The device kinds the engine's external-stage planner considers (rule 1).
ENGINE_KINDS: tuple[str, ...] = ("gpu_integrated", "npu")
#: The planner's default placement threshold (``plan_external_stage``).
MIN_FRACTION_ON_TARGET = 0.5
#: The graph backend's default placement threshold (``ExternalWorker.load``, rule 4).
BACKEND_MIN_FRACTION = 1.0
#: The most bytes one call's inputs, or its outputs, may carry (``ExternalWorker``).
DEFAULT_MAX_PAYLOAD_BYTES = 256 * MiB

_UNREACHABLE = RefusalCode.DEVICE_UNREACHABLE.value
_NO_GRAPH = RefusalCode.NO_EXPORTED_GRAPH.value
_DECLINED = RefusalCode.EP_DECLINED.value
_BUDGET = RefusalCode.BUDGET_EXCEEDS_DEVICE.value


# ---- values -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A named reason a device was not used, with the action that fixes it.

    ``cause`` is xstage's (docs/external.md, the refusal table); the engine reads the first
    four fields.
    """

    code: str
    device_id: str
    message: str
    remedy: str
    cause: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The refusal as JSON."""
        return asdict(self)


class PlacementRefused(RuntimeError):
    """The stage could not be placed; carries the refusal and the report, when there was one."""

    def __init__(self, refusal: Refusal, report: LoadReport | None = None) -> None:
        super().__init__(f"[{refusal.code}] {refusal.message}")
        self.refusal = refusal
        self.report = report


class WorkerStartError(RuntimeError):
    """The route cannot start a worker, or the worker was used out of order."""


class PayloadTooLarge(ValueError):
    """One call's inputs or outputs carry more than the worker's ``max_payload_bytes``."""


@dataclass(frozen=True)
class GraphArtifact:
    """An exported graph: where it is, what it is, and where it came from.

    ``sha256`` and ``bytes`` cover the graph *and* its external-data files (xstage's artifact
    identity); ``fmt`` is checked against the graph when the stage opens.
    """

    path: str
    sha256: str
    bytes: int
    fmt: str
    opset: int
    source_model: str
    source_revision: str | None
    component: str
    exporter: str
    input_spec: tuple[dict[str, Any], ...] = ()
    output_spec: tuple[dict[str, Any], ...] = ()
    calibration: dict[str, Any] | None = None
    parity: dict[str, Any] | None = None
    notes: str = ""

    @property
    def artifact_id(self) -> str:
        """A short stable key: digest, format, opset and component."""
        seed = f"{self.sha256}:{self.fmt}:{self.opset}:{self.component}"
        return hashlib.sha256(seed.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The artifact as JSON."""
        return asdict(self)


def build_graph_artifact(
    path: str | os.PathLike[str], *, fmt: str, opset: int, source_model: str, component: str,
    exporter: str, source_revision: str | None = None, input_spec: tuple[dict[str, Any], ...] = (),
    output_spec: tuple[dict[str, Any], ...] = (), calibration: dict[str, Any] | None = None,
    parity: dict[str, Any] | None = None, notes: str = "",
) -> GraphArtifact:
    """Describe an exported graph (xstage reads it: digest over every file, declared I/O).

    Raises:
        FileNotFoundError: no file at ``path``.
        UsageError: ``fmt`` is not what the graph holds.
    """
    from xstage.artifact import inspect_artifact

    if not Path(path).is_file():
        raise FileNotFoundError(f"exported graph not found: {path}")
    art = inspect_artifact(path, fmt=fmt, component=component)
    try:
        spec_in = input_spec or tuple(io.to_dict() for io in art.inputs)
        spec_out = output_spec or tuple(io.to_dict() for io in art.outputs)
        return GraphArtifact(
            path=str(path), sha256=art.sha256, bytes=art.bytes, fmt=art.format, opset=int(opset),
            source_model=str(source_model), source_revision=source_revision, component=component,
            exporter=exporter, input_spec=spec_in, output_spec=spec_out, calibration=calibration,
            parity=parity, notes=notes)
    finally:
        art.release()


@dataclass(frozen=True)
class DeviceCapability:
    """One device, as this process can use it (rule 5: ``extra`` names the xstage device)."""

    device_id: str
    kind: str
    vendor: str
    name: str
    backend: str | None
    runnable: bool
    memory_pool: str
    memory_bytes: int
    compute_capability: tuple[int, ...] | None
    weight_formats: frozenset[str]
    evidence: str
    reason: str = ""
    masked: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON (formats sorted)."""
        out = asdict(self)
        out["weight_formats"] = sorted(self.weight_formats)
        out["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return out


@dataclass
class MemoryReservation:
    """One claim on one pool, budgeted before the load and checked after it."""

    pool: str
    purpose: str
    bytes: int
    lifetime: str
    reclaimable: str
    evidence: str
    note: str = ""
    actual_upper_bound_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The reservation as JSON."""
        return asdict(self)


@dataclass(frozen=True)
class Route:
    """One way to reach a device, resolved or not (xstage's route, in the engine's shape)."""

    name: str
    interpreter: str | None
    worker: str
    ep: str
    is_windows: bool
    available: bool
    reason: str = ""
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The route as JSON."""
        return asdict(self)


@dataclass(frozen=True)
class LoadReport:
    """What the worker did when it opened the graph, and where it put it.

    ``fraction_on_target`` is the proof's fraction (rule 2); ``None`` only when nothing was
    measured. ``note`` says what xstage decided beyond the engine's node count. ``warmup_s``
    is the rest of the admission after the session was created (the profiled runs, the proof,
    the gate).
    """

    ep: str
    graph_path: str
    device_name: str = ""
    placement_granularity: str = "graph_nodes"
    session_providers: tuple[str, ...] = ()
    available_providers: tuple[str, ...] = ()
    node_counts: dict[str, int] = field(default_factory=dict)
    total_nodes: int = 0
    target_nodes: int = 0
    fraction_on_target: float | None = None
    session_create_s: float = 0.0
    warmup_s: float = 0.0
    rss_bytes: int = 0
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    profile_path: str = ""
    ep_directory: str = ""
    requested_provider_missing: str = ""
    fallback_note: str = ""
    onnxruntime: str = ""
    device_id_requested: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON."""
        return asdict(self)

    def summary(self) -> str:
        """One line: placement, timings, the worker's resident set."""
        if self.fraction_on_target is None:
            placement = f"placement unverified ({self.note or 'no profiled run'})"
        else:
            split = ", ".join(f"{k}={v}" for k, v in sorted(self.node_counts.items()))
            placement = f"{self.target_nodes}/{self.total_nodes} nodes on {self.ep} ({split})"
        device = f" ({self.device_name})" if self.device_name else ""
        return (f"{Path(self.graph_path).name} on {self.ep}{device}: {placement}; "
                f"session {self.session_create_s:.3f}s, warmup {self.warmup_s:.3f}s, "
                f"worker rss {self.rss_bytes / MiB:.0f} MiB")


@dataclass(frozen=True)
class RunTiming:
    """Where one forward's wall time went: inside the worker, and the round trip here."""

    worker_s: float
    round_trip_s: float

    @property
    def transport_s(self) -> float:
        """The round trip less the worker's time: copies, the channel, dispatch."""
        return max(0.0, self.round_trip_s - self.worker_s)

    def to_dict(self) -> dict[str, float]:
        """The timing as JSON, ``transport_s`` included."""
        return {"worker_s": self.worker_s, "round_trip_s": self.round_trip_s,
                "transport_s": self.transport_s}


# ---- devices and routes ------------------------------------------------------------------


def _short_ep(spec: Any) -> str:
    """The engine's EP spelling: ``vitisai``, ``dml``, ``cpu``, ``openvino`` …"""
    if spec.ep:
        return str(spec.ep).removesuffix("ExecutionProvider").lower()
    return str(spec.torch_device or spec.runtime)


def _route_from_status(status: Any) -> Route:
    spec = status.spec
    extra = {"xstage_route": status.name, "devices": list(status.devices),
             "reason_code": status.reason_code.value if status.reason_code else None,
             "remedy": status.remedy, "versions": dict(status.versions or {}),
             "reference_arm": spec.reference_arm}
    return Route(name=status.name, interpreter=str(status.interpreter) if status.interpreter else None,
                 worker="xstage_remote.worker", ep=_short_ep(spec), is_windows=spec.os_side == "windows",
                 available=bool(status.resolved), reason=status.reason, extra=extra)


def resolve_route(name: str, *, report: DeviceReport | None = None) -> Route:
    """xstage's route ``name`` in the engine's ``Route`` shape (resolved or not, with why).

    Raises:
        ValueError: no route has that name (the message lists them).
    """
    from xstage.device_table import devices

    table = report or devices()
    known = [r.name for r in table.routes]
    if name not in known:
        raise ValueError(f"unknown route {name!r}; expected one of {sorted(known)}")
    return _route_from_status(table.route(name))


def enumerate_devices(report: DeviceReport | None = None, *,
                      kinds: Sequence[str] | None = None) -> list[DeviceCapability]:
    """The rows of xstage's device table as the engine's ``DeviceCapability`` list.

    A row is runnable when a resolved route drives it; its ``weight_formats`` are those
    routes' formats; ``extra["worker_route"]`` is the first of them that is not a reference
    arm (else the reference arm). The integrated GPU and NPU rows report ``memory_bytes`` 0
    (they share the host pool).
    """
    from xstage.device_table import devices

    table = report or devices()
    host_free = next((int(r.device.available_bytes) for r in table.devices if r.device.kind == "cpu"), 0)
    out = []
    for row in table.devices:
        dev = row.device
        if kinds is not None and dev.kind not in kinds:
            continue
        resolved = sorted((r for r in row.routes if r.resolved), key=lambda r: r.spec.reference_arm)
        formats = frozenset(f for r in resolved for f in r.spec.formats)
        missing = "; ".join(f"{r.name}: {r.reason}" for r in row.routes if not r.resolved)
        out.append(DeviceCapability(
            device_id=dev.id, kind=dev.kind, vendor=dev.vendor or "", name=dev.name,
            backend=f"xstage:{resolved[0].name}" if resolved else None, runnable=bool(resolved),
            memory_pool=dev.pool, memory_bytes=int(dev.memory_bytes or 0), compute_capability=None,
            weight_formats=formats, evidence="D", reason="" if resolved else missing,
            extra={"xstage_device": dev.id, "worker_route": resolved[0].name if resolved else None,
                   "routes": [_route_from_status(r).to_dict() for r in row.routes],
                   "host_pool_available_bytes": host_free}))
    return out


# ---- the plan ------------------------------------------------------------------------------


@dataclass
class StagePlan:
    """Where one exported graph would run, what it would cost, and what was refused."""

    artifact: GraphArtifact
    device: DeviceCapability | None
    route: Route | None
    reservations: list[MemoryReservation] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    min_fraction_on_target: float = MIN_FRACTION_ON_TARGET
    report: LoadReport | None = None
    #: xstage's side of the choice: the device id, the device table, the pool capacity.
    xstage: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def admitted(self) -> bool:
        """A device and a route were chosen."""
        return self.device is not None and self.route is not None

    @property
    def budget_bytes(self) -> int:
        """The sum of the reservations."""
        return sum(r.bytes for r in self.reservations)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON."""
        return {
            "artifact": self.artifact.to_dict(),
            "device": self.device.to_dict() if self.device else None,
            "route": self.route.to_dict() if self.route else None,
            "reservations": [r.to_dict() for r in self.reservations],
            "refusals": [r.to_dict() for r in self.refusals],
            "min_fraction_on_target": self.min_fraction_on_target,
            "budget_bytes": self.budget_bytes,
            "admitted": self.admitted,
            "report": self.report.to_dict() if self.report else None,
            "xstage_device": self.xstage.get("device"),
        }

    def summary(self) -> str:
        """The plan for people: the choice and its budget, or every refusal with its remedy."""
        head = f"{self.artifact.component} ({self.artifact.fmt}, {self.artifact.bytes / MiB:.1f} MiB)"
        if not self.admitted:
            lines = [f"{head}: REFUSED"]
            lines += [f"  [{r.code}] {r.device_id}: {r.message}\n      remedy: {r.remedy}"
                      for r in self.refusals]
            return "\n".join(lines)
        assert self.device is not None and self.route is not None
        lines = [f"{head} -> {self.device.device_id} via {self.route.name} "
                 f"(xstage device {self.xstage.get('device')})",
                 f"  budget {self.budget_bytes / MiB:.0f} MiB on {self.device.memory_pool}"]
        for r in self.reservations:
            lines.append(f"    {r.purpose:<18} {r.bytes / MiB:>7.0f} MiB  [{r.evidence}] {r.lifetime}")
        if self.report is not None:
            lines.append(f"  {self.report.summary()}")
        lines += [f"  also considered: [{r.code}] {r.device_id}: {r.message}" for r in self.refusals]
        return "\n".join(lines)


def _from_xstage(refusal: Any, device_id: str) -> Refusal:
    return Refusal(code=refusal.code.value, device_id=device_id, message=refusal.message,
                   remedy=refusal.remedy, cause=refusal.cause)


def _static_shapes(art: Any) -> dict[str, tuple[int, ...]]:
    return {io.name: tuple(int(d) for d in io.shape) for io in art.inputs
            if all(isinstance(d, int) for d in io.shape)}


def _budget(art: Any, cand: Any, table: DeviceReport, capacity: int | None) -> tuple[Any, Any]:
    """The candidate's budget and its fit in its pool (no process starts)."""
    from xstage import ledger as ledger_mod
    from xstage.ledger import footprint
    from xstage.stage.ledger import Ledger

    spec = cand.route.spec
    held = footprint.reservations(art, spec.memory_cost(cand.route.versions), cand.pool,
                                  _static_shapes(art), route=cand.route.name)
    budget = ledger_mod.make_budget(held, pool=cand.pool)
    book = Ledger.default()
    pool = (ledger_mod.Pool(cand.pool, capacity, "pool_capacity_bytes") if capacity is not None
            else book.pool(cand.pool, [row.device for row in table.devices]))
    return budget, ledger_mod.check_fit(pool, book.held_bytes(cand.pool), budget)


def _candidates(devices: Sequence[DeviceCapability], kinds: Sequence[str], prefer: str | None,
                require: str | None) -> tuple[list[DeviceCapability], Refusal | None]:
    cands = [d for d in devices if d.kind in kinds]
    if require:
        cands = [d for d in cands if d.device_id == require]
        if not cands:
            return [], Refusal(
                _UNREACHABLE, require,
                f"{require!r} was required and is not among the devices in scope "
                f"({[d.device_id for d in devices if d.kind in kinds]}; scope {list(kinds)})",
                "`xstage devices` lists what this process can reach, and why anything missing is "
                "missing", cause="no_route")
    elif prefer:
        cands.sort(key=lambda d: d.device_id != prefer)
    if not cands:
        return [], Refusal(
            _UNREACHABLE, "-", f"no device of kind {' or '.join(kinds)} is among the devices given",
            "`xstage devices` lists what this process can reach; pass kinds= to widen the scope",
            cause="no_route")
    return cands, None


def _consider(plan: StagePlan, device: DeviceCapability, art: Any, table: DeviceReport,
              capacity: int | None) -> bool:
    """One row through the plan's checks; True when it was chosen."""
    from xstage.planner import make_plan

    if not device.runnable:
        plan.refusals.append(Refusal(_UNREACHABLE, device.device_id,
                                     device.reason or "no route resolves for this device here",
                                     "`xstage devices` says what each missing route needs",
                                     cause="route_missing"))
        return False
    if art.format not in device.weight_formats:
        plan.refusals.append(Refusal(
            _NO_GRAPH, device.device_id, f"{device.device_id} executes {sorted(device.weight_formats)}, "
            f"and this graph is {art.format}", "export the stage in one of those formats",
            cause="format_not_run_here"))
        return False
    xdev = str(device.extra.get("xstage_device") or device.device_id)
    route = device.extra.get("worker_route")
    try:
        xplan = make_plan(table, art.format, device=xdev, route=str(route) if route else None)
    except errors.UsageError as exc:
        plan.refusals.append(Refusal(_UNREACHABLE, device.device_id, str(exc), exc.remedy or "",
                                     cause="no_route"))
        return False
    if not xplan.candidates:
        plan.refusals += [_from_xstage(r, device.device_id) for r in xplan.refusals[:1]]
        return False
    cand = xplan.candidates[0]
    budget, fit = _budget(art, cand, table, capacity)
    if not fit.fits:
        plan.refusals.append(Refusal(_BUDGET, device.device_id, fit.message(), fit.remedy(),
                                     cause=fit.cause or "over_budget"))
        return False
    plan.device, plan.route = device, _route_from_status(cand.route)
    plan.reservations = [MemoryReservation(r.pool, r.purpose, r.bytes, r.lifetime, "on_release",
                                           r.evidence, r.basis) for r in budget.reservations]
    plan.xstage.update(device=cand.device, route=cand.route.name, pool=cand.pool)
    return True


def plan_external_stage(
    artifact: GraphArtifact,
    devices: list[DeviceCapability],
    *,
    prefer: str | None = None,
    require: str | None = None,
    min_fraction_on_target: float = MIN_FRACTION_ON_TARGET,
    pool_capacity_bytes: int | None = None,
    kinds: Sequence[str] = ENGINE_KINDS,
    report: DeviceReport | None = None,
) -> StagePlan:
    """Choose a device for one exported graph, or refuse with reasons; starts no process.

    ``require`` names the only device that may be used (a refusal, never a substitute);
    ``prefer`` tries one first and falls through. Each row of scope ``kinds`` goes through:
    a route resolves (``device_unreachable_from_this_process``), the format is one it runs
    (``no_exported_graph``), xstage's planner has a candidate for (the row's xstage device,
    its route), and the budget fits the pool (``budget_exceeds_device``; the pool's capacity
    is ``pool_capacity_bytes`` when given, else the ledger's). Every refused row stays in
    ``refusals``.

    Args:
        artifact: the exported graph.
        devices: the rows to choose from (``enumerate_devices()``, or the engine's own).
        prefer: a ``device_id`` to try first.
        require: the only ``device_id`` that may be used.
        min_fraction_on_target: the placement threshold ``open`` applies (0 to 1).
        pool_capacity_bytes: the pool's capacity, instead of what the ledger reads.
        kinds: the device kinds in scope (the engine's: the integrated GPU and the NPU).
        report: xstage's device table (default: ``xstage.devices()``).

    Raises:
        UsageError: ``artifact.fmt`` is not what the graph holds.
        ArtifactError: the graph cannot be read.
    """
    from xstage.artifact import inspect_artifact
    from xstage.device_table import devices as device_table

    plan = StagePlan(artifact=artifact, device=None, route=None,
                     min_fraction_on_target=min_fraction_on_target)
    cands, refusal = _candidates(devices, kinds, prefer, require)
    if refusal is not None:
        plan.refusals.append(refusal)
        return plan
    table = report or device_table()
    plan.xstage.update(report=table, capacity=pool_capacity_bytes)
    art = inspect_artifact(artifact.path, fmt=artifact.fmt, component=artifact.component)
    try:
        for device in cands:
            if _consider(plan, device, art, table, pool_capacity_bytes):
                break
    finally:
        art.release()
    return plan


# ---- the report ----------------------------------------------------------------------------


def _node_counts(proof: Mapping[str, Any]) -> dict[str, int]:
    counts = {str(proof.get("target_ep")): int(proof.get("nodes_on_target") or 0)}
    for ep, ops in (proof.get("off_target_nodes") or {}).items():
        counts[ep] = counts.get(ep, 0) + sum(int(n) for n in (ops or {}).values())
    return counts


def _stricter(proof: Mapping[str, Any], parity: Mapping[str, Any] | None,
              attestation: Mapping[str, Any] | None) -> str:
    """The note: what xstage decided beyond the engine's node count."""
    parts = [f"xstage proof {proof.get('verdict')}: fraction {proof.get('fraction')} is the lower of "
             f"node fraction {proof.get('node_fraction')} and time fraction {proof.get('time_fraction')} "
             f"(decided by {proof.get('decided_by')}); both must reach {proof.get('min_placement')}, "
             "where the engine counts nodes only"]
    if attestation:
        parts.append(f"device attested {attestation.get('observed')} by {attestation.get('source')} "
                     f"({attestation.get('detail')}), planned {attestation.get('planned')}")
    if parity:
        parts.append(f"numeric gate {parity.get('verdict')} against reference "
                     f"{parity.get('reference_kind')} at {parity.get('tolerance_key')}: "
                     f"{parity.get('summary')}")
    return "; ".join(parts)


def _report(record: Mapping[str, Any], ep: str, graph_path: str, extra_note: str = "",
            io: Any = None) -> LoadReport:
    """A ``LoadReport`` from an xstage record (a stage's, or a refusal's)."""
    proof = dict(record.get("proof") or {})
    refusals = (record.get("outcome") or {}).get("refusals") or []
    if not proof and refusals and refusals[-1].get("code") == _DECLINED:
        proof = dict(refusals[-1].get("evidence") or {})
    worker = record.get("worker") or {}
    runtime = worker.get("runtime") or {}
    attestation = record.get("device_attestation")
    note = _stricter(proof, record.get("parity"), attestation) if proof else "no proof was collected"
    fraction = proof.get("fraction")
    return LoadReport(
        ep=ep, graph_path=graph_path,
        device_name=str((attestation or {}).get("observed") or (record.get("plan") or {}).get(
            "chosen", {}).get("device") or ""),
        session_providers=tuple(proof.get("session_providers") or ()),
        available_providers=tuple(proof.get("available_providers") or ()),
        node_counts=_node_counts(proof) if proof else {},
        total_nodes=int(proof.get("nodes_total") or proof.get("original_nodes_total") or 0),
        target_nodes=int(proof.get("nodes_on_target") or 0),
        fraction_on_target=None if fraction is None else float(fraction),
        session_create_s=float(runtime.get("load_s") or 0.0),
        rss_bytes=int((record.get("memory") or {}).get("rss_bytes") or 0),
        inputs=tuple(i.to_dict() for i in io.inputs) if io is not None else (),
        outputs=tuple(o.to_dict() for o in io.outputs) if io is not None else (),
        requested_provider_missing="", onnxruntime=str(proof.get("ort_version") or ""),
        note="; ".join(p for p in (note, extra_note) if p))


def _write_profile(record: Mapping[str, Any], prefix: str | os.PathLike[str] | None) -> str:
    """The proof and its detail as JSON at ``<prefix>placement.json`` (the engine's profile)."""
    if prefix is None:
        return ""
    path = Path(f"{os.fspath(prefix)}placement.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {k: record.get(k) for k in ("proof", "detail", "device_attestation", "parity")}
    path.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    return str(path)


def verify_placement(plan: StagePlan, report: LoadReport) -> Refusal | None:
    """The engine's gate over a report: ``None`` when the placement reaches the plan's threshold.

    A provider that never came up, an unmeasured placement (``None``) and a fraction below
    ``plan.min_fraction_on_target`` are each ``execution_provider_declined_graph``.
    """
    device_id = plan.device.device_id if plan.device else "-"
    remedy = ("`xstage bisect` finds the regions this route takes whole; `xstage report` shows "
              "each node's provider")
    if report.requested_provider_missing:
        return Refusal(_DECLINED, device_id, report.fallback_note
                       or f"{report.requested_provider_missing} did not initialise", remedy,
                       cause="provider_swapped")
    if report.fraction_on_target is None:
        return Refusal(_DECLINED, device_id, "placement was not measured: no profiled run "
                       f"({report.note or 'no run'})", remedy, cause="unmeasured")
    if report.fraction_on_target < plan.min_fraction_on_target:
        split = ", ".join(f"{k}={v}" for k, v in sorted(report.node_counts.items()))
        return Refusal(_DECLINED, device_id,
                       f"{report.ep} took {report.fraction_on_target:.0%} of the graph, below the "
                       f"{plan.min_fraction_on_target:.0%} required; the split was {split}", remedy,
                       cause="declined")
    return None


def _refused(exc: errors.Refused, device_id: str, ep: str, graph_path: str) -> PlacementRefused:
    last = exc.refusals[-1]
    report = _report(exc.record, ep, graph_path) if exc.record else None
    return PlacementRefused(_from_xstage(last, device_id), report)


def _outputs(out: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {name: np.array(value) for name, value in out.items()}


# ---- the stage -----------------------------------------------------------------------------


class ExternalStage:
    """A planned stage, opened through ``open_stage`` (proof, attestation, gate, measured peak).

    Raises:
        PlacementRefused: the plan admitted nothing (its first refusal).
    """

    def __init__(self, plan: StagePlan) -> None:
        if not plan.admitted:
            raise PlacementRefused(plan.refusals[0] if plan.refusals else Refusal(
                _UNREACHABLE, "-", "no device was selected", "see the plan", cause="no_route"))
        self.plan = plan
        self._stage: Stage | None = None
        self._runs = 0
        self._run_s = 0.0

    def open(self, example_inputs: dict[str, np.ndarray], *,
             profile_dir: str | Path | None = None) -> LoadReport:
        """Start the worker, load the graph, prove where it ran and gate its numbers.

        Raises:
            ValueError: no ``example_inputs`` (placement is measured from a profiled run).
            PlacementRefused: xstage refused the stage (any of its five codes).
        """
        from xstage.stage import open_stage
        from xstage.stage.ledger import Ledger

        if not example_inputs:
            raise ValueError("example_inputs are required: placement is verified from a profiled run "
                             "of them, and without one there is no placement to check")
        plan, art = self.plan, self.plan.artifact
        assert plan.device is not None and plan.route is not None
        capacity = plan.xstage.get("capacity")
        ledger = Ledger({plan.xstage["pool"]: capacity}) if capacity is not None else None
        started = time.perf_counter()
        try:
            stage = open_stage(art.path, device=plan.xstage["device"], route=plan.xstage["route"],
                               min_placement=plan.min_fraction_on_target, inputs=example_inputs,
                               fmt=art.fmt, component=art.component, report=plan.xstage["report"],
                               ledger=ledger)
        except errors.Refused as exc:
            refused = _refused(exc, plan.device.device_id, plan.route.ep, art.path)
            plan.refusals.append(refused.refusal)
            plan.report = refused.report
            raise refused from None
        self._stage = stage
        record = stage.record()
        prefix = Path(profile_dir) / f"{art.component}_" if profile_dir else None
        report = _report(record, plan.route.ep, art.path, io=stage.artifact)
        report = _with(report, profile_path=_write_profile(record, prefix),
                       warmup_s=_after_session(report, started))
        plan.report = report
        refusal = verify_placement(plan, report)
        if refusal is not None:  # xstage admitted it, so this is the same threshold: never expected
            self.close()
            raise PlacementRefused(refusal, report)
        for reservation in plan.reservations:
            if reservation.purpose == "runtime" and report.rss_bytes:
                reservation.actual_upper_bound_bytes = report.rss_bytes
        return report

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTiming]:
        """One forward; ``RunTiming`` splits the worker's time from the round trip.

        Raises:
            RuntimeError: the stage is not open.
        """
        if self._stage is None:
            raise RuntimeError("stage is not open; call open() first")
        started = time.perf_counter()
        out = self._stage(inputs)
        round_trip = time.perf_counter() - started
        worker_s = float(self._stage.last_timing.get("worker_ns", 0)) * 1e-9
        self._runs += 1
        self._run_s += worker_s
        return _outputs(out), RunTiming(worker_s=worker_s, round_trip_s=round_trip)

    def stats(self) -> dict[str, Any]:
        """Runs, their worker time, the worker's own resident set and peak, the load report."""
        timing = self._stage.last_timing if self._stage is not None else {}
        report = self.plan.report
        return {"runs": self._runs, "total_run_s": self._run_s,
                "rss_bytes": int(timing.get("rss") or (report.rss_bytes if report else 0)),
                "peak_rss_bytes": int(timing.get("peak") or 0),
                "report": report.to_dict() if report else None}

    def close(self) -> None:
        """Close the stage (idempotent): the worker ends, the ledger releases its budget."""
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.close()

    def __enter__(self) -> ExternalStage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _after_session(report: LoadReport, started: float) -> float:
    """``warmup_s``: the admission's wall time after the session was created (the profiled
    runs, the proof, the numeric gate, the measured peak)."""
    return max(0.0, time.perf_counter() - started - report.session_create_s)


def _with(report: LoadReport, **changes: Any) -> LoadReport:
    from dataclasses import replace

    return replace(report, **changes)


# ---- the graph backend's worker ------------------------------------------------------------


def file_digest(path: str | os.PathLike[str]) -> str:
    """The sha256 of one file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ArtifactManifest:
    """The graph backend's bundle: files (relative POSIX paths) with their sha256, and metadata.

    Schema 1 only: ``metadata["graph_file"]`` and ``metadata["example_inputs_file"]`` name two
    of ``files``. ``read`` checks every file's digest and that none leaves the bundle.
    """

    schema_version: int
    component: str
    files: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def artifact_metadata(self) -> None:
        """Schema 1 carries no artifact metadata (None).

        Raises:
            ValueError: a schema this adapter does not read.
        """
        if self.schema_version != 1:
            raise ValueError(f"artifact manifest schema {self.schema_version} is not read here: "
                             "the graph backend binds schema 1 only")

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ArtifactManifest:
        """Read and check a manifest.

        Raises:
            ValueError: an unknown schema, no files, a path that leaves the bundle, or a file
                missing or changed.
        """
        path = Path(path)
        manifest = cls(**json.loads(path.read_text(encoding="utf-8")))
        if manifest.schema_version != 1 or not manifest.files:
            raise ValueError("unsupported or empty artifact manifest (schema 1, with files)")
        if not isinstance(manifest.component, str) or not manifest.component:
            raise ValueError("artifact component is required")
        root = path.parent.resolve()
        for name, digest in manifest.files.items():
            if not isinstance(name, str) or "\\" in name or ":" in name:
                raise ValueError("artifact payloads must use portable relative POSIX paths")
            target = (root / name).resolve()
            if root not in target.parents:
                raise ValueError(f"artifact path leaves bundle: {name}")
            if not target.is_file() or file_digest(target) != digest:
                raise ValueError(f"artifact payload missing or digest mismatch: {name}")
        return manifest


def _payload(tensors: Mapping[str, Any], limit: int, what: str) -> None:
    total = sum(int(np.asarray(v).nbytes) for v in tensors.values())
    if total > limit:
        raise PayloadTooLarge(f"{what} carry {total} bytes, over max_payload_bytes {limit}")


class ExternalWorker:
    """One stage on one route, in the graph backend's shape; ``load`` opens it through xstage.

    ``start()`` checks the route and answers the route's hello (interpreter, versions); the
    worker process starts in ``load`` (``open_stage`` starts, loads, proves and gates in one
    visit), after which ``hello`` is the worker's own. ``min_fraction_on_target`` is the
    backend's 1.0 unless given.

    Raises:
        WorkerStartError: the route is not available (its reason).
    """

    def __init__(self, route: Route, *, start_timeout_s: float = 120.0, call_timeout_s: float = 300.0,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 min_fraction_on_target: float = BACKEND_MIN_FRACTION,
                 report: DeviceReport | None = None) -> None:
        if not route.available:
            raise WorkerStartError(f"route {route.name} is not available: {route.reason}")
        if not 0 < min_fraction_on_target <= 1:
            raise ValueError("placement threshold must be in (0, 1]")
        self.route = route
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.max_payload_bytes = max_payload_bytes
        self.min_fraction_on_target = min_fraction_on_target
        self.hello: dict[str, Any] = {}
        self.report: LoadReport | None = None
        self._table = report
        self._started = False
        self._drained = False
        self._stage: Stage | None = None
        self._runs = 0
        self._run_s = 0.0

    def start(self) -> dict[str, Any]:
        """Check the route once more and return its hello (no process yet: see the class).

        Raises:
            WorkerStartError: started twice, or the route no longer resolves.
        """
        if self._started:
            raise WorkerStartError("worker instances cannot be started twice")
        route = resolve_route(self.route.name, report=self._table)
        if not route.available:
            raise WorkerStartError(f"route {route.name} is not available: {route.reason}")
        self._started = True
        self.hello = {"route": route.name, "interpreter": route.interpreter, "ep": route.ep,
                      "versions": dict((route.extra or {}).get("versions") or {})}
        return self.hello

    def load(self, graph_path: str | Path, *, example_inputs: dict[str, np.ndarray] | None = None,
             profile: bool = True, profile_prefix: str | Path | None = None,
             ep_dir: str | Path | None = None, intra_op_num_threads: int | None = None,
             device_id: int | None = None, artifact_files: list[Path] | None = None) -> LoadReport:
        """Open the graph on the route, prove where it ran, gate it; the report.

        ``example_inputs`` None: xstage synthesizes seeded inputs from the signature.
        ``artifact_files``: the bundle's hashed files; every file xstage would read (the
        graph and its external data) must be one of them. ``ep_dir``: xstage finds an EP
        through its route (docs/routes.md); it is kept in ``ep_directory``, not used.

        Raises:
            WorkerStartError: ``start()`` was not called, the worker was terminated, or it
                already holds a graph.
            ValueError: a graph file outside ``artifact_files``; ``device_id`` off DirectML.
            PlacementRefused: xstage refused the stage.
        """
        from xstage.artifact import inspect_artifact
        from xstage.client import Deadlines
        from xstage.stage import open_stage

        if not self._started or self._drained:
            raise WorkerStartError("worker is not running; call start() first")
        if self._stage is not None:
            raise WorkerStartError("this worker already holds a graph; one worker serves one stage")
        if device_id is not None and (self.route.ep != "dml" or device_id < 0):
            raise ValueError("device_id requires a nonnegative DirectML route")
        if artifact_files is not None:
            allowed = {Path(p).resolve() for p in artifact_files}
            art = inspect_artifact(graph_path)
            try:
                reads = [Path(f["path"]).resolve() for f in art.files]
            finally:
                art.release()
            outside = [str(p) for p in reads if p not in allowed]
            if outside:
                raise ValueError(f"the graph reads files the bundle does not hash: {outside}")
        deadlines = Deadlines(spawn=self.start_timeout_s, hello=self.start_timeout_s,
                              call=self.call_timeout_s)
        started = time.perf_counter()
        try:
            stage = open_stage(graph_path, route=self.route.name, min_placement=self.min_fraction_on_target,
                               inputs=example_inputs, threads=intra_op_num_threads, deadlines=deadlines,
                               ep_options={"device_id": str(device_id)} if device_id is not None else None,
                               report=self._table)
        except errors.Refused as exc:
            raise _refused(exc, self.route.name, self.route.ep, str(graph_path)) from None
        self._stage = stage
        record = stage.record()
        self.hello = dict((record.get("worker") or {}).get("hello") or {})
        note = "" if example_inputs else "example inputs synthesized by xstage (seeded)"
        report = _report(record, self.route.ep, str(graph_path), note, io=stage.artifact)
        self.report = _with(report, ep_directory=str(ep_dir or ""), device_id_requested=device_id,
                            warmup_s=_after_session(report, started),
                            profile_path=_write_profile(record, profile_prefix) if profile else "")
        return self.report

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTiming]:
        """One forward; inputs and outputs each within ``max_payload_bytes``.

        Raises:
            WorkerStartError: nothing is loaded.
            PayloadTooLarge: the inputs or the outputs carry more than the limit.
        """
        if self._stage is None:
            raise WorkerStartError("worker is not running; call start() and load() first")
        _payload(inputs, self.max_payload_bytes, "the inputs")
        started = time.perf_counter()
        out = _outputs(self._stage(inputs))
        round_trip = time.perf_counter() - started
        _payload(out, self.max_payload_bytes, "the outputs")
        worker_s = float(self._stage.last_timing.get("worker_ns", 0)) * 1e-9
        self._runs += 1
        self._run_s += worker_s
        return out, RunTiming(worker_s=worker_s, round_trip_s=round_trip)

    def stats(self) -> dict[str, Any]:
        """Counters and the worker's own resident set, for the ledger."""
        timing = self._stage.last_timing if self._stage is not None else {}
        return {"runs": self._runs, "total_run_s": self._run_s, "rss_bytes": int(timing.get("rss") or 0),
                "peak_rss_bytes": int(timing.get("peak") or 0)}

    def terminate(self) -> bool:
        """End the worker; True when its process is gone (idempotent)."""
        if self._drained:
            return True
        stage, self._stage = self._stage, None
        pid = stage.worker_pid if stage is not None else None
        if stage is not None:
            stage.close()
        self._drained = pid is None or not _alive(pid)
        return self._drained

    def close(self, timeout_s: float = 10.0) -> None:
        """Terminate (the worker's own shutdown deadline applies, not ``timeout_s``)."""
        self.terminate()

    def __enter__(self) -> ExternalWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
