"""``Refill``: keep K requests of one input in flight, each refilled from the last one's callback.

The throughput mode's driver (``Requests.measure_throughput``). A loop in the caller's thread
that waits for the oldest request and then submits the next pays two hand-offs per request:
the thread that collects a result wakes the caller, and the caller's ``submit`` finds the
collecting thread busy and queues the request for it (a copy of the inputs and a wake-up).
Measured on a 16-CPU host, PP-OCRv4 det at depth 4 on ort-cpu: 1.0-1.3 ms from ``submit`` to
published that way, 0.2 ms from the callback (docs/throughput.md, "How the throughput mode
drives the stage"). So the next request is submitted where the last one's result arrives, as
OpenVINO's ``benchmark_app`` restarts an infer request from its completion callback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

__all__ = ["Refill"]


class Refill:
    """``depth`` requests of ``inputs`` in flight, until ``total`` sent or ``duration`` s passed.

    Either bound may be None, not both. ``run`` blocks until every request sent has ended and
    raises the first request's error, if any (no request is sent after it). ``sent`` counts
    the requests submitted, ``latency`` holds each successful one's seconds from ``submit`` to
    its result.

    A callback that finds the request already done when it is attached runs in the
    submitting thread; the requests it would send are then sent by the loop already running
    there (``_local.filling``), so a stage that answers inside ``submit`` never recurses.
    """

    def __init__(self, submit: Callable[[Mapping[str, Any]], Future[Any]], inputs: Mapping[str, Any],
                 *, depth: int, total: int | None, duration: float | None) -> None:
        self._submit = submit
        self._inputs = inputs
        self._depth = depth
        self._total = total
        self._duration = duration
        self._end: float | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._local = threading.local()
        self._caller: threading.Thread | None = None
        self._inflight = 0
        self._error: BaseException | None = None
        self.sent = 0
        self.latency: list[float] = []

    def run(self) -> None:
        """Send, wait until every request sent has ended, raise the first error."""
        self._caller = threading.current_thread()
        if self._duration is not None:
            self._end = time.perf_counter() + self._duration
        self._fill()
        self._check_finished()
        try:
            self._finished.wait()
        except BaseException as exc:  # Ctrl-C: nothing more is sent; what is in flight ends
            with self._lock:
                self._error = self._error or exc
            raise
        if self._error is not None:
            raise self._error

    def _more(self) -> bool:
        """Another request may go (``_lock`` held)."""
        if self._error is not None or self._inflight >= self._depth:
            return False
        if self._total is not None and self.sent >= self._total:
            return False
        return self._end is None or time.perf_counter() < self._end

    def _fill(self) -> None:
        """Send until ``depth`` are in flight or no more may go."""
        if getattr(self._local, "filling", False):
            return  # a callback run inside this thread's ``submit``: the loop below sends
        self._local.filling = True
        try:
            while True:
                with self._lock:
                    if not self._more():
                        return
                    self.sent += 1
                    self._inflight += 1
                t0 = time.perf_counter()
                try:
                    future = self._submit(self._inputs)
                except BaseException as exc:  # noqa: BLE001 - every error ends the run, named
                    with self._lock:
                        self.sent -= 1
                        self._inflight -= 1
                        if self._error is None:
                            self._error = exc
                    return
                future.add_done_callback(lambda fut, t0=t0: self._done(fut, t0))
        except BaseException as exc:  # noqa: BLE001 - in a callback it would only be logged
            self._fail(exc)
            if threading.current_thread() is self._caller:
                raise
        finally:
            self._local.filling = False

    def _done(self, future: Future[Any], t0: float) -> None:
        """A request ended: its latency kept, the next one sent from here."""
        try:
            self._ended(future, t0)
        except BaseException as exc:  # noqa: BLE001 - a callback's error is only logged: end the run
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """End the run now with an error outside the requests (a submit that returned no future).

        Waiting would wait for a callback that will not come.
        """
        with self._lock:
            self._error = self._error or exc
        self._finished.set()

    def _ended(self, future: Future[Any], t0: float) -> None:
        now = time.perf_counter()
        error = None if future.cancelled() else future.exception()
        with self._lock:
            self._inflight -= 1
            if future.cancelled() and self._error is None:
                self._error = RuntimeError("a throughput request was cancelled")
            elif error is not None and self._error is None:
                self._error = error
            elif error is None and not future.cancelled():
                self.latency.append(now - t0)
        self._fill()
        self._check_finished()

    def _check_finished(self) -> None:
        with self._lock:
            if self._inflight == 0 and not self._more():
                self._finished.set()
