"""Hypothesis fuzz of the decoder: thousands of inputs, and nothing but ``ProtocolError``.

Inputs come in layers, each reaching deeper into ``parse_frame``: arbitrary bytes (stop at
the prefix), the magic plus arbitrary bytes (the length checks), consistent lengths around
arbitrary header bytes (UTF-8 and JSON), JSON headers built from field names and edge values
(op, id, fields, tensor descriptors), and valid frames with mutations (bit flips,
truncations, insertions, deletions, numbers swapped in the header). Valid frames built from
random tensors must round-trip bit-exact.
"""

import json
import re
import socket
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import fuzz_examples
from xstage_remote import wire

TAGS = list(wire.DTYPES)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def fuzz(n):
    """Settings for a fuzz test of ``n`` examples (no deadline: CI machines are slow)."""
    return settings(max_examples=fuzz_examples(n), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def decode_or_refuse(data, **kw):
    """``parse_frame``; ``None`` when refused. Any other exception fails the test."""
    try:
        frame = wire.parse_frame(data, **kw)
    except wire.ProtocolError:
        return None
    frame.arrays()
    return frame


def bits(a):
    """Raw bits in C order as unsigned integers of the itemsize (big-endian swapped first)."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.view(UINT[a.dtype.itemsize])


# ----------------------------------------------------------------------------- strategies

@st.composite
def tensor(draw):
    """One array of a whitelisted dtype with random bits and a random memory layout."""
    tag = draw(st.sampled_from(TAGS))
    dt = wire.dtype_of_tag(tag)
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=5)))
    n = int(np.prod(shape, dtype=np.int64))
    raw = draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize))
    if tag == "bool":
        arr = (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    else:
        arr = np.frombuffer(raw, dt).reshape(shape).copy()
    layout = draw(st.sampled_from(["c", "fortran", "transposed", "reversed", "strided",
                                   "big_endian", "big_endian_reversed"]))
    if layout == "fortran":
        arr = np.asfortranarray(arr)
    elif layout == "transposed":
        arr = arr.T
    elif layout in ("reversed", "big_endian_reversed") and arr.ndim:
        arr = arr[::-1]
    elif layout == "strided" and arr.ndim:
        arr = np.repeat(arr, 2, axis=-1)[..., ::2]
    if layout.startswith("big_endian") and dt.itemsize > 1:
        arr = arr.byteswap().view(arr.dtype.newbyteorder(">"))
    return arr


names = st.text(min_size=1, max_size=8)


@st.composite
def tensor_maps(draw, max_tensors=4):
    keys = draw(st.lists(names, max_size=max_tensors, unique=True))
    return {k: draw(tensor()) for k in keys}


@st.composite
def valid_frames(draw):
    """(header, arrays, bytes) of a valid run/result frame."""
    header = {"op": draw(st.sampled_from(["run", "result"])),
              "id": draw(st.integers(0, 2**63 - 1))}
    arrays = draw(tensor_maps())
    data = b"".join(bytes(p) for p in wire.encode_frame(header, arrays))
    return header, arrays, data


#: Values that sit on the edges of the checks.
EDGE_INTS = [-(2**63), -1, 0, 1, 2, 3, 4, 8, 16, 32, 33, 1024, 1025, 4096, 4097, 2**31,
             2**32, 2**40, 2**40 + 1, 2**63 - 1, 2**63, 2**64]
json_scalars = st.one_of(
    st.sampled_from(EDGE_INTS), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(), st.none(), st.text(max_size=6), st.sampled_from(TAGS + ["complex64", "<f4"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
FIELD_NAMES = sorted({k for spec in wire.OPS.values() for k in spec} | {"op", "id", "x"})


VALUES_OF = {dict: st.dictionaries(st.text(max_size=4), json_scalars, max_size=3),
             list: st.lists(json_scalars, max_size=3), str: st.text(max_size=8),
             int: st.integers(0, 3)}


def sometimes(draw, n=5):
    """True about once in ``n`` draws: how often a strategy below breaks a rule."""
    return draw(st.integers(0, n - 1)) == 0


HOSTILE_SHAPES = [[1] * 33, [0, 2**40, 2**40], [2**40, 2**40], [2**40 + 1], [-1, -1],
                  [8, 5, 5581, 8681, 49477, 384773], [0] * 32]


@st.composite
def descriptor_lists(draw):
    """(descs, payload_len): a valid tensor list, then 0-3 fields broken on purpose."""
    descs, offset = [], 0
    for i in range(draw(st.integers(0, 4))):
        tag = draw(st.sampled_from(TAGS))
        shape = draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4))
        nbytes = int(np.prod(shape, dtype=object)) * wire.DTYPES[tag][1]
        descs.append({"name": f"t{i}", "dtype": tag, "shape": shape, "offset": offset,
                      "nbytes": nbytes})
        offset += nbytes
    for _ in range(draw(st.integers(0, 3))):
        if not descs:
            break
        d = draw(st.sampled_from(descs))
        key = draw(st.sampled_from(["name", "dtype", "shape", "shape", "offset", "nbytes",
                                    "strides", "del", "hostile_shape"]))
        if key == "hostile_shape":
            d["shape"] = draw(st.sampled_from(HOSTILE_SHAPES))
        elif key == "del":
            d.pop(draw(st.sampled_from(sorted(d))), None)
        elif key == "shape" and isinstance(d.get("shape"), list) and d["shape"] \
                and draw(st.booleans()):
            d["shape"][draw(st.integers(0, len(d["shape"]) - 1))] = draw(
                st.one_of(st.sampled_from(EDGE_INTS), json_scalars))
        else:
            d[key] = draw(st.one_of(st.sampled_from(EDGE_INTS + ["x", "t0", "", "bfloat16"]),
                                    json_values))
    if sometimes(draw, 8):
        descs.append(draw(json_values))
    plen = offset if not sometimes(draw) else draw(st.sampled_from([0, 1, 8, offset + 1]))
    return descs, plen


@st.composite
def json_headers(draw):
    """(header, payload_len): mostly right op, id and fields, with rules broken at random."""
    op = draw(st.sampled_from(sorted(wire.OPS) + ["run", "result"] * 4))
    h = {"op": op if not sometimes(draw, 12) else draw(json_values)}
    if not sometimes(draw, 12):
        h["id"] = draw(st.one_of(st.integers(0, 2**63 - 1), st.sampled_from(EDGE_INTS))
                       if not sometimes(draw, 6) else json_values)
    plen = 0
    for key, (typ, required) in wire.OPS.get(op, {}).items():
        if key == "t":
            h["t"], plen = draw(descriptor_lists())
        elif sometimes(draw, 10):
            continue  # drop the field
        elif required or draw(st.booleans()):
            h[key] = draw(VALUES_OF[typ] if not sometimes(draw, 10) else json_values)
    if sometimes(draw, 10):
        h[draw(st.sampled_from(FIELD_NAMES))] = draw(json_values)
    if sometimes(draw, 10):
        plen = draw(st.integers(0, 64))
    return h, plen


# ----------------------------------------------------------------------------- fuzz


@fuzz(1500)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data):
    """(a) Arbitrary bytes: refused with ProtocolError (almost all at the magic)."""
    decode_or_refuse(data)


@fuzz(1500)
@given(st.binary(max_size=300))
def test_fuzz_magic_then_arbitrary_bytes(data):
    """(a) The magic, then arbitrary bytes: reaches the length checks."""
    decode_or_refuse(b"XSW1" + data)


@fuzz(1500)
@given(st.binary(min_size=0, max_size=200), st.binary(max_size=64),
       st.one_of(st.none(), st.integers(0, 2**32 - 1)), st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_fuzz_arbitrary_header_bytes(header, payload, hlen, plen):
    """(a) Lengths mostly consistent, header bytes arbitrary: reaches UTF-8 and JSON."""
    hlen = len(header) if hlen is None else hlen
    plen = len(payload) if plen is None else plen
    decode_or_refuse(struct.pack("<4sIQ", b"XSW1", hlen, plen) + header + payload)


@fuzz(2000)
@given(json_headers())
def test_fuzz_json_headers(case):
    """(a) JSON headers from real field names and edge values: reaches op, id, fields, tensors."""
    header, plen = case
    raw = json.dumps(header).encode()
    data = struct.pack("<4sIQ", b"XSW1", len(raw), plen) + raw + bytes(plen)
    decode_or_refuse(data)


NUMBER = re.compile(rb"-?\d+")
SWAPS = [b"0", b"-1", b"1", b"8", b"2", b"33", b"1e999", b"4.0", b"true", b"null", b"[]", b"{}",
         b"4294967296", b"18446744073709551616", b"1099511627777", b'"x"', b"NaN"]


@st.composite
def mutated_frames(draw):
    """A valid frame with 1-4 mutations; lengths in the prefix are sometimes fixed up."""
    _, _, data = draw(valid_frames())
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite",
                                     "swap_number", "swap_number", "swap_number"]))
        hend = 16 + struct.unpack_from("<I", data, 4)[0] if len(data) >= 16 else len(data)
        # Mostly aim at the header, where most checks are.
        region = draw(st.sampled_from(["header", "header", "header", "prefix", "anywhere"]))
        if region == "header" and min(hend, len(data)) > 16:
            pos = draw(st.integers(16, min(hend, len(data)) - 1))
        elif region == "prefix":
            pos = draw(st.integers(0, max(min(16, len(data)) - 1, 0)))
        else:
            pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[pos:pos + len(chunk)] = chunk
        elif kind == "swap_number" and len(data) >= 16:
            matches = list(NUMBER.finditer(bytes(data[16:hend])))
            if matches:
                m = draw(st.sampled_from(matches))
                swap = draw(st.sampled_from(SWAPS))
                data[16 + m.start():16 + m.end()] = swap
                if draw(st.booleans()):  # keep the header length consistent
                    hlen = hend - 16 - (m.end() - m.start()) + len(swap)
                    data[4:8] = struct.pack("<I", hlen)
    if draw(st.booleans()) and len(data) >= 16:
        # Fix the payload length so the frame's total length agrees with its prefix.
        hlen = struct.unpack_from("<I", data, 4)[0]
        data[8:16] = struct.pack("<Q", max(len(data) - 16 - hlen, 0))
    return bytes(data)


@fuzz(2500)
@given(mutated_frames())
def test_fuzz_mutated_valid_frames(data):
    """(b) Valid frames with bit flips, truncations, insertions: ProtocolError or a frame."""
    decode_or_refuse(data)


@fuzz(1000)
@given(valid_frames())
def test_fuzz_valid_frames_round_trip(case):
    """(c) Valid frames from random tensors decode to the same header, names and bits."""
    header, arrays, data = case
    frame = wire.parse_frame(data)
    assert (frame.op, frame.id) == (header["op"], header["id"])
    got = frame.arrays()
    assert list(got) == list(arrays)
    for name, sent in arrays.items():
        arr = got[name]
        assert arr.shape == sent.shape
        assert arr.dtype == wire.dtype_of_tag(wire.tag_of_dtype(sent.dtype))
        assert arr.flags.c_contiguous
        np.testing.assert_array_equal(bits(arr), bits(sent))


@fuzz(500)
@given(tensor_maps(max_tensors=3))
def test_encode_decode_round_trip_over_socket(arrays):
    """Encode → send over a socketpair → receive: random dtypes, shapes and layouts, bit-exact."""
    a, b = socket.socketpair()
    b.settimeout(10)
    try:
        wire.send_frame(a, {"op": "result", "id": 9}, arrays)
        got = wire.recv_frame(b).arrays()
    finally:
        a.close()
        b.close()
    assert list(got) == list(arrays)
    for name, sent in arrays.items():
        assert got[name].shape == sent.shape and got[name].flags.c_contiguous
        np.testing.assert_array_equal(bits(got[name]), bits(sent))


@fuzz(300)
@given(st.integers(1, 2**41), st.sampled_from(TAGS), st.integers(0, 40))
def test_fuzz_large_claims_need_no_memory(plen, tag, rank):
    """Claims of up to 2^41 payload bytes with all-ones shapes never allocate the claim."""
    shape = [1] * rank
    header = json.dumps({"op": "run", "id": 1, "t": [
        {"name": "x", "dtype": tag, "shape": shape, "offset": 0, "nbytes": plen}]}).encode()
    data = struct.pack("<4sIQ", b"XSW1", len(header), plen) + header
    assert decode_or_refuse(data, max_payload=2**41) is None
