"""The placement proof every route's evidence ends in: a frozen verdict with what it rests on. Pure.

``xstage.evidence.onnx`` builds it from onnxruntime's profile and plan, ``xstage.evidence.torch``
from the torch profiler's op log; the stage layer reads :attr:`PlacementProof.passed` and
records :meth:`PlacementProof.to_dict` (docs/design.md §5, §7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = ["BASES", "CAUSES", "VERDICTS", "Basis", "Cause", "PlacementProof", "Verdict"]

#: The closed verdict set (docs/design.md §5).
VERDICTS = ("placed", "declined", "unmeasured")
#: The causes a proof can carry (docs/design.md §7, ``execution_provider_declined_graph``).
CAUSES = ("declined", "unmeasured", "provider_swapped", "evidence_conflict", "outputs_off_device")
#: Which layer decided (docs/design.md §5's conflict table: ``execution (plan incomplete)`` is its case (a);
#: ``execution`` alone is what records before 0.2 say).
BASES = ("plan", "execution", "execution (plan incomplete)")

Verdict = Literal["placed", "declined", "unmeasured"]
Cause = Literal["declined", "unmeasured", "provider_swapped", "evidence_conflict", "outputs_off_device"]
Basis = Literal["plan", "execution", "execution (plan incomplete)"]


@dataclass(frozen=True)
class PlacementProof:
    """The verdict on where a stage ran, with the evidence it rests on.

    Times are microseconds, as onnxruntime's profiler writes them. Execution fields are None
    when no usable profile was read, plan fields when there was no plan.

    Attributes:
        target_ep: the EP the stage was meant to run on (the name in the evidence).
        requested_ep: the EP the session was asked for (usually ``target_ep``).
        session_providers: ``session.get_providers()``, or None when not collected.
        available_providers: ``onnxruntime.get_available_providers()``, or None.
        ort_version: the worker's onnxruntime version, when given.
        verdict: ``placed``, ``declined`` (measured, below ``min_placement``) or
            ``unmeasured`` (no usable evidence; never passes).
        cause: None when placed; else ``declined``, ``unmeasured``, ``provider_swapped`` or
            ``evidence_conflict`` (the plan names the target, the execution is unusable).
        basis: ``plan`` or ``execution (plan incomplete)``: which layer decided; None when
            nothing was measured (``execution`` in records before 0.2).
        fraction: the fraction that decided: the lower of :attr:`node_fraction` and
            :attr:`time_fraction` (:attr:`decided_by` says which).
        min_placement: the threshold: placed iff both fractions are ``> 0`` and reach it.
        swapped: the requested EP was replaced (``xstage.evidence.onnx``, rule 4).
        fallback_banner: the Python layer's "Falling back to [...]" banner was seen.
        node_fraction: 1 − original nodes put on other providers / the original nodes that ran,
            by :attr:`node_basis`: the nodes the plan lists (or the name-checked kernels' nodes),
            each member of a fused or compiled partition once; copies and nodes onnxruntime
            inserted excluded, a node it removed counted nowhere.
        nodes_on_target: plan: nodes assigned to the target.
        nodes_total: plan: nodes assigned to any EP (copies excluded).
        plan_copies: plan: ``Memcpy*`` nodes.
        graph_node_count: nodes of the ONNX graph and its subgraphs, when given.
        time_fraction: execution: kernel time on the target / all kernel time (copies count as
            not on the target), summed over :attr:`timed_runs`; the median of
            :attr:`run_time_fractions` where it is lower (a delay in one run kept out).
        kernel_fraction: execution: compute kernels on the target / all compute kernels.
        event_fraction: execution: the event count, recorded beside the verdict's (never
            deciding it): every kernel event of the first profiled run on the target / all of
            them, copies and control flow included (docs/external.md, "Two placement metrics").
        kernels_on_target: execution: compute kernel events on the target (a fused subgraph is one).
        kernels_total: execution: compute kernel events (copies and control flow excluded).
        kernel_time_on_target_us: execution: their time on the target.
        kernel_time_total_us: execution: all compute kernel time (control flow's own time included).
        kernels_by_provider: execution: compute kernel events per provider.
        kernel_time_by_provider_us: execution: compute kernel time per provider, each
            control-flow kernel's own time with the provider that ran it.
        control_flow_kernels: execution: ``If``/``Loop``/``Scan`` events, not counted above.
        control_flow_time_us: execution: their events' time (it contains their children's).
        control_flow_own_time_us: execution: their own time (their events less their children's),
            counted in the time fraction for the provider that ran each.
        copies: execution: ``Memcpy*`` kernel events.
        copy_time_us: execution: their time.
        runs: execution: ``model_run`` events in the profile (the profiled warm-up: 4).
        profile_format: how the profile was read: ``json``, ``lines``, or None.
        cpu_nodes: nodes left on the CPU EP, by op type (names; ``<op_type>#<i>`` for unnamed
            nodes), from the basis; empty when the target is the CPU EP.
        off_target_nodes: every node not on the target, by EP, then op type.
        notes: what was used and why, for people.
        decided_by: ``node fraction`` or ``time fraction``: the lower one, which decided.
        node_basis: ``plan``, or ``execution`` (the name-checked kernels, when the plan is
            incomplete): what :attr:`node_fraction` counts.
        original_nodes_total: the node fraction's whole: the original nodes that ran (see
            :attr:`node_fraction`); None when only bounds of it are known.
        original_nodes_off_target: those the node basis put on other providers.
        timed_runs: the profiled runs the time fraction sums (2–4; 1 for a one-run profile).
        run_time_fractions: execution: each timed run's own time fraction (None for a run
            whose kernels took 0 us).
        conflicts: where the layers disagreed (docs/design.md §5's case (b); the lower fraction decided).
        names_checked: whether every kernel event's name passed the name check; None when no
            names were given to check against.
        name_failures: the names that failed it (at most 10), with why.
        renamed: whether the worker ran a renamed copy of the graph.
        ep_report: the EP's own operator report as judged (``evidence.ep_report``: usable, its
            fraction, nodes per device, the nodes it left off the target), where the route
            asks for one; None otherwise.
    """

    target_ep: str
    requested_ep: str
    session_providers: tuple[str, ...] | None
    available_providers: tuple[str, ...] | None
    ort_version: str | None
    verdict: Verdict
    cause: Cause | None
    basis: Basis | None
    fraction: float | None
    min_placement: float
    swapped: bool
    fallback_banner: bool
    node_fraction: float | None = None
    nodes_on_target: int | None = None
    nodes_total: int | None = None
    plan_copies: int | None = None
    graph_node_count: int | None = None
    time_fraction: float | None = None
    kernel_fraction: float | None = None
    event_fraction: float | None = None
    kernels_on_target: int | None = None
    kernels_total: int | None = None
    kernel_time_on_target_us: int | None = None
    kernel_time_total_us: int | None = None
    kernels_by_provider: Mapping[str, int] = field(default_factory=dict)
    kernel_time_by_provider_us: Mapping[str, int] = field(default_factory=dict)
    control_flow_kernels: int | None = None
    control_flow_time_us: int | None = None
    control_flow_own_time_us: int | None = None
    copies: int | None = None
    copy_time_us: int | None = None
    runs: int | None = None
    profile_format: Literal["json", "lines"] | None = None
    cpu_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    off_target_nodes: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    decided_by: str | None = None
    node_basis: str | None = None
    original_nodes_total: int | None = None
    original_nodes_off_target: int | None = None
    timed_runs: tuple[int, ...] | None = None
    run_time_fractions: tuple[float | None, ...] | None = None
    conflicts: tuple[str, ...] = ()
    names_checked: bool | None = None
    name_failures: tuple[str, ...] = ()
    renamed: bool | None = None
    ep_report: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        """Keep the closed sets closed: a proof outside them is a bug, not a verdict."""
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {self.verdict!r}")
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"cause must be None or one of {CAUSES}, not {self.cause!r}")
        if (self.verdict == "placed") != (self.cause is None):
            raise ValueError(f"a {self.verdict} proof cannot have cause {self.cause!r}")
        if self.basis is not None and self.basis not in BASES:
            raise ValueError(f"basis must be None or one of {BASES}, not {self.basis!r}")

    @property
    def passed(self) -> bool:
        """Whether the gate admits the stage: ``verdict == "placed"``."""
        return self.verdict == "placed"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (dicts, lists, str, int, float, bool, None), fields in order;
        ``ep_report`` only where the route asked for one (records stay as they were)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if not (f.name == "ep_report" and self.ep_report is None)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value
