"""The wire's spec as data and checks: limits, dtypes, ops, the JSON header's rules, the
frame prefix and the record sizes (docs/wire.md). The lowest layer of ``xstage_remote.wire``:
``frames``, ``codec`` and ``channel`` read its public names and nothing else of each other's.

Every ``validate_*`` function raises ``ProtocolError`` before anything sized by the peer is
allocated, and the checks run cheapest first: prefix → lengths → UTF-8 → JSON → op → fields →
tensor names → dtype → rank → ``nbytes == prod(shape) * itemsize`` (Python ints, no
overflow) → exact coverage.

Frame on a stream (all integers little-endian)::

    0       4          8                 16            16+H
    +-------+----------+-----------------+-------------+-------------------+
    | magic | H (u32)  | P (u64)         | header (H)  | payload (P)       |
    +-------+----------+-----------------+-------------+-------------------+

``XSW1``: the header is a UTF-8 JSON object whose ``t`` list describes the tensors laid end
to end in the payload. ``XSB1``: a binary call frame, whose header only a codec decodes
(``codec.FastCodec``). There is no pickle anywhere in this package, by design.
"""

import json
import struct

import numpy as np

MAGIC = b"XSW1"
#: A binary call frame's magic: framing knows it, a codec (``codec.FastCodec``) decodes it.
FAST_MAGIC = b"XSB1"
#: The profile's bytes in an ``evidence_data`` frame (a name no ONNX output can take: it is
#: not a valid identifier, and the client refuses a stage whose outputs use it anyway).
PROFILE_TENSOR = "xstage:profile"
#: ``sets_checked``'s tensor names where a slot set answered otherwise: set 0's outputs, that set's
SET0_PREFIX, SETK_PREFIX = "set0/", "setk/"


PREFIX = struct.Struct("<4sIQ")
#: A header is small JSON; a megabyte is generous and bounds the parse.
MAX_HEADER_BYTES = 1 << 20
#: Default payload ceiling per frame; a connection may lower or raise it.
MAX_PAYLOAD_BYTES = 8 << 30
MAX_TENSORS = 4096
MAX_NAME_CHARS = 1024
MAX_RANK = 32
#: Per-dimension ceiling: keeps ``prod(shape)`` a sane Python int before it is compared.
MAX_DIM = 1 << 40
#: numpy refuses a shape whose non-zero dims times itemsize exceed this, even when another
#: dim is 0 (an empty tensor): checked here so decoding never meets numpy's ValueError.
MAX_SPAN = (1 << 63) - 1


class ProtocolError(Exception):
    """Raised when bytes on the wire break the spec; the message names the field and limit."""


def _bf16():
    try:
        import ml_dtypes  # noqa: F401  (optional: only where bfloat16 crosses the wire)

        return np.dtype(ml_dtypes.bfloat16)
    except Exception:  # not installed in this interpreter
        return None


#: The dtype whitelist: tag → (numpy dtype or None for bfloat16, itemsize).
DTYPES = {
    "bool": (np.dtype("bool"), 1),
    "int8": (np.dtype("<i1"), 1),
    "int16": (np.dtype("<i2"), 2),
    "int32": (np.dtype("<i4"), 4),
    "int64": (np.dtype("<i8"), 8),
    "uint8": (np.dtype("<u1"), 1),
    "uint16": (np.dtype("<u2"), 2),
    "uint32": (np.dtype("<u4"), 4),
    "uint64": (np.dtype("<u8"), 8),
    "float16": (np.dtype("<f2"), 2),
    "bfloat16": (None, 2),
    "float32": (np.dtype("<f4"), 4),
    "float64": (np.dtype("<f8"), 8),
}
#: Stable small integers for the binary descriptors in shared memory (shm.py).
DTYPE_CODES = {tag: i + 1 for i, tag in enumerate(DTYPES)}
CODE_DTYPES = {code: tag for tag, code in DTYPE_CODES.items()}


_TAGS = {}


def tag_of_dtype(dtype):
    """The wire tag of a numpy dtype, or ProtocolError if it is not on the whitelist."""
    tag = _TAGS.get(dtype)
    if tag is not None:
        return tag
    dtype = np.dtype(dtype)
    tag = None
    if dtype.name == "bfloat16":
        tag = "bfloat16"
    elif dtype.kind in "biuf" and dtype.name in DTYPES:
        tag = dtype.name
    elif dtype.kind == "b":
        tag = "bool"
    if tag is not None:
        _TAGS[dtype] = tag  # dtype.name is slow (Python-level); calls hit this cache
        return tag
    raise ProtocolError(
        "dtype %s is not on the wire's whitelist (%s)" % (dtype, ", ".join(DTYPES))
    )


def dtype_of_tag(tag, name="?"):
    """The numpy dtype for a wire tag (bfloat16 needs ml_dtypes in this interpreter)."""
    entry = DTYPES.get(tag)
    if entry is None:
        raise ProtocolError("tensor %r: unknown dtype %r" % (name, tag))
    if entry[0] is None:
        dt = _bf16()
        if dt is None:
            raise ProtocolError(
                "tensor %r is bfloat16 and this interpreter has no ml_dtypes to hold it; "
                "pip install ml_dtypes there" % (name,)
            )
        return dt
    return entry[0]


# ---------------------------------------------------------------------------- header spec

_OBJ, _LIST, _STR, _INT, _BOOL, _NUM = dict, list, str, int, bool, (int, float)

#: op → {field: (type, required)}. Unknown ops and unknown fields are rejected; ``op`` and
#: ``id`` are common to all. ``t`` is the tensor list (validated by validate_tensor_descs).
OPS = {
    "hello": {"v": (_INT, True), "features": (_LIST, True), "worker": (_OBJ, True),
              "package_hash": (_STR, True), "auth": (_STR, True), "nonce": (_STR, False),
              "record_bytes": (_INT, False)},
    "auth": {"nonce": (_STR, True), "proof": (_STR, True)},
    "auth_ok": {"proof": (_STR, True)},
    "load": {"runtime": (_STR, True), "path": (_STR, True), "options": (_OBJ, False),
             "tuning": (_OBJ, False)},
    "loaded": {"inputs": (_LIST, True), "outputs": (_LIST, True), "info": (_OBJ, False)},
    "attach": {"region": (_OBJ, True)},
    "attached": {"info": (_OBJ, False)},
    "run": {"t": (_LIST, True), "options": (_OBJ, False)},
    "result": {"t": (_LIST, True), "timing": (_OBJ, False)},
    "ping": {},
    "pong": {"info": (_OBJ, False)},
    "evidence": {},
    "evidence_data": {"info": (_OBJ, True), "t": (_LIST, False)},
    "device_slots": {},
    "device_slots_ready": {"info": (_OBJ, True), "t": (_LIST, True)},
    "state": {},
    "state_data": {"t": (_LIST, True)},
    "check_sets": {"t": (_LIST, True)},
    "sets_checked": {"info": (_OBJ, True), "t": (_LIST, False)},
    "shutdown": {},
    "bye": {},
    "error": {"kind": (_STR, True), "message": (_STR, True), "traceback": (_STR, False)},
}
_COMMON = {"op", "id"}
#: ``gen``: the generation of the worker a frame comes from or goes to (u32, from 1). The
#: reader checks its type here; each end checks its value (docs/wire.md, "Request identity").
GEN_FIELD = "gen"
MAX_GENERATION = (1 << 32) - 1


def with_generation(header, generation):
    """``header`` with the sender's generation: the one helper every writer stamps through."""
    return dict(header, gen=generation)


def validate_prefix(prefix, max_payload=MAX_PAYLOAD_BYTES):
    """Check the 16-byte prefix and return ``(header_len, payload_len)``."""
    if len(prefix) != PREFIX.size:
        raise ProtocolError("frame prefix is %d bytes, expected %d" % (len(prefix), PREFIX.size))
    magic, hlen, plen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError("frame magic is %r, expected %r" % (magic, MAGIC))
    if hlen < 2 or hlen > MAX_HEADER_BYTES:
        raise ProtocolError("header length %d is outside [2, %d]" % (hlen, MAX_HEADER_BYTES))
    if plen > max_payload:
        raise ProtocolError("payload length %d exceeds the limit %d" % (plen, max_payload))
    return hlen, plen


def _no_duplicates(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the repeated key for the message
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ProtocolError("duplicate key %r in header" % (key,))
            seen.add(key)
    return out


def _reject_constant(name):
    raise ProtocolError("header contains %s, which is not JSON" % name)


def _finite_float(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):  # a literal like 1e999: Infinity by the back door
        raise ProtocolError("header number %.40s is not a finite double" % text)
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                            parse_float=_finite_float)
JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


_JSON_WS = " \t\n\r"


def validate_header_bytes(raw):
    """Decode header bytes: UTF-8, then JSON object without duplicate keys or NaN."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("header is not UTF-8 (%s)" % exc.reason) from None
    try:
        # json.loads, minus a decoder built per call and two regex passes (a third of a
        # small frame's decode time): one decoder, its scanner, JSON whitespace by hand.
        start = len(text) - len(text.lstrip(_JSON_WS))
        try:
            obj, end = _DECODER.scan_once(text, start)
        except StopIteration as err:
            raise json.JSONDecodeError("Expecting value", text, err.value) from None
        tail = text[end:]
        if tail.strip(_JSON_WS):
            raise json.JSONDecodeError("Extra data", text, end + len(tail) - len(tail.lstrip(_JSON_WS)))
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("header JSON nests too deeply") from None
    except ValueError as exc:
        raise ProtocolError("header is not JSON (%s)" % exc) from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is a JSON %s, expected an object" % type(obj).__name__)
    return obj


#: Per op, for the common case checked with set operations: the keys allowed, the keys
#: required, and each field's type. Any miss takes ``_header_problem`` for the message.
_ALLOWED = {op: frozenset(spec) | _COMMON | {GEN_FIELD} for op, spec in OPS.items()}
_REQUIRED = {op: frozenset(k for k, (_, req) in spec.items() if req) for op, spec in OPS.items()}
_TYPED = {op: tuple((k, typ) for k, (typ, _) in spec.items()) for op, spec in OPS.items()}


def validate_header(obj):
    """Check op, id and the op's fields (no unknown ones); return the op name."""
    op = obj.get("op")
    if type(op) is str and op in OPS:
        rid = obj.get("id")
        gen = obj.get(GEN_FIELD, 1)
        keys = obj.keys()
        if (type(rid) is int and 0 <= rid < 1 << 63 and type(gen) is int
                and 1 <= gen <= MAX_GENERATION and keys <= _ALLOWED[op]
                and _REQUIRED[op] <= keys):
            for key, typ in _TYPED[op]:
                if key in obj:
                    value = obj[key]
                    if not isinstance(value, typ) or (typ is _INT and isinstance(value, bool)):
                        break
            else:
                return op
    return _header_problem(obj)


def _header_problem(obj):
    """``validate_header`` field by field, raising the first problem in a fixed order."""
    op = obj.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError("unknown op %r (known: %s)" % (op, ", ".join(sorted(OPS))))
    rid = obj.get("id")
    if type(rid) is not int or rid < 0 or rid >= 1 << 63:
        raise ProtocolError("op %s: id %r is not an integer in [0, 2^63)" % (op, rid))
    spec = OPS[op]
    for key in obj:
        if key not in _COMMON and key not in spec and key != GEN_FIELD:
            raise ProtocolError("op %s: unknown field %r" % (op, key))
    if GEN_FIELD in obj:
        gen = obj[GEN_FIELD]
        if type(gen) is not int or gen < 1 or gen > MAX_GENERATION:
            raise ProtocolError("op %s: gen %r is not an integer in [1, 2^32)" % (op, gen))
    for key, (typ, required) in spec.items():
        if key not in obj:
            if required:
                raise ProtocolError("op %s: missing field %r" % (op, key))
            continue
        value = obj[key]
        if not isinstance(value, typ) or (typ is _INT and isinstance(value, bool)):
            raise ProtocolError(
                "op %s: field %r is %s, expected %s"
                % (op, key, type(value).__name__, getattr(typ, "__name__", "number"))
            )
    return op


def validate_tensor_descs(descs, payload_len):
    """Check a ``t`` list against the payload length; return ``[(name, tag, shape, off, n)]``.

    Names are unique non-empty strings, dtypes on the whitelist, rank ≤ MAX_RANK, every
    dimension a non-negative int, ``nbytes == prod(shape) * itemsize`` and the tensors laid
    end to end from offset 0 covering the payload exactly (no holes, no overlap).
    """
    if len(descs) > MAX_TENSORS:
        raise ProtocolError("%d tensors in one frame exceed the limit %d" % (len(descs), MAX_TENSORS))
    seen = set()
    out = []
    cursor = 0
    for i, d in enumerate(descs):
        if not isinstance(d, dict):
            raise ProtocolError("tensor descriptor %d is not an object" % i)
        extra = set(d) - {"name", "dtype", "shape", "offset", "nbytes"}
        if extra:
            raise ProtocolError("tensor descriptor %d has unknown fields %s" % (i, sorted(extra)))
        name = d.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise ProtocolError("tensor descriptor %d: name %r is not a string of 1..%d chars"
                                % (i, name, MAX_NAME_CHARS))
        if name in seen:
            raise ProtocolError("tensor %r appears twice in one frame" % (name,))
        seen.add(name)
        tag = d.get("dtype")
        if not isinstance(tag, str) or tag not in DTYPES:
            raise ProtocolError("tensor %r: dtype %r is not on the whitelist" % (name, tag))
        shape = d.get("shape")
        if not isinstance(shape, list):
            raise ProtocolError("tensor %r: shape is not a list" % (name,))
        if len(shape) > MAX_RANK:
            raise ProtocolError("tensor %r: rank %d exceeds %d" % (name, len(shape), MAX_RANK))
        count = 1
        span = DTYPES[tag][1]
        for dim in shape:
            if type(dim) is not int or dim < 0 or dim > MAX_DIM:
                raise ProtocolError("tensor %r: dimension %r is not an int in [0, 2^40]" % (name, dim))
            count *= dim
            span *= dim or 1
        if span > MAX_SPAN:
            raise ProtocolError("tensor %r: shape %r spans more than 2^63 - 1 bytes" % (name, shape))
        nbytes = d.get("nbytes")
        offset = d.get("offset")
        if type(nbytes) is not int or type(offset) is not int:
            raise ProtocolError("tensor %r: offset and nbytes must be integers" % (name,))
        expected = count * DTYPES[tag][1]
        if nbytes != expected:
            raise ProtocolError("tensor %r: nbytes %d != prod(shape) * itemsize = %d"
                                % (name, nbytes, expected))
        if offset != cursor:
            raise ProtocolError("tensor %r: offset %d, expected %d (tensors are contiguous)"
                                % (name, offset, cursor))
        cursor += nbytes
        if cursor > payload_len:
            raise ProtocolError("tensor %r ends at byte %d, past the payload's %d"
                                % (name, cursor, payload_len))
        out.append((name, tag, tuple(shape), offset, nbytes))
    if cursor != payload_len:
        raise ProtocolError("tensors cover %d bytes of a %d-byte payload" % (cursor, payload_len))
    return out



# ------------------------------------------------------------------- records (sizes)
#
# On the authenticated channel every frame travels as records: the bytes, then a trailer of
# an 8-byte record counter and a 32-byte tag (``channel``). The sizes live here, in the
# spec, because a codec's lane (``codec.Lane``) keeps room for a trailer after its frame so
# that the channel can seal it in place: one layer's zero-copy hook, no other layer's constant.

#: Frames up to this size (prefix + header + payload) go in one piece: one ``sendall`` on a
#: plain stream, one record on the channel.
SMALL_FRAME = 1 << 16
TAG_BYTES = 32
COUNTER = struct.Struct("<Q")
TRAILER_BYTES = COUNTER.size + TAG_BYTES
