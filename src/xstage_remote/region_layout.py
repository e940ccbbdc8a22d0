"""The shared region's layout: the bytes both ends agree on, and the checks of a slot table.

One region per worker, created by the client after ``loaded`` (it knows the stage's declared
inputs and outputs then), handed over once (a memfd passed over the control socket, or a
named file under /dev/shm unlinked as soon as both ends hold it), and used for every call
after. On this path the control socket carries only errors, inline fallbacks and liveness.

Layout v2 with K slot sets (integers little-endian, offsets in bytes; ``b(s) = 64 + 192 s``)::

      0 +--------------------------------------------------+
        | "XSR1" | u32 version | u64 size | u32 n_slots     |   identity (client, once)
        | u32 generation | u32 n_sets (K)                  |
   b(s) +--------------------------------------------------+   control block of set s:
        | req_id u64 | client_asleep u32 | client_cpu u32 |   client writes
        | req_gen u32 | req_flags u32 | pub_ns u64 | cancel_id u64 |
        | coming_ns u64 (set 0 only: "Heads-up" below)        |
        | fill u64 ("Streamed inputs" below)                 |
 b(s)+64+--------------------------------------------------+
        | resp_id u64 | status u32 | pad | worker_ns u64   |   worker writes
        | rss u64 | peak u64 | worker_asleep u32 | worker_cpu u32 | resp_gen u32 | pad |
        | taken_id u64 | pad u64 | start_ns u64 | end_ns u64 | flags u32 |
  b(K) +--------------------------------------------------+   (aligned to 64)
        | descriptor[0] .. descriptor[n_slots-1]           |   272 B each:
        |   u8 dtype code, u8 rank, u16 pad, u32 pad,      |   inputs: client writes
        |   u64 nbytes, u64 dims[32]                       |   outputs: worker writes
        +--------------------------------------------------+  aligned to 4096
        | slot data, each slot aligned to 64 B             |
   size +--------------------------------------------------+

With K = 1 this is the layout of one set exactly (descriptors at 256). The asleep flags and CPU
numbers exist once, in set 0's block: the doorbell is the region's, not a set's.

Every slot belongs to a *slot set* (its ``set`` field): the inputs and outputs of one request
in flight. K sets let K requests be in flight at once: the client writes request n+1's inputs
into the next set while the worker computes request n. The client publishes requests into the
sets in cyclic order (0, 1, .., K-1, 0, ..) and the worker takes them in the same order, so
results come back in submission order.

Who may touch a set, by its two request ids (one request in flight per set)::

    state       condition                 owner of slots+descriptors  next move
    IDLE        req_id == resp_id         client                      client writes inputs,
                                                                      then req_gen, pub_ns,
                                                                      req_id (a fresh id),
                                                                      rings
    REQUESTED   req_id != resp_id,        worker (may read)           worker writes taken_id
                taken_id != req_id                                    = req_id (the request
                                                                      has *started*), then
                                                                      reads cancel_id
    RUNNING     taken_id == req_id        worker                      worker runs, writes
                                                                      outputs, status, stamps,
                                                                      then resp_gen, resp_id =
                                                                      req_id, rings

Cancel (a request published but not started): the client writes ``cancel_id = req_id``, then
reads ``taken_id``. The worker reads ``cancel_id`` *before* it writes ``taken_id``; a cancelled
request is answered with status 3 and never run. So a client that still sees ``taken_id !=
req_id`` after writing ``cancel_id`` knows no result will be delivered for it; on x86 the
worker may, in a window of a store buffer's drain, miss the cancel and run the request anyway:
its outputs are then discarded by the client, never delivered (a stateful stage therefore does
not withdraw published requests).

Stamps (``time.monotonic_ns``, one clock for both processes on one kernel): ``pub_ns`` when the
client published the request, ``start_ns``/``end_ns`` around the worker's compute. They let
tests check order without a wall clock.

A request id is the client's per-stage request counter (the same ids its frames carry, never
reused), so a reply left over from an interrupted call can never be taken for a later call's:
the client accepts a response only when ``resp_id`` is the id it published and ``resp_gen``
its worker's generation. The region carries the generation it was made for; a worker refuses
a region, and a request, of another generation.

NOTE (ordering): every publisher writes data and descriptors *before* the request id,
and every reader reads the request id *before* the data. x86-64 keeps stores in order
and loads in order, so a spinning reader that sees the new number sees the data. Weaker
CPUs do not promise that and Python has no fence: there ``SPIN`` is off and the reader
blocks on the doorbell, whose send/recv pair orders memory in the kernel.

Layers of the region transport (``shm`` re-exports them all): this module (offsets, sizes,
the slot table's plan and checks), ``region`` (the mapping and every read and write of it),
``doorbell`` (wake-ups and the spin-or-block waits). Runs under the worker's interpreter too
(Python >= 3.9, standard library and numpy).
"""

import struct

from .tuning import TransportTuning
from .wire import DTYPES, MAX_RANK, ProtocolError

MAGIC = b"XSR1"
#: 2: request ids and generations in the control block, slot sets in the slot table.
VERSION = 2
#: Slot sets in one region at most (requests in flight at once; ``open_stage(depth=K)``).
MAX_SETS = 64
MAX_GENERATION = (1 << 32) - 1
#: An input at least this large given as its own slot's view (``Region.slot_views``) is not
#: copied; below it the copy costs less than telling them apart.
IN_PLACE_MIN_BYTES = 1 << 16
#: The documented ceiling of one region (``TransportTuning.max_region_bytes``, whose default
#: this is); stages whose declared I/O exceed it go inline.
MAX_REGION_BYTES = TransportTuning().max_region_bytes
MAX_SLOTS = 1024
#: The first control block, and the stride of one set's block (client half 64, worker 128).
CTL_OFF = 64
CTL_STRIDE = 192
#: Where descriptors start in a one-set region (``desc_offset(1)``).
DESC_OFF = 256
DESC = struct.Struct("<BBHIQ" + "Q" * MAX_RANK)  # 272 bytes
DATA_ALIGN = 64
PAGE = 4096

OFF_REQ_SEQ = 64
OFF_CLIENT_ASLEEP = 72
OFF_REQ_GEN = 80
OFF_RESP_SEQ = 128
OFF_STATUS = 136
OFF_WORKER_NS = 144
OFF_WORKER_ASLEEP = 168
OFF_RESP_GEN = 176
#: Each side's CPU (+1; 0 unknown) sits just after its asleep flag; see "Shared CPU" above.
CPU_AFTER_FLAG = 4
#: The caller moves off the worker's CPU at most this often (a move costs ~10-30 µs, a
#: shared CPU ~50 µs per hop).
NUDGE_SECONDS = 0.001

STATUS_OK = 0
STATUS_ERROR = 1
STATUS_INLINE = 2
#: The request was withdrawn by the client before it started; it did not run.
STATUS_CANCELLED = 3

# Offsets inside one set's control block (see the layout above).
R_REQ_ID, R_REQ_GEN, R_REQ_FLAGS, R_PUB_NS, R_CANCEL_ID = 0, 16, 20, 24, 32
#: Set 0's block only: when the client expects to publish its next request (a heads-up).
OFF_COMING = CTL_OFF + 40
#: Each set's block: how far the caller has copied its next request's inputs ("Streamed inputs").
R_FILL = 48
#: ``req_flags``: reset the stage's state to its initial value before this request.
FLAG_RESET_STATE = 1
#: ``req_flags``: the inputs are in the worker's device slots of this set, and so go the
#: outputs (torch-cuda ``device_tensors=on``, ``device_slots.py``); no tensor bytes here.
FLAG_DEVICE_TENSORS = 2
#: ``flags`` of an answer: the request ran from the initial state (a reset, or a new worker).
FLAG_STATE_RESET = 1
R_RESP_ID, R_STATUS, R_RESP_GEN, R_TAKEN_ID, R_STAMPS = 64, 72, 112, 120, 136

#: "Streamed inputs": inputs at least this large are copied in chunks of ``STREAM_CHUNK_BYTES``,
#: each followed by its set's ``fill`` (a slot under 4 GiB: ``fill`` holds 32 bits of bytes).
#: 1 MiB chunks: on the H200 a 4.8 MB input's round trip was 1.934 ms in 1 MiB chunks, 1.993 in
#: 512 KiB ones, 2.029 unstreamed (one run, interleaved: each announcement costs the worker a
#: DMA call); below two chunks nothing overlaps.
STREAM_MIN_BYTES = 2 << 20
STREAM_CHUNK_BYTES = 1 << 20

#: The structs and the control block's offsets ``region`` and ``doorbell`` read and write:
#: public, because the layout is the contract between them.
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
HEAD = struct.Struct("<4sIQIII")
RESPONSE = struct.Struct("<IIQQQ")
STAMPS = struct.Struct("<QQI")  # start_ns, end_ns, flags
#: req_gen, req_flags, pub_ns: side by side in a set's client half (``R_REQ_GEN`` on).
PUBLISH = struct.Struct("<IIQ")
#: A set's whole answer in one read, from ``status`` to ``flags``.
ANSWER = struct.Struct("<IIQQQIIIIQQQQI")



def desc_offset(n_sets):
    """Where the descriptors start in a region of ``n_sets`` slot sets."""
    return align(CTL_OFF + CTL_STRIDE * n_sets, DATA_ALIGN)



def align(n, a):
    return (n + a - 1) // a * a


def plan_layout(inputs, outputs, sets=1, max_bytes=None):
    """Slot table for declared I/O: ``[(name, role, tag, capacity)]`` → (slots, size).

    Every input needs a known capacity (else ``(None, 0)``: the stage runs inline). An
    output whose capacity is ``None`` (a data-dependent dimension) gets no slot and comes
    back inline. ``sets`` slot sets hold the same slots each. Returns ``(slots, size)``;
    ``(None, 0)`` also when the region would exceed ``max_bytes`` (None: ``MAX_REGION_BYTES``;
    the client passes its ``TransportTuning.max_region_bytes``).
    """
    if not inputs or any(c is None for _, _, c in inputs):
        return None, 0
    if type(sets) is not int or not 1 <= sets <= MAX_SETS:
        raise ValueError("sets %r is outside [1, %d]" % (sets, MAX_SETS))
    specs = [(n, "in", t, c) for n, t, c in inputs]
    specs += [(n, "out", t, c) for n, t, c in outputs if c is not None]
    data_off = align(desc_offset(sets) + len(specs) * sets * DESC.size, PAGE)
    cursor = data_off
    slots = []
    for s in range(sets):
        for name, role, tag, cap in specs:
            slots.append({"name": name, "role": role, "dtype": tag, "capacity": int(cap),
                          "offset": cursor, "set": s})
            cursor = align(cursor + max(int(cap), 1), DATA_ALIGN)
    size = align(cursor, PAGE)
    if size > (MAX_REGION_BYTES if max_bytes is None else max_bytes):
        return None, 0
    return slots, size


SLOT_KEYS = {"name", "role", "dtype", "capacity", "offset", "set"}


def validate_layout(size, slots, n_sets=1, max_bytes=None):
    """Check a slot table received from the peer before mapping anything.

    Every malformed table raises ``ProtocolError`` (never ``TypeError``/``ValueError``): the
    table is JSON from the peer, so any field may hold any JSON value. ``max_bytes``: the
    largest region this end maps (None: ``MAX_REGION_BYTES``; ``TransportTuning.max_region_bytes``).
    """
    ceiling = MAX_REGION_BYTES if max_bytes is None else max_bytes
    if type(size) is not int or size <= 0 or size > ceiling:
        raise ProtocolError("region size %r is outside (0, %d]" % (size, ceiling))
    if type(n_sets) is not int or not 1 <= n_sets <= MAX_SETS:
        raise ProtocolError("region set count %r is outside [1, %d]" % (n_sets, MAX_SETS))
    if not isinstance(slots, list) or not slots or len(slots) > MAX_SLOTS:
        raise ProtocolError("region slot table must list 1..%d slots" % MAX_SLOTS)
    data_off = align(desc_offset(n_sets) + len(slots) * DESC.size, PAGE)
    seen = set()
    end = data_off
    for i, s in enumerate(slots):
        if not isinstance(s, dict) or set(s) != SLOT_KEYS:
            raise ProtocolError("region slot %d must have exactly %s" % (i, ", ".join(sorted(SLOT_KEYS))))
        name, role = s["name"], s["role"]
        if type(s["set"]) is not int or not 0 <= s["set"] < n_sets:
            raise ProtocolError("region slot %r: set %r is outside [0, %d)" % (name, s["set"], n_sets))
        if not isinstance(name, str) or not isinstance(role, str) or role not in ("in", "out") \
                or (s["set"], role, name) in seen:
            raise ProtocolError("region slot %d: bad or duplicate role/name %r" % (i, (role, name)))
        seen.add((s["set"], role, name))
        if not isinstance(s["dtype"], str) or s["dtype"] not in DTYPES:
            raise ProtocolError("region slot %r: dtype %r not on the whitelist" % (name, s["dtype"]))
        cap, off = s["capacity"], s["offset"]
        if type(cap) is not int or type(off) is not int or cap < 0 or off % DATA_ALIGN:
            raise ProtocolError("region slot %r: capacity/offset invalid" % (name,))
        if off < end or off + cap > size:
            raise ProtocolError("region slot %r at [%d, %d) overlaps or leaves the region"
                                % (name, off, off + cap))
        end = off + cap
    first = sorted((d["role"], d["name"], d["dtype"]) for d in slots if d["set"] == 0)
    for k in range(1, n_sets):
        other = sorted((d["role"], d["name"], d["dtype"]) for d in slots if d["set"] == k)
        if other != first:
            raise ProtocolError("region set %d does not hold the same slots as set 0" % k)
    return data_off

