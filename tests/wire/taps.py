"""A socket wrapper for the channel tests: it keeps what each send wrote, and can be muted."""

from __future__ import annotations

import socket


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
