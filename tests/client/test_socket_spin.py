"""The TCP path's spins before blocking, end to end (``xstage_remote.sockspin``).

A client spinning for its reply still ends the call by its deadline (``CallTimeout``, the
worker killed), and a worker spinning for its next request still leaves when its client's
connection ends. Both spins get a budget far longer than the test (the spin would hold
without the checks). Everything that could hang runs in a thread with a hard timeout or
under ``psutil.wait_procs``'s; nothing asserts on wall-clock time.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

import numpy as np
import psutil

from tests.client.conftest import in_thread
from xstage import errors
from xstage.client import Deadlines, WorkerClient, WorkerState
from xstage_remote import sockspin

HARD_TIMEOUT = 120  # seconds a scenario may take before it counts as hung


def _big_spin(client: WorkerClient) -> sockspin.SocketSpin:
    """Give the client's channel a spin of an hour (where this machine spins at all)."""
    io = client.link.io
    assert io is not None and client.link.channel is not None
    spin = sockspin.SocketSpin(3600.0, io.recv_nowait, spinning=True, allowed_cpus=2,
                               load=lambda: None)
    client.link.spin = client.link.channel.spin = spin
    return spin


def test_a_spinning_call_ends_by_its_deadline(graphs):
    w = WorkerClient(sys.executable, shm_mode="off", transport="tcp",
                     deadlines=Deadlines(call=1))
    w.start()
    try:
        w.load(graphs["slice"])
        x = {"x": np.ones(4096, np.float32)}
        w.run(x)
        w.run(x)  # the lean path from here on
        spin = _big_spin(w)
        pid = w.pid
        os.kill(pid, signal.SIGSTOP)
        exc = in_thread(lambda: w.run(x), HARD_TIMEOUT)
        assert isinstance(exc, errors.CallTimeout), exc
        assert spin.policy.rules["spin"] >= 1  # it was spinning when the deadline passed
        assert w.state is WorkerState.DEAD
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        w.close()


def test_a_worker_spinning_for_its_next_request_leaves_with_its_client(graphs):
    """The worker's spin budget is an hour; its client's connection ends (its stdin, the
    death pipe, stays open): the worker exits as orphaned (status 70) all the same."""
    env = dict(os.environ, XSTAGE_WORKER_SPIN_SECONDS="3600")
    w = WorkerClient(sys.executable, shm_mode="off", transport="tcp", env=env)
    w.start()
    try:
        w.load(graphs["slice"])
        for _ in range(3):
            w.run({"x": np.ones(4096, np.float32)})
        info = w.ping()
        assert "socket_spin" in info, info  # the worker spins (or blocks) through its policy
        proc = psutil.Process(w.pid)
        assert w._ctl is not None
        w._ctl.shutdown(socket.SHUT_RDWR)
        gone, alive = psutil.wait_procs([proc], timeout=30.0)
        assert not alive, "the worker still runs after its client's connection ended"
        assert gone[0].returncode == 70
    finally:
        w.close()


def test_calls_over_a_spinning_channel_are_answered_in_order(graphs):
    """Many short calls with the client's and the worker's spins on: each reply is its own
    request's (the ids are checked by the client), values exact."""
    with WorkerClient(sys.executable, shm_mode="off", transport="tcp") as w:
        w.load(graphs["slice"])
        for i in range(300):
            x = np.full(4096, float(i), np.float32)
            out = w.run({"x": x})
            np.testing.assert_array_equal(next(iter(out.values())), x[:1024])
        if w.link.spin is not None:  # installed where waits can spin (x86-64, two CPUs or more)
            assert sum(w.link.spin.policy.rules.values()) >= 300
