"""Framing, validation and tensor encoding for the xstage worker protocol (docs/wire.md).

One implementation, imported by both ends. Every ``validate_*`` function raises
``ProtocolError`` before anything sized by the peer is allocated, and the checks run
cheapest first: prefix → lengths → UTF-8 → JSON → op → fields → tensor names → dtype →
rank → ``nbytes == prod(shape) * itemsize`` (Python ints, no overflow) → exact coverage.

Frame on the control stream (all integers little-endian)::

    0       4          8                 16            16+H
    +-------+----------+-----------------+-------------+-------------------+
    | XSW1  | H (u32)  | P (u64)         | header (H)  | payload (P)       |
    +-------+----------+-----------------+-------------+-------------------+

The header is a UTF-8 JSON object; its ``t`` list describes the tensors laid end to end
in the payload. There is no pickle anywhere in this module, by design.
"""

import hashlib
import hmac
import json
import os
import struct
import sys

import numpy as np

__all__ = [
    "DTYPES",
    "MAGIC",
    "MAX_DIM",
    "MAX_HEADER_BYTES",
    "MAX_NAME_CHARS",
    "MAX_PAYLOAD_BYTES",
    "MAX_RANK",
    "MAX_TENSORS",
    "OPS",
    "PREFIX",
    "PROFILE_TENSOR",
    "Channel",
    "FAST_MAGIC",
    "FastCodec",
    "encode_fast",
    "GEN_FIELD",
    "MAX_GENERATION",
    "Frame",
    "auth_token",
    "PeerClosed",
    "ProtocolError",
    "decode_tensors",
    "dtype_of_tag",
    "encode_frame",
    "parse_frame",
    "recv_frame",
    "send_encoded",
    "send_frame",
    "tag_of_dtype",
    "validate_header",
    "validate_header_bytes",
    "validate_prefix",
    "validate_tensor_descs",
    "with_generation",
]

MAGIC = b"XSW1"
#: The profile's bytes in an ``evidence_data`` frame (a name no ONNX output can take: it is
#: not a valid identifier, and the client refuses a stage whose outputs use it anyway).
PROFILE_TENSOR = "xstage:profile"


def auth_token(secret, pid):
    """The hello's proof that the worker holds the secret the client wrote to its stdin."""
    return hmac.new(secret.encode("utf-8"), ("xstage-hello:%d" % pid).encode(), hashlib.sha256).hexdigest()

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
_MAX_SPAN = (1 << 63) - 1


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
    "load": {"runtime": (_STR, True), "path": (_STR, True), "options": (_OBJ, False)},
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
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


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
        if span > _MAX_SPAN:
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


class Frame:
    """One decoded frame: the validated header and the payload it describes."""

    __slots__ = ("header", "payload", "tensors", "fast")

    def __init__(self, header, payload, tensors, fast=False):
        self.header = header
        self.payload = payload
        self.tensors = tensors
        #: True for a binary call frame (``XSB1``: ``run`` or ``result``, see ``FastCodec``).
        self.fast = fast

    @property
    def op(self):
        return self.header["op"]

    @property
    def id(self):
        return self.header["id"]

    def arrays(self):
        """The frame's tensors as numpy arrays viewing the payload (writable, C order)."""
        return decode_tensors(self.tensors, self.payload)

    def __repr__(self):
        return "Frame(op=%r, id=%r, tensors=%d)" % (self.op, self.id, len(self.tensors))


def decode_tensors(tensors, payload):
    """Arrays for validated descriptors; zero-copy views of ``payload``."""
    out = {}
    for name, tag, shape, offset, nbytes in tensors:
        dtype = dtype_of_tag(tag, name)
        if nbytes == 0:
            arr = np.empty(shape, dtype=dtype)
        else:
            arr = np.frombuffer(payload, dtype=dtype, count=nbytes // dtype.itemsize,
                                offset=offset).reshape(shape)
        out[name] = arr
    return out


def encode_tensors(arrays):
    """Descriptors and buffers for a name → array mapping (non-contiguous arrays copied once)."""
    descs = []
    buffers = []
    offset = 0
    if len(arrays) > MAX_TENSORS:
        raise ProtocolError("%d tensors in one frame exceed the limit %d" % (len(arrays), MAX_TENSORS))
    for name, arr in arrays.items():
        if not isinstance(name, str) or not name:
            raise ProtocolError("tensor name %r is not a non-empty string" % (name,))
        if len(name) > MAX_NAME_CHARS:
            raise ProtocolError("tensor name %r is not a string of 1..%d chars"
                                % (name, MAX_NAME_CHARS))
        arr = np.asarray(arr)
        tag = tag_of_dtype(arr.dtype)
        if len(arr.shape) > MAX_RANK:
            raise ProtocolError("tensor %r: rank %d exceeds %d" % (name, arr.ndim, MAX_RANK))
        if arr.shape and max(arr.shape) > MAX_DIM:
            raise ProtocolError("tensor %r: dimension %d is over 2^40" % (name, max(arr.shape)))
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        nbytes = arr.nbytes
        descs.append({"name": name, "dtype": tag, "shape": [int(d) for d in arr.shape],
                      "offset": offset, "nbytes": nbytes})
        if nbytes:
            buffers.append(_byte_view(arr))
        offset += nbytes
    return descs, buffers, offset


#: Descriptor JSON by signature: calls repeat one signature, and building the ``t`` list and
#: encoding it is most of a small frame's encoding time. Key: ``((name, dtype, shape), ...)``
#: (the dtype carries the byte order); value: ``(t JSON, payload length, byte views)``.
_SIGNATURES = {}
_MAX_SIGNATURES = 256
#: Only descriptor lists up to this size are kept (by writers and readers): the common
#: signatures of a few tensors, never a megabyte header of thousands.
_MAX_CACHED_T_BYTES = 4096
#: Every encoder here writes ``t`` last, so a reader can take the descriptor list apart from
#: the rest of the header (``_split_head``).
_T_KEY = b',"t":'


def _byte_view(arr):
    """The bytes of a C-contiguous, non-empty array (a tenth of the cost of a uint8 view)."""
    try:
        return memoryview(arr).cast("B")
    except (ValueError, TypeError, BufferError, NotImplementedError):
        # numpy cannot export bfloat16 (ml_dtypes) through the buffer protocol.
        return memoryview(arr.reshape(-1).view(np.uint8))


def _encode_arrays(arrays):
    """``(t JSON bytes, buffers, payload length)`` for name → array; a signature met before
    reuses its descriptor JSON (names, dtypes and shapes were checked when it was built)."""
    if len(arrays) > MAX_TENSORS:
        raise ProtocolError("%d tensors in one frame exceed the limit %d" % (len(arrays), MAX_TENSORS))
    arrs = [(name, arr if type(arr) is np.ndarray else np.asarray(arr))
            for name, arr in arrays.items()]
    try:
        key = tuple([(name, arr.dtype, arr.shape) for name, arr in arrs])
        known = _SIGNATURES.get(key)
    except TypeError:  # an unhashable name: the full path names the problem
        known = None
    if known is None:
        descs, buffers, plen = encode_tensors(dict(arrs))
        raw = _ENCODER.encode(descs).encode("utf-8")
        if len(raw) <= _MAX_CACHED_T_BYTES:  # bounded: at most 256 lists of 4 KiB
            if len(_SIGNATURES) >= _MAX_SIGNATURES:
                _SIGNATURES.clear()
            _SIGNATURES[key] = (raw, plen, [d["nbytes"] != 0 for d in descs])
        return raw, buffers, plen
    raw, plen, nonempty = known
    buffers = []
    for (name, arr), keep in zip(arrs, nonempty):
        if keep:
            if not arr.flags.c_contiguous or arr.dtype.byteorder == ">" or (
                    arr.dtype.byteorder == "=" and sys.byteorder == "big"):
                arr = encode_tensors({name: arr})[1][0]  # the copy the full path makes
                buffers.append(arr)
            else:
                buffers.append(_byte_view(arr))
    return raw, buffers, plen


def encode_frame(header, arrays=None):
    """A list of buffers making one frame: prefix + header + tensor bytes (no joined copy).

    The header is encoded with ``t`` as its last member (``docs/wire.md`` does not require
    an order; this encoder's fixed one lets a reader reuse the descriptors it checked for an
    earlier frame of the same signature).
    """
    header = dict(header)
    buffers = []
    plen = 0
    tjson = None
    if arrays is not None:
        # Descriptors built here meet every limit by construction (encode_tensors checks
        # what numpy does not), so only a caller's own ``t`` list is validated again.
        tjson, buffers, plen = _encode_arrays(arrays)
        header["t"] = _NO_TENSORS
    elif "t" in header:
        validate_tensor_descs(header["t"], plen)
    validate_header(header)
    if tjson is not None:
        del header["t"]
    try:
        raw = _ENCODER.encode(header).encode("utf-8")
    except (TypeError, ValueError) as exc:  # NaN/inf, sets, numpy scalars, cycles
        raise ProtocolError("header cannot be encoded as strict JSON (%s)" % exc) from None
    if tjson is not None:
        raw = b"".join((raw[:-1], _T_KEY, tjson, b"}"))
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError("header is %d bytes, over the limit %d" % (len(raw), MAX_HEADER_BYTES))
    return [PREFIX.pack(MAGIC, len(raw), plen), raw] + buffers


_NO_TENSORS = []


# ------------------------------------------------------------------- binary call frames
#
# The per-call frames, ``run`` and ``result``, MAY travel as binary frames once both ends
# have agreed (the worker lists ``fast-frames`` in its hello; the client then sends its
# ``run`` frames in binary and the worker answers a binary ``run`` with a binary ``result``).
# The prefix is the JSON frame's with the magic ``XSB1``; the header is a fixed
# little-endian struct instead of JSON (docs/wire.md, "Binary call frames"):
#
#   head    kind u8 (1 run, 2 result) | flags u8 | tensors u16 | gen u32 | id u64   16 bytes
#   timing  worker_ns u64 | rss u64 | peak u64                     (result only)    24 bytes
#   tensor  index u16 | dtype code u8 | rank u8 | reserved u32 (0) | nbytes u64 | dims u64 × rank
#
# ``index`` names the tensor by its position in the loaded signature (``loaded.inputs`` for
# a run, ``loaded.outputs`` for a result); the payload holds the tensors end to end in
# descriptor order, as in a JSON frame.

FAST_MAGIC = b"XSB1"
FAST_RUN = 1
FAST_RESULT = 2
#: ``run`` flags: start from the initial state (``options.reset_state``).
FAST_RESET_STATE = 1
#: ``result`` flags: the stage keeps state (``timing.state_reset`` present) / its value.
FAST_HAS_STATE = 1
FAST_STATE_RESET = 2
FAST_HEAD = struct.Struct("<BBHIQ")
FAST_TIMING = struct.Struct("<QQQ")
FAST_TENSOR = struct.Struct("<HBBIQ")
_FAST_FLAGS = {FAST_RUN: FAST_RESET_STATE, FAST_RESULT: FAST_HAS_STATE | FAST_STATE_RESET}
_FAST_OPS = {FAST_RUN: "run", FAST_RESULT: "result"}
_FAST_KINDS = {"run": FAST_RUN, "result": FAST_RESULT}
_U64 = (1 << 64) - 1
_DIMS = {}  # rank -> Struct of rank u64


def _dims_struct(rank):
    st = _DIMS.get(rank)
    if st is None:
        st = _DIMS[rank] = struct.Struct("<%dQ" % rank)
    return st


def _little(arr):
    """``arr`` C-contiguous and little-endian: the bytes a frame carries (copied if needed)."""
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


class FastCodec:
    """Binary ``run``/``result`` frames for one loaded signature (both ends build one).

    ``inputs`` and ``outputs`` are the loaded stage's tensor names in ``loaded``'s order: a
    descriptor's index is a position in one of them. Descriptors are cached per call
    signature on both sides (bounded), so a call repeating its signature packs and checks
    two small structs.
    """

    def __init__(self, inputs, outputs):
        self.names = {FAST_RUN: tuple(inputs), FAST_RESULT: tuple(outputs)}
        self.index = {kind: {n: i for i, n in enumerate(names)}
                      for kind, names in self.names.items()}
        for kind, names in self.names.items():
            if len(self.index[kind]) != len(names) or len(names) > 0xFFFF:
                raise ProtocolError("a signature for binary frames needs at most 65535 unique "
                                    "names per side (%s)" % _FAST_OPS[kind])
        self._enc = {}
        self._dec = {}
        self._lanes = {}

    # ---------------------------------------------------------------- writing
    def encode(self, kind, rid, gen, flags, arrays, timing=None):
        """``[prefix, header, *tensor bytes]`` of one binary frame (as ``encode_frame``).

        ``timing``: ``(worker_ns, rss, peak)`` of a result. Every limit is checked here, so
        a frame this returns is one the reader accepts.
        """
        arrs = arrays.items()
        try:
            key = (kind,) + tuple([(name, arr.dtype, arr.shape) for name, arr in arrs
                                   if type(arr) is np.ndarray])
            known = self._enc.get(key) if len(key) == len(arrays) + 1 else None
        except TypeError:  # an unhashable name
            key, known = None, None
        if known is None:
            arrs = [(name, np.asarray(arr)) for name, arr in arrs]
            if key is not None and len(key) != len(arrs) + 1:
                key = (kind,) + tuple([(name, arr.dtype, arr.shape) for name, arr in arrs])
            known = self._signature(kind, arrs, key)
        descs, plen, views = known
        buffers = []
        for (_, arr), view in zip(arrs, views):
            if view == 1 and arr.flags.c_contiguous:
                buffers.append(_byte_view(arr))
            elif view:
                buffers.append(_byte_view(_little(arr)))
        if flags & ~_FAST_FLAGS.get(kind, 0) or not 1 <= gen <= MAX_GENERATION \
                or not 0 <= rid < 1 << 63:
            raise ProtocolError("binary %s frame: flags %r, gen %r or id %r out of range"
                                % (_FAST_OPS.get(kind, kind), flags, gen, rid))
        head = FAST_HEAD.pack(kind, flags, len(arrs), gen, rid)
        if kind == FAST_RESULT:
            try:
                head += FAST_TIMING.pack(*timing)
            except (struct.error, TypeError):
                raise ProtocolError("binary result frame: timing %r is not three integers "
                                    "in [0, 2^64)" % (timing,)) from None
        head += descs
        return [PREFIX.pack(FAST_MAGIC, len(head), plen), head] + buffers

    def _signature(self, kind, arrs, key):
        """Descriptor bytes, payload length and per tensor 0 (empty), 1 (bytes as they are)
        or 2 (converted to little-endian) for one call signature, checked once."""
        index = self.index.get(kind)
        if index is None:
            raise ProtocolError("binary frame kind %r is not run (1) or result (2)" % (kind,))
        if len(arrs) > MAX_TENSORS:
            raise ProtocolError("%d tensors in one frame exceed the limit %d"
                                % (len(arrs), MAX_TENSORS))
        out = []
        views = []
        plen = 0
        seen = set()
        for name, arr in arrs:
            i = index.get(name) if isinstance(name, str) else None
            if i is None:
                raise ProtocolError("tensor %r is not an %s of the loaded stage (%s)"
                                    % (name, "input" if kind == FAST_RUN else "output",
                                       ", ".join(self.names[kind])))
            if i in seen:
                raise ProtocolError("tensor %r appears twice in one frame" % (name,))
            seen.add(i)
            tag = tag_of_dtype(arr.dtype)
            if arr.ndim > MAX_RANK:
                raise ProtocolError("tensor %r: rank %d exceeds %d" % (name, arr.ndim, MAX_RANK))
            if arr.shape and max(arr.shape) > MAX_DIM:
                raise ProtocolError("tensor %r: dimension %d is over 2^40" % (name, max(arr.shape)))
            nbytes = arr.size * DTYPES[tag][1]
            out.append(FAST_TENSOR.pack(i, DTYPE_CODES[tag], arr.ndim, 0, nbytes))
            out.append(_dims_struct(arr.ndim).pack(*arr.shape))
            bo = arr.dtype.byteorder
            views.append(0 if nbytes == 0 else
                         2 if bo == ">" or (bo == "=" and sys.byteorder == "big") else 1)
            plen += nbytes
        known = (b"".join(out), plen, tuple(views))
        if key is not None:
            if len(self._enc) >= _MAX_SIGNATURES:
                self._enc.clear()
            self._enc[key] = known
        return known

    def lane(self, kind, gen, arrays):
        """The ``_Lane`` of one call signature (kind, generation, names, dtypes, shapes), or
        None where its frame is not one small record of plain bytes (a tensor to convert to
        little-endian, bfloat16, a frame over ``SMALL_FRAME``). Built once, from the frame
        ``encode`` writes, and kept per signature (bounded)."""
        try:
            key = (kind, gen) + tuple([(name, type(arr), arr.dtype, arr.shape)
                                       for name, arr in arrays.items()])
            lane = self._lanes.get(key, False)
        except (AttributeError, TypeError):  # not arrays, or an unhashable name
            return None
        if lane is not False:
            return lane
        lane = None
        if 1 <= gen <= MAX_GENERATION and kind in self.names \
                and all(t is np.ndarray for _, t, _, _ in key[2:]):
            try:
                descs, plen, views = self._signature(
                    kind, [(name, arr) for name, arr in arrays.items()], None)
            except ProtocolError:  # the long way names the problem
                return None
            if 2 not in views and plen + FAST_HEAD.size + len(descs) + PREFIX.size \
                    + FAST_TIMING.size <= SMALL_FRAME:
                head = FAST_HEAD.pack(kind, 0, len(arrays), gen, 0)
                if kind == FAST_RESULT:
                    head += FAST_TIMING.pack(0, 0, 0)
                lane = _Lane(kind, head + descs, plen, [
                    (name, n) for (name, arr), n in zip(arrays.items(), _sizes(descs, len(arrays)))])
                lane._signed([(name, arr.dtype, arr.shape) for name, arr in arrays.items()])
                try:
                    lane.fill(0, arrays)
                except (ValueError, TypeError, BufferError):  # no plain buffer (bfloat16)
                    lane = None
        if len(self._lanes) >= _MAX_SIGNATURES:
            self._lanes.clear()
        self._lanes[key] = lane
        return lane

    def expect(self, kind, gen, tensors, plen):
        """The ``_Expect`` of the frames of ``kind`` and generation ``gen`` that carry the
        checked descriptor list ``tensors`` (as ``decode_head`` returned it for a frame of
        payload ``plen``), no flags set, in one record; None where there is none.

        Its fixed bytes are written from ``tensors`` (a checked list has one encoding) and
        decoded once here the long way: a frame that equals them outside the id (and a
        result's timing) is one ``decode_head`` accepts, with these tensors.
        """
        index = self.index.get(kind)
        if index is None or not 1 <= gen <= MAX_GENERATION:
            return None
        out = []
        try:
            for name, tag, shape, _, nbytes in tensors:
                out.append(FAST_TENSOR.pack(index[name], DTYPE_CODES[tag], len(shape), 0, nbytes))
                out.append(_dims_struct(len(shape)).pack(*shape))
            head = FAST_HEAD.pack(kind, 0, len(tensors), gen, 0)
        except (KeyError, TypeError, ValueError, struct.error):
            return None
        if kind == FAST_RESULT:
            head += FAST_TIMING.pack(0, 0, 0)
        descs = b"".join(out)
        n = PREFIX.size + len(head) + len(descs) + plen
        if n > SMALL_FRAME:
            return None
        try:
            header, checked = self.decode_head(head + descs, plen)
        except ProtocolError:
            return None
        if list(checked) != list(tensors) or "options" in header or (
                "timing" in header and len(header["timing"]) != 3):
            return None
        return _Expect(self, kind, PREFIX.pack(FAST_MAGIC, len(head) + len(descs), plen)
                       + head[:8], descs, n, plen, checked)

    # ---------------------------------------------------------------- reading
    def decode_head(self, raw, plen):
        """A binary header checked against ``plen``: ``(header dict, tensors)``.

        The header dict is the JSON frame's (``op``, ``id``, ``gen``, and ``options`` of a
        run or ``timing`` of a result); the tensors are ``(name, tag, shape, offset,
        nbytes)`` as ``validate_tensor_descs`` returns them. Every field is checked before
        anything is sized by it: a malformed header is a ``ProtocolError`` naming the field.
        """
        raw = bytes(raw)
        if len(raw) < FAST_HEAD.size:
            raise ProtocolError("binary frame: header is %d bytes, shorter than its %d-byte "
                                "fixed part" % (len(raw), FAST_HEAD.size))
        kind, flags, n, gen, rid = FAST_HEAD.unpack_from(raw)
        if kind == FAST_RUN:
            start = FAST_HEAD.size
            header = {"op": "run", "id": rid, "gen": gen}
            if flags & FAST_RESET_STATE:
                header["options"] = {"reset_state": True}
        elif kind == FAST_RESULT:
            start = FAST_HEAD.size + FAST_TIMING.size
            if len(raw) < start:
                raise ProtocolError("binary result frame: header is %d bytes, shorter than its "
                                    "%d-byte fixed part with timing" % (len(raw), start))
            worker_ns, rss, peak = FAST_TIMING.unpack_from(raw, FAST_HEAD.size)
            timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak}
            if flags & FAST_HAS_STATE:
                timing["state_reset"] = bool(flags & FAST_STATE_RESET)
            header = {"op": "result", "id": rid, "gen": gen, "timing": timing}
        else:
            raise ProtocolError("binary frame: kind %d is not run (1) or result (2)" % kind)
        if flags & ~_FAST_FLAGS[kind]:
            raise ProtocolError("binary %s frame: unknown flags 0x%02x" % (_FAST_OPS[kind], flags))
        if not 1 <= gen <= MAX_GENERATION:
            raise ProtocolError("binary %s frame: gen %d is not in [1, 2^32)" % (_FAST_OPS[kind], gen))
        if rid >= 1 << 63:
            raise ProtocolError("binary %s frame: id %d is not in [0, 2^63)" % (_FAST_OPS[kind], rid))
        key = (kind, n, raw[start:], plen)
        tensors = self._dec.get(key)
        if tensors is None:
            tensors = self._check_tensors(kind, n, raw, start, plen)
            if len(raw) - start <= _MAX_CACHED_T_BYTES:
                if len(self._dec) >= _MAX_CHECKED_T:
                    self._dec.clear()
                self._dec[key] = tensors
        return header, tensors

    def _check_tensors(self, kind, n, raw, pos, plen):
        op = _FAST_OPS[kind]
        names = self.names[kind]
        if n > len(names):
            raise ProtocolError("binary %s frame: %d tensors, the loaded stage has %d %ss"
                                % (op, n, len(names), "input" if kind == FAST_RUN else "output"))
        out = []
        seen = set()
        cursor = 0
        for i in range(n):
            if len(raw) - pos < FAST_TENSOR.size:
                raise ProtocolError("binary %s frame: tensor %d: descriptor cut short (header "
                                    "ends at byte %d)" % (op, i, len(raw)))
            index, code, rank, reserved, nbytes = FAST_TENSOR.unpack_from(raw, pos)
            pos += FAST_TENSOR.size
            if index >= len(names):
                raise ProtocolError("binary %s frame: tensor %d: index %d is past the loaded "
                                    "stage's %d names" % (op, i, index, len(names)))
            name = names[index]
            if index in seen:
                raise ProtocolError("binary %s frame: tensor %r (index %d) appears twice"
                                    % (op, name, index))
            seen.add(index)
            tag = CODE_DTYPES.get(code)
            if tag is None:
                raise ProtocolError("binary %s frame: tensor %r: dtype code %d is not in the "
                                    "wire's table" % (op, name, code))
            if rank > MAX_RANK:
                raise ProtocolError("binary %s frame: tensor %r: rank %d exceeds %d"
                                    % (op, name, rank, MAX_RANK))
            if reserved:
                raise ProtocolError("binary %s frame: tensor %r: reserved field is %d, not 0"
                                    % (op, name, reserved))
            if len(raw) - pos < 8 * rank:
                raise ProtocolError("binary %s frame: tensor %r: %d dims cut short (header "
                                    "ends at byte %d)" % (op, name, rank, len(raw)))
            shape = _dims_struct(rank).unpack_from(raw, pos)
            pos += 8 * rank
            itemsize = DTYPES[tag][1]
            count = 1
            span = itemsize
            for dim in shape:
                if dim > MAX_DIM:
                    raise ProtocolError("binary %s frame: tensor %r: dimension %d is over 2^40"
                                        % (op, name, dim))
                count *= dim
                span *= dim or 1
            if span > _MAX_SPAN:
                raise ProtocolError("binary %s frame: tensor %r: shape %r spans more than "
                                    "2^63 - 1 bytes" % (op, name, list(shape)))
            if nbytes != count * itemsize:
                raise ProtocolError("binary %s frame: tensor %r: nbytes %d != prod(shape) * "
                                    "itemsize = %d" % (op, name, nbytes, count * itemsize))
            if cursor + nbytes > plen:
                raise ProtocolError("binary %s frame: tensor %r ends at byte %d, past the "
                                    "payload's %d" % (op, name, cursor + nbytes, plen))
            out.append((name, tag, shape, cursor, nbytes))
            cursor += nbytes
        if pos != len(raw):
            raise ProtocolError("binary %s frame: header is %d bytes, its fields end at byte %d"
                                % (op, len(raw), pos))
        if cursor != plen:
            raise ProtocolError("binary %s frame: tensors cover %d bytes of a %d-byte payload"
                                % (op, cursor, plen))
        return out


def _sizes(descs, n):
    """The byte length of each of ``n`` tensors, read back from their binary descriptors."""
    out = []
    pos = 0
    for _ in range(n):
        _, _, rank, _, nbytes = FAST_TENSOR.unpack_from(descs, pos)
        pos += FAST_TENSOR.size + 8 * rank
        out.append(nbytes)
    return out


class _Lane:
    """One call signature's binary frame, kept whole with room for its record trailer.

    The common case of a call (a fixed signature, no state reset, nothing to convert): the
    prefix, the fixed header and the descriptors were written once, by ``FastCodec.encode``'s
    checks; per call only the request id (and a result's timing) is packed into place and
    the tensors' bytes copied in (``fill``). ``buf`` is the frame (``n`` bytes) followed by
    ``TRAILER_BYTES`` for ``Channel.send_sealed``; it is reused, so it is sent before the
    next ``fill`` (a call sends synchronously). The bytes equal ``encode``'s.
    """

    __slots__ = ("buf", "view", "n", "frame", "_id_at", "_timing_at", "_places", "_sig")

    def __init__(self, kind, head, plen, sizes):
        prefix = PREFIX.pack(FAST_MAGIC, len(head), plen)
        self.n = len(prefix) + len(head) + plen
        self.buf = bytearray(prefix + head) + bytearray(plen + TRAILER_BYTES)
        self.view = memoryview(self.buf)
        self.frame = self.view[:self.n]  # the frame without the trailer (plain streams)
        self._id_at = PREFIX.size + 8
        self._timing_at = PREFIX.size + FAST_HEAD.size if kind == FAST_RESULT else None
        places = []
        at = len(prefix) + len(head)
        for name, nbytes in sizes:
            if nbytes:  # an empty tensor has no bytes to copy
                places.append((name, at, at + nbytes))
            at += nbytes
        self._places = tuple(places)
        self._sig = None

    def _signed(self, sig):
        """Keep the signature it was built for, ``[(name, dtype, shape)]`` in its order (with
        numpy arrays: ``FastCodec.lane``'s key), for ``fill_same``."""
        at = {name: (start, end) for name, start, end in self._places}
        self._sig = tuple((name, dtype, shape) + at.get(name, (0, 0))
                          for name, dtype, shape in sig)

    def fill_same(self, rid, arrays, timing=None):
        """``fill`` for arrays of the signature this lane was built for (the names in its
        order, numpy arrays of its dtypes and shapes), compared in the loop that copies them;
        None where they are not (the caller takes the long way; what was copied is
        overwritten by the next fill, and nothing is sent). Raises as ``fill``."""
        if rid >= 1 << 63:
            raise struct.error("request id %d is not in [0, 2^63)" % rid)
        sig = self._sig
        if sig is None or len(arrays) != len(sig):
            return None
        view = self.view
        ndarray = np.ndarray
        for (name, dtype, shape, start, end), (got, arr) in zip(sig, arrays.items()):
            if got != name or type(arr) is not ndarray or arr.dtype != dtype \
                    or arr.shape != shape:
                return None
            if start:  # an empty tensor has no bytes to copy
                view[start:end] = arr.data.cast("B")
        if timing is None:
            _U64_AT.pack_into(self.buf, self._id_at, rid)
        elif self._timing_at is None:
            raise TypeError("a run frame carries no timing")
        else:  # a result's: the timing follows the id
            _ID_TIMING.pack_into(self.buf, self._id_at, rid, *timing)
        return self

    def fill(self, rid, arrays, timing=None):
        """Pack ``rid`` (and ``timing``: worker_ns, rss, peak) and copy the arrays' bytes in.

        ValueError or BufferError where an array has no C-contiguous buffer (the caller
        then encodes the frame the long way); struct.error for a field out of range.
        """
        if rid >= 1 << 63:
            raise struct.error("request id %d is not in [0, 2^63)" % rid)
        buf = self.buf
        if timing is None:
            _U64_AT.pack_into(buf, self._id_at, rid)
        elif self._timing_at is None:
            raise TypeError("a run frame carries no timing")
        else:  # a result's: the timing follows the id
            _ID_TIMING.pack_into(buf, self._id_at, rid, *timing)
        view = self.view
        for name, start, end in self._places:
            # Same length (the signature fixes it); a view that is not C-contiguous cannot
            # be cast (TypeError), bfloat16 has no buffer (ValueError).
            view[start:end] = arrays[name].data.cast("B")
        return self


_U64_AT = struct.Struct("<Q")
#: A binary frame's bytes before its id: the prefix, then kind, flags, tensor count, gen.
_FIXED_BYTES = 24
#: A result's id and timing, read in one step (``_Expect``).
_ID_TIMING = struct.Struct("<QQQQ")


class _Expect:
    """The next frame as one call signature makes it: what ``Channel.recv`` checks it against
    in fewer steps (``FastCodec.expect`` builds one from a checked frame).

    ``fixed``: the prefix and the header's first 8 bytes (kind, flags 0, tensor count, gen);
    ``descs``: the descriptors, after the id (and a result's timing). A frame whose bytes
    equal these is one of ``n`` bytes, one record, that ``decode_head`` accepts with
    ``tensors``; ``Channel.recv`` then checks its counter and tag and its id, and fills
    ``fields`` (``(id,)`` of a run, ``(id, worker_ns, rss, peak)`` of a result) and
    ``payload`` (the payload's own bytes). ``rid``: the id the frame must carry, set by the
    caller before each receive (None: any id in ``[0, 2^63)``).
    """

    __slots__ = ("codec", "kind", "prefix", "fixed", "descs", "descs_at", "payload_at", "n",
                 "plen", "tensors", "unpack", "rid", "fields", "payload")

    def __init__(self, codec, kind, fixed, descs, n, plen, tensors):
        self.codec = codec
        self.kind = kind
        self.prefix = fixed[:PREFIX.size]
        self.fixed = fixed
        self.descs = descs
        self.descs_at = _FIXED_BYTES + (_ID_TIMING.size if kind == FAST_RESULT else _U64_AT.size)
        self.payload_at = self.descs_at + len(descs)
        self.n = n
        self.plen = plen
        self.tensors = tensors
        self.unpack = (_ID_TIMING if kind == FAST_RESULT else _U64_AT).unpack_from
        self.rid = None
        self.fields = None
        self.payload = None


def encode_fast(codec, op, rid, gen, arrays, options=None, timing=None):
    """A ``run`` or ``result`` header's frame in binary (``codec``), else None when its
    fields do not fit the binary header (the caller then encodes it as JSON).

    ``options`` of a run: only ``reset_state``; ``timing`` of a result: ``worker_ns``,
    ``rss``, ``peak`` and optionally ``state_reset``, nothing else.
    """
    kind = _FAST_KINDS.get(op)
    flags = 0
    fixed = None
    if kind == FAST_RUN:
        if options:
            if set(options) - {"reset_state"}:
                return None
            flags = FAST_RESET_STATE if options.get("reset_state") else 0
    elif kind == FAST_RESULT:
        timing = timing or {}
        if set(timing) - {"worker_ns", "rss", "peak", "state_reset"}:
            return None
        fixed = (timing.get("worker_ns", 0), timing.get("rss", 0), timing.get("peak", 0))
        if not all(type(v) is int and 0 <= v <= _U64 for v in fixed):
            return None
        if "state_reset" in timing:
            flags = FAST_HAS_STATE | (FAST_STATE_RESET if timing["state_reset"] else 0)
    else:
        return None
    return codec.encode(kind, rid, gen, flags, arrays or {}, fixed)


def _read_prefix(prefix, max_payload):
    """``(fast, header_len, payload_len)`` of a frame's prefix, JSON (XSW1) or binary (XSB1)."""
    if prefix[:4] == FAST_MAGIC and len(prefix) == PREFIX.size:
        _, hlen, plen = PREFIX.unpack(prefix)
        if hlen < FAST_HEAD.size or hlen > MAX_HEADER_BYTES:
            raise ProtocolError("binary frame header length %d is outside [%d, %d]"
                                % (hlen, FAST_HEAD.size, MAX_HEADER_BYTES))
        if plen > max_payload:
            raise ProtocolError("payload length %d exceeds the limit %d" % (plen, max_payload))
        return True, hlen, plen
    hlen, plen = validate_prefix(prefix, max_payload)
    return False, hlen, plen


def _head(fast, raw, plen, codec):
    """A frame's header checked: JSON (``_validate_head``) or binary (``codec``)."""
    if not fast:
        return _validate_head(raw, plen)
    if codec is None:
        raise ProtocolError("binary frame (XSB1) where this end expects JSON frames (binary "
                            "call frames follow a load on a connection that agreed to them)")
    return codec.decode_head(raw, plen)


def send_frame(sock, header, arrays=None):
    """Encode and send one frame on a stream socket."""
    send_encoded(sock, encode_frame(header, arrays))


def send_encoded(sock, parts):
    """Send one frame already encoded (``encode_frame``, ``FastCodec.encode``), as plain
    frames go: a small one joined in one ``sendall``, a large one part by part."""
    if sum(len(p) for p in parts) <= 1 << 16:
        sock.sendall(b"".join(parts))
        return
    for part in parts:
        sock.sendall(part)


class PeerClosed(EOFError):
    """Raised when the stream ends; ``partial`` says whether it ended inside a frame."""

    def __init__(self, partial):
        EOFError.__init__(self, "peer closed the stream" + (" mid-frame" if partial else ""))
        self.partial = partial


def _recv_exactly(sock, view, started):
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed(started or got > 0)
        got += k


#: Checked descriptor lists by their exact bytes and the payload length: ``(t JSON, plen)``
#: → ``(descriptors, tensors)``. Filled by ``_validate_head``; a hit skips the parse and the
#: checks of a list already checked, byte for byte.
_CHECKED_T = {}
_MAX_CHECKED_T = 256


def _split_head(raw):
    """``(rest, t JSON)`` for a header whose last member is ``"t":[...]``, else None.

    ``rest`` is the header without that member. When ``rest`` parses as a JSON object
    without a ``t`` key and the tail as a JSON array, the whole is exactly that object with
    ``t`` added: ``,"t":[`` cannot occur inside a JSON string (a quote there is escaped), and
    a split inside a nested object leaves ``rest`` unbalanced, which its parse refuses (the
    caller then takes the full path).
    """
    if raw[-2:] != b"]}":
        return None
    cut = raw.rfind(_T_KEY + b"[")
    if cut <= 1:
        return None
    return raw[:cut] + b"}", raw[cut + len(_T_KEY):-1]


def _rest_object(rest):
    """The header without its ``t`` member, parsed, or None where that is not a non-empty
    JSON object without ``t`` (then the split was not the top level's last member)."""
    try:
        obj = validate_header_bytes(rest)
    except ProtocolError:
        return None
    return obj if obj and "t" not in obj else None


def _validate_head(raw, plen):
    """A frame's header bytes, checked cheapest-first, and its tensor list against ``plen``.

    The one head check of every reader (``recv_frame``, ``parse_frame``, ``Channel.recv``).
    A descriptor list byte-identical to one checked before (with the same ``plen``) is
    taken from ``_CHECKED_T`` instead of being parsed and checked again.
    """
    raw = bytes(raw)
    split = _split_head(raw) if plen else None
    if split is not None:
        known = _CHECKED_T.get((split[1], plen))
        if known is not None:
            header = _rest_object(split[0])
            if header is not None:
                descs, tensors = known
                header["t"] = [dict(d) for d in descs]
                validate_header(header)
                return header, tensors
    header = validate_header_bytes(raw)
    op = validate_header(header)
    if "t" in header:
        tensors = validate_tensor_descs(header["t"], plen)
        if split is not None and len(split[1]) <= _MAX_CACHED_T_BYTES:
            _remember_t(split, plen, header["t"], tensors)
        return header, tensors
    if plen:
        raise ProtocolError("op %s carries a %d-byte payload and no tensor list" % (op, plen))
    return header, []


def _remember_t(split, plen, descs, tensors):
    """Keep a checked list for its exact bytes, once the split is shown to be the top level's
    last member (the rest an object without ``t``, the tail exactly this list)."""
    rest, tail = split
    if _rest_object(rest) is None:
        return
    try:
        same = json.loads(tail.decode("utf-8")) == descs
    except ValueError:
        same = False
    if not same:
        return
    if len(_CHECKED_T) >= _MAX_CHECKED_T:
        _CHECKED_T.clear()
    _CHECKED_T[(tail, plen)] = (tuple(dict(d) for d in descs), tensors)


def recv_frame(sock, max_payload=MAX_PAYLOAD_BYTES, codec=None):
    """Read, validate and return one Frame; nothing peer-sized is allocated before it passes.

    ``codec``: the ``FastCodec`` of the loaded signature where binary call frames were
    agreed (a binary frame without one is refused).
    """
    prefix = bytearray(PREFIX.size)
    _recv_exactly(sock, memoryview(prefix), False)
    fast, hlen, plen = _read_prefix(bytes(prefix), max_payload)
    raw = bytearray(hlen)
    _recv_exactly(sock, memoryview(raw), True)
    header, tensors = _head(fast, raw, plen, codec)
    # np.empty, not bytearray: no zero-fill pass over memory the socket overwrites anyway.
    payload = np.empty(plen, dtype=np.uint8)
    if plen:
        _recv_exactly(sock, memoryview(payload), True)
    return Frame(header, payload, tensors, fast)


def parse_frame(data, max_payload=MAX_PAYLOAD_BYTES, codec=None):
    """Validate and decode one complete frame held in memory (the fuzz target)."""
    data = memoryview(data)
    fast, hlen, plen = _read_prefix(bytes(data[: PREFIX.size]), max_payload)
    end = PREFIX.size + hlen
    if len(data) < end:
        raise ProtocolError("frame holds %d bytes, its header needs %d" % (len(data), end))
    header, tensors = _head(fast, data[PREFIX.size:end], plen, codec)
    if len(data) != end + plen:
        raise ProtocolError("frame holds %d bytes, its lengths say %d" % (len(data), end + plen))
    frame = Frame(header, bytearray(data[end:]), tensors, fast)
    frame.arrays()  # dtype availability (bfloat16) is part of decoding
    return frame


def send_parts(sock, parts):
    """Send a frame's buffers in one system call where the kernel takes them all.

    One ``sendmsg`` (gather, no joined copy) instead of one ``sendall`` per part: each
    separate send can wake the reader for a partial frame, and on a virtual machine a
    wake-up of a sleeping peer costs tens of microseconds (docs/performance.md#doorbell).
    """
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views[:1024])  # IOV_MAX is 1024 on Linux
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


# ----------------------------------------------------------------- authenticated channel
#
# Across the OS boundary (TCP connect-back) the stream is authenticated (docs/security.md):
#
#   worker → client  hello    {..., nonce: Nw}            fresh 32 random bytes, hex
#   client → worker  auth     {nonce: Nc, proof: Pc}      Pc = HMAC(secret, "client" | T)
#   worker → client  auth_ok  {proof: Pw}                 Pw = HMAC(secret, "worker" | T)
#
# where T = SHA-256("xstage-handshake-v1" | digest(hello header) | Nw | Nc). Each side
# derives one key per direction from the secret and T, and every later frame travels as
# records: the bytes, then a trailer of an 8-byte record counter and HMAC-SHA256(key,
# counter | bytes). A frame of at most SMALL_FRAME bytes is one record; a larger one is
# prefix + header, then its payload in CHUNK_BYTES records, each checked as it arrives.

#: The MAC of every record, by name (docs/security.md, docs/performance.md#channel).
MAC_NAME = "HMAC-SHA256"
TAG_BYTES = 32
COUNTER = struct.Struct("<Q")
TRAILER_BYTES = COUNTER.size + TAG_BYTES
NONCE_BYTES = 32
#: Frames up to this size (prefix + header + payload) are one record.
SMALL_FRAME = 1 << 16
_HANDSHAKE = b"xstage-handshake-v1\0"


def _mac_threads_default():
    """Threads that hash one large frame's payload records at once (0: the caller's thread).

    ``XSTAGE_MAC_THREADS`` sets it (0 to 16); by default half the CPUs this process may run
    on, at most 4, and none below 4 CPUs: the peer hashes the same records at the same time,
    and on a 2-CPU machine a second hashing thread only takes the peer's CPU.
    """
    raw = os.environ.get("XSTAGE_MAC_THREADS", "").strip()
    if raw:
        try:
            return max(0, min(16, int(raw)))
        except ValueError:
            pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(4, cpus // 2) if cpus >= 4 else 0


#: The default of ``Channel.mac_threads`` in this process.
MAC_THREADS = _mac_threads_default()
#: Record sizes a worker may announce in its hello (``record_bytes``).
RECORD_BYTES_RANGE = (1 << 16, 1 << 22)


def record_bytes_default(threads):
    """Payload bytes per record of a large frame, for a worker hashing on ``threads`` threads.

    Small enough that the two ends' MACs overlap with the transfer, large enough that a
    record's fixed cost is noise. Each record costs the sender a system call that wakes the
    reader: on 2 vCPUs (no hashing threads) 512 KiB records took the sender 5-20 % less CPU
    per MiB than 256 KiB or 1 MiB ones; on the 16-core host, where records are hashed on
    threads, 1 MiB went 1.10 GB/s each way in 256 KiB records against 0.83 in 512 KiB ones
    (two records leave two of four threads idle) (``benchmarks/channel.py``,
    ``channel_timeline.py``, docs/performance.md#channel_timeline).
    """
    return 1 << 18 if threads else 1 << 19


#: This process's record size (a worker announces it in its hello; both ends use the worker's).
CHUNK_BYTES = record_bytes_default(MAC_THREADS)


def check_record_bytes(value):
    """The record size a hello announced, checked (a power of two in ``RECORD_BYTES_RANGE``)."""
    if type(value) is not int or value & (value - 1) \
            or not RECORD_BYTES_RANGE[0] <= value <= RECORD_BYTES_RANGE[1]:
        raise ProtocolError("handshake: record_bytes %r is not a power of two in [%d, %d]"
                            % ((value,) + RECORD_BYTES_RANGE))
    return value
_POOLS = {}


def _mac_pool(threads):
    """The process's pool of ``threads`` hashing threads (hashlib lets go of the GIL while it
    hashes a large buffer, so they run beside the thread that sends or receives)."""
    key = (threads, os.getpid())  # a forked child has none of its parent's threads
    pool = _POOLS.get(key)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = _POOLS.setdefault(key, ThreadPoolExecutor(threads, "xstage-mac"))
    return pool


def new_nonce():
    """A fresh handshake nonce (hex)."""
    return os.urandom(NONCE_BYTES).hex()


def _check_nonce(nonce, who):
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
        raise ProtocolError("handshake: the %s nonce is not %d hex digits" % (who, 2 * NONCE_BYTES))
    try:
        return bytes.fromhex(nonce)
    except ValueError:
        raise ProtocolError("handshake: the %s nonce is not hex" % who) from None


def transcript(hello_header, client_nonce):
    """What both proofs and both keys are bound to: this hello and both fresh nonces."""
    canon = json.dumps(hello_header, separators=(",", ":"), sort_keys=True, allow_nan=False)
    worker_nonce = _check_nonce(hello_header.get("nonce"), "worker's")
    return hashlib.sha256(_HANDSHAKE + hashlib.sha256(canon.encode("utf-8")).digest()
                          + worker_nonce + _check_nonce(client_nonce, "client's")).digest()


def _derive(secret, label, transcript_digest):
    return hmac.new(secret.encode("utf-8"), label + b"\0" + transcript_digest, "sha256").digest()


def proof(secret, role, transcript_digest):
    """The hex proof that ``role`` (``client`` or ``worker``) holds the secret, for this T."""
    return _derive(secret, b"xstage-proof-" + role.encode(), transcript_digest).hex()


def check_proof(secret, role, transcript_digest, got):
    """Constant-time check of a peer's proof; ProtocolError naming the check on a mismatch."""
    if not isinstance(got, str) or not hmac.compare_digest(
            got.encode("ascii", "replace"), proof(secret, role, transcript_digest).encode()):
        raise ProtocolError("handshake check failed (proof): the %s does not prove the session "
                            "secret for this connection's nonces" % role)


class _Mac:
    """HMAC-SHA256 (RFC 2104) under one key, with the key's two padded blocks hashed once.

    ``hmac.digest`` redoes that per call, and an ``hmac.HMAC`` copy wraps a Python object
    around it: the copies of two prepared SHA-256 states here cost about half (a record of a
    small frame pays this twice per round trip on each side). The tag equals
    ``hmac.digest(key, counter + bytes, "sha256")`` (tests/wire/test_wire_channel.py).
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, key):
        if len(key) > 64:  # never here: the keys are 32-byte HMAC outputs
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def begin(self, counter):
        """The inner hash of a record, fed its counter; ``update`` it with the bytes."""
        inner = self._inner.copy()
        inner.update(counter)
        return inner

    def finish(self, inner):
        """The tag of a record whose bytes ``inner`` has hashed."""
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def tag(self, counter, parts):
        inner = self.begin(counter)
        for part in parts:
            inner.update(part)
        return self.finish(inner)


_EMPTY = np.empty(0, dtype=np.uint8)


class Channel:
    """Frames with integrity over one connection, after the handshake.

    ``role`` is this end (``client`` or ``worker``). Every record carries a counter per
    direction; a record that does not verify fails as ``mac``, a verified record with a
    counter already seen as ``replay``, one from ahead as ``reorder``. After any of these
    the connection is unusable (docs/wire.md). Reads go through a buffer that a small frame
    is checked and parsed in place of (one ``recv`` for the whole record, usually); a large
    frame's payload is read straight into its array. No descriptors are ever passed on this
    stream.
    """

    def __init__(self, sock, secret, transcript_digest, role):
        c2w = _derive(secret, b"xstage-key-c2w", transcript_digest)
        w2c = _derive(secret, b"xstage-key-w2c", transcript_digest)
        self.sock = sock
        send_key, recv_key = (c2w, w2c) if role == "client" else (w2c, c2w)
        self._seal_mac = _Mac(send_key)
        self._check_mac = _Mac(recv_key)
        self.sent = 0
        self.received = 0
        #: Threads that hash a large frame's records at once (``MAC_THREADS``; 0: this one).
        self.mac_threads = MAC_THREADS
        #: Payload bytes per record (``CHUNK_BYTES``; both ends of a connection must agree).
        self.chunk_bytes = CHUNK_BYTES
        #: Spins before blocking for the next frame (``sockspin.SocketSpin``; None: blocks).
        self.spin = None
        self._stall = None  # called before a receive would block (_recv_checked_behind)
        self._waker = None  # made by the first large frame received on hashing threads
        self._buf = bytearray(SMALL_FRAME + TRAILER_BYTES + 4096)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    # ------------------------------------------------------------------ sending
    def _seal(self, parts):
        counter = COUNTER.pack(self.sent)
        self.sent += 1
        return counter + self._seal_mac.tag(counter, parts)

    def send(self, header, arrays=None):
        """Encode one frame and send it as authenticated records."""
        self.send_parts(encode_frame(header, arrays))

    def send_parts(self, parts):
        """Send one frame already encoded by ``encode_frame`` as authenticated records.

        A small frame is one record and one ``send``; a large one is its head record, then
        payload records of ``CHUNK_BYTES``, each sent before it is sealed: the reader hashes a
        record's bytes as they arrive, under the counter it expects, while this end computes
        the same tag (on two CPUs, the two MACs overlap instead of following each other); the
        trailer follows, in one ``sendmsg`` with the next record's bytes (one system call and
        one wake-up of the reader per record, docs/performance.md#channel_timeline).
        """
        _, hlen, plen = PREFIX.unpack_from(parts[0])  # what the encoder wrote: the sizes
        if PREFIX.size + hlen + plen <= SMALL_FRAME:  # one record, one send
            data = b"".join(parts)
            counter = COUNTER.pack(self.sent)
            self.sent += 1
            self.sock.sendall(b"".join((data, counter, self._seal_mac.tag(counter, (data,)))))
            return
        head = parts[:2]
        body = [memoryview(p).cast("B") for p in parts[2:]]
        head = head + [self._seal(head)]
        records = []
        chunk = []
        room = self.chunk_bytes
        for view in body:
            while len(view):
                take = view[:room]
                view = view[len(take):]
                chunk.append(take)
                room -= len(take)
                if room == 0:
                    records.append(chunk)
                    chunk, room = [], self.chunk_bytes
        if chunk:
            records.append(chunk)
        if self.mac_threads and len(records) > 1:
            self._send_sealed_ahead(head, records)
            return
        ahead = head
        for chunk in records:
            ahead = self._send_record(ahead, chunk)
        send_parts(self.sock, ahead)

    def send_sealed(self, lane):
        """Send a ``_Lane``'s frame as one record, sealed in place in its trailer room.

        The record ``send_parts`` makes of the same frame (its bytes, the counter, the tag of
        counter and bytes), with no joined copy: the counter and the tag are written into the
        lane's buffer after the frame, and the buffer goes out in one ``sendall``.
        """
        n = lane.n
        buf = lane.buf
        view = lane.view
        counter = view[n:n + COUNTER.size]
        COUNTER.pack_into(buf, n, self.sent)
        self.sent += 1
        mac = self._seal_mac
        inner = mac._inner.copy()
        inner.update(counter)
        inner.update(lane.frame)
        outer = mac._outer.copy()
        outer.update(inner.digest())
        buf[n + COUNTER.size:] = outer.digest()
        self.sock.sendall(buf)

    def _send_sealed_ahead(self, ahead, records):
        """Payload records whose tags are computed on ``mac_threads`` threads at once while
        this thread sends: each record's bytes go out at once, its trailer when its tag is
        ready, with the next record's bytes (the bytes on the wire are those of
        ``_send_record``)."""
        pool = _mac_pool(self.mac_threads)
        first = self.sent
        self.sent += len(records)
        counters = [COUNTER.pack(first + i) for i in range(len(records))]
        tags = [pool.submit(self._seal_mac.tag, c, chunk) for c, chunk in zip(counters, records)]
        for counter, chunk, tag in zip(counters, records, tags):
            send_parts(self.sock, ahead + chunk)
            ahead = [counter + tag.result()]
        send_parts(self.sock, ahead)

    def _send_record(self, ahead, chunk):
        """A payload record's bytes, behind ``ahead`` (the head record, or the previous
        record's trailer) in the same system call; returns its trailer, which goes out with
        the next record's bytes or alone after the last. The bytes go before the MAC, so the
        reader hashes them while this end does (it checks nothing before the trailer has
        come), and each send wakes the reader once."""
        send_parts(self.sock, ahead + chunk)
        return [self._seal(chunk)]

    # ------------------------------------------------------------------ receiving
    def _recv_into(self, view, n):
        """One receive; with records hashed behind (``_stall`` set), first what is in is
        verified when nothing more is ready to read (this thread is about to block)."""
        if self._stall is not None:
            import select

            if not select.select([self.sock], [], [], 0)[0]:
                self._stall()
        return self.sock.recv_into(view, n)

    def _need(self, n, started=True):
        """Make the buffer hold ``n`` unread bytes (``n`` fits it); return where they start."""
        have = self._end - self._start
        if have >= n:
            return self._start
        if self._start + n > len(self._buf):  # move the unread bytes to the front
            self._buf[:have] = bytes(self._view[self._start:self._end])
            self._start, self._end = 0, have
        while self._end - self._start < n:
            k = self._recv_into(self._view[self._end:], 0)
            if k == 0:
                raise PeerClosed(started or self._end > self._start)
            self._end += k
        return self._start

    def _fill(self, target, inner=None):
        """Fill ``target`` (a memoryview) from the buffer, then the socket; ``inner`` (a hash)
        takes each piece as it lands, while it is in the cache and while the rest is on its
        way."""
        got = 0
        n = len(target)
        have = self._end - self._start
        if have:
            got = min(have, n)
            target[:got] = self._view[self._start:self._start + got]
            self._start += got
            if inner is not None:
                inner.update(target[:got])
        while got < n:
            if n - got >= len(self._buf) // 2:  # large: straight into the target
                k = self._recv_into(target[got:], n - got)
                if k == 0:
                    raise PeerClosed(True)
            else:
                s = self._need(n - got)
                k = n - got
                target[got:] = self._view[s:s + k]
                self._start = s + k
            if inner is not None:
                inner.update(target[got:got + k])
            got += k

    def _trailer(self):
        """The next record's trailer, consumed from the buffer (a copy)."""
        s = self._need(TRAILER_BYTES)
        self._start = s + TRAILER_BYTES
        return bytes(self._view[s:s + TRAILER_BYTES])

    def _verify(self, parts, trailer, what, tag=None):
        """Check a record's tag, then its counter; ProtocolError naming the failed check.

        ``tag``: the record's tag computed ahead under the expected counter (the payload's
        records are hashed as they arrive); any other counter in the trailer is hashed again
        under that counter, so each failure is named as if it had been checked afresh.
        """
        counter = trailer[:COUNTER.size]
        if tag is None or counter != COUNTER.pack(self.received):
            tag = self._check_mac.tag(counter, parts)
        if not hmac.compare_digest(tag, trailer[COUNTER.size:]):
            raise ProtocolError("frame integrity check failed (mac): record %d (%s) does not "
                                "verify under this connection's key: tampered or injected"
                                % (self.received, what))
        (number,) = COUNTER.unpack(counter)
        if number < self.received:
            raise ProtocolError("frame sequence check failed (replay): record %d arrived again "
                                "where %d was expected" % (number, self.received))
        if number > self.received:
            raise ProtocolError("frame sequence check failed (reorder): record %d arrived where "
                                "%d was expected: records reordered or dropped"
                                % (number, self.received))
        self.received += 1

    def recv(self, max_payload=MAX_PAYLOAD_BYTES, codec=None, expect=None):
        """Read, authenticate, validate and return one Frame (nothing unverified is returned).

        ``codec`` as in ``recv_frame``: binary call frames are records like any frame.
        ``expect``: a ``_Expect`` of ``codec`` (``FastCodec.expect``). Where the next frame
        is the one it describes (its fixed bytes, the id it asks for), under the counter
        expected and with a tag that verifies, that frame is taken in fewer steps: ``expect``
        itself is returned, its ``fields`` and ``payload`` the frame's. Any other frame is
        read as without it (nothing is consumed before), so a failure is named as ever.
        """
        s = self._start
        if self._end - s < PREFIX.size:
            spin = self.spin
            if spin is not None and self._end == s:  # nothing of the next frame yet: spin
                self._start = self._end = s = 0
                k = spin.recv_into(self._view)
                if k is None:
                    s = self._need(PREFIX.size, started=False)
                    spin.blocked()
                elif k == 0:
                    raise PeerClosed(False)
                else:
                    self._end = k
                    if k < PREFIX.size:
                        s = self._need(PREFIX.size)
            elif self._end == s:  # nothing of the next frame yet: one receive, at the front
                self._start = self._end = s = 0  # (no records hashed behind here: no _stall)
                k = self.sock.recv_into(self._view, 0)
                if k == 0:
                    raise PeerClosed(False)
                self._end = k
                if k < PREFIX.size:
                    s = self._need(PREFIX.size)
            else:
                s = self._need(PREFIX.size, started=False)
        if expect is not None and codec is expect.codec and expect.plen <= max_payload:
            if self._recv_expected(s, expect):
                return expect
            s = self._start  # (the wait for its bytes may have moved them to the front)
        got = self._recv_small(s, max_payload, codec)
        if got is not None:
            return got
        s = self._start  # (_recv_small may have moved the unread bytes to the buffer's front)
        fast, hlen, plen = _read_prefix(bytes(self._view[s:s + PREFIX.size]), max_payload)
        end = PREFIX.size + hlen
        if end + plen <= SMALL_FRAME:  # one record: checked and parsed in the buffer
            s = self._need(end + plen + TRAILER_BYTES)
            record = self._view[s:s + end + plen]
            self._verify((record,), bytes(self._view[s + end + plen:s + end + plen + TRAILER_BYTES]),
                         "frame head")
            self._start = s + end + plen + TRAILER_BYTES
            header, tensors = _head(fast, record[PREFIX.size:end], plen, codec)
            payload = np.frombuffer(bytearray(record[end:]), dtype=np.uint8) if plen else _EMPTY
            return Frame(header, payload, tensors, fast)
        if end + TRAILER_BYTES <= len(self._buf):
            s = self._need(end + TRAILER_BYTES)
            head = self._view[s:s + end]
            self._verify((head,), bytes(self._view[s + end:s + end + TRAILER_BYTES]), "frame head")
            self._start = s + end + TRAILER_BYTES
            raw = bytes(head[PREFIX.size:])
        else:  # a header larger than the buffer
            prefix = bytes(self._view[s:s + PREFIX.size])
            self._start = s + PREFIX.size
            rest = bytearray(hlen)
            self._fill(memoryview(rest))
            self._verify((prefix, rest), self._trailer(), "frame head")
            raw = rest
        header, tensors = _head(fast, raw, plen, codec)
        payload = np.empty(plen, dtype=np.uint8)
        view = memoryview(payload)
        mac = self._check_mac
        if self.mac_threads and plen > self.chunk_bytes:
            self._recv_checked_behind(view, plen)
            return Frame(header, payload, tensors, fast)
        for start in range(0, plen, self.chunk_bytes):
            part = view[start:start + self.chunk_bytes]
            inner = mac.begin(COUNTER.pack(self.received))  # the counter this record must carry
            self._fill(part, inner)
            self._verify((part,), self._trailer(), "payload at byte %d" % start, mac.finish(inner))
        return Frame(header, payload, tensors, fast)

    def _recv_expected(self, s, expect):
        """``recv`` of the frame ``expect`` describes, at ``s`` (``self._start``): True when the
        next frame is that one (its fixed bytes, the id it asks for, the counter expected, a tag
        that verifies), then consumed, its ``fields`` and ``payload`` in ``expect``; False with
        nothing consumed (the long path reads the same bytes and names any failure).
        """
        # The signature's frame: its fixed bytes compared, the id (and timing) read in one
        # step, the counter and tag checked; no header dict, no Frame.
        buf = self._buf
        n = expect.n
        if self._end - s < n + TRAILER_BYTES and buf.startswith(expect.prefix, s):
            s = self._need(n + TRAILER_BYTES)  # as _recv_small would, for this prefix
        if self._end - s >= n + TRAILER_BYTES and buf[s:s + _FIXED_BYTES] == expect.fixed \
                and buf[s + expect.descs_at:s + expect.payload_at] == expect.descs \
                and _U64_AT.unpack_from(buf, s + n)[0] == self.received:
            fields = expect.unpack(buf, s + _FIXED_BYTES)
            rid = expect.rid
            if (fields[0] == rid) if rid is not None else (fields[0] < 1 << 63):
                view = self._view
                mac = self._check_mac
                inner = mac._inner.copy()
                inner.update(view[s + n:s + n + COUNTER.size])
                inner.update(view[s:s + n])
                outer = mac._outer.copy()
                outer.update(inner.digest())
                if hmac.compare_digest(outer.digest(),
                                       view[s + n + COUNTER.size:s + n + TRAILER_BYTES]):
                    self.received += 1
                    self._start = s + n + TRAILER_BYTES
                    expect.fields = fields
                    expect.payload = bytearray(view[s + expect.payload_at:s + n])
                    return True
        return False

    def _recv_small(self, s, max_payload, codec):
        """The common case of ``recv`` in fewer steps: a well-formed one-record frame whose
        record verifies under the counter expected. Anything else returns None before any
        state changes, and ``recv``'s full path reads the same bytes (and names the failure)."""
        buf = self._buf
        magic, hlen, plen = PREFIX.unpack_from(buf, s)
        n = PREFIX.size + hlen + plen
        if n > SMALL_FRAME or plen > max_payload or hlen < (
                FAST_HEAD.size if magic == FAST_MAGIC else 2) or hlen > MAX_HEADER_BYTES \
                or magic not in (MAGIC, FAST_MAGIC) or (magic == FAST_MAGIC and codec is None):
            return None
        if self._end - s < n + TRAILER_BYTES:
            s = self._need(n + TRAILER_BYTES)
        counter = COUNTER.pack(self.received)
        if buf[s + n:s + n + COUNTER.size] != counter:
            return None
        view = self._view
        mac = self._check_mac  # _Mac.tag, written out (this runs for every small frame)
        inner = mac._inner.copy()
        inner.update(counter)
        inner.update(view[s:s + n])
        outer = mac._outer.copy()
        outer.update(inner.digest())
        if not hmac.compare_digest(outer.digest(),
                                   view[s + n + COUNTER.size:s + n + TRAILER_BYTES]):
            return None
        self.received += 1
        self._start = s + n + TRAILER_BYTES
        end = s + PREFIX.size + hlen
        if magic == FAST_MAGIC:
            header, tensors = codec.decode_head(view[s + PREFIX.size:end], plen)
        else:
            header, tensors = _validate_head(view[s + PREFIX.size:end], plen)
        # The payload's own bytes (a bytearray: the arrays view it, writable, no numpy wrapper).
        payload = bytearray(view[end:s + n]) if plen else _EMPTY
        return Frame(header, payload, tensors, magic == FAST_MAGIC)

    def _recv_checked_behind(self, view, plen):
        """Payload records read by this thread while ``mac_threads`` threads hash the ones
        already in, each under the counter it must carry (a record's hash starts as soon as
        its bytes are in, before its trailer comes). Every record is verified in order
        (``_verify`` names a failure) before any byte of the frame is returned. Before this
        thread blocks for more bytes it verifies the records whose tags are ready, and while
        one in front is still being hashed it waits for whichever comes first, bytes or that
        tag (``_Waker``): a stream cut short after a bad record fails on that record's check,
        as in the caller's thread, instead of waiting for bytes that never come, and the
        reader never waits for a hash while bytes are there to read."""
        pool = _mac_pool(self.mac_threads)
        mac = self._check_mac
        if self._waker is None:
            self._waker = _Waker()
        waker = self._waker
        pending = []  # [part, tag future, byte offset, trailer or None], in record order
        self._stall = lambda: self._verify_ready(pending, waker)
        try:
            for start in range(0, plen, self.chunk_bytes):
                part = view[start:start + self.chunk_bytes]
                counter = COUNTER.pack(self.received + len(pending))
                self._fill(part)
                tag = pool.submit(mac.tag, counter, (part,))
                tag.add_done_callback(waker.ring)
                entry = [part, tag, start, None]
                pending.append(entry)
                entry[3] = self._trailer()
        except EOFError:
            self._stall = None
            self._verify_pending([e for e in pending if e[3] is not None])
            raise
        finally:
            self._stall = None
        self._verify_pending(pending)

    def _verify_ready(self, pending, waker):
        """Called when a receive would block: verify the records in front whose tags are
        ready; while the one in front has its trailer but not its tag, wait for the tag or
        for bytes, whichever comes first."""
        import select

        while pending and pending[0][3] is not None:
            part, tag, start, trailer = pending[0]
            if tag.done():
                self._verify((part,), trailer, "payload at byte %d" % start, tag.result())
                del pending[0]
                continue
            ready = select.select([self.sock, waker.sock], [], [])[0]
            waker.drain()
            if self.sock in ready:
                return

    def _verify_pending(self, pending):
        for part, tag, start, trailer in pending:
            self._verify((part,), trailer, "payload at byte %d" % start, tag.result())
        del pending[:]


class _Waker:
    """A socket pair a hashing thread rings when a tag is ready, so that a reader can wait
    for bytes or a tag in one ``select`` (a socket pair, not a pipe: Windows selects sockets
    only)."""

    __slots__ = ("sock", "_bell")

    def __init__(self):
        import socket

        self.sock, self._bell = socket.socketpair()
        self.sock.setblocking(False)
        self._bell.setblocking(False)

    def ring(self, _future=None):
        try:
            self._bell.send(b"\0")
        except OSError:  # full (never: drained at each wait) or closed with its channel
            pass

    def drain(self):
        try:
            while self.sock.recv(4096):
                pass
        except OSError:
            pass
