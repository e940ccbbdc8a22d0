"""The region's doorbell: wake-ups, and each wait's choice to spin or block (docs/wire.md).

Wait policy: each wait asks ``waitpolicy.WaitPolicy`` (a pure module: its rules, and why, are
in its docstring) whether to spin, and for how long, before it blocks. It spins, yielding
once every ``SPIN_YIELD_SECONDS`` (50 µs: a yield lets a peer that shares this CPU run, but
beside busy neighbours each yield hands the CPU to one of them for a scheduler slice, so a
small call's answer is awaited without one), while spinning can pay: the answer is expected
soon, recent spins were answered, and no check came back late (a late one means another task
ran on this CPU: the spin stops at once and the policy backs off). Otherwise it blocks at
once: beside neighbours that never sleep, a spinner's yield hands its CPU to them for a whole
scheduler slice, and a 64 B call took ~2-10 ms instead of ~15 µs (docs/performance.md). The doorbell
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

Every knob comes from the ``TransportTuning`` a doorbell is made with (``Doorbell(sock,
tuning=)``; None: the defaults, the module constants below), read into attributes once:
the spin loop reads locals. No knob is read from the environment.
"""

import atexit
import os
import platform
import select
import socket
import struct
import sys
import threading
import time

from . import waitpolicy
from .region_layout import CPU_AFTER_FLAG, NUDGE_SECONDS, U32
from .tuning import TransportTuning

#: The knobs' defaults (the client sends its own in ``load``; docs/configuration.md).
_DEFAULTS = TransportTuning()
#: Spin only where plain stores and loads are ordered (see the NOTE above).
SPIN = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
#: Long enough to cover a small call's round trip (tens of µs) many times over; short
#: enough that an idle worker sleeps almost at once. Each yield costs ~0.3-1 µs here.
SPIN_SECONDS = _DEFAULTS.spin_seconds
#: An idle worker spins this long after answering, then sleeps: long enough for a caller that
#: calls again at once (back-to-back calls cost tens of µs between them), short enough not to
#: burn a core the caller's own work needs between calls.
WORKER_SPIN_SECONDS = _DEFAULTS.worker_spin_seconds
#: A caller does not spin while the worker computes a call expected to take longer than this:
#: on a small machine its spinning would steal a core from the runtime's own threads (measured
#: here: a 0.5 ms call took 1.5 ms round trip with the caller spinning, 0.55 ms without); the
#: doorbell's wake-up (~20-50 µs) is small against such a call.
LONG_CALL_SECONDS = _DEFAULTS.long_call_seconds
#: A spinner yields once this long after its last yield (or its start), not on every check.
#: Beside busy neighbours a yield hands the CPU to one of them for a scheduler slice (EEVDF
#: moves the yielder's deadline a slice later), so a spin that yielded on every check was
#: preempted at once and the policy blocked instead; a 64 B call's answer comes within ~10-20 µs,
#: before the first yield. Measured on the 2-vCPU VM beside 2 busy loops
#: (docs/performance.md#hotpath): half round trip 8.4-10.4 against 20.2-24.2 µs yielding on every check,
#: quiet unchanged. A yield every 50 µs still lets a peer that shares this CPU run (a spin never
#: holds it longer), and a spin preempted between two checks still stops at once.
#: 0: yield on every check (as before).
SPIN_YIELD_SECONDS = _DEFAULTS.spin_yield_seconds
#: A yield that returns later than this was preempted: another task ran on this CPU meanwhile
#: (a yield with nothing else to run takes ~0.3-1 µs here; a neighbour's scheduler slice is
#: ~1-3 ms). The spin stops at once and the policy backs off (waitpolicy rule 4).
PREEMPTED_SECONDS = _DEFAULTS.preempted_seconds
#: ``crowd_blocks`` (``XSTAGE_CROWD_BLOCKS=1`` on the client): a waiter blocks whenever the
#: machine has more runnable tasks than CPUs (+1), even where its spins pay (waitpolicy rule
#: 6): less CPU taken from busy neighbours (0.56-0.92x per 64 B call on the 2-vCPU VM beside
#: 2 loops), for a half round trip that was 0.75-1.25x in seven interleaved runs
#: (docs/performance.md#hotpath). Off by default: the target is latency, and the least loaded
#: run lost it.
CROWD_BLOCKS = _DEFAULTS.crowd_blocks
#: How often a waiter re-reads the machine's runnable tasks (waitpolicy rule 5): ~3.6 µs a
#: read here, so at most every 10 ms costs nothing measurable and follows a load that changes.
LOAD_SAMPLE_SECONDS = 0.01
#: A caller waiting for a call expected to be long sleeps until this many seconds before the
#: expected answer, then spins (waitpolicy rule 3, ``near_end``; 0: off). Why 100 µs: a timed
#: sleep ends up to 50 µs late (Linux's default timer slack) and a sleeping CPU takes tens of
#: µs more to wake; the spin that follows is at most three times this.
NEAR_END_SECONDS = _DEFAULTS.near_end_seconds
#: A caller whose inputs took at least this long to copy into the region last time wakes a
#: sleeping worker before it copies them again, telling it when to expect the request
#: ("Heads-up" above; 0: off). Why 100 µs: a sleeping CPU takes ~30 µs (2-vCPU VM) to 60-120 µs
#: (the 16-core Xeon) to wake, so a shorter copy would end before the worker is up anyway.
HEADS_UP_SECONDS = _DEFAULTS.heads_up_seconds
#: A worker woken by a heads-up spins until this long after the announced time at most (a copy
#: slower than announced), and never longer than ``HEADS_UP_MAX_SECONDS`` in all.
HEADS_UP_SLACK_SECONDS = 0.0001
HEADS_UP_MAX_SECONDS = 0.005
#: ``doorbell=socket`` (``XSTAGE_DOORBELL``) keeps the socketpair as the doorbell even where
#: eventfds exist (for comparing the two: ``benchmarks/transport.py --doorbell``).
EVENTFD_BELL = _DEFAULTS.doorbell != "socket"
#: The most waits one trace keeps.
MAX_TRACE = 200000
_TRACES = []



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


def eventfd_pair(tuning=None):
    """Two eventfds for one region's doorbell (the client's wake-up, the worker's), or None
    where eventfds are not available or ``tuning.doorbell`` is ``socket`` (None:
    ``EVENTFD_BELL``): the socketpair then stays the doorbell."""
    wanted = EVENTFD_BELL if tuning is None else tuning.doorbell != "socket"
    if make_eventfd is None or not wanted:
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
    """Every traced doorbell's trace (``wait_trace``), one JSON file each in its folder (at
    exit; a process that ends with ``os._exit`` calls this first)."""
    import json

    for n, bell in enumerate(_TRACES):
        role = "caller" if bell.nudge else "worker"
        path = os.path.join(bell.trace_dir, "wait-%s-%d-%d.json" % (role, os.getpid(), n))
        try:
            with open(path, "w") as f:
                json.dump(bell.trace_document(role), f)
        except OSError:
            pass


def _traced(bell):
    """Keep ``bell``'s trace for ``write_traces`` (registered at exit with the first one)."""
    if not _TRACES:
        atexit.register(write_traces)
    _TRACES.append(bell)


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

    def __init__(self, sock, tuning=None):
        self.tune(tuning)
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

    def tune(self, tuning=None):
        """Take the knobs of ``tuning`` (a ``TransportTuning``; None: the defaults), read once
        into attributes (the spin loop reads locals): the caller's and the worker's spin
        budgets, how often a spin yields, the policy's parameters (made at the first ``bind``:
        a worker tunes its doorbell when ``load`` brings its client's tuning, before
        ``attach``) and ``trace_dir``."""
        tuning = _DEFAULTS if tuning is None else tuning
        self.tuning = tuning
        self.spin_seconds = tuning.spin_seconds
        self.worker_spin_seconds = tuning.worker_spin_seconds
        self.spin_yield_seconds = tuning.spin_yield_seconds
        #: ``wait_trace=DIR`` (``XSTAGE_WAIT_TRACE`` on the client): this doorbell records its
        #: decisions, their inputs and what each wait saw, and writes them to
        #: ``DIR/wait-<role>-<pid>-<n>.json`` at exit (``scripts/record_wait_traces.py``; the
        #: policy's tests replay such traces). None: no trace.
        self.trace_dir = tuning.wait_trace or None

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
        (default: the tuning's ``spin_seconds``). A rebind (a resized region) keeps what the
        policy learned."""
        self.region, self.own, self.peer, self.nudge = region, own, peer, nudge
        if self.policy is None:
            t = self.tuning
            self.policy = waitpolicy.WaitPolicy(
                self.spin_seconds if spin is None else spin, _allowed_cpus(), spinning=SPIN,
                long_call=t.long_call_seconds, preempted=t.preempted_seconds,
                crowd_blocks=t.crowd_blocks, near_end=t.near_end_seconds,
                hold=self.spin_yield_seconds)
            if self.trace_dir:
                self.trace = []
                _traced(self)

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
            if U32.unpack_from(region.mm, self.peer)[0]:
                self._wake()
            # else the peer is spinning and will see the published number
        else:
            self._wake()
        # The decision after the ring, not before: a sleeping peer's wake-up starts ~1 µs
        # earlier (the policy, a clock read, now and then a load sample).
        if self.policy is not None and self._next is None and not region.closed:
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
        if region is None or not SPIN or region.closed or not region.flag(self.peer) \
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
            U32.pack_into(region.mm, self.own + CPU_AFTER_FLAG, cpu)
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
            if tell and not self.region.closed:
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
        ``spin_yield_seconds`` (not on every check: see ``SPIN_YIELD_SECONDS``); (outcome, longest gap between
        two checks, end time). A gap longer than the policy's ``preempted`` ends the spin at
        once: someone else ran on this CPU (after a yield, or preempting the spin). ``cpu``:
        this side's CPU + 1 as the wait read it (0: read it here)."""
        stop = start + budget
        preempted = self.policy.preempted
        shared = self._shares_cpu if tell and self.nudge else None
        monotonic = time.monotonic
        every = self.spin_yield_seconds
        if tell and not self.nudge and every:
            # The side that never moves (the worker) holds no CPU its peer last waited on:
            # the caller preempted there by this side's wake-up must run to send the next
            # request, so this spin yields on every check (as all spins did before holding).
            if U32.unpack_from(self.region.mm, self.peer + CPU_AFTER_FLAG)[0] \
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
        U32.pack_into(mm, own, 1)
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
            if not region.closed:
                U32.pack_into(mm, own, 0)

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
