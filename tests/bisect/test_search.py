"""The pure search over verdict oracles: regions found exactly, bounds, limits, contradictions."""

from __future__ import annotations

import random

import pytest
from oracles import Chain, Replay

from xstage.bisect.search import Outcome, probe_bound, search


def _seeded(seed: int) -> tuple[int, list[int]]:
    rng = random.Random(seed)
    n = rng.randint(1, 64)
    k = rng.randint(0, min(5, n))
    return n, sorted(rng.sample(range(n), k))


@pytest.mark.parametrize("hint", [True, False], ids=["plan-hint", "no-hint"])
@pytest.mark.parametrize("seed", range(40))
def test_seeded_chains_are_found_exactly_within_the_bound(seed: int, hint: bool) -> None:
    n, declined = _seeded(seed)
    oracle = Chain(n, declined, hint=hint)
    bound = probe_bound(n, len(declined))
    found = search(n, oracle, max_probes=bound)
    assert list(found.regions) == oracle.expected(), (n, declined)
    assert found.cut_short is None
    assert len(found.probes) <= bound
    assert not found.contradictions


def test_a_graph_taken_whole_takes_one_probe() -> None:
    oracle = Chain(30, [])
    found = search(30, oracle)
    assert found.regions == ((0, 30),)
    assert oracle.asked == [(0, 30)]


def test_a_graph_declined_everywhere_has_no_region() -> None:
    oracle = Chain(5, range(5))
    found = search(5, oracle)
    assert found.regions == ()
    assert found.cut_short is None
    assert all(not p.accepted for p in found.probes)


def test_the_same_oracle_gives_the_same_probes_in_the_same_order() -> None:
    runs = [search(40, Chain(40, [3, 17, 18, 31])) for _ in range(3)]
    assert len({tuple((p.start, p.stop, p.phase) for p in r.probes) for r in runs}) == 1


def test_a_range_is_never_probed_twice() -> None:
    oracle = Chain(33, [0, 16, 32], hint=False)
    search(33, oracle)
    assert len(oracle.asked) == len(set(oracle.asked))


def test_max_probes_is_a_hard_limit_and_said() -> None:
    oracle = Chain(64, [5, 40], hint=False)
    found = search(64, oracle, max_probes=4)
    assert len(found.probes) == 4 == len(oracle.asked)
    assert found.cut_short == "max_probes"
    accepted = {(p.start, p.stop) for p in found.probes if p.accepted}
    assert set(found.regions) <= accepted  # only what a probe accepted is reported


def test_the_deadline_stops_before_the_next_probe() -> None:
    oracle = Chain(64, [5, 40])
    calls = iter(range(1000))
    found = search(64, oracle, expired=lambda: next(calls) >= 3)
    assert len(found.probes) == 3
    assert found.cut_short == "deadline"


def test_min_region_drops_shorter_regions_and_stops_the_split() -> None:
    oracle = Chain(20, [2, 10, 12])
    found = search(20, oracle, min_region=3)
    assert list(found.regions) == oracle.expected(min_region=3) == [(3, 10), (13, 20)]
    assert all(p.stop - p.start >= 1 for p in found.probes)


def test_regions_start_and_stop_only_at_allowed_cuts() -> None:
    cuts = [0, 4, 8, 12, 16]
    oracle = Chain(16, [6])
    found = search(16, oracle, cuts=cuts)
    assert all(p.start in cuts and p.stop in cuts for p in found.probes)
    assert list(found.regions) == [(0, 4), (8, 16)]


def test_a_node_declined_alone_but_taken_in_context_is_grown_into_and_reported() -> None:
    """OpenVINO's Celu: declined alone, taken in a chain; the search does not assume."""
    oracle = Chain(12, [8], context=[3])
    found = search(12, oracle)
    assert list(found.regions) == [(0, 8), (9, 12)]
    kinds = {c.kind for c in found.contradictions}
    assert kinds <= {"super_range_accepted", "sub_range_declined"}


def test_a_node_the_whole_left_off_and_taken_with_its_neighbour_is_a_contradiction() -> None:
    """Declined alone (and left off in the whole graph), accepted with its neighbour: grown into.

    Measured on OpenVINO: a Celu is left on the CPU alone and taken inside a chain; the node
    before a Hardmax is left on the CPU in the chain and taken alone.
    """
    def oracle(start: int, stop: int) -> Outcome:
        ok = not start <= 4 < stop and (start, stop) != (2, 3)
        return Outcome(ok, "accepted" if ok else "declined", off_target=frozenset({2, 4}))

    found = search(6, oracle)
    assert found.regions == ((0, 4), (5, 6))
    grown = next(p for p in found.probes if (p.start, p.stop) == (0, 3))
    declined_alone = next(p for p in found.probes if (p.start, p.stop) == (2, 3))
    assert grown.phase == "grow" and grown.accepted and not declined_alone.accepted
    assert any(c.kind == "super_range_accepted" and c.probe == grown.index
               and c.earlier == declined_alone.index for c in found.contradictions)
    assert found.probes[-1].phase == "merge" and (found.probes[-1].start, found.probes[-1].stop) == (0, 4)


def test_a_declined_union_of_accepted_pieces_keeps_the_pieces() -> None:
    def oracle(start: int, stop: int) -> Outcome:
        ok = (start, stop) in {(0, 4), (4, 8)}
        return Outcome(ok, "accepted" if ok else "declined")

    found = search(8, oracle)
    assert found.regions == ((0, 4), (4, 8))
    assert [p.phase for p in found.probes] == ["whole", "split", "split"]


@pytest.mark.parametrize("bad", [{"min_region": 0}, {"max_probes": 0}, {"cuts": [0, 9]}])
def test_rejects_bad_arguments(bad: dict) -> None:
    with pytest.raises(ValueError):
        search(8, Chain(8, []), **bad)


@pytest.mark.parametrize("name", ["chain-hardmax", "chain-hardmax-edges"])
def test_a_recorded_live_run_replays_probe_for_probe(name: str) -> None:
    """The live run's verdicts, replayed: the same probes, in the same order, the same regions."""
    oracle = Replay(name)
    found = search(oracle.n, oracle, cuts=oracle.cuts, max_probes=oracle.doc["budget"]["max_probes"])
    assert [(p.start, p.stop) for p in found.probes] == [
        (p["start"], p["stop"]) for p in oracle.doc["probes"]]
    assert [[r["start"], r["stop"]] for r in oracle.doc["regions"]] == [list(r) for r in found.regions]


def test_a_limit_reached_while_growing_keeps_the_regions_already_proven() -> None:
    oracle = Chain(12, [3, 8])
    full = search(12, oracle)
    grows = [p for p in full.probes if p.phase == "grow"]
    assert grows
    cut = search(12, Chain(12, [3, 8]), max_probes=len(full.probes) - len(grows) + 1)
    assert cut.cut_short == "max_probes"
    assert cut.regions == full.regions == ((0, 3), (4, 8), (9, 12))


def test_a_range_refused_by_the_budget_is_not_judged_and_never_a_contradiction() -> None:
    """A probe refused for another reason than the partitioner's (the ledger's
    ``peak_over_budget`` here) says nothing about what the target takes: its range is *not
    judged*, split like a declined one, listed, and never counted in a contradiction."""
    def oracle(start: int, stop: int) -> Outcome:
        if start <= 5 < stop:  # node 5 allocates past the budget in any range that holds it
            return Outcome(False, "budget_peak_over_budget", "over budget", judged=False)
        if start <= 2 < stop:
            return Outcome(False, "declined", "left on the CPU", frozenset({2}))
        return Outcome(True, "accepted")

    found = search(8, oracle)
    assert found.regions == ((0, 2), (3, 5), (6, 8))
    assert [p.outcome.fact for p in found.probes][0] == "not_judged"
    assert found.unjudged and all(p.start <= 5 < p.stop for p in found.unjudged)
    assert {p.outcome.fact for p in found.probes if p.start <= 2 < p.stop and not p.start <= 5 < p.stop} \
        == {"declined"}
    assert not found.contradictions
