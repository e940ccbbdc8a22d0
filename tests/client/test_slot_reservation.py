"""``input_slots()`` hands out a slot set no request owns, reserved for the call that takes it.

The attacks: a caller that does what docs/serving.md says (ask for the slots before each call,
fill them, submit) at depth 2 with requests still in flight, and another call made while a
reserved set is being filled. The order is arranged, never raced: the worker is stopped
(SIGSTOP) so the requests stay in flight until the test lets it go on.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading

import numpy as np
import pytest

from xstage import builtin_graphs, errors
from xstage.client import WorkerClient
from xstage_remote import shm

N = 1 << 15  # 128 KiB of float32: a slot recognised by its address (shm.IN_PLACE_MIN_BYTES)
assert N * 4 >= shm.IN_PLACE_MIN_BYTES


@pytest.fixture(scope="module")
def slice_big(tmp_path_factory: pytest.TempPathFactory):
    return builtin_graphs.write(builtin_graphs.slice_graph(N, N // 2),
                                tmp_path_factory.mktemp("g") / "slice.onnx")


def _values(k: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(k)]


def _waiting_for_a_set(client: WorkerClient, done: threading.Event) -> None:
    """Until the filler thread either waits inside ``input_slots`` or is done (no clock)."""
    while not (done.is_set() or getattr(client.pipeline, "slot_waiters", 0)):
        threading.Event().wait(0.001)


def test_slots_asked_for_while_every_set_is_in_flight_wait_for_a_free_one(slice_big):
    """Three fills at depth 2: the third must not get the set of request 1, still unanswered."""
    a, b, c = _values(3)
    with WorkerClient(sys.executable, depth=2) as client:
        client.load(slice_big)
        os.kill(client.pid, signal.SIGSTOP)
        futures = []
        try:
            for v in (a, b):
                slots = client.input_slots()
                slots["x"][...] = v
                futures.append(client.submit(slots))
            done = threading.Event()

            def third() -> None:
                slots = client.input_slots()  # every set is in flight: it waits
                slots["x"][...] = c
                futures.append(client.submit(slots))
                done.set()

            filler = threading.Thread(target=third)
            filler.start()
            _waiting_for_a_set(client, done)
            assert not done.is_set()  # it waited: no set was free
        finally:
            os.kill(client.pid, signal.SIGCONT)
        filler.join(timeout=120)
        assert done.is_set()
        for fut, v in zip(futures, (a, b, c), strict=True):
            np.testing.assert_array_equal(fut.result(timeout=120)["y"], v[: N // 2])


def test_no_free_set_within_the_timeout_is_a_named_error(slice_big):
    with WorkerClient(sys.executable, depth=2) as client:
        client.load(slice_big)
        os.kill(client.pid, signal.SIGSTOP)  # nothing can come free while it is stopped
        try:
            first = client.submit({"x": np.ones(N, np.float32)})
            second = client.submit({"x": np.ones(N, np.float32)})
            with pytest.raises(errors.SlotsBusy, match="2 slot sets") as busy:
                client.input_slots(timeout=0.05)
            assert "timeout" in busy.value.remedy
        finally:
            os.kill(client.pid, signal.SIGCONT)
        first.result(timeout=120), second.result(timeout=120)
        with pytest.raises(errors.UsageError, match="timeout"):
            client.input_slots(timeout=-1)


def test_a_reserved_set_is_not_taken_by_another_call(slice_big):
    """At depth 1 a plain call made while the slots are being filled goes around them."""
    a, b = _values(2)
    with WorkerClient(sys.executable, depth=1) as client:
        client.load(slice_big)
        slots = client.input_slots()
        slots["x"][...] = a
        np.testing.assert_array_equal(client.run({"x": b})["y"], b[: N // 2])  # inline
        future = client.submit({"x": b})  # queued: waits for nothing, goes inline too
        np.testing.assert_array_equal(future.result(timeout=120)["y"], b[: N // 2])
        np.testing.assert_array_equal(client.run(slots)["y"], a[: N // 2])
        # Taken: the next call goes through the region again.
        assert client.pipeline.reserved == {}


def test_slots_dropped_without_a_call_are_given_back(slice_big):
    with WorkerClient(sys.executable, depth=1) as client:
        client.load(slice_big)
        slots = client.input_slots()
        del slots
        gc.collect()
        again = client.input_slots(timeout=0.05)  # the only set: free again
        again["x"][...] = 3.0
        np.testing.assert_array_equal(client.run(again)["y"], np.full(N // 2, 3.0, np.float32))
