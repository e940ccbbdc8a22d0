"""The numeric gate's two reference arms, behind one interface (``outputs``, ``time``).

* ONNX stages: the fp32 graph on onnxruntime's CPU EP, in this process (``OnnxReference``).
* torch stages: the fp32 program on ``torch-cpu``, in a worker (``TorchReference``). The
  client has no torch of its own (a torch is ~1 GB, and the route's interpreter already has
  one), so the reference runs in a ``torch-cpu`` worker, started when the gate needs it and
  closed at once.

It also reads, for a quantized (QDQ) artifact, which outputs a ``QuantizeLinear`` produced and
with what scale and zero point (:func:`quantized_outputs`): the gate compares those integers
dequantized.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors, parity
from xstage.artifact import Artifact, snapshot_graph
from xstage.client import Deadlines
from xstage.device_table import DeviceReport
from xstage.routes import reference_spec
from xstage.routes.launch import load_options, open_worker
from xstage.snapshot import release

__all__ = ["OnnxReference", "TorchReference", "make_reference", "quantized_outputs"]


class OnnxReference:
    """The reference arm: the fp32 graph on onnxruntime's CPU EP, in this process."""

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

    def precheck(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Run the reference now: inputs it cannot run fail before any worker starts.

        Its outputs are let go at once (the gate computes its own twice): kept, they held the
        stage's output bytes in the client for the whole open and the stage's life.
        """
        if self._outputs is None:
            with self.runner() as run:
                run(feeds)

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
    def runner(self) -> Iterator[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]]:
        """Calls in this arm's one session (the gate computes its inputs twice through it).

        Raises:
            InputError: the inputs do not run on the reference graph.
        """
        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            try:
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


class TorchReference:
    """The fp32 program on a ``torch-cpu`` worker, started per use and closed at once."""

    def __init__(self, report: DeviceReport, path: Path, kind: str,
                 output_names: Sequence[str]) -> None:
        self.path, self.kind = path, kind
        self.snapshot: Path | None = None  # a separate reference program's snapshot (make_reference)
        self._report = report
        self._names = list(output_names)
        self._outputs: dict[str, np.ndarray] | None = None

    def precheck(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Nothing to run early: the torch reference needs a worker.

        It starts when the gate needs it (after a candidate has run), so this arm never starts
        one for nothing.
        """

    def _worker(self, path: Path | None = None, deadlines: Deadlines | None = None,  # type: ignore[no-untyped-def]
                **extra: Any):
        status = self._report.route(reference_spec("torch").name)
        if not status.resolved:
            raise errors.RouteMissing(
                f"the numeric gate of a torch stage runs its fp32 program on torch-cpu, which "
                f"is missing here: {status.reason}",
                reason_code=status.reason_code.value if status.reason_code else "unknown",
                remedy=status.remedy or "set XSTAGE_PYTHON_TORCH_CPU to an interpreter with torch")
        client = open_worker(status, deadlines=deadlines)
        try:
            client.load(path or self.path, runtime="torch",
                        options={**load_options(status, output_names=self._names), **extra})
        except BaseException:
            client.close()
            raise
        return client

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fp32 program's outputs for ``feeds`` on torch-cpu, computed once."""
        if self._outputs is None:
            client = self._worker()
            try:
                self._outputs = client.run(feeds)
            finally:
                client.close()
        return self._outputs

    def call(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fp32 program's outputs for ``feeds``, not cached (a stateful stage's later calls)."""
        client = self._worker()
        try:
            return client.run(feeds)
        finally:
            client.close()

    @contextmanager
    def runner(self) -> Iterator[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]]:
        """Calls in one torch-cpu worker, closed after the block.

        The gate computes its inputs twice there, so a random generator runs on rather than
        starting again from its seed in a fresh worker.
        """
        client = self._worker()
        try:
            yield client.run
        finally:
            client.close()

    def float64_outputs(self, path: Path, feeds: Mapping[str, np.ndarray],
                        time_limit_s: float) -> dict[str, np.ndarray]:
        """The program at ``path`` run in float64 on torch-cpu (the gate's tie-break).

        Its parameters, buffers and constants are widened and its float inputs too; the worker
        fails the call, naming the op, where the program still computes a narrower float.

        Raises:
            RouteMissing: torch-cpu is not available here.
            WorkerRaised: the program cannot run in float64 (the message says why).
        """
        limit = Deadlines(load=time_limit_s, warmup=time_limit_s, call=time_limit_s)
        client = self._worker(path, limit, float64=True, profile=False)
        try:
            return client.run(feeds)
        finally:
            client.close()

    def time(self, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
        """Seconds per call of the torch-cpu worker, ``runs`` times after one warm call."""
        client = self._worker()
        try:
            client.run(feeds)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                client.run(feeds)
                times.append(time.perf_counter() - t0)
            return times
        finally:
            client.close()


def make_reference(art: Artifact, reference: str | os.PathLike[str], session: Mapping[str, Any],
                   report: DeviceReport) -> OnnxReference | TorchReference:
    """The reference arm for ``art``.

    ``auto`` takes the manifest's fp32 source where the artifact is not fp32 itself, else the
    same graph (or program) on the CPU. The arm reads a snapshot, never the user's files: the
    artifact's own (``art.path``), or one taken here of a separate reference graph (its
    ``snapshot`` names it; release it with ``xstage.snapshot.release`` when the arm is done).

    Raises:
        ArtifactError: an ONNX reference graph that does not load on onnxruntime's CPU EP, or
            a reference that cannot be read (or changed while it was copied).
    """
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
        arm: OnnxReference | TorchReference
        if art.format.startswith("pt:"):
            arm = TorchReference(report, path, "torch_cpu" if kind == "same_graph_cpu" else kind,
                                 [o.name for o in art.outputs])
        else:
            arm = OnnxReference(path, kind, session,
                                shown=snap.files[0].source if snap is not None else art.origin)
    except BaseException:
        if snap is not None:
            release(snap.folder)
        raise
    arm.snapshot = snap.folder if snap is not None else None
    return arm


def quantized_outputs(art: Artifact) -> dict[str, parity.QuantParams]:
    """The graph outputs of a quantized artifact that a ``QuantizeLinear`` produces.

    Each comes with that Q's scale, zero point and axis (for the gate's dequantized comparison).
    Empty for every format not in :data:`xstage.parity.QUANTIZED_FORMATS` (the graph is not
    read then), and for a Q whose scale or zero point is not a constant of the graph or that
    quantizes in blocks (``block_size``): those outputs stay compared exactly.
    """
    if art.format not in parity.QUANTIZED_FORMATS or art.format.startswith("pt:"):
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
