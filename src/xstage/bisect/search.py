"""The bisect search: which contiguous ranges of one node order a probe accepts. Pure.

The search knows nodes only by their position ``0..n-1`` in one stable topological order and
asks an oracle, ``probe(start, stop)``, whether the range ``[start, stop)`` is *accepted*
(placed whole on the target and through the gate). It never runs anything itself: the probes
that start workers live in ``xstage.bisect.probe``, and the tests drive this module with a
recorded verdict oracle.

The phases, in order (each numbered rule is cited in the code as "Rule N"):

1. **Whole graph.** One probe of ``[0, n)``. Accepted: that is the one region, one probe.
2. **Split.** A declined range longer than ``min_region`` is split at allowed cuts and each
   piece is probed, breadth first, left to right. Where the whole graph's probe named the
   nodes the target left off (the plan's assignment), the first split falls on the edges of
   those runs; every later split (and every split without that hint) falls at the allowed cut
   nearest the middle. The hint only chooses where to split: every piece is still probed.
3. **Merge.** Adjacent accepted pieces are probed again as one range (a union of accepted
   ranges is never assumed accepted); a declined union keeps its pieces as separate regions.
4. **Grow.** Each region is grown into its declined neighbours one allowed step at a time, to
   the right and then to the left, while the grown range is accepted (a super-range of a
   declined range is never assumed declined). Regions that grew until they touch are merged
   once more (Rule 3).

A probe's answer is one of three facts: *accepted*, *declined* (the partitioner's answer: only
``execution_provider_declined_graph``) or *not judged* (any other refusal of the probe, a
budget or a gate refusal, or an error: it says nothing about what the partitioner takes).
The search treats a range not judged as it treats a declined one (split where it can, never
merged or grown into), never counts it in a contradiction, and lists it
(:attr:`SearchResult.unjudged`), so the caller can say which ranges it could not judge.

Probes are never repeated (a range already probed reuses its verdict), so the same ``n``,
cuts, options and oracle always give the same probes in the same order. ``max_probes`` and
the ``expired`` callable (the ``--deadline``) are hard limits: the search stops before the
probe that would pass one and says which (:attr:`SearchResult.cut_short`).

Every probe is checked against every earlier one for the two assumptions the search refuses
to make; a probe that breaks one is a :class:`Contradiction` in the result (a vision tower's merger
subgraph was accepted alone while the whole tower was declined).

With ``k`` declined nodes scattered in a chain of ``n`` and the plan's hint, the search takes
``1 + (2k + 1) + 2k`` probes at most; without the hint, ``1 + 2k⌈log2 n⌉`` to split plus the
merges and grows. ``probe_bound`` is the figure the live tests hold it to.

.. versionadded:: 0.3
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Contradiction",
    "Outcome",
    "Probe",
    "SearchResult",
    "allowed_cuts_check",
    "probe_bound",
    "search",
]

Phase = Literal["whole", "split", "merge", "grow"]
CutShort = Literal["max_probes", "deadline"]


@dataclass(frozen=True)
class Outcome:
    """What one probe says about one range: the oracle's answer.

    Attributes:
        accepted: placed whole on the target and through the numeric gate.
        verdict: the probe's verdict in one word (``accepted``, ``declined``, ``gate_failed``,
            ``ep_compile_failed``, ``failed``, …); the search reads only ``accepted`` and
            ``judged``.
        reason: the EP's or the gate's own reason, in words, where it gave one.
        off_target: positions (whole-graph numbering) the target left off in this probe, from
            the plan's assignment; None when the probe did not say.
        detail: anything the caller wants kept with the probe (its refusal, its proof).
        judged: False when the probe neither was accepted nor declined by the partitioner (a
            budget or gate refusal, an error): the range is *not judged*.
    """

    accepted: bool
    verdict: str
    reason: str | None = None
    off_target: frozenset[int] | None = None
    detail: object = None
    judged: bool = True

    @property
    def fact(self) -> Literal["accepted", "declined", "not_judged"]:
        """What the probe says about the partitioner: accepted, declined or not judged."""
        if self.accepted:
            return "accepted"
        return "declined" if self.judged else "not_judged"


@dataclass(frozen=True)
class Probe:
    """One probe the search made: the range, why it was probed, and its outcome."""

    index: int
    start: int
    stop: int
    phase: Phase
    outcome: Outcome

    @property
    def accepted(self) -> bool:
        """Whether the probe accepted its range."""
        return self.outcome.accepted

    @property
    def judged(self) -> bool:
        """Whether the probe was accepted or declined (not a refusal of another kind, or an error)."""
        return self.outcome.accepted or self.outcome.judged


@dataclass(frozen=True)
class Contradiction:
    """A probe whose verdict breaks one of the assumptions the search does not make.

    ``kind`` is ``sub_range_declined`` (``probe`` was declined inside the range of the
    accepted ``earlier``) or ``super_range_accepted`` (``probe`` was accepted around the range
    of the declined ``earlier``).
    """

    kind: Literal["sub_range_declined", "super_range_accepted"]
    probe: int
    earlier: int


@dataclass(frozen=True)
class SearchResult:
    """The accepted regions, every probe in order, and how the search ended.

    Attributes:
        n: nodes in the order.
        regions: accepted ranges ``(start, stop)``, sorted, disjoint, each accepted by a probe
            of exactly that range and at least ``min_region`` long.
        probes: every probe, in the order made.
        contradictions: the probes that broke a monotonicity assumption.
        cut_short: None when the search ran to its end; else the limit that stopped it.
        min_region: the smallest region reported.
        max_probes: the probe budget (None: none).
    """

    n: int
    regions: tuple[tuple[int, int], ...]
    probes: tuple[Probe, ...]
    contradictions: tuple[Contradiction, ...]
    cut_short: CutShort | None
    min_region: int
    max_probes: int | None = None

    @property
    def unjudged(self) -> tuple[Probe, ...]:
        """The probes whose range was not judged (a refusal other than declined, an error)."""
        return tuple(p for p in self.probes if not p.judged)


class _Stop(Exception):
    """A hard limit was reached: unwinds the phases (never leaves this module)."""

    def __init__(self, why: CutShort) -> None:
        super().__init__(why)
        self.why = why


def probe_bound(n: int, k: int) -> int:
    """The live tests' probe budget for ``n`` nodes with ``k`` declined: ``1 + 2(k+1)⌈log2 n⌉``."""
    return 1 + 2 * (k + 1) * max(1, math.ceil(math.log2(max(n, 2))))


def allowed_cuts_check(n: int, cuts: Iterable[int]) -> tuple[int, ...]:
    """``cuts`` sorted and checked: within ``[0, n]``, with ``0`` and ``n`` always present.

    Raises:
        ValueError: ``n`` below 1, or a cut outside ``[0, n]``.
    """
    if n < 1:
        raise ValueError(f"a search needs at least one node, got n={n}")
    out = set(cuts) | {0, n}
    bad = sorted(c for c in out if not 0 <= c <= n)
    if bad:
        raise ValueError(f"cuts {bad} are outside [0, {n}]")
    return tuple(sorted(out))


class _Search:
    """The state of one search: the probes made, the budget, the limits."""

    def __init__(self, n: int, cuts: Sequence[int], probe: Callable[[int, int], Outcome], *,
                 min_region: int, max_probes: int | None,
                 expired: Callable[[], bool]) -> None:
        self.n, self.cuts, self.oracle = n, tuple(cuts), probe
        self.min_region, self.max_probes, self.expired = min_region, max_probes, expired
        self.probes: list[Probe] = []
        self.seen: dict[tuple[int, int], Probe] = {}
        self.contradictions: list[Contradiction] = []
        #: The regions known so far: each accepted by a probe of exactly its range, disjoint.
        self.regions: list[tuple[int, int]] = []

    def ask(self, start: int, stop: int, phase: Phase) -> Probe:
        """One probe of ``[start, stop)``, or the earlier one of the same range."""
        if (start, stop) in self.seen:
            return self.seen[start, stop]
        if self.max_probes is not None and len(self.probes) >= self.max_probes:
            raise _Stop("max_probes")
        if self.expired():
            raise _Stop("deadline")
        made = Probe(len(self.probes), start, stop, phase, self.oracle(start, stop))
        for other in self.probes:  # the assumptions the search does not make, checked
            if not (made.judged and other.judged):
                continue  # a range not judged says nothing about the partitioner
            inside = other.start <= start and stop <= other.stop
            around = start <= other.start and other.stop <= stop
            if other.accepted and not made.accepted and inside:
                self.contradictions.append(Contradiction("sub_range_declined", made.index, other.index))
            elif not other.accepted and made.accepted and around:
                self.contradictions.append(Contradiction("super_range_accepted", made.index,
                                                         other.index))
        self.probes.append(made)
        self.seen[start, stop] = made
        return made

    def inner_cuts(self, start: int, stop: int) -> list[int]:
        """The allowed cuts strictly inside ``(start, stop)``."""
        return [c for c in self.cuts if start < c < stop]

    def midpoint(self, start: int, stop: int) -> list[int]:
        """The allowed cut nearest the middle of the range (the left one on a tie), or none."""
        inner = self.inner_cuts(start, stop)
        if not inner:
            return []
        middle = (start + stop) / 2
        return [min(inner, key=lambda c: (abs(c - middle), c))]

    def hinted(self, start: int, stop: int, off: frozenset[int]) -> list[int]:
        """Cuts on the edges of the runs of off-target nodes in the range, snapped to allowed cuts.

        An edge that is not an allowed cut moves to the nearest allowed cut (outward from the
        on-target run, so the off-target node stays in its own piece).
        """
        edges: set[int] = set()
        for i in range(start, stop):
            before = i - 1 >= start and (i - 1 in off)
            if (i in off) != before and i > start:
                edges.add(i)
        inner = self.inner_cuts(start, stop)
        snapped = set()
        for edge in sorted(edges):
            if edge in inner:
                snapped.add(edge)
                continue
            if edge in off:  # an on-target run ends here: move left, keep the off node out
                left = [c for c in inner if c < edge]
                if left:
                    snapped.add(left[-1])
            else:  # an off-target run ends here: move right
                right = [c for c in inner if c > edge]
                if right:
                    snapped.add(right[0])
        return sorted(snapped)

    def pieces(self, start: int, stop: int, cuts: list[int]) -> list[tuple[int, int]]:
        """``[start, stop)`` cut at ``cuts``."""
        points = [start, *cuts, stop]
        return [(a, b) for a, b in zip(points, points[1:], strict=False) if a < b]


def search(n: int, probe: Callable[[int, int], Outcome], *, cuts: Iterable[int] | None = None,
           min_region: int = 1, max_probes: int | None = None,
           expired: Callable[[], bool] | None = None) -> SearchResult:
    """Find the accepted regions of ``n`` nodes in order; see the module docstring.

    Args:
        n: the number of nodes.
        probe: the oracle: ``probe(start, stop)`` → :class:`Outcome` for ``[start, stop)``.
        cuts: the positions a region may start or end at (default: every position). A QDQ
            graph allows only cuts that fall between a Q and its DQ.
        min_region: the smallest region reported; declined ranges are split down to it.
        max_probes: a hard limit on probes (None: none).
        expired: called before each probe; True stops the search (the ``--deadline``).

    Raises:
        ValueError: ``n`` below 1, a cut outside ``[0, n]``, ``min_region`` below 1 or
            ``max_probes`` below 1.
    """
    if min_region < 1:
        raise ValueError(f"min_region must be at least 1, got {min_region}")
    if max_probes is not None and max_probes < 1:
        raise ValueError(f"max_probes must be at least 1, got {max_probes}")
    allowed = allowed_cuts_check(n, range(n + 1) if cuts is None else cuts)
    state = _Search(n, allowed, probe, min_region=min_region, max_probes=max_probes,
                    expired=expired or (lambda: False))
    cut_short: CutShort | None = None
    try:
        whole = state.ask(0, n, "whole")  # Rule 1
        if whole.accepted:
            state.regions = [(0, n)]
        else:
            _split(state, whole.outcome.off_target)
            _merge(state)
            if _grow(state):  # grown regions that now touch are probed as one
                _merge(state)
    except _Stop as stop:
        cut_short = stop.why
    final = tuple(sorted(r for r in state.regions if r[1] - r[0] >= min_region))
    return SearchResult(n=n, regions=final, probes=tuple(state.probes),
                        contradictions=tuple(state.contradictions), cut_short=cut_short,
                        min_region=min_region, max_probes=max_probes)


def _split(state: _Search, off: frozenset[int] | None) -> None:
    """Rule 2: the accepted pieces of the declined whole, split breadth first."""
    first = state.hinted(0, state.n, off) if off else []
    queue = state.pieces(0, state.n, first or state.midpoint(0, state.n))
    while queue:
        level, queue = queue, []
        for start, stop in level:
            made = state.ask(start, stop, "split")
            if made.accepted:
                state.regions = sorted([*state.regions, (start, stop)])
            elif stop - start > state.min_region and (middle := state.midpoint(start, stop)):
                queue += state.pieces(start, stop, middle)


def _merge(state: _Search) -> None:
    """Rule 3: adjacent accepted pieces probed as one range; kept apart when it is declined."""
    runs: list[list[tuple[int, int]]] = []
    for piece in state.regions:
        if runs and runs[-1][-1][1] == piece[0]:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    for run in runs:
        if len(run) > 1 and state.ask(run[0][0], run[-1][1], "merge").accepted:
            kept = [r for r in state.regions if r not in run]
            state.regions = sorted([*kept, (run[0][0], run[-1][1])])


def _grow(state: _Search) -> bool:
    """Rule 4: each region grown one allowed step at a time into its declined neighbours.

    Returns whether any region grew.
    """
    grown = state.regions
    before = list(grown)
    for i in range(len(grown)):
        start, stop = grown[i]
        right_limit = grown[i + 1][0] if i + 1 < len(grown) else state.n
        while True:  # to the right
            nxt = [c for c in state.cuts if stop < c <= right_limit]
            if not nxt or not state.ask(start, nxt[0], "grow").accepted:
                break
            stop = nxt[0]
            grown[i] = (start, stop)
        left_limit = grown[i - 1][1] if i > 0 else 0
        while True:  # to the left
            prev = [c for c in state.cuts if left_limit <= c < start]
            if not prev or not state.ask(prev[-1], stop, "grow").accepted:
                break
            start = prev[-1]
            grown[i] = (start, stop)
    return grown != before
