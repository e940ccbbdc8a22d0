"""One ``test_rejects_<condition>`` per way wire.py refuses a frame (docs/wire.md).

Frames are built by hand with the ``raw_frame`` fixture, so the encoder's own checks do not
hide the decoder's. The messages are asserted where they name the cause: the field, the
tensor, the observed value and the limit.
"""

import json
import re
import socket
import struct

import ml_dtypes
import numpy as np
import pytest

from xstage_remote import wire
from xstage_remote.wire import ProtocolError

#: A minimal valid header for every op (the fields each op requires, and no others).
VALID = {
    "hello": {"op": "hello", "id": 0, "v": 1, "features": ["inline"], "worker": {"pid": 1},
              "package_hash": "ab" * 32, "auth": "cd" * 32},
    "load": {"op": "load", "id": 1, "runtime": "ort", "path": "/m.onnx"},
    "loaded": {"op": "loaded", "id": 1, "inputs": [], "outputs": []},
    "attach": {"op": "attach", "id": 2, "region": {"kind": "memfd"}},
    "attached": {"op": "attached", "id": 2},
    "run": {"op": "run", "id": 3, "t": []},
    "result": {"op": "result", "id": 3, "t": []},
    "ping": {"op": "ping", "id": 4},
    "pong": {"op": "pong", "id": 4},
    "evidence": {"op": "evidence", "id": 6},
    "evidence_data": {"op": "evidence_data", "id": 6, "info": {}, "t": []},
    "device_slots": {"op": "device_slots", "id": 7},
    "device_slots_ready": {"op": "device_slots_ready", "id": 7, "info": {}, "t": []},
    "state": {"op": "state", "id": 8},
    "state_data": {"op": "state_data", "id": 8, "t": []},
    "check_sets": {"op": "check_sets", "id": 9, "t": []},
    "sets_checked": {"op": "sets_checked", "id": 9, "info": {"sets": 2, "differs": None}},
    "shutdown": {"op": "shutdown", "id": 5},
    "bye": {"op": "bye", "id": 5},
    "error": {"op": "error", "id": 3, "kind": "ValueError", "message": "bad input"},
    "auth": {"op": "auth", "id": 0, "nonce": "ab" * 32, "proof": "cd" * 32},
    "auth_ok": {"op": "auth_ok", "id": 0, "proof": "cd" * 32},
}

#: A value of the wrong JSON type for each field type in ``wire.OPS``.
WRONG = {dict: [], list: {}, str: 1, int: "1"}


def desc(name="x", dtype="float32", shape=(2,), offset=0, nbytes=None):
    """A tensor descriptor; ``nbytes`` defaults to the right value for the shape."""
    if nbytes is None:
        nbytes = int(np.prod(shape, dtype=object)) * wire.DTYPES[dtype][1]
    return {"name": name, "dtype": dtype, "shape": list(shape), "offset": offset,
            "nbytes": nbytes}


def run_with(descs, payload_len):
    """(header, payload) for a run frame with these descriptors and a zero payload."""
    return {"op": "run", "id": 1, "t": descs}, bytes(payload_len)


@pytest.fixture
def parse(raw_frame):
    """``parse_frame`` on a hand-built frame."""
    def parse(header, payload=b"", **kw):
        max_payload = kw.pop("max_payload", wire.MAX_PAYLOAD_BYTES)
        return wire.parse_frame(raw_frame(header, payload, **kw), max_payload=max_payload)
    return parse


def rejects(match):
    """``pytest.raises(ProtocolError)`` whose message contains ``match`` literally."""
    return pytest.raises(ProtocolError, match=re.escape(match))


# ------------------------------------------------------------------------- sanity


@pytest.mark.parametrize("op", list(VALID))
def test_accepts_minimal_header_of_every_op(parse, op):
    """The templates below are valid, so each rejection below is caused by its one change."""
    assert parse(VALID[op]).op == op


def test_valid_table_covers_every_op():
    """Every op in ``wire.OPS`` has a template here (a new op needs its tests)."""
    assert set(VALID) == set(wire.OPS)


# ------------------------------------------------------------------------- prefix


def test_rejects_bad_magic(parse):
    """A frame that does not start with ``XSW1`` is refused before its lengths are read."""
    with rejects("frame magic is b'XSW2', expected b'XSW1'"):
        parse(VALID["ping"], magic=b"XSW2")


def test_rejects_lowercase_magic(parse):
    """The magic is compared byte for byte."""
    with rejects("frame magic is b'xsw1'"):
        parse(VALID["ping"], magic=b"xsw1")


@pytest.mark.parametrize("hlen", [0, 1])
def test_rejects_header_length_below_two(parse, hlen):
    """The shortest JSON object (``{}``) is 2 bytes; a shorter header length is refused."""
    with rejects(f"header length {hlen} is outside [2, {wire.MAX_HEADER_BYTES}]"):
        parse(b"{}"[:hlen])


def test_rejects_header_length_over_limit(parse):
    """A header length above MAX_HEADER_BYTES is refused from the prefix alone."""
    n = wire.MAX_HEADER_BYTES + 1
    with rejects(f"header length {n} is outside [2, {wire.MAX_HEADER_BYTES}]"):
        parse(VALID["ping"], hlen=n)


def test_rejects_header_length_u32_max(parse):
    """The largest u32 header length is refused too."""
    with rejects("header length 4294967295 is outside"):
        parse(VALID["ping"], hlen=2**32 - 1)


def test_accepts_header_length_at_limit(parse):
    """A header of exactly MAX_HEADER_BYTES (space-padded JSON) is accepted."""
    raw = json.dumps(VALID["ping"]).encode()
    assert parse(raw + b" " * (wire.MAX_HEADER_BYTES - len(raw))).op == "ping"


@pytest.mark.parametrize("pad", [b" ", b"\t\r\n ", b"    "])
def test_accepts_json_whitespace_around_the_object(parse, pad):
    """Deliberate leniency: JSON whitespace MAY pad the header before or after the object."""
    raw = json.dumps(VALID["ping"]).encode()
    assert parse(pad + raw + pad).op == "ping"


def test_rejects_payload_over_default_limit(parse):
    """A payload length above MAX_PAYLOAD_BYTES is refused from the prefix alone."""
    n = wire.MAX_PAYLOAD_BYTES + 1
    with rejects(f"payload length {n} exceeds the limit {wire.MAX_PAYLOAD_BYTES}"):
        parse(VALID["ping"], plen=n)


def test_rejects_payload_over_connection_limit(parse):
    """A connection's own (lower) limit applies instead of the default."""
    header, payload = run_with([desc(shape=(257,))], 1028)
    with rejects("payload length 1028 exceeds the limit 1024"):
        parse(header, payload, max_payload=1024)


def test_rejects_payload_u64_max(parse):
    """The largest u64 payload length is refused from the prefix alone."""
    with rejects(f"payload length {2**64 - 1} exceeds the limit"):
        parse(VALID["ping"], plen=2**64 - 1)


@pytest.mark.parametrize("n", [0, 1, 4, 15])
def test_rejects_truncated_prefix(n, raw_frame):
    """Fewer than 16 bytes cannot hold a prefix."""
    with rejects(f"frame prefix is {n} bytes, expected 16"):
        wire.parse_frame(raw_frame(VALID["ping"])[:n])


def test_rejects_prefix_of_wrong_size():
    """``validate_prefix`` takes exactly 16 bytes."""
    with rejects("frame prefix is 17 bytes, expected 16"):
        wire.validate_prefix(b"XSW1" + bytes(13))


# ------------------------------------------------------------------------- header bytes


def test_rejects_non_utf8_header(parse):
    """Header bytes that are not UTF-8 are refused before JSON sees them."""
    with rejects("header is not UTF-8 (invalid start byte)"):
        parse(b'{"op":"\xff"}')


def test_rejects_overlong_utf8_header(parse):
    """Overlong UTF-8 (``C0 AF`` for ``/``) is not UTF-8."""
    with rejects("header is not UTF-8"):
        parse(b'{"op":"\xc0\xaf"}')


def test_rejects_utf16_header(parse):
    """A UTF-16 header is not UTF-8 JSON."""
    with pytest.raises(ProtocolError, match="header is not (UTF-8|JSON)"):
        parse(json.dumps(VALID["ping"]).encode("utf-16"))


def test_rejects_utf8_bom(parse):
    """A byte-order mark before the object is not JSON."""
    with rejects("header is not JSON"):
        parse(b"\xef\xbb\xbf" + json.dumps(VALID["ping"]).encode())


def test_rejects_non_json_header(parse):
    """Text that is not JSON is refused."""
    with rejects("header is not JSON (Expecting property name enclosed in double quotes"):
        parse(b"{op: 'ping', id: 1}")


def test_rejects_trailing_data_after_json(parse):
    """One JSON value only: trailing bytes after the object are not JSON."""
    with rejects("header is not JSON (Extra data"):
        parse(json.dumps(VALID["ping"]) + "{}")


def test_rejects_nul_padding(parse):
    """Padding MAY be spaces only; NUL bytes after the object are refused."""
    with rejects("header is not JSON"):
        parse(json.dumps(VALID["ping"]).encode() + b"\0\0\0")


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ('"ping"', "str"), ("17", "int"),
                                        ("null", "NoneType"), ("true", "bool")])
def test_rejects_json_that_is_not_an_object(parse, text, kind):
    """The header is a JSON object; any other JSON value is refused and named."""
    with rejects(f"header is a JSON {kind}, expected an object"):
        parse(text)


def test_rejects_duplicate_keys(parse):
    """Duplicate keys are refused (a polyglot header could mean two things)."""
    with rejects("duplicate key 'id' in header"):
        parse('{"op":"ping","id":1,"id":2}')


def test_rejects_duplicate_keys_nested(parse):
    """Duplicate keys are refused at any depth, not only at the top."""
    with rejects("duplicate key 'a' in header"):
        parse('{"op":"load","id":1,"runtime":"ort","path":"p","options":{"a":1,"a":1}}')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_rejects_nan_constant(parse, constant):
    """Python's JSON extensions NaN/Infinity are not JSON and are refused."""
    with rejects(f"header contains {constant}, which is not JSON"):
        parse(f'{{"op":"pong","id":1,"info":{{"x":{constant}}}}}')


@pytest.mark.parametrize("literal", ["1e999", "-1e400"])
def test_rejects_number_overflowing_to_infinity(parse, literal):
    """A number literal too large for a double would decode to ±inf: refused like Infinity."""
    with rejects(f"header number {literal} is not a finite double"):
        parse(f'{{"op":"pong","id":1,"info":{{"x":{literal}}}}}')


def test_rejects_deep_nesting(parse):
    """A deeply nested header (a JSON bomb) is refused, not a RecursionError."""
    depth = 100_000
    text = '{"op":"pong","id":1,"info":{"x":' + "[" * depth + "]" * depth + "}}"
    with rejects("header JSON nests too deeply"):
        parse(text)


def test_rejects_huge_integer_literal(parse):
    """An integer literal beyond Python's digit limit is refused as not JSON."""
    with rejects("header is not JSON"):
        parse('{"op":"ping","id":%s}' % ("9" * 5000))


# ------------------------------------------------------------------------- op, id, fields


@pytest.mark.parametrize("op", ["pickle", "__reduce__", "PING", ""])
def test_rejects_unknown_op(parse, op):
    """An op not in ``OPS`` is refused and the known ops are listed."""
    with rejects(f"unknown op {op!r} (known: attach, attached, auth, auth_ok, bye, check_sets, "
                 f"device_slots, device_slots_ready, error"):
        parse({"op": op, "id": 1})


def test_rejects_missing_op(parse):
    """A header without ``op`` is refused."""
    with rejects("unknown op None"):
        parse({"id": 1})


@pytest.mark.parametrize("op", [1, ["ping"], None, {"ping": 1}])
def test_rejects_non_string_op(parse, op):
    """``op`` is a string; other JSON types are refused (and never hashed)."""
    with rejects(f"unknown op {op!r}"):
        parse({"op": op, "id": 1})


@pytest.mark.parametrize("rid", [-1, True, False, 1.0, 2**63, 2**64, "1", None, [1]],
                         ids=["negative", "true", "false", "float", "2^63", "2^64", "str",
                              "null", "list"])
def test_rejects_bad_id(parse, rid):
    """``id`` is an integer in [0, 2^63): not negative, bool, float, string or too large."""
    with rejects(f"op ping: id {rid!r} is not an integer in [0, 2^63)"):
        parse({"op": "ping", "id": rid})


def test_rejects_missing_id(parse):
    """A header without ``id`` is refused."""
    with rejects("op ping: id None is not an integer in [0, 2^63)"):
        parse({"op": "ping"})


@pytest.mark.parametrize("rid", [0, 2**63 - 1])
def test_accepts_id_at_bounds(parse, rid):
    """0 and 2^63 - 1 are valid ids (the bounds are inclusive / exclusive as documented)."""
    assert parse({"op": "ping", "id": rid}).id == rid


@pytest.mark.parametrize("op", list(VALID))
def test_rejects_unknown_field(parse, op):
    """Every op refuses a field it does not define."""
    with rejects(f"op {op}: unknown field 'extra'"):
        parse(dict(VALID[op], extra=1))


@pytest.mark.parametrize("op", [op for op in VALID if "t" not in wire.OPS[op]])
def test_rejects_tensor_list_on_op_without_tensors(parse, op):
    """Only ``run`` and ``result`` carry tensors; ``t`` elsewhere is an unknown field."""
    with rejects(f"op {op}: unknown field 't'"):
        parse(dict(VALID[op], t=[]))


REQUIRED = [(op, key) for op, spec in wire.OPS.items() for key, (_, req) in spec.items() if req]


@pytest.mark.parametrize("op, key", REQUIRED, ids=[f"{op}.{key}" for op, key in REQUIRED])
def test_rejects_missing_required_field(parse, op, key):
    """Every required field of every op is enforced."""
    header = dict(VALID[op])
    del header[key]
    with rejects(f"op {op}: missing field {key!r}"):
        parse(header)


FIELDS = [(op, key, typ) for op, spec in wire.OPS.items() for key, (typ, _) in spec.items()]


@pytest.mark.parametrize("op, key, typ", FIELDS, ids=[f"{op}.{key}" for op, key, _ in FIELDS])
def test_rejects_wrong_field_type(parse, op, key, typ):
    """Every field of every op is type-checked (object, list, string, integer)."""
    value = WRONG[typ]
    with rejects(f"op {op}: field {key!r} is {type(value).__name__}, expected {typ.__name__}"):
        parse(dict(VALID[op], **{key: value}))


def test_rejects_bool_for_integer_field(parse):
    """JSON ``true`` is not an integer even though Python's bool is an int."""
    with rejects("op hello: field 'v' is bool, expected int"):
        parse(dict(VALID["hello"], v=True))


def test_rejects_null_for_optional_field(parse):
    """An optional field, when present, has its type; ``null`` is not 'absent'."""
    with rejects("op pong: field 'info' is NoneType, expected dict"):
        parse(dict(VALID["pong"], info=None))


# ------------------------------------------------------------------------- tensor descriptors


def test_rejects_too_many_tensors(parse):
    """More than MAX_TENSORS descriptors are refused before any is inspected."""
    n = wire.MAX_TENSORS + 1
    descs = [desc(f"t{i}", "uint8", (0,)) for i in range(n)]
    with rejects(f"{n} tensors in one frame exceed the limit {wire.MAX_TENSORS}"):
        parse(*run_with(descs, 0))


def test_accepts_max_tensors(parse):
    """Exactly MAX_TENSORS descriptors are accepted."""
    descs = [desc(f"t{i}", "uint8", (0,)) for i in range(wire.MAX_TENSORS)]
    assert len(parse(*run_with(descs, 0)).tensors) == wire.MAX_TENSORS


@pytest.mark.parametrize("bad", [1, "x", None, ["x", "float32"]])
def test_rejects_descriptor_not_an_object(parse, bad):
    """Each descriptor is a JSON object; the message gives its index."""
    with rejects("tensor descriptor 1 is not an object"):
        parse(*run_with([desc(), bad], 8))


def test_rejects_descriptor_unknown_fields(parse):
    """Descriptors have exactly name/dtype/shape/offset/nbytes: no strides, no extras."""
    with rejects("tensor descriptor 0 has unknown fields ['order', 'strides']"):
        parse(*run_with([dict(desc(), strides=[4], order="F")], 8))


@pytest.mark.parametrize("name", ["", None, 1, ["x"]], ids=["empty", "null", "int", "list"])
def test_rejects_bad_tensor_name(parse, name):
    """A tensor name is a non-empty string."""
    with rejects(f"tensor descriptor 0: name {name!r} is not a string of 1..{wire.MAX_NAME_CHARS} chars"):
        parse(*run_with([desc(name=name)], 8))


def test_rejects_missing_tensor_name(parse):
    """A descriptor without a name is refused."""
    d = desc()
    del d["name"]
    with rejects("tensor descriptor 0: name None is not a string"):
        parse(*run_with([d], 8))


def test_rejects_tensor_name_too_long(parse):
    """Names longer than MAX_NAME_CHARS characters are refused."""
    with rejects(f"is not a string of 1..{wire.MAX_NAME_CHARS} chars"):
        parse(*run_with([desc(name="n" * (wire.MAX_NAME_CHARS + 1))], 8))


def test_accepts_tensor_name_at_limit(parse):
    """A name of exactly MAX_NAME_CHARS characters (counted as characters) is accepted."""
    name = "é" * wire.MAX_NAME_CHARS
    assert parse(*run_with([desc(name=name)], 8)).tensors[0][0] == name


def test_rejects_duplicate_tensor_names(parse):
    """Two tensors with one name are refused (which one would the reader get?)."""
    with rejects("tensor 'x' appears twice in one frame"):
        parse(*run_with([desc("x"), desc("x", offset=8)], 16))


@pytest.mark.parametrize("tag", ["complex64", "float128", "object", "str", "float8_e4m3fn",
                                 "int4", "<f4", "FLOAT32", "bfloat", "void"])
def test_rejects_unknown_dtype(parse, tag):
    """Only the whitelist's tags are accepted; numpy spellings and other types are not."""
    with rejects(f"tensor 'x': dtype {tag!r} is not on the whitelist"):
        parse(*run_with([dict(desc(), dtype=tag)], 8))


@pytest.mark.parametrize("tag", [None, 4, ["float32"]], ids=["null", "int", "list"])
def test_rejects_non_string_dtype(parse, tag):
    """A dtype that is not a string is refused (and never hashed)."""
    with rejects(f"tensor 'x': dtype {tag!r} is not on the whitelist"):
        parse(*run_with([dict(desc(), dtype=tag)], 8))


@pytest.mark.parametrize("shape", [3, "3", None, {"0": 3}], ids=["int", "str", "null", "obj"])
def test_rejects_shape_not_a_list(parse, shape):
    """``shape`` is a JSON list."""
    with rejects("tensor 'x': shape is not a list"):
        parse(*run_with([dict(desc(), shape=shape)], 8))


def test_rejects_rank_over_limit(parse):
    """Rank above MAX_RANK is refused before the dimensions are multiplied."""
    with rejects("tensor 'x': rank 33 exceeds 32"):
        parse(*run_with([desc(shape=(1,) * 33, nbytes=4)], 4))


def test_accepts_rank_at_limit(parse):
    """Rank MAX_RANK is accepted."""
    frame = parse(*run_with([desc(shape=(1,) * 32)], 4))
    assert frame.arrays()["x"].shape == (1,) * 32


@pytest.mark.parametrize("dim", [-1, 2.0, True, "2", None, [2], 2**40 + 1, 2**64],
                         ids=["negative", "float", "bool", "str", "null", "list", "2^40+1",
                              "2^64"])
def test_rejects_bad_dimension(parse, dim):
    """Each dimension is an int in [0, 2^40]: not negative, float, bool or huge."""
    with rejects(f"tensor 'x': dimension {dim!r} is not an int in [0, 2^40]"):
        parse(*run_with([desc(shape=(2, dim), nbytes=8)], 8))


def test_rejects_negative_dims_whose_product_is_valid(parse):
    """[-1, -2] multiplies to 2 but is still refused (each dimension is checked)."""
    with rejects("dimension -1 is not an int"):
        parse(*run_with([desc(shape=(-1, -2), nbytes=8)], 8))


def test_rejects_shape_whose_size_overflows_int64(parse):
    """Dims whose product overflows int64 are refused in Python ints, not wrapped around."""
    with rejects("tensor 'x': shape [1099511627776, 1099511627776] spans more than 2^63 - 1"):
        parse(*run_with([desc(dtype="float64", shape=(2**40, 2**40), nbytes=8)], 8))


def test_rejects_wrapped_around_nbytes(parse):
    """An nbytes equal to the product taken mod 2^64 is not accepted as the product."""
    shape = (2**40, 2**24 + 1)
    wrapped = (2**40 * (2**24 + 1) * 8) % 2**64
    header, _ = run_with([desc(dtype="float64", shape=shape, nbytes=wrapped)], 0)
    with rejects("tensor 'x': shape"):
        parse(header, plen=wrapped, max_payload=2**64)


def test_rejects_empty_tensor_too_large_for_numpy(parse):
    """A zero-size shape whose other dims overflow int64 is refused, not a numpy ValueError."""
    with rejects("tensor 'x': shape [0, 1099511627776, 1099511627776] spans more than"):
        parse(*run_with([desc(dtype="float64", shape=(0, 2**40, 2**40), nbytes=0)], 0))


def test_accepts_empty_tensor_with_large_other_dims(parse):
    """A zero-size shape is fine while the other dims stay in range."""
    frame = parse(*run_with([desc(dtype="uint8", shape=(0, 2**30, 2**30), nbytes=0)], 0))
    assert frame.arrays()["x"].shape == (0, 2**30, 2**30)


@pytest.mark.parametrize("field, value", [("nbytes", None), ("nbytes", "8"), ("nbytes", 8.0),
                                          ("nbytes", True), ("offset", None), ("offset", 0.0),
                                          ("offset", False), ("offset", [0])],
                         ids=["nbytes-missing", "nbytes-str", "nbytes-float", "nbytes-bool",
                              "offset-missing", "offset-float", "offset-bool", "offset-list"])
def test_rejects_offset_or_nbytes_not_integer(parse, field, value):
    """``offset`` and ``nbytes`` are JSON integers (not floats, bools or strings)."""
    d = desc()
    if value is None:
        del d[field]
    else:
        d[field] = value
    with rejects("tensor 'x': offset and nbytes must be integers"):
        parse(*run_with([d], 8))


@pytest.mark.parametrize("nbytes", [7, 9, 0, -8, 2**64 + 8])
def test_rejects_nbytes_mismatch(parse, nbytes):
    """``nbytes`` equals prod(shape) * itemsize exactly."""
    with rejects(f"tensor 'x': nbytes {nbytes} != prod(shape) * itemsize = 8"):
        parse(*run_with([desc(nbytes=nbytes)], 8))


def test_rejects_first_offset_not_zero(parse):
    """The first tensor starts at payload byte 0."""
    with rejects("tensor 'x': offset 4, expected 0 (tensors are contiguous)"):
        parse(*run_with([desc(offset=4)], 12))


def test_rejects_offset_gap(parse):
    """A hole between tensors is refused (no hidden bytes in the payload)."""
    with rejects("tensor 'y': offset 12, expected 8 (tensors are contiguous)"):
        parse(*run_with([desc("x"), desc("y", offset=12)], 20))


def test_rejects_offset_overlap(parse):
    """Overlapping tensors are refused (one byte, two meanings)."""
    with rejects("tensor 'y': offset 4, expected 8 (tensors are contiguous)"):
        parse(*run_with([desc("x"), desc("y", offset=4)], 16))


def test_rejects_negative_offset(parse):
    """A negative offset is refused."""
    with rejects("tensor 'x': offset -8, expected 0"):
        parse(*run_with([desc(offset=-8)], 8))


def test_rejects_tensor_past_payload(parse):
    """A tensor that ends past the payload is refused before the payload is read."""
    with rejects("tensor 'y' ends at byte 16, past the payload's 12"):
        parse(*run_with([desc("x"), desc("y", offset=8)], 12))


def test_rejects_payload_not_exactly_covered(parse):
    """Payload bytes that no tensor describes are refused (no trailing data)."""
    with rejects("tensors cover 8 bytes of a 12-byte payload"):
        parse(*run_with([desc("x")], 12))


def test_rejects_payload_with_empty_tensor_list(parse):
    """``t: []`` describes an empty payload only."""
    with rejects("tensors cover 0 bytes of a 4-byte payload"):
        parse(*run_with([], 4))


def test_rejects_payload_without_tensor_list(parse):
    """An op without ``t`` carries no payload."""
    with rejects("op ping carries a 8-byte payload and no tensor list"):
        parse(VALID["ping"], bytes(8))


def test_rejects_payload_without_tensor_list_over_socket(raw_frame, feed_socket):
    """``recv_frame`` refuses it too, before reading the payload."""
    with rejects("op pong carries a 1099511627776-byte payload and no tensor list"):
        feed_socket(raw_frame(VALID["pong"], plen=2**40), max_payload=2**41)


# ------------------------------------------------------------------------- frame length


def test_rejects_frame_shorter_than_its_header(raw_frame):
    """``parse_frame``: the bytes end inside the header."""
    data = raw_frame(VALID["ping"])
    with rejects(f"frame holds {len(data) - 1} bytes, its header needs {len(data)}"):
        wire.parse_frame(data[:-1])


def test_rejects_frame_shorter_than_its_payload(raw_frame):
    """``parse_frame``: the bytes end inside the payload."""
    header, payload = run_with([desc()], 8)
    data = raw_frame(header, payload)
    with rejects(f"frame holds {len(data) - 3} bytes, its lengths say {len(data)}"):
        wire.parse_frame(data[:-3])


def test_rejects_frame_longer_than_its_lengths(raw_frame):
    """``parse_frame``: bytes after the frame are refused (one frame per call)."""
    data = raw_frame(VALID["ping"])
    with rejects(f"frame holds {len(data) + 16} bytes, its lengths say {len(data)}"):
        wire.parse_frame(data + data[:16])


# ------------------------------------------------------------------------- end of stream


def test_rejects_peer_closed_before_a_frame(feed_socket):
    """End of stream between frames is a clean close: ``PeerClosed(partial=False)``."""
    with pytest.raises(wire.PeerClosed) as info:
        feed_socket(b"")
    assert info.value.partial is False
    assert str(info.value) == "peer closed the stream"


@pytest.mark.parametrize("where", ["prefix", "header", "payload"])
def test_rejects_peer_closed_mid_frame(raw_frame, feed_socket, where):
    """End of stream inside a frame is ``PeerClosed(partial=True)``."""
    data = raw_frame(*run_with([desc()], 8))
    cut = {"prefix": 7, "header": 20, "payload": len(data) - 1}[where]
    with pytest.raises(wire.PeerClosed) as info:
        feed_socket(data[:cut])
    assert info.value.partial is True
    assert str(info.value) == "peer closed the stream mid-frame"


def test_peer_closed_is_an_eof_error():
    """``PeerClosed`` is an ``EOFError``, not a ``ProtocolError``: nothing was malformed."""
    assert issubclass(wire.PeerClosed, EOFError)
    assert not issubclass(wire.PeerClosed, ProtocolError)


def test_peer_closed_after_one_full_frame():
    """A frame, then end of stream: the frame is read, then a clean ``PeerClosed``."""
    a, b = socket.socketpair()
    b.settimeout(10)
    try:
        wire.send_frame(a, VALID["ping"])
        a.shutdown(socket.SHUT_WR)
        assert wire.recv_frame(b).op == "ping"
        with pytest.raises(wire.PeerClosed) as info:
            wire.recv_frame(b)
    finally:
        a.close()
        b.close()
    assert info.value.partial is False


# ------------------------------------------------------------------------- dtype availability


def test_rejects_bfloat16_without_ml_dtypes(monkeypatch, raw_frame):
    """Decoding bfloat16 where ml_dtypes is missing names ml_dtypes and how to install it."""
    monkeypatch.setattr(wire.spec, "_bf16", lambda: None)
    data = raw_frame(*run_with([desc("w", "bfloat16", (2,))], 4))
    with rejects("tensor 'w' is bfloat16 and this interpreter has no ml_dtypes to hold it; "
                 "pip install ml_dtypes there"):
        wire.parse_frame(data)


def test_recv_frame_defers_bfloat16_refusal_to_arrays(monkeypatch, raw_frame, feed_socket):
    """``recv_frame`` returns the frame; ``Frame.arrays()`` is where a missing ml_dtypes bites."""
    monkeypatch.setattr(wire.spec, "_bf16", lambda: None)
    frame = feed_socket(raw_frame(*run_with([desc("w", "bfloat16", (2,))], 4)))
    with rejects("tensor 'w' is bfloat16 and this interpreter has no ml_dtypes"):
        frame.arrays()


def test_rejects_unknown_tag_in_dtype_of_tag():
    """``dtype_of_tag`` refuses a tag outside the whitelist, naming the tensor."""
    with rejects("tensor 'y': unknown dtype 'complex64'"):
        wire.dtype_of_tag("complex64", "y")


# ------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("array", [
    np.array([object()], dtype=object),
    np.zeros(2, dtype=np.complex64),
    np.zeros(2, dtype=np.complex128),
    np.array(["a", "bc"]),
    np.array([b"a"]),
    np.zeros(2, dtype="datetime64[s]"),
    np.zeros(2, dtype="timedelta64[s]"),
    np.zeros(2, dtype=np.longdouble),
    np.zeros(2, dtype=[("a", "<i4")]),
    np.zeros(2, dtype=ml_dtypes.float8_e4m3fn),
    np.zeros(2, dtype=ml_dtypes.int4),
], ids=["object", "complex64", "complex128", "str", "bytes", "datetime64", "timedelta64",
        "longdouble", "structured", "float8", "int4"])
def test_rejects_encoding_dtype_off_whitelist(array):
    """The encoder refuses any dtype outside the whitelist and lists the whitelist."""
    with rejects(f"dtype {array.dtype} is not on the wire's whitelist (bool, int8"):
        wire.encode_frame({"op": "run", "id": 1}, {"x": array})


@pytest.mark.parametrize("name", ["", 1, None, b"x"], ids=["empty", "int", "null", "bytes"])
def test_rejects_encoding_bad_tensor_name(name):
    """The encoder refuses names that are not non-empty strings."""
    with rejects(f"tensor name {name!r} is not a non-empty string"):
        wire.encode_frame({"op": "run", "id": 1}, {name: np.zeros(1)})


def test_rejects_encoding_tensor_name_too_long():
    """The encoder applies MAX_NAME_CHARS too (through the descriptor check)."""
    with rejects(f"is not a string of 1..{wire.MAX_NAME_CHARS} chars"):
        wire.encode_frame({"op": "run", "id": 1},
                          {"n" * (wire.MAX_NAME_CHARS + 1): np.zeros(1)})


def test_rejects_encoding_rank_over_limit():
    """The encoder refuses rank above MAX_RANK."""
    with rejects("tensor 'x': rank 33 exceeds 32"):
        wire.encode_frame({"op": "run", "id": 1}, {"x": np.zeros((1,) * 33)})


def test_rejects_encoding_too_many_tensors():
    """The encoder refuses more than MAX_TENSORS tensors."""
    arrays = {f"t{i}": np.zeros(0) for i in range(wire.MAX_TENSORS + 1)}
    with rejects("4097 tensors in one frame exceed the limit 4096"):
        wire.encode_frame({"op": "run", "id": 1}, arrays)


def test_rejects_encoding_header_over_limit():
    """The encoder refuses a header whose JSON exceeds MAX_HEADER_BYTES."""
    header = {"op": "error", "id": 1, "kind": "E", "message": "m" * wire.MAX_HEADER_BYTES}
    with rejects(f"over the limit {wire.MAX_HEADER_BYTES}"):
        wire.encode_frame(header)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_rejects_encoding_non_finite_header_number(value):
    """The encoder refuses NaN/±inf in a header (the decoder would refuse them)."""
    with rejects("header cannot be encoded as strict JSON"):
        wire.encode_frame({"op": "pong", "id": 1, "info": {"x": value}})


def test_rejects_encoding_non_json_header_value():
    """The encoder refuses header values JSON cannot hold, as a ProtocolError."""
    with rejects("header cannot be encoded as strict JSON"):
        wire.encode_frame({"op": "pong", "id": 1, "info": {"x": {1, 2}}})


def test_rejects_encoding_unknown_op():
    """The encoder validates the header like the decoder does."""
    with rejects("unknown op 'pickle'"):
        wire.encode_frame({"op": "pickle", "id": 1})


def test_rejects_encoding_run_without_tensors():
    """``run`` requires ``t``: send ``{}`` for a call without inputs, not ``None``."""
    with rejects("op run: missing field 't'"):
        wire.encode_frame({"op": "run", "id": 1})


def test_rejects_encoding_bad_id():
    """The encoder refuses an id outside [0, 2^63)."""
    with rejects("op ping: id -1 is not an integer"):
        wire.encode_frame({"op": "ping", "id": -1})


def test_encoder_refuses_before_writing(monkeypatch):
    """``send_frame`` sends nothing when the frame is refused."""
    class Sock:
        sent = []

        def sendall(self, data):
            self.sent.append(data)

    sock = Sock()
    with pytest.raises(ProtocolError):
        wire.send_frame(sock, {"op": "run", "id": 1}, {"x": np.zeros(1, np.complex64)})
    assert sock.sent == []


# ------------------------------------------------------------------------- order of checks


def test_checks_run_cheapest_first(raw_frame):
    """A frame wrong in every way reports the cheapest check first; fixing it reveals the next."""
    bad_desc = {"name": "x", "dtype": "complex64", "shape": [2], "offset": 0, "nbytes": 99}
    steps = [
        ("frame magic", dict(magic=b"BAD!", hlen=0, plen=2**63, header=b"\xff\xfe")),
        ("header length 0", dict(hlen=0, plen=2**63, header=b"\xff\xfe")),
        ("payload length", dict(plen=2**63, header=b"\xff\xfe")),
        ("not UTF-8", dict(header=b"\xff\xfe")),
        ("not JSON", dict(header=b"{op}")),
        ("unknown op", dict(header={"op": "nope", "id": -1})),
        ("id -1", dict(header={"op": "run", "id": -1, "zz": 1})),
        ("unknown field 'zz'", dict(header={"op": "run", "id": 1, "zz": 1, "t": [bad_desc]})),
        ("dtype 'complex64'", dict(header={"op": "run", "id": 1, "t": [bad_desc]})),
        ("nbytes 99", dict(header={"op": "run", "id": 1, "t": [dict(bad_desc, dtype="uint8")]})),
    ]
    for expected, kw in steps:
        header = kw.pop("header")
        payload = bytes(2)
        with rejects(expected):
            wire.parse_frame(raw_frame(header, payload, **kw))


def test_validate_prefix_returns_lengths():
    """``validate_prefix`` returns ``(header_len, payload_len)`` from a good prefix."""
    assert wire.validate_prefix(struct.pack("<4sIQ", b"XSW1", 20, 300)) == (20, 300)


def test_public_names_are_exported():
    """The module's public API is in ``__all__``."""
    for name in ("parse_frame", "recv_frame", "send_frame", "encode_frame", "PeerClosed",
                 "ProtocolError", "MAX_DIM", "validate_tensor_descs"):
        assert name in wire.__all__
