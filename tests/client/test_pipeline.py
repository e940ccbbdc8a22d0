"""Requests in flight: K slot sets, submission order, cancel and deadlines (docs/serving.md).

Order is checked with the worker's own stamps (``time.monotonic_ns`` on one kernel: when the
client published a request, when the worker's compute started and ended), never with the
wall clock: with depth 2, request n+1 is published before request n's compute ends; with
depth 1 never.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.client.conftest import slow_graph, stop_on_run_env, wait_stopped, wait_until
from xstage import errors
from xstage.client import WorkerClient
from xstage_remote import shm


@pytest.fixture(scope="module")
def mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tens of milliseconds of MatMul: long enough for the next request to be published."""
    path = tmp_path_factory.mktemp("pipeline") / "mid.onnx"
    onnx.save(slow_graph(384, 12), path)
    return path


@pytest.fixture(scope="module")
def long(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Hundreds of milliseconds: a request that is surely still computing when we act."""
    path = tmp_path_factory.mktemp("pipeline") / "long.onnx"
    onnx.save(slow_graph(1024, 12), path)
    return path


@pytest.fixture(scope="module")
def reshape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reshape by a data input: a bad shape makes the worker raise for that request only."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    path = tmp_path_factory.mktemp("pipeline") / "reshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    return path


def _x(n: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": (rng.standard_normal((n, n)) * scale).astype(np.float32)}


def _started(w: WorkerClient, fut) -> None:
    """Wait (on the worker's own flag, not the clock) until ``fut``'s request has started."""
    region = w.link.region
    req = fut._req
    while not (req.published and region.started(req.rid, req.set)):
        threading.Event().wait(0.001)


def test_results_come_back_in_submission_order(mid):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(mid)
        feeds = [_x(384, i + 1) for i in range(6)]
        expected = [w.run(f)["y"] for f in feeds]
        futures = [w.submit(f) for f in feeds]
        for fut, want in zip(futures, expected, strict=True):
            np.testing.assert_array_equal(fut.result(timeout=120)["y"], want)
        ids = [f.request_id for f in futures]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert {f.generation for f in futures} == {1}


def test_depth_2_publishes_the_next_request_before_the_current_compute_ends(mid, fault_python,
                                                                           tmp_path):
    """Ordered, not raced: the worker stops itself as it takes each request and is resumed
    only once the client has published the next one, so each overlap the stamps show is one
    the client made, never a compute outlasting a wake-up."""
    stamps = tmp_path / "stamps"
    with WorkerClient(fault_python, depth=2, env=stop_on_run_env(1, every=True, stamps=stamps)) as w:
        w.load(mid)
        futures = [w.submit(_x(384)) for _ in range(4)]
        for n in range(1, len(futures) + 1):
            wait_stopped(w.pid, stamps, n)
            if n < len(futures):
                following = futures[n]
                wait_until(lambda f=following: f.request_id is not None, f"request {n + 1} published")
            os.kill(w.pid, signal.SIGCONT)
        stamps_ = [f.result(timeout=120) and f.timing for f in futures]
    for before, after in itertools.pairwise(stamps_):
        assert after["published_ns"] < before["end_ns"]  # overlapped
        assert after["start_ns"] >= before["end_ns"]  # one compute at a time, in order


def test_depth_1_publishes_only_after_the_previous_answer(mid):
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(mid)
        futures = [w.submit(_x(384)) for _ in range(4)]
        stamps = [f.result(timeout=120) and f.timing for f in futures]
    for before, after in itertools.pairwise(stamps):
        assert after["published_ns"] > before["end_ns"]


def test_a_sync_call_waits_behind_submitted_requests(mid):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(mid)
        futures = [w.submit(_x(384)) for _ in range(3)]
        w.run(_x(384))
        mine = dict(w.last_timing)
        for fut in futures:
            assert fut.done()
            assert fut.timing["end_ns"] <= mine["start_ns"]


def test_one_thread_submits_while_another_waits(mid):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(mid)
        futures: list = []
        ready = threading.Semaphore(0)

        def producer() -> None:
            for i in range(8):
                futures.append(w.submit(_x(384, i + 1)))
                ready.release()

        thread = threading.Thread(target=producer)
        thread.start()
        got = []
        for i in range(8):
            ready.acquire()
            got.append(futures[i].result(timeout=120)["y"])
        thread.join()
        want = w.run(_x(384, 8))["y"]
        np.testing.assert_array_equal(got[-1], want)


def test_a_request_the_worker_refuses_fails_alone(reshape):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    good, bad = np.array([6, 4]), np.array([5, 5])
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(reshape)
        w.fit_region({"x": x, "shape": good, "y": x.reshape(6, 4)})
        futures = [w.submit({"x": x, "shape": s}) for s in (good, bad, good)]
        assert futures[0].result(timeout=60)["y"].shape == (6, 4)
        with pytest.raises(errors.WorkerRaised, match="Reshape|reshape|shape"):
            futures[1].result(timeout=60)
        assert futures[2].result(timeout=60)["y"].shape == (6, 4)


def test_inline_stages_are_queued_too(graphs):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(graphs["symbolic"])
        assert w.link.region is None
        xs = [np.full((3, 2), i, np.float32) for i in range(4)]
        futures = [w.submit({"x": x}) for x in xs]
        for fut, x in zip(futures, xs, strict=True):
            np.testing.assert_array_equal(fut.result(timeout=60)["y"], -x)


def test_the_region_holds_k_sets_of_the_same_slots(mid):
    with WorkerClient(sys.executable, depth=3) as w:
        w.load(mid)
        region = w.link.region
        assert region.n_sets == 3
        for s in range(3):
            assert region.capacity("in", "x", s) == 384 * 384 * 4
            assert region.capacity("out", "y", s) == 384 * 384 * 4


# ---------------------------------------------------------------------- cancel
def test_cancel_a_queued_request(mid, fault_python):
    """The worker stops itself as it takes the first request: the second stays queued (depth 1)
    until the cancel, by order."""
    with WorkerClient(fault_python, depth=1, env=stop_on_run_env(1)) as w:
        w.load(mid)
        first = w.submit(_x(384))
        queued = w.submit(_x(384))
        wait_stopped(w.pid)
        assert queued.cancel()
        assert queued.cancelled()
        os.kill(w.pid, signal.SIGCONT)
        first.result(timeout=120)
        assert w.in_flight() == 0


def test_cancel_a_published_request_that_has_not_started(mid, fault_python):
    """The worker stops itself as it takes the first request (before it marks it started):
    the second is published into the other set and cannot start before the cancel."""
    with WorkerClient(fault_python, depth=2, env=stop_on_run_env(1)) as w:
        w.load(mid)
        first = w.submit(_x(384))
        second = w.submit(_x(384))
        wait_stopped(w.pid)
        wait_until(lambda: second._req.published, "the pump publishing the second request")
        assert second.cancel()
        os.kill(w.pid, signal.SIGCONT)
        assert first.result(timeout=120)["y"].shape == (384, 384)
        third = w.submit(_x(384))  # the withdrawn set is free again
        assert third.result(timeout=120)["y"].shape == (384, 384)
        assert second.cancelled() and second.timing == {}


def test_a_started_request_cannot_be_cancelled(long):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(long)
        first = w.submit(_x(1024))
        _started(w, first)
        assert not first.cancel()
        assert first.result(timeout=120)["y"].shape == (1024, 1024)


# ---------------------------------------------------------------------- deadlines
def test_a_deadline_before_start_fails_the_request_and_keeps_the_worker(long):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(long)
        pid = w.pid
        # Stopped, the worker cannot start either request before the second's deadline passes
        # (the first's compute outlasting 50 ms was a race on a loaded machine).
        os.kill(pid, signal.SIGSTOP)
        try:
            first = w.submit(_x(1024), timeout=None)
            late = w.submit(_x(1024), timeout=0.05)
            with pytest.raises(errors.CallTimeout):
                late.result(timeout=120)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert first.result(timeout=120)["y"].shape == (1024, 1024)
        assert w.run(_x(1024))["y"].shape == (1024, 1024)
        assert w.pid == pid


def test_a_deadline_during_compute_kills_the_worker(mid, fault_python):
    """The worker stops itself as it takes the timed request: its deadline passes mid-call by
    order (no answer can come), never by a race with the compute."""
    with WorkerClient(fault_python, depth=2, env=stop_on_run_env(1)) as w:
        w.load(mid)
        x = _x(384)
        timed = w.submit(x, timeout=0.5)
        published = w.submit(x, timeout=None)
        queued = w.submit(x, timeout=None)
        with pytest.raises(errors.CallTimeout):
            timed.result(timeout=120)
        for fut in (published, queued):
            with pytest.raises(errors.WorkerDied) as info:
                fut.result(timeout=120)
            assert info.value.generation == 1
            assert "generation 1" in str(info.value)
        with pytest.raises(errors.StageClosed):
            w.run(x)


def test_bad_timeouts_are_usage_errors(mid):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(mid)
        for bad in (0, -1, float("inf"), "1", True):
            with pytest.raises(errors.UsageError, match="timeout"):
                w.submit(_x(384), timeout=bad)


def test_closing_fails_what_is_still_queued(long):
    w = WorkerClient(sys.executable, depth=1)
    w.start()
    w.load(long)
    futures = [w.submit(_x(1024)) for _ in range(3)]
    w.close()
    for fut in futures:
        if not fut.cancelled():
            exc = fut.exception(timeout=60)
            assert exc is None or isinstance(exc, (errors.StageClosed, errors.WorkerDied))
    assert not [t for t in threading.enumerate() if t.name.startswith("xstage-pump")]


def test_layout_refuses_a_set_outside_the_count():
    slots, size = shm.plan_layout([("x", "float32", 64)], [("y", "float32", 64)], sets=2)
    shm.validate_layout(size, slots, 2)
    with pytest.raises(shm.ProtocolError, match="set"):
        shm.validate_layout(size, slots, 1)
    with pytest.raises(shm.ProtocolError, match="same slots"):
        shm.validate_layout(size, [s for s in slots if s["role"] == "in" or s["set"] == 0], 2)


def test_an_answer_of_another_generation_is_not_taken():
    slots, size = shm.plan_layout([("x", "float32", 64)], [("y", "float32", 64)], sets=2)
    region = shm.Region.create(size, slots, "memfd", generation=2, n_sets=2)
    try:
        old = shm.Region(region.mm, size, slots, "memfd", generation=1, n_sets=2)
        old.publish_response(7, shm.STATUS_OK, 0, s=1)
        assert region.resp_id(1) == 7 and not region.answered(7, 1)
        region.publish_response(7, shm.STATUS_OK, 0, s=1)
        assert region.answered(7, 1) and not region.answered(7, 0)
    finally:
        region.close()


def test_a_withdrawn_request_is_not_taken_and_a_taken_one_cannot_be_withdrawn():
    slots, size = shm.plan_layout([("x", "float32", 64)], [("y", "float32", 64)], sets=2)
    region = shm.Region.create(size, slots, "memfd", n_sets=2)
    try:
        region.publish_request(5, 1)
        assert region.withdraw(5, 1)  # not started
        assert not region.take(5, 1)  # the worker sees the cancel and does not run it
        region.publish_request(6, 0)
        assert region.take(6, 0) and region.started(6, 0)
        assert not region.withdraw(6, 0)  # it started
    finally:
        region.close()


def test_a_cancelled_future_is_done_for_wait_and_as_completed(long):
    """``concurrent.futures.wait``/``as_completed`` used to wait forever on a cancelled one."""
    import concurrent.futures

    with WorkerClient(sys.executable, depth=1) as w:
        w.load(long)
        os.kill(w.pid, signal.SIGSTOP)  # the first stays in flight: the second stays queued
        try:
            first = w.submit(_x(1024))
            second = w.submit(_x(1024))
            assert second.cancel()
            done, not_done = concurrent.futures.wait([second], timeout=60)
            assert done == {second} and not not_done
            assert list(concurrent.futures.as_completed([second], timeout=60)) == [second]
        finally:
            os.kill(w.pid, signal.SIGCONT)
        assert first.result(timeout=120)["y"].shape == (1024, 1024)
