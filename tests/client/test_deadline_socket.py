"""One deadline per call on the control socket: the kernel's limits, set only on a change."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.client.conftest import in_thread
from xstage.client.deadlines import DeadlineSocket

HARD_TIMEOUT = 30.0


def _raises_timeout(fn) -> None:  # type: ignore[no-untyped-def]
    """``fn()`` raises TimeoutError, in a thread this test abandons if it hangs instead."""
    exc = in_thread(fn, HARD_TIMEOUT)
    assert isinstance(exc, TimeoutError), exc


class _Counting:
    """A socket that counts the ``setsockopt`` calls made through it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.options = sock, 0

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def setsockopt(self, *args: object) -> None:
        self.options += 1
        self.sock.setsockopt(*args)  # type: ignore[arg-type]

    def recv_into(self, *args: object) -> int:
        return self.sock.recv_into(*args)  # type: ignore[arg-type]

    def send(self, data: object) -> int:
        return self.sock.send(data)  # type: ignore[arg-type]


def test_calls_of_one_phase_set_the_kernels_limits_once():
    a, b = socket.socketpair()
    with a, b:
        counting = _Counting(a)
        io = DeadlineSocket(counting)  # type: ignore[arg-type]
        buf = bytearray(8)
        for _ in range(50):
            io.start(30.0)
            io.sendall(b"ping")
            b.sendall(b"pong")
            assert io.recv_into(buf) == 4
        assert counting.options == 2  # SO_SNDTIMEO and SO_RCVTIMEO, once
        io.start(None)  # another phase: set again, once
        assert counting.options == 4
        assert a.gettimeout() is None  # blocking: no poll or ioctl around each system call


def test_a_silent_peer_ends_a_receive_in_timeout_error():
    a, b = socket.socketpair()
    with a, b:
        io = DeadlineSocket(a)
        io.start(0.2)
        _raises_timeout(lambda: io.recv_into(bytearray(8)))
        assert io.got == 0  # nothing read: an interrupted wait would leave the stream whole


def test_a_peer_that_does_not_read_ends_a_send_in_timeout_error():
    a, b = socket.socketpair()
    with a, b:
        io = DeadlineSocket(a)
        io.start(0.2)
        _raises_timeout(lambda: io.sendall(bytes(64 << 20)))  # far more than the buffers hold


def test_a_trickling_peer_cannot_stretch_a_call_past_its_deadline():
    """Each byte comes well within the limit the kernel holds, the whole never within the
    call's deadline: the deadline still ends the call (between system calls)."""
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle() -> None:
        for _ in range(200):
            if stop.wait(0.02):
                return
            try:
                b.send(b"x")
            except OSError:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        io = DeadlineSocket(a)
        io.start(0.3)
        view = memoryview(bytearray(200))

        def read_all() -> None:
            got = 0
            while got < len(view):
                got += io.recv_into(view[got:])

        _raises_timeout(read_all)
        assert 0 < io.got < len(view)
    finally:
        stop.set()
        t.join()
        a.close()
        b.close()


def test_a_passed_deadline_raises_before_the_next_system_call():
    a, b = socket.socketpair()
    with a, b:
        io = DeadlineSocket(a)
        io.start(0.05)
        time.sleep(0.1)
        b.sendall(b"ready")  # data waiting: only the deadline can refuse the read
        with pytest.raises(TimeoutError):
            io.recv_into(bytearray(8))
