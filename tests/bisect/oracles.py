"""Verdict oracles for the pure search: rule-based ones, and replays of recorded live runs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from xstage.bisect.search import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bisect"


class Chain:
    """A chain whose ``declined`` nodes the target never takes; every other range is accepted.

    ``context`` lists nodes declined alone but taken inside any longer range (OpenVINO's Celu,
    measured: left on the CPU alone, fused into the EP's subgraph in a chain). ``hint`` says
    whether probes report the nodes left off (the plan's assignment).
    """

    def __init__(self, n: int, declined: Iterable[int], *, context: Iterable[int] = (),
                 hint: bool = True) -> None:
        self.n, self.declined, self.context = n, frozenset(declined), frozenset(context)
        self.hint = hint
        self.asked: list[tuple[int, int]] = []

    def __call__(self, start: int, stop: int) -> Outcome:
        self.asked.append((start, stop))
        off = {d for d in self.declined if start <= d < stop}
        off |= {c for c in self.context if start <= c < stop and stop - start == 1}
        return Outcome(not off, "accepted" if not off else "declined",
                       None if not off else "left on the CPU",
                       frozenset(off) if self.hint else None)

    def expected(self, min_region: int = 1) -> list[tuple[int, int]]:
        """The maximal ranges free of declined nodes, at least ``min_region`` long."""
        out, start = [], 0
        for d in [*sorted(self.declined), self.n]:
            if d - start >= min_region:
                out.append((start, d))
            start = d + 1
        return out


class Replay:
    """The verdicts of a recorded live bisect (its record), in order.

    A probe the recording lacks fails the test: the search must ask exactly what the live run
    asked. The nodes each probe left off are mapped back to positions through the record's
    order.
    """

    def __init__(self, name: str) -> None:
        doc = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
        self.doc = doc
        self.n, self.cuts = doc["order"]["nodes"], doc["order"]["cuts"]
        self.position = {name: i for i, name in enumerate(doc["order"]["names"])}
        self.verdicts = {(p["start"], p["stop"]): p for p in doc["probes"]}
        self.asked: list[tuple[int, int]] = []

    def __call__(self, start: int, stop: int) -> Outcome:
        self.asked.append((start, stop))
        if (start, stop) not in self.verdicts:
            raise AssertionError(f"the search asked [{start}, {stop}), which the live run never probed")
        p = self.verdicts[start, stop]
        names = [n for names in p["off_target"].values() for n in names]
        off = frozenset(self.position[n] for n in names) if p["node_fraction"] is not None else None
        return Outcome(p["accepted"], p["verdict"], p["reason"], off,
                       judged=p.get("fact", "declined") != "not_judged")
