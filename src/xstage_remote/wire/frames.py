"""Frames: the layer that turns headers and arrays into bytes on a stream and back
(docs/wire.md). It checks through ``spec``; a binary call frame's header is handed to the
codec the caller passes (``check_head``), the one hook this layer offers the codec above it.
"""

import json
import sys

import numpy as np

from .spec import (
    FAST_MAGIC,
    JSON_ENCODER,
    MAGIC,
    MAX_DIM,
    MAX_HEADER_BYTES,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_RANK,
    MAX_TENSORS,
    PREFIX,
    SMALL_FRAME,
    ProtocolError,
    dtype_of_tag,
    tag_of_dtype,
    validate_header,
    validate_header_bytes,
    validate_prefix,
    validate_tensor_descs,
)


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
            buffers.append(byte_view(arr))
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


def byte_view(arr):
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
        raw = JSON_ENCODER.encode(descs).encode("utf-8")
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
                buffers.append(byte_view(arr))
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
        raw = JSON_ENCODER.encode(header).encode("utf-8")
    except (TypeError, ValueError) as exc:  # NaN/inf, sets, numpy scalars, cycles
        raise ProtocolError("header cannot be encoded as strict JSON (%s)" % exc) from None
    if tjson is not None:
        raw = b"".join((raw[:-1], _T_KEY, tjson, b"}"))
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError("header is %d bytes, over the limit %d" % (len(raw), MAX_HEADER_BYTES))
    return [PREFIX.pack(MAGIC, len(raw), plen), raw] + buffers


_NO_TENSORS = []


def read_prefix(prefix, max_payload, codec=None):
    """``(fast, header_len, payload_len)`` of a frame's prefix, JSON (XSW1) or binary (XSB1);
    a binary header shorter than ``codec.head_bytes`` (its fixed part) is refused here."""
    if prefix[:4] == FAST_MAGIC and len(prefix) == PREFIX.size:
        _, hlen, plen = PREFIX.unpack(prefix)
        least = 1 if codec is None else codec.head_bytes
        if hlen < least or hlen > MAX_HEADER_BYTES:
            raise ProtocolError("binary frame header length %d is outside [%d, %d]"
                                % (hlen, least, MAX_HEADER_BYTES))
        if plen > max_payload:
            raise ProtocolError("payload length %d exceeds the limit %d" % (plen, max_payload))
        return True, hlen, plen
    hlen, plen = validate_prefix(prefix, max_payload)
    return False, hlen, plen


def check_head(fast, raw, plen, codec):
    """A frame's header checked: JSON (``validate_head``) or binary (``codec``)."""
    if not fast:
        return validate_head(raw, plen)
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
    if sum(len(p) for p in parts) <= SMALL_FRAME:
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
#: → ``(descriptors, tensors)``. Filled by ``validate_head``; a hit skips the parse and the
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


def validate_head(raw, plen):
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
    fast, hlen, plen = read_prefix(bytes(prefix), max_payload, codec)
    raw = bytearray(hlen)
    _recv_exactly(sock, memoryview(raw), True)
    header, tensors = check_head(fast, raw, plen, codec)
    # np.empty, not bytearray: no zero-fill pass over memory the socket overwrites anyway.
    payload = np.empty(plen, dtype=np.uint8)
    if plen:
        _recv_exactly(sock, memoryview(payload), True)
    return Frame(header, payload, tensors, fast)


def parse_frame(data, max_payload=MAX_PAYLOAD_BYTES, codec=None):
    """Validate and decode one complete frame held in memory (the fuzz target)."""
    data = memoryview(data)
    fast, hlen, plen = read_prefix(bytes(data[: PREFIX.size]), max_payload, codec)
    end = PREFIX.size + hlen
    if len(data) < end:
        raise ProtocolError("frame holds %d bytes, its header needs %d" % (len(data), end))
    header, tensors = check_head(fast, data[PREFIX.size:end], plen, codec)
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
