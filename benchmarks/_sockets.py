"""Socket set-up the socket-path benchmarks share (``channel.py``, ``call64.py``)."""

from __future__ import annotations

import socket


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of one TCP loopback connection, both with ``TCP_NODELAY`` (as the
    connect-back sets it): one process's CPU cost of a frame each way, without a peer."""
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b
