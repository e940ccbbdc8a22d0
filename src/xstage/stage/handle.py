"""``Stage``: an admitted stage, called like a function; it knows where it ran and how well."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from xstage import errors, evidence, parity
from xstage import ledger as ledger_mod
from xstage.artifact import Artifact
from xstage.client.pipeline import USE_DEADLINE, StageFuture
from xstage.planner import Candidate, Plan
from xstage.record.build import build_record
from xstage.record.io import records_path, utc_now, write_record
from xstage.refusal import Refusal
from xstage.snapshot import release
from xstage.stage.admit import Admission, admit
from xstage.stage.ledger import Holding
from xstage.stage.refill import Refill
from xstage.stage.request import RESTART_POLICIES
from xstage.stage.state import state_bytes
from xstage.timings import DEFAULT_PERCENTILES, summarize, throughput_block

__all__ = ["RESTART_POLICIES", "Stage"]



class Requests:
    """``acall`` and ``map`` on top of a stage's ``submit`` and ``depth``.

    One implementation for a local ``Stage`` and a ``ClusterStage``, so the two keep one
    behaviour.
    """

    @property
    def depth(self) -> int:
        """How many requests may be in flight."""
        raise NotImplementedError

    def submit(self, inputs: Mapping[str, Any], *,
               timeout: Any = USE_DEADLINE) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """One request; its outputs come through the future."""
        raise NotImplementedError

    def _keeps_state(self) -> bool:
        """Whether the stage carries state pairs (and so serves one request at a time)."""
        return False

    async def acall(self, inputs: Mapping[str, Any], *,
                    timeout: Any = USE_DEADLINE) -> dict[str, np.ndarray]:
        """``await stage.acall(inputs)``: ``submit`` for asyncio (the event loop never blocks).

        Raises:
            InputError, StageClosed, UsageError: as ``submit``, before anything is queued.
        """
        return await asyncio.wrap_future(self.submit(inputs, timeout=timeout))

    def map(self, inputs: Iterable[Mapping[str, Any]], *, depth: int | None = None,
            timeout: Any = USE_DEADLINE) -> Iterator[dict[str, np.ndarray]]:
        """Outputs for each item of ``inputs``, in order, ``depth`` requests in flight.

        The next item is taken from ``inputs`` (and produced, if it is a generator) while the
        worker computes the ones before it. ``depth`` defaults to the stage's and may not exceed
        it. Leaving the loop early cancels what has not started.

        Raises:
            UsageError: ``depth`` is not a whole number in 1..the stage's depth.
        """
        k = self.depth if depth is None else depth
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.depth:
            raise errors.UsageError(
                f"map(depth={depth!r}) needs 1 <= depth <= {self.depth}, the stage's depth",
                remedy=f"open the stage with open_stage(..., depth={depth}) to keep that many "
                "requests in flight" if isinstance(depth, int) and not isinstance(depth, bool)
                and depth > self.depth else "give a whole number of requests in flight")
        return self._map(iter(inputs), k, timeout)

    def measure_throughput(self, inputs: Mapping[str, Any], *, depth: int, requests: int | None = None,
                           duration: float | None = None, batch: int | None = None,
                           percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
        """``depth`` requests of ``inputs`` in flight: the record's ``timings.throughput``.

        It runs ``requests`` requests or for ``duration`` seconds (whichever is given; default
        100 requests); the block is ``xstage.timings.throughput_block``'s.

        Each request's latency runs from its ``submit`` to its result (stamped when the result
        arrives). The next request is submitted from the finished one's done-callback, in the
        thread that collected it, as ``benchmark_app`` restarts an infer request from its
        completion callback: no hand-off to the calling thread between two requests
        (docs/throughput.md, "How the throughput mode drives the stage"). A depth above the
        stage's runs at the stage's depth and says so (a stage with state pairs is served at
        depth 1).

        Raises:
            UsageError: ``depth`` below 1, or ``requests``/``duration`` not positive.
            The first request's error (``InputError``, ``WorkerDied``, ...), once the requests
            in flight have ended.
        """
        if depth < 1 or (requests is not None and requests < 1) \
                or (duration is not None and duration <= 0):
            raise errors.UsageError("--depth and --requests must be >= 1 and --duration > 0")
        k, note = min(depth, self.depth), None
        if k < depth:
            note = (f"depth {depth} asked, served at {k}: "
                    + ("a stage with state pairs runs one request at a time" if self._keeps_state()
                       else f"the stage's depth is {k}"))
        total = requests if requests is not None else (None if duration is not None else 100)
        drive = Refill(self.submit, inputs, depth=k, total=total, duration=duration)
        start = time.perf_counter()
        drive.run()
        wall = time.perf_counter() - start
        return throughput_block(depth=k, requests=drive.sent, wall_s=wall, batch=batch,
                                latency_s=drive.latency,
                                concurrency=getattr(self, "concurrency", None), percentiles=percentiles,
                                note=note)

    def _map(self, items: Iterator[Mapping[str, Any]], k: int,
             timeout: Any) -> Iterator[dict[str, np.ndarray]]:
        window: deque[concurrent.futures.Future[dict[str, np.ndarray]]] = deque()
        try:
            for feeds in items:
                window.append(self.submit(feeds, timeout=timeout))
                if len(window) >= k:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for fut in window:
                fut.cancel()


class Stage(Requests):
    """An admitted stage: call it like a function; it knows where it ran and how well.

    Built by ``open_stage`` from an ``Admission`` (the candidate that passed every gate) and
    the plan it came from. ``stage(inputs)`` waits in the caller's thread; ``submit`` returns
    a ``concurrent.futures.Future`` and keeps up to ``depth`` requests in flight
    (docs/serving.md). With ``restart="never"`` a dead worker makes a dead stage: every call
    raises ``StageClosed``. With ``restart="on_death"`` the requests in flight fail with
    ``WorkerDied`` naming the generation, and generation n+1 is proven and gated again before
    it serves the queued requests and the next call (at most ``max_restarts`` in
    ``restart_window`` seconds; a refused restart closes the stage). ``close()`` is
    idempotent, writes the stage's record (restarts included), and the stage is a context
    manager.
    """

    def __init__(self, admission: Admission, *, plan: Plan,
                 tried: Sequence[tuple[Candidate, str, Refusal | None]],
                 restart: str = "never", max_restarts: int = 3, restart_window: float = 60.0,
                 record_on_close: bool = True,
                 say: Callable[[str], None] | None = None) -> None:
        self._admission = admission
        self._client = admission.client
        self._ledger = admission.ledger
        self._holding: Holding | None = admission.holding
        self._timing_plan = (0, 0)  # (runs, warmup) of the last ``measure``: the record's request
        self._lock = threading.RLock()  # the worker swap (a restart); calls take it briefly
        self.candidate: Candidate = admission.candidate
        self.artifact: Artifact = admission.setup.artifact
        self.plan = plan
        self.proof: evidence.PlacementProof = admission.proof
        self.parity: parity.Parity = admission.parity
        self.notes = list(admission.notes)
        self.tried = list(tried)
        #: What the ledger holds for this stage while it is open.
        self.budget: ledger_mod.Budget = admission.holding.budget
        self.timings: dict[str, Any] | None = None
        self._calls: list[dict[str, Any]] = []  # the timed calls of ``measure``, for the record's detail
        #: Things that went wrong after admission and did not stop the stage (a call whose
        #: peak passed the budget); they go into the record.
        self.warnings: list[str] = []
        self.restart = restart
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.record_on_close = record_on_close
        #: Each restart: generation, cause, when (UTC), outcome.
        self.restarts: list[dict[str, Any]] = []
        self._restart_times: list[float] = []
        self._state_resets = 0
        self._closed_cause: str | None = None
        self._closed = False
        #: True while a restart's admission runs (``health`` says ``restarting``).
        self._restarting = False
        self._snapshots = list(admission.setup.snapshots)  # pinned until close (xstage.snapshot)
        self._record_path: str | None = None
        self._say = say or (lambda _m: None)
        self._install(self._client)

    @property
    def generation(self) -> int:
        """The serving worker's generation (1, then +1 per restart)."""
        return self._client.generation

    @property
    def depth(self) -> int:
        """Requests in flight at once in the worker (``open_stage(depth=...)``)."""
        return self._client.depth

    def _keeps_state(self) -> bool:
        return bool(self._admission.setup.state)

    @property
    def holding(self) -> Holding | None:
        """What this stage holds in its ledger (its budget's reservation).

        None once closed, or while a restart holds nothing.
        """
        return self._holding

    @property
    def concurrency(self) -> int:
        """Requests the worker computes at once, as it granted them (``open_stage(concurrency=...)``)."""
        return self._client.concurrent

    @property
    def device(self) -> str:
        """The device the stage runs on (``gpu_integrated:amd``, ``cpu``, …)."""
        return self.candidate.device

    @property
    def route(self) -> str:
        """The route that drives it (``ort-openvino``, ``torch-cuda``, …)."""
        return self.candidate.route.name

    @property
    def inputs(self) -> Mapping[str, np.ndarray]:
        """The checked inputs the stage was admitted on (the warm-up and the gate ran them)."""
        return self._admission.setup.feeds

    @property
    def last_timing(self) -> Mapping[str, int]:
        """The last call's timing from the worker (``worker_ns``, copies, ``peak``, …)."""
        return self._client.last_timing

    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid (None once it is gone)."""
        return self._client.pid

    def device_inputs(self, *, timeout: float | None = None) -> dict[str, Any]:
        """A device slot set no request owns, reserved for the call it is given to.

        ``device_tensors=on`` only. CUDA tensors by input name, views of one set of the
        worker's device input slots: fill them (a producer's ``out=``, ``copy_``) and call the
        stage with them (``stage(slots)`` or ``submit(slots)``), and the call copies nothing
        in this process. As with
        ``input_slots``, no other request is published into the set before that call; while
        every set is in flight or reserved this waits for one. Ask again before each call.

        Raises:
            UsageError: the stage serves no device tensors.
            SlotsBusy: no set came free within ``timeout`` seconds.
            StageClosed: the stage is closed.
        """
        return self._serving().device_inputs(timeout=timeout)

    def input_slots(self, shapes: Mapping[str, Sequence[int]] | None = None, *,
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """A slot set of the shared region no request owns, reserved for the call given it.

        Writable numpy arrays by input name, views of one set's input slots at the declared
        shapes (``shapes`` for dimensions that are not fixed): fill them and call the stage
        with them (``stage(slots)`` or ``submit(slots)``), and the call copies nothing in. No
        other request is published into the set before that call; while every set is in
        flight or reserved this waits for one (docs/serving.md). Ask again before each call.

        Raises:
            UsageError: the stage has no shared region, or a shape does not fit its slot.
            SlotsBusy: no set came free within ``timeout`` seconds.
            StageClosed: the stage is closed.
        """
        return self._serving().input_slots(shapes, timeout=timeout)

    def waits(self) -> dict[str, Any]:
        """The shared region's spin-or-block decisions so far, on both sides (``--verbose``).

        Returns:
            ``WorkerClient.waits()``: ``{"caller": …, "worker": …}``, counts by rule and by
            outcome with a ``line`` in words; empty for a side without a shared region.
        """
        return self._client.waits()

    def __call__(self, inputs: Mapping[str, Any], *, views: bool = False
                 ) -> dict[str, np.ndarray]:
        """Outputs by name in graph order; a dtype or shape mismatch raises ``InputError``.

        The same as ``submit(inputs).result()`` (order, deadline, generation) but waited for in
        the caller's thread, without a Future. ``views=True``: outputs that come back through
        the shared region are read-only views of it, not copies, valid until the call
        ``depth`` calls later is made (at depth 1, the next call): copy what must outlive it.
        """
        return self._run(inputs, views)

    def submit(self, inputs: Mapping[str, Any], *, timeout: Any = USE_DEADLINE) -> StageFuture:
        """Queue one call and return its ``concurrent.futures.Future`` (docs/serving.md).

        At most ``depth`` requests are in flight in the worker; the rest wait here, and
        results come back in submission order. ``timeout``: seconds from now (``None``: no
        limit; by default the stage's call deadline).

        Raises:
            InputError: inputs that do not match the stage (checked before queuing).
            StageClosed: the stage is closed.
            UsageError: a ``timeout`` that is not a number of seconds > 0 or None.
        """
        client = self._serving()
        try:
            return client.submit(inputs, timeout=timeout)
        except (errors.StageClosed, errors.WorkerDied) as exc:
            if not _unsent(exc) or not self._after_death(
                    client, exc if isinstance(exc, errors.WorkerDied) else None):
                raise
            return self._serving().submit(inputs, timeout=timeout)

    def _run(self, inputs: Mapping[str, Any], views: bool = False) -> dict[str, np.ndarray]:
        client = self._serving()
        try:
            out = client.run(inputs, views=views)
        except (errors.WorkerDied, errors.StageClosed, errors.CallTimeout) as exc:
            if client.state.value in ("dead", "closed") and self._after_death(client, exc) \
                    and _unsent(exc):
                return self._run(inputs, views)  # it never reached the dead worker: the next one
            raise
        warning = ledger_mod.call_peak_warning(client.last_timing.get("peak"), self._admission.ledger_doc)
        if warning and not self.warnings:
            self.warnings.append(warning)
        return out

    # ------------------------------------------------------------------ generations
    def _install(self, client: Any) -> None:
        client.pipeline.on_death = lambda queued, exc, c=client: self._on_death(c, queued, exc)

    def _serving(self) -> Any:
        """The client of the serving generation (waits while a restart runs).

        Raises:
            ForkedStage: this process is a fork of the stage's (checked before any lock: one
                the parent's threads held at the fork stays held here).
            StageClosed: the stage is closed.
        """
        self._client.check_not_forked()
        with self._lock:
            if self._closed:
                raise errors.StageClosed(
                    "the stage is closed" + (f": {self._closed_cause}" if self._closed_cause
                                             else ""))
            return self._client

    def _on_death(self, client: Any, queued: list[Any], exc: BaseException) -> bool:
        """The pump found the worker dead: a restart takes over the queued requests."""
        if self.restart != "on_death" or self._closed:
            return False
        threading.Thread(target=self._after_death, args=(client, exc, queued), daemon=True,
                         name="xstage-restart").start()
        return True

    def _after_death(self, client: Any, exc: BaseException | None,
                     queued: Sequence[Any] = ()) -> bool:
        """Restart after ``client``'s worker died (once per generation); True when serving.

        Without a restart the stage's memory goes back to the ledger with its worker.
        """
        with self._lock:
            if self._client is not client:  # another thread restarted it already
                self._client.pipeline.adopt(list(queued))
                return not self._closed
            if self.restart != "on_death" or self._closed:
                self._ledger.release(self._holding)
                self._holding = None
                if not self._closed and self.restart == "never":
                    self._closed_cause = f"its worker died: {_cause(exc)}"
                return False
            self._restarting = True  # health() reads it without the lock held here
            try:
                return self._restart_locked(client, _cause(exc), list(queued))
            finally:
                self._restarting = False

    def _restart_locked(self, client: Any, cause: str, queued: list[Any]) -> bool:
        now = time.monotonic()
        self._restart_times = [t for t in self._restart_times if now - t < self.restart_window]
        entry = {"generation": client.generation + 1, "cause": cause, "at": utc_now()}
        self._ledger.release(self._holding)
        self._holding = None
        queued = queued + client.pipeline.take_queued()  # left by a synchronous caller's death
        client.close()
        if len(self._restart_times) >= self.max_restarts:
            entry["outcome"] = "limit"
            self.restarts.append(entry)
            return self._shut(f"{self.max_restarts} restarts within {self.restart_window:g} s; "
                              f"the last cause: {cause}", queued)
        self._restart_times.append(now)
        self._say(f"restarting: generation {client.generation + 1} ({cause})")
        setup = replace(self._admission.setup, generation=client.generation + 1,
                        first_id=client.next_id)
        try:
            outcome = admit(self.candidate, setup, self._say)
        except (errors.XstageError, errors.StageClosed) as exc:
            entry["outcome"] = "failed"
            entry["error"] = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
            self.restarts.append(entry)
            return self._shut(f"generation {entry['generation']} failed to start: "
                              f"{entry['error']}", queued)
        if isinstance(outcome, Refusal):
            entry["outcome"] = "refused"
            entry["refusal"] = outcome.to_dict()
            self.restarts.append(entry)
            return self._shut(f"generation {entry['generation']} was refused: "
                              f"{outcome.message}", queued)
        entry["outcome"] = "serving"
        self.restarts.append(entry)
        self._admission = outcome
        self._client = outcome.client
        self._holding = outcome.holding
        self.proof, self.parity = outcome.proof, outcome.parity
        self._install(self._client)
        self._client.pipeline.adopt(queued)
        return True

    def _shut(self, cause: str, queued: Sequence[Any]) -> bool:
        """Close the stage for ``cause``: the queued requests fail with ``StageClosed``."""
        self._closed = True
        self._closed_cause = cause
        closed = errors.StageClosed(f"the stage is closed: {cause}")
        for req in queued:
            if req.future is not None and not req.future.done():
                req.future.set_exception(closed)
        return False

    def reset_state(self) -> None:
        """The next call (or request submitted after this) runs from the initial state.

        Only for a stage whose manifest declares state pairs; its result says
        ``state_reset=True``.

        Raises:
            ForkedStage: this process is a fork of the stage's.
            UsageError: the stage declares no state.
            StageClosed: the stage is closed.
        """
        self._client.check_not_forked()
        if not self._admission.setup.state:
            raise errors.UsageError(
                f"{self.artifact.path.name} declares no state, so there is none to reset",
                remedy="declare state pairs in its manifest (docs/serving.md)")
        self._serving().reset_state()
        self._state_resets += 1

    def health(self) -> dict[str, Any]:
        """Generation, restarts with their causes, requests in flight, the last proof's digest.

        ``state`` is ``serving``, ``restarting`` (generation n+1's admission is running; the
        generation and the proof are still the last one's) or ``closed`` (with
        ``closed_cause``). It never waits for a restart: it reads what the stage holds now,
        without the lock a restart holds while it admits the next generation.

        Raises:
            ForkedStage: this process is a fork of the stage's.
        """
        self._client.check_not_forked()
        client, admission, restarting = self._client, self._admission, self._restarting
        if restarting:
            state = "restarting"
        elif self._closed or client.state.value in ("dead", "closed"):
            state = "closed"
        else:
            state = "serving"
        return {
            "state": state,
            "generation": client.generation,
            "restarts": [dict(r) for r in list(self.restarts)],
            "in_flight": client.in_flight(),
            "proof_sha256": admission.warm.worker["evidence_sha256"],
            "closed_cause": self._closed_cause,
        }

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker, give the budget back and write the stage's record (idempotent).

        The record goes under ``XSTAGE_HOME/records`` (``record_path`` names it) unless the
        stage was opened with ``record_on_close=False`` (the CLI writes its own). In a forked
        child it does nothing (the worker, the budget and the record are the parent's). It
        never raises for the record: one that cannot be written (a full disk, a folder gone) is
        a ``RuntimeWarning`` and ``record_path`` stays None.
        """
        if self._client.forked:
            return
        with self._lock:
            self._closed = True
            self._client.close()
            self._ledger.release(self._holding)
            self._holding = None
            while self._snapshots:  # once: eviction may take them again
                release(self._snapshots.pop())
            if self.record_on_close and self._record_path is None:
                self._record_path = ""  # once, even when writing fails
                path = records_path(graph=self.artifact.path)
                try:
                    self._record_path = str(write_record(self.record(argv=()), path))
                except OSError as exc:  # closed all the same: the record is what is lost
                    warnings.warn(f"the stage closed, but its record was not written: "
                                  f"{getattr(exc, 'message', None) or exc}", RuntimeWarning,
                                  stacklevel=2)

    @property
    def record_path(self) -> str | None:
        """Where ``close()`` wrote the stage's record (None before, or when not written)."""
        return self._record_path or None

    def measure(self, *, runs: int = 20, warmup: int = 3, compare_cpu: bool = False,
                progress: Callable[[int], None] | None = None,
                percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
        """Unprofiled warm-ups, then ``runs`` timed calls on the checked inputs.

        ``percentiles`` are reported each with the runs it needs (``xstage.timings``).

        Raises:
            UsageError: ``runs`` < 1 or ``warmup`` < 0.
        """
        if runs < 1 or warmup < 0:
            raise errors.UsageError("--runs must be >= 1 and --warmup >= 0")
        feeds = self.inputs
        for _ in range(warmup):
            self._run(feeds)
        compute, round_trip = [], []
        origin = self._admission.warm.phases[0][1] if self._admission.warm.phases else 0
        calls = []
        for i in range(runs):
            t0 = time.perf_counter()
            self._run(feeds)
            round_trip.append(time.perf_counter() - t0)
            last = self._client.last_timing
            compute.append(last.get("worker_ns", 0) / 1e9)
            calls.append({"start_us": round((t0 * 1e9 - origin) / 1e3, 1),
                          "round_trip_us": round(round_trip[-1] * 1e6, 1),
                          "compute_us": round(compute[-1] * 1e6, 1), "rss_bytes": last.get("rss"),
                          "peak_bytes": last.get("peak"),
                          **{f"{k}_us": round(last[f"{k}_ns"] / 1e3, 1) for k in ("copy_in", "copy_out")
                             if isinstance(last.get(f"{k}_ns"), int)}})
            if progress:
                progress(i + 1)
        self._calls = calls
        reference = self._admission.setup.reference
        ref = reference.time(feeds, runs) if compare_cpu else None
        self.timings = summarize(compute, round_trip, warmup=warmup, reference_s=ref,
                                 percentiles=percentiles)
        self._timing_plan = (runs, warmup)
        return self.timings

    def record(self, *, argv: Sequence[str] = ()) -> dict[str, Any]:
        """The record of this stage so far (validated and written by ``xstage.record``).

        Raises:
            ForkedStage: this process is a fork of the stage's.
        """
        self._client.check_not_forked()
        client, timing = self._client, self._client.last_timing
        worker = {"route": self.route, "interpreter": client.interpreter,
                  "hello": client.hello or {},
                  "log": str(client.log_path) if client.log_path else None, "notes": self.notes,
                  "runtime": dict((client.loaded or {}).get("info") or {}),
                  "evidence_sha256": self._admission.warm.worker["evidence_sha256"]}
        if self._admission.warm.worker.get("compile_cache"):  # the runtime's compile cache
            worker["compile_cache"] = dict(self._admission.warm.worker["compile_cache"])
        accelerator = self._admission.warm.info.get("accelerator")
        if isinstance(accelerator, dict):  # torch-cuda: stream, pinned region, CUDA graph
            serving = self._admission.warm.pinned_region  # the region it serves from
            worker["accelerator"] = accelerator if serving is None else {
                **accelerator, "pinned_region": dict(serving)}
            accelerator = worker["accelerator"]
            slots = client.pipeline.device
            if slots is not None and slots.info:  # device tensors: the slots as exported
                worker["accelerator"] = {**accelerator, "device_tensors": {
                    "state": "exported", **{k: slots.info[k] for k in ("sets", "via")},
                    "bytes": slots.info["buffer_bytes"]}}
        return build_record(
            serving=self._serving_block(),
            argv=argv, started=self._admission.setup.started, request=self._request_block(),
            status="placed", artifact=self.artifact, plan=self.plan,
            tried=self.tried, worker=worker, proof=self.proof.to_dict(),
            parity_doc=self.parity.to_dict(), timings=self.timings,
            memory={"rss_bytes": timing.get("rss"), "peak_bytes": timing.get("peak")},
            ledger={**self._admission.ledger_doc, "warnings": list(self.warnings)},
            device_attestation=(self._admission.attestation.to_dict()
                                if self._admission.attestation else None),
            detail=({**self._admission.detail, "calls": list(self._calls)}
                    if self._admission.detail is not None else None))

    def _request_block(self) -> dict[str, Any]:
        """The record's ``request`` block: the request, what it resolved to, the timing plan."""
        setup = self._admission.setup
        runs, warmup = self._timing_plan
        return setup.request.to_record(setup.resolved, runs=runs, warmup=warmup)

    def _serving_block(self) -> dict[str, Any]:
        """The record's ``serving`` block: depth, restart policy, generations."""
        return {"depth": self.depth, "concurrency": self.concurrency, "restart": self.restart,
                "max_restarts": self.max_restarts,
                "restart_window_s": self.restart_window, "generation": self.generation,
                "restarts": [dict(r) for r in self.restarts],
                "closed_cause": self._closed_cause, "state": self._state_block()}

    def _state_block(self) -> dict[str, Any] | None:
        pairs = self._admission.setup.state
        if not pairs:
            return None
        return {"pairs": [p.to_dict() for p in pairs],
                "bytes": state_bytes(pairs, self.artifact), "resets": self._state_resets}


def _unsent(exc: BaseException) -> bool:
    """The failed call never reached the dead worker (the next generation may serve it)."""
    return isinstance(exc, errors.StageClosed) or bool(getattr(exc, "idle", False))


def _cause(exc: BaseException | None) -> str:
    """One line naming why a worker went away."""
    if exc is None:
        return "its worker died"
    return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
