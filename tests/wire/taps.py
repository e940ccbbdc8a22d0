"""The channel tests' sockets: a wrapper that keeps what each send wrote (and can be muted),
and a connected pair of authenticated channels over a socketpair."""

from __future__ import annotations

import socket

from xstage_remote import wire


class Tap:
    """A socket that keeps what each send call wrote (``sends``), and can be muted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sends: list[bytes] = []
        self.mute = False

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))
        if not self.mute:
            self.sock.sendall(data)

    def sendmsg(self, buffers) -> int:  # type: ignore[no-untyped-def]
        data = b"".join(bytes(x) for x in buffers)
        self.sendall(data)
        return len(data)

    def recv_into(self, *args):  # type: ignore[no-untyped-def]
        return self.sock.recv_into(*args)

    def fileno(self) -> int:
        return self.sock.fileno()


def channel_pair(secret: str, role_a: str = "client", role_b: str = "worker"):  # type: ignore[no-untyped-def]
    """Two channels over a socketpair, past a handshake's transcript: (a, b, a's tap, b's tap)."""
    hello = {"op": "hello", "id": 0, "nonce": wire.new_nonce()}
    digest = wire.transcript(hello, wire.new_nonce())
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    ta, tb = Tap(a), Tap(b)
    return wire.Channel(ta, secret, digest, role_a), wire.Channel(tb, secret, digest, role_b), \
        ta, tb


def cut_records(data: bytes) -> list[bytes]:
    """Frames as a channel sends them, back to back, cut into their records (each with its
    trailer): a small frame is one record; a large one its head, then its payload records."""
    t = wire.TRAILER_BYTES
    records: list[bytes] = []
    pos = 0
    while pos < len(data):
        _, hlen, plen = wire.PREFIX.unpack_from(data, pos)
        if wire.PREFIX.size + hlen + plen <= wire.SMALL_FRAME:
            sizes = [wire.PREFIX.size + hlen + plen + t]
        else:
            sizes = [wire.PREFIX.size + hlen + t] + [
                min(wire.CHUNK_BYTES, plen - start) + t for start in range(0, plen, wire.CHUNK_BYTES)]
        for size in sizes:
            records.append(data[pos:pos + size])
            pos += size
    assert pos == len(data)
    return records
