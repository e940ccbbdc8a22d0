"""One request to a worker, the future its caller holds, a slot set reserved for one call.

The pipeline's values (``client/pipeline.py`` drives them): a ``Request`` moves from the queue
into a slot set and is answered; a ``StageFuture`` is its caller's handle; a ``Reservation`` is
a set handed out by ``input_slots`` / ``device_inputs`` until the call given its views takes it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from xstage.client import device_slots

__all__ = ["EarlyFrames", "Request", "Reservation", "Reservations", "StageFuture", "Withdraws",
           "address", "snapshot", "view_dropped"]


class Withdraws(Protocol):
    """What a future asks of the pipeline that serves its request (``Pipeline.withdraw``)."""

    def withdraw(self, req: Request, cancelled: Callable[[], bool]) -> bool:
        """Withdraw ``req`` if it has not started, calling ``cancelled`` under the lock."""


class StageFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` for one request to a stage.

    Its result is the outputs by name. ``request_id`` and ``generation`` name the request and
    the worker that served it; ``timing`` holds the worker's stamps (``published_ns``,
    ``taken_ns``, ``start_ns``, ``end_ns``: ``time.monotonic_ns`` of this machine) once done.
    ``cancel()`` succeeds for a request that has not started.
    """

    def __init__(self, req: Request) -> None:
        super().__init__()
        self._req = req
        self.request_id: int | None = None
        self.generation: int | None = None
        self.timing: dict[str, int] = {}
        self.state_reset = False

    def cancel(self) -> bool:
        """Withdraw the request if it has not started; True when it will never run."""
        if self.done():
            return super().cancel()
        pipeline = self._req.pipeline
        return pipeline is not None and pipeline.withdraw(self._req, self._base_cancel)

    def _base_cancel(self) -> bool:
        """Cancel it and tell its waiters.

        ``concurrent.futures.wait`` and ``as_completed`` count a cancelled future done only
        once ``set_running_or_notify_cancel`` moved it on to ``CANCELLED_AND_NOTIFIED``.
        """
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED, waiters told
        return True


def snapshot(feeds: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of a request that stays queued, copied: ``submit`` reads them only once.

    A caller may refill its buffers as soon as ``submit`` returns (docs/serving.md,
    "Requests"). Device tensors are the caller's until the request is answered.
    """
    return {name: a.copy() if type(a) is np.ndarray else a for name, a in feeds.items()}


class Request:
    """One request: its inputs, who waits for it, its deadline and where it is."""

    __slots__ = ("deadline", "discard", "done", "error", "feeds", "flags", "future", "out",
                 "phase", "pipeline", "published", "result", "rid", "seconds", "set", "timing",
                 "token", "uncertain")

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
        #: The pipeline that serves it (a restarted stage's adopts it), for ``cancel``.
        self.pipeline: Withdraws | None = None


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


class Reservations(dict):  # type: ignore[type-arg]
    """The reserved sets by set number (the pipeline's ``mu`` held), and those given back.

    ``dropped`` holds the reservations whose views all died unused: appended without a lock
    (``view_dropped`` runs wherever the garbage collector does), taken off by
    ``forget_dropped``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dropped: deque[Reservation] = deque()

    def forget_dropped(self) -> None:
        """Give back the sets whose views all died unused."""
        while self.dropped:
            token = self.dropped.popleft()
            if self.get(token.set) is token:
                del self[token.set]

    def hand_out(self, s: int, views: Mapping[str, Any], mu: Any) -> None:
        """Set ``s``'s reservation covers ``views``; dropping them all unused gives it back."""
        live = [v for v in views.values() if v.nbytes]
        token = Reservation(s, {name: address(v) for name, v in views.items() if v.nbytes},
                            len(live))
        with mu:
            if s in self:
                self[s] = token
        for v in live:
            weakref.finalize(v, view_dropped, token, self.dropped)
        if not live:
            self.dropped.append(token)  # nothing to recognise it by: not held

    def blocked(self, req: Request, next_set: int) -> bool:
        """``req`` may not be published in ``next_set`` (the pipeline's ``mu`` held).

        Another caller reserved that set, or ``req`` carries a reserved set that is not next.
        """
        owner = self.get(next_set)
        token = req.token
        if token is not None and self.get(token.set) is not token:
            token = req.token = None  # given back (cannot happen while it holds the views)
        return (owner is not None and owner is not token) \
            or (token is not None and token.set != next_set)

    def token_of(self, feeds: Mapping[str, Any]) -> Reservation | None:
        """The reservation whose views ``feeds`` carries."""
        for token in self.values():
            if token.carried_by(feeds):
                return token
        return None


class EarlyFrames(dict):  # type: ignore[type-arg]
    """Frames read ahead of the request being collected, by request id.

    With concurrent runs the worker answers requests in the order they finish, and an error's
    or an inline result's frame comes on the control stream in that order, not in the order
    the pipeline collects (docs/serving.md, "Concurrent runs").
    """

    def keep(self, frame: Any, inflight: Iterable[Request]) -> bool:
        """Keep ``frame`` for its request if that one is in flight; False if it is not."""
        if any(r.rid == frame.id for r in inflight):
            self[frame.id] = frame
            return True
        return False

    def read(self, recv: Callable[[str, float | None], Any], req: Request,
             inflight: Iterable[Request]) -> Any:
        """``req``'s frame: kept earlier, or read, keeping any other in-flight request's."""
        frame = self.pop(req.rid, None)
        while frame is None:
            got = recv(req.phase, req.seconds)
            if got.id == req.rid or not self.keep(got, inflight):
                frame = got  # not another request's: ``expect`` judges it
        return frame


def address(view: Any) -> int:
    """Where a handed-out view starts: a numpy slot's address, or a CUDA tensor's pointer."""
    if type(view) is np.ndarray:
        return int(view.__array_interface__["data"][0])
    return int(view.data_ptr())


def view_dropped(token: Reservation, dropped: deque[Reservation]) -> None:
    """A reserved view died (``weakref.finalize``): the last one gives the set back.

    Runs wherever the garbage collector does, so it takes no lock: the pipeline takes the
    token off ``dropped`` the next time it looks (``Pipeline.reserve``).
    """
    with contextlib.suppress(IndexError):
        token.left.pop()
    if not token.left:
        dropped.append(token)


