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
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors
from xstage.client import device_slots
from xstage.client.host import CallHost
from xstage.client.outputs import USE_DEADLINE, Outputs
from xstage.client.region import SharedRegion, heads_up_default
from xstage.client.requests import EarlyFrames, Request, Reservation, Reservations, StageFuture, snapshot
from xstage_remote import shm, wire

if TYPE_CHECKING:
    from xstage.client.device_slots import DeviceSlots

__all__ = ["USE_DEADLINE", "Outputs", "Pipeline", "Reservation", "StageFuture"]


class Pipeline:
    """The requests of one worker client: queue, in-flight sets, the pump thread.

    Every method that drives (``call``, ``drain``, the pump) runs with the client's lock held;
    ``submit`` and ``cancel`` only take the pipeline's own short lock.
    """

    def __init__(self, client: CallHost) -> None:
        self.client = client
        self.mu = threading.Lock()
        self.work = threading.Condition(self.mu)
        self.queue: deque[Request] = deque()
        self.inflight: deque[Request] = deque()
        self.next_set = 0
        self.closed = False
        #: Whether the stage keeps state in the worker: published requests are not withdrawn.
        self.stateful = False
        self._pump: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._pump_waiting = False
        self.on_death: Callable[[list[Request], BaseException], bool] | None = None
        #: The worker's device slots (torch-cuda ``device_tensors=on``), else None.
        self.device: DeviceSlots | None = None
        #: The last fast call's copy of its inputs into the region (ns): a long one is
        #: announced to a sleeping worker before the next (``shm.Doorbell.heads_up``).
        self._copy_in_ns = 0
        #: A copy in at least this long (ns) is announced; 0: never (``region.heads_up_default``).
        self.heads_up_ns = heads_up_default(client.tuning.heads_up_seconds)
        #: Slot sets handed out by ``input_slots`` and not yet taken, by set (``mu`` held).
        self.reserved = Reservations()
        #: The set a synchronous call in this thread's fast way is using, else -1: not in
        #: ``inflight``, so ``reserve`` reads it (written before the call reads ``reserved``,
        #: read after ``reserve`` writes it: one of the two sees the other).
        self.fast_set = -1
        #: Threads waiting in ``input_slots`` for a set to come free, and their condition.
        self.slot_waiters = 0
        self.freed = threading.Condition(self.mu)
        self.early = EarlyFrames()  # frames of requests answered ahead of the head

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
        flags = c.take_reset() if c.reset_next else 0  # its frame only after reset_state()
        if not self.queue and not self.inflight:
            region = c.link.region
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
            return c.call_inline(feeds, out, phase, flags)  # one frame each way, no queue
        req = Request(feeds, None, seconds, phase, out)
        req.flags = flags
        with self.mu:
            if self.reserved:
                req.token = self.reserved.token_of(feeds)
            self.queue.append(req)
        try:
            self._drive(lambda: req.done)
        except BaseException:
            self._abandon(req)
            raise
        finally:
            self.kick()
        if req.error is not None:
            raise req.error
        if req.result is None:  # cannot happen: every way out of _drive resolves it
            raise errors.StageClosed(f"the {c.route} worker is {c.state.value}")
        return req.result

    def _read_outputs(self, region: shm.Region, s: int, out: Mapping[str, np.ndarray],
                      result: dict[str, np.ndarray], views: bool = False) -> None:
        """Set ``s``'s outputs into ``result``, each descriptor checked before its copy.

        A name the caller gave an ``out`` array for is copied into it; with ``views``, the
        others are read-only views of their slots (no copy) (``SharedRegion.read_outputs``).
        """
        try:
            self.client.link.read_outputs(region, s, out, result, views, self.device)
        except wire.ProtocolError as exc:
            raise self._garbled(exc) from exc

    def _garbled(self, exc: wire.ProtocolError) -> errors.RemoteProtocolError:
        """A descriptor the worker wrote was out of its slot's bounds: the worker is ended."""
        c = self.client
        c.abort()
        return errors.RemoteProtocolError(f"worker {c.pid}: {exc}")

    def _call_fast(self, region: shm.Region, feeds: Mapping[str, np.ndarray],
                   out: Mapping[str, np.ndarray], phase: str,
                   seconds: float | None, flags: int,
                   views: bool = False) -> dict[str, np.ndarray] | None:
        """Nothing queued or in flight: publish in the next set and wait, in this thread.

        None (nothing published) when an input has no slot or does not fit its slot: the
        call then goes the queue's way, inline.
        """
        c = self.client
        link = c.link
        bell, ctl = link.bell, link.ctl
        assert bell is not None and ctl is not None
        s = self.next_set
        if self.reserved and not self._may_take(s, feeds):
            if not device_slots.carried(self.device, feeds):
                return None  # another caller's reserved set, or views of a set not next: inline
            if s in self.reserved:  # device tensors cannot go inline around it
                raise device_slots.busy(s)
        if self._copy_in_ns >= self.heads_up_ns > 0:  # wake the worker during the copy
            bell.heads_up(time.monotonic_ns() + self._copy_in_ns)
        t0 = time.perf_counter_ns()
        written = link.write_inputs(region, feeds, s, self.device)
        if written is None:  # an input has no slot or does not fit it: the inline way
            return None
        flags |= written
        copy_in = self._copy_in_ns = time.perf_counter_ns() - t0
        rid = c.take_id()  # a fresh id per call: a stale response can never match it
        try:
            # An interrupt from here on finds the request published or not by its id in the
            # set (``req_id``), never by where in these lines it landed.
            region.publish_request(rid, s, flags)
            self.next_set = (s + 1) % region.n_sets
            bell.ring(expected=link.expected_s)  # decides the wait below (shm.Doorbell.ring)
            deadline = None if seconds is None else time.monotonic() + seconds
            # The doorbell's policy spins only where it can pay (shm.py, waitpolicy.py): told
            # the worker's recent compute, it blocks for calls expected to be long.
            # The spin checks the id alone (one read); the generation is checked once, after.
            answered = region.answer_check(rid, s)
            state = bell.wait(answered, deadline, watch=(ctl,), expected=link.expected_s)
            frame = None
            if state == "timeout":
                c.call_timeout(phase, seconds)
            if state in ("closed", "watch") and region.resp_id(s) != rid:
                # The worker either died or sent a frame ahead of its response (error, inline).
                if c.close_requested:
                    raise c.closed_under_call()
                frame = c.recv(phase, seconds)
                if region.resp_id(s) != rid:
                    bell.wait(answered, deadline, spin=0)
        except BaseException as exc:
            if not isinstance(exc, (errors.XstageError, errors.StageClosed)) \
                    and c.link.region is region and region.req_id(s) == rid:
                self.next_set = (s + 1) % region.n_sets
                req = Request(feeds, None, None, phase)
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
                link.expected_s = 0.7 * link.expected_s + 0.3 * worker_ns / 1e9
                t0 = time.perf_counter_ns()
                result = Outputs()
                if answer & shm.FLAG_STATE_RESET:
                    result.state_reset = True
                try:  # ``_read_outputs`` without its frame (the common call)
                    link.read_outputs(region, s, out, result, views, self.device)
                except wire.ProtocolError as exc:
                    raise self._garbled(exc) from exc
                c.last_timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak,
                                 "copy_in_ns": copy_in,
                                 "copy_out_ns": time.perf_counter_ns() - t0,
                                 "published_ns": published, "start_ns": start, "end_ns": end}
                return result
        req = Request(feeds, None, None, phase, out)
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
        req = Request(feeds, None, seconds, "call")
        future = req.future = StageFuture(req)
        req.pipeline = self
        c = self.client
        # Nobody drives: publish in this thread. Whoever drives publishes only with the
        # client's lock held, so while this thread holds it no one reads ``req.feeds`` but it.
        driving = c.lock.acquire(blocking=False)
        try:
            with self.mu:
                if self.closed:
                    raise errors.StageClosed("the stage is closed")
                req.flags = c.take_reset()
                if self.reserved:
                    req.token = self.reserved.token_of(feeds)
                if not driving and req.token is None:
                    req.feeds = snapshot(feeds)  # a driver may publish it any time from now
                self.queue.append(req)
            if driving:
                try:
                    if c.link.region is not None and not c.closed_why:
                        self._publish()
                except errors.XstageError:
                    pass  # the pump meets the same failure and fails the requests with it
                with self.mu:
                    if req.token is None and req in self.queue:  # not published: queued
                        req.feeds = snapshot(feeds)
        finally:
            if driving:
                c.lock.release()
        self.kick()
        return future

    def withdraw(self, req: Request, cancelled: Callable[[], bool]) -> bool:
        """``StageFuture.cancel``: withdraw a queued request, or a published one not started.

        ``cancelled`` (the future's own cancel) runs under the pipeline's lock once the request
        will never run; its answer is the result.
        """
        with self.mu:
            if req.done or req.discard:
                return False
            if req in self.queue:
                self.queue.remove(req)
                self._give_back(req)
                req.discard = True
                req.done = True
                return cancelled()
            if req not in self.inflight or self.stateful:
                return False
            if not req.published:  # the driver is writing its inputs: it will not publish it
                req.discard = True
                return cancelled()
            try:
                withdrawn = self.client.link.cancel(req.rid, req.set)
            except ValueError:  # the region was closed under us: the worker is gone
                return False
            if not withdrawn:
                return False
            req.discard = True  # its set comes free when the worker answers "cancelled"
            return cancelled()

    def drain(self) -> None:
        """Collect every published request (the client's lock held): frames may follow."""
        if self.inflight:
            self._drive(lambda: not self.inflight, publish=False)

    def take_queued(self) -> list[Request]:
        """Hand over the submitted requests not yet published (a restarted stage serves them)."""
        with self.mu:
            queued = [r for r in self.queue if r.future is not None]
            for req in queued:
                self.queue.remove(req)
        return queued

    def adopt(self, reqs: list[Request]) -> None:
        """Serve requests queued for a worker that died, ahead of any later ones, in order."""
        if not reqs:
            return
        with self.mu:
            for req in reqs:
                req.rid, req.set, req.published = 0, -1, False
                req.token = None  # a set of the dead worker's region
                req.pipeline = self
            self.queue.extendleft(reversed(reqs))
        self.kick()

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
        self.reserved.forget_dropped()
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

    def hand_out(self, s: int, views: Mapping[str, Any]) -> None:
        """Set ``s``'s reservation covers ``views``; dropping them all unused gives it back."""
        self.reserved.hand_out(s, views, self.mu)

    def _may_take(self, s: int, feeds: Mapping[str, Any]) -> bool:
        """A synchronous call may be published in set ``s`` (reservations exist).

        Yes when ``s`` is not reserved and the call carries no reserved views, or when it
        carries ``s``'s own (then taken). A call carrying another set's views is not
        published in ``s`` (its inputs go inline) and gives that set back.
        """
        with self.mu:
            token = self.reserved.token_of(feeds)
            owner = self.reserved.get(s)
            if token is not None:
                del self.reserved[token.set]
                self._notify_freed()
            return owner is token

    def _give_back(self, req: Request) -> None:
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
    def kick(self) -> None:
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
            with c.lock:
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
            if c.link.region is None or c.link.bell is None:
                self._fail_all(errors.StageClosed(f"the {c.route} worker is {c.state.value}"))
                return
            try:
                self._wait_head(pump)
            except (errors.XstageError, errors.StageClosed) as exc:
                self._fail_all(exc)
                if c.close_requested or c.closed_why is not None or c.link.region is None:
                    return

    def _wait_head(self, pump: bool) -> None:
        c = self.client
        region, bell = c.link.region, c.link.bell
        assert region is not None and bell is not None and c.link.ctl is not None
        head = self.inflight[0]
        deadline = self._earliest_deadline()
        watch: list[Any] = [c.link.ctl]
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
                              spin=0.0 if pump else None, expected=c.link.expected_s)
        finally:
            self._pump_waiting = False
        if state == "ready":
            self._collect(head, None)
        elif state == "timeout":
            self._expire()
        elif state == "closed":
            if region.resp_id(s) == rid:
                self._collect(head, None)
            elif c.close_requested:
                raise c.closed_under_call()
            else:
                raise c.died()
        else:  # "watch": a frame ahead of the head's response, or a wake-up
            if self._wake is not None:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    self._wake[0].recv(4096)
            readable, _, _ = select.select([c.link.ctl], [], [], 0)
            if readable and region.resp_id(s) != rid:
                if c.close_requested:
                    raise c.closed_under_call()
                frame = c.recv(head.phase, head.seconds)
                if frame.id != rid and self.early.keep(frame, self.inflight):
                    return  # another request's answer, finished first (concurrent runs)
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
        return len(self.inflight) < region.n_sets and SharedRegion.fits(region, req.feeds) \
            and not (self.reserved and self.reserved.blocked(req, self.next_set))

    def _earliest_deadline(self) -> float | None:
        times = [r.deadline for r in self.inflight if r.deadline is not None and not r.discard]
        times += [r.deadline for r in self.queue if r.deadline is not None]
        return min(times) if times else None

    def _expire(self) -> None:
        """Deadlines that passed: withdraw requests not started; kill for one that has."""
        c = self.client
        region = c.link.region
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
            c.abort()
            with self.mu:
                self.inflight.remove(r)
                self._notify_freed()
            self._fail(r, timeout)
            raise c.death_of(f"killed after request #{r.rid}'s call deadline of "
                              f"{r.seconds or 0:g} s passed", exit_status=None, log_tail=tail)

    # ------------------------------------------------------------------ publish, collect
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
                    region = c.link.region
                    blocked = bool(self.reserved) and self.reserved.blocked(req, self.next_set)
                    if blocked and device_slots.carried(self.device, req.feeds):
                        # Device tensors cannot go inline around a reserved set: another
                        # caller's set next fails the request (in order); views of another
                        # set of its own are copied into this one.
                        blocked = False
                        owner = self.reserved.get(self.next_set)
                        if owner is not None and owner is not req.token:
                            if self.inflight:
                                return
                            busy = device_slots.busy(self.next_set)
                    inline = region is None or not SharedRegion.fits(region, req.feeds) or blocked
                    if busy is None and inline and self.inflight:
                        return  # the inline call follows the region's calls in order
                    if busy is None and not inline:
                        assert region is not None
                        if len(self.inflight) >= region.n_sets:
                            return
                        req.set = self.next_set
                        req.rid = c.take_id()
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

    def _publish_one(self, req: Request) -> None:
        c = self.client
        region, bell = c.link.region, c.link.bell
        assert region is not None and bell is not None
        try:
            t0 = time.perf_counter_ns()
            written = c.link.write_inputs(region, req.feeds, req.set, self.device)
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

    def _run_inline(self, req: Request) -> None:
        """A request whose inputs have no slot (or do not fit): one frame each way."""
        c = self.client
        try:
            header: dict[str, Any] = {"op": "run"}
            if req.flags & shm.FLAG_RESET_STATE:
                header["options"] = {"reset_state": True}
            frame = c.request(header, "result", req.phase, arrays=req.feeds)
            c.last_timing = dict(frame.header.get("timing", {}))
            req.rid = frame.id
            result = c.link.collect(frame.arrays(), req.out)
            result.state_reset = bool(c.last_timing.get("state_reset"))
            self._resolve(req, result, dict(c.last_timing))
        except errors.WorkerRaised as exc:
            self._fail(req, exc)
        except (errors.XstageError, errors.StageClosed) as exc:
            self._fail(req, exc)
            self._fail_all(exc)

    def _collect(self, req: Request, frame: wire.Frame | None) -> None:
        """The head request's answer: outputs copied out, or its error (the lock held)."""
        c = self.client
        region = c.link.region
        assert region is not None
        with self.mu:
            self.inflight.popleft()
            if self.slot_waiters:
                self.freed.notify_all()
        s, rid = req.set, req.rid
        if not region.answered(rid, s):
            c.abort()
            raise errors.RemoteProtocolError(
                f"the region's response #{region.resp_id(s)} carries gen {region.resp_gen(s)}, "
                f"expected #{rid} of generation {c.generation}")
        status, worker_ns, rss, peak, published, start, end, answer, _ = region.answer(s)
        timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak, **req.timing,
                  "published_ns": published, "start_ns": start, "end_ns": end}
        if req.uncertain and status == shm.STATUS_CANCELLED:
            c.state_settled(req)  # withdrawn before it started: the state never moved
        if status == shm.STATUS_CANCELLED:
            return  # withdrawn: its waiter was told when it was withdrawn
        c.link.expected_s = 0.7 * c.link.expected_s + 0.3 * worker_ns / 1e9
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
            frame = self.early.read(c.recv, req, self.inflight)
        try:
            frame = c.expect(frame, "result", rid)
        except errors.WorkerRaised as exc:
            self._fail(req, exc)
            return
        c.last_timing = {**dict(frame.header.get("timing", {})), "published_ns": published,
                         "start_ns": start, "end_ns": end}
        inline = c.link.collect(frame.arrays(), req.out)
        inline.state_reset = bool(answer & shm.FLAG_STATE_RESET)
        self._resolve(req, inline, c.last_timing)

    # ------------------------------------------------------------------ outcomes
    def _resolve(self, req: Request, result: dict[str, np.ndarray], timing: dict[str, int]) -> None:
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

    def _fail(self, req: Request, exc: BaseException) -> None:
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
            self.early.clear()
            self._notify_freed()
        gen_exc: BaseException = exc
        if isinstance(exc, errors.CallTimeout):
            gen_exc = c.death_of("killed after a request's call deadline passed",
                                  exit_status=None, log_tail=exc.log_tail)
        for req in inflight:
            self._fail(req, gen_exc if req.error is None else req.error)
        if queued and not (self.on_death is not None and self.on_death(queued, exc)):
            for req in queued:
                self._fail(req, gen_exc)

    def _uncertain(self, req: Request, region: shm.Region) -> None:
        """An interrupted request of a stage with state: withdrawn if it has not started.

        Until its answer says it never ran (``STATUS_CANCELLED``), the state the next call
        would run on is unknown (``WorkerClient.state_uncertain``); a withdraw that loses the
        race with the worker's take leaves an answer that says it ran.
        """
        req.uncertain = True
        self.client.state_uncertain = req
        with contextlib.suppress(ValueError):  # a region closed under us: the worker is gone
            region.withdraw(req.rid, req.set)

    def _abandon(self, req: Request) -> None:
        """The sync caller left (an interrupt): its request, if published, is discarded."""
        with self.mu:
            req.discard = True
            region = self.client.link.region
            if self.stateful and req.published and not req.done and region is not None:
                self._uncertain(req, region)
            if req in self.queue:
                self.queue.remove(req)
                self._give_back(req)
