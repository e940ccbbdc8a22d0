"""``ClusterStage``: a stage served by a Ray actor on another node, with ``Stage``'s API.

Calls travel as Ray tasks of the stage's actor (numpy arrays through the object store, read
without a copy on the receiving side); the actor's own ``Stage`` serves them with its worker.
A dead actor (or node) fails the requests in flight with ``WorkerDied`` naming the node; with
``restart="on_death"`` the stage is placed again (a new actor, on a node with the resources),
proven and gated again before it serves the next request.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from xstage import errors
from xstage.client.pipeline import USE_DEADLINE
from xstage.cluster.actor import remote_error
from xstage.record.io import records_path, utc_now, write_record
from xstage.stage.handle import RESTART_POLICIES, Requests
from xstage.timings import DEFAULT_PERCENTILES, summarize

__all__ = ["ClusterFuture", "ClusterStage", "Placing"]


class Placing(Protocol):
    """What a stage on a cluster asks of its placement (``place.Placement``), no more.

    A protocol, not the class: ``place`` builds the stage, so naming the class here would be
    an import cycle (docs/architecture.md, "Layers").
    """

    ray: Any
    artifact: Any
    say: Callable[[str], None]  # one line of progress for the caller

    def place(self) -> tuple[Any, dict[str, Any]]:
        """The stage's actor on a node with the resources, and its answer."""

#: Seconds a control question (record, health, close) to a live actor may take.
CONTROL_TIMEOUT_S = 60.0


class ClusterFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` for one request; ``generation`` names the actor."""

    def __init__(self, generation: int) -> None:
        super().__init__()
        self.generation = generation
        self.timing: dict[str, int] = {}


class ClusterStage(Requests):
    """A stage placed on a cluster node: ``Stage``'s API, served through Ray.

    ``node`` names where it runs (Ray node id, host name, address); ``record()`` is the node's
    record whole, with a ``cluster`` block (node, resources, ledger node, restarts).
    """

    def __init__(self, placement: Placing, placed: tuple[Any, dict[str, Any]], *,
                 restart: str = "never", max_restarts: int = 3, restart_window: float = 60.0,
                 record_on_close: bool = True) -> None:
        if restart not in RESTART_POLICIES:
            raise errors.UsageError(f"restart={restart!r} is not one of "
                                    f"{', '.join(RESTART_POLICIES)}")
        self._placement = placement
        self._ray = placement.ray
        self._lock = threading.RLock()  # the actor swap (a re-placement); held across Ray calls
        self._counts = threading.Lock()  # in-flight count and dead generations: never across one
        #: Answers are settled here, never in Ray's own thread (which a re-placement needs).
        self._settler = concurrent.futures.ThreadPoolExecutor(1, "xstage-cluster-settle")
        self._actor, self._opened = placed
        self._generation = 1
        self._dead: set[int] = set()
        self._in_flight = 0
        self.restart = restart
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.record_on_close = record_on_close
        #: Each re-placement: generation, cause, when (UTC), outcome (the ``serving`` shape).
        self.restarts: list[dict[str, Any]] = []
        self._restart_times: list[float] = []
        self._closed = False
        self._ended = False
        self._closed_cause: str | None = None
        self._record_path: str | None = None
        self.timings: dict[str, Any] | None = None
        self.last_timing: dict[str, int] = {}
        self.artifact = placement.artifact

    # ------------------------------------------------------------------ what it is
    @property
    def node(self) -> dict[str, Any]:
        """Where the serving actor runs: ``node_id``, ``hostname``, ``address``, ``pid``, …."""
        return dict(self._opened["where"])

    @property
    def device(self) -> str:
        """The device the node's ``open_stage`` chose."""
        return str(self._opened["device"])

    @property
    def route(self) -> str:
        """The route that drives it on the node."""
        return str(self._opened["route"])

    @property
    def depth(self) -> int:
        """Requests in flight at once on the node."""
        return int(self._opened["depth"])

    @property
    def generation(self) -> int:
        """The serving actor's generation (1, then +1 per re-placement)."""
        return self._generation

    @property
    def inputs(self) -> Mapping[str, np.ndarray]:
        """The checked inputs the stage was admitted on."""
        return self._opened["inputs"]

    @property
    def record_path(self) -> str | None:
        """Where ``close()`` wrote the record (None before, or when not written)."""
        return self._record_path or None

    # ------------------------------------------------------------------ calls
    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by name: ``submit(inputs).result()``."""
        return self.submit(inputs).result()

    def submit(self, inputs: Mapping[str, Any], *,
               timeout: Any = USE_DEADLINE) -> ClusterFuture:
        """Queue one call on the node's stage; its Future fails with ``WorkerDied`` when the
        actor or its node dies (``timeout``: as ``Stage.submit``, applied on the node).

        Raises:
            StageClosed: the stage is closed.
        """
        actor, gen, where = self._serving()
        fut = ClusterFuture(gen)
        wire_timeout = "deadline" if timeout is USE_DEADLINE else timeout
        ref = actor.call.options(concurrency_group="calls").remote(dict(inputs), wire_timeout)
        with self._counts:
            self._in_flight += 1
        ref.future().add_done_callback(lambda done: self._hand_over(fut, done, gen, where))
        return fut

    def _hand_over(self, fut: ClusterFuture, done: concurrent.futures.Future,  # type: ignore[type-arg]
                   gen: int, where: Mapping[str, Any]) -> None:
        """In Ray's thread: settle on the stage's own thread (inline once it is closed)."""
        try:
            self._settler.submit(self._settle, fut, done, gen, where)
        except RuntimeError:  # the stage closed while this call was in flight
            self._settle(fut, done, gen, where)

    def _settle(self, fut: ClusterFuture, done: concurrent.futures.Future,  # type: ignore[type-arg]
                gen: int, where: Mapping[str, Any]) -> None:
        """One call's answer: outputs, the node's error, or a dead actor."""
        with self._counts:
            self._in_flight -= 1
        try:
            answer = done.result()
        except Exception as exc:  # noqa: BLE001 - Ray's errors, sorted below
            fut.set_exception(self._ray_failure(exc, gen, where))
            return
        if answer[0] == "ok":
            fut.timing = answer[2]
            self.last_timing = answer[2]
            fut.set_result(answer[1])
        else:
            fut.set_exception(remote_error(answer[1], where))

    def _ray_failure(self, exc: BaseException, gen: int, where: Mapping[str, Any]) -> Exception:
        """A Ray error as xstage's: a dead actor or node is ``WorkerDied`` naming the node."""
        rex = self._ray.exceptions
        if not isinstance(exc, rex.RayActorError | rex.ActorUnavailableError):
            return errors.XstageError(f"the Ray call to {where.get('hostname')} failed: "
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        died = errors.WorkerDied(
            f"the stage's Ray actor on {where.get('hostname')} (node {where.get('node_id')}, "
            f"{where.get('address')}, pid {where.get('pid')}) died: "
            f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}",
            exit_status=None, generation=gen, pid=where.get("pid"),
            remedy="open it with restart='on_death' to place it again on a node with the "
            "resources; the node's Ray logs say why it died")
        died.node = dict(where)  # type: ignore[attr-defined]
        with self._counts:
            self._dead.add(gen)
        if self.restart == "on_death":
            threading.Thread(target=self._replace, args=(gen, died), daemon=True,
                             name="xstage-cluster-restart").start()
        return died

    # ------------------------------------------------------------------ generations
    def _serving(self) -> tuple[Any, int, dict[str, Any]]:
        """The serving actor, its generation and node; a dead one is replaced first."""
        with self._lock:
            with self._counts:
                dead = self._generation in self._dead
            if dead and not self._closed:
                self._replace(self._generation, None)
            if self._closed:
                raise errors.StageClosed("the stage is closed" + (
                    f": {self._closed_cause}" if self._closed_cause else ""))
            return self._actor, self._generation, self._opened["where"]

    def _replace(self, gen: int, died: errors.WorkerDied | None) -> None:
        """Place generation ``gen + 1`` after ``gen``'s actor died (once per generation)."""
        with self._lock:
            if gen != self._generation or self._closed:
                return
            cause = f"WorkerDied: {died.message}" if died else "its Ray actor died"
            self._give_back()
            if self.restart != "on_death":
                self._shut(f"its Ray actor died ({cause})")
                return
            now = time.monotonic()
            self._restart_times = [t for t in self._restart_times
                                   if now - t < self.restart_window]
            entry: dict[str, Any] = {"generation": gen + 1, "cause": cause, "at": utc_now()}
            self.restarts.append(entry)
            if len(self._restart_times) >= self.max_restarts:
                entry["outcome"] = "limit"
                self._shut(f"{self.max_restarts} restarts within {self.restart_window:g} s; "
                           f"the last cause: {cause}")
                return
            self._restart_times.append(now)
            self._placement.say(f"placing generation {gen + 1} again ({cause})")
            try:
                self._actor, self._opened = self._placement.place()
            except errors.Refused as exc:
                entry.update(outcome="refused", refusal=exc.refusals[0].to_dict())
                self._shut(f"generation {gen + 1} was refused: {exc.message}")
                return
            except (errors.XstageError, self._ray.exceptions.RayError) as exc:
                entry.update(outcome="failed", error=f"{type(exc).__name__}: {exc}")
                self._shut(f"generation {gen + 1} failed to start: {entry['error']}")
                return
            entry["outcome"] = "serving"
            self._generation = gen + 1

    def _give_back(self) -> None:
        """The dead actor's holding goes back to its node's ledger (best effort)."""
        token, node = self._opened.get("holding"), self._opened["where"]["node_id"]
        if token is None:
            return
        try:
            from xstage.cluster._ray import NAMESPACE

            ledger = self._ray.get_actor(f"xstage-ledger-{node}", namespace=NAMESPACE)
            ledger.release_token.remote(token)
        except (ValueError, self._ray.exceptions.RayError):
            pass  # the node is gone, and its ledger with it

    def _shut(self, cause: str) -> None:
        self._closed = True
        self._closed_cause = cause

    # ------------------------------------------------------------------ state
    def _control(self, method: str, default: Any = None) -> Any:
        """Ask the live actor (``record``, ``health``, ``waits``); ``default`` when it is gone."""
        try:
            return self._ray.get(getattr(self._actor, method).options(
                concurrency_group="control").remote(), timeout=CONTROL_TIMEOUT_S)
        except (self._ray.exceptions.RayError, errors.XstageError):
            return default

    def health(self) -> dict[str, Any]:
        """As ``Stage.health()``, plus ``node`` and the node's own ``remote`` health."""
        with self._lock:
            with self._counts:
                dead = self._generation in self._dead
            remote = None if dead or self._closed else self._control("health")
            return {
                "state": "closed" if self._closed or remote is None else remote["state"],
                "generation": self._generation, "restarts": [dict(r) for r in self.restarts],
                "in_flight": self._in_flight,
                "proof_sha256": self._opened["record"]["worker"]["evidence_sha256"],
                "closed_cause": self._closed_cause, "node": self.node, "remote": remote}

    def waits(self) -> dict[str, Any]:
        """The node's ``Stage.waits()`` (empty once the actor is gone)."""
        return self._control("waits", {}) or {}

    def record(self, *, argv: Any = ()) -> dict[str, Any]:
        """The node's record whole, with ``argv``, the client's timings and ``cluster``."""
        with self._lock:
            with self._counts:
                alive = self._generation not in self._dead and not self._closed
            doc = dict((self._control("record") if alive else None) or self._opened["record"])
            place = self._placement
            doc["argv"] = list(argv)
            doc["request"] = {**doc["request"], "cluster": "ray",
                              "resources": dict(place.resources)}
            if self.timings is not None:
                doc["timings"] = dict(self.timings)
            doc["cluster"] = place.cluster_block(
                self._opened["where"], generation=self._generation,
                restarts=[dict(r) for r in self.restarts], closed_cause=self._closed_cause,
                ledger={"node_id": self._opened["where"]["node_id"],
                        "pool": self._opened.get("pool")})
            return doc

    def measure(self, *, runs: int = 20, warmup: int = 3, compare_cpu: bool = False,
                progress: Any = None,
                percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
        """Timed calls through Ray (round trip here; compute from the node's stamps).

        ``compare_cpu`` is not available through a cluster (the reference arm is the node's).

        Raises:
            UsageError: ``runs`` < 1, ``warmup`` < 0, or ``compare_cpu``.
        """
        if runs < 1 or warmup < 0:
            raise errors.UsageError("--runs must be >= 1 and --warmup >= 0")
        if compare_cpu:
            raise errors.UsageError("--compare-cpu does not cross to a cluster node",
                                    remedy="time the reference on the node itself")
        feeds = self.inputs
        for _ in range(warmup):
            self(feeds)
        compute, round_trip = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            fut = self.submit(feeds)
            fut.result()
            round_trip.append(time.perf_counter() - t0)
            stamps = fut.timing
            compute.append(max(0, stamps.get("end_ns", 0) - stamps.get("start_ns", 0)) / 1e9)
            if progress:
                progress(i + 1)
        self.timings = summarize(compute, round_trip, warmup=warmup, percentiles=percentiles)
        return self.timings

    # ------------------------------------------------------------------ closing
    def __enter__(self) -> ClusterStage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the node's stage, end its actor, write the record here (idempotent)."""
        with self._lock:
            if self._ended:
                return
            doc = self.record() if self.record_on_close else None
            self._closed = self._ended = True
            try:
                self._ray.get(self._actor.close.options(concurrency_group="control").remote(),
                              timeout=CONTROL_TIMEOUT_S)
            except self._ray.exceptions.RayError:
                self._give_back()
            self._ray.kill(self._actor)
            self._settler.shutdown(wait=False)
            if doc is not None:
                self._record_path = ""
                path = records_path(graph=self.artifact.path)
                self._record_path = str(write_record(doc, path))
