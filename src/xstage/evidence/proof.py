"""The placement proof every route's evidence ends in: a frozen verdict with what it rests on. Pure.

``xstage.evidence.onnx`` builds it from onnxruntime's profile and plan, ``xstage.evidence.torch``
from the torch profiler's op log; the stage layer reads :attr:`PlacementProof.passed` and
records :meth:`PlacementProof.to_dict` (DESIGN §4–§5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = ["BASES", "CAUSES", "VERDICTS", "Basis", "Cause", "PlacementProof", "Verdict"]

#: The closed verdict set (DESIGN §4).
VERDICTS = ("placed", "declined", "unmeasured")
#: The causes a proof can carry (DESIGN §5, ``execution_provider_declined_graph``).
CAUSES = ("declined", "unmeasured", "provider_swapped", "outputs_off_device")
#: What the gate's fraction was computed from.
BASES = ("plan", "execution")

Verdict = Literal["placed", "declined", "unmeasured"]
Cause = Literal["declined", "unmeasured", "provider_swapped", "outputs_off_device"]
Basis = Literal["plan", "execution"]


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
        cause: None when placed; else ``declined``, ``unmeasured`` or ``provider_swapped``.
        basis: ``plan`` or ``execution``: what :attr:`fraction` was computed from; None when
            nothing was measured.
        fraction: the fraction the gate used (node fraction on ``plan``; time fraction, or
            kernel fraction when all kernels took 0 µs, on ``execution``).
        min_placement: the threshold: placed iff ``fraction > 0`` and ``fraction >= min_placement``.
        swapped: the requested EP was replaced (``xstage.evidence.onnx``, rule 4).
        fallback_banner: the Python layer's "Falling back to [...]" banner was seen.
        node_fraction: plan: nodes on the target / all nodes (copies excluded).
        nodes_on_target: plan: nodes assigned to the target.
        nodes_total: plan: nodes assigned to any EP (copies excluded).
        plan_copies: plan: ``Memcpy*`` nodes.
        graph_node_count: nodes of the ONNX graph and its subgraphs, when given.
        time_fraction: execution: compute kernel time on the target / all compute kernel time.
        kernel_fraction: execution: compute kernels on the target / all compute kernels.
        kernels_on_target: execution: compute kernel events on the target (a fused subgraph is one).
        kernels_total: execution: compute kernel events (copies and control flow excluded).
        kernel_time_on_target_us: execution: their time on the target.
        kernel_time_total_us: execution: all compute kernel time.
        kernels_by_provider: execution: compute kernel events per provider.
        kernel_time_by_provider_us: execution: compute kernel time per provider.
        control_flow_kernels: execution: ``If``/``Loop``/``Scan`` events, not counted above.
        control_flow_time_us: execution: their time, excluded (it contains their children's).
        copies: execution: ``Memcpy*`` kernel events.
        copy_time_us: execution: their time.
        runs: execution: ``model_run`` events in the profile (one profiled warm-up: 1).
        profile_format: how the profile was read: ``json``, ``lines``, or None.
        cpu_nodes: nodes left on the CPU EP, by op type (names; ``<op_type>#<i>`` for unnamed
            nodes), from the basis; empty when the target is the CPU EP.
        off_target_nodes: every node not on the target, by EP, then op type.
        notes: what was used and why, for people.
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
    kernels_on_target: int | None = None
    kernels_total: int | None = None
    kernel_time_on_target_us: int | None = None
    kernel_time_total_us: int | None = None
    kernels_by_provider: Mapping[str, int] = field(default_factory=dict)
    kernel_time_by_provider_us: Mapping[str, int] = field(default_factory=dict)
    control_flow_kernels: int | None = None
    control_flow_time_us: int | None = None
    copies: int | None = None
    copy_time_us: int | None = None
    runs: int | None = None
    profile_format: Literal["json", "lines"] | None = None
    cpu_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    off_target_nodes: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

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
        """Plain JSON types (dicts, lists, str, int, float, bool, None), fields in order."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value
