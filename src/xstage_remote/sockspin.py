"""Spin before blocking on the control socket: the socket path's wait.

A blocked receive sleeps in the kernel, and the reply then wakes it: on a virtual machine
whose idle vCPUs halt (guest halt-polling off) that wake-up costs tens of µs, more than a
64 B call's whole CPU work (docs/performance.md#sockwait). A receive
that polls the socket (``MSG_DONTWAIT``) for a bounded time first takes the reply on a CPU
that never slept.

When to spin is the shared region's decision, made by the same pure policy
(``waitpolicy.WaitPolicy``: its rules and why are in its docstring), with the same budgets:
``XSTAGE_SPIN_SECONDS`` for the client waiting for its reply, ``XSTAGE_WORKER_SPIN_SECONDS``
for the worker waiting for the next request, off where ``SPIN`` is off (not x86-64) or the
budget is 0. This module only measures for it: the machine's runnable tasks
(``/proc/loadavg``, sampled at most every ``LOAD_SAMPLE_SECONDS``), each spin's longest gap
between two polls, how each wait ended. A gap longer than ``PREEMPTED_SECONDS`` means
another task ran on this CPU: the spin stops there and the policy backs off. The socket
path always blocks at once on a crowded machine (the policy's ``crowded`` rule is on here):
a spinner beside busy neighbours takes the CPU they, or the peer, need.

Every fourth poll the spinner yields (``sched_yield``): where the peer runs on this same CPU
the yield hands it over, and the reply is there at the next poll. The client also moves off
the CPU its local worker last ran on (``proc_cpu``; "Shared CPU" in ``shm.py``), and waits
blocked for the reply to a request larger than one record (``client/worker.py``). The load
the policy is told is the fewest runnable tasks of the last ``STEADY`` samples: onnxruntime's
pool threads spin a while after each run, so one sample overstates the crowd.

A spin never outlives the caller's deadline: each poll goes through ``poll``, which raises
``TimeoutError`` once the deadline has passed (the client's ``DeadlineSocket.recv_nowait``),
and a peer that leaves is seen at the next poll (a receive of 0 bytes: end of file).
Python 3.9, standard library only.
"""

import os
import socket
import time

from . import shm, waitpolicy

__all__ = ["AVAILABLE", "SocketSpin", "close_proc_cpu", "install", "nonblocking_poll", "proc_cpu"]

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)

#: Whether a receive can poll here (Windows has no ``MSG_DONTWAIT``: its worker blocks).
AVAILABLE = _DONTWAIT != 0

#: A spin yields its CPU (``sched_yield``) every this many polls: where the peer shares this
#: CPU the yield hands it over; a yield on every poll slowed the polls themselves (measured:
#: docs/performance.md#sockwait).
YIELD_EVERY = 4

#: Load samples (``LOAD_SAMPLE_SECONDS`` apart) whose fewest runnable tasks the policy is told.
STEADY = 3

_READY = (0.0, 0.0, "ready", 0.0)  # a wait whose bytes were there at its first look


def nonblocking_poll(sock):
    """``poll(view)`` for a plain socket: the bytes received into ``view`` (0: end of file),
    or None when nothing is there yet.

    Raises:
        ValueError: ``sock`` has a Python timeout (a socket in timeout mode waits for
            readiness before a ``MSG_DONTWAIT`` receive, so the poll would block).
    """
    if sock.gettimeout() is not None:
        raise ValueError("nonblocking_poll needs a blocking socket (settimeout(None)), "
                         "not one with a timeout of %rs" % sock.gettimeout())
    recv_into = sock.recv_into

    def poll(view):
        try:
            return recv_into(view, 0, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None

    return poll


def proc_cpu(pid):
    """``() -> int``: the CPU process ``pid``'s main thread last ran on (``/proc/PID/stat``,
    field 39), or -1; None where there is no such file (another kernel, not Linux)."""
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None

    def cpu():
        try:
            return int(os.pread(fd, 1024, 0).rsplit(b")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            return -1

    cpu.fd = fd  # closed by ``close_proc_cpu``
    return cpu


def close_proc_cpu(cpu):
    """Close what ``proc_cpu`` opened (None: nothing)."""
    if cpu is not None:
        try:
            os.close(cpu.fd)
        except OSError:
            pass


def install(channel, spin_seconds, poll, peer_cpu=None, tuning=None):
    """Give ``channel`` (a ``wire.Channel``) a ``SocketSpin`` where waits could spin here;
    return it, or None (the channel then blocks at once, as before). ``tuning``: the
    ``TransportTuning`` whose policy knobs the spin takes (None: the defaults)."""
    if not AVAILABLE:
        return None
    spin = SocketSpin(spin_seconds, poll, peer_cpu=peer_cpu, tuning=tuning)
    if spin.never:
        return None
    channel.spin = spin
    return spin


class SocketSpin:
    """One side's receive wait on a socket: spin, as the policy decides, then block.

    Args:
        spin_seconds: this side's budget (``shm.SPIN_SECONDS`` for the client,
            ``shm.WORKER_SPIN_SECONDS`` for the worker).
        poll: ``poll(view) -> int | None`` (``nonblocking_poll`` or the client's
            ``DeadlineSocket.recv_nowait``).
        spinning: False turns every wait into a block (``shm.SPIN`` by default).
        allowed_cpus: CPUs this process may run on (default: its affinity mask).
        load: ``() -> waitpolicy.Load | None`` (default ``shm.read_load``).
        tuning: the ``TransportTuning`` whose ``long_call_seconds`` and ``preempted_seconds``
            the policy takes (None: the defaults).

    ``expected``: seconds the answer is expected to take (the client sets it from the
    worker's time per call; None for the worker's wait for a request).
    """

    def __init__(self, spin_seconds, poll, spinning=None, allowed_cpus=None, load=None,
                 peer_cpu=None, tuning=None):
        if spinning is None:
            spinning = shm.SPIN and AVAILABLE
        if allowed_cpus is None:
            allowed_cpus = shm._allowed_cpus()
        self.policy = waitpolicy.WaitPolicy(
            spin_seconds, allowed_cpus, spinning=spinning,
            long_call=shm.LONG_CALL_SECONDS if tuning is None else tuning.long_call_seconds,
            preempted=shm.PREEMPTED_SECONDS if tuning is None else tuning.preempted_seconds,
            crowd_blocks=True)
        self.poll = poll
        self.expected = None
        self._read_load = shm.read_load if load is None else load
        self._load = None
        self._sampled = -shm.LOAD_SAMPLE_SECONDS
        self._recent = []  # runnable tasks in the last samples (``_steady``)
        self._crowded = False  # the last decision was "crowded" (until the next sample)
        #: ``() -> int``: the CPU the peer last ran on (``proc_cpu``), where it is known: a
        #: spin that finds the peer on its own CPU moves itself off it ("Shared CPU").
        self.peer_cpu = peer_cpu if shm._getcpu is not None else None
        self._nudged = -shm.NUDGE_SECONDS
        self.moved = 0  # how many times a spin moved this process off the peer's CPU
        self._waiting = None  # (spun, longest gap, outcome, start) of a wait that blocked
        self._seen = None  # what the last wait saw, for the policy (``Wait``'s fields)

    @property
    def never(self):
        """True where every wait would block (spinning off, no budget, one CPU allowed): such
        a spin is better not installed (``install``), so a wait costs nothing extra."""
        p = self.policy
        return not p.spinning or p.spin_seconds <= 0 or p.allowed_cpus <= 1

    def recv_into(self, view):
        """Spin for the bytes of the next frame; the count received into ``view`` (0: the
        peer closed), or None: the policy said block, or nothing came within the spin, so
        the caller blocks, then calls ``blocked``. ``TimeoutError`` from ``poll`` passes
        through (a deadline).

        A wait the policy blocks costs no poll (the blocking receive takes bytes already
        there). What a wait saw is told to the policy at the start of the next wait, not
        when the bytes arrive: the frame they begin is read first (the next wait begins
        after this side's send, while the peer works).
        """
        policy = self.policy
        seen = self._seen
        if seen is not None:
            self._seen = None
            policy.observe(*seen)
        now = time.monotonic()
        if now - self._sampled >= shm.LOAD_SAMPLE_SECONDS:
            self._sampled = now
            self._load = self._steady(self._read_load())
        elif self._crowded:  # the same sample would say "crowded" again: block, no decision
            policy.rules["crowded"] += 1
            return None
        decision = policy.decide(self._load, self.expected)
        if decision.rule != "spin" or decision.spin <= 0:
            # "crowded" stands until the next load sample (it depends on nothing else)
            self._crowded = decision.rule == "crowded"
            self._waiting = (0.0, 0.0, "blocked", now)
            return None
        self._crowded = False
        poll = self.poll
        k = poll(view)
        if k is not None:  # already there
            self._seen = _READY
            return k
        last = now
        if self.peer_cpu is not None and now - self._nudged >= shm.NUDGE_SECONDS:
            self._nudged = now
            self._move_off_peer()
            last = time.monotonic()  # the move's migration is not a preemption of the spin
        stop = now + decision.spin
        preempted = policy.preempted
        monotonic = time.monotonic
        yield_ = shm._yield
        every = YIELD_EVERY
        polls = 0
        longest = 0.0
        while True:
            polls += 1
            if polls % every == 0:
                yield_()
            k = poll(view)
            t = monotonic()
            gap = t - last
            last = t
            if gap > longest:
                longest = gap
            if k is not None:
                self._seen = (t - now, longest, "answered", t - now)
                return k
            if gap > preempted:
                outcome = "preempted"
                break
            if t > stop:
                outcome = "expired"
                break
        self._waiting = (t - now, longest, outcome, now)
        return None

    def _move_off_peer(self):
        """Where the peer last ran on this process's CPU, move to another CPU it may use
        (pinning to the others migrates at once; the full mask is restored right after), as
        the shared region's caller does (``shm.py``, "Shared CPU"): two spinners on one CPU
        take turns by yields, and the peer's reply waits for each. Once a millisecond at
        most; never on the worker's side (both moving would chase each other)."""
        cpu = shm._getcpu()
        if cpu < 0 or self.peer_cpu() != cpu:
            return
        try:
            allowed = os.sched_getaffinity(0)
            others = allowed - {cpu}
            if others:
                os.sched_setaffinity(0, others)
                os.sched_setaffinity(0, allowed)
                self.moved += 1
        except (OSError, AttributeError):
            pass

    def _steady(self, load):
        """The load the policy is told: the fewest runnable tasks of the last ``STEADY``
        samples. onnxruntime's pool threads spin a while after each run, so one sample on a
        quiet 2-CPU machine often shows a task or two beyond the CPUs; neighbours that never
        sleep show in every sample (measured: docs/performance.md#sockwait)."""
        recent = self._recent
        if load is None:
            recent.clear()
            return None
        recent.append(load[0])
        if len(recent) > STEADY:
            del recent[0]
        return waitpolicy.Load(min(recent), load[1])

    def blocked(self):
        """The blocking receive that followed a None from ``recv_into`` has returned: the
        policy learns, at the next wait, how long the answer took (``slow_answers``)."""
        waiting = self._waiting
        if waiting is not None:
            self._waiting = None
            spun, longest, outcome, start = waiting
            self._seen = (spun, longest, outcome, time.monotonic() - start)

    def summary(self):
        """The policy's decisions and outcomes so far, with ``line`` in words."""
        seen = self._seen
        if seen is not None:
            self._seen = None
            self.policy.observe(*seen)
        summary = self.policy.summary()
        summary["line"] = waitpolicy.describe(summary)
        if self.peer_cpu is not None:
            summary["moved"] = self.moved
            summary["line"] += ", moved off the peer's CPU %d" % self.moved
        return summary

