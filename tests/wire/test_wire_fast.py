"""Binary call frames (``XSB1``, docs/wire.md "Binary call frames"): round trips, every
malformed field refused by name, fuzzed mutations refused with ``ProtocolError`` only, and the
authenticated channel's checks on binary records (tamper, inject, replay, reorder).
"""

from __future__ import annotations

import re
import socket
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from taps import channel_pair, cut_records

from tests.conftest import fuzz_examples
from xstage_remote import wire

INPUTS = ["x", "mask", "ids"]
OUTPUTS = ["y", "z"]
TIMING = {"worker_ns": 5000, "rss": 10**8, "peak": 10**9}
SECRET = "5e" * 16


def codec() -> wire.FastCodec:
    return wire.FastCodec(INPUTS, OUTPUTS)


def frame_bytes(op: str, arrays, rid: int = 7, gen: int = 1, **kw) -> bytes:
    parts = wire.encode_fast(codec(), op, rid, gen, arrays, **kw)
    assert parts is not None
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)


def parse(data: bytes, c: wire.FastCodec | None = None) -> wire.Frame:
    return wire.parse_frame(data, codec=c or codec())


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


# ----------------------------------------------------------------------------- round trips
def test_run_and_result_round_trip_with_their_fields() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = parse(frame_bytes("run", {"x": x, "ids": np.array([1, 2], np.int64)}, 9, 3,
                          options={"reset_state": True}))
    assert f.fast and f.op == "run" and f.id == 9
    assert f.header == {"op": "run", "id": 9, "gen": 3, "options": {"reset_state": True}}
    got = f.arrays()
    assert list(got) == ["x", "ids"] and np.array_equal(got["x"], x) and got["ids"].tolist() == [1, 2]
    f = parse(frame_bytes("result", {"z": np.ones(2, bool)}, 9, 3,
                          timing=dict(TIMING, state_reset=True)))
    assert f.header == {"op": "result", "id": 9, "gen": 3,
                        "timing": dict(TIMING, state_reset=True)}
    assert parse(frame_bytes("result", {}, timing=TIMING)).header["timing"] == TIMING


@pytest.mark.parametrize("tag", list(wire.DTYPES))
def test_every_whitelisted_dtype_and_byte_order_round_trips(tag: str) -> None:
    try:
        dt = wire.dtype_of_tag(tag)
    except wire.ProtocolError:
        pytest.skip("bfloat16 needs ml_dtypes")
    raw = np.random.default_rng(1).integers(0, 256, 24 * dt.itemsize, dtype=np.uint8)
    a = (raw & 1).astype(bool) if tag == "bool" else raw.view(dt)
    a = a.reshape(4, 6)
    for variant in (a, a.T, a[:, ::2], a.byteswap().view(a.dtype.newbyteorder(">"))
                    if dt.itemsize > 1 else a):
        got = parse(frame_bytes("run", {"x": variant})).arrays()["x"]
        assert got.dtype.byteorder in "=|<" and got.shape == variant.shape
        assert np.array_equal(bits(got), bits(variant))


def test_empty_tensors_and_a_repeated_signature_reuse_checked_descriptors() -> None:
    c = codec()
    for _ in range(3):
        data = b"".join(bytes(memoryview(p).cast("B")) for p in
                        wire.encode_fast(c, "run", 1, 1, {"x": np.zeros((0, 5), np.float32),
                                                           "mask": np.ones(3, np.uint8)}))
        got = parse(data, c).arrays()
        assert got["x"].shape == (0, 5) and got["mask"].tolist() == [1, 1, 1]


def test_fields_the_binary_header_cannot_hold_fall_back_to_json() -> None:
    c = codec()
    assert wire.encode_fast(c, "run", 1, 1, {}, {"other": 1}) is None
    assert wire.encode_fast(c, "result", 1, 1, {}, timing={"worker_ns": -1}) is None
    assert wire.encode_fast(c, "result", 1, 1, {}, timing={"extra": 1}) is None
    assert wire.encode_fast(c, "ping", 1, 1, {}) is None


@pytest.mark.parametrize("arrays, message", [
    ({"w": np.zeros(1)}, "tensor 'w' is not an input of the loaded stage"),
    ({"x": np.zeros(1, np.complex64)}, "not on the wire's whitelist"),
    ({"x": np.zeros((1,) * 33, np.uint8)}, "rank 33 exceeds 32"),
])
def test_the_writer_refuses_what_the_reader_would(arrays, message: str) -> None:
    with pytest.raises(wire.ProtocolError, match=re.escape(message)):
        wire.encode_fast(codec(), "run", 1, 1, arrays)


def test_a_binary_frame_without_an_agreement_is_refused() -> None:
    data = frame_bytes("run", {"x": np.zeros(2, np.float32)})
    with pytest.raises(wire.ProtocolError, match=r"binary frame \(XSB1\) where this end expects JSON"):
        wire.parse_frame(data)


# ----------------------------------------------------------------------------- rejects
HEAD = wire.FAST_HEAD
DESC = wire.FAST_TENSOR


def raw_frame(head: bytes, payload: bytes = b"", hlen: int | None = None,
              plen: int | None = None) -> bytes:
    return wire.PREFIX.pack(wire.FAST_MAGIC, len(head) if hlen is None else hlen,
                            len(payload) if plen is None else plen) + head + payload


def desc(index: int = 0, code: int = wire.DTYPE_CODES["float32"], dims=(2,), nbytes=8,
         reserved: int = 0) -> bytes:
    return DESC.pack(index, code, len(dims), reserved, nbytes) + struct.pack(f"<{len(dims)}Q", *dims)


GOOD_RUN = HEAD.pack(1, 0, 1, 1, 5) + desc()
CASES = [
    ("prefix hlen", raw_frame(b"\0" * 8), "binary frame header length 8 is outside [16,"),
    ("kind", raw_frame(HEAD.pack(3, 0, 0, 1, 5)), "kind 3 is not run (1) or result (2)"),
    ("run flags", raw_frame(HEAD.pack(1, 2, 0, 1, 5)), "binary run frame: unknown flags 0x02"),
    ("result flags", raw_frame(HEAD.pack(2, 8, 0, 1, 5) + bytes(24)),
     "binary result frame: unknown flags 0x08"),
    ("gen", raw_frame(HEAD.pack(1, 0, 0, 0, 5)), "gen 0 is not in [1, 2^32)"),
    ("id", raw_frame(HEAD.pack(1, 0, 0, 1, 1 << 63)), "id 9223372036854775808 is not in [0, 2^63)"),
    ("timing", raw_frame(HEAD.pack(2, 0, 0, 1, 5) + bytes(8)),
     "shorter than its 40-byte fixed part with timing"),
    ("count", raw_frame(HEAD.pack(1, 0, 4, 1, 5)), "4 tensors, the loaded stage has 3 inputs"),
    ("descriptor", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + bytes(5)), "tensor 0: descriptor cut short"),
    ("index", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(index=3), bytes(8)),
     "tensor 0: index 3 is past the loaded stage's 3 names"),
    ("duplicate", raw_frame(HEAD.pack(1, 0, 2, 1, 5) + desc() + desc(), bytes(16)),
     "tensor 'x' (index 0) appears twice"),
    ("dtype code", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(code=99), bytes(8)),
     "tensor 'x': dtype code 99 is not in the wire's table"),
    ("dtype code 0", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(code=0), bytes(8)),
     "dtype code 0 is not in the wire's table"),
    ("rank", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(dims=(1,) * 33, nbytes=4), bytes(4)),
     "tensor 'x': rank 33 exceeds 32"),
    ("reserved", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(reserved=1), bytes(8)),
     "reserved field is 1, not 0"),
    ("dims cut", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc()[:-3], bytes(8)),
     "tensor 'x': 1 dims cut short"),
    ("dim", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(dims=((1 << 40) + 1,)), bytes(8)),
     "dimension 1099511627777 is over 2^40"),
    ("span", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(dims=(0, 1 << 40, 1 << 40), nbytes=0)),
     "spans more than 2^63 - 1 bytes"),
    ("nbytes", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(nbytes=12), bytes(12)),
     "nbytes 12 != prod(shape) * itemsize = 8"),
    ("past payload", raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(), bytes(4)),
     "tensor 'x' ends at byte 8, past the payload's 4"),
    ("trailing header", raw_frame(GOOD_RUN + b"\0", bytes(8)),
     "header is 41 bytes, its fields end at byte 40"),
    ("coverage", raw_frame(GOOD_RUN, bytes(12)), "tensors cover 8 bytes of a 12-byte payload"),
    ("frame length", raw_frame(GOOD_RUN, bytes(8))[:-1], "frame holds"),
]


@pytest.mark.parametrize("field, data, message", CASES, ids=[c[0] for c in CASES])
def test_each_malformed_field_is_refused_by_name(field: str, data: bytes, message: str) -> None:
    with pytest.raises(wire.ProtocolError, match=re.escape(message)):
        parse(data).arrays()


def test_a_well_formed_hand_built_frame_is_accepted() -> None:
    f = parse(raw_frame(GOOD_RUN, np.array([1.5, 2.5], np.float32).tobytes()))
    assert f.arrays()["x"].tolist() == [1.5, 2.5]


def test_a_huge_declared_tensor_is_refused_before_any_allocation() -> None:
    """The payload limit is the prefix's, before the header; the header's claims are
    checked against the payload length before anything is read or allocated."""
    huge = raw_frame(HEAD.pack(1, 0, 1, 1, 5) + desc(dims=(1 << 40,), nbytes=4 << 40),
                     plen=4 << 40)
    with pytest.raises(wire.ProtocolError, match="payload length 4398046511104 exceeds"):
        wire.parse_frame(huge, max_payload=1 << 20, codec=codec())
    a, b = socket.socketpair()
    a.sendall(huge)
    a.close()
    b.settimeout(10)
    with pytest.raises(wire.ProtocolError, match="exceeds the limit"):
        wire.recv_frame(b, max_payload=1 << 30, codec=codec())


# ----------------------------------------------------------------------------- fuzz
def _fuzz(n: int):  # type: ignore[no-untyped-def]
    return settings(max_examples=fuzz_examples(n), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


VALID = [
    frame_bytes("run", {"x": np.arange(6, dtype=np.float32).reshape(2, 3),
                        "ids": np.arange(3, dtype=np.int64)}),
    frame_bytes("result", {"y": np.arange(4, dtype=np.float16), "z": np.zeros((0, 2), bool)},
                timing=dict(TIMING, state_reset=False)),
    frame_bytes("run", {}, options={"reset_state": True}),
]


def decode_or_refuse(data: bytes) -> wire.Frame | None:
    try:
        frame = parse(bytes(data))
    except wire.ProtocolError:
        return None
    frame.arrays()
    return frame


@_fuzz(3000)
@given(st.data())
def test_fuzz_mutated_binary_frames_are_refused_with_protocol_error_only(data) -> None:  # type: ignore[no-untyped-def]
    frame = bytearray(data.draw(st.sampled_from(VALID)))
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["flip", "byte", "cut", "insert", "delete", "word"]))
        at = data.draw(st.integers(0, max(0, len(frame) - 1)))
        if how == "flip" and frame:
            frame[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "byte" and frame:
            frame[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del frame[at:]
        elif how == "insert":
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        elif how == "delete" and frame:
            del frame[at:at + data.draw(st.integers(1, 9))]
        elif how == "word" and len(frame) >= at + 8:
            frame[at:at + 8] = struct.pack("<Q", data.draw(st.sampled_from(
                [0, 1, 2**16 - 1, 2**31, 2**32 - 1, 2**40, 2**40 + 1, 2**63 - 1, 2**63, 2**64 - 1])))
    decode_or_refuse(bytes(frame))


@_fuzz(1000)
@given(st.binary(max_size=200), st.integers(0, 300), st.integers(0, 300))
def test_fuzz_arbitrary_binary_headers(head: bytes, hlen: int, plen: int) -> None:
    decode_or_refuse(raw_frame(head, bytes(min(plen, 64)), hlen=hlen, plen=plen))


@st.composite
def call(draw):  # type: ignore[no-untyped-def]
    out = {}
    for name in draw(st.lists(st.sampled_from(INPUTS), unique=True, max_size=3)):
        tag = draw(st.sampled_from([t for t in wire.DTYPES if t != "bfloat16"]))
        dt = wire.dtype_of_tag(tag)
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
        n = int(np.prod(shape, dtype=np.int64))
        raw = draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize))
        a = (np.frombuffer(raw, np.uint8) & 1).astype(bool) if tag == "bool" else np.frombuffer(raw, dt)
        a = a.reshape(shape)
        if draw(st.booleans()) and dt.itemsize > 1:
            a = a.byteswap().view(a.dtype.newbyteorder(">"))
        out[name] = a
    return out


@_fuzz(400)
@given(call())
def test_fuzz_valid_binary_frames_round_trip_bit_exact(arrays) -> None:  # type: ignore[no-untyped-def]
    got = parse(frame_bytes("run", arrays)).arrays()
    assert list(got) == list(arrays)
    for name, a in arrays.items():
        assert got[name].shape == a.shape and np.array_equal(bits(got[name]), bits(a))


# ----------------------------------------------------------------------------- channel


def _pair():  # type: ignore[no-untyped-def]
    return channel_pair(SECRET)


@pytest.mark.parametrize("n", [16, 300_000], ids=["one record", "payload records"])
def test_binary_frames_travel_as_records_both_ways(n: int) -> None:
    client, worker, _, _ = _pair()
    c = codec()
    x = np.arange(n, dtype=np.float32)
    for _ in range(2):
        t = threading.Thread(target=client.send_parts,
                             args=(wire.encode_fast(c, "run", 4, 1, {"x": x}),))
        t.start()
        got = worker.recv(codec=c)
        t.join()
        assert got.fast and got.id == 4 and np.array_equal(got.arrays()["x"], x)
        t = threading.Thread(target=worker.send_parts,
                             args=(wire.encode_fast(c, "result", 4, 1, {"y": x}, timing=TIMING),))
        t.start()
        got = client.recv(codec=c)
        t.join()
        assert got.header["timing"] == TIMING and np.array_equal(got.arrays()["y"], x)


def _records(n: int, frames: int = 1):  # type: ignore[no-untyped-def]
    """A channel pair, and the records of ``frames`` binary runs the client wrote (muted)."""
    tx, rx, a, b = _pair()
    a.mute = True
    c = codec()
    out = []
    for rid in range(1, frames + 1):
        del a.sends[:]
        tx.send_parts(wire.encode_fast(c, "run", rid, 1, {"x": np.arange(n, dtype=np.float32)}))
        out += cut_records(b"".join(a.sends))
    return out, rx, a, b


def _read_after(records: list[bytes], rx, a, b, frames: int, **kw) -> None:  # type: ignore[no-untyped-def]
    """Send ``records`` from ``a`` (on a thread, then close it) while ``rx`` reads ``frames``
    + 1 frames (``kw``: ``recv``'s codec and expectation, else a fresh codec)."""
    def write() -> None:
        try:
            a.sock.sendall(b"".join(records))
            a.sock.close()
        except OSError:
            pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(frames + 1):
            got = rx.recv(**(kw or {"codec": codec()}))
            assert "expect" not in kw or got is kw["expect"]
    finally:
        b.sock.close()
        writer.join(10)


@pytest.mark.parametrize("n", [16, (3 * wire.CHUNK_BYTES + 4096) // 4], ids=["small", "large"])
@pytest.mark.parametrize("attack, check", [
    ("tamper", "frame integrity check failed (mac)"),
    ("inject", "frame integrity check failed (mac)"),
    ("replay", "frame sequence check failed (replay)"),
    ("reorder", "frame sequence check failed (reorder)"),
])
def test_attacks_on_binary_records_fail_closed_by_name(n: int, attack: str, check: str) -> None:
    records, rx, a, b = _records(n, 2)
    per = len(records) // 2
    if attack == "tamper":  # a byte of the binary header: the request id
        bad = bytearray(records[0])
        bad[wire.PREFIX.size + 8] ^= 1
        records[0] = bytes(bad)
    elif attack == "inject":  # a binary frame sealed with no key, in front
        forged = b"".join(bytes(memoryview(p).cast("B")) for p in
                          wire.encode_fast(codec(), "run", 1, 1, {"x": np.zeros(4, np.float32)}))
        records.insert(0, forged + wire.COUNTER.pack(0) + bytes(wire.TAG_BYTES))
    elif attack == "replay":  # the first frame again in place of the second
        records = records[:per] + records[:per]
    elif per > 2:  # two payload records swapped
        records[1], records[2] = records[2], records[1]
    else:  # the second frame first
        records = records[per:] + records[:per]
    with pytest.raises(wire.ProtocolError, match=re.escape(check)):
        _read_after(records, rx, a, b, 2)


# ------------------------------------------------------------------- a signature's kept frame
LANE_CASES = [
    ("run", {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, None),
    ("run", {"ids": np.array([5, -1], np.int64), "x": np.zeros((0, 3), np.float32),
             "mask": np.ones((2, 1, 2), bool)}, None),
    ("result", {"y": np.float16(1.5) * np.ones((4,), np.float16)}, (7, 8, 9)),
    ("result", {"z": np.array(3, np.uint8), "y": np.arange(5, dtype=np.float64)},
     (2**64 - 1, 0, 10**12)),
]


@pytest.mark.parametrize("op, arrays, timing", LANE_CASES)
def test_a_signatures_kept_frame_is_the_frame_encode_writes(op: str, arrays, timing) -> None:  # type: ignore[no-untyped-def]
    """``_Lane``: the id and timing packed in, the tensors copied in; byte for byte the
    frame ``encode_fast`` makes, call after call (its buffer is reused)."""
    c = codec()
    kind = {"run": wire.FAST_RUN, "result": wire.FAST_RESULT}[op]
    lane = c.lane(kind, 3, arrays)
    assert lane is not None and c.lane(kind, 3, arrays) is lane
    for rid in (1, 2**63 - 1, 42):
        arrays = {k: np.asarray(v + 1 if v.dtype != bool else v, v.dtype).reshape(v.shape)
                  for k, v in arrays.items()}
        want = wire.encode_fast(c, op, rid, 3, arrays, timing=None if timing is None else dict(
            zip(("worker_ns", "rss", "peak"), timing, strict=True)))
        lane.fill(rid, arrays, timing)
        assert bytes(lane.frame) == b"".join(bytes(memoryview(p).cast("B")) for p in want)
        assert parse(bytes(lane.frame), c).id == rid


def test_a_kept_frame_is_only_for_bytes_that_go_as_they_are() -> None:
    """Big-endian tensors, unknown names, non-arrays: no lane (the long way converts or names
    the problem). An array of the signature that is not C-contiguous, or an id past 2^63, makes
    ``fill`` raise before anything is sent (the caller takes the long way)."""
    c = codec()
    assert c.lane(wire.FAST_RUN, 1, {"x": np.arange(4, dtype=">f4")}) is None
    assert c.lane(wire.FAST_RUN, 1, {"nope": np.arange(4, dtype="<f4")}) is None
    assert c.lane(wire.FAST_RUN, 1, {"x": [1.0, 2.0]}) is None
    assert c.lane(wire.FAST_RUN, 1, {"x": np.zeros(70_000, np.uint8)}) is None  # over one record
    lane = c.lane(wire.FAST_RUN, 1, {"x": np.zeros((4, 4), np.float32)})
    with pytest.raises((ValueError, TypeError, BufferError)):
        lane.fill(1, {"x": np.zeros((4, 8), np.float32)[:, ::2]})
    with pytest.raises(struct.error):
        lane.fill(2**63, {"x": np.zeros((4, 4), np.float32)})


@pytest.mark.parametrize("op, arrays, timing", LANE_CASES)
def test_a_kept_frame_filled_for_its_own_signature_is_the_frame_fill_writes(op: str, arrays, timing) -> None:  # type: ignore[no-untyped-def]
    """``_Lane.fill_same``: for arrays of the lane's signature, the bytes ``fill`` writes;
    for anything else (a name, its order, a dtype, a shape, not an array, one tensor more or
    less) None, and the next fill of the signature is whole again."""
    c = codec()
    kind = {"run": wire.FAST_RUN, "result": wire.FAST_RESULT}[op]
    lane = c.lane(kind, 3, arrays)
    first = next(iter(arrays))
    a0 = arrays[first]
    bads = [
        {("w" if k == first else k): v for k, v in arrays.items()},  # another name
        {**arrays, first: a0.astype(np.int32 if a0.dtype != np.int32 else np.int16)},
        {**arrays, first: a0.reshape(-1) if a0.ndim != 1 else a0.reshape(1, -1)},
        {**arrays, first: a0.tolist()},  # not an array
        {**arrays, "extra": a0},
        {k: v for k, v in arrays.items() if k != first},  # one less
    ]
    if len(arrays) > 1:
        bads.append(dict(reversed(list(arrays.items()))))  # another order
    for bad in bads:
        assert lane.fill_same(9, bad, timing) is None
    for rid in (1, 2**63 - 1, 42):
        arrays = {k: np.asarray(v + 1 if v.dtype != bool else ~v, v.dtype).reshape(v.shape)
                  for k, v in arrays.items()}
        assert lane.fill_same(rid, arrays, timing) is lane
        want = bytes(lane.frame)
        assert bytes(lane.fill(rid, arrays, timing).frame) == want
        want_parts = wire.encode_fast(c, op, rid, 3, arrays, timing=None if timing is None else dict(
            zip(("worker_ns", "rss", "peak"), timing, strict=True)))
        assert want == b"".join(bytes(memoryview(p).cast("B")) for p in want_parts)
    with pytest.raises(struct.error):
        lane.fill_same(2**63, arrays, timing)


def test_a_kept_frame_filled_for_its_signature_refuses_what_fill_refuses() -> None:
    c = codec()
    lane = c.lane(wire.FAST_RUN, 1, {"x": np.zeros((4, 4), np.float32)})
    with pytest.raises((ValueError, TypeError, BufferError)):
        lane.fill_same(1, {"x": np.zeros((4, 8), np.float32)[:, ::2]})
    with pytest.raises(TypeError, match="a run frame carries no timing"):
        lane.fill_same(1, {"x": np.zeros((4, 4), np.float32)}, (1, 2, 3))
    assert lane.fill_same(1, {"x": np.zeros((4, 4), ">f4")}) is None  # another dtype


def test_a_sealed_kept_frame_is_the_record_send_parts_makes() -> None:
    """``Channel.send_sealed``: the same bytes on the wire as ``send_parts`` of the encoded
    frame (counter and tag included), and the reader takes both."""
    c = codec()
    x = np.arange(16, dtype=np.float32)
    tx, rx, a, _ = _pair()
    lane = c.lane(wire.FAST_RUN, 1, {"x": x})
    for rid in (1, 2):
        tx.send_parts(wire.encode_fast(c, "run", rid, 1, {"x": x}))
        got = rx.recv(codec=c)
        assert got.id == rid and np.array_equal(got.arrays()["x"], x)
    tx2, rx2, a2, _ = _pair()
    tx2._seal_mac, rx2._check_mac = tx._seal_mac, rx._check_mac  # one key, to compare bytes
    tx2.sent = rx2.received = 0
    for rid in (1, 2):
        tx2.send_sealed(lane.fill(rid, {"x": x}))
        got = rx2.recv(codec=c)
        assert got.id == rid and np.array_equal(got.arrays()["x"], x)
    assert a2.sends == a.sends


# --------------------------------------------------------- a signature's expected frame
def _expecting(op: str, arrays, gen: int = 3):  # type: ignore[no-untyped-def]
    """A codec, a channel pair, the signature's lane and its ``_Expect``, made from a first
    frame read the long way."""
    c = codec()
    kind = {"run": wire.FAST_RUN, "result": wire.FAST_RESULT}[op]
    tx, rx, a, b = _pair()
    tx.send_parts(wire.encode_fast(c, op, 1, gen, arrays, timing=TIMING if op == "result" else None))
    first = rx.recv(codec=c)
    exp = c.expect(kind, gen, first.tensors, len(first.payload))
    assert exp is not None
    return c, tx, rx, c.lane(kind, gen, arrays), exp


EXPECT_CASES = [
    ("run", {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, None),
    ("run", {"ids": np.array([5, -1], np.int64), "mask": np.ones((2, 1, 2), bool)}, None),
    ("result", {"y": np.arange(5, dtype=np.float64)}, (7, 8, 9)),
    ("result", {"z": np.array(3, np.uint8), "y": np.ones((2, 2), np.float16)},
     (2**64 - 1, 0, 10**12)),
]


@pytest.mark.parametrize("op, arrays, timing", EXPECT_CASES)
def test_an_expected_frame_is_read_as_the_long_way_reads_it(op: str, arrays, timing) -> None:  # type: ignore[no-untyped-def]
    """``Channel.recv(expect=)``: the signature's frame comes back as the expectation, its id,
    timing and payload those the long way decodes from the same bytes; its fixed bytes are
    the frame's own; one record consumed per frame, the stream in step after it."""
    c, tx, rx, lane, exp = _expecting(op, arrays)
    for i, rid in enumerate((2, 2**63 - 1, 5)):
        arrays = {k: np.asarray(v + i if v.dtype != bool else v, v.dtype).reshape(v.shape)
                  for k, v in arrays.items()}
        lane.fill(rid, arrays, timing)
        data = bytes(lane.frame)
        assert data[:len(exp.fixed)] == exp.fixed
        assert data[exp.descs_at:exp.descs_at + len(exp.descs)] == exp.descs
        want = parse(data, c)
        exp.rid = rid if op == "result" else None
        received = rx.received
        tx.send_sealed(lane)
        got = rx.recv(codec=c, expect=exp)
        assert got is exp and rx.received == received + 1
        assert exp.fields[0] == want.id == rid
        if op == "result":
            assert dict(zip(("worker_ns", "rss", "peak"), exp.fields[1:], strict=True)) \
                == want.header["timing"]
        assert bytes(exp.payload) == bytes(want.payload) and type(exp.payload) is bytearray
    tx.send({"op": "pong", "id": 9})  # the next frame, of another kind: the long way
    assert rx.recv(codec=c, expect=exp).op == "pong"


OFF_CASES = ["another id", "another generation", "another shape", "reset_state", "JSON frame",
             "in pieces"]


@pytest.mark.parametrize("case", OFF_CASES)
def test_a_frame_off_the_expectation_is_read_the_long_way(case: str) -> None:
    """Any frame but the expected one comes back as a Frame, decoded as without the
    expectation (the caller's checks name the difference); a record that arrives in pieces
    is still read whole; the next expected frame is taken as ever."""
    x = np.arange(16, dtype=np.float32)
    c, tx, rx, lane, exp = _expecting("run", {"x": x})
    exp.rid = 4
    if case == "another id":
        tx.send_sealed(lane.fill(5, {"x": x}))
        got = rx.recv(codec=c, expect=exp)
        assert got is not exp and got.id == 5 and got.header["gen"] == 3
    elif case == "another generation":
        tx.send_parts(wire.encode_fast(c, "run", 4, 2, {"x": x}))
        got = rx.recv(codec=c, expect=exp)
        assert got is not exp and got.header["gen"] == 2
    elif case == "another shape":
        tx.send_parts(wire.encode_fast(c, "run", 4, 3, {"x": x.reshape(4, 4)}))
        got = rx.recv(codec=c, expect=exp)
        assert got is not exp and got.arrays()["x"].shape == (4, 4)
    elif case == "reset_state":
        tx.send_parts(wire.encode_fast(c, "run", 4, 3, {"x": x}, {"reset_state": True}))
        got = rx.recv(codec=c, expect=exp)
        assert got is not exp and got.header["options"] == {"reset_state": True}
    elif case == "JSON frame":
        tx.send({"op": "run", "id": 4, "gen": 3}, {"x": x})
        got = rx.recv(codec=c, expect=exp)
        assert got is not exp and not got.fast and got.id == 4
    else:  # the record's first 20 bytes, the rest 50 ms later
        lane.fill(4, {"x": x})
        a = tx.sock
        real = a.sock

        class Split:
            def sendall(self, data: bytes) -> None:
                real.sendall(bytes(data[:20]))
                threading.Timer(0.05, real.sendall, (bytes(data[20:]),)).start()

        tx.sock = Split()
        tx.send_sealed(lane)
        tx.sock = a
        assert rx.recv(codec=c, expect=exp) is exp and exp.fields == (4,)
    exp.rid = None
    tx.send_sealed(lane.fill(6, {"x": x + 1}))
    assert rx.recv(codec=c, expect=exp) is exp and exp.fields == (6,)
    assert np.frombuffer(exp.payload, np.float32).tolist() == (x + 1).tolist()


def test_an_expected_frame_keeps_the_id_range_check() -> None:
    """An id past 2^63 (the kept frame refuses to write one) fails as the long way names it,
    with or without an expectation."""
    x = np.arange(16, dtype=np.float32)
    c, tx, rx, lane, exp = _expecting("run", {"x": x})
    data = bytearray(lane.fill(7, {"x": x}).frame)
    wire._U64_AT.pack_into(data, wire.PREFIX.size + 8, 1 << 63)
    tx.send_parts([bytes(data)])
    with pytest.raises(wire.ProtocolError, match=re.escape("id 9223372036854775808 is not in")):
        rx.recv(codec=c, expect=exp)


def test_an_expectation_is_only_for_what_it_was_made_for() -> None:
    """Another codec's frames, a smaller payload limit, or no codec at all: the long way."""
    x = np.arange(16, dtype=np.float32)
    c, tx, rx, lane, exp = _expecting("run", {"x": x})
    tx.send_sealed(lane.fill(8, {"x": x}))
    got = rx.recv(codec=codec(), expect=exp)
    assert got is not exp and got.id == 8
    for kw, message in [({"codec": c, "max_payload": 8}, "payload length 64 exceeds the limit 8"),
                        ({"codec": None}, "binary frame (XSB1) where this end expects JSON")]:
        tx.send_sealed(lane.fill(8, {"x": x}))
        with pytest.raises(wire.ProtocolError, match=re.escape(message)):
            rx.recv(expect=exp, **kw)
        c, tx, rx, lane, exp = _expecting("run", {"x": x})
    assert c.expect(wire.FAST_RUN, 0, exp.tensors, exp.plen) is None  # gen 0
    assert c.expect(wire.FAST_RUN, 1, exp.tensors, exp.plen + 4) is None  # tensors != payload
    assert c.expect(wire.FAST_RESULT, 1, exp.tensors, exp.plen) is None  # x is not an output


@pytest.mark.parametrize("attack, check", [
    ("tamper id", "frame integrity check failed (mac)"),
    ("tamper payload", "frame integrity check failed (mac)"),
    ("inject", "frame integrity check failed (mac)"),
    ("replay", "frame sequence check failed (replay)"),
    ("reorder", "frame sequence check failed (reorder)"),
])
def test_attacks_on_expected_records_fail_closed_by_name(attack: str, check: str) -> None:
    """With an expectation, a tampered, injected, replayed or reordered record fails with
    the same check name as without one."""
    records, rx, a, b = _records(16, 2)
    c = codec()
    exp = c.expect(wire.FAST_RUN, 1, parse(records[0][:-wire.TRAILER_BYTES], c).tensors, 64)
    assert exp is not None
    if attack.startswith("tamper"):
        bad = bytearray(records[0])
        bad[wire.PREFIX.size + 8 if attack == "tamper id" else -wire.TRAILER_BYTES - 1] ^= 1
        records[0] = bytes(bad)
    elif attack == "inject":
        forged = b"".join(bytes(memoryview(p).cast("B")) for p in
                          wire.encode_fast(c, "run", 1, 1, {"x": np.zeros(16, np.float32)}))
        records.insert(0, forged + wire.COUNTER.pack(0) + bytes(wire.TAG_BYTES))
    elif attack == "replay":
        records = records[:1] + records[:1]
    else:
        records = records[1:] + records[:1]

    with pytest.raises(wire.ProtocolError, match=re.escape(check)):
        _read_after(records, rx, a, b, 2, codec=c, expect=exp)
