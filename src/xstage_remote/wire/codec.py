"""The fast codec: binary ``run``/``result`` frames for one loaded signature (docs/wire.md,
"Binary call frames"). Above ``frames`` (whose ``check_head`` hands it a binary header), below
``channel``, which it never imports. Its zero-copy hooks for a transport are two small
classes: ``Lane`` (a signature's frame kept whole, with ``spec.TRAILER_BYTES`` of room for a
record trailer: ``Channel.send_sealed`` seals it in place) and ``ExpectedFrame`` (the next
frame's fixed bytes and where its fields lie: ``Channel.recv`` compares them in place).
"""

import struct
import sys

import numpy as np

from .frames import byte_view
from .spec import (
    CODE_DTYPES,
    DTYPE_CODES,
    DTYPES,
    FAST_MAGIC,
    MAX_DIM,
    MAX_GENERATION,
    MAX_RANK,
    MAX_SPAN,
    MAX_TENSORS,
    PREFIX,
    SMALL_FRAME,
    TRAILER_BYTES,
    ProtocolError,
    tag_of_dtype,
)

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
#: Cache bounds: signatures kept per codec, descriptor bytes kept per entry.
_MAX_SIGNATURES = 256
_MAX_CACHED_BYTES = 4096
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

    #: The fixed part of a binary header (``frames.read_prefix`` refuses a shorter one).
    head_bytes = FAST_HEAD.size

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
                buffers.append(byte_view(arr))
            elif view:
                buffers.append(byte_view(_little(arr)))
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
        """The ``Lane`` of one call signature (kind, generation, names, dtypes, shapes), or
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
                lane = Lane(kind, head + descs, plen, [
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
        """The ``ExpectedFrame`` of the frames of ``kind`` and generation ``gen`` that carry the
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
        return ExpectedFrame(self, kind, PREFIX.pack(FAST_MAGIC, len(head) + len(descs), plen)
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
            if len(raw) - start <= _MAX_CACHED_BYTES:
                if len(self._dec) >= _MAX_SIGNATURES:
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
            if span > MAX_SPAN:
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


class Lane:
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
#: A result's id and timing, read in one step (``ExpectedFrame``).
_ID_TIMING = struct.Struct("<QQQQ")


class ExpectedFrame:
    """The next frame as one call signature makes it: what ``Channel.recv`` checks it against
    in fewer steps (``FastCodec.expect`` builds one from a checked frame).

    ``fixed``: the prefix and the header's first 8 bytes (kind, flags 0, tensor count, gen);
    ``descs``: the descriptors, after the id (and a result's timing). A frame whose bytes
    equal these is one of ``n`` bytes, one record, that ``decode_head`` accepts with
    ``tensors``; ``Channel.recv`` then checks its counter and tag and its id, and fills
    ``fields`` (``(id,)`` of a run, ``(id, worker_ns, rss, peak)`` of a result) and
    ``payload`` (the payload's own bytes). ``rid``: the id the frame must carry, set by the
    caller before each receive (None: any id in ``[0, 2^63)``).

    The hook a transport reads in place (``Channel._recv_expected``): ``fixed`` at the
    frame's start, ``descs`` at ``descs_at``, ``unpack(buf, start + fields_at)`` for the
    fields, the payload from ``payload_at`` to ``n``.
    """

    __slots__ = ("codec", "kind", "prefix", "fixed", "fields_at", "descs", "descs_at",
                 "payload_at", "n", "plen", "tensors", "unpack", "rid", "fields", "payload")

    def __init__(self, codec, kind, fixed, descs, n, plen, tensors):
        self.codec = codec
        self.kind = kind
        self.prefix = fixed[:PREFIX.size]
        self.fixed = fixed
        self.fields_at = _FIXED_BYTES
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
