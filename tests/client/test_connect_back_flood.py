"""The TCP connect-back listener under a flood of pending peers (docs/security.md).

Silent connections to the client's listener are held, at most ``max_pending`` at once (the
oldest closed first), watched through ``selectors`` (no 1,024-descriptor ``select`` limit), and
the real worker still completes its handshake after them. The worker's half is the worker's
own ``handshake``; everything is loopback, every wait bounded.
"""

from __future__ import annotations

import fcntl
import resource
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from xstage.client import connect_back
from xstage_remote.worker import handshake

#: The bound on every wait here: a failure, never a measurement.
BOUND = 120.0


class _Accepting:
    """``accept_authenticated`` on a fresh loopback listener, in a thread."""

    def __init__(self, max_pending: int, listener: socket.socket | None = None) -> None:
        self.listener = listener or socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.port = self.listener.getsockname()[1]
        self.secret = secrets.token_hex(16)
        self.result: connect_back.Handshaken | BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(max_pending,), daemon=True)
        self.thread.start()

    def _run(self, max_pending: int) -> None:
        try:
            self.result = connect_back.accept_authenticated(
                self.listener, self.secret, time.monotonic() + BOUND, alive=lambda: True,
                max_pending=max_pending)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.result = exc

    def worker(self) -> connect_back.Handshaken:
        """Connect as the worker, prove the secret; what the listener returned."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=BOUND)
        try:
            handshake(sock, self.secret)
            self.thread.join(BOUND)
            assert not self.thread.is_alive(), "the listener never returned"
            if isinstance(self.result, BaseException):
                raise self.result
            assert isinstance(self.result, connect_back.Handshaken)
            self.result.sock.close()
            return self.result
        finally:
            sock.close()


def _closed_by_listener(silent: list[socket.socket], need: int) -> int:
    """Wait until ``need`` of the silent peers read end-of-file (the listener closed them)."""
    watch = selectors.DefaultSelector()
    for s in silent:
        watch.register(s, selectors.EVENT_READ)
    seen, end = 0, time.monotonic() + BOUND
    try:
        while seen < need:
            assert time.monotonic() < end, f"only {seen} of {need} peers were closed"
            for key, _ in watch.select(1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1)
                except ConnectionResetError:
                    data = b""
                assert data == b"", "a silent peer was sent bytes"
                watch.unregister(sock)
                sock.close()
                seen += 1
        return seen
    finally:
        watch.close()


@pytest.fixture
def nofile() -> Iterator[None]:
    """RLIMIT_NOFILE raised as far as the hard limit (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_listener_numbered_past_1024_still_accepts(nofile: None) -> None:
    """A client with over a thousand descriptors open (its listener's number past 1,024):
    before, ``select()`` raised a raw ``ValueError`` (filedescriptor out of range)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2100:
        pytest.skip("RLIMIT_NOFILE's hard limit is below 2,100 descriptors")
    base = socket.create_server(("127.0.0.1", 0), backlog=64)
    high = fcntl.fcntl(base.fileno(), fcntl.F_DUPFD_CLOEXEC, 1100)  # the lowest free past 1,100
    base.close()
    assert high >= 1100
    accepting = _Accepting(64, socket.socket(fileno=high))
    won = accepting.worker()
    assert won.hello["op"] == "hello" and won.refused == []


def test_a_few_hundred_silent_peers_over_a_lowered_cap() -> None:
    """300 silent peers with at most 32 held: the listener closes the oldest as new ones come
    (268 read end-of-file before the worker connects), then the worker wins."""
    accepting = _Accepting(32)
    silent = [socket.create_connection(("127.0.0.1", accepting.port), timeout=BOUND)
              for _ in range(300)]
    try:
        assert _closed_by_listener(silent, 300 - 32) == 300 - 32
        won = accepting.worker()
    finally:
        for s in silent:
            s.close()
    assert any("oldest of 32 peers pending" in r for r in won.refused)
    assert len(won.refused) <= 32


@pytest.mark.slow(reason="opens 15,000 loopback connections and 15,000 descriptors at once "
                  "(a burden on a shared machine); the lowered cap above takes the same path")
def test_fifteen_thousand_pending_connections(nofile: None) -> None:
    """15,000 connections before the worker's (before: ``select()`` past 1,024 descriptors
    raised a raw ``ValueError``); the default cap holds 256 at once and the worker wins."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 16_000:
        pytest.skip("RLIMIT_NOFILE's hard limit is below 16,000 descriptors")
    accepting = _Accepting(connect_back.MAX_PENDING_PEERS)
    silent: list[socket.socket] = []
    try:
        for _ in range(15_000):
            silent.append(socket.create_connection(("127.0.0.1", accepting.port), timeout=BOUND))
        need = 15_000 - connect_back.MAX_PENDING_PEERS
        assert _closed_by_listener(silent, need) == need
        won = accepting.worker()
    finally:
        for s in silent:
            s.close()
    assert len(won.refused) <= 32
