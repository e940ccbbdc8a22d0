"""The socket path's spin before blocking (``xstage_remote.sockspin``).

* The decision is the wait policy's: a spin where it says spin, a block at once where it
  says block (one CPU, a crowded machine, spinning off, a long call), nothing polled beyond
  the one look that every wait takes.
* A spinning receive gives the same frames as a blocking one, a frame split across polls
  included.
* A spin ends by the call's deadline (``DeadlineSocket.recv_nowait`` raises
  ``TimeoutError``), and a peer that leaves while the other end spins is seen at once
  (``PeerClosed``), whatever the spin's budget.

Every socket read has a timeout or runs in a thread the test abandons; nothing asserts on
wall-clock time.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import numpy as np
import pytest

from tests.client.conftest import in_thread, stepping_clock
from xstage.client.deadlines import DeadlineSocket
from xstage_remote import shm, sockspin, waitpolicy, wire

SECRET = "5e" * 16
DIGEST = hashlib.sha256(b"tests/wire/test_sockspin.py").digest()
HARD_TIMEOUT = 30.0  # seconds any blocking step here may take before the test fails
QUIET = waitpolicy.Load(1, 2)  # a load sample with a CPU free


class Polls:
    """A scripted ``poll``: each call takes the next answer (None: nothing there yet)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, view):
        self.calls += 1
        return self.answers.pop(0) if self.answers else None


def _spin(poll, budget=10.0, load=QUIET, cpus=2, spinning=True):
    return sockspin.SocketSpin(budget, poll, spinning=spinning, allowed_cpus=cpus,
                               load=lambda: load)


@pytest.fixture
def clock(monkeypatch):
    """The spin's clock moves 1 us per read: a budget is a number of polls, and no poll is
    ever late (a preemption), however busy the machine."""
    return stepping_clock(monkeypatch, sockspin)


def test_a_spin_takes_an_answer_that_comes_while_it_polls(clock):
    poll = Polls([None, None, None, 7])
    spin = _spin(poll)
    assert spin.recv_into(memoryview(bytearray(16))) == 7
    assert poll.calls == 4
    assert spin.policy.rules["spin"] == 1
    assert spin.summary()["outcomes"] == {"answered": 1}


def test_bytes_already_there_are_taken_at_the_first_poll(clock):
    poll = Polls([5])
    spin = _spin(poll)
    assert spin.recv_into(memoryview(bytearray(16))) == 5
    assert poll.calls == 1
    assert spin.summary()["outcomes"] == {"ready": 1}


def test_end_of_file_while_spinning_is_returned_at_once(clock):
    poll = Polls([None, 0])
    assert _spin(poll).recv_into(memoryview(bytearray(16))) == 0
    assert poll.calls == 2


@pytest.mark.parametrize("why, kwargs, rule", [
    ("one CPU", {"cpus": 1}, "one_cpu"),
    ("a crowded machine", {"load": waitpolicy.Load(4, 2)}, "crowded"),
    ("spinning off", {"spinning": False}, "off"),
    ("no budget", {"budget": 0.0}, "off"),
])
def test_the_policy_blocks_at_once(why, kwargs, rule):
    """Where the policy says block, the wait hands over to the blocking read at once, with
    no poll (the blocking read takes bytes already there)."""
    poll = Polls([])
    spin = _spin(poll, **kwargs)
    assert spin.recv_into(memoryview(bytearray(16))) is None, why
    assert poll.calls == 0
    assert spin.policy.rules[rule] == 1
    spin.blocked()
    assert spin.summary()["outcomes"] == {"blocked": 1}


@pytest.mark.parametrize("kwargs", [{"cpus": 1}, {"spinning": False}, {"budget": 0.0}])
def test_a_spin_that_would_always_block_is_not_installed(kwargs):
    a, b = socket.socketpair()
    try:
        assert _spin(sockspin.nonblocking_poll(b), **kwargs).never
        assert not _spin(sockspin.nonblocking_poll(b)).never
        channel = wire.Channel(b, SECRET, DIGEST, "worker")
        if kwargs == {"cpus": 1}:
            if not hasattr(os, "sched_getaffinity"):
                pytest.skip("no affinity mask here")
            mask = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {min(mask)})
            try:
                assert sockspin.install(channel, 1.0, sockspin.nonblocking_poll(b)) is None
            finally:
                os.sched_setaffinity(0, mask)
            assert channel.spin is None
    finally:
        a.close()
        b.close()


def test_a_long_call_blocks_at_once():
    poll = Polls([])
    spin = _spin(poll)
    spin.expected = 0.5  # the worker's last call took half a second
    assert spin.recv_into(memoryview(bytearray(16))) is None
    assert poll.calls == 0 and spin.policy.rules["long_call"] == 1


def test_a_spin_that_finds_nothing_expires_and_the_caller_blocks(clock):
    poll = Polls([])
    spin = _spin(poll, budget=1e-4)
    assert spin.recv_into(memoryview(bytearray(16))) is None
    assert poll.calls > 1
    spin.blocked()
    assert spin.summary()["outcomes"] == {"expired": 1}


# ------------------------------------------------------------------ through the channel

def _pair():
    """A socketpair: ``a`` with a timeout, ``b`` (the spinning reader's) blocking, as the
    worker's socket is (``nonblocking_poll`` refuses a socket in timeout mode); every read
    on ``b`` runs in a thread the test abandons (``in_thread``)."""
    a, b = socket.socketpair()
    a.settimeout(HARD_TIMEOUT)
    return a, b


def _channels(a, b):
    return (wire.Channel(a, SECRET, DIGEST, "client"), wire.Channel(b, SECRET, DIGEST, "worker"))


def test_a_spinning_channel_reads_the_frames_a_blocking_one_reads():
    a, b = _pair()
    sender, reader = _channels(a, b)
    reader.spin = _spin(sockspin.nonblocking_poll(b))
    codec = wire.FastCodec(["x"], ["y"])
    try:
        exc = in_thread(lambda: _frames_through(a, sender, reader, codec), HARD_TIMEOUT)
        assert exc is None, exc
    finally:
        a.close()
        b.close()


def _frames_through(a, sender, reader, codec):
    frames = [({"op": "ping", "id": i, "gen": 1}, None) for i in range(1, 4)]
    frames.append(({"op": "run", "id": 9, "gen": 1}, {"x": np.arange(300, dtype=np.float32)}))
    for header, arrays in frames:
        sender.send(header, arrays)
    for header, arrays in frames:
        got = reader.recv(codec=codec)
        assert (got.op, got.id) == (header["op"], header["id"])
        if arrays:
            np.testing.assert_array_equal(got.arrays()["x"], arrays["x"])
    # a frame whose first bytes come alone: the spin takes a part of the prefix
    parts = wire.encode_frame({"op": "ping", "id": 10, "gen": 1})
    record = b"".join(parts)
    counter = wire.COUNTER.pack(sender.sent)
    sealed = record + counter + sender._seal_mac.tag(counter, (record,))
    sender.sent += 1
    first = threading.Timer(0.05, a.sendall, (sealed[:5],))  # while the reader spins
    late = threading.Timer(0.1, a.sendall, (sealed[5:],))
    first.start()
    late.start()
    got = reader.recv()
    first.join()
    late.join()
    assert (got.op, got.id) == ("ping", 10)
    assert reader.spin.policy.rules["spin"] >= 1


def test_nonblocking_poll_refuses_a_socket_in_timeout_mode():
    a, b = socket.socketpair()
    try:
        b.settimeout(1.0)
        with pytest.raises(ValueError, match="blocking socket"):
            sockspin.nonblocking_poll(b)
    finally:
        a.close()
        b.close()


def test_a_spinning_receive_ends_by_the_calls_deadline():
    """The client's spin polls through ``DeadlineSocket.recv_nowait``: a deadline that passes
    while it spins (a budget far beyond it, a peer that never answers) raises TimeoutError,
    which the client turns into CallTimeout."""
    a, b = socket.socketpair()
    try:
        io = DeadlineSocket(a)
        channel = wire.Channel(io, SECRET, DIGEST, "client")
        channel.spin = _spin(io.recv_nowait, budget=3600.0)
        io.start(0.05)
        exc = in_thread(channel.recv, HARD_TIMEOUT)
        assert isinstance(exc, TimeoutError), exc
        assert io.got == 0  # nothing consumed: the stream is whole
    finally:
        a.close()
        b.close()


def test_recv_nowait_after_the_deadline_raises_before_reading():
    a, b = socket.socketpair()
    try:
        io = DeadlineSocket(a)
        b.sendall(b"abc")
        io.start(1e-6)
        threading.Event().wait(0.01)
        with pytest.raises(TimeoutError):
            io.recv_nowait(memoryview(bytearray(8)))
        io.start(None)
        assert io.recv_nowait(memoryview(bytearray(8))) == 3 and io.got == 3
        assert io.recv_nowait(memoryview(bytearray(8))) is None
    finally:
        a.close()
        b.close()


def test_a_worker_spinning_for_the_next_request_notices_its_client_leave():
    """The worker's wait for a request, spinning with a budget far longer than the test: the
    client's close is seen at the next poll as a clean end of the stream."""
    a, b = _pair()
    _, reader = _channels(a, b)
    reader.spin = _spin(sockspin.nonblocking_poll(b), budget=3600.0)
    leave = threading.Timer(0.05, a.close)
    leave.start()
    try:
        exc = in_thread(reader.recv, HARD_TIMEOUT)
        assert isinstance(exc, wire.PeerClosed) and not exc.partial, exc
    finally:
        leave.join()
        b.close()


def test_a_client_leaving_inside_a_frame_is_a_partial_end():
    a, b = _pair()
    _, reader = _channels(a, b)
    reader.spin = _spin(sockspin.nonblocking_poll(b), budget=3600.0)
    a.sendall(b"XSW1")
    leave = threading.Timer(0.05, a.close)
    leave.start()
    try:
        exc = in_thread(reader.recv, HARD_TIMEOUT)
        assert isinstance(exc, wire.PeerClosed) and exc.partial, exc
    finally:
        leave.join()
        b.close()


def test_the_policy_is_told_the_fewest_runnable_tasks_of_the_last_samples():
    """A transient spike (a runtime's pool threads spinning after a run) is not a crowd;
    neighbours that never sleep show in every sample."""
    spin = _spin(Polls([]))
    seen = [spin._steady(waitpolicy.Load(n, 2)) for n in (2, 5, 5, 5, 1)]
    assert [s.running for s in seen] == [2, 2, 2, 5, 1]
    assert spin._steady(None) is None
    assert spin._steady(waitpolicy.Load(4, 2)).running == 4  # a gap starts afresh


def test_crowded_stands_until_the_next_load_sample():
    """Once a sample says crowded, the waits until the next sample block without asking
    the policy again (each is still counted as a crowded block)."""
    samples = []

    def load():
        samples.append(1)
        return waitpolicy.Load(6, 2)

    poll = Polls([])
    spin = sockspin.SocketSpin(10.0, poll, spinning=True, allowed_cpus=2, load=load)
    for _ in range(5):
        assert spin.recv_into(memoryview(bytearray(16))) is None
        spin.blocked()
    assert poll.calls == 0
    assert spin.policy.rules["crowded"] == 5
    assert len(samples) <= 2  # sampled at most every LOAD_SAMPLE_SECONDS


def test_proc_cpu_reads_where_a_process_last_ran():
    cpu = sockspin.proc_cpu(os.getpid())
    if cpu is None:
        pytest.skip("no /proc/PID/stat here")
    try:
        assert 0 <= cpu() < (os.cpu_count() or 1)
    finally:
        sockspin.close_proc_cpu(cpu)
    assert sockspin.proc_cpu(2**22 + 12345) is None  # above pid_max: no such process


def test_a_spin_that_finds_the_peer_on_its_cpu_moves_off_it():
    """The client's side of "Shared CPU": the peer reported on this CPU, so the spin pins
    itself to the other CPUs for a moment (and restores its mask)."""
    if shm._getcpu is None or not hasattr(os, "sched_getaffinity") \
            or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs sched_getcpu and two CPUs")
    mask = os.sched_getaffinity(0)
    poll = Polls([None, None, 3])
    spin = sockspin.SocketSpin(10.0, poll, spinning=True, allowed_cpus=2, load=lambda: QUIET,
                               peer_cpu=lambda: shm._getcpu())
    spin.policy.preempted = 60.0  # a loaded test machine may preempt: not what is tested
    assert spin.recv_into(memoryview(bytearray(16))) == 3
    assert spin.moved == 1
    assert os.sched_getaffinity(0) == mask
    assert "moved off the peer's CPU 1" in spin.summary()["line"]
