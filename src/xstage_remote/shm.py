"""The shared region between a client and its worker: layout, slot states and the doorbell.

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

Wait policy: each wait asks ``waitpolicy.WaitPolicy`` (a pure module: its rules, and why, are
in its docstring) whether to spin, and for how long, before it blocks. It spins, yielding
once every ``SPIN_YIELD_SECONDS`` (50 µs: a yield lets a peer that shares this CPU run, but
beside busy neighbours each yield hands the CPU to one of them for a scheduler slice, so a
small call's answer is awaited without one), while spinning can pay: the answer is expected
soon, recent spins were answered, and no check came back late (a late one means another task
ran on this CPU: the spin stops at once and the policy backs off). Otherwise it blocks at
once: beside neighbours that never sleep, a spinner's yield hands its CPU to them for a whole
scheduler slice, and a 64 B call took ~2-10 ms instead of ~15 µs (issue 14). The doorbell
measures what the policy needs: the machine's runnable tasks (``/proc/loadavg``, at most every
``LOAD_SAMPLE_SECONDS``), each spin's longest gap between two checks, how long each answer
took. ``Doorbell.summary()`` counts the decisions (``--verbose``);
``XSTAGE_WAIT_TRACE`` records them with their inputs (``scripts/record_wait_traces.py``).

To block, a side raises its ``*_asleep`` flag, re-checks, and sleeps on the doorbell (``poll``
on its eventfd, or ``select`` on the socketpair where there are no eventfds); a poster
rings only when the peer's flag is up, which saves two system calls (~4 µs) per call while
both sides are awake. NOTE (ordering): flag-then-recheck on one side and publish-then-read-flag
on the other is a store→load pattern that x86 may reorder, so both sides could miss each other
and sleep forever. Each side therefore puts a full barrier between its store and its load
(``_fence``: a lock taken and released, whose locked instructions order every earlier store
before every later load). The sleep has no timeout of its own beyond the caller's deadline: a
1 ms safety timeout used to bound that race instead, and arming a short timer cost ~6 µs per
blocked wait on this VM (timer reprogramming traps to the hypervisor), half a blocked round
trip. Where spinning is off, posters always ring. The ring is non-blocking: a full doorbell
buffer already holds a pending wake-up; a woken waiter takes the pending rings in one read.

Shared CPU: when both sides run on one CPU, spinning is a trap. onnxruntime pins its
intra-op threads to cores, so the scheduler often leaves the caller and the worker's main
thread together on the one core left, with the other idle; a yielding spinner there is not
switched out until the scheduler's fairness says so (EEVDF eligibility), and wake-ups of a
socket keep the two together. Measured here: 1 MiB round trips cost ~100 µs of overhead
instead of ~50 µs, depending on where each process happened to land. Each side therefore
writes its CPU when it starts waiting and when a spin ends, and the caller — one side only,
or the two would chase each other — moves itself to another CPU it may use when it finds the
worker on its own (pinning to the others migrates at once; the full mask is restored right
after). Where there is no other CPU it stops spinning and blocks. The worker never moves: its
main thread belongs beside onnxruntime's pinned threads, and moving it onto one of their
cores doubled a 5 ms graph's compute here.

Heads-up: a worker that found no request within its spin sleeps, and a sleeping CPU takes tens
of µs to wake (60-120 µs measured on the 16-core Xeon). Where the caller's copy of the next
request's inputs into the region is long (``HEADS_UP_SECONDS``, from the last call's copy), a
caller that finds the worker asleep first writes ``coming_ns`` (when it expects to publish:
now + the last copy's time) and rings; the worker, woken with no request yet, spins until
``coming_ns`` + ``HEADS_UP_SLACK_SECONDS`` (at most ``HEADS_UP_MAX_SECONDS``), so its wake-up
overlaps the copy instead of following it. A heads-up never publishes anything: a worker that
misses it (or an older one that ignores it) takes the request from the usual ring.

Streamed inputs: where the worker's device reads the inputs from the region by DMA (torch-cuda's
pinned region), the caller copies a large input (``STREAM_MIN_BYTES``) in chunks and, after
each, stores in its set's ``fill`` how far it got: ``seq << 48 | slot << 32 | bytes`` (``seq``
counts the large inputs written, mod 2^16; ``slot`` indexes the slot table; bytes from the slot's
start). A worker waiting for that set's request may queue the DMA of the bytes written so far
(``bytes`` only grows for one ``seq`` and slot, and the caller never writes below it again
before the publish), so the transfer overlaps the caller's copy; at the request it copies only
what it has not, if ``seq`` still matches. Each large input written takes a new ``seq`` (one
written in place or not contiguous announces 0 bytes), so queued bytes of a withdrawn or
abandoned write never stand for a later one. A worker that ignores ``fill`` copies everything.
"""

import atexit
import errno
import mmap
import os
import platform
import select
import socket
import struct
import sys
import threading
import time

import numpy as np

from . import waitpolicy
from .wire import CODE_DTYPES, DTYPE_CODES, DTYPES, MAX_DIM, MAX_RANK, ProtocolError, dtype_of_tag

__all__ = [
    "DATA_ALIGN",
    "FLAG_DEVICE_TENSORS",
    "FLAG_RESET_STATE",
    "FLAG_STATE_RESET",
    "MAX_REGION_BYTES",
    "SPIN",
    "SPIN_SECONDS",
    "STATUS_CANCELLED",
    "STATUS_ERROR",
    "STATUS_INLINE",
    "STATUS_OK",
    "Doorbell",
    "Region",
    "desc_offset",
    "plan_layout",
    "read_load",
    "validate_layout",
    "write_traces",
]

MAGIC = b"XSR1"
#: 2: request ids and generations in the control block, slot sets in the slot table.
VERSION = 2
#: Slot sets in one region at most (requests in flight at once; ``open_stage(depth=K)``).
MAX_SETS = 64
MAX_GENERATION = (1 << 32) - 1
#: An input at least this large given as its own slot's view (``Region.slot_views``) is not
#: copied; below it the copy costs less than telling them apart.
IN_PLACE_MIN_BYTES = 1 << 16
#: The documented ceiling of one region; stages whose declared I/O exceed it go inline.
#: Malformed ``XSTAGE_*`` numbers read below, one line each (the default is used meanwhile);
#: the client refuses to start a worker while this is not empty.
ENV_PROBLEMS = []


def _env_number(name, default, cast, example):
    """The number in environment variable ``name``, or ``default`` (noting a malformed one)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = cast(raw.strip())
        if not value >= 0 or value == float("inf"):
            raise ValueError
        return value
    except ValueError:
        ENV_PROBLEMS.append("%s=%r is not a number >= 0: unset it or set e.g. %s=%s"
                            % (name, raw, name, example))
        return default


MAX_REGION_BYTES = _env_number("XSTAGE_MAX_REGION_BYTES", 4 << 30, int, "4294967296")
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
_R_REQ_ID, _R_REQ_GEN, _R_REQ_FLAGS, _R_PUB_NS, _R_CANCEL_ID = 0, 16, 20, 24, 32
#: Set 0's block only: when the client expects to publish its next request (a heads-up).
OFF_COMING = CTL_OFF + 40
#: Each set's block: how far the caller has copied its next request's inputs ("Streamed inputs").
_R_FILL = 48
#: ``req_flags``: reset the stage's state to its initial value before this request.
FLAG_RESET_STATE = 1
#: ``req_flags``: the inputs are in the worker's device slots of this set, and so go the
#: outputs (torch-cuda ``device_tensors=on``, ``device_slots.py``); no tensor bytes here.
FLAG_DEVICE_TENSORS = 2
#: ``flags`` of an answer: the request ran from the initial state (a reset, or a new worker).
FLAG_STATE_RESET = 1
_R_RESP_ID, _R_STATUS, _R_RESP_GEN, _R_TAKEN_ID, _R_STAMPS = 64, 72, 112, 120, 136

#: Spin only where plain stores and loads are ordered (see the NOTE above).
SPIN = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
#: Long enough to cover a small call's round trip (tens of µs) many times over; short
#: enough that an idle worker sleeps almost at once. Each yield costs ~0.3-1 µs here.
SPIN_SECONDS = _env_number("XSTAGE_SPIN_SECONDS", 0.002, float, "0.002")
#: An idle worker spins this long after answering, then sleeps: long enough for a caller that
#: calls again at once (back-to-back calls cost tens of µs between them), short enough not to
#: burn a core the caller's own work needs between calls.
WORKER_SPIN_SECONDS = _env_number("XSTAGE_WORKER_SPIN_SECONDS", 0.0003, float, "0.0003")
#: A caller does not spin while the worker computes a call expected to take longer than this:
#: on a small machine its spinning would steal a core from the runtime's own threads (measured
#: here: a 0.5 ms call took 1.5 ms round trip with the caller spinning, 0.55 ms without); the
#: doorbell's wake-up (~20-50 µs) is small against such a call.
LONG_CALL_SECONDS = _env_number("XSTAGE_LONG_CALL_SECONDS", 0.0002, float, "0.0002")
#: A spinner yields once this long after its last yield (or its start), not on every check.
#: Beside busy neighbours a yield hands the CPU to one of them for a scheduler slice (EEVDF
#: moves the yielder's deadline a slice later), so a spin that yielded on every check was
#: preempted at once and the policy blocked instead; a 64 B call's answer comes within ~10-20 µs,
#: before the first yield. Measured on the 2-vCPU VM beside 2 busy loops
#: (docs/performance.md#hotpath): half round trip 8.4-10.4 against 20.2-24.2 µs yielding on every check,
#: quiet unchanged. A yield every 50 µs still lets a peer that shares this CPU run (a spin never
#: holds it longer), and a spin preempted between two checks still stops at once.
#: 0: yield on every check (as before).
SPIN_YIELD_SECONDS = _env_number("XSTAGE_SPIN_YIELD_SECONDS", 0.00005, float, "0.00005")
#: A yield that returns later than this was preempted: another task ran on this CPU meanwhile
#: (a yield with nothing else to run takes ~0.3-1 µs here; a neighbour's scheduler slice is
#: ~1-3 ms). The spin stops at once and the policy backs off (waitpolicy rule 4).
PREEMPTED_SECONDS = _env_number("XSTAGE_PREEMPTED_SECONDS", 0.0002, float, "0.0002")
#: ``XSTAGE_CROWD_BLOCKS=1``: a waiter blocks whenever the machine has more runnable tasks than
#: CPUs (+1), even where its spins pay (waitpolicy rule 6): less CPU taken from busy neighbours
#: (0.56-0.92x per 64 B call on the 2-vCPU VM beside 2 loops), for a half round trip that was
#: 0.75-1.25x in seven interleaved runs (docs/performance.md#hotpath). Off by default: the
#: target is latency, and the least loaded run lost it.
CROWD_BLOCKS = bool(_env_number("XSTAGE_CROWD_BLOCKS", 0, int, "1"))
#: How often a waiter re-reads the machine's runnable tasks (waitpolicy rule 5): ~3.6 µs a
#: read here, so at most every 10 ms costs nothing measurable and follows a load that changes.
LOAD_SAMPLE_SECONDS = 0.01
#: A caller waiting for a call expected to be long sleeps until this many seconds before the
#: expected answer, then spins (waitpolicy rule 3, ``near_end``; 0: off). Why 100 µs: a timed
#: sleep ends up to 50 µs late (Linux's default timer slack) and a sleeping CPU takes tens of
#: µs more to wake; the spin that follows is at most three times this.
NEAR_END_SECONDS = _env_number("XSTAGE_NEAR_END_SECONDS", 0.0001, float, "0.0001")
#: A caller whose inputs took at least this long to copy into the region last time wakes a
#: sleeping worker before it copies them again, telling it when to expect the request
#: ("Heads-up" above; 0: off). Why 100 µs: a sleeping CPU takes ~30 µs (2-vCPU VM) to 60-120 µs
#: (the 16-core Xeon) to wake, so a shorter copy would end before the worker is up anyway.
HEADS_UP_SECONDS = _env_number("XSTAGE_HEADS_UP_SECONDS", 0.0001, float, "0.0001")
#: A worker woken by a heads-up spins until this long after the announced time at most (a copy
#: slower than announced), and never longer than ``HEADS_UP_MAX_SECONDS`` in all.
HEADS_UP_SLACK_SECONDS = 0.0001
HEADS_UP_MAX_SECONDS = 0.005
#: "Streamed inputs": inputs at least this large are copied in chunks of ``STREAM_CHUNK_BYTES``,
#: each followed by its set's ``fill`` (a slot under 4 GiB: ``fill`` holds 32 bits of bytes).
#: 1 MiB chunks: on the H200 a 4.8 MB input's round trip was 1.934 ms in 1 MiB chunks, 1.993 in
#: 512 KiB ones, 2.029 unstreamed (one run, interleaved: each announcement costs the worker a
#: DMA call); below two chunks nothing overlaps.
STREAM_MIN_BYTES = 2 << 20
STREAM_CHUNK_BYTES = 1 << 20
#: ``XSTAGE_WAIT_TRACE=DIR``: each doorbell records its decisions, their inputs and what each
#: wait saw, and writes them to ``DIR/wait-<role>-<pid>-<n>.json`` at exit
#: (``scripts/record_wait_traces.py``; the policy's tests replay such traces).
TRACE_DIR = os.environ.get("XSTAGE_WAIT_TRACE") or None
#: ``XSTAGE_DOORBELL=socket`` keeps the socketpair as the doorbell even where eventfds exist
#: (for comparing the two: ``benchmarks/transport.py --doorbell``).
EVENTFD_BELL = os.environ.get("XSTAGE_DOORBELL", "eventfd") != "socket"
#: The most waits one trace keeps.
MAX_TRACE = 200000
_TRACES = []

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<4sIQIII")
_RESPONSE = struct.Struct("<IIQQQ")
_STAMPS = struct.Struct("<QQI")  # start_ns, end_ns, flags
#: req_gen, req_flags, pub_ns: side by side in a set's client half (``_R_REQ_GEN`` on).
_PUBLISH = struct.Struct("<IIQ")
#: A set's whole answer in one read, from ``status`` to ``flags``.
_ANSWER = struct.Struct("<IIQQQIIIIQQQQI")


def desc_offset(n_sets):
    """Where the descriptors start in a region of ``n_sets`` slot sets."""
    return _align(CTL_OFF + CTL_STRIDE * n_sets, DATA_ALIGN)


def _load_getcpu():
    """libc's sched_getcpu (a vDSO read, ~0.1 µs plus ctypes) or None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, ImportError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


_getcpu = _load_getcpu() if sys.platform.startswith("linux") else None

_yield = os.sched_yield if hasattr(os, "sched_yield") else (lambda: None)

_FENCE = threading.Lock()


def _fence():
    """A full memory barrier: CPython's lock takes and releases with locked instructions, and
    on x86 a locked instruction orders every earlier store before every later load (~0.16 µs)."""
    _FENCE.acquire()
    _FENCE.release()


def _load_eventfd():
    """A maker of eventfds: ``os.eventfd`` (3.10+), else libc's through ctypes, else None."""
    if not sys.platform.startswith("linux"):
        return None
    flags = getattr(os, "EFD_NONBLOCK", 0o4000) | getattr(os, "EFD_CLOEXEC", 0o2000000)
    if hasattr(os, "eventfd"):
        return lambda: os.eventfd(0, flags)
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).eventfd
    except (OSError, AttributeError, ImportError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_uint, ctypes.c_int]

    def make():
        fd = fn(0, flags)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    return make


#: ``make_eventfd()`` → a non-blocking, close-on-exec eventfd; None where the OS has none.
make_eventfd = _load_eventfd()
#: What a ring writes to an eventfd: 1, as the kernel's native u64.
_EVENT_ONE = struct.pack("=Q", 1)


def eventfd_pair():
    """Two eventfds for one region's doorbell (the client's wake-up, the worker's), or None
    where eventfds are not available (the socketpair then stays the doorbell)."""
    if make_eventfd is None or not EVENTFD_BELL:
        return None
    first = make_eventfd()
    try:
        return first, make_eventfd()
    except OSError:
        os.close(first)
        raise


def _allowed_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_LOADAVG = []  # the open /proc/loadavg, once tried: [fd] or [None]


def read_load():
    """(runnable tasks, CPUs) of the whole machine, or None where /proc/loadavg is not there.

    The fourth field of /proc/loadavg counts the tasks running or runnable at this instant,
    this one included; ``os.cpu_count()`` counts the same machine's CPUs (in a container both
    are the host's)."""
    if not _LOADAVG:
        try:
            _LOADAVG.append(os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except (OSError, AttributeError):
            _LOADAVG.append(None)
    fd = _LOADAVG[0]
    if fd is None:
        return None
    try:
        running = int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return waitpolicy.Load(running, os.cpu_count() or 1)


_read_load = read_load  # the doorbell's reader (tests replace it)


def write_traces():
    """``XSTAGE_WAIT_TRACE``: every doorbell's trace, one JSON file each (at exit; a process
    that ends with ``os._exit`` calls this first)."""
    if not TRACE_DIR:
        return
    import json

    for n, bell in enumerate(_TRACES):
        role = "caller" if bell.nudge else "worker"
        path = os.path.join(TRACE_DIR, "wait-%s-%d-%d.json" % (role, os.getpid(), n))
        try:
            with open(path, "w") as f:
                json.dump(bell.trace_document(role), f)
        except OSError:
            pass


if TRACE_DIR:
    atexit.register(write_traces)


#: Regions at least this large ask for transparent huge pages (fewer TLB misses per copy).
HUGE_ADVICE_BYTES = 4 << 20


def _advise_huge(mm, size):
    """Ask for transparent huge pages on a large region's mapping; honoured only where the
    kernel allows them for shared memory (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``
    ``advise`` or ``within_size``), a no-op elsewhere."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or size < HUGE_ADVICE_BYTES:
        return
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        pass


def _align(n, a):
    return (n + a - 1) // a * a


def plan_layout(inputs, outputs, sets=1):
    """Slot table for declared I/O: ``[(name, role, tag, capacity)]`` → (slots, size).

    Every input needs a known capacity (else ``(None, 0)``: the stage runs inline). An
    output whose capacity is ``None`` (a data-dependent dimension) gets no slot and comes
    back inline. ``sets`` slot sets hold the same slots each. Returns ``(slots, size)``;
    ``(None, 0)`` also when the region would exceed ``MAX_REGION_BYTES``.
    """
    if not inputs or any(c is None for _, _, c in inputs):
        return None, 0
    if type(sets) is not int or not 1 <= sets <= MAX_SETS:
        raise ValueError("sets %r is outside [1, %d]" % (sets, MAX_SETS))
    specs = [(n, "in", t, c) for n, t, c in inputs]
    specs += [(n, "out", t, c) for n, t, c in outputs if c is not None]
    data_off = _align(desc_offset(sets) + len(specs) * sets * DESC.size, PAGE)
    cursor = data_off
    slots = []
    for s in range(sets):
        for name, role, tag, cap in specs:
            slots.append({"name": name, "role": role, "dtype": tag, "capacity": int(cap),
                          "offset": cursor, "set": s})
            cursor = _align(cursor + max(int(cap), 1), DATA_ALIGN)
    size = _align(cursor, PAGE)
    if size > MAX_REGION_BYTES:
        return None, 0
    return slots, size


_SLOT_KEYS = {"name", "role", "dtype", "capacity", "offset", "set"}


def validate_layout(size, slots, n_sets=1):
    """Check a slot table received from the peer before mapping anything.

    Every malformed table raises ``ProtocolError`` (never ``TypeError``/``ValueError``): the
    table is JSON from the peer, so any field may hold any JSON value.
    """
    if type(size) is not int or size <= 0 or size > MAX_REGION_BYTES:
        raise ProtocolError("region size %r is outside (0, %d]" % (size, MAX_REGION_BYTES))
    if type(n_sets) is not int or not 1 <= n_sets <= MAX_SETS:
        raise ProtocolError("region set count %r is outside [1, %d]" % (n_sets, MAX_SETS))
    if not isinstance(slots, list) or not slots or len(slots) > MAX_SLOTS:
        raise ProtocolError("region slot table must list 1..%d slots" % MAX_SLOTS)
    data_off = _align(desc_offset(n_sets) + len(slots) * DESC.size, PAGE)
    seen = set()
    end = data_off
    for i, s in enumerate(slots):
        if not isinstance(s, dict) or set(s) != _SLOT_KEYS:
            raise ProtocolError("region slot %d must have exactly %s" % (i, ", ".join(sorted(_SLOT_KEYS))))
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


class Region:
    """A mapped region with typed access to the control block, descriptors and slots.

    The creator alone unlinks a named region; ``close()`` is idempotent and never runs from
    ``__del__`` (unmapping under live numpy views raises, so close tolerates it).
    """

    def __init__(self, mm, size, slots, kind, name=None, creator=False, generation=1,
                 n_sets=1):
        self.mm = mm
        self.generation = generation
        self.size = size
        self.slots = slots
        self.kind = kind
        self.name = name
        self.creator = creator
        self.n_sets = n_sets
        self.desc_off = desc_offset(n_sets)
        self.index = {(s.get("set", 0), s["role"], s["name"]): i for i, s in enumerate(slots)}
        self._base = [CTL_OFF + CTL_STRIDE * k for k in range(n_sets)]
        self._views = {}
        self._packed = {}
        self._read = {}
        self._writes = {}  # (set, role, name, dtype, shape) -> (desc start, end, bytes, view)
        self._feeds = {}  # (set, the inputs' descriptor bytes) -> {name: view}
        self._spans = {}  # (set, input names) -> the inputs' descriptors (start, end), or ()
        self._outs = {}  # (slot index, descriptor bytes) -> view
        #: Who copies large inputs into their slots (``use_copier``), and from what size.
        self.copier = None
        self._copy_min = 1 << 62
        #: Copy large inputs in chunks, each announced in ``fill`` ("Streamed inputs"): the
        #: client's, where the worker's device reads the region by DMA.
        self.stream_fill = False
        self._fill_seq = 0
        self._closed = False

    # ------------------------------------------------------------------ creation / attach
    @classmethod
    def create(cls, size, slots, kind="auto", generation=1, n_sets=1):
        """Make a region for one worker generation: a memfd where the OS allows, else a
        named file (stale names of dead creators are swept first)."""
        if kind == "auto":
            kind = "memfd" if hasattr(os, "memfd_create") else "named"
        if kind == "memfd":
            fd = os.memfd_create("xstage-region", os.MFD_CLOEXEC)
            name = None
        elif kind == "named":
            sweep_stale_names()
            name = "/dev/shm/xstage-%d-%s" % (os.getpid(), os.urandom(6).hex())
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        else:
            raise ValueError("unknown region kind %r" % kind)
        try:
            os.ftruncate(fd, size)
            if name:
                _allocate(fd, name, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            if name:
                _unlink(name)
            raise
        _advise_huge(mm, size)
        region = cls(mm, size, slots, kind, name, creator=True, generation=generation,
                     n_sets=n_sets)
        region.fd = fd
        _HEAD.pack_into(mm, 0, MAGIC, VERSION, size, len(slots), generation, n_sets)
        return region

    @classmethod
    def attach(cls, fd_or_name, size, slots, generation=1, n_sets=1):
        """Map a region the peer made for ``generation``; validates the slot table first,
        then the identity (a region of another generation is refused)."""
        try:
            validate_layout(size, slots, n_sets)
        except ProtocolError:
            if not isinstance(fd_or_name, str):
                os.close(fd_or_name)
            raise
        if isinstance(fd_or_name, str):
            if not fd_or_name.startswith("/dev/shm/xstage-") or "/" in fd_or_name[9:]:
                raise ProtocolError("region name %r is not an xstage region" % (fd_or_name,))
            fd = os.open(fd_or_name, os.O_RDWR)
            kind, name = "named", fd_or_name
        else:
            fd, kind, name = fd_or_name, "memfd", None
        try:
            if os.fstat(fd).st_size < size:
                raise ProtocolError("region is %d bytes, the table says %d"
                                    % (os.fstat(fd).st_size, size))
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _advise_huge(mm, size)
        if name:
            _unlink(name)  # both ends hold it now: the name has done its job
        magic, version, got_size, n, gen, got_sets = _HEAD.unpack_from(mm, 0)
        if magic != MAGIC or version != VERSION or got_size != size or n != len(slots) \
                or got_sets != n_sets:
            mm.close()
            raise ProtocolError("region identity %r v%d size %d n %d sets %d does not match the "
                                "table (v%d, %d sets)" % (magic, version, got_size, n, got_sets,
                                                          VERSION, n_sets))
        if gen != generation:
            mm.close()
            raise ProtocolError("region generation %d, this worker is generation %d (a region is "
                                "never reused across generations)" % (gen, generation))
        return cls(mm, size, slots, kind, name, generation=generation, n_sets=n_sets)

    def handed_over(self):
        """The creator's half of "unlinked as soon as both ends hold it"."""
        if self.creator and self.name:
            _unlink(self.name)
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)
            self.fd = None

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._views.clear()
        self._writes.clear()
        self.copier, self._copy_min = None, 1 << 62
        self._feeds.clear()
        self._outs.clear()
        self.handed_over()
        try:
            self.mm.close()
        except BufferError:  # a numpy view is still alive; the mapping goes with the process
            pass

    @property
    def closed(self):
        return self._closed

    # ------------------------------------------------------------------ control blocks
    # Every method takes the slot set ``s`` (0 by default: the one set of a depth-1 region).
    def req_id(self, s=0):
        return _U64.unpack_from(self.mm, self._base[s] + _R_REQ_ID)[0]

    def resp_id(self, s=0):
        return _U64.unpack_from(self.mm, self._base[s] + _R_RESP_ID)[0]

    def req_gen(self, s=0):
        return _U32.unpack_from(self.mm, self._base[s] + _R_REQ_GEN)[0]

    def resp_gen(self, s=0):
        return _U32.unpack_from(self.mm, self._base[s] + _R_RESP_GEN)[0]

    def answer_check(self, rid, s=0):
        """A function of no arguments, true once set ``s``'s ``resp_id`` is ``rid``: what a
        caller's wait polls (one read per check, no method call; the generation is checked
        once after, ``resp_gen``)."""
        unpack, mm, off = _U64.unpack_from, self.mm, self._base[s] + _R_RESP_ID
        return lambda: unpack(mm, off)[0] == rid

    def request_check(self, last, s=0):
        """A function of no arguments, true once set ``s``'s ``req_id`` is no longer ``last``
        (a new request is published): what the worker's idle wait polls."""
        unpack, mm, off = _U64.unpack_from, self.mm, self._base[s] + _R_REQ_ID
        return lambda: unpack(mm, off)[0] != last

    def answered(self, rid, s=0):
        """True when set ``s``'s published response answers request ``rid`` of this generation."""
        return self.resp_id(s) == rid and self.resp_gen(s) == self.generation

    def publish_request(self, rid, s=0, flags=0):
        # NOTE: inputs and descriptors are already written; the generation, flags and the
        # stamp, then the id last.
        base = self._base[s]
        _PUBLISH.pack_into(self.mm, base + _R_REQ_GEN, self.generation, flags, time.monotonic_ns())
        _U64.pack_into(self.mm, base + _R_REQ_ID, rid)

    def request_head(self, s=0):
        """Set ``s``'s ``(req_gen, req_flags)`` in one read (the worker's, once per request)."""
        gen, flags, _ = _PUBLISH.unpack_from(self.mm, self._base[s] + _R_REQ_GEN)
        return gen, flags

    def req_flags(self, s=0):
        return _U32.unpack_from(self.mm, self._base[s] + _R_REQ_FLAGS)[0]

    def take(self, rid, s=0):
        """The worker's start of request ``rid`` in set ``s``: False when it was withdrawn.

        NOTE (ordering): ``cancel_id`` is read *before* ``taken_id`` is written (see "Cancel").
        """
        base = self._base[s]
        if _U64.unpack_from(self.mm, base + _R_CANCEL_ID)[0] == rid:
            return False
        _U64.pack_into(self.mm, base + _R_TAKEN_ID, rid)
        return True

    def withdraw(self, rid, s=0):
        """The client's cancel of published request ``rid``: True when it had not started.

        NOTE (ordering): ``cancel_id`` is written *before* ``taken_id`` is read.
        """
        base = self._base[s]
        _U64.pack_into(self.mm, base + _R_CANCEL_ID, rid)
        return _U64.unpack_from(self.mm, base + _R_TAKEN_ID)[0] != rid

    def started(self, rid, s=0):
        """True once the worker has taken request ``rid`` of set ``s``."""
        return _U64.unpack_from(self.mm, self._base[s] + _R_TAKEN_ID)[0] == rid

    def publish_response(self, rid, status, worker_ns, rss=0, peak=0, s=0, start_ns=0,
                         end_ns=0, flags=0):
        # NOTE: outputs and descriptors first, then status, stats and stamps, the id last.
        base = self._base[s]
        _RESPONSE.pack_into(self.mm, base + _R_STATUS, status, 0, worker_ns, rss, peak)
        _STAMPS.pack_into(self.mm, base + _R_STAMPS, start_ns, end_ns, flags)
        _U32.pack_into(self.mm, base + _R_RESP_GEN, self.generation)
        _U64.pack_into(self.mm, base + _R_RESP_ID, rid)

    def announce(self, coming_ns):
        """The caller's heads-up: its next request is expected by ``coming_ns``
        (``time.monotonic_ns``; 0: none announced). See "Heads-up"."""
        _U64.pack_into(self.mm, OFF_COMING, coming_ns)

    def coming(self):
        """The announced ``coming_ns`` (0: none)."""
        return _U64.unpack_from(self.mm, OFF_COMING)[0]

    def set_flag(self, off, value):
        _U32.pack_into(self.mm, off, value)

    def flag(self, off):
        return _U32.unpack_from(self.mm, off)[0]

    def response(self, s=0):
        """(status, worker_ns, rss, peak) of set ``s``'s last published response."""
        status, _, worker_ns, rss, peak = _RESPONSE.unpack_from(self.mm, self._base[s] + _R_STATUS)
        return status, worker_ns, rss, peak

    def answer(self, s=0):
        """Set ``s``'s answer in one read: (status, worker_ns, rss, peak, published_ns,
        start_ns, end_ns, flags, resp_gen)."""
        base = self._base[s]
        f = _ANSWER.unpack_from(self.mm, base + _R_STATUS)
        return (f[0], f[2], f[3], f[4], _U64.unpack_from(self.mm, base + _R_PUB_NS)[0],
                f[11], f[12], f[13], f[7])

    # ------------------------------------------------------------------ descriptors + slots
    def has(self, role, name, s=0):
        return (s, role, name) in self.index

    def capacity(self, role, name, s=0):
        """The byte capacity of a slot, or None when it has none."""
        i = self.index.get((s, role, name))
        return None if i is None else self.slots[i]["capacity"]

    def use_copier(self, copier):
        """Copy inputs of at least ``copier.min_bytes`` with ``copier.copyto(dst, src,
        casting)`` (the client's ``CopyPool``: the same bytes, on several CPUs); None: every
        copy is one ``np.copyto``. Write plans made before are dropped (each says which copy)."""
        self.copier = copier
        self._copy_min = 1 << 62 if copier is None else copier.min_bytes
        self._writes.clear()

    def write(self, role, name, arr, s=0):
        """Copy ``arr`` into its slot and describe it; False if it has no slot or does not fit.

        One copy, straight into the slot (``np.copyto`` into a view of the mapping: no
        intermediate bytes; a large one split across the copier's threads, ``use_copier``). A
        (set, slot, dtype, shape) seen before reuses its descriptor's packed bytes, its view and
        its choice of copy: a call of a known signature costs one slice assignment and the
        copy."""
        key = (s, role, name, arr.dtype, arr.shape)
        plan = self._writes.get(key)
        if plan is None:
            i = self.index.get((s, role, name))
            if i is None:
                return False
            nbytes = arr.nbytes
            if nbytes > self.slots[i]["capacity"] or arr.ndim > MAX_RANK:
                return False
            view = self.view(role, name, arr.dtype, arr.shape, s) if nbytes else None
            off = self.desc_off + i * DESC.size
            # Where a large array may already be the slot itself (written in place): its address.
            at = view.__array_interface__["data"][0] if view is not None \
                and nbytes >= IN_PLACE_MIN_BYTES else None
            plan = (off, off + DESC.size, self._packed_desc(i, arr.shape, nbytes), view,
                    nbytes >= self._copy_min, at)
            if len(self._writes) > 64 * self.n_sets:
                self._writes.clear()
            self._writes[key] = plan
        off, end, raw, view, large, at = plan
        self.mm[off:end] = raw
        streamed = self.stream_fill and view is not None and role == "in" \
            and STREAM_MIN_BYTES <= view.nbytes < (1 << 32)
        if at is not None and arr.__array_interface__["data"][0] == at \
                and arr.flags.c_contiguous:
            if streamed:  # nothing streamed for it: no bytes a worker queued may stand for it
                self._announce(s, self.index[(s, role, name)], 0)
            return True  # the slot itself (``slot_views``), filled in place: nothing to copy
        if streamed and arr.flags.c_contiguous:
            self._stream(view, arr, s, self.index[(s, role, name)])
            return True
        if streamed:
            self._announce(s, self.index[(s, role, name)], 0)
        if view is not None:
            if large:
                self.copier.copyto(view, arr, "no")
            else:
                np.copyto(view, arr, casting="no")
        return True

    def _stream(self, view, arr, s, i):
        """Copy ``arr`` into slot ``i``'s ``view`` in chunks, each announced in set ``s``'s
        ``fill`` after its bytes ("Streamed inputs"; x86 keeps the stores in order)."""
        dst = view.reshape(-1).view(np.uint8)
        src = arr.reshape(-1).view(np.uint8)
        head = self._announce(s, i, 0)
        off, mm, pack = self._base[s] + _R_FILL, self.mm, _U64.pack_into
        n = dst.nbytes
        for a in range(0, n, STREAM_CHUNK_BYTES):
            b = min(a + STREAM_CHUNK_BYTES, n)
            dst[a:b] = src[a:b]
            pack(mm, off, head | b)

    def _announce(self, s, i, done):
        """A new ``seq`` for slot ``i`` of set ``s``, stored with ``done`` bytes; returns
        ``seq << 48 | i << 32``. Every large input written to a DMA-read region takes one, so
        bytes a worker queued for an earlier write (withdrawn, or abandoned for the inline
        way) never stand for this one."""
        self._fill_seq = (self._fill_seq + 1) & 0xFFFF
        head = (self._fill_seq << 48) | (i << 32)
        _U64.pack_into(self.mm, self._base[s] + _R_FILL, head | done)
        return head

    def fill(self, s=0):
        """Set ``s``'s ``fill`` (``seq << 48 | slot << 32 | bytes``; "Streamed inputs")."""
        return _U64.unpack_from(self.mm, self._base[s] + _R_FILL)[0]

    def fill_check(self, s=0):
        """A function of no arguments reading set ``s``'s ``fill`` (a waiter's poll)."""
        unpack, mm, off = _U64.unpack_from, self.mm, self._base[s] + _R_FILL
        return lambda: unpack(mm, off)[0]

    def slot_views(self, role, shapes, s=0):
        """Writable views of set ``s``'s ``role`` slots by name, at ``shapes`` ({name: (dtype,
        shape)}): what a caller fills in place (``write`` then copies nothing)."""
        return {name: self.view(role, name, dtype, shape, s)
                for name, (dtype, shape) in shapes.items()}

    def inputs(self, s, names):
        """Set ``s``'s inputs (``names``, a tuple) as views by name, each descriptor checked
        (``read_desc``).

        The descriptors of one set's inputs lie side by side (``plan_layout``); their bytes,
        read in one slice, key the views made from them before, so a call of a known signature
        costs one read. (A table whose inputs are not side by side reads each one.)"""
        if not names:
            return {}
        span = self._spans.get((s, names))
        if span is None:
            at = [self.index[(s, "in", name)] for name in names]
            side_by_side = at == list(range(at[0], at[0] + len(at)))
            off = self.desc_off + at[0] * DESC.size
            span = self._spans[(s, names)] = (off, off + len(at) * DESC.size) if side_by_side \
                else ()
        raw = self.mm[span[0]:span[1]] if span else None
        known = self._feeds.get((s, raw)) if span else None
        if known is not None:
            return dict(known)
        feeds = {}
        for name in names:
            dtype, shape = self.read_desc("in", name, s)
            feeds[name] = self.view("in", name, dtype, shape, s)
        if span:
            if len(self._feeds) > 16 * self.n_sets:
                self._feeds.clear()
            self._feeds[(s, raw)] = feeds
        return dict(feeds)

    def output(self, name, s=0):
        """A view of set ``s``'s output ``name`` as its descriptor (checked) describes it."""
        i = self.index[(s, "out", name)]
        off = self.desc_off + i * DESC.size
        raw = self.mm[off:off + DESC.size]
        view = self._outs.get((i, raw))
        if view is not None:
            return view
        dtype, shape = self.read_desc("out", name, s)
        view = self.view("out", name, dtype, shape, s)
        if len(self._outs) > 64 * self.n_sets:
            self._outs.clear()
        self._outs[(i, raw)] = view
        return view

    def describe(self, role, name, shape, nbytes, s=0):
        """Write only the descriptor (the data was written in place)."""
        self._put_desc(self.index[(s, role, name)], tuple(shape), nbytes)

    def _put_desc(self, i, shape, nbytes):
        off = self.desc_off + i * DESC.size
        self.mm[off:off + DESC.size] = self._packed_desc(i, shape, nbytes)

    def _packed_desc(self, i, shape, nbytes):
        # The packed bytes of a (slot, shape) pair never change: pack once, then one slice
        # assignment per call (~0.2 µs instead of a 36-field pack).
        key = (i, shape)
        raw = self._packed.get(key)
        if raw is None:
            dims = list(shape) + [0] * (MAX_RANK - len(shape))
            raw = DESC.pack(DTYPE_CODES[self.slots[i]["dtype"]], len(shape), 0, 0, nbytes, *dims)
            if len(self._packed) > 256:
                self._packed.clear()
            self._packed[key] = raw
        return raw

    def read_desc(self, role, name, s=0):
        """Validated ``(dtype, shape)`` of a slot's current content, from the peer's descriptor."""
        i = self.index[(s, role, name)]
        off = self.desc_off + i * DESC.size
        raw = self.mm[off:off + DESC.size]
        known = self._read.get(raw)
        if known is not None and known[0] == i:
            return known[1], known[2]  # these exact bytes were validated for this slot before
        slot = self.slots[i]
        fields = DESC.unpack(raw)
        code, rank, nbytes = fields[0], fields[1], fields[4]
        tag = CODE_DTYPES.get(code)
        if tag != slot["dtype"]:
            raise ProtocolError("slot %r: descriptor dtype code %d, slot holds %s"
                                % (name, code, slot["dtype"]))
        if rank > MAX_RANK:
            raise ProtocolError("slot %r: rank %d exceeds %d" % (name, rank, MAX_RANK))
        shape = tuple(fields[5:5 + rank])
        count = 1
        span = DTYPES[tag][1]
        for d in shape:
            if d > MAX_DIM:  # a zero beside huge dimensions would pass the byte count
                raise ProtocolError("slot %r: dimension %d exceeds %d" % (name, d, MAX_DIM))
            count *= d
            span *= d or 1
        if span > (1 << 63) - 1:  # numpy refuses such a shape even when it is empty
            raise ProtocolError("slot %r: shape %s spans more than 2^63 - 1 bytes" % (name, shape))
        if count * DTYPES[tag][1] != nbytes or nbytes > slot["capacity"]:
            raise ProtocolError("slot %r: nbytes %d does not match shape %s or exceeds capacity %d"
                                % (name, nbytes, shape, slot["capacity"]))
        dtype = dtype_of_tag(tag, name)
        if len(self._read) > 256:
            self._read.clear()
        self._read[raw] = (i, dtype, shape)
        return dtype, shape

    def view(self, role, name, dtype, shape, s=0):
        """A numpy view of a slot's bytes (valid until the region is closed; cached)."""
        key = (s, role, name, dtype, shape)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        slot = self.slots[self.index[(s, role, name)]]
        count = 1
        for d in shape:
            count *= d
        if count * dtype.itemsize > slot["capacity"]:
            raise ProtocolError("slot %r: %s of %s does not fit %d bytes"
                                % (name, shape, dtype, slot["capacity"]))
        if count == 0:
            return np.empty(shape, dtype=dtype)
        view = np.frombuffer(self.mm, dtype=dtype, count=count,
                             offset=slot["offset"]).reshape(shape)
        if len(self._views) > 64 * self.n_sets:
            self._views.clear()
        self._views[key] = view
        return view


class RegionSpaceError(OSError):
    """No room for a named region's bytes where its name lives (a full ``/dev/shm``).

    Raised by ``Region.create`` before anything is mapped: a sparse file there would map, and
    the first write past the free space would kill the writer with SIGBUS instead.
    """


def _allocate(fd, name, size):
    """Every byte of a named region allocated up front (``posix_fallocate``): a full
    ``/dev/shm`` is ``RegionSpaceError`` now, never a SIGBUS at the first write. Where the
    file system cannot allocate ahead (no ``posix_fallocate``, ``EOPNOTSUPP``), the file stays
    sparse, as before."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return
    try:
        fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise RegionSpaceError(exc.errno, "no room for a %d-byte shared region in %s (%s)"
                                   % (size, os.path.dirname(name), os.strerror(exc.errno)),
                                   name) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def sweep_stale_names():
    """Unlink ``/dev/shm/xstage-<pid>-*`` names whose creator is gone (it died during the
    hand-over, before either end could unlink); best effort, Linux only. A name this user may
    not remove (another user's, in the sticky ``/dev/shm``) is skipped: a new region's name is
    random and ``O_EXCL``, so a planted one never stands in for it."""
    if os.name != "posix":
        return
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for entry in names:
        parts = entry.split("-")
        if len(parts) != 3 or parts[0] != "xstage" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            try:
                _unlink("/dev/shm/" + entry)
            except OSError:  # another user's name in the sticky folder: theirs to remove
                continue
        except (PermissionError, OverflowError, OSError):
            continue


def _unlink(name):
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass


class Doorbell:
    """One side's wake-ups: one end of a socketpair, or a pair of eventfds once the region is
    attached (``use_eventfds``); see the wait policy above.

    With eventfds a ring writes the peer's eventfd and a blocked wait polls this side's (and
    the watched fds) and reads it: a blocked round trip costs ~8 µs of system calls here
    instead of ~12-14 µs through the socketpair (``benchmarks/doorbell.py``; a futex through
    ctypes, ~9 µs, cannot watch a socket while it sleeps). An eventfd
    never reports that the peer is gone, so the socket stays: the control socket, which both
    sides watch while they block, reports a death as its end-of-file.

    With a region, ``own``/``peer`` are the offsets of this side's and the peer's asleep
    flags; without one (or where spinning is off) every ring is sent. ``policy`` (a
    ``waitpolicy.WaitPolicy``, made at the first ``bind``) decides each wait's spin; ``trace``,
    when it is a list, receives every decision with its inputs and what the wait saw
    (``XSTAGE_WAIT_TRACE``).
    """

    def __init__(self, sock):
        self.sock = sock
        self.sock.setblocking(False)
        self.region = None
        self.own = self.peer = None
        self._nudged = -NUDGE_SECONDS
        self.nudge = False
        self.policy = None
        self.trace = None
        self._load = None
        self._sampled = -LOAD_SAMPLE_SECONDS
        self._next = None  # the decision ring() made for the wait that follows it
        self._unlearned = None  # an answered spin's outcome, told the policy later (_catch_up)
        self._wait_fd = self._ring_fd = None  # eventfds: this side's wake-up, the peer's
        self._polls = {}  # watched fds -> a registered select.poll (eventfd mode)

    def use_eventfds(self, wait_fd, ring_fd):
        """Ring ``ring_fd`` and block on ``wait_fd`` from now on (this side owns both; the
        ones used before are closed). The socket stays open: a death still ends it."""
        self.close_eventfds()
        self._wait_fd, self._ring_fd = wait_fd, ring_fd

    def close_eventfds(self):
        for fd in (self._wait_fd, self._ring_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wait_fd = self._ring_fd = None
        self._polls = {}

    @property
    def kind(self):
        """``eventfd`` or ``socket``: what rings and what a blocked wait sleeps on."""
        return "socket" if self._wait_fd is None else "eventfd"

    def bind(self, region, own, peer, nudge=False, spin=None):
        """Use ``region``'s flags; ``nudge``: this side checks for a shared CPU and moves off
        it (the caller's side only; see "Shared CPU"); ``spin``: this side's spin budget
        (default ``SPIN_SECONDS``). A rebind (a resized region) keeps what the policy learned."""
        self.region, self.own, self.peer, self.nudge = region, own, peer, nudge
        if self.policy is None:
            self.policy = waitpolicy.WaitPolicy(
                SPIN_SECONDS if spin is None else spin, _allowed_cpus(), spinning=SPIN,
                long_call=LONG_CALL_SECONDS, preempted=PREEMPTED_SECONDS,
                crowd_blocks=CROWD_BLOCKS, near_end=NEAR_END_SECONDS,
                hold=SPIN_YIELD_SECONDS)
            if TRACE_DIR:
                self.trace = []
                _TRACES.append(self)

    def summary(self):
        """The policy's decisions and outcomes so far (``waitpolicy.WaitPolicy.summary``),
        with ``line``: the same in words (``waitpolicy.describe``)."""
        if self.policy is None:
            return {}
        self._catch_up()
        summary = self.policy.summary()
        summary["line"] = waitpolicy.describe(summary)
        return summary

    def _shares_cpu(self, known=0):
        """True when this side should stop spinning: the peer last waited on this CPU and
        moving off it failed or was tried less than ``NUDGE_SECONDS`` ago. ``known``: this
        side's CPU + 1 as just read (0: read it here)."""
        cpu = known - 1 if known else _getcpu()
        if cpu < 0 or self.region.flag(self.peer + CPU_AFTER_FLAG) != cpu + 1:
            return False
        now = time.monotonic()
        if now - self._nudged < NUDGE_SECONDS:
            return True
        self._nudged = now
        try:
            allowed = os.sched_getaffinity(0)
            others = allowed - {cpu}
            if not others:
                return True
            os.sched_setaffinity(0, others)
            os.sched_setaffinity(0, allowed)
        except (OSError, AttributeError):
            return True
        self.region.set_flag(self.own + CPU_AFTER_FLAG, _getcpu() + 1)
        return False

    def ring(self, expected=None):
        """Wake the peer if it sleeps (the answer or request is already published).

        A side always waits after it rings, so with a region bound the policy decides that
        wait here (``expected`` as for ``wait``). The asleep flag is raised only in the wait
        itself (flag, barrier, re-check, sleep): a ring often wakes the peer onto the ringer's
        CPU, where it answers before the ringer's ``write`` returns, and a flag raised before
        the ring made the peer ring back a side that never slept (one system call each way,
        and a stale wake-up in the next wait).
        """
        region = self.region
        if SPIN and region is not None:
            # NOTE (ordering): the number just published must be visible to the peer before
            # its flag is read here, or both sides could miss each other (store→load); a
            # locked instruction orders them (``_fence``, inline: see the wait policy above).
            _FENCE.acquire()
            _FENCE.release()
            if _U32.unpack_from(region.mm, self.peer)[0]:
                self._wake()
            # else the peer is spinning and will see the published number
        else:
            self._wake()
        # The decision after the ring, not before: a sleeping peer's wake-up starts ~1 µs
        # earlier (the policy, a clock read, now and then a load sample).
        if self.policy is not None and self._next is None and not region._closed:
            self._next = self._decide(expected)

    def wake(self):
        """A ring from a thread other than this side's waiter (concurrent runs): always
        written, it decides nothing for this side's next wait and reads no flag, so it is safe
        beside the waiter's ``wait``; the peer re-checks what was published."""
        self._wake()

    def _wake(self):
        """One ring: a write to the peer's eventfd, or a byte on the socketpair."""
        if self._ring_fd is not None:
            try:
                os.write(self._ring_fd, _EVENT_ONE)
            except OSError:
                pass  # the counter is full (never in practice): a wake-up is pending
            return
        try:
            self.sock.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the buffer is full: a wake-up is already pending
        except OSError:
            pass  # the peer is gone; the waiter's end-of-file check reports it

    def heads_up(self, coming_ns):
        """Wake the peer ahead of a request expected by ``coming_ns`` if it sleeps
        ("Heads-up"); True if a ring went out. Decides nothing for this side's next wait.
        Not while the last load sample shows more runnable tasks than CPUs: the worker's spin
        would take a CPU the machine's other work (and this copy) is waiting for."""
        region, load = self.region, self._load
        if region is None or not SPIN or region._closed or not region.flag(self.peer) \
                or (load is not None and load[0] > load[1]):
            return False
        region.announce(coming_ns)
        if self._ring_fd is not None:
            try:
                os.write(self._ring_fd, _EVENT_ONE)
            except OSError:
                pass
            return True
        try:
            self.sock.send(b"\0")
        except OSError:
            pass
        return True

    def _decide(self, expected):
        """(decision, expected, when): the policy asked, with a fresh load sample if due."""
        if self._unlearned is not None:
            self._catch_up()
        now = time.monotonic()
        if now - self._sampled >= LOAD_SAMPLE_SECONDS:
            self._sampled = now
            self._load = _read_load()
        return self.policy.decide(self._load, expected), expected, now

    def _consume(self):
        """Take the pending rings (one read: a ring is one byte, a few at most are pending);
        True if the other end has closed."""
        if self._wait_fd is not None:
            try:
                os.read(self._wait_fd, 8)  # the counter: every pending ring at once
            except OSError:  # nothing pending (a spurious readiness)
                pass
            return False
        try:
            return not self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # reset: the peer died with rings it never read
            return True

    def wait(self, ready, deadline, watch=(), spin=None, expected=None, heads_up=False):
        """Wait until ``ready()``; returns "ready", "watch" (a watched fd is readable),
        "closed" (the other end of the bell is gone) or "timeout". ``deadline`` is a
        ``time.monotonic()`` value or None. ``spin=0`` blocks at once without asking the
        policy; otherwise the policy decides (``spin`` caps its budget), told the answer's
        ``expected`` seconds where the caller knows them (a decision ``ring`` made stands).
        ``heads_up``: a ring that comes with an announced request ("Heads-up") ends a blocked
        wait in a spin until the announced time (the worker's idle wait)."""
        policy, region = self.policy, self.region
        made, self._next = self._next, None
        if self._unlearned is not None:
            self._catch_up()
        if ready():
            if made is not None and made[0].spin <= 0 and not region.closed:
                region.set_flag(self.own, 0)
            if policy is not None and spin != 0:
                policy.observe(0.0, 0.0, "ready", 0.0)
                if self.trace is not None:
                    self._record(made[0] if made else None, made[1] if made else expected,
                                 0.0, 0.0, "ready", 0.0)
            elif made is not None and self.trace is not None:
                self._record(made[0], made[1], 0.0, 0.0, None, None)
            return "ready"
        if policy is None or spin == 0:
            if made is not None and self.trace is not None:
                self._record(made[0], made[1], 0.0, 0.0, None, None)
            return self._sleep(ready, deadline, watch)
        decision, expected, start = made if made is not None else self._decide(expected)
        budget = decision.spin if spin is None else min(decision.spin, spin)
        tell = _getcpu is not None  # publish where this side runs
        cpu = 0
        if tell:
            cpu = _getcpu() + 1
            _U32.pack_into(region.mm, self.own + CPU_AFTER_FLAG, cpu)
        outcome, longest, spun = "blocked", 0.0, 0.0
        near_end = decision.rule == "near_end"
        if budget > 0 and near_end:  # sleep until near the expected answer first (waitpolicy)
            until = start + policy.wake(expected)
            state = self._sleep(ready, until if deadline is None else min(deadline, until),
                                watch, fine=True)
            if state != "timeout" or (deadline is not None and time.monotonic() >= deadline):
                # answered early (rung while asleep), or it ended for another reason
                self._learn(decision, expected, 0.0, 0.0, "blocked" if state == "ready" else None,
                            time.monotonic() - start)
                return state
        if budget > 0:
            begun = time.monotonic()
            outcome, longest, now = self._spin(ready, begun, budget, tell,
                                               cpu if not near_end else 0)
            spun = now - (begun if near_end else start)
            if outcome == "answered":
                self._unlearned = (tell, (decision, expected, spun, longest, outcome,
                                          now - start))
                return "ready"  # the answer first: the policy learns at the next decision
        early = self._announced if heads_up and SPIN else None
        state = self._sleep(ready, deadline, watch, early=early)
        while state == "coming":  # rung ahead of a request: spin until it is published
            if self._spin_until_coming(ready, tell):
                state = "ready"
                break
            state = self._sleep(ready, deadline, watch, early=early)
        self._learn(decision, expected, spun, longest, outcome if state == "ready" else None,
                    time.monotonic() - start)
        return state

    def _announced(self):
        """True while a heads-up's announced time (plus the slack) is still ahead."""
        coming = self.region.coming()
        return coming > 0 and coming / 1e9 + HEADS_UP_SLACK_SECONDS > time.monotonic()

    def _spin_until_coming(self, ready, tell):
        """The spin a heads-up asks for (taken once: the announcement is cleared); True if
        the request came within it."""
        region = self.region
        coming = region.coming() / 1e9
        region.announce(0)
        now = time.monotonic()
        budget = min(coming + HEADS_UP_SLACK_SECONDS, now + HEADS_UP_MAX_SECONDS) - now
        if budget <= 0:
            return ready()
        if self._spin(ready, now, budget, tell)[0] != "answered":
            return False
        if tell:
            self._tell_cpu()
        return True

    def _catch_up(self):
        """Tell the policy (and the trace) the answered spin ``wait`` left for later.

        An answered spin is the common end of a wait, and what follows it is the call's
        critical path (the caller's copy out, the worker's run): its outcome is learned at
        this side's next decision (``_decide``, after its next publish and ring) or wait,
        before anything else is decided, so the policy sees the same sequence (the traces
        replay), and the CPU this side now runs on is published then (the peer reads it when
        its next spin starts). ~2 µs a wait on the 2-vCPU VM.
        """
        late, self._unlearned = self._unlearned, None
        if late is not None:
            tell, args = late
            if tell and not self.region._closed:
                self._tell_cpu()
            self._learn(*args)

    def _tell_cpu(self):
        """Publish the CPU this side runs on now (the scheduler may have moved it while it
        spun); the peer's next spin reads it (``_shares_cpu``, the worker's yields)."""
        self.region.set_flag(self.own + CPU_AFTER_FLAG, _getcpu() + 1)

    def _learn(self, decision, expected, spun, longest, outcome, latency):
        """What a wait saw, told to the policy and the trace; ``outcome`` None: the wait ended
        for another reason (a watched fd, a death, the deadline), so there is nothing to learn."""
        if outcome is not None:
            self.policy.observe(spun, longest, outcome, latency)
        if self.trace is not None:
            self._record(decision, expected, spun, longest, outcome,
                         latency if outcome is not None else None)

    def _spin(self, ready, start, budget, tell, cpu=0):
        """Spin until ``ready()`` or the budget ends, yielding once every
        ``SPIN_YIELD_SECONDS`` (not on every check: see there); (outcome, longest gap between
        two checks, end time). A gap longer than the policy's ``preempted`` ends the spin at
        once: someone else ran on this CPU (after a yield, or preempting the spin). ``cpu``:
        this side's CPU + 1 as the wait read it (0: read it here)."""
        stop = start + budget
        preempted = self.policy.preempted
        shared = self._shares_cpu if tell and self.nudge else None
        monotonic = time.monotonic
        every = SPIN_YIELD_SECONDS
        if tell and not self.nudge and every:
            # The side that never moves (the worker) holds no CPU its peer last waited on:
            # the caller preempted there by this side's wake-up must run to send the next
            # request, so this spin yields on every check (as all spins did before holding).
            if _U32.unpack_from(self.region.mm, self.peer + CPU_AFTER_FLAG)[0] \
                    == (cpu or _getcpu() + 1):
                every = 0.0
        last = start
        due = start + every  # the next yield
        longest = 0.0
        # A shared CPU is checked when the spin starts and before each yield (not on every
        # check: ~0.4 µs each): on a shared CPU the yield itself hands over, so a short call
        # would always be answered before a later check could see it.
        if shared is not None and shared(cpu):
            return "shared", longest, monotonic()
        while True:
            if last >= due:
                if shared is not None and shared():
                    return "shared", longest, monotonic()
                _yield()
                now = monotonic()
                due = now + every
            else:
                now = monotonic()
            gap = now - last
            last = now
            if gap > longest:
                longest = gap
            if ready():  # (where this side runs now is told later: ``_catch_up``)
                return "answered", longest, now
            if gap > preempted:
                return "preempted", longest, now
            if now > stop:
                return "expired", longest, now

    def _record(self, decision, expected, spun, longest, outcome, latency):
        """One trace entry: the decision's inputs and the decision (None: the answer was
        there before the wait began), then what the wait saw (None: it ended for another
        reason, so the policy learned nothing from it)."""
        if len(self.trace) < MAX_TRACE:
            self.trace.append({
                "load": list(self._load) if self._load is not None and decision else None,
                "expected": expected,
                "decision": list(decision) if decision is not None else None,
                "wait": [spun, longest, outcome, latency] if outcome is not None else None})

    def trace_document(self, role):
        """The recorded trace with the policy's parameters (``tests/wire/test_waitpolicy.py``)."""
        self._catch_up()
        p = self.policy
        return {"role": role, "spin_seconds": p.spin_seconds, "allowed_cpus": p.allowed_cpus,
                "spinning": p.spinning, "long_call": p.long_call, "preempted": p.preempted,
                "window": p.window, "failures": p.failures, "min_backoff": p.min_backoff,
                "max_backoff": p.max_backoff, "load_margin": p.load_margin,
                "crowd_blocks": p.crowd_blocks, "near_end": p.near_end,
                "hold": p.hold,
                "cpus": os.cpu_count(), "waits": list(self.trace or [])}

    def _sleep(self, ready, deadline, watch, fine=False, early=None):
        region = self.region
        if region is None:
            return self._block(ready, deadline, watch)
        mm, own = region.mm, self.own
        _U32.pack_into(mm, own, 1)
        try:
            # NOTE (ordering): this side's asleep flag is stored before the answer is read,
            # and the poster stores the answer before reading the flag (``ring``): a full
            # barrier on each side, so at least one of them sees the other's store.
            _FENCE.acquire()
            _FENCE.release()
            if self._wait_fd is not None:
                return self._block_eventfd(ready, deadline, watch, fine, early)
            return self._block(ready, deadline, watch, fine, early)
        finally:
            if not region._closed:
                _U32.pack_into(mm, own, 0)

    def _block(self, ready, deadline, watch, fine=False, early=None):
        """Sleep on the socketpair (and ``watch``) until ``ready()``: ``select``, then take
        the rings. (With eventfds, ``_block_eventfd``; ``select`` keeps a deadline to the
        microsecond, so ``fine`` changes nothing here.) ``early``: "coming" when a ring
        leaves nothing ready but ``early()`` is true (a heads-up)."""
        if self._wait_fd is not None:
            return self._block_eventfd(ready, deadline, watch, fine, early)
        fds = [self.sock] + list(watch) if watch else [self.sock]
        while True:
            if ready():
                return "ready"
            timeout = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    return "timeout"
            readable, _, _ = select.select(fds, [], [], timeout)
            # A ring left over from an earlier wait wakes this one at once; it is taken here
            # and the loop sleeps again.
            rung = bool(readable) and readable[0] is self.sock
            if rung and self._consume():
                return "ready" if ready() else "closed"
            if ready():
                return "ready"
            if any(r is not self.sock for r in readable):
                return "watch"
            if rung and early is not None and early():
                return "coming"


    def _block_eventfd(self, ready, deadline, watch, fine=False, early=None):
        """``_block`` on this side's eventfd (and ``watch``): one registered poll per set of
        watched fds, so a blocked wait costs one poll and one read. ``fine``: the deadline
        is kept to the microsecond (``select``) rather than poll's milliseconds (the near-end
        sleep, whose deadline is a fraction of a millisecond away)."""
        key = tuple(watch)  # the watched sockets themselves (hashed by identity)
        poll = self._polls.get(key)
        if poll is None:
            poll = select.poll()
            for fd in (self._wait_fd,) + key:
                poll.register(fd, select.POLLIN)
            if len(self._polls) > 8:
                self._polls.clear()
            self._polls[key] = poll
        wait_fd = self._wait_fd
        while True:
            if ready():
                return "ready"
            timeout = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    return "timeout"
                if fine:
                    found = select.select((wait_fd,) + key, (), (), timeout)[0]
                    events = [(wait_fd if f == wait_fd else -1, 0) for f in found]
                else:
                    events = poll.poll(int(timeout * 1000) + 1)  # milliseconds, rounded up
            else:
                events = poll.poll(None)
            bell = False
            other = False
            for fd, _ in events:
                if fd == wait_fd:
                    bell = True
                else:
                    other = True
            if bell:
                # A ring left over from an earlier wait wakes this one at once; it is taken
                # here and the loop sleeps again.
                try:
                    os.read(wait_fd, 8)
                except OSError:
                    pass
            if ready():
                return "ready"
            if other:
                return "watch"
            if bell and early is not None and early():
                return "coming"


def socketpair():
    """A Unix stream socketpair (the doorbell and the control channel on one OS)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
