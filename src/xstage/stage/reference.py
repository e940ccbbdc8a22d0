"""The numeric gate's reference arms, behind one interface (``outputs``, ``runner``, ``time``).

* ONNX stages, by default: the fp32 graph on the ``ort-cpu`` route's worker
  (``OnnxWorkerReference``), started when the gate needs it and closed at once. The caller's
  process imports no onnxruntime and holds none of the graph's tensors (docs/memory.md, "The
  gate's transient reservations"). Its float64 tie-break runs in a child process of this
  interpreter (``xstage.stage.tiebreak.evaluate_in_child``).
* ONNX stages with ``reference_arm="in_process"``: the fp32 graph on onnxruntime's CPU EP in
  this process (``OnnxReference``), the tie-break here too: the session lives as long as the
  stage (the caller's onnxruntime and memory, in no budget).
* torch stages: the fp32 program on ``torch-cpu``, in a worker (``TorchReference``). The
  client has no torch of its own (a torch is ~1 GB, and the route's interpreter already has
  one), so the reference runs in a ``torch-cpu`` worker, started when the gate needs it and
  closed at once (``reference_arm`` does not apply).

A worker arm, and the tie-break's child, are charged to the ledger's host pool while they run:
a transient reservation (the route's footprint of the reference graph, ``xstage.ledger``),
taken before the worker starts and given back when it is closed; where it does not fit,
:class:`ReferenceOverBudget` says so and nothing starts.

It also reads, for a quantized (QDQ) artifact, which outputs a ``QuantizeLinear`` produced and
with what scale and zero point (:func:`quantized_outputs`): the gate compares those integers
dequantized.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors, parity
from xstage import ledger as ledger_mod
from xstage.artifact import Artifact, snapshot_graph
from xstage.client import Deadlines, WorkerClient
from xstage.device_table import DeviceReport
from xstage.ledger import footprint
from xstage.routes import reference_spec
from xstage.routes.launch import load_options, open_worker
from xstage.routes.status import RouteStatus
from xstage.snapshot import Snapshot, release

if TYPE_CHECKING:
    from xstage.ledger import Budget, Fit
    from xstage.stage.ledger import Ledger

__all__ = ["REFERENCE_ARMS", "OnnxReference", "OnnxWorkerReference", "ReferenceOverBudget",
           "TorchReference", "make_reference", "quantized_outputs", "transient"]

#: Where an ONNX stage's reference arm runs: ``worker`` (the default: the ort-cpu route's
#: worker, the tie-break in a child process) or ``in_process`` (this process's onnxruntime).
REFERENCE_ARMS = ("worker", "in_process")

Outputs = dict[str, np.ndarray]


class ReferenceOverBudget(errors.XstageError):
    """The reference arm's worker (or the tie-break's child) does not fit the ledger's host pool."""

    def __init__(self, what: str, fit: Fit, budget: Budget) -> None:
        """Name ``what`` did not fit, with the pool's figures (``fit``) and its ``budget``."""
        super().__init__(f"the numeric gate's {what} does not fit beside what the ledger holds: "
                         f"{fit.message()}", remedy=fit.remedy())
        self.fit, self.budget = fit, budget


@contextmanager
def transient(book: Ledger | None, held: Sequence[ledger_mod.Reservation], what: str) -> Iterator[None]:
    """Hold ``held`` (host-pool reservations) in ``book`` for the block, then give them back.

    Raises:
        ReferenceOverBudget: they do not fit; nothing is held.
    """
    if book is None:
        yield
        return
    budget = ledger_mod.make_budget(held, pool=ledger_mod.HOST_POOL)
    holding, fit = book.reserve(budget, f"the numeric gate's {what}")
    if holding is None:
        raise ReferenceOverBudget(what, fit, budget)
    try:
        yield
    finally:
        book.release(holding)


class OnnxReference:
    """The reference arm in this process (``reference_arm="in_process"``).

    The fp32 graph on onnxruntime's CPU EP, its session alive as long as the arm (the stage's
    setup holds it): the caller's onnxruntime and memory, in no budget.
    """

    def __init__(self, path: Path, kind: str, session_opts: Mapping[str, Any],
                 shown: Path | None = None) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3  # onnxruntime's warnings are not the user's business here
        if session_opts.get("intra_op_num_threads"):
            so.intra_op_num_threads = int(session_opts["intra_op_num_threads"])
        if session_opts.get("graph_optimization_level"):
            so.graph_optimization_level = getattr(
                ort.GraphOptimizationLevel, session_opts["graph_optimization_level"])
        self.path, self.kind = path, kind
        self.snapshot: Path | None = None  # a separate reference graph's snapshot (make_reference)
        try:
            self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise errors.ArtifactError(
                f"the reference graph {shown or path} does not load on onnxruntime's CPU EP: {exc}",
                remedy="check the graph (or --reference)") from exc
        self.names = [o.name for o in self.session.get_outputs()]
        self._outputs: dict[str, np.ndarray] | None = None

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The reference outputs for ``feeds``, computed once.

        Raises:
            InputError: the inputs do not run on the reference graph.
        """
        if self._outputs is None:
            try:
                values = self.session.run(self.names, dict(feeds))
            except Exception as exc:
                raise errors.InputError(f"the inputs do not run on the reference graph: {exc}",
                                        remedy="check input names, dtypes and shapes") from exc
            self._outputs = dict(zip(self.names, values, strict=True))
        return self._outputs

    def call(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The reference outputs for ``feeds``, not cached (a stateful stage's later calls)."""
        return dict(zip(self.names, self.session.run(self.names, dict(feeds)), strict=True))

    @contextmanager
    def runner(self) -> Iterator[Callable[..., dict[str, np.ndarray]]]:
        """Calls in this arm's one session (the gate computes its inputs twice through it).

        Raises:
            InputError: the inputs do not run on the reference graph.
        """
        def run(feeds: Mapping[str, np.ndarray], views: bool = False) -> dict[str, np.ndarray]:
            try:  # owned arrays either way (``views``: the worker arm's read-in-place)
                return self.call(feeds)
            except Exception as exc:
                raise errors.InputError(f"the inputs do not run on the reference graph: {exc}",
                                        remedy="check input names, dtypes and shapes") from exc

        yield run

    def time(self, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
        """Seconds per run of the reference, ``runs`` times (for ``--compare-cpu``)."""
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            self.session.run(self.names, dict(feeds))
            times.append(time.perf_counter() - t0)
        return times


class _WorkerArm:
    """What the worker arms share: the route's worker, started per use and charged to the ledger.

    ``report`` is the device table the route is found in (None: ``xstage.devices()``);
    ``deadlines`` the stage's per-phase deadlines (a worker's first call is its warm-up);
    ``footprint_of`` is the reference graph as the ledger sizes it (the artifact itself, or the
    separate reference graph's snapshot), ``shapes`` the gate's input shapes.
    """

    runtime = "onnxruntime"

    def __init__(self, report: DeviceReport | None, path: Path, kind: str,
                 output_names: Sequence[str], *, footprint_of: Artifact | None = None,
                 shapes: Mapping[str, tuple[int, ...]] | None = None,
                 ledger: Ledger | None = None, session: Mapping[str, Any] | None = None,
                 deadlines: Deadlines | None = None) -> None:
        self.path, self.kind = path, kind
        self.snapshot: Path | None = None  # a separate reference graph's snapshot (make_reference)
        self._report = report
        self._names = list(output_names)
        self._footprint, self._shapes = footprint_of, dict(shapes or {})
        self._ledger, self._session = ledger, dict(session or {})
        self._deadlines = deadlines
        self._outputs: Outputs | None = None

    def _status(self) -> RouteStatus:
        """The reference arm's route as the device table resolved it.

        Raises:
            RouteMissing: it is not resolved here.
        """
        from xstage.device_table import devices

        status = (self._report or devices()).route(reference_spec(self.runtime).name)
        if not status.resolved:
            what = "fp32 program on torch-cpu" if self.runtime == "torch" else \
                "fp32 graph on the ort-cpu route's worker"
            env = "XSTAGE_PYTHON_TORCH_CPU" if self.runtime == "torch" else "XSTAGE_PYTHON_ORT_CPU"
            raise errors.RouteMissing(
                f"the numeric gate of this stage runs its {what}, which is missing here: "
                f"{status.reason}",
                reason_code=status.reason_code.value if status.reason_code else "unknown",
                remedy=status.remedy or f"set {env} to an interpreter with {self.runtime}")
        return status

    def _held(self, status: RouteStatus) -> list[ledger_mod.Reservation]:
        """The reference worker's reservations in the host pool (the route's footprint)."""
        if self._footprint is None:
            return []
        return footprint.reservations(self._footprint, status.spec.memory_cost(status.versions),
                                      ledger_mod.HOST_POOL, self._shapes, route=status.name)

    def _options(self, status: RouteStatus) -> dict[str, Any]:
        return load_options(status, session=self._session, output_names=self._names)

    @contextmanager
    def _worker(self, path: Path | None = None, deadlines: Deadlines | None = None,
                **extra: Any) -> Iterator[WorkerClient]:
        """One reference worker for the block, held in the ledger while it lives.

        Raises:
            RouteMissing: the route is missing here.
            ReferenceOverBudget: its footprint does not fit the host pool.
        """
        status = self._status()
        with transient(self._ledger, self._held(status), f"reference arm ({status.name} worker)"):
            client = open_worker(status, deadlines=deadlines or self._deadlines)
            try:
                options = {**self._options(status), **extra}
                client.load(path or self.path, runtime=options.get("runtime", "ort"),
                            options=options)
                yield client
            finally:
                client.close()

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> Outputs:
        """The reference outputs for ``feeds``, computed once."""
        if self._outputs is None:
            with self._worker() as client:
                self._outputs = client.run(feeds, phase="warmup")
        return self._outputs

    def call(self, feeds: Mapping[str, np.ndarray]) -> Outputs:
        """The reference outputs for ``feeds``, not cached (a stateful stage's later calls)."""
        with self._worker() as client:
            return client.run(feeds, phase="warmup")

    @contextmanager
    def runner(self) -> Iterator[Callable[..., Outputs]]:
        """Calls in one reference worker, closed after the block.

        The gate computes its inputs twice there, so a random generator runs on rather than
        starting again from its seed in a fresh worker.
        """
        with self._worker() as client:
            calls = 0

            def run(feeds: Mapping[str, np.ndarray], views: bool = False) -> Outputs:
                """``views``: read-only views of the region's slots, valid until the next call."""
                nonlocal calls
                calls += 1  # the worker's first call is its warm-up (its deadline)
                return client.run(feeds, phase="warmup" if calls == 1 else "call", views=views)

            yield run

    def time(self, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
        """Seconds per call of a fresh reference worker, ``runs`` times after one warm call.

        For ``Stage.measure(compare_cpu=True)``; the worker is charged to the ledger meanwhile.
        """
        with self._worker() as client:
            client.run(feeds, phase="warmup")
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                client.run(feeds)
                times.append(time.perf_counter() - t0)
            return times


class OnnxWorkerReference(_WorkerArm):
    """The reference arm: the fp32 graph on the ``ort-cpu`` route's worker (the default).

    Its tie-break (:meth:`exact_outputs`) runs in a child process of this interpreter.
    """

    def __init__(self, report: DeviceReport | None, path: Path, kind: str, *,
                 shown: Path | None = None, **kwargs: Any) -> None:
        super().__init__(report, path, kind, (), **kwargs)
        self._shown = shown or path

    @contextmanager
    def _worker(self, path: Path | None = None, deadlines: Deadlines | None = None,
                **extra: Any) -> Iterator[WorkerClient]:
        """The route's worker, its load and call failures said as the in-process arm says them."""
        loading = True
        try:
            with super()._worker(path, deadlines, **extra) as client:
                loading = False
                yield client
        except errors.WorkerRaised as exc:
            if loading:
                raise errors.ArtifactError(
                    f"the reference graph {self._shown} does not load on onnxruntime's CPU EP: "
                    f"{exc.message}", remedy="check the graph (or --reference)") from exc
            raise errors.InputError(f"the inputs do not run on the reference graph: {exc.message}",
                                    remedy="check input names, dtypes and shapes") from exc

    def exact_outputs(self, path: Path, feeds: Mapping[str, np.ndarray],
                      graph_bytes: int) -> Outputs:
        """The tie-break: ``path`` in float64 in a child process, charged to the ledger meanwhile.

        Raises:
            Unavailable: as ``tiebreak.evaluate_in_child``, or its child does not fit the pool.
        """
        from xstage.stage import tiebreak

        try:
            with transient(self._ledger, tiebreak.child_reservations(graph_bytes),
                           "float64 tie-break (a child process)"):
                return tiebreak.evaluate_in_child(path, feeds, graph_bytes=graph_bytes)
        except ReferenceOverBudget as exc:
            raise tiebreak.Unavailable(str(exc), "memory") from exc


class TorchReference(_WorkerArm):
    """The fp32 program on a ``torch-cpu`` worker, started per use and closed at once.

    ``open_stage`` does not run it before the candidates (as it does an ONNX reference): a torch
    worker starts only when a gate needs it, after a candidate has run, never for nothing.
    """

    runtime = "torch"

    def _options(self, status: RouteStatus) -> dict[str, Any]:
        return load_options(status, output_names=self._names)

    def float64_outputs(self, path: Path, feeds: Mapping[str, np.ndarray],
                        time_limit_s: float) -> Outputs:
        """The program at ``path`` run in float64 on torch-cpu (the gate's tie-break).

        Its parameters, buffers and constants are widened and its float inputs too; the worker
        fails the call, naming the op, where the program still computes a narrower float.

        Raises:
            RouteMissing: torch-cpu is not available here.
            WorkerRaised: the program cannot run in float64 (the message says why).
            Unavailable: the worker does not fit the ledger's host pool.
        """
        from xstage.stage import tiebreak

        limit = Deadlines(load=time_limit_s, warmup=time_limit_s, call=time_limit_s)
        try:
            with self._worker(path, limit, float64=True, profile=False) as client:
                return client.run(feeds)
        except ReferenceOverBudget as exc:
            raise tiebreak.Unavailable(str(exc), "memory") from exc


def make_reference(art: Artifact, reference: str | os.PathLike[str], session: Mapping[str, Any],
                   report: DeviceReport | None, *, where: str = "worker", ledger: Ledger | None = None,
                   shapes: Mapping[str, tuple[int, ...]] | None = None,
                   deadlines: Deadlines | None = None,
                   ) -> OnnxReference | OnnxWorkerReference | TorchReference:
    """The reference arm for ``art``.

    ``auto`` takes the manifest's fp32 source where the artifact is not fp32 itself, else the
    same graph (or program) on the CPU. The arm reads a snapshot, never the user's files: the
    artifact's own (``art.path``), or one taken here of a separate reference graph (its
    ``snapshot`` names it; release it with ``xstage.snapshot.release`` when the arm is done).

    ``where``: one of :data:`REFERENCE_ARMS` (an ONNX stage's; a torch program's reference is
    always a worker). A worker arm charges ``ledger`` (None: nothing charged) for the route's
    footprint of the reference graph at input ``shapes`` while it runs, and its worker has the
    stage's ``deadlines``.

    Raises:
        UsageError: ``where`` is not one of :data:`REFERENCE_ARMS`.
        ArtifactError: an in-process ONNX reference graph that does not load on onnxruntime's
            CPU EP, or a reference that cannot be read (or changed while it was copied).
    """
    if where not in REFERENCE_ARMS:
        raise errors.UsageError(f"reference_arm={where!r} is not one of {', '.join(REFERENCE_ARMS)}",
                                remedy="worker (the default) or in_process")
    if reference == "auto":
        source = art.manifest.get("fp32_source")
        if source and art.format != "onnx:fp32":
            given, kind = (art.origin.parent / source), "fp32_source"
        else:
            given, kind = None, "same_graph_cpu"
    else:
        given, kind = Path(reference), "user"
    snap = snapshot_graph(given) if given is not None else None
    path = snap.graph if snap is not None else art.path
    try:
        arm: OnnxReference | OnnxWorkerReference | TorchReference
        sized = {"footprint_of": _sized(art, snap), "shapes": shapes, "ledger": ledger,
             "deadlines": deadlines}
        if art.runtime == "torch":
            arm = TorchReference(report, path, "torch_cpu" if kind == "same_graph_cpu" else kind,
                                 [o.name for o in art.outputs], **sized)
        elif where == "in_process":
            arm = OnnxReference(path, kind, session,
                                shown=snap.files[0].source if snap is not None else art.origin)
        else:
            arm = OnnxWorkerReference(report, path, kind, session=session,
                                      shown=snap.files[0].source if snap is not None else art.origin,
                                      **sized)
    except BaseException:
        if snap is not None:
            release(snap.folder)
        raise
    arm.snapshot = snap.folder if snap is not None else None
    return arm


def _sized(art: Artifact, snap: Snapshot | None) -> Artifact:
    """The reference graph as the ledger sizes it: the artifact, or the separate graph's snapshot.

    A separate graph: its files and bytes, as an fp32 graph or program, the artifact's signature.
    """
    if snap is None:
        return art
    return replace(art, path=snap.graph, format="pt:fp32" if art.runtime == "torch"
                   else "onnx:fp32", format_source="reference", sha256=snap.sha256,
                   bytes=snap.bytes, snapshot=None, origin=snap.files[0].source,
                   files=tuple({"path": str(f.source), "sha256": f.sha256, "bytes": f.bytes}
                               for f in snap.files))


def quantized_outputs(art: Artifact) -> dict[str, parity.QuantParams]:
    """The graph outputs of a quantized artifact that a ``QuantizeLinear`` produces.

    Each comes with that Q's scale, zero point and axis (for the gate's dequantized comparison).
    Empty for every format not in :data:`xstage.parity.QUANTIZED_FORMATS` (the graph is not
    read then), and for a Q whose scale or zero point is not a constant of the graph or that
    quantizes in blocks (``block_size``): those outputs stay compared exactly.
    """
    if art.format not in parity.QUANTIZED_FORMATS or art.runtime == "torch":
        return {}
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(art.path), load_external_data=False).graph
    consts: dict[str, Any] = {}
    for init in graph.initializer:
        consts[init.name] = init
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                consts[node.output[0]] = value
    producers = {out: node for node in graph.node for out in node.output}
    found: dict[str, parity.QuantParams] = {}
    for output in graph.output:
        node = producers.get(output.name)
        if node is None or node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        scale = consts.get(node.input[1]) if len(node.input) > 1 else None
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zp = consts.get(zp_name) if zp_name else None
        if attrs.get("block_size") or scale is None or (zp_name and zp is None):
            continue
        try:
            scale_a = numpy_helper.to_array(scale)
            zp_a = numpy_helper.to_array(zp) if zp is not None else np.zeros((), np.uint8)
        except Exception:  # external data not loaded, or a type numpy cannot hold
            continue
        found[output.name] = {"scale": scale_a, "zero_point": zp_a, "axis": int(attrs.get("axis", 1)),
                              "node": node.name or f"QuantizeLinear→{output.name}"}
    return found
