"""Shared helpers for the wire tests: hand-built frames and a real socketpair transport."""

import json
import socket
import struct
import threading

import pytest

from xstage_remote import wire

#: Every socket read in these tests gives up after this long, so no test can hang.
SOCKET_TIMEOUT_S = 10.0


def _raw_frame(header, payload=b"", *, magic=b"XSW1", hlen=None, plen=None):
    """Bytes of one frame built by hand (no validation): ``header`` is a dict, str or bytes."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    hlen = len(header) if hlen is None else hlen
    plen = len(payload) if plen is None else plen
    return struct.pack("<4sIQ", magic, hlen, plen) + header + payload


def _feed_socket(data, *, max_payload=wire.MAX_PAYLOAD_BYTES, close_after=True):
    """Send ``data`` from one end of a socketpair and ``recv_frame`` it on the other.

    A thread does the sending (a frame larger than the socket buffer would otherwise block),
    the sender shuts its write side when done so a truncated frame reads as end-of-file, and
    the receiver has a timeout so the call can never hang.
    """
    a, b = socket.socketpair()
    b.settimeout(SOCKET_TIMEOUT_S)
    a.settimeout(SOCKET_TIMEOUT_S)

    def send():
        try:
            a.sendall(data)
            if close_after:
                a.shutdown(socket.SHUT_WR)
        except OSError:  # the receiver refused early and closed its end
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return wire.recv_frame(b, max_payload=max_payload)
    finally:
        b.close()
        sender.join(SOCKET_TIMEOUT_S)
        a.close()


def _send_and_receive(header, arrays=None):
    """``send_frame`` on one end of a socketpair, ``recv_frame`` on the other."""
    a, b = socket.socketpair()
    a.settimeout(SOCKET_TIMEOUT_S)
    b.settimeout(SOCKET_TIMEOUT_S)
    errors = []

    def send():
        try:
            wire.send_frame(a, header, arrays)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)
            a.close()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        frame = wire.recv_frame(b)
    except wire.PeerClosed:
        sender.join(SOCKET_TIMEOUT_S)
        if errors:
            raise errors[0] from None
        raise
    finally:
        sender.join(SOCKET_TIMEOUT_S)
        a.close()
        b.close()
    if errors:
        raise errors[0]
    return frame


def _in_memory(header, arrays=None):
    """``encode_frame`` then ``parse_frame`` on the joined bytes."""
    return wire.parse_frame(b"".join(bytes(p) for p in wire.encode_frame(header, arrays)))


@pytest.fixture(params=["memory", "socket"])
def transport(request):
    """One frame through ``encode_frame``/``parse_frame`` or ``send_frame``/``recv_frame``."""
    return _in_memory if request.param == "memory" else _send_and_receive


@pytest.fixture
def raw_frame():
    """Build a frame by hand, bypassing the encoder's checks (see ``_raw_frame``)."""
    return _raw_frame


@pytest.fixture
def feed_socket():
    """Push raw bytes through a socketpair into ``recv_frame`` (see ``_feed_socket``)."""
    return _feed_socket


@pytest.fixture
def in_memory():
    """``encode_frame`` → ``parse_frame``."""
    return _in_memory


@pytest.fixture
def over_socket():
    """``send_frame`` → ``recv_frame`` over a real socketpair."""
    return _send_and_receive
