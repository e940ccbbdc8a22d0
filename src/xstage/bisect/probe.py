"""One probe: a region of the graph opened as a stage, with the proof and gate of ``external``.

A probe writes the region ``[start, stop)`` as its own graph (``xstage.bisect.graph``) and hands
it to ``xstage.open_stage`` on the one pinned (route, device), with ``min_placement`` 1.0 and the
region's inputs taken from the capture run: the same admission as ``xstage external`` (budget,
worker, profiled warm-up, proof, attestation, numeric gate, measured peak), no second path. An
admitted stage is closed at once; the probe keeps its verdict and what it rests on.

The verdict of a probe is one word: ``accepted``; else the refusal's cause (``declined``,
``ep_compile_failed``, ``unmeasured``, …, with ``gate_`` before a numeric gate's cause and
``budget_`` before a budget's); ``format_mismatch`` when the region fails the parent's format
check; ``error`` when its worker failed (died, timed out, could not load the region).

Only a refusal coded ``execution_provider_declined_graph`` is the partitioner's answer, a
*declined* range; every other refusal (the budget, the numeric gate, no exported graph) and
every error leaves the range *not judged* (``Outcome.judged`` False, docs/bisect.md).

.. versionadded:: 0.3
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.bisect.graph import BisectGraph
from xstage.bisect.search import Outcome
from xstage.device_table import DeviceReport
from xstage.refusal import Refusal, RefusalCode
from xstage.stage import open_stage

__all__ = ["ProbeDetail", "Prober"]


@dataclass(frozen=True)
class ProbeDetail:
    """What one probe rests on, for the record.

    Attributes:
        seconds: the probe's wall time (write, start, warm up, prove, gate, close).
        code: the refusal code, or None when accepted or failed.
        cause: the refusal's cause, or None.
        node_fraction: the proof's node fraction on the target, when measured.
        off_target: the ops the target left off, by op type (node names).
        graph: the region's graph file (kept only with ``--keep-probes``), or None.
    """

    seconds: float
    code: str | None
    cause: str | None
    node_fraction: float | None
    off_target: Mapping[str, tuple[str, ...]]
    graph: str | None


class Prober:
    """The oracle the search asks: ``prober(start, stop)`` → :class:`Outcome`.

    Args:
        graph: the graph in its stable order.
        values: the capture run's values (the regions' inputs come from them).
        route: the pinned route's name.
        device: the pinned device.
        workdir: where region graphs are written (each removed after its probe unless
            ``keep``).
        report: the device table, read once for every probe.
        options: further ``open_stage`` keyword arguments (``ep_options``, ``threads``,
            ``tolerance``, ``deadlines``, ``graph_opt_level``).
        keep: keep each probe's region graph.
        on_probe: called after each probe with its range and outcome.
    """

    def __init__(self, graph: BisectGraph, values: Mapping[str, Any], *, route: str, device: str,
                 workdir: Path, report: DeviceReport, options: Mapping[str, Any],
                 keep: bool = False,
                 on_probe: Callable[[int, int, Outcome], None] | None = None) -> None:
        self.graph, self.values = graph, values
        self.route, self.device, self.workdir, self.report = route, device, workdir, report
        self.options, self.keep, self.on_probe = dict(options), keep, on_probe
        self.count = 0

    def __call__(self, start: int, stop: int) -> Outcome:
        """Probe ``[start, stop)``; never raises for the region's own failures (they are verdicts)."""
        self.count += 1
        path = self.workdir / f"probe-{self.count:04d}-{start}-{stop}.onnx"
        t0 = time.perf_counter()
        inputs, _ = self.graph.write_region(start, stop, path, self.values)
        feeds = {name: np.asarray(self.values[name]) for name in inputs}
        try:
            outcome = self._open(path, feeds, t0)
        finally:
            if not self.keep:
                path.unlink(missing_ok=True)
        if self.on_probe is not None:
            self.on_probe(start, stop, outcome)
        return outcome

    def _open(self, path: Path, feeds: Mapping[str, np.ndarray], t0: float) -> Outcome:
        kept = str(path) if self.keep else None
        try:
            stage = open_stage(path, route=self.route, device=self.device, min_placement=1.0,
                               inputs=feeds, fmt=self.graph.fmt, report=self.report,
                               deadlines=self.options.get("deadlines"),
                               ep_options=self.options.get("ep_options"),
                               threads=self.options.get("threads"),
                               tolerance=self.options.get("tolerance"),
                               graph_opt_level=self.options.get("graph_opt_level"))
        except errors.Refused as refused:
            return self._refused(refused, time.perf_counter() - t0, kept)
        except errors.UsageError as exc:  # the region fails the parent's format check
            detail = ProbeDetail(time.perf_counter() - t0, None, None, None, {}, kept)
            return Outcome(False, "format_mismatch", exc.message, None, detail, judged=False)
        except (errors.WorkerError, errors.ArtifactError, errors.InputError) as exc:
            detail = ProbeDetail(time.perf_counter() - t0, None, None, None, {}, kept)
            return Outcome(False, "error", exc.message, None, detail, judged=False)
        with stage:
            proof = stage.proof
        detail = ProbeDetail(time.perf_counter() - t0, None, None, proof.node_fraction, {}, kept)
        return Outcome(True, "accepted", None, frozenset(), detail)

    def _refused(self, refused: errors.Refused, seconds: float, kept: str | None) -> Outcome:
        refusal: Refusal = refused.refusals[-1]
        evidence = refusal.evidence or {}
        proof = evidence.get("proof") if isinstance(evidence.get("proof"), dict) else evidence
        off: dict[str, list[str]] = {}
        for by_op in (proof.get("off_target_nodes") or {}).values():
            for op, names in (by_op or {}).items():
                off.setdefault(op, []).extend(names)
        positions = frozenset(self.graph.position[n] for names in off.values() for n in names
                              if n in self.graph.position)
        verdict = {RefusalCode.NUMERIC_GATE_FAILED: f"gate_{refusal.cause}",
                   RefusalCode.BUDGET_EXCEEDS_DEVICE: f"budget_{refusal.cause}"}.get(
                       refusal.code, refusal.cause)
        fraction = proof.get("node_fraction")
        detail = ProbeDetail(seconds, refusal.code.value, refusal.cause,
                             float(fraction) if isinstance(fraction, (int, float)) else None,
                             {op: tuple(sorted(set(names))) for op, names in sorted(off.items())},
                             kept)
        measured = isinstance(fraction, (int, float))  # the plan (or execution) said per node
        return Outcome(False, verdict, refusal.message, positions if measured else None, detail,
                       judged=refusal.code is RefusalCode.EP_DECLINED)
