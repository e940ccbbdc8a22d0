"""Claims of huge sizes are refused before anything is allocated (``tracemalloc`` peak < 1 MiB).

The peer sends only a prefix and a header, never the payload it claims; the receiving socket
has a timeout, so a decoder that tried to read (or allocate) the payload would fail the test
with ``TimeoutError``/``MemoryError`` instead of hanging.
"""

import json
import socket
import struct
import tracemalloc

import pytest

from xstage_remote import wire

MIB = 1 << 20
TIB = 1 << 40


def claim(descs, plen, op="run"):
    """Prefix + header (no payload) for a frame claiming ``plen`` payload bytes."""
    header = json.dumps({"op": op, "id": 1, "t": descs}).encode()
    return struct.pack("<4sIQ", b"XSW1", len(header), plen) + header


def desc(dtype, shape, nbytes, name="x", offset=0):
    return {"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes}


def refuse_with_peak(data, **kw):
    """``recv_frame`` on ``data`` sent over a socketpair (peer keeps its end open).

    Returns ``(error, peak_bytes)``; the error must be ``ProtocolError``.
    """
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    try:
        a.sendall(data)  # small: fits the socket buffer, no thread needed
        tracemalloc.start()
        try:
            with pytest.raises(wire.ProtocolError) as info:
                wire.recv_frame(b, **kw)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        a.close()
        b.close()
    return info.value, peak


def test_rejects_2e40_payload_claim_with_small_peak():
    """A valid header whose tensor covers a 2^40-byte payload: refused at the prefix."""
    data = claim([desc("uint8", [TIB], TIB)], TIB)
    err, peak = refuse_with_peak(data)
    assert str(err) == f"payload length {TIB} exceeds the limit {wire.MAX_PAYLOAD_BYTES}"
    assert peak < MIB, peak


def test_rejects_2e40_payload_claim_over_lowered_limit():
    """A connection that lowered its limit refuses a claim above it the same way."""
    data = claim([desc("uint8", [TIB], TIB)], TIB)
    err, peak = refuse_with_peak(data, max_payload=64 * MIB)
    assert f"exceeds the limit {64 * MIB}" in str(err)
    assert peak < MIB, peak


@pytest.mark.parametrize("descs, message", [
    ([desc("uint8", [TIB], TIB - 1)],
     "tensor 'x': nbytes 1099511627775 != prod(shape) * itemsize = 1099511627776"),
    ([desc("float32", [1 << 38], TIB), desc("uint8", [1], 1, "y", TIB)],
     "tensor 'y' ends at byte 1099511627777, past the payload's 1099511627776"),
    ([desc("uint8", [TIB - 1], TIB - 1)],
     "tensors cover 1099511627775 bytes of a 1099511627776-byte payload"),
    ([desc("uint8", [1 << 20, 1 << 20, 1 << 20], TIB)],
     "tensor 'x': nbytes 1099511627776 != prod(shape) * itemsize = 1152921504606846976"),
    ([desc("float64", [1 << 40, 1 << 40], TIB)],
     "tensor 'x': shape [1099511627776, 1099511627776] spans more than 2^63 - 1 bytes"),
    ([desc("uint8", [TIB * 2], TIB)],
     "tensor 'x': dimension 2199023255552 is not an int in [0, 2^40]"),
    ([desc("uint8", [TIB], TIB), desc("uint8", [TIB], TIB, "x", TIB)],
     "tensor 'x' appears twice in one frame"),
], ids=["nbytes-off-by-one", "past-payload", "not-covered", "nbytes-vs-shape", "span",
        "dim-over-limit", "duplicate-name"])
def test_rejects_2e40_claim_at_descriptor_check_when_limit_raised(descs, message):
    """With ``max_payload=2^41`` the prefix passes; the descriptor check refuses, no payload read."""
    err, peak = refuse_with_peak(claim(descs, TIB), max_payload=TIB * 2)
    assert str(err) == message
    assert peak < MIB, peak


def test_rejects_2e40_claim_without_tensor_list_when_limit_raised():
    """A 2^40-byte claim on an op without tensors is refused before the payload."""
    header = json.dumps({"op": "ping", "id": 1}).encode()
    data = struct.pack("<4sIQ", b"XSW1", len(header), TIB) + header
    err, peak = refuse_with_peak(data, max_payload=TIB * 2)
    assert str(err) == "op ping carries a 1099511627776-byte payload and no tensor list"
    assert peak < MIB, peak


def test_rejects_header_length_claim_with_small_peak():
    """A 4 GiB header claim is refused from the prefix, before a header buffer exists."""
    data = struct.pack("<4sIQ", b"XSW1", 2**32 - 1, 0) + b"{}"
    err, peak = refuse_with_peak(data)
    assert str(err).startswith("header length 4294967295 is outside [2, ")
    assert peak < MIB, peak


def test_parse_frame_refuses_2e40_claim_with_small_peak():
    """``parse_frame`` on the same bytes refuses without copying anything large."""
    data = claim([desc("uint8", [TIB], TIB - 1)], TIB)
    tracemalloc.start()
    try:
        with pytest.raises(wire.ProtocolError, match="nbytes"):
            wire.parse_frame(data, max_payload=TIB * 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MIB, peak
