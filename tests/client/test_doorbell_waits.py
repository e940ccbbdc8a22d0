"""The doorbell's waiting and waking (shm.py, "Wait policy"), on real processes and sockets."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import random
import sys
import time

import numpy as np
import pytest

from tests.client.conftest import stepping_clock
from xstage.client import WorkerClient
from xstage_remote import doorbell as doorbell_mod
from xstage_remote import shm

IO = [("x", "float32", 16)]
CALLS = 3000
#: A liveness bound, not a speed one: a lost wake-up would sleep until this deadline.
DEADLINE_S = 30.0


def _worker_side(region: shm.Region, sock, other, spin: float | None, seed: int,
                 events: tuple[int, int] | None = None) -> None:
    other.close()  # the caller's end, inherited: its close must reach this side as end-of-file
    bell = shm.Doorbell(sock)
    bell.bind(region, shm.OFF_WORKER_ASLEEP, shm.OFF_CLIENT_ASLEEP, spin=shm.WORKER_SPIN_SECONDS)
    if events is not None:  # the worker waits on the first eventfd and rings the second
        bell.use_eventfds(events[0], events[1])
    rng = random.Random(seed)
    while True:
        last = region.resp_id()
        # An eventfd never ends: the caller's end of the socket, watched, says it is gone.
        state = bell.wait(lambda w=last: region.req_id() != w, time.monotonic() + DEADLINE_S,
                          spin=spin, watch=[sock] if events is not None else ())
        if state != "ready":
            os._exit(3 if state == "timeout" else 0)
        if rng.random() < 0.2:  # shake the interleavings: publish early, late, or in between
            time.sleep(rng.random() * 5e-5)
        region.publish_response(region.req_id(), shm.STATUS_OK, 0)
        bell.ring()


def _caller_and_worker(bell_kind: str, target, *args):  # type: ignore[no-untyped-def]
    """A region and a doorbell (socket or eventfds) between this process, the caller, and a
    forked worker side running ``target(region, its socket, ours, *args, events)``; returns
    (region, our socket, the child, our bound doorbell, the eventfds or None)."""
    slots, size = shm.plan_layout(IO, IO)
    region = shm.Region.create(size, slots)
    a, b = shm.socketpair()
    events = shm.eventfd_pair() if bell_kind == "eventfd" else None
    child = mp.get_context("fork").Process(target=target, args=(region, b, a, *args, events))
    child.start()
    b.close()
    bell = shm.Doorbell(a)
    bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
    if events is not None:
        bell.use_eventfds(events[1], events[0])
    return region, a, child, bell, events


needs_eventfd = pytest.mark.skipif(shm.make_eventfd is None, reason="no eventfd on this OS")


@pytest.mark.parametrize("bell_kind", ["socket", pytest.param("eventfd", marks=needs_eventfd)])
@pytest.mark.parametrize("spin", [0, None], ids=["always-block", "policy"])
def test_no_wake_up_is_ever_lost(spin: float | None, bell_kind: str) -> None:
    """Both sides raise their flag and re-check; the poster publishes and reads the flag. With
    a barrier on each side one of them always sees the other, so no wait outlives its answer
    (a lost ring would sleep until the 30 s deadline and fail here). The same with the
    eventfd doorbell."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")  # so that a failure can be replayed
    region, a, child, bell, events = _caller_and_worker(bell_kind, _worker_side, spin, seed)
    try:
        if events is not None:
            assert bell.kind == "eventfd"
        rng = random.Random(seed + 1)
        for rid in range(1, CALLS + 1):
            region.publish_request(rid)
            bell.ring()
            if rng.random() < 0.2:
                time.sleep(rng.random() * 5e-5)
            state = bell.wait(lambda r=rid: region.resp_id() == r, time.monotonic() + DEADLINE_S,
                              spin=spin)
            assert state == "ready", f"call {rid}: {state}"
    finally:
        a.close()
        child.join(timeout=60)
        region.close()
        if events is not None:
            bell.close_eventfds()
    assert child.exitcode == 0


@contextlib.contextmanager
def _region_and_pair():  # type: ignore[no-untyped-def]
    """A one-set region and a socketpair for two doorbells, closed after the test."""
    slots, size = shm.plan_layout(IO, IO)
    region = shm.Region.create(size, slots)
    a, b = shm.socketpair()
    try:
        yield region, a, b
    finally:
        a.close()
        b.close()
        region.close()


def test_a_preempted_spin_stops_at_once_blocks_and_backs_off(monkeypatch) -> None:
    """A yield that comes back late means another task held this CPU: the spin ends there,
    the wait blocks, and the next waits block without spinning."""
    with _region_and_pair() as (region, a, b):
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        clock = stepping_clock(monkeypatch, doorbell_mod)
        monkeypatch.setattr(doorbell_mod, "_yield", lambda: clock.advance(0.005))  # the CPU went elsewhere
        bell.spin_yield_seconds = 0.0  # a yield on every check
        monkeypatch.setattr(doorbell_mod, "_read_load", lambda: None)
        for _ in range(2):  # one preempted spin alone is no pattern (waitpolicy rule 4); two are
            answers = iter([False, False, True])  # before waiting, after the yield, blocked
            assert bell.wait(lambda a=answers: next(a), time.monotonic() + 5) == "ready"
        summary = bell.summary()
        assert summary["rules"] == {"spin": 2}
        assert summary["outcomes"] == {"preempted": 2}
        answers = iter([False, True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5) == "ready"
        assert bell.summary()["rules"] == {"spin": 2, "backoff": 1}


def test_a_spin_yields_once_per_interval_not_on_every_check(monkeypatch) -> None:
    """A spin checks without yielding until ``SPIN_YIELD_SECONDS`` have passed since its last
    yield (beside busy neighbours a yield hands the CPU away for a scheduler slice): an answer
    that comes within the interval costs no yield; a long spin yields once per interval."""
    yields = []
    with _region_and_pair() as (region, a, b):
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        stepping_clock(monkeypatch, doorbell_mod)  # the spin's budget is checks, not the scheduler's time
        monkeypatch.setattr(doorbell_mod, "_yield", lambda: yields.append(1))
        monkeypatch.setattr(doorbell_mod, "_read_load", lambda: None)
        bell.spin_yield_seconds = 60.0
        answers = iter([False] * 50 + [True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5) == "ready"
        assert yields == []
        assert bell.summary()["outcomes"] == {"answered": 1}
        bell.spin_yield_seconds = 0.0
        answers = iter([False] * 50 + [True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5) == "ready"
        assert len(yields) == 50  # one before each check of the spin (the first is before it)


def test_an_answered_spin_is_learned_at_the_next_decision_not_before_the_answer(
        monkeypatch) -> None:
    """The answer goes first (the caller's copy out, the worker's run): an answered spin's
    outcome reaches the policy when this side next decides or waits, in the same order."""
    seen = []
    with _region_and_pair() as (region, a, b):
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        monkeypatch.setattr(doorbell_mod, "_read_load", lambda: None)
        stepping_clock(monkeypatch, doorbell_mod)
        real = bell.policy.observe
        monkeypatch.setattr(bell.policy, "observe", lambda *w: seen.append(w[2]) or real(*w))
        answers = iter([False, True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5) == "ready"
        assert seen == []  # not yet: the caller has its answer to read
        bell.ring()  # the next publish's ring decides the next wait: learned first
        assert seen == ["answered"]
        answers = iter([False, True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5) == "ready"
        assert bell.summary()["outcomes"] == {"answered": 2}  # a summary catches up too
        assert seen == ["answered", "answered"]


@pytest.mark.parametrize("caller_cpu", [0, 1])
def test_a_worker_on_its_callers_cpu_yields_on_every_check(monkeypatch, caller_cpu: int) -> None:
    """The worker never moves: holding a CPU its caller last waited on would keep the caller
    from sending the next request, so there it yields before every check; elsewhere it holds."""
    yields = []
    with _region_and_pair() as (region, a, b):
        bell = shm.Doorbell(b)
        bell.bind(region, shm.OFF_WORKER_ASLEEP, shm.OFF_CLIENT_ASLEEP,
                  spin=shm.WORKER_SPIN_SECONDS)
        monkeypatch.setattr(doorbell_mod, "_getcpu", lambda: 0)
        monkeypatch.setattr(doorbell_mod, "_yield", lambda: yields.append(1))
        monkeypatch.setattr(doorbell_mod, "_read_load", lambda: None)
        bell.spin_yield_seconds = 60.0
        stepping_clock(monkeypatch, doorbell_mod)
        region.set_flag(shm.OFF_CLIENT_ASLEEP + shm.CPU_AFTER_FLAG, caller_cpu + 1)
        answers = iter([False] * 20 + [True])
        assert bell.wait(lambda: next(answers), time.monotonic() + 5, spin=1.0) == "ready"
        assert len(yields) == (20 if caller_cpu == 0 else 0)


def test_a_spin_preempted_between_two_checks_stops_at_once(monkeypatch) -> None:
    """Without a yield, a check that comes late still means another task ran on this CPU:
    the spin ends there (``preempted``) and the wait blocks."""
    with _region_and_pair() as (region, a, b):
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        bell.spin_yield_seconds = 60.0
        monkeypatch.setattr(doorbell_mod, "_read_load", lambda: None)
        clock = stepping_clock(monkeypatch, doorbell_mod)
        checks = iter([False, "late", False, True])  # before waiting, in the spin, blocked

        def ready() -> bool:
            got = next(checks)
            if got == "late":
                clock.advance(0.005)  # the spin lost its CPU here
                return False
            return bool(got)

        assert bell.wait(ready, time.monotonic() + 5) == "ready"
        assert bell.summary()["outcomes"] == {"preempted": 1}


def _heads_up_worker_side(region: shm.Region, sock, other, events) -> None:
    """The worker's idle wait (``heads_up=True``), its spin never cut short by preemption (a
    loaded test machine): exit 0 once it took a request that was published without a ring."""
    other.close()
    bell = shm.Doorbell(sock)
    bell.bind(region, shm.OFF_WORKER_ASLEEP, shm.OFF_CLIENT_ASLEEP, spin=shm.WORKER_SPIN_SECONDS)
    bell.policy.preempted = 60.0
    doorbell_mod.HEADS_UP_MAX_SECONDS = 60.0
    if events is not None:
        bell.use_eventfds(events[0], events[1])
    state = bell.wait(lambda: region.req_id() != 0, time.monotonic() + DEADLINE_S,
                      spin=shm.WORKER_SPIN_SECONDS, watch=[sock] if events else (),
                      heads_up=True)
    region.publish_response(region.req_id(), shm.STATUS_OK, 0)
    bell.ring()
    os._exit(0 if state == "ready" else 3)


@pytest.mark.parametrize("bell_kind", ["socket", pytest.param("eventfd", marks=needs_eventfd)])
def test_a_heads_up_wakes_a_sleeping_worker_into_a_spin_that_takes_the_request(bell_kind) -> None:
    """A caller about to copy a long input announces when it will publish and rings; the
    worker, asleep, wakes and spins until then, so the request is taken without the ring that
    publishing sends (none is sent here: a worker that slept again would never answer).

    Ordered, not timed: the request is published only once the worker has taken the
    announcement (a worker that woke after the request was already there would take it
    without spinning, and the announcement would stay).
    """
    region, a, child, bell, events = _caller_and_worker(bell_kind, _heads_up_worker_side)
    try:
        limit = time.monotonic() + DEADLINE_S
        while not region.flag(shm.OFF_WORKER_ASLEEP):  # its spin ends, then it sleeps
            assert time.monotonic() < limit, "the worker never went to sleep"
            time.sleep(0.001)
        assert bell.heads_up(time.monotonic_ns() + int(DEADLINE_S * 1e9))
        while region.coming() != 0:  # the worker woke and took the announcement: it spins now
            assert time.monotonic() < limit, "the worker never took the heads-up"
            time.sleep(0.001)
        region.publish_request(1)  # published, and no ring: only the spin can take it
        state = bell.wait(lambda: region.resp_id() == 1, time.monotonic() + DEADLINE_S, spin=0)
        assert state == "ready"
        child.join(DEADLINE_S)
        assert child.exitcode == 0
        assert region.coming() == 0  # the announcement is taken once
        region.set_flag(shm.OFF_WORKER_ASLEEP, 0)
        assert not bell.heads_up(time.monotonic_ns())  # an awake worker is not rung
    finally:
        if child.is_alive():
            child.kill()
        if events is not None:
            bell.close_eventfds()
        a.close()
        region.close()


def test_a_ring_left_over_from_an_earlier_wait_does_not_end_the_next_one() -> None:
    slots, size = shm.plan_layout(IO, IO)
    region = shm.Region.create(size, slots)
    a, b = shm.socketpair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        b.send(b"\0\0")  # stale rings
        assert bell.wait(lambda: False, time.monotonic() + 0.05, spin=0) == "timeout"
        b.close()
        assert bell.wait(lambda: False, time.monotonic() + 5, spin=0) == "closed"
    finally:
        a.close()
        region.close()


@needs_eventfd
def test_an_eventfd_bell_takes_left_over_rings_and_reports_a_watched_fd() -> None:
    """Stale rings (one counter) wake a wait that finds nothing and sleeps again; the peer's
    death reaches an eventfd waiter through the watched control socket, never the eventfd."""
    slots, size = shm.plan_layout(IO, IO)
    region = shm.Region.create(size, slots)
    a, b = shm.socketpair()
    ctl_a, ctl_b = shm.socketpair()
    mine, peer = shm.eventfd_pair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP)
        bell.use_eventfds(mine, peer)
        for _ in range(3):
            os.write(mine, (1).to_bytes(8, "little"))  # three rings, one pending count
        assert bell.wait(lambda: False, time.monotonic() + 0.05, watch=[ctl_a], spin=0) \
            == "timeout"
        ctl_b.close()  # the peer is gone: its control socket ends
        assert bell.wait(lambda: False, time.monotonic() + 5, watch=[ctl_a], spin=0) == "watch"
        region.set_flag(shm.OFF_WORKER_ASLEEP, 1)  # the peer sleeps: a ring is sent
        bell.ring()  # to the peer's eventfd (nobody waits on it here: the count just grows)
        assert int.from_bytes(os.read(peer, 8), "little") == 1
    finally:
        bell.close_eventfds()
        for sock in (a, b, ctl_a):
            sock.close()
        region.close()


@pytest.mark.parametrize("doorbell", ["socket", pytest.param("eventfd", marks=needs_eventfd)])
def test_a_worker_client_rings_the_doorbell_it_was_given(tmp_path, monkeypatch, doorbell) -> None:
    """The client sends the worker a pair of eventfds with the region's memfd unless
    ``XSTAGE_DOORBELL=socket``; both ends then use the same kind, and calls are answered."""
    from xstage import builtin_graphs

    monkeypatch.setenv("XSTAGE_DOORBELL", doorbell)  # read once, into the client's tuning
    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), tmp_path / "s.onnx")
    with WorkerClient(sys.executable) as w:
        w.load(graph)
        assert w.link.bell is not None and w.link.bell.kind == doorbell
        x = np.arange(16, dtype=np.float32)
        for _ in range(50):
            np.testing.assert_array_equal(w.run({"x": x})["y"], x)


def test_a_worker_records_its_trace_when_asked(tmp_path, monkeypatch) -> None:
    """``XSTAGE_WAIT_TRACE``: the worker writes its decisions, their inputs and what each
    wait saw when it exits (the policy's fixtures are recorded this way)."""
    monkeypatch.setenv("XSTAGE_WAIT_TRACE", str(tmp_path))
    from xstage import builtin_graphs

    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), tmp_path / "s.onnx")
    with WorkerClient(sys.executable) as w:
        w.load(graph)
        for _ in range(20):
            w.run({"x": np.ones(16, np.float32)})
        pid = w.pid
        waits = w.waits()
    (path,) = tmp_path.glob(f"wait-worker-{pid}-*.json")
    doc = json.loads(path.read_text())
    assert doc["role"] == "worker" and doc["spin_seconds"] == shm.WORKER_SPIN_SECONDS
    assert len(doc["waits"]) >= 20
    decided = [w for w in doc["waits"] if w["decision"] is not None]
    # Some requests were there before the worker waited (no decision); it waited again after.
    assert 1 <= sum(waits["worker"]["rules"].values()) <= len(decided)


def test_a_worker_traces_where_its_loads_tuning_says_not_where_its_environment_does(
        tmp_path, monkeypatch) -> None:
    """The worker's knobs come from ``load`` (``TransportTuning``): its trace goes to the
    folder the load names, with the spin budget the load sets; the folder and the budget in
    its own environment are not read. (The load's ``tuning`` is added here as the client
    sends it.)"""
    from xstage import builtin_graphs
    from xstage.client import worker as client_worker

    sent, ignored = tmp_path / "sent", tmp_path / "env"
    sent.mkdir()
    ignored.mkdir()
    real_send = client_worker.WorkerClient._send

    def send(self, header, *args, **kwargs):  # type: ignore[no-untyped-def]
        if header.get("op") == "load":
            header = dict(header, tuning={"wait_trace": str(sent), "worker_spin_seconds": 0.001})
        return real_send(self, header, *args, **kwargs)

    monkeypatch.setattr(client_worker.WorkerClient, "_send", send)
    env = dict(os.environ, XSTAGE_WAIT_TRACE=str(ignored), XSTAGE_WORKER_SPIN_SECONDS="3600")
    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), tmp_path / "s.onnx")
    with WorkerClient(sys.executable, env=env) as w:
        w.load(graph)
        for _ in range(5):
            w.run({"x": np.ones(16, np.float32)})
        pid = w.pid
    (path,) = sent.glob(f"wait-worker-{pid}-*.json")
    assert json.loads(path.read_text())["spin_seconds"] == 0.001
    assert list(ignored.iterdir()) == []
