"""``Refill``, the throughput mode's driver (docs/throughput.md, "How the throughput mode drives
the stage"): K requests in flight, each refilled from the last one's done-callback.

The submit functions here stand in for ``Stage.submit`` to put the driver's edges in a
chosen order (answers inside ``submit``, answers from another thread, failures); a real
stage's throughput is driven in tests/stage/test_concurrent.py. Nothing is timed.
"""

from __future__ import annotations

import queue
import sys
import threading
from concurrent.futures import Future

import pytest

from xstage import errors
from xstage.stage.refill import Refill


class Answered:
    """A submit whose futures are done before ``submit`` returns (a stage that answers inline)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.depth_seen = 0
        self.open = 0

    def __call__(self, inputs):
        self.calls += 1
        fut: Future = Future()
        if self.fail_at is not None and self.calls == self.fail_at:
            fut.set_exception(errors.WorkerDied("the worker died", exit_status=-9, pid=1))
        else:
            fut.set_result({"y": inputs["x"]})
        return fut


class Collector:
    """A submit whose futures are answered by one collecting thread, in submission order, as
    the stage's pump answers them; it records the most requests it ever held at once."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.pending: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.open = 0
        self.most = 0
        self.calls = 0
        self.fail_at = fail_at
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def __call__(self, inputs):
        fut: Future = Future()
        with self.lock:
            self.calls += 1
            self.open += 1
            self.most = max(self.most, self.open)
            n = self.calls
        self.pending.put((fut, n))
        return fut

    def _answer(self) -> None:
        while True:
            item = self.pending.get()
            if item is None:
                return
            fut, n = item
            with self.lock:
                self.open -= 1
            if self.fail_at == n:
                fut.set_exception(errors.InputError("input x: wrong shape"))
            else:
                fut.set_result({"y": n})  # its callback runs here, and submits the next

    def stop(self) -> None:
        self.pending.put(None)
        self.thread.join(timeout=30)


def test_it_sends_exactly_the_requests_asked_never_more_than_depth_at_once():
    submit = Collector()
    try:
        drive = Refill(submit, {"x": 1}, depth=4, total=200, duration=None)
        drive.run()
    finally:
        submit.stop()
    assert drive.sent == submit.calls == 200
    assert len(drive.latency) == 200
    assert 1 <= submit.most <= 4


def test_answers_inside_submit_never_recurse():
    """Every future is done when ``submit`` returns, so each callback runs inside the loop's own
    ``submit``: the loop sends the next, the callback does not (10x the recursion limit)."""
    n = 10 * sys.getrecursionlimit()
    submit = Answered()
    drive = Refill(submit, {"x": 1}, depth=3, total=n, duration=None)
    drive.run()
    assert drive.sent == submit.calls == n and len(drive.latency) == n


@pytest.mark.parametrize("make", [lambda: Answered(fail_at=5), lambda: Collector(fail_at=5)],
                         ids=["inside-submit", "from-the-collector"])
def test_the_first_error_is_raised_and_nothing_is_sent_after_it(make):
    submit = make()
    try:
        drive = Refill(submit, {"x": 1}, depth=2, total=100, duration=None)
        with pytest.raises((errors.WorkerDied, errors.InputError)):
            drive.run()
    finally:
        if isinstance(submit, Collector):
            submit.stop()
    # request 5 failed; at most the other one in flight was sent before its answer was seen
    assert 5 <= drive.sent <= 6 and submit.calls == drive.sent
    assert len(drive.latency) == drive.sent - 1


def test_a_submit_that_raises_ends_the_run_with_its_error():
    calls = []

    def submit(inputs):
        calls.append(1)
        if len(calls) == 3:
            raise errors.StageClosed("the stage is closed")
        fut: Future = Future()
        fut.set_result({})
        return fut

    drive = Refill(submit, {}, depth=2, total=10, duration=None)
    with pytest.raises(errors.StageClosed):
        drive.run()
    assert drive.sent == 2 and len(calls) == 3


def test_a_duration_ends_the_run():
    """By time, not count: the run ends on its own (no figure about how many it sent)."""
    submit = Collector()
    try:
        drive = Refill(submit, {"x": 1}, depth=2, total=None, duration=0.05)
        drive.run()
    finally:
        submit.stop()
    assert drive.sent >= 1 and len(drive.latency) == drive.sent


def test_a_submit_that_returns_no_future_ends_the_run_instead_of_hanging():
    """The third submit runs in the collecting thread's callback, where an exception is only
    logged by ``concurrent.futures``: the run ends with it rather than wait for a callback
    that never comes."""
    collector = Collector()

    def submit(inputs):
        fut = collector(inputs)
        return object() if collector.calls == 3 else fut

    try:
        drive = Refill(submit, {"x": 1}, depth=2, total=10, duration=None)
        with pytest.raises(AttributeError):
            drive.run()
    finally:
        collector.stop()
