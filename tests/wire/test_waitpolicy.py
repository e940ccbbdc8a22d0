"""The doorbell's wait policy (``xstage_remote/waitpolicy.py``): each rule, then recorded traces.

The rules are checked one by one on made-up inputs (the policy is a pure function of them);
the traces in ``tests/fixtures/waits`` were recorded from real runs by
``scripts/record_wait_traces.py`` (quiet, beside one busy-looping process per CPU, the same with
rule 6 on, a caller that calls every 3 ms, a call of about a millisecond) and replay to the
decisions the run made.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from xstage_remote import waitpolicy
from xstage_remote.waitpolicy import Load, WaitPolicy

TRACES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "waits").glob("*.json"))
SPIN = 0.002
QUIET = Load(2, 16)
CROWDED = Load(20, 16)


def policy(**kw: object) -> WaitPolicy:
    """A policy that backs off at the first unpaid spin unless told otherwise (rule 4's
    ``failures`` has its own tests)."""
    args = {"spin_seconds": SPIN, "allowed_cpus": 16, "failures": 1, "load_margin": 0}
    args.update(kw)
    return WaitPolicy(**args)  # type: ignore[arg-type]


def answered(p: WaitPolicy, longest: float = 1e-6, latency: float = 2e-5) -> None:
    p.observe(latency, longest, "answered", latency)


def preempted(p: WaitPolicy) -> None:
    p.observe(0.001, 0.001, "preempted", 0.001)  # a slice lost, shorter than the budget


# --------------------------------------------------------------------------- the rules
def test_spins_on_a_quiet_machine() -> None:
    assert policy().decide(QUIET) == (SPIN, "spin")


def test_rule_1_off_where_spinning_is_off_or_the_budget_is_zero() -> None:
    assert policy(spinning=False).decide(QUIET) == (0.0, "off")
    assert policy(spin_seconds=0).decide(QUIET) == (0.0, "off")


def test_rule_2_one_allowed_cpu_never_spins() -> None:
    assert policy(allowed_cpus=1).decide(QUIET) == (0.0, "one_cpu")


def test_rule_3_a_long_expected_call_blocks() -> None:
    p = policy(long_call=0.0002)
    assert p.decide(QUIET, expected=0.001) == (0.0, "long_call")
    assert p.decide(QUIET, expected=0.0001).rule == "spin"
    assert p.decide(QUIET, expected=None).rule == "spin"


def test_rule_3_near_end_a_long_call_with_a_cpu_free_sleeps_then_spins_near_its_end() -> None:
    p = policy(long_call=0.0002, near_end=0.0001)
    d = p.decide(QUIET, expected=0.0013)
    assert d.rule == "near_end" and d.spin == pytest.approx(0.0003)  # three leads at most
    assert p.wake(0.0013) == pytest.approx(0.0012)  # sleeps until 100 µs before the answer
    assert p.decide(Load(16, 16), expected=0.0013).rule == "near_end"  # waiter + peer: room
    assert p.decide(Load(17, 16), expected=0.0013) == (0.0, "long_call")  # a task waits for a CPU
    assert p.decide(None, expected=0.0013) == (0.0, "long_call")  # load unknown
    assert p.decide(QUIET, expected=0.0001).rule == "spin"  # a short call spins as before
    assert policy(long_call=0.0002).decide(QUIET, expected=0.0013).rule == "long_call"  # off


def test_rule_3_near_end_spins_that_do_not_pay_back_off_then_probe_again() -> None:
    p = policy(long_call=0.0002, near_end=0.0001, min_backoff=4)
    assert p.decide(QUIET, expected=0.0013).rule == "near_end"
    p.observe(0.0003, 1e-6, "expired", 0.002)  # the call ran long: the spin found nothing
    rules = [p.decide(QUIET, expected=0.0013).rule for _ in range(5)]
    assert rules == ["long_call"] * 4 + ["near_end"]  # the backoff's waits, then a probe
    answered(p, latency=0.0013)  # the probe paid: the backoff halves away
    assert p.decide(QUIET, expected=0.0013).rule == "near_end"


def test_rule_4_one_unpaid_spin_alone_is_no_pattern_two_are() -> None:
    """Neighbours that run in bursts preempt a spin now and then; neighbours that never sleep
    preempt every one."""
    p = policy(failures=2, min_backoff=4)
    preempted(p)
    assert p.decide(QUIET).rule == "spin"
    preempted(p)
    assert [p.decide(QUIET).rule for _ in range(5)] == ["backoff"] * 4 + ["spin"]


def test_rule_4_unpaid_spins_far_apart_never_back_off() -> None:
    p = policy(failures=2, window=8)
    for _ in range(5):
        preempted(p)
        for _ in range(8):
            assert p.decide(QUIET).rule == "spin"
            answered(p)


def test_rule_4_a_preempted_spin_blocks_the_next_waits_then_probes() -> None:
    p = policy(min_backoff=4)
    preempted(p)
    assert [p.decide(QUIET).rule for _ in range(4)] == ["backoff"] * 4
    assert p.decide(QUIET).rule == "spin"  # the probe


def test_rule_4_a_long_yield_backs_off_even_when_the_spin_was_answered() -> None:
    """Answered after another task held the CPU for a slice: the spin cost that slice."""
    p = policy(min_backoff=2, preempted=0.0002)
    answered(p, longest=0.001)
    assert [p.decide(QUIET).rule for _ in range(3)] == ["backoff", "backoff", "spin"]


def test_rule_4_each_preempted_probe_doubles_the_backoff_up_to_its_bound() -> None:
    p = policy(min_backoff=2, max_backoff=8)
    lengths = []
    for _ in range(5):
        preempted(p)
        n = 0
        while p.decide(None).rule == "backoff":
            n += 1
        lengths.append(n)
    assert lengths == [2, 4, 8, 8, 8]


def test_rule_4_a_spin_unanswered_for_its_whole_budget_backs_off() -> None:
    """Beside busy neighbours a worker's spin can expire without a long yield: its caller is
    the one kept off the CPU. That spin paid nothing, and the next ones would not either."""
    p = policy(min_backoff=2)
    p.observe(SPIN, 1e-6, "expired", SPIN)
    assert [p.decide(None).rule for _ in range(3)] == ["backoff", "backoff", "spin"]
    p.observe(SPIN, 1e-6, "expired", SPIN)
    assert [p.decide(None).rule for _ in range(5)] == ["backoff"] * 4 + ["spin"]


def test_a_shared_cpu_is_no_reason_to_back_off() -> None:
    """The caller moved off the worker's CPU (shm.py's "Shared CPU"); the next spin may pay."""
    p = policy()
    p.observe(1e-5, 1e-6, "shared", 3e-5)
    assert p.decide(QUIET).rule == "spin"


def test_rule_4_each_answered_spin_halves_the_backoff() -> None:
    p = policy(min_backoff=2, max_backoff=64)
    for _ in range(4):
        preempted(p)
        while p.decide(QUIET).rule == "backoff":
            pass
    assert p.summary()["backoff"] == 16
    answered(p)
    assert p.summary()["backoff"] == 8
    assert p.decide(QUIET).rule == "spin"  # a free machine: spinning resumes at once
    answered(p)
    answered(p)
    answered(p)
    assert p.summary()["backoff"] == 0
    preempted(p)
    assert sum(p.decide(QUIET).rule == "backoff" for _ in range(10)) == 2  # from the start again


def test_rule_4_and_5_a_lucky_probe_beside_busy_neighbours_keeps_the_spins_rare() -> None:
    p = policy(min_backoff=8, max_backoff=256)
    for _ in range(6):
        preempted(p)
        while p.decide(CROWDED).rule != "spin":
            pass
    answered(p)  # the probe happened to be answered
    rules = [p.decide(CROWDED).rule for _ in range(200)]
    assert "spin" not in rules


def test_rule_4_a_free_cpu_ends_a_long_backoff_early() -> None:
    p = policy(min_backoff=4, max_backoff=256)
    for _ in range(6):
        preempted(p)
        while p.decide(CROWDED).rule != "spin":
            pass
    preempted(p)  # backoff 256
    assert [p.decide(CROWDED).rule for _ in range(10)] == ["backoff"] * 10
    assert p.decide(QUIET).rule == "spin"  # the neighbours stopped: probe now


def test_rule_4_a_free_cpu_does_not_cut_the_shortest_backoff() -> None:
    p = policy(min_backoff=4)
    preempted(p)
    assert [p.decide(QUIET).rule for _ in range(5)] == ["backoff"] * 4 + ["spin"]


def test_rule_5_a_crowded_machine_holds_the_probe_back_as_long_again_at_most() -> None:
    p = policy(min_backoff=4, max_backoff=16)
    preempted(p)
    rules = [p.decide(CROWDED).rule for _ in range(8)]
    assert rules == ["backoff"] * 4 + ["oversubscribed"] * 4
    assert p.decide(CROWDED).rule == "spin"  # the probe, crowded or not
    preempted(p)
    rules = [p.decide(CROWDED).rule for _ in range(16)]
    assert rules == ["backoff"] * 8 + ["oversubscribed"] * 8
    assert p.decide(CROWDED).rule == "spin"


def test_rule_5_a_crowded_machine_holds_no_probe_of_a_held_spin_back() -> None:
    """A spin that yields only once every ``hold`` seconds is not handed to a neighbour
    before a small call's answer: after its backoff the probe goes, crowded or not."""
    p = policy(min_backoff=4, max_backoff=16, hold=0.00005)
    preempted(p)
    rules = [p.decide(CROWDED).rule for _ in range(5)]
    assert rules == ["backoff"] * 4 + ["held"]  # the probe, cut to the hold window (rule 8)
    assert p.rules["oversubscribed"] == 0


def test_rule_4_a_held_spin_that_expires_at_its_window_starts_no_backoff() -> None:
    """A held spin costs at most its window, about a blocked wake-up beside busy neighbours;
    a preempted one, or a full spin that expires, still backs off."""
    p = policy(hold=0.00005, failures=2)
    for _ in range(8):
        assert p.decide(CROWDED).rule == "held"
        p.observe(0.00005, 1e-6, "expired", 0.00009)
    assert p.decide(CROWDED).rule == "held"
    p.observe(0.00004, 0.001, "preempted", 0.001)
    p.observe(0.00004, 0.001, "preempted", 0.001)
    assert p.decide(CROWDED).rule == "backoff"
    full = policy(hold=0.00005, failures=2)
    full.observe(SPIN, 1e-6, "expired", 0.003)
    full.observe(SPIN, 1e-6, "expired", 0.003)
    assert full.decide(QUIET).rule == "backoff"


def test_rule_8_a_crowded_sample_cuts_a_held_spin_to_its_hold_window() -> None:
    """Past the hold window a spin yields, and on a crowded machine a yield hands the CPU to a
    neighbour for a slice: there the spin stops at the window (then blocks)."""
    p = policy(hold=0.00005)
    assert p.decide(CROWDED) == (0.00005, "held")
    assert p.decide(QUIET) == (SPIN, "spin")
    assert policy().decide(CROWDED) == (SPIN, "spin")  # spins that yield on every check
    p.decide(CROWDED)
    assert waitpolicy.describe(p.summary()).startswith("spin 3 (none), block 0 (none), held 2")


def test_rule_5_the_probe_goes_as_soon_as_a_cpu_is_free() -> None:
    p = policy(min_backoff=2)
    preempted(p)
    assert [p.decide(CROWDED).rule for _ in range(4)] == ["backoff", "backoff"] + ["oversubscribed"] * 2
    assert p.decide(QUIET).rule == "spin"


def test_rule_5_the_peers_spinning_runtime_thread_is_no_crowd() -> None:
    """One runnable task beyond the CPUs (onnxruntime's pool thread spinning after a run) is
    room by default; two are a crowd."""
    p = WaitPolicy(SPIN, 2, failures=1, min_backoff=2)
    p.observe(0.001, 0.001, "preempted", 0.001)
    assert [p.decide(Load(3, 2)).rule for _ in range(3)] == ["backoff", "backoff", "spin"]
    p.observe(0.001, 0.001, "preempted", 0.001)
    assert [p.decide(Load(4, 2)).rule for _ in range(8)] == ["backoff"] * 4 + ["oversubscribed"] * 4


def test_rule_5_load_alone_never_stops_a_spin_that_pays() -> None:
    """Neighbours that run in bursts leave the spinner its CPU: spinning still pays there."""
    p = policy()
    for _ in range(100):
        assert p.decide(CROWDED).rule == "spin"
        answered(p)


def test_rule_6_a_crowded_machine_blocks_without_a_backoff_where_asked() -> None:
    """``crowd_blocks``: a sample with more runnable tasks than CPUs (and the margin) blocks
    even while spins pay; a sample with room spins again at once."""
    p = policy(crowd_blocks=True)
    for _ in range(20):
        assert p.decide(CROWDED) == (0.0, "crowded")
        p.observe(0.0, 0.0, "blocked", 2e-5)
    assert p.decide(QUIET).rule == "spin"
    answered(p)
    assert p.decide(Load(17, 16)).rule == "crowded"  # this policy's margin is 0
    margin = policy(crowd_blocks=True, load_margin=1)
    assert margin.decide(Load(17, 16)).rule == "spin"  # the peer's runtime thread: room
    assert margin.decide(Load(18, 16)).rule == "crowded"
    assert policy(crowd_blocks=True).decide(None).rule == "spin"  # no sample: no crowd


def test_rule_6_leaves_a_backoff_to_rules_4_and_5() -> None:
    """While backing off, a crowded sample is rule 5's (the probe held back, then let go),
    so the machine emptying is still noticed by a probe."""
    p = policy(crowd_blocks=True, min_backoff=4, max_backoff=16)
    preempted(p)
    rules = [p.decide(CROWDED).rule for _ in range(8)]
    assert rules == ["backoff"] * 4 + ["oversubscribed"] * 4
    assert p.decide(CROWDED).rule == "spin"  # the probe


def test_rule_6_is_off_by_default() -> None:
    assert policy().decide(CROWDED).rule == "spin"


def test_rule_7_answers_slower_than_the_budget_block_until_they_are_quick_again() -> None:
    p = policy(window=8)
    for _ in range(5):
        p.observe(0.0, 0.0, "blocked", 0.005)  # the caller calls every 5 ms
    assert p.decide(QUIET).rule == "slow_answers"
    for _ in range(3):  # blocked waits keep reporting their answers' times
        p.observe(0.0, 0.0, "blocked", 0.00003)
    assert p.decide(QUIET).rule == "slow_answers"  # 5 of 8 still slow
    p.observe(0.0, 0.0, "blocked", 0.00003)
    p.observe(0.0, 0.0, "blocked", 0.00003)
    assert p.decide(QUIET).rule == "spin"  # 3 of the last 8 slow


def test_rule_7_one_slow_answer_does_not_stop_spinning() -> None:
    p = policy(window=8)
    for _ in range(7):
        answered(p)
    p.observe(0.0, 0.0, "blocked", 0.5)
    assert p.decide(QUIET).rule == "spin"


def test_an_answer_found_before_waiting_counts_as_quick() -> None:
    p = policy(window=4)
    for _ in range(4):
        p.observe(0.0, 0.0, "blocked", 0.01)
    assert p.decide(QUIET).rule == "slow_answers"
    for _ in range(3):
        p.observe(0.0, 0.0, "ready", 0.0)
    assert p.decide(QUIET).rule == "spin"


def test_the_summary_counts_rules_and_outcomes_and_says_them_in_words() -> None:
    p = policy(min_backoff=2)
    p.decide(QUIET)
    preempted(p)
    p.decide(QUIET)
    p.observe(0.0, 0.0, "blocked", 1e-5)
    p.observe(0.0, 0.0, "ready", 0.0)
    summary = p.summary()
    assert summary["rules"] == {"spin": 1, "backoff": 1}
    assert summary["outcomes"] == {"preempted": 1, "blocked": 1, "ready": 1}
    assert waitpolicy.describe(summary) == (
        "spin 1 (preempted 1), block 1 (backoff 1), answered before waiting 1")


def test_the_policy_module_is_pure() -> None:
    """No clock, file, process or CPU: only what the doorbell hands it (and namedtuple)."""
    tree = ast.parse(Path(waitpolicy.__file__).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"collections"}


# --------------------------------------------------------------------------- recorded traces
def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _policy_of(doc: dict) -> WaitPolicy:
    """A fresh policy with the recorded one's parameters."""
    return WaitPolicy(doc["spin_seconds"], doc["allowed_cpus"], spinning=doc["spinning"],
                      long_call=doc["long_call"], preempted=doc["preempted"],
                      window=doc["window"], failures=doc["failures"],
                      min_backoff=doc["min_backoff"], max_backoff=doc["max_backoff"],
                      load_margin=doc["load_margin"], near_end=doc.get("near_end", 0.0),
                      crowd_blocks=doc.get("crowd_blocks", False),  # recorded before rule 6: off
                      hold=doc.get("hold", 0.0))  # recorded before held spins: a yield a check


def _replay(doc: dict) -> list[list | None]:
    """The decisions a fresh policy makes when handed the trace's inputs and observations."""
    p = _policy_of(doc)
    made: list[list | None] = []
    for w in doc["waits"]:
        if w["decision"] is None:  # the answer was there before the wait began
            made.append(None)
        else:
            load = Load(*w["load"]) if w["load"] is not None else None
            made.append(list(p.decide(load, w["expected"])))
        if w["wait"] is not None:
            p.observe(*w["wait"])
    return made


def test_the_traces_are_there() -> None:
    names = {p.name for p in TRACES}
    for scenario in ("quiet", "busy", "busy_crowd", "idle_caller", "long_call"):
        for role in ("caller", "worker"):
            assert f"{scenario}-{role}.json" in names, "run scripts/record_wait_traces.py"


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_a_recorded_trace_replays_to_the_decisions_the_run_made(path: Path) -> None:
    """Only what the trace holds decided each wait: the policy is a function of its inputs."""
    doc = _load(path)
    assert _replay(doc) == [w["decision"] for w in doc["waits"]]


def _is_unpaid(doc: dict, w: dict) -> bool:
    """As rule 4 counts it: preempted, a late yield, or expired (a held spin that expired
    within twice its window excepted)."""
    if w["wait"] is None or w["wait"][0] <= 0:
        return False
    held = w["decision"] is not None and w["decision"][1] == "held" \
        and w["wait"][0] <= 2 * doc["hold"]
    return w["wait"][2] == "preempted" or w["wait"][1] > doc["preempted"] or (
        w["wait"][2] == "expired" and not held)


def _blocks_after_repeated_unpaid_spins(doc: dict) -> list[tuple[int, bool]]:
    """For each unpaid spin with another among the ``window`` spins before it: how many
    decisions blocked right after it, and whether the trace ended before a spin came."""
    policy_ = _policy_of(doc)
    runs = []
    waits = doc["waits"]
    recent: list[bool] = []  # unpaid or not, per spin that spun, oldest first
    for i, w in enumerate(waits):
        if w["wait"] is None or w["wait"][0] <= 0:
            continue
        unpaid = _is_unpaid(doc, w)
        if unpaid and sum(recent[-(policy_.window - 1):]) >= policy_.failures - 1:
            n, ended = 0, True
            for later in waits[i + 1:]:
                if later["decision"] is None:
                    continue
                if later["decision"][1] == "spin":
                    ended = False
                    break
                n += 1
            runs.append((n, ended))
        recent.append(unpaid)
    return runs


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_repeated_unpaid_spins_are_followed_by_a_backoff(path: Path) -> None:
    doc = _load(path)
    least = _policy_of(doc).min_backoff
    for i, (n, ended) in enumerate(_blocks_after_repeated_unpaid_spins(doc)):
        assert n >= least or ended, f"unpaid spin {i}: only {n} waits blocked, then a spin"


def _unpaid(doc: dict) -> int:
    """Spins that cost their budget or a slice: expired, preempted, or a yield came back late."""
    return sum(1 for w in doc["waits"] if _is_unpaid(doc, w))


@pytest.mark.parametrize("role", ["caller", "worker"])
def test_beside_busy_neighbours_few_spins_go_unpaid(role: str) -> None:
    """Beside processes that never sleep, a spin that does not pay hands the CPU to
    them for a slice; after one, the policy backs off, so few do. (Spins that pay stay: a
    worker whose caller sends the next request at once is answered within its budget.)"""
    doc = _load(TRACES[0].parent / f"busy-{role}.json")
    decided = sum(1 for w in doc["waits"] if w["decision"] is not None)
    assert _unpaid(doc) <= max(2, decided // 20), (_unpaid(doc), decided)


def test_a_caller_that_calls_every_few_milliseconds_gets_a_worker_that_sleeps() -> None:
    doc = _load(TRACES[0].parent / "idle_caller-worker.json")
    rules = [w["decision"][1] for w in doc["waits"] if w["decision"] is not None][2 * 8:]
    assert rules.count("spin") <= max(2, len(rules) // 50)


def test_rule_6_decides_only_in_the_run_that_asked_for_it() -> None:
    """``busy_crowd`` was recorded with ``XSTAGE_CROWD_BLOCKS=1``: its crowded samples blocked
    by rule 6; the default runs never name it."""
    for path in TRACES:
        doc = _load(path)
        rules = {w["decision"][1] for w in doc["waits"] if w["decision"] is not None}
        if path.name.startswith("busy_crowd-"):
            assert doc["crowd_blocks"] is True and "crowded" in rules, path.name
        else:
            assert doc["crowd_blocks"] is False and "crowded" not in rules, path.name


def test_a_long_call_is_never_spun_for_from_its_start() -> None:
    """Blocked (``long_call``), or asleep until near its end and then a short spin
    (``near_end``, a CPU free): never a spin for the whole call."""
    doc = _load(TRACES[0].parent / "long_call-caller.json")
    known = [w for w in doc["waits"]
             if w["decision"] is not None and w["expected"] and w["expected"] > doc["long_call"]]
    assert known, "the trace holds no call known to be long"
    assert {w["decision"][1] for w in known} <= {"long_call", "near_end"}
    near = [w for w in known if w["decision"][1] == "near_end"]
    assert all(w["decision"][0] <= 3 * doc["near_end"] for w in near), near[:3]


def test_the_summary_line_keeps_spin_then_block_first_with_near_end_waits() -> None:
    p = policy(long_call=0.0002, near_end=0.0001)
    for _ in range(3):
        p.decide(QUIET, expected=0.001)
        p.observe(0.0001, 1e-6, "answered", 0.001)
    p.decide(QUIET)
    p.observe(0.0, 0.0, "ready", 0.0)
    line = waitpolicy.describe(p.summary())
    assert line.startswith("spin 1 (answered 3), block 0 (none), near end 3"), line
