"""The call API of a worker client: ``run``, ``submit``, the slots, the state.

``Calls`` is ``WorkerClient``'s half that calls the loaded stage (``client/worker.py`` keeps the
lifecycle: spawn, hello, load, close, liveness). A call checks its inputs once per signature and
goes the shortest way its transport allows (``client/transport.py``): the lean socket call (the
signature's kept frame, no queue), the region's synchronous way (``Pipeline.call``), or the
queue (``submit``, ``client/pipeline.py``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from xstage import errors
from xstage.client import device_slots
from xstage.client.outputs import USE_DEADLINE, Outputs
from xstage.client.process import WorkerState, checked_settings
from xstage.client.region import SharedRegion
from xstage.client.requests import StageFuture
from xstage.signature import check_inputs, not_a_mapping, wire_order
from xstage_remote import shm, wire

__all__ = ["Calls"]

#: The ``out`` of a call that gave none (read only: nothing is ever added to it).
_NO_OUT: Mapping[str, np.ndarray] = MappingProxyType({})


def _check_timeout(call: str, timeout: float | None) -> None:
    """A slot wait's ``timeout``: seconds >= 0, or None to wait without limit."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not timeout >= 0):
        raise errors.UsageError(f"{call}(timeout={timeout!r}) is not a number of "
                                "seconds >= 0", remedy="give seconds, or None to wait")


class Calls:
    """The call API ``WorkerClient`` inherits; every attribute it reads is the client's."""

    # The client's (``WorkerClient.__init__``), named for the type checker.
    pipeline: Any
    _accepted: set[tuple[Any, ...]]
    _known: tuple[tuple[Any, ...], Any] | None
    _next_id: int
    _pending: tuple[str, int] | None

    @property
    def next_id(self) -> int:
        """The id the next request gets: a replacement worker continues its stage's ids."""
        return self._next_id

    def _init_calls(self, first_id: int) -> None:
        """The call API's own state, set by ``WorkerClient.__init__``."""
        self.last_timing: dict[str, int] = {}
        #: The caller's inputs (the loaded signature's, state inputs left out).
        self.inputs: list[dict[str, Any]] = []
        self._accepted = set()  # input signatures checked once (``_check_inputs``)
        #: The region path's last accepted input signature and its region (``_known_for``).
        self._known = None
        self._next_id = first_id  # a replacement worker continues its stage's ids
        #: ``reset_state()`` asked for the next request to run from the initial state
        #: (``take_reset`` hands the flag out once; the pipeline reads this first).
        self.reset_next = False
        #: An interrupted request of a stage with state that may have moved the state
        #: (``Pipeline._uncertain``): calls raise ``StateUncertain`` until ``reset_state()``,
        #: unless its answer says it never ran.
        self.state_uncertain: Any = None
        # The request whose reply has not been read yet: ("frame" | "shm", id). Set once the
        # request is wholly sent, cleared when its reply is read. A call interrupted between
        # the two closes the stage (``_interrupted``); were one left set, the next request
        # would first read and discard that reply (``_repair``).
        self._pending = None

    # ------------------------------------------------------------------ frames
    #: What ``_translate`` turns into an xstage error (anything else passes as it is).
    _LOWER = (wire.PeerClosed, ConnectionError, TimeoutError, wire.ProtocolError)

    def _translate(self, exc: BaseException, phase: str, seconds: float | None) -> BaseException:
        """A lower-layer failure as the most specific xstage error (ends the worker)."""
        if isinstance(exc, (wire.PeerClosed, ConnectionError)):
            if self.close_requested:
                return self.closed_under_call()
            return self.died()
        if isinstance(exc, TimeoutError):
            timeout_cls = {
                "spawn": errors.SpawnTimeout,
                "hello": errors.HelloTimeout,
                "load": errors.LoadTimeout,
                "warmup": errors.WarmupTimeout,
                "call": errors.CallTimeout,
                "shutdown": errors.ShutdownTimeout,
            }[phase]
            tail = self.log_tail()
            pid = self.pid
            self.abort()
            return timeout_cls(seconds or 0, pid=pid, log_tail=tail)
        self.abort()
        return errors.RemoteProtocolError(f"worker {self.pid}: {exc}")

    def closed_under_call(self) -> errors.StageClosed:
        """``StageClosed`` for a call that ``close()`` from another thread ended."""
        self.abort()
        self.closed_why = "close() was called from another thread while this call was in flight"
        return errors.StageClosed(f"the {self.route} worker was closed: {self.closed_why}")

    def _break(self, why: str) -> None:
        """The stream's position is unknown (a frame half sent or half read): end the worker."""
        self.closed_why = why
        self.abort()

    def _send(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None,
              phase: str = "call") -> None:
        """Send one frame within ``phase``'s deadline (a stopped reader cannot hold us).

        The deadline starts here and covers the reply's ``recv`` too (``DeadlineSocket``: the
        kernel's limits, set once per change, instead of a ``poll`` and two ``ioctl`` per
        system call).
        """
        link = self.link
        assert link is not None
        try:
            parts = link.encode(header, arrays, self.generation)
        except wire.ProtocolError as exc:
            raise errors.LocalProtocolError(str(exc)) from exc
        seconds = getattr(self.deadlines, phase)
        link.io.start(seconds)
        try:
            link.send(parts, header["op"] == "run")  # a call's reply may be spun for
        except self._LOWER as exc:
            raise self._translate(exc, phase, seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, OSError):
                self._break(f"a request was interrupted ({type(exc).__name__}) while it was "
                            "being sent; the worker holds part of a frame")
            raise

    def recv(self, phase: str, seconds: float | None, *, fresh: bool = True) -> wire.Frame:
        """Read one frame within ``seconds``.

        ``fresh=False`` goes on with the deadline the request's ``_send`` started (one
        deadline per call). An interrupt (Ctrl-C) inside the read closes the stage at once,
        whether or not a byte of the frame had arrived: a signal handler runs between two
        bytecodes, so bytes taken from the socket may not be counted yet, and the next call
        must never read from the middle of a frame (it raises ``StageClosed`` saying why).
        """
        link = self.link
        if link is None or self._ctl is None:
            raise errors.StageClosed(f"worker is {self.state.value}")
        if fresh:
            link.io.start(seconds)
        else:
            link.io.got = 0
        try:
            return link.recv()  # type: ignore[no-any-return]
        except self._LOWER as exc:
            raise self._translate(exc, phase, seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError)):
                self._interrupted(exc)
            raise

    def _interrupted(self, exc: BaseException) -> None:
        """A call was interrupted between its request and its whole reply: close the stage."""
        if self.closed_why is None and self.state is WorkerState.READY:
            self._break(f"a call was interrupted ({type(exc).__name__}) before its reply was "
                        "read whole; the stream's position is unknown")

    def expect(self, frame: wire.Frame, op: str, rid: int) -> wire.Frame:
        """``frame`` checked as the reply ``op`` to request ``rid``.

        Raises:
            RemoteProtocolError: another frame (the worker is ended).
            WorkerRaised: the worker's ``error`` reply.
        """
        if frame.id != rid or frame.op not in (op, "error"):
            self.abort()
            raise errors.RemoteProtocolError(
                f"expected {op} #{rid}, the worker sent {frame.op} #{frame.id}"
            )
        self._check_generation(frame)
        if frame.op == "error":
            h = frame.header
            raise errors.WorkerRaised(
                f"the {self.route} worker raised {h['kind']}: {h['message']}",
                kind=h["kind"],
                remote_traceback=h.get("traceback", ""),
                pid=self.pid,
            )
        return frame

    def _repair(self) -> None:
        """Read and discard the reply of a call that did not finish.

        A call interrupted after its request was sent leaves its reply unread; reading it
        here makes the next reply read the next request's.
        """
        pending = self._pending
        if pending is None:
            return
        _, rid = pending
        seconds = self.deadlines.call
        frame = self.recv("call", seconds)
        if frame.id != rid:
            self.abort()
            raise errors.RemoteProtocolError(
                f"the reply to interrupted request #{rid} was expected, the worker sent "
                f"{frame.op} #{frame.id}")
        self._check_generation(frame)
        self._pending = None

    def call_timeout(self, phase: str, seconds: float | None) -> None:
        """End the worker and raise the phase's timeout (``WarmupTimeout``, ``CallTimeout``)."""
        pid, tail = self.pid, self.log_tail()
        self.abort()
        timeout_cls = errors.WarmupTimeout if phase == "warmup" else errors.CallTimeout
        raise timeout_cls(seconds or 0, pid=pid, log_tail=tail)

    def request(self, header: dict[str, Any], reply: str, phase: str,
                arrays: Mapping[str, np.ndarray] | None = None) -> wire.Frame:
        """One frame each way (after any region requests in flight), the reply checked."""
        self._require_ready()
        self.pipeline.drain()  # region requests in flight are answered before any frame
        self._repair()
        rid = self.take_id()
        header = dict(header, id=rid)
        self._pending = ("frame", rid)  # before the send: no window where it is sent, unmarked
        try:
            self._send(header, arrays, phase)
        except BaseException as exc:
            self._pending = None  # not sent, or half sent and the worker ended (_break)
            if not isinstance(exc, (OSError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # or sent whole as the interrupt came: it will answer
            raise
        try:
            frame = self.recv(phase, getattr(self.deadlines, phase), fresh=False)
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # before the read began, too: the stage closes
            raise
        self._pending = None
        return self.expect(frame, reply, rid)


    # ------------------------------------------------------------------ calls
    def device_inputs(self, *, timeout: float | None = None) -> dict[str, Any]:
        """A device slot set no request owns, reserved for the call given it, to write in place.

        ``device_tensors=on`` only. CUDA tensors by input name, views of one set's device
        input slots; a call given these tensors copies nothing in this process
        (``device_slots.DeviceSlots.inputs``). The set is reserved as ``input_slots`` reserves
        one: no request is published into it until the call given these tensors takes it;
        while every set is in flight or reserved this waits (at most ``timeout`` seconds).
        Ask again before each call. A device call of tensors of its own made while another
        caller's reserved set is next cannot go around it inline: it raises ``SlotsBusy``.

        Raises:
            UsageError: the stage serves no device tensors, or a ``timeout`` that is not a
                number of seconds >= 0.
            SlotsBusy: no set came free within ``timeout``.
            StageClosed: the worker was closed or died.
        """
        _check_timeout("device_inputs", timeout)
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        device = self.pipeline.device
        if device is None:
            raise errors.UsageError(
                "device_inputs() on a stage opened without device tensors",
                remedy="open a torch-cuda stage with --ep-option device_tensors=on "
                "(open_stage(..., ep_options={'device_tensors': 'on'}))")
        region = self.link.region
        if region is None:
            raise errors.StageClosed(f"the {self.route} worker is {self.state.value}")
        device.open()
        s = self._reserve_set(region, timeout)
        views = device.reserved_inputs(s)  # tensors of their own: see hand_out
        self.pipeline.hand_out(s, views)
        return views

    def input_slots(self, shapes: Mapping[str, Sequence[int]] | None = None, *,
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """A slot set no request owns, reserved for the call given it, to fill in place.

        Writable numpy views (little-endian, C-contiguous) of one set's input slots at each
        input's declared shape, or at ``shapes[name]`` where a dimension is not fixed. The set
        is reserved: no request is published into it until a call (``run`` or ``submit``)
        given these arrays takes it, and that call copies nothing into the region for them.
        While every set is in flight or reserved, this waits for one to come free (at most
        ``timeout`` seconds; None: no limit). Ask again before each call. Slots dropped
        without a call give their set back; a call made meanwhile with arrays of its own goes
        around a set reserved for another (inline, one frame each way).

        Raises:
            UsageError: no shared region (the socket transport, ``shm_mode="off"``), an input
                without a slot, a dimension neither fixed nor given, a shape that does not
                fit its slot, or a ``timeout`` that is not a number of seconds >= 0.
            SlotsBusy: no set came free within ``timeout``.
            StageClosed: the worker was closed or died.
        """
        _check_timeout("input_slots", timeout)
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        region = self.link.region
        if region is None or self.loaded is None:
            raise errors.UsageError(
                "input_slots() on a stage without a shared region",
                remedy="use the default transport with shm_mode 'auto' (the socket "
                "transport and shm_mode='off' copy every call's inputs into frames)")
        wanted = self.link.slot_shapes(shapes)
        s = self._reserve_set(region, timeout)
        views = {name: v.view() for name, v in   # objects of their own: see hand_out
                 region.slot_views("in", wanted, s).items()}
        self.pipeline.hand_out(s, views)
        return views

    def _reserve_set(self, region: shm.Region, timeout: float | None) -> int:
        """A free set of ``region``, reserved; waits while none is (``input_slots``).

        The requests in flight are collected by whoever drives (the pump, started here if
        need be, or a synchronous caller); each set that comes free wakes the waiters.
        """
        pipe = self.pipeline
        deadline = None if timeout is None else time.monotonic() + timeout
        with pipe.mu:
            while True:
                if pipe.closed or self.link.region is not region:
                    raise errors.StageClosed(f"the {self.route} worker is {self.state.value}"
                                             if self.link.region is None else
                                             "the shared region was replaced while waiting "
                                             "for a slot set")
                s = pipe.reserve(region.n_sets)
                if s is not None:
                    return s
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise errors.SlotsBusy(
                        f"no free slot set within {timeout:g} s: all {region.n_sets} slot "
                        f"sets of the {self.route} worker are in flight or reserved",
                        remedy="wait longer (a larger timeout, or None), take fewer slot "
                        "sets before calling with them, or open the stage with a larger "
                        "depth")
                pipe.slot_waiters += 1
                try:
                    pipe.mu.release()
                    try:
                        pipe.kick()  # someone collects what is in flight
                    finally:
                        pipe.mu.acquire()
                    # Woken by each set that comes free; the bound only re-checks a set a
                    # synchronous call let go of between our look and our wait.
                    pipe.freed.wait(0.25 if left is None else min(left, 0.25))
                finally:
                    pipe.slot_waiters -= 1

    def fit_region(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Size the shared region for these concrete tensors (inputs and/or outputs).

        A stage with symbolic dimensions gets no region at load (no slot can be sized from
        the declaration); once a caller knows its real shapes — the inputs it will send, the
        outputs the warm-up returned — the slots are sized from them, and later calls of that
        size take the shared path. Larger calls still go inline. Returns whether a region is
        attached afterwards.
        """
        if self._forked:
            raise self._forked_error()
        with self.lock:
            self._require_ready()
            link = self.link
            if not isinstance(link, SharedRegion):
                return False
            for name, arr in arrays.items():
                link.observed[name] = int(np.asarray(arr).nbytes)
            if link.fits_seen():
                return True
            self._attach_region(link)
            return link.region is not None

    def widen(self, depth: int, concurrency: int = 1) -> dict[str, Any] | None:
        """Serve at ``depth`` slot sets from now on, up to ``concurrency`` computed at once.

        The attached region is replaced by one of ``depth`` sets (the worker lets go of the old
        one when it attaches the new one: docs/wire.md, "Shared-memory region"); without a region
        the depth is kept for the one a later ``fit_region`` attaches. ``open_stage`` proves and
        gates a stage at depth 1, so its calls there touch one set's pages, then widens it to the
        depth it serves at (docs/memory.md, "The client's peak while opening a stage"). Whatever
        is in flight is collected first; slots handed out of the old region are not reserved in
        the new one. Where ``depth`` sets would not fit (the region's ceiling, or no space for a
        named region), the region attached stays and serves.

        Returns:
            The worker's ``attached`` info for the new region (torch-cuda: its
            ``pinned_region`` as registered), or None where no region was attached.

        Raises:
            UsageError: ``depth`` outside 1..64, or ``concurrency`` outside 1..``depth``.
        """
        if self._forked:
            raise self._forked_error()
        checked_settings(self.generation, depth, self.shm_mode, self.transport, self.tuning)
        self._check_concurrency(concurrency, depth)
        with self.lock:
            self._require_ready()
            link = self.link
            same = (depth, concurrency) == (self.depth, self.concurrency)
            self.depth, self.concurrency = depth, concurrency
            if same or not isinstance(link, SharedRegion) or link.region is None:
                return None
            return self._attach_region(link)  # type: ignore[no-any-return]

    def _check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs as the worker takes them (checked against the signature, wire order)."""
        if device_slots.on_device(self.pipeline.device, inputs):  # device tensors (docs/torch.md)
            return self.pipeline.device.check(inputs)
        feeds = {name: np.asarray(value) for name, value in inputs.items()}
        # Calls usually repeat one signature: a checked one is remembered (a few µs a call).
        key = tuple((n, a.dtype, a.shape) for n, a in feeds.items())
        if key not in self._accepted:
            self._validate_feeds(feeds)
            if len(self._accepted) > 64:
                self._accepted.clear()
            self._accepted.add(key)
        return wire_order(feeds)  # the shared region holds little-endian bytes, as the wire

    def _validate_feeds(self, inputs: Mapping[str, np.ndarray]) -> None:
        check_inputs(inputs, self.inputs)

    def evidence(self) -> tuple[dict[str, Any], bytes | None]:
        """What the worker's runtime collected for the proof: facts, and the profile's bytes."""
        if self._forked:
            raise self._forked_error()
        with self.lock:
            frame = self.request({"op": "evidence"}, "evidence_data", "call")
            arrays = frame.arrays()
            profile = arrays.get(wire.PROFILE_TENSOR)
            return dict(frame.header["info"]), (bytes(profile) if profile is not None else None)

    def check_sets(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                                            dict[str, np.ndarray]]:
        """Have the worker answer ``inputs`` in every slot set and compare each with set 0.

        The inputs travel inline, and every set's pages are touched in the worker only
        (``xstage_remote.set_check``), so the client's peak stays where it was. Returns the
        worker's info (``sets``: how many ran; ``differs``: the first set that answered
        otherwise, bit for bit, or None) and, where one did, set 0's outputs and that set's by
        name; ``({}, {}, {})`` without a region of two sets or more; ``skipped`` says why
        where the worker does not offer ``check-sets`` or the inputs are over one frame.
        """
        if self._forked:
            raise self._forked_error()
        with self.lock:
            region = getattr(self.link, "region", None)
            if region is None or region.n_sets < 2:
                return {}, {}, {}
            if "check-sets" not in ((self.hello or {}).get("features") or ()):
                return {"sets": 0, "skipped": "the worker does not offer check-sets"}, {}, {}
            feeds = self._check_inputs(inputs)
            if sum(a.nbytes for a in feeds.values()) > wire.MAX_PAYLOAD_BYTES:
                return {"sets": 0, "skipped": "the inputs are over one frame's limit "
                        f"({wire.MAX_PAYLOAD_BYTES >> 30} GiB)"}, {}, {}
            frame = self.request({"op": "check_sets"}, "sets_checked", "warmup", arrays=feeds)
            arrays = frame.arrays()
            return (dict(frame.header["info"]),
                    {n[len(wire.SET0_PREFIX):]: np.array(a) for n, a in arrays.items()
                     if n.startswith(wire.SET0_PREFIX)},
                    {n[len(wire.SETK_PREFIX):]: np.array(a) for n, a in arrays.items()
                     if n.startswith(wire.SETK_PREFIX)})

    def state_values(self) -> dict[str, np.ndarray]:
        """The state the last call left in the worker, by state output name (copies).

        For the numeric gate, which compares every state output at every call; a stage's
        state otherwise never crosses the wire.
        """
        with self.lock:
            frame = self.request({"op": "state"}, "state_data", "call")
            return {name: np.array(value) for name, value in frame.arrays().items()}

    def run(self, inputs: Mapping[str, Any], *,
            out: Mapping[str, np.ndarray] | None = None,
            phase: str = "call", views: bool = False) -> dict[str, np.ndarray]:
        """Run the loaded stage: outputs by name in graph order, C-contiguous, owned.

        ``out`` may hold preallocated C-contiguous arrays for some outputs (same dtype and
        shape as the result); those are filled in place and returned, saving an allocation
        per call on the shared-memory path. ``views=True``: outputs that come back through
        the shared region are read-only views of their slots instead (nothing copied out),
        valid until the request ``depth`` calls later is published (at depth 1, the next
        call); an ``out`` array is still filled. ``phase`` picks the deadline: ``call``, or
        ``warmup`` for the first, profiled run.
        """
        if self._forked:  # one attribute: a child of a fork (``forked_away``)
            raise self._forked_error()
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            raise not_a_mapping(inputs, (s["name"] for s in (self.loaded or {}).get("inputs", ())))
        with self.lock:
            if self._exited() and self.state is WorkerState.READY:
                raise self._idle_death()  # nothing sent: a restarted stage serves this call
            if self.state_uncertain is not None:
                self._settle_state()
            link = self.link
            lane = link.lane
            if lane is not None and out is None and phase == "call" and self._pending is None \
                    and not self.reset_next and type(inputs) is dict and link.region is None \
                    and self.state is WorkerState.READY and self.closed_why is None \
                    and not self.pipeline.queue and not self.pipeline.inflight:
                result = self._call_lean(link, lane, inputs)
                if result is not None:
                    return result
            known = self._known
            if known is not None and known[1] is link.region and out is None \
                    and phase == "call" and type(inputs) is dict \
                    and self.state is WorkerState.READY and self.closed_why is None:
                try:
                    key = tuple([(name, type(a), a.dtype, a.shape) for name, a in inputs.items()])
                except AttributeError:  # not an array
                    key = None
                if key == known[0]:  # accepted as they are, region path: see _known_for
                    return self.pipeline.call(inputs, _NO_OUT, phase, views)
            self._require_ready()
            if self.loaded is None:
                raise errors.UsageError("run() before load()")
            feeds = self._check_inputs(inputs)
            if out is None and phase == "call":
                if link.region is None:
                    if link.codec is not None:
                        link.lane = None if self.pipeline.stateful or self.pipeline.device is not None \
                            else link.lane_for(feeds, inputs, self.generation)
                else:
                    self._known = self._known_for(feeds, inputs)
            return self.pipeline.call(feeds, out or {}, phase, views)

    def _known_for(self, feeds: Mapping[str, np.ndarray],
                   inputs: Mapping[str, Any]) -> tuple[tuple[Any, ...], Any] | None:
        """The signature of inputs ``_check_inputs`` just accepted, for ``run`` to skip.

        Numpy arrays accepted as they are (in wire byte order, host memory), with the region
        they go through: a later call of the same (name, type, dtype, shape) skips the checks,
        as a socket call's lane does (~2 µs a call). Device tensors, converted inputs: None
        (checked each time).
        """
        if self.pipeline.device is not None or type(inputs) is not dict \
                or any(feeds[name] is not value or type(value) is not np.ndarray
                       for name, value in inputs.items()):
            return None
        return (tuple([(name, type(a), a.dtype, a.shape) for name, a in inputs.items()]),
                self.link.region)

    def _call_lean(self, link: Any, lane: Any, inputs: dict[str, Any]) -> Outputs | None:
        """One call the common way, in fewer steps.

        The lock is held; nothing is pending, queued or in flight; no region, no state, no
        ``out``; the inputs are of the signature last accepted.

        The request is the signature's kept binary frame with its id packed in, sealed in
        place (``wire._Lane``, ``Channel.send_sealed``); the reply is checked as
        ``expect`` checks it (id, op, generation) and its arrays read with the plan of the
        reply's checked descriptor list. None where the inputs are not that signature's
        (nothing sent): the caller takes the long way, which checks them.
        """
        frame_lane = lane
        rid = self._next_id
        try:
            if frame_lane.fill_same(rid, inputs) is None:  # not the signature: the long way
                return None
        except (ValueError, TypeError, BufferError, KeyError):  # not C-contiguous: the long way
            return None
        except struct.error as exc:
            raise errors.LocalProtocolError(f"binary run frame: {exc}") from exc
        self._next_id = rid + 1
        channel = link.channel
        seconds = self.deadlines.call
        link.io.start(seconds)
        spin = link.spin
        if spin is not None:
            spin.expected = link.expected
        self._pending = ("frame", rid)  # before the send, as request
        try:
            link.send_lane(frame_lane)
        except self._LOWER as exc:
            self._pending = None
            raise self._translate(exc, "call", seconds) from exc
        except BaseException as exc:
            self._pending = None
            if not isinstance(exc, OSError):
                self._break(f"a request was interrupted ({type(exc).__name__}) while it was "
                            "being sent; the worker holds part of a frame")
            raise
        reply = link.reply
        try:
            if reply is None or channel is None:
                frame = self.recv("call", seconds, fresh=False)
            else:
                # The reply this call's signature makes (``recv``, with the channel checking
                # it in fewer steps): any other frame comes back as a Frame, checked below.
                reply.rid = rid
                try:
                    frame = channel.recv(codec=link.codec, expect=reply)
                except self._LOWER as exc:
                    raise self._translate(exc, "call", seconds) from exc
        except BaseException as exc:
            if not isinstance(exc, (OSError, EOFError, errors.XstageError, errors.StageClosed)):
                self._interrupted(exc)  # inside the read or before it began: the stage closes
            raise
        if reply is not None and channel is not None:
            if frame is reply:
                self._pending = None
                _, worker_ns, rss, peak = reply.fields
                self.last_timing = {"worker_ns": worker_ns, "rss": rss, "peak": peak}
                link.expected = worker_ns * 1e-9
                return link.planned(reply.payload)  # type: ignore[no-any-return]
        self._pending = None
        header = frame.header
        if header["id"] != rid or header["op"] != "result" or not frame.fast \
                or header.get(wire.GEN_FIELD) != self.generation:
            return self._finish_inline(self.expect(frame, "result", rid), {})
        timing = self.last_timing = header["timing"]  # decoded for this frame alone
        link.expected = timing["worker_ns"] * 1e-9
        return link.collect_lean(frame, self.generation)  # type: ignore[no-any-return]

    def call_inline(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
                     phase: str, flags: int) -> Outputs:
        """A synchronous call as one frame each way, nothing queued or in flight (lock held).

        No request object, no queue; the reply's arrays are the outputs.
        """
        header: dict[str, Any] = {"op": "run"}
        if flags & shm.FLAG_RESET_STATE:
            header["options"] = {"reset_state": True}
        return self._finish_inline(self.request(header, "result", phase, arrays=feeds), out)

    def _finish_inline(self, frame: wire.Frame, out: Mapping[str, np.ndarray]) -> Outputs:
        """A ``result`` frame (checked by ``expect``) as the call's outputs and timing."""
        timing = frame.header.get("timing")
        self.last_timing = dict(timing) if timing else {}
        self.link.expected = self.last_timing.get("worker_ns", 0) * 1e-9
        result: Outputs = self.link.collect(frame.arrays(), out)
        result.state_reset = bool(self.last_timing.get("state_reset"))
        return result

    def submit(self, inputs: Mapping[str, Any], *, timeout: Any = USE_DEADLINE) -> StageFuture:
        """Queue one call; its future's result is what ``run`` returns.

        At most ``depth`` requests are in flight in the worker; the rest wait in the client, in
        order. The deadline (``timeout`` seconds, ``None`` for none, by default the call
        deadline) runs from now.

        Raises:
            InputError: inputs that do not match the stage (checked before queuing).
            StageClosed: the worker was closed or died.
            UsageError: a ``timeout`` that is not a number of seconds > 0 or None.
        """
        seconds = self.deadlines.call if timeout is USE_DEADLINE else timeout
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(
                seconds, (int, float)) or not seconds > 0 or seconds == float("inf")):
            raise errors.UsageError(f"timeout={timeout!r} is not a number of seconds > 0",
                                    remedy="give seconds, or None for no limit")
        if self._forked:
            raise self._forked_error()
        self._require_ready()
        if self.loaded is None:
            raise errors.UsageError("submit() before load()")
        if not isinstance(inputs, Mapping):
            raise not_a_mapping(inputs, (s["name"] for s in self.loaded.get("inputs", ())))
        if self.state_uncertain is not None:
            with self.lock:
                self._settle_state()
        return self.pipeline.submit(self._check_inputs(inputs), seconds)

    def reset_state(self) -> None:
        """The next request (submitted after this) runs from the initial state.

        It also ends the doubt an interrupted call left (``StateUncertain``).
        """
        if self._forked:
            raise self._forked_error()
        self.reset_next = True
        self.state_uncertain = None

    def state_settled(self, req: Any) -> None:
        """The interrupted request ``req`` never ran (its answer says so): the state stands."""
        if self.state_uncertain is req:
            self.state_uncertain = None

    def _settle_state(self) -> None:
        """Before a call that follows an interrupted one of a stage with state (lock held).

        The interrupted request's answer is collected first (it says whether it ran); if it
        ran, or may have, the call is refused.

        Raises:
            StateUncertain: the interrupted call may have moved the state.
        """
        if self.pipeline.inflight:
            self.pipeline.drain()
        if self.state_uncertain is not None:
            raise errors.StateUncertain(
                f"request #{self.state_uncertain.rid} to the {self.route} worker was "
                "interrupted after the worker took it: the state it keeps may have moved by "
                "that call, so the next call would run on a state you cannot know",
                remedy="call reset_state() to run the next call from the initial state "
                "(docs/serving.md, \"State that stays in the worker\")")

    def take_reset(self) -> int:
        """``shm.FLAG_RESET_STATE`` once after ``reset_state()``, else 0."""
        if not self.reset_next:
            return 0
        self.reset_next = False
        return shm.FLAG_RESET_STATE

    def in_flight(self) -> int:
        """Requests queued or in flight (not yet answered)."""
        return len(self.pipeline.queue) + len(self.pipeline.inflight)
