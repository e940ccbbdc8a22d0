"""Requests in flight to one worker: the queue, the K slot sets, results in submission order.

A worker's region holds K slot sets (``depth``), so K requests can be in flight at once: while
the worker computes request n, the client has already written request n+1's inputs into the
next set. Requests beyond K wait in the client's queue. Whoever holds the worker client's lock
is the *driver*: it publishes queued requests into free sets (in the sets' cyclic order, which
the worker follows), waits on the doorbell for the oldest request's answer, copies its outputs
out and resolves it. A synchronous call drives in the caller's thread (no Future, no thread
hand-over); futures are driven by one pump thread, started on the first ``submit``.

Each request has a deadline counted from its submission. One that passes before the request
has *started* (the worker has taken its descriptor) fails it with ``CallTimeout`` and withdraws
it (the worker answers it as cancelled, never runs it, and the set is free again). One that
passes while the worker computes it kills the worker: that request gets ``CallTimeout``, every
other request in flight ``WorkerDied`` naming the generation. ``StageFuture.cancel()`` withdraws
a queued request, or a published one that has not started (shm.py, "Cancel").

Lifecycle of a request::

    queued ──publish──▶ in flight ──answer──▶ done (result, error, or discarded)
      │                    │
      └ cancel/deadline    └ withdrawn (cancel/deadline before start): answered "cancelled"
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors
from xstage.client import copies, device_slots
from xstage_remote import shm, wire


def _heads_up_default(seconds: float) -> int:
    """``seconds`` (the tuning's ``heads_up_seconds``) in ns with 4 CPUs or more, else 0.

    On the 2-vCPU VM a heads-up's ring made the caller 60 µs slower (the woken worker took
    the caller's CPU, the other was asleep) for a worker woken ~3 µs earlier; with CPUs to
    spare the woken worker lands on an idle one (``benchmarks/heads_up.py``).
    """
    return int(seconds * 1e9) if copies.allowed_cpus() >= 4 else 0

if TYPE_CHECKING:
    from xstage.client.device_slots import DeviceSlots
    from xstage.client.worker import WorkerClient

__all__ = ["USE_DEADLINE", "Outputs", "Pipeline", "Reservation", "StageFuture"]


class Outputs(dict):  # type: ignore[type-arg]
    """A call's outputs by name, in graph order.

    ``state_reset`` is true when a stage with state pairs ran this call from the initial state
    (the first call of a worker generation, or the first after ``reset_state()``).
    """

    state_reset = False


class _UseDeadline:
    """The ``timeout=`` default: the client's ``Deadlines.call`` (``None`` means no limit)."""

    def __repr__(self) -> str:
        return "USE_DEADLINE"


#: ``submit(feeds, timeout=USE_DEADLINE)``: the call deadline of the stage's ``Deadlines``.
USE_DEADLINE: Any = _UseDeadline()


class StageFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` for one request to a stage.

    Its result is the outputs by name. ``request_id`` and ``generation`` name the request and
    the worker that served it; ``timing`` holds the worker's stamps (``published_ns``,
    ``taken_ns``, ``start_ns``, ``end_ns``: ``time.monotonic_ns`` of this machine) once done.
    ``cancel()`` succeeds for a request that has not started.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__()
        self._pipeline = pipeline
        self.request_id: int | None = None
        self.generation: int | None = None
        self.timing: dict[str, int] = {}
        self.state_reset = False

    def cancel(self) -> bool:
        """Withdraw the request if it has not started; True when it will never run."""
        if self.done():
            return super().cancel()
        return self._pipeline.cancel(self)

    def _base_cancel(self) -> bool:
        """Cancel it and tell its waiters.

        ``concurrent.futures.wait`` and ``as_completed`` count a cancelled future done only
        once ``set_running_or_notify_cancel`` moved it on to ``CANCELLED_AND_NOTIFIED``.
        """
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED, waiters told
        return True


def _snapshot(feeds: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of a request that stays queued, copied: ``submit`` reads them only once.

    A caller may refill its buffers as soon as ``submit`` returns (docs/serving.md,
    "Requests"). Device tensors are the caller's until the request is answered.
    """
    return {name: a.copy() if type(a) is np.ndarray else a for name, a in feeds.items()}


class _Req:
    """One request: its inputs, who waits for it, its deadline and where it is."""

    __slots__ = ("deadline", "discard", "done", "error", "feeds", "flags", "future", "out",
                 "phase", "published", "result", "rid", "seconds", "set", "timing", "token",
                 "uncertain")

    def __init__(self, feeds: Mapping[str, np.ndarray], future: StageFuture | None,
                 seconds: float | None, phase: str,
                 out: Mapping[str, np.ndarray] | None = None) -> None:
        self.feeds = feeds
        self.future = future
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.phase = phase
        self.out = out or {}
        self.flags = 0  # shm.FLAG_RESET_STATE: the stage's state is reset before it runs
        self.rid = 0
        self.set = -1
        self.published = False  # its id is in its set's control block
        self.discard = False  # nobody wants the outputs (cancelled, timed out, interrupted)
        self.done = False
        self.result: dict[str, np.ndarray] | None = None
        self.error: BaseException | None = None
        self.timing: dict[str, int] = {}
        #: The reserved slot set its inputs were written in (``input_slots``), else None.
        self.token: Reservation | None = None
        #: An interrupted request of a stage with state: its answer says whether it ran.
        self.uncertain = False


class Reservation:
    """One slot set handed out by ``input_slots``, reserved for the call given its views.

    No request is published into it but the call given its views (recognised by their
    addresses), until that call takes it or every view is dropped unused
    (``weakref.finalize``: the set is given back).
    """

    __slots__ = ("addrs", "left", "set", "__weakref__")

    def __init__(self, s: int, addrs: dict[str, int], views: int) -> None:
        self.set = s
        self.addrs = addrs  # input name -> the slot's address (non-empty slots only)
        self.left = [None] * views  # one entry per live view; popped as each one dies

    def carried_by(self, feeds: Mapping[str, Any]) -> bool:
        """Whether ``feeds`` holds one of this set's views (by address)."""
        for name, addr in self.addrs.items():
            arr = feeds.get(name)
            if type(arr) is np.ndarray:
                if arr.__array_interface__["data"][0] == addr:
                    return True
            elif arr is not None and device_slots.is_cuda_tensor(arr) and arr.data_ptr() == addr:
                return True
        return False


def _address(view: Any) -> int:
    """Where a handed-out view starts: a numpy slot's address, or a CUDA tensor's pointer."""
    if type(view) is np.ndarray:
        return int(view.__array_interface__["data"][0])
    return int(view.data_ptr())


def _view_dropped(token: Reservation, dropped: deque[Reservation]) -> None:
    """A reserved view died (``weakref.finalize``): the last one gives the set back.

    Runs wherever the garbage collector does, so it takes no lock: the pipeline takes the
    token off ``dropped`` the next time it looks (``_forget_dropped``).
    """
    with contextlib.suppress(IndexError):
        token.left.pop()
    if not token.left:
        dropped.append(token)


class Pipeline:
    """The requests of one worker client: queue, in-flight sets, the pump thread.

    Every method that drives (``call``, ``drain``, the pump) runs with the client's lock held;
    ``submit`` and ``cancel`` only take the pipeline's own short lock.
    """

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self.mu = threading.Lock()
        self.work = threading.Condition(self.mu)
        self.queue: deque[_Req] = deque()
        self.inflight: deque[_Req] = deque()
        self.next_set = 0
        self.closed = False
        #: Whether the stage keeps state in the worker: published requests are not withdrawn.
        self.stateful = False
        self._pump: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._pump_waiting = False
        self.on_death: Callable[[list[_Req], BaseException], bool] | None = None
        self._names_of: list[dict[str, Any]] | None = None  # the outputs _out_names lists
        self._out_names: list[str] = []
        #: The worker's device slots (torch-cuda ``device_tensors=on``), else None.
        self.device: DeviceSlots | None = None
        #: The last fast call's copy of its inputs into the region (ns): a long one is
        #: announced to a sleeping worker before the next (``shm.Doorbell.heads_up``).
        self._copy_in_ns = 0
        #: A copy in at least this long (ns) is announced; 0: never (``_heads_up_default``).
        self.heads_up_ns = _heads_up_default(client.tuning.heads_up_seconds)
        #: Slot sets handed out by ``input_slots`` and not yet taken, by set (``mu`` held).
        self.reserved: dict[int, Reservation] = {}
        #: Reservations whose views all died unused (appended without a lock, see
        #: ``_view_dropped``).
        self._dropped: deque[Reservation] = deque()
        #: The set a synchronous call in this thread's fast way is using, else -1: not in
        #: ``inflight``, so ``reserve`` reads it (written before the call reads ``reserved``,
        #: read after ``reserve`` writes it: one of the two sees the other).
        self.fast_set = -1
        #: Threads waiting in ``input_slots`` for a set to come free, and their condition.
        self.slot_waiters = 0
        self.freed = threading.Condition(self.mu)

    # ------------------------------------------------------------------ entry points
    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return not self.queue and not self.inflight

    def call(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
             phase: str, views: bool = False) -> dict[str, np.ndarray]:
        """A synchronous call, driven in the caller's thread (the client's lock is held).

        ``views``: outputs read from the region are returned as read-only views of their slots
        (``WorkerClient.run``); only where the call goes the fast way, nothing in flight.
        """
        c = self.client
        seconds = getattr(c.deadlines, phase)
        flags = c._take_reset()
        if not self.queue and not self.inflight:
            region = c._region
            if region is not None:
                self.fast_set = self.next_set  # before ``reserved`` is read (``reserve``)
                try:
                    result = self._call_fast(region, feeds, out, phase, seconds, flags, views)
                finally:
                    self.fast_set = -1
                    if self.slot_waiters:
                        with self.mu:
                            self.freed.notify_all()
                if result is not None:
                    return result
            return c._call_inline(feeds, out, phase, flags)  # one frame each way, no queue
        req = _Req(feeds, None, seconds, phase, out)
        req.flags = flags
        with self.mu:
            if self.reserved:
                req.token = self._token_of(feeds)
            self.queue.append(req)
        try:
            self._drive(lambda: req.done)
        except BaseException:
            self._abandon(req)
            raise
        finally:
            self._kick()
        if req.error is not None:
            raise req.error
        if req.result is None:  # cannot happen: every way out of _drive resolves it
            raise errors.StageClosed(f"the {c.route} worker is {c.state.value}")
        return req.result

    def _read_outputs(self, region: shm.Region, s: int, out: Mapping[str, np.ndarray],
                      result: dict[str, np.ndarray], views: bool = False) -> None:
        """Set ``s``'s outputs into ``result``, each descriptor checked before its copy.

        A name the caller gave an ``out`` array for is copied into it; with ``views``, the
        others are read-only views of their slots (no copy).
        """
        c = self.client
        if self.device is not None and self.device.on_device.get(s):
            result.update(self.device.outputs(s))  # device tensors: views of set s's slots
            return
        fill = c._fill_output
        if self._names_of is not c._outputs:  # the names, once per load
            self._names_of, self._out_names = c._outputs, [d["name"] for d in c._outputs]
        whole = c._copies.min_bytes  # a copy this large is split (``copies.CopyPool``)
        for name in self._out_names:
            try:
                view = region.output(name, s)  # the descriptor checked (cached by its bytes)
            except wire.ProtocolError as exc:
                c._abort()
                raise errors.RemoteProtocolError(f"worker {c.pid}: {exc}") from exc
            target = out.get(name) if out else None
            if target is not None:
                result[name] = fill(target, view, name)
            elif views:
                ro = view.view()
                ro.flags.writeable = False
                result[name] = ro
            elif view.nbytes < whole:  # a slot view is C-contiguous: its copy is owned, C order
                result[name] = view.copy()
            else:
                result[name] = fill(None, view, name)

    def _call_fast(self, region: shm.Region, feeds: Mapping[str, np.ndarray],
                   out: Mapping[str, np.ndarray], phase: str,
                   seconds: float | None, flags: int,
                   views: bool = False) -> dict[str, np.ndarray] | None:
        """Nothing queued or in flight: publish in the next set and wait, in this thread.

        None (nothing published) when an input has no slot or does not fit its slot: the
        call then goes the queue's way, inline.
        """
        c = self.client
        bell, ctl = c._bell, c._ctl
        assert bell is not None and ctl is not None
        s = self.next_set
        if self.reserved and not self._may_take(s, feeds):
            if not self._device_feeds(feeds):
                return None  # another caller's reserved set, or views of a set not next: inline
            if s in self.reserved:  # device tensors cannot go inline around it
                raise self._device_busy(s)
        if self._copy_in_ns >= self.heads_up_ns > 0:  # wake the worker during the copy
            bell.heads_up(time.monotonic_ns() + self._copy_in_ns)
        t0 = time.perf_counter_ns()
        written = self._write_inputs(region, feeds, s)
        if written is None:  # an input has no slot or does not fit it: the inline way
            return None
        flags |= written
        copy_in = self._copy_in_ns = time.perf_counter_ns() - t0
        rid = c._take_id()  # a fresh id per call: a stale response can never match it
        try:
            # An interrupt from here on finds the request published or not by its id in the
            # set (``req_id``), never by where in these lines it landed.
            region.publish_request(rid, s, flags)
            self.next_set = (s + 1) % region.n_sets
            bell.ring(expected=c._expected_s)  # decides the wait below (shm.Doorbell.ring)
            deadline = None if seconds is None else time.monotonic() + seconds
            # The doorbell's policy spins only where it can pay (shm.py, waitpolicy.py): told
            # the worker's recent compute, it blocks for calls expected to be long.
            # The spin checks the id alone (one read); the generation is checked once, after.
            answered = region.answer_check(rid, s)
            state = bell.wait(answered, deadline, watch=(ctl,), expected=c._expected_s)
            frame = None
            if state == "timeout":
                c._call_timeout(phase, seconds)
            if state in ("closed", "watch") and region.resp_id(s) != rid:
                # The worker either died or sent a frame ahead of its response (error, inline).
                if c._close_requested:
                    raise c._closed_under_call()
                frame = c._recv(phase, seconds)
                if region.resp_id(s) != rid:
                    bell.wait(answered, deadline, spin=0)
        except BaseException as exc:
            if not isinstance(exc, (errors.XstageError, errors.StageClosed)) \
                    and c._region is region and region.req_id(s) == rid:
                self.next_set = (s + 1) % region.n_sets
                req = _Req(feeds, None, None, phase)
                req.rid, req.set = rid, s
                req.discard = True  # interrupted: the next driver collects and drops its answer
                req.published = True
                if self.stateful:
                    self._uncertain(req, region)
                with self.mu:
                    self.inflight.append(req)
            raise
        if frame is None:
            status, worker_ns, rss, peak, published, start, end, answer, gen = region.answer(s)
            if status == shm.STATUS_OK and gen == c.generation:  # the common case
                c._expected_s = 0.7 * c._expected_s + 0.3 * worker_ns / 1e9
                t0 = time.perf_counter_ns()
                result = Outputs()
                if answer & shm.FLAG_STATE_RESET:
                    result.state_reset = True
                self._read_outputs(region, s, out, result, views)
                c.last_timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak,
                                 "copy_in_ns": copy_in,
                                 "copy_out_ns": time.perf_counter_ns() - t0,
                                 "published_ns": published, "start_ns": start, "end_ns": end}
                return result
        req = _Req(feeds, None, None, phase, out)
        req.rid, req.set, req.timing["copy_in_ns"] = rid, s, copy_in
        req.flags = flags
        self.inflight.append(req)
        self._collect(req, frame)
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def submit(self, feeds: Mapping[str, np.ndarray], seconds: float | None) -> StageFuture:
        """Queue a request; publish it at once when no one is driving and a set is free."""
        future = StageFuture(self)
        req = _Req(feeds, future, seconds, "call")
        future._req = req  # type: ignore[attr-defined]
        c = self.client
        # Nobody drives: publish in this thread. Whoever drives publishes only with the
        # client's lock held, so while this thread holds it no one reads ``req.feeds`` but it.
        driving = c._lock.acquire(blocking=False)
        try:
            with self.mu:
                if self.closed:
                    raise errors.StageClosed("the stage is closed")
                req.flags = c._take_reset()
                if self.reserved:
                    req.token = self._token_of(feeds)
                if not driving and req.token is None:
                    req.feeds = _snapshot(feeds)  # a driver may publish it any time from now
                self.queue.append(req)
            if driving:
                try:
                    if c._region is not None and not c._closed_why:
                        self._publish()
                except errors.XstageError:
                    pass  # the pump meets the same failure and fails the requests with it
                with self.mu:
                    if req.token is None and req in self.queue:  # not published: queued
                        req.feeds = _snapshot(feeds)
        finally:
            if driving:
                c._lock.release()
        self._kick()
        return future

    def cancel(self, future: StageFuture) -> bool:
        """``StageFuture.cancel``: withdraw a queued request, or a published one not started."""
        req: _Req = future._req  # type: ignore[attr-defined]
        with self.mu:
            if req.done or req.discard:
                return False
            if req in self.queue:
                self.queue.remove(req)
                self._give_back(req)
                req.discard = True
                req.done = True
                return future._base_cancel()
            if req not in self.inflight or self.stateful:
                return False
            if not req.published:  # the driver is writing its inputs: it will not publish it
                req.discard = True
                return future._base_cancel()
            region = self.client._region
            try:
                withdrawn = region is not None and region.withdraw(req.rid, req.set)
            except ValueError:  # the region was closed under us: the worker is gone
                return False
            if not withdrawn:
                return False
            req.discard = True  # its set comes free when the worker answers "cancelled"
            return future._base_cancel()

    def drain(self) -> None:
        """Collect every published request (the client's lock held): frames may follow."""
        if self.inflight:
            self._drive(lambda: not self.inflight, publish=False)

    def take_queued(self) -> list[_Req]:
        """Hand over the submitted requests not yet published (a restarted stage serves them)."""
        with self.mu:
            queued = [r for r in self.queue if r.future is not None]
            for req in queued:
                self.queue.remove(req)
        return queued

    def adopt(self, reqs: list[_Req]) -> None:
        """Serve requests queued for a worker that died, ahead of any later ones, in order."""
        if not reqs:
            return
        with self.mu:
            for req in reqs:
                req.rid, req.set, req.published = 0, -1, False
                req.token = None  # a set of the dead worker's region
                if req.future is not None:
                    req.future._pipeline = self
            self.queue.extendleft(reversed(reqs))
        self._kick()

    def reset_sets(self) -> None:
        """A new region: its sets start again at 0 (nothing may be in flight).

        Slots handed out of the old region are not reserved in the new one.
        """
        with self.mu:
            self.next_set = 0
            self.reserved.clear()
            self._notify_freed()

    # ------------------------------------------------------------------ reserved sets
    def reserve(self, n_sets: int) -> int | None:
        """A set no request owns, reserved for the call given its views; None if none is free.

        ``mu`` held. The sets in flight are the ``inflight`` ring before ``next_set`` and a
        synchronous call's ``fast_set``; the queued requests take the first free sets after
        it, so the reservation is the next free one after those. A set reserved while a
        synchronous call was choosing the same one is given back (``fast_set``).
        """
        self._forget_dropped()
        busy = {r.set for r in self.inflight}
        busy.add(self.fast_set)
        skip = len(self.queue)
        for j in range(n_sets):
            s = (self.next_set + j) % n_sets
            if s in busy or s in self.reserved:
                continue
            if skip:
                skip -= 1
                continue
            self.reserved[s] = Reservation(s, {}, 0)
            if self.fast_set == s:  # a synchronous call took it meanwhile
                del self.reserved[s]
                return None
            return s
        return None

    def hand_out(self, s: int, views: Mapping[str, np.ndarray]) -> None:
        """Set ``s``'s reservation covers ``views``; dropping them all unused gives it back."""
        live = [v for v in views.values() if v.nbytes]
        token = Reservation(s, {name: _address(v) for name, v in views.items() if v.nbytes},
                            len(live))
        with self.mu:
            if s in self.reserved:
                self.reserved[s] = token
        for v in live:
            weakref.finalize(v, _view_dropped, token, self._dropped)
        if not live:
            self._dropped.append(token)  # nothing to recognise it by: not held

    def _forget_dropped(self) -> None:
        """Give back the sets whose views all died unused (``mu`` held)."""
        while self._dropped:
            token = self._dropped.popleft()
            if self.reserved.get(token.set) is token:
                del self.reserved[token.set]

    def _token_of(self, feeds: Mapping[str, Any]) -> Reservation | None:
        """The reservation whose views ``feeds`` carries (``mu`` held)."""
        for token in self.reserved.values():
            if token.carried_by(feeds):
                return token
        return None

    def _may_take(self, s: int, feeds: Mapping[str, Any]) -> bool:
        """A synchronous call may be published in set ``s`` (reservations exist).

        Yes when ``s`` is not reserved and the call carries no reserved views, or when it
        carries ``s``'s own (then taken). A call carrying another set's views is not
        published in ``s`` (its inputs go inline) and gives that set back.
        """
        with self.mu:
            token = self._token_of(feeds)
            owner = self.reserved.get(s)
            if token is not None:
                del self.reserved[token.set]
                self._notify_freed()
            return owner is token

    def _blocked(self, req: _Req) -> bool:
        """``req`` may not be published in ``next_set`` (``mu`` held).

        Another caller reserved that set, or ``req`` carries a reserved set that is not next.
        """
        owner = self.reserved.get(self.next_set)
        token = req.token
        if token is not None and self.reserved.get(token.set) is not token:
            token = req.token = None  # given back (cannot happen while it holds the views)
        return (owner is not None and owner is not token) \
            or (token is not None and token.set != self.next_set)

    def _give_back(self, req: _Req) -> None:
        """``req`` leaves the queue: its reserved set, if any, is free (``mu`` held)."""
        token = req.token
        if token is not None:
            req.token = None
            if self.reserved.get(token.set) is token:
                del self.reserved[token.set]
                self._notify_freed()

    def _notify_freed(self) -> None:
        """Wake the threads waiting in ``input_slots`` (``mu`` held)."""
        if self.slot_waiters:
            self.freed.notify_all()

    def close(self, why: BaseException) -> None:
        """Fail everything still queued or in flight with ``why``; stop the pump."""
        with self.mu:
            self.closed = True
            pending = list(self.inflight) + list(self.queue)
            self.inflight.clear()
            self.queue.clear()
            self.reserved.clear()
            self.work.notify_all()
            self.freed.notify_all()
        for req in pending:
            self._fail(req, why)
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"\0")

    def release(self) -> None:
        """Join the pump thread and close the wake-up pair (after ``close``)."""
        pump = self._pump
        if pump is not None and pump is not threading.current_thread():
            pump.join(timeout=10)
        if self._wake is not None:
            for sock in self._wake:
                sock.close()
            self._wake = None

    # ------------------------------------------------------------------ the pump
    def _kick(self) -> None:
        """Make sure the pump collects what is queued or in flight."""
        with self.mu:
            if self.closed or (not self.queue and not self.inflight):
                return
            if self._pump is None:
                self._wake = socket.socketpair()
                for sock in self._wake:
                    sock.setblocking(False)
                self._pump = threading.Thread(target=self._pump_loop, daemon=True,
                                              name=f"xstage-pump-{self.client.route}")
                self._pump.start()
            elif self._pump_waiting and self._wake is not None:
                with contextlib.suppress(OSError):
                    self._wake[1].send(b"\0")
            self.work.notify()

    def _pump_loop(self) -> None:
        c = self.client
        while True:
            with self.work:
                while not self.closed and not self.queue and not self.inflight:
                    self.work.wait()
                if self.closed:
                    return
            with c._lock:
                if self.closed:
                    return
                try:
                    self._drive(lambda: not self.queue and not self.inflight, pump=True)
                except errors.XstageError:
                    pass  # the requests were failed with it
                except Exception as exc:  # a bug: every waiter sees it rather than hanging
                    self._fail_all(exc)
                    raise

    # ------------------------------------------------------------------ driving
    def _drive(self, until: Callable[[], bool], *, pump: bool = False,
               publish: bool = True) -> None:
        """Publish and collect until ``until()`` (the client's lock held)."""
        c = self.client
        while True:
            if publish:
                self._publish()
            if until():
                return
            if not self.inflight:
                if not self.queue:
                    return
                continue
            if c._region is None or c._bell is None:
                self._fail_all(errors.StageClosed(f"the {c.route} worker is {c.state.value}"))
                return
            try:
                self._wait_head(pump)
            except (errors.XstageError, errors.StageClosed) as exc:
                self._fail_all(exc)
                if c._close_requested or c._closed_why is not None or c._region is None:
                    return

    def _wait_head(self, pump: bool) -> None:
        c = self.client
        region, bell = c._region, c._bell
        assert region is not None and bell is not None and c._ctl is not None
        head = self.inflight[0]
        deadline = self._earliest_deadline()
        watch: list[Any] = [c._ctl]
        if pump and self._wake is not None:
            watch.append(self._wake[0])
            with self.mu:  # checked and flagged under the lock ``submit`` queues under
                if self._can_publish(region):
                    return
                self._pump_waiting = True
        s, rid = head.set, head.rid
        try:
            # The pump blocks (it waits beside the threads that submit); a caller waiting in
            # its own thread lets the doorbell's policy decide.
            state = bell.wait(lambda: region.resp_id(s) == rid, deadline, watch=watch,
                              spin=0.0 if pump else None, expected=c._expected_s)
        finally:
            self._pump_waiting = False
        if state == "ready":
            self._collect(head, None)
        elif state == "timeout":
            self._expire()
        elif state == "closed":
            if region.resp_id(s) == rid:
                self._collect(head, None)
            elif c._close_requested:
                raise c._closed_under_call()
            else:
                raise c._died()
        else:  # "watch": a frame ahead of the head's response, or a wake-up
            if self._wake is not None:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    self._wake[0].recv(4096)
            readable, _, _ = select.select([c._ctl], [], [], 0)
            if readable and region.resp_id(s) != rid:
                if c._close_requested:
                    raise c._closed_under_call()
                frame = c._recv(head.phase, head.seconds)
                if region.resp_id(s) != rid:
                    bell.wait(lambda: region.resp_id(s) == rid, head.deadline, spin=0)
                self._collect(head, frame)

    def _can_publish(self, region: shm.Region) -> bool:
        """The queue's head could be published now (``mu`` held)."""
        if not self.queue:
            return False
        req = self.queue[0]
        if req.deadline is not None and req.deadline <= time.monotonic():
            return True
        return len(self.inflight) < region.n_sets and self._fits(region, req.feeds) \
            and not (self.reserved and self._blocked(req))

    def _earliest_deadline(self) -> float | None:
        times = [r.deadline for r in self.inflight if r.deadline is not None and not r.discard]
        times += [r.deadline for r in self.queue if r.deadline is not None]
        return min(times) if times else None

    def _expire(self) -> None:
        """Deadlines that passed: withdraw requests not started; kill for one that has."""
        c = self.client
        region = c._region
        assert region is not None
        now = time.monotonic()
        with self.mu:
            late = [r for r in self.queue if r.deadline is not None and r.deadline <= now]
            for r in late:
                self.queue.remove(r)
                self._give_back(r)
        for r in late:
            self._fail(r, errors.CallTimeout(r.seconds or 0, pid=c.pid))
        for r in list(self.inflight):
            if r.discard or r.deadline is None or r.deadline > now:
                continue
            if not self.stateful and region.withdraw(r.rid, r.set):
                r.discard = True
                self._fail(r, errors.CallTimeout(r.seconds or 0, pid=c.pid))
                continue
            # It started: its state is unknown, the worker goes.
            pid, tail = c.pid, c.log_tail()
            timeout = errors.CallTimeout(r.seconds or 0, pid=pid, log_tail=tail)
            c._abort()
            with self.mu:
                self.inflight.remove(r)
                self._notify_freed()
            self._fail(r, timeout)
            raise c._death_of(f"killed after request #{r.rid}'s call deadline of "
                              f"{r.seconds or 0:g} s passed", exit_status=None, log_tail=tail)

    # ------------------------------------------------------------------ publish, collect
    @staticmethod
    def _fits(region: shm.Region, feeds: Mapping[str, np.ndarray]) -> bool:
        for name, arr in feeds.items():
            cap = region.capacity("in", name)
            if cap is None or arr.nbytes > cap:
                return False
        return True

    def _write_inputs(self, region: shm.Region, feeds: Mapping[str, Any], s: int) -> int | None:
        """Set ``s``'s inputs into the region, or into the device slots; the flags to publish.

        Device tensors (``device_slots.py``) go to the worker's device slots of set ``s``. None
        when a host input has no slot or does not fit it (``Region.write`` checks).
        """
        if self.device is not None and self.device.holds(s, feeds):
            return self.device.write(feeds, s)
        for name, arr in feeds.items():
            if not region.write("in", name, arr, s):
                return None
        return 0

    def _publish(self) -> None:
        """Queued requests into free sets, in order (the client's lock held)."""
        c = self.client
        while True:
            busy: BaseException | None = None
            with self.mu:
                if not self.queue:
                    return
                req = self.queue[0]
                inline = False
                if req.deadline is not None and req.deadline <= time.monotonic():
                    busy = errors.CallTimeout(req.seconds or 0, pid=c.pid)
                else:
                    region = c._region
                    blocked = bool(self.reserved) and self._blocked(req)
                    if blocked and self._device_feeds(req.feeds):
                        # Device tensors cannot go inline around a reserved set: another
                        # caller's set next fails the request (in order); views of another
                        # set of its own are copied into this one.
                        blocked = False
                        owner = self.reserved.get(self.next_set)
                        if owner is not None and owner is not req.token:
                            if self.inflight:
                                return
                            busy = self._device_busy(self.next_set)
                    inline = region is None or not self._fits(region, req.feeds) or blocked
                    if busy is None and inline and self.inflight:
                        return  # the inline call follows the region's calls in order
                    if busy is None and not inline:
                        assert region is not None
                        if len(self.inflight) >= region.n_sets:
                            return
                        req.set = self.next_set
                        req.rid = c._take_id()
                        self.next_set = (self.next_set + 1) % region.n_sets
                        self.inflight.append(req)
                self.queue.popleft()
                if req.token is not None:  # published in its set (``inflight`` holds it now),
                    self._give_back(req)  # gone inline, or failed: the reservation is over
            if busy is not None:
                self._fail(req, busy)
            elif inline:
                self._run_inline(req)
            else:
                self._publish_one(req)

    def _device_feeds(self, feeds: Mapping[str, Any]) -> bool:
        """Whether a request's inputs are device tensors (``device_tensors=on``)."""
        return self.device is not None and bool(feeds) \
            and device_slots.is_cuda_tensor(next(iter(feeds.values())))

    def _device_busy(self, s: int) -> errors.SlotsBusy:
        """A device call finds set ``s`` (next) reserved by another ``device_inputs()``."""
        return errors.SlotsBusy(
            f"slot set {s}, the next one, is reserved by a device_inputs() call whose tensors "
            "have not been called with yet; device tensors cannot go around it inline",
            remedy="call the stage with the tensors device_inputs() gave (or drop them) "
            "before calling with tensors of your own")

    def _publish_one(self, req: _Req) -> None:
        c = self.client
        region, bell = c._region, c._bell
        assert region is not None and bell is not None
        try:
            t0 = time.perf_counter_ns()
            written = self._write_inputs(region, req.feeds, req.set)
            if written is None:  # _fits said it would: the region changed under the request
                raise errors.RemoteProtocolError("an input no longer fits its region slot")
            req.flags |= written
            req.timing["copy_in_ns"] = time.perf_counter_ns() - t0
        except BaseException:
            with self.mu:
                self.inflight.remove(req)
                self.next_set = req.set
                self._notify_freed()
            raise
        with self.mu:
            if req.discard:  # cancelled while its inputs were written: never published
                self.inflight.remove(req)
                self.next_set = req.set
                self._notify_freed()
                return
            region.publish_request(req.rid, req.set, req.flags)
            req.published = True
        if req.future is not None:
            req.future.request_id = req.rid
            req.future.generation = c.generation
        bell.ring()

    def _run_inline(self, req: _Req) -> None:
        """A request whose inputs have no slot (or do not fit): one frame each way."""
        c = self.client
        try:
            header: dict[str, Any] = {"op": "run"}
            if req.flags & shm.FLAG_RESET_STATE:
                header["options"] = {"reset_state": True}
            frame = c._request(header, "result", req.phase, arrays=req.feeds)
            c.last_timing = dict(frame.header.get("timing", {}))
            req.rid = frame.id
            result = c._collect(frame.arrays(), req.out)
            result.state_reset = bool(c.last_timing.get("state_reset"))
            self._resolve(req, result, dict(c.last_timing))
        except errors.WorkerRaised as exc:
            self._fail(req, exc)
        except (errors.XstageError, errors.StageClosed) as exc:
            self._fail(req, exc)
            self._fail_all(exc)

    def _collect(self, req: _Req, frame: wire.Frame | None) -> None:
        """The head request's answer: outputs copied out, or its error (the lock held)."""
        c = self.client
        region = c._region
        assert region is not None
        with self.mu:
            self.inflight.popleft()
            if self.slot_waiters:
                self.freed.notify_all()
        s, rid = req.set, req.rid
        if not region.answered(rid, s):
            c._abort()
            raise errors.RemoteProtocolError(
                f"the region's response #{region.resp_id(s)} carries gen {region.resp_gen(s)}, "
                f"expected #{rid} of generation {c.generation}")
        status, worker_ns, rss, peak, published, start, end, answer, _ = region.answer(s)
        timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak, **req.timing,
                  "published_ns": published, "start_ns": start, "end_ns": end}
        if req.uncertain and status == shm.STATUS_CANCELLED:
            c._state_settled(req)  # withdrawn before it started: the state never moved
        if status == shm.STATUS_CANCELLED:
            return  # withdrawn: its waiter was told when it was withdrawn
        c._expected_s = 0.7 * c._expected_s + 0.3 * worker_ns / 1e9
        if status == shm.STATUS_OK:
            result = Outputs()
            result.state_reset = bool(answer & shm.FLAG_STATE_RESET)
            t0 = time.perf_counter_ns()
            if not req.discard:
                self._read_outputs(region, s, req.out, result)
            timing["copy_out_ns"] = time.perf_counter_ns() - t0
            c.last_timing = timing
            self._resolve(req, result, timing)
            return
        if frame is None:
            frame = c._recv(req.phase, req.seconds)
        try:
            frame = c._expect(frame, "result", rid)
        except errors.WorkerRaised as exc:
            self._fail(req, exc)
            return
        c.last_timing = {**dict(frame.header.get("timing", {})), "published_ns": published,
                         "start_ns": start, "end_ns": end}
        inline = c._collect(frame.arrays(), req.out)
        inline.state_reset = bool(answer & shm.FLAG_STATE_RESET)
        self._resolve(req, inline, c.last_timing)

    # ------------------------------------------------------------------ outcomes
    def _resolve(self, req: _Req, result: dict[str, np.ndarray], timing: dict[str, int]) -> None:
        req.timing = timing
        if req.discard or req.done:
            req.done = True
            return
        req.done = True
        req.result = result
        if req.future is not None:
            req.future.timing = timing
            req.future.state_reset = bool(getattr(result, "state_reset", False))
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                req.future.set_result(result)

    def _fail(self, req: _Req, exc: BaseException) -> None:
        """``req`` ends with ``exc`` (a withdrawn one stays in flight until its set is answered)."""
        if req.done:
            return
        req.done = True
        req.error = exc
        if req.future is not None and not req.future.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                req.future.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        """The worker is gone: every request in flight fails; the queue goes to ``on_death``."""
        c = self.client
        with self.mu:
            inflight = list(self.inflight)
            self.inflight.clear()
            # A synchronous caller drives its own request: it hears of the death itself.
            inflight += [r for r in self.queue if r.future is None]
            queued = [r for r in self.queue if r.future is not None]
            self.queue.clear()
            self.reserved.clear()
            self._notify_freed()
        gen_exc: BaseException = exc
        if isinstance(exc, errors.CallTimeout):
            gen_exc = c._death_of("killed after a request's call deadline passed",
                                  exit_status=None, log_tail=exc.log_tail)
        for req in inflight:
            self._fail(req, gen_exc if req.error is None else req.error)
        if queued and not (self.on_death is not None and self.on_death(queued, exc)):
            for req in queued:
                self._fail(req, gen_exc)

    def _uncertain(self, req: _Req, region: shm.Region) -> None:
        """An interrupted request of a stage with state: withdrawn if it has not started.

        Until its answer says it never ran (``STATUS_CANCELLED``), the state the next call
        would run on is unknown (``WorkerClient._state_uncertain``); a withdraw that loses the
        race with the worker's take leaves an answer that says it ran.
        """
        req.uncertain = True
        self.client._state_uncertain = req
        with contextlib.suppress(ValueError):  # a region closed under us: the worker is gone
            region.withdraw(req.rid, req.set)

    def _abandon(self, req: _Req) -> None:
        """The sync caller left (an interrupt): its request, if published, is discarded."""
        with self.mu:
            req.discard = True
            region = self.client._region
            if self.stateful and req.published and not req.done and region is not None:
                self._uncertain(req, region)
            if req in self.queue:
                self.queue.remove(req)
                self._give_back(req)
