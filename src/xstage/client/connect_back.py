"""The client's half of the TCP connect-back handshake (docs/security.md).

The listener stays open and accepts every peer until one completes the handshake: it says
a hello with a fresh nonce, receives this client's nonce and proof, and answers with a proof
over both nonces and its hello that only the holder of the session secret can make. Peers
that fail (or say nothing) are closed; the winner's stream becomes an authenticated
``wire.Channel``. Nothing blocks on one peer: each is read without blocking into a buffer of
its own, so a silent or slow connection cannot hold the worker's out. Peers are watched
through ``selectors`` (epoll or poll: no 1,024-descriptor limit) and at most
``MAX_PENDING_PEERS`` are held at once, the oldest closed first.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xstage_remote import wire

__all__ = ["Handshaken", "NoPeer", "accept_authenticated"]

#: Bytes a peer may send before it must have completed a handshake frame.
_MAX_PENDING = wire.PREFIX.size + 64 * 1024
#: Peers held at once before the handshake; past it the oldest is closed. The worker says its
#: hello as soon as it connects, so only a flood of more than this many connections between
#: its connect and its hello can push it out (then the start fails by name, never silently).
MAX_PENDING_PEERS = 256
#: Why the last peers were closed, kept for the error and ``refused_peers``.
_MAX_REASONS = 32


class NoPeer(Exception):
    """No peer completed the handshake in time; ``reached`` says how far the best got."""

    def __init__(self, reached: str, last_failure: str | None) -> None:
        Exception.__init__(self, reached)
        self.reached = reached  # "accept" (nobody connected) or "hello"
        self.last_failure = last_failure


@dataclass
class Handshaken:
    """The peer that proved the secret: its socket, hello and authenticated channel."""

    sock: socket.socket
    hello: dict[str, Any]
    channel: wire.Channel
    refused: list[str] = field(default_factory=list)


@dataclass
class _Peer:
    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    hello: dict[str, Any] | None = None
    digest: bytes = b""


def _take_frame(peer: _Peer) -> wire.Frame | None:
    """One complete handshake frame from the peer's buffer (no payload allowed), or None."""
    if len(peer.buf) < wire.PREFIX.size:
        return None
    hlen, _ = wire.validate_prefix(bytes(peer.buf[: wire.PREFIX.size]), max_payload=0)
    end = wire.PREFIX.size + hlen
    if len(peer.buf) < end:
        if end > _MAX_PENDING:
            raise wire.ProtocolError(f"handshake frame of {end} bytes is too large")
        return None
    frame = wire.parse_frame(bytes(peer.buf[:end]), max_payload=0)
    del peer.buf[:end]
    return frame


def _advance(peer: _Peer, secret: str, frame: wire.Frame) -> wire.Channel | None:
    """Feed one frame to the peer's handshake; the Channel once it has proved the secret."""
    if peer.hello is None:
        if frame.op != "hello" or frame.id != 0:
            raise wire.ProtocolError(f"handshake: first frame is {frame.op} #{frame.id}, "
                                     "expected hello #0")
        nonce = wire.new_nonce()
        peer.digest = wire.transcript(frame.header, nonce)  # checks the worker's nonce
        wire.check_record_bytes(frame.header.get("record_bytes", wire.CHUNK_BYTES))
        peer.hello = frame.header
        peer.sock.setblocking(True)
        wire.send_frame(peer.sock, {"op": "auth", "id": 0, "nonce": nonce,
                                    "proof": wire.proof(secret, "client", peer.digest)})
        peer.sock.setblocking(False)
        return None
    if frame.op != "auth_ok" or frame.id != 0:
        raise wire.ProtocolError(f"handshake: expected auth_ok #0, the peer sent "
                                 f"{frame.op} #{frame.id}")
    wire.check_proof(secret, "worker", peer.digest, frame.header["proof"])
    if peer.buf:
        raise wire.ProtocolError("handshake: bytes after auth_ok before the first request")
    peer.sock.setblocking(True)
    channel = wire.Channel(peer.sock, secret, peer.digest, "client")
    # the worker's record size, both ways (its hello, part of the transcript both proofs cover)
    channel.chunk_bytes = peer.hello.get("record_bytes", wire.CHUNK_BYTES)
    return channel


def accept_authenticated(listener: socket.socket, secret: str, deadline: float | None,
                         alive: Callable[[], bool],
                         max_pending: int = MAX_PENDING_PEERS) -> Handshaken:
    """Accept peers on ``listener`` until one completes the handshake (see the module doc).

    ``deadline`` is a ``time.monotonic()`` value (None: no limit); ``alive`` says whether the
    worker process still runs (when it has exited, waiting longer is pointless). At most
    ``max_pending`` peers are held at once: a new one past that closes the oldest, and so
    does a full descriptor table (``EMFILE``). Raises ``NoPeer`` when the deadline passes or
    the worker exits first. The listener and every losing peer are closed.
    """
    peers: dict[socket.socket, _Peer] = {}  # in the order they came: the oldest first
    refused: collections.deque[str] = collections.deque(maxlen=_MAX_REASONS)
    reached = "accept"
    watch = selectors.DefaultSelector()  # epoll/poll: no FD_SETSIZE limit, as select has

    def drop(peer: _Peer, why: str) -> None:
        refused.append(why)
        del peers[peer.sock]
        watch.unregister(peer.sock)
        peer.sock.close()

    try:
        listener.setblocking(False)
        watch.register(listener, selectors.EVENT_READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or not alive():
                if any(p.hello is not None for p in peers.values()) and not refused:
                    # The worker ended after its hello, before its proof reached us: its check of
                    # ours failed (the order of the exit and of our read is the scheduler's).
                    refused.append("the worker closed the connection during the handshake, after "
                                   "its hello (it refused this client's proof)")
                raise NoPeer(reached, refused[-1] if refused else None)
            wait = 0.2 if left is None else min(left, 0.2)
            for key, _ in watch.select(wait):
                sock = key.fileobj
                if sock is listener:
                    _take_peer(listener, peers, watch, max_pending, drop)
                    continue
                assert isinstance(sock, socket.socket)
                peer = peers[sock]
                try:
                    data = sock.recv(65536)
                    if not data:
                        raise wire.PeerClosed(bool(peer.buf))
                    peer.buf += data
                    while (frame := _take_frame(peer)) is not None:
                        reached = "hello"
                        channel = _advance(peer, secret, frame)
                        if channel is not None:
                            del peers[sock]
                            assert peer.hello is not None
                            return Handshaken(sock, peer.hello, channel, list(refused))
                except (wire.ProtocolError, EOFError, OSError) as exc:
                    drop(peer, f"{type(exc).__name__}: {exc}")
    finally:
        watch.close()
        listener.close()
        for p in peers.values():
            with contextlib.suppress(OSError):
                p.sock.close()


def _take_peer(listener: socket.socket, peers: dict[socket.socket, _Peer],
               watch: selectors.BaseSelector, max_pending: int,
               drop: Callable[[_Peer, str], None]) -> None:
    """Accept one peer; the oldest pending one closed first at the cap or on ``EMFILE``."""
    try:
        conn, _ = listener.accept()
    except BlockingIOError:  # taken back by the peer before we got to it
        return
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE) or not peers:
            raise
        drop(next(iter(peers.values())), f"closed: no descriptor left for a new peer ({exc})")
        return
    if len(peers) >= max_pending:
        drop(next(iter(peers.values())),
             f"closed: the oldest of {max_pending} peers pending the handshake")
    conn.setblocking(False)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peers[conn] = _Peer(conn)
    watch.register(conn, selectors.EVENT_READ)
