"""Round trips: every whitelisted dtype and every shape class arrives bit-exact.

Each case runs twice through the ``transport`` fixture: in memory (``encode_frame`` →
``parse_frame``) and over a real ``socket.socketpair()`` (``send_frame`` → ``recv_frame``).
Values are compared as raw bits (``.view(uintN)``), so NaN payloads and signed zeros count.
"""

import ml_dtypes
import numpy as np
import pytest

from xstage_remote import wire

TAGS = list(wire.DTYPES)
FLOAT_TAGS = ["float16", "bfloat16", "float32", "float64"]
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def native(tag):
    """The dtype a decoded tensor of ``tag`` has."""
    return wire.dtype_of_tag(tag)


def random_array(tag, shape, seed=0):
    """C-contiguous array of ``tag`` filled with random bits (0/1 for bool)."""
    rng = np.random.default_rng(seed)
    if tag == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    dt = native(tag)
    n = int(np.prod(shape, dtype=np.int64))
    return rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)


def bits(a):
    """The array's raw bits in C order, as unsigned integers of its itemsize."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.view(UINT[a.dtype.itemsize])


def big_endian(a):
    """The same values as ``a``, held in a big-endian array (bit-level swap, no casts)."""
    return a.byteswap().view(a.dtype.newbyteorder(">"))


def assert_bit_exact(got, want, tag):
    """Same dtype (the tag's native one), same shape, same bits, C-contiguous."""
    assert got.dtype == native(tag)
    assert got.shape == want.shape
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(bits(got), bits(want))


def run_header(rid=1):
    return {"op": "run", "id": rid}


# Shape classes: name → function(tag) returning (the array to send, the values expected).
def _scalar(tag):
    a = random_array(tag, ())
    return a, a


def _empty_1d(tag):
    a = random_array(tag, (0,))
    return a, a


def _empty_3d(tag):
    a = random_array(tag, (3, 0, 2))
    return a, a


def _vector(tag):
    a = random_array(tag, (7,))
    return a, a


def _matrix(tag):
    a = random_array(tag, (3, 5))
    return a, a


def _rank32(tag):
    a = random_array(tag, (2,) + (1,) * 30 + (3,))
    return a, a


def _transposed(tag):
    a = random_array(tag, (4, 6)).T
    return a, np.ascontiguousarray(a)


def _fortran_3d(tag):
    a = np.asfortranarray(random_array(tag, (2, 3, 4)))
    return a, np.ascontiguousarray(a)


def _strided(tag):
    a = random_array(tag, (6, 9))[::2, 1::3]
    return a, np.ascontiguousarray(a)


def _negative_strides(tag):
    a = random_array(tag, (4, 6))[::-1, ::-2]
    return a, np.ascontiguousarray(a)


def _broadcast(tag):
    a = np.broadcast_to(random_array(tag, (1, 5)), (3, 5))
    return a, np.ascontiguousarray(a)


def _big_endian(tag):
    a = random_array(tag, (3, 4))
    return big_endian(a), a


def _big_endian_strided(tag):
    a = random_array(tag, (5, 4))
    return big_endian(a)[::-2, 1:], np.ascontiguousarray(a[::-2, 1:])


def _big_endian_scalar(tag):
    a = random_array(tag, ())
    return big_endian(a), a


SHAPES = {
    "scalar": _scalar,
    "empty_1d": _empty_1d,
    "empty_3d": _empty_3d,
    "vector": _vector,
    "matrix": _matrix,
    "rank32": _rank32,
    "transposed": _transposed,
    "fortran_3d": _fortran_3d,
    "strided": _strided,
    "negative_strides": _negative_strides,
    "broadcast": _broadcast,
    "big_endian": _big_endian,
    "big_endian_strided": _big_endian_strided,
    "big_endian_scalar": _big_endian_scalar,
}


@pytest.mark.parametrize("shape_class", list(SHAPES))
@pytest.mark.parametrize("tag", TAGS)
def test_round_trip_is_bit_exact(transport, tag, shape_class):
    """One tensor of this dtype and shape class arrives with the same dtype, shape and bits."""
    sent, want = SHAPES[shape_class](tag)
    frame = transport(run_header(), {"x": sent})
    assert frame.op == "run" and frame.id == 1
    assert_bit_exact(frame.arrays()["x"], want, tag)


# NaN payloads, signalling NaNs, infinities and signed zeros, as raw bit patterns.
SPECIAL_BITS = {
    "float16": [0x7E00, 0x7C01, 0xFE55, 0x7D2A, 0x7C00, 0xFC00, 0x8000, 0x0001],
    "bfloat16": [0x7FC0, 0x7F81, 0xFFAA, 0x7FA5, 0x7F80, 0xFF80, 0x8000, 0x0001],
    "float32": [0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FA5A5A5, 0x7F800000, 0xFF800000,
                0x80000000, 0x00000001],
    "float64": [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8DEADBEEF0001, 0x7FF4000000000ABC,
                0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000, 0x1],
}


def special_floats(tag):
    dt = native(tag)
    return np.array(SPECIAL_BITS[tag], dtype=UINT[dt.itemsize]).view(dt)


@pytest.mark.parametrize("tag", FLOAT_TAGS)
def test_round_trip_keeps_nan_payload_bits(transport, tag):
    """Quiet and signalling NaNs with payloads, ±inf, -0.0 and denormals keep every bit."""
    a = special_floats(tag)
    got = transport(run_header(), {"x": a}).arrays()["x"]
    np.testing.assert_array_equal(bits(got), np.array(SPECIAL_BITS[tag], dtype=bits(a).dtype))


@pytest.mark.parametrize("tag", FLOAT_TAGS)
def test_round_trip_keeps_nan_payload_bits_from_big_endian(transport, tag):
    """The byte-order conversion of a big-endian input does not quieten or alter NaNs."""
    a = special_floats(tag)
    got = transport(run_header(), {"x": big_endian(a)}).arrays()["x"]
    np.testing.assert_array_equal(bits(got), np.array(SPECIAL_BITS[tag], dtype=bits(a).dtype))


def test_round_trip_many_tensors_in_one_frame(transport):
    """Every dtype and shape class at once, in one frame, in order, each bit-exact."""
    sent, want = {}, {}
    for i, tag in enumerate(TAGS):
        for shape_class, make in SHAPES.items():
            name = f"{tag}/{shape_class}"
            sent[name], want[name] = make(tag)
        sent[f"{tag}/extra_empty_{i}"] = random_array(tag, (0, 4))
        want[f"{tag}/extra_empty_{i}"] = random_array(tag, (0, 4))
    frame = transport(run_header(7), sent)
    got = frame.arrays()
    assert list(got) == list(sent)
    for name, arr in got.items():
        assert_bit_exact(arr, want[name], name.split("/")[0])


def test_round_trip_empty_tensor_mapping(transport):
    """A run with no tensors at all carries ``t: []`` and an empty payload."""
    frame = transport(run_header(), {})
    assert frame.header["t"] == [] and frame.arrays() == {} and len(frame.payload) == 0


def test_round_trip_bfloat16_is_ml_dtypes(transport):
    """bfloat16 travels as raw 2-byte data tagged ``bfloat16`` and returns as ml_dtypes."""
    a = np.array([1.0, -2.5, 3.140625], dtype=ml_dtypes.bfloat16)
    frame = transport(run_header(), {"x": a})
    assert frame.header["t"][0]["dtype"] == "bfloat16"
    assert frame.header["t"][0]["nbytes"] == 6
    got = frame.arrays()["x"]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert got.astype(np.float32).tolist() == [1.0, -2.5, 3.140625]


def test_round_trip_scalar_stays_zero_d(transport):
    """A 0-d array arrives as a 0-d array (shape ``()``, not ``(1,)``) of its dtype."""
    got = transport(run_header(), {"s": np.float32(2.5)}).arrays()["s"]
    assert got.shape == () and got.dtype == np.float32 and got[()] == 2.5


def test_round_trip_python_scalars_take_numpy_defaults(transport):
    """Plain Python values go through ``np.asarray`` (bool, int64, float64)."""
    got = transport(run_header(), {"b": True, "i": -3, "f": 0.5}).arrays()
    assert [(a.dtype.name, a.shape, a[()]) for a in got.values()] == [
        ("bool", (), True), ("int64", (), -3), ("float64", (), 0.5)]


def test_round_trip_header_fields(transport):
    """Header fields (nested objects, unicode, the largest id) arrive unchanged."""
    header = {"op": "run", "id": 2**63 - 1,
              "options": {"a": [1, 2.5, "é\u2603", None, True], "b": {"c": -0.0}}}
    frame = transport(header, {"x": np.arange(3, dtype=np.int16)})
    got = dict(frame.header)
    del got["t"]
    assert got == header


def test_round_trip_descriptors_are_laid_end_to_end(transport):
    """Descriptors carry name, dtype, shape, offset and nbytes; offsets are cumulative."""
    frame = transport(run_header(), {"a": np.zeros((2, 3), np.float32),
                                     "b": np.zeros((0,), np.int8),
                                     "c": np.zeros((), np.uint16)})
    assert frame.header["t"] == [
        {"name": "a", "dtype": "float32", "shape": [2, 3], "offset": 0, "nbytes": 24},
        {"name": "b", "dtype": "int8", "shape": [0], "offset": 24, "nbytes": 0},
        {"name": "c", "dtype": "uint16", "shape": [], "offset": 24, "nbytes": 2},
    ]
    assert len(frame.payload) == 26


def test_result_frames_round_trip_like_run_frames(transport):
    """``result`` carries tensors the same way ``run`` does."""
    a = random_array("float32", (4, 4))
    frame = transport({"op": "result", "id": 3, "timing": {"worker_ns": 12}}, {"y": a})
    assert frame.op == "result"
    assert_bit_exact(frame.arrays()["y"], a, "float32")


def test_decoded_arrays_are_writable_views_of_the_payload(in_memory):
    """``Frame.arrays()`` gives writable zero-copy views of the frame's payload."""
    frame = in_memory(run_header(), {"x": np.arange(6, dtype=np.int32)})
    x = frame.arrays()["x"]
    assert x.flags.writeable and np.shares_memory(x, np.frombuffer(frame.payload, np.uint8))


def test_decoded_little_endian_bytes(in_memory):
    """Payload bytes are little-endian whatever the sender's array order was."""
    frame = in_memory(run_header(), {"x": np.array([1], dtype=">u4")})
    assert bytes(frame.payload) == b"\x01\x00\x00\x00"


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview"])
def test_parse_frame_accepts_any_bytes_like(kind):
    """``parse_frame`` takes bytes, bytearray or a memoryview of one frame."""
    data = b"".join(bytes(p) for p in wire.encode_frame(run_header(), {"x": np.ones(3)}))
    data = {"bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data)}[kind]
    assert wire.parse_frame(data).arrays()["x"].tolist() == [1.0, 1.0, 1.0]


def test_two_frames_back_to_back_on_one_socket():
    """``recv_frame`` reads exactly one frame and leaves the next one on the stream."""
    import socket

    a, b = socket.socketpair()
    b.settimeout(10)
    try:
        wire.send_frame(a, {"op": "ping", "id": 1})
        wire.send_frame(a, run_header(2), {"x": np.arange(4, dtype=np.uint8)})
        wire.send_frame(a, {"op": "shutdown", "id": 3})
        got = [wire.recv_frame(b) for _ in range(3)]
    finally:
        a.close()
        b.close()
    assert [(f.op, f.id) for f in got] == [("ping", 1), ("run", 2), ("shutdown", 3)]
    assert got[1].arrays()["x"].tolist() == [0, 1, 2, 3]


def test_large_frame_round_trips_over_socket(over_socket):
    """A 4 MiB payload (larger than the socket buffer) arrives intact over the socketpair."""
    a = random_array("uint8", (4 << 20,), seed=3)
    got = over_socket(run_header(), {"big": a}).arrays()["big"]
    assert np.array_equal(got, a)


@pytest.mark.parametrize("tag", TAGS)
def test_tag_of_dtype_maps_each_whitelisted_dtype(tag):
    """``tag_of_dtype`` and ``dtype_of_tag`` are inverse on the whitelist."""
    assert wire.tag_of_dtype(wire.dtype_of_tag(tag)) == tag


@pytest.mark.parametrize("tag", [t for t in TAGS if wire.DTYPES[t][1] > 1])
def test_tag_of_dtype_ignores_byte_order(tag):
    """A big-endian dtype maps to the same tag (the encoder converts the bytes)."""
    assert wire.tag_of_dtype(native(tag).newbyteorder(">")) == tag


def test_dtype_codes_are_pinned():
    """The small integers shm.py writes into descriptors never change meaning."""
    assert wire.DTYPE_CODES == {
        "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7,
        "uint32": 8, "uint64": 9, "float16": 10, "bfloat16": 11, "float32": 12, "float64": 13,
    }
    assert {c: t for t, c in wire.DTYPE_CODES.items()} == wire.CODE_DTYPES


def test_whitelist_itemsizes():
    """Each whitelisted tag's itemsize is its dtype's itemsize (bfloat16: 2)."""
    assert {t: native(t).itemsize for t in TAGS} == {t: n for t, (_, n) in wire.DTYPES.items()}
