"""The shared-CPU rule of the doorbell (shm.py, "Shared CPU"), on real CPUs and processes."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from tests.client.conftest import wait_until
from xstage.client import WorkerClient
from xstage_remote import shm

IO = [("x", "float32", 16)]


@pytest.fixture
def region():
    slots, size = shm.plan_layout(IO, IO)
    r = shm.Region.create(size, slots)
    yield r
    r.close()


needs_two_cpus = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shm._getcpu is None
    or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and two usable CPUs")


@needs_two_cpus
def test_a_waiter_on_its_peers_cpu_moves_off_it(region):
    a, b = shm.socketpair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
        before = shm._getcpu()
        region.set_flag(shm.OFF_WORKER_ASLEEP + shm.CPU_AFTER_FLAG, before + 1)
        assert bell._shares_cpu() is False  # it moved, so it no longer shares
        after = shm._getcpu()
        assert after != before
        assert region.flag(shm.OFF_CLIENT_ASLEEP + shm.CPU_AFTER_FLAG) == after + 1
    finally:
        a.close()
        b.close()


@needs_two_cpus
def test_affinity_mask_is_restored_after_a_move(region):
    allowed = os.sched_getaffinity(0)
    a, b = shm.socketpair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
        region.set_flag(shm.OFF_WORKER_ASLEEP + shm.CPU_AFTER_FLAG, shm._getcpu() + 1)
        bell._shares_cpu()
        assert os.sched_getaffinity(0) == allowed
    finally:
        a.close()
        b.close()


def test_an_unknown_peer_cpu_is_never_shared(region):
    if shm._getcpu is None:
        pytest.skip("no sched_getcpu here")
    a, b = shm.socketpair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_CLIENT_ASLEEP, shm.OFF_WORKER_ASLEEP, nudge=True)
        region.set_flag(shm.OFF_WORKER_ASLEEP + shm.CPU_AFTER_FLAG, 0)
        assert bell._shares_cpu() is False
    finally:
        a.close()
        b.close()


def test_the_worker_publishes_its_cpu_while_calls_run(graphs):
    if shm._getcpu is None:
        pytest.skip("no sched_getcpu here")
    with WorkerClient(sys.executable) as w:
        w.load(graphs["mlp"])
        w.run({"x": np.zeros((8, 256), np.float32)})
        ncpu = os.cpu_count() or 1
        # Written when the worker starts waiting for the next call, just after answering.
        wait_until(lambda: w.link.region.flag(shm.OFF_WORKER_ASLEEP + shm.CPU_AFTER_FLAG) != 0,
                   "the worker publishing its CPU")
        assert 1 <= w.link.region.flag(shm.OFF_WORKER_ASLEEP + shm.CPU_AFTER_FLAG) <= ncpu
        # The client's is written only when it had to wait (an answer may already be there).
        assert 0 <= w.link.region.flag(shm.OFF_CLIENT_ASLEEP + shm.CPU_AFTER_FLAG) <= ncpu


def test_the_worker_side_never_moves(region):
    """Moving the worker's main thread onto onnxruntime's pinned cores doubled compute."""
    a, b = shm.socketpair()
    try:
        bell = shm.Doorbell(a)
        bell.bind(region, shm.OFF_WORKER_ASLEEP, shm.OFF_CLIENT_ASLEEP)
        assert bell.nudge is False
        calls = []
        bell._shares_cpu = lambda: calls.append(1) or False
        answers = iter([False] * 20 + [True])  # ready only after twenty spins
        # Nothing rings here: a spin the policy stops (a crowded machine) blocks until the
        # deadline, which is as good for this test.
        state = bell.wait(lambda: next(answers, True), time.monotonic() + 1, spin=1.0)
        assert state in ("ready", "timeout")
        assert calls == []
    finally:
        a.close()
        b.close()


def test_two_processes_pinned_to_one_cpu_still_answer(graphs):
    """With nowhere to move, the waiter blocks instead of spinning; calls still complete."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity control here")
    import onnxruntime as ort

    cpu = min(os.sched_getaffinity(0))
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(graphs["mlp"])).run(None, {"x": x})[0]
    with WorkerClient(sys.executable) as w:
        os.sched_setaffinity(w.pid, {cpu})
        for tid in os.listdir(f"/proc/{w.pid}/task"):
            os.sched_setaffinity(int(tid), {cpu})
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
        try:
            w.load(graphs["mlp"])
            assert w.link.region is not None
            for _ in range(20):
                np.testing.assert_array_equal(w.run({"x": x})["y"], ref)
        finally:
            os.sched_setaffinity(0, allowed)
