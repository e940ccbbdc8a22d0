"""``bisect``: find what a route's partitioner takes, with real probes, and say so in a record.

The steps, in order (docs/bisect.md has the user's view):

1. The artifact is read (``xstage.artifact``), its inputs resolved as ``external`` resolves
   them, and the graph loaded in its stable order (``xstage.bisect.graph``).
2. One run of the whole graph on onnxruntime's CPU EP keeps every value: the probes' inputs.
3. The plan (``xstage.planner``) pins one (route, device): the ``--route``, or the first
   candidate for ``--device``. Nothing to pin is a refusal of the whole bisect.
4. The search (``xstage.bisect.search``, pure) asks the prober (``xstage.bisect.probe``) about
   ranges; each probe is a region opened through ``xstage.open_stage``.
5. The record (``xstage.bisect.record``): regions with their shares, declined ops with the
   reason of the smallest declined probe that held them, the ranges not judged (a probe refused
   for another reason than the partitioner's, or failed), every probe, the contradictions, the
   budget. With ``out``, the split artifact is written (``xstage.bisect.split``) and run once on
   the captured inputs, its outputs checked against the whole graph's on the CPU by the numeric
   gate's rules (``xstage.parity``'s tiers, then ``xstage.stage.tiebreak``'s float64 tie-break
   and noise tier where the tight tier fails).

The exit code: 0 a region accepted and every probe judged; 2 no region and every probe judged;
1 a range not judged (the regions found are still written) or a failed split check. A search
cut short by ``max_probes`` or ``deadline`` is recorded (``budget.cut_short``), not an error.

.. versionadded:: 0.3
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors, parity
from xstage._version import __version__
from xstage.artifact import Artifact, inspect_artifact
from xstage.bisect import cost
from xstage.bisect.graph import BisectGraph, capture, load_graph
from xstage.bisect.probe import ProbeDetail, Prober
from xstage.bisect.record import KIND, SCHEMA_VERSION
from xstage.bisect.search import Outcome, Probe, SearchResult, search
from xstage.bisect.split import SplitRun, run_split, write_split
from xstage.client import Deadlines
from xstage.device_table import DeviceReport
from xstage.device_table import devices as device_report
from xstage.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_REFUSED
from xstage.inputs import SEED, resolve_feeds
from xstage.planner import make_plan
from xstage.record import utc_now
from xstage.signature import check_inputs
from xstage.snapshot import releasing
from xstage.stage import tiebreak

__all__ = ["BisectResult", "bisect"]


@dataclass(frozen=True)
class BisectResult:
    """What one bisect found.

    Attributes:
        graph: the graph in its stable order.
        search: the search's result (regions as ``(start, stop)``, every probe).
        record: the ``xstage.bisect`` record (``xstage.bisect.record`` validates and writes it).
        exit_code: 0 when a region was found (or the whole graph taken), 2 for no region, 1
            when a range was not judged or the split check failed (module docstring).
        split: the split artifact's check run, with ``out``; else None.
        route: the route every probe ran on.
        device: the device every probe ran on.
    """

    graph: BisectGraph
    search: SearchResult
    record: dict[str, Any]
    exit_code: int
    split: SplitRun | None
    route: str
    device: str

    @property
    def regions(self) -> tuple[tuple[int, int], ...]:
        """The accepted regions, ``(start, stop)`` in the graph's order."""
        return self.search.regions


def _check_limits(min_region: int, max_probes: int | None, deadline: float | None) -> None:
    """The search's limits, checked before anything runs.

    Raises:
        UsageError: ``min_region`` or ``max_probes`` below 1, or ``deadline`` not above 0.
    """
    if isinstance(min_region, bool) or not isinstance(min_region, int) or min_region < 1:
        raise errors.UsageError(f"--min-region {min_region} must be a whole number >= 1")
    if max_probes is not None and (isinstance(max_probes, bool) or not isinstance(max_probes, int)
                                   or max_probes < 1):
        raise errors.UsageError(f"--max-probes {max_probes} must be a whole number >= 1")
    if deadline is not None and not deadline > 0:
        raise errors.UsageError(f"--deadline {deadline} must be a number of seconds > 0")


@releasing  # the snapshots it read, once it is done
def bisect(
    graph: str | os.PathLike[str], *, route: str | None = None, device: str | None = None,
    fmt: str | None = None, inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None, dims: Mapping[str, int] | None = None,
    min_region: int = 1, max_probes: int | None = None, deadline: float | None = None,
    ep_options: Mapping[str, str] | None = None, threads: int | None = None,
    tolerance: float | Mapping[str, float] | None = None, graph_opt_level: str | None = None,
    deadlines: Deadlines | None = None, out: str | os.PathLike[str] | None = None,
    keep_probes: str | os.PathLike[str] | None = None, report: DeviceReport | None = None,
    on_probe: Callable[[int, int, Outcome], None] | None = None, argv: Sequence[str] = (),
) -> BisectResult:
    """Find the regions of ``graph`` that ``route`` (or ``device``'s first route) takes whole.

    See the module docstring for the steps. ``deadline`` (seconds) and ``max_probes`` are hard
    limits on the search; each probe keeps ``deadlines`` (``external``'s ``--timeout``).
    ``keep_probes`` names a folder to keep every probe's region graph in.

    Raises:
        UsageError: bad limits, a torch program, conflicting selectors, an ``out`` folder that
            is not empty.
        Refused: no (route, device) to probe on (the plan's refusals say why).
        ArtifactError: the graph cannot be read.
        InputError: the inputs do not run on the whole graph.
    """
    started, t0 = utc_now(), time.perf_counter()
    _check_limits(min_region, max_probes, deadline)
    if out is not None and Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise errors.UsageError(f"--out {out} exists and is not an empty folder",
                                remedy="name a new folder (nothing is overwritten)")
    art = inspect_artifact(graph, fmt=fmt)
    if art.runtime != "onnxruntime":
        raise errors.UsageError(f"bisect cuts ONNX graphs; {art.path.name} is {art.format}",
                                remedy="export the stage to ONNX (xstage export) and bisect that")
    feeds = check_inputs(resolve_feeds(art.inputs, inputs, shapes=shapes, dims=dims), art.inputs)
    g = load_graph(art.path, art.format)
    session = {"intra_op_num_threads": threads} if threads else {}
    values = capture(g, feeds, session)
    capture_s = time.perf_counter() - t0
    cuts = g.cuts(values)
    report = report or device_report()
    plan = make_plan(report, art.format, device=device, route=route)
    request = _request(route, device, min_region, max_probes, deadline, inputs, feeds)
    if not plan.candidates:  # nothing to probe on: a refusal of the whole bisect, with its record
        first = plan.refusals[0] if plan.refusals else None
        message = first.message if first else f"no route to probe {art.path.name} on"
        record = _record(argv, started, t0, capture_s, art, g, cuts, request, None, None,
                         {"status": "refused", "exit_code": EXIT_REFUSED, "message": message},
                         refusals=[r.to_dict() for r in plan.refusals])
        raise errors.Refused(message, refusals=list(plan.refusals),
                             remedy=first.remedy if first else None, record=record)
    cand = plan.candidates[0]
    work = Path(keep_probes) if keep_probes else Path(tempfile.mkdtemp(prefix="xstage-bisect-"))
    work.mkdir(parents=True, exist_ok=True)
    prober = Prober(g, values, route=cand.route.name, device=cand.device, workdir=work,
                    report=report, keep=bool(keep_probes), on_probe=on_probe,
                    options={"deadlines": deadlines, "ep_options": dict(ep_options or {}),
                             "threads": threads, "tolerance": tolerance,
                             "graph_opt_level": graph_opt_level})
    limit = time.monotonic() + deadline if deadline is not None else None
    try:
        found = search(len(g), prober, cuts=cuts, min_region=min_region, max_probes=max_probes,
                       expired=(lambda: time.monotonic() >= limit) if limit is not None else None)
    finally:
        if not keep_probes:
            shutil.rmtree(work, ignore_errors=True)
    costs = g.costs(values)
    split_doc: dict[str, Any] | None = None
    split_run: SplitRun | None = None
    if out is not None and found.regions:
        written = write_split(g, values, found.regions, out, route=cand.route.name,
                              device=cand.device, source_sha256=art.sha256)
        split_run = run_split(out, feeds, report=report, deadlines=deadlines,
                              ep_options=dict(ep_options or {}), threads=threads)
        split_doc = {"dir": str(out), "parts": [
            {"name": p["name"], "kind": p["kind"], "start": p["start"], "stop": p["stop"],
             "graph": p["graph"],
             "placed": next((r.proof.passed for r in split_run.parts
                             if r.name == p["name"] and r.proof is not None), None)}
            for p in written["parts"]],
            "check": _check_split(split_run, values, g, art, feeds)}
    outcome = _outcome(found, len(g), split_doc["check"] if split_doc else None)
    record = _record(argv, started, t0, capture_s, art, g, cuts, request,
                     {"route": cand.route.name, "device": cand.device}, found,
                     outcome, costs=costs, split=split_doc)
    return BisectResult(graph=g, search=found, record=record, exit_code=outcome["exit_code"],
                        split=split_run,
                        route=cand.route.name, device=cand.device)


def _request(route: str | None, device: str | None, min_region: int, max_probes: int | None,
             deadline: float | None, inputs: object,
             feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The record's ``request`` block: what the caller asked for."""
    return {"route": route, "device": device, "min_region": min_region,
            "max_probes": max_probes, "deadline_s": deadline,
            "inputs": {"source": "synthesized" if inputs is None else
                       ("npz" if isinstance(inputs, str | os.PathLike) else "caller"),
                       "seed": SEED if inputs is None else None,
                       "tensors": {n: {"dtype": str(a.dtype), "shape": list(a.shape)}
                                   for n, a in feeds.items()}}}


def _record(argv: Sequence[str], started: str, t0: float, capture_s: float, art: Artifact,
            g: BisectGraph, cuts: Sequence[int], request: dict[str, Any],
            target: dict[str, str] | None, found: SearchResult | None,
            outcome: dict[str, Any], *, costs: Sequence[cost.NodeCost] = (),
            split: dict[str, Any] | None = None,
            refusals: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``xstage.bisect`` record (schema ``bisect-v1.json``)."""
    probes = found.probes if found else ()
    doc = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "xstage_version": __version__,
        "argv": list(argv), "started": started, "finished": utc_now(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "python": sys.version.split()[0], "machine": platform.machine()},
        "outcome": outcome,
        "artifact": {"path": str(art.origin), "format": art.format, "sha256": art.sha256,
                     "nodes": len(g)},
        "request": request,
        "target": target,
        "order": {"nodes": len(g), "cuts": list(cuts), "qdq": g.qdq, "renamed": g.renamed,
                  "names": [n.name for n in g.nodes]},
        "regions": _regions(found, g, costs) if found else [],
        "declined_ops": _declined(found, g) if found else [],
        "not_judged": [_unjudged_doc(p) for p in found.unjudged] if found else [],
        "probes": [_probe_doc(p) for p in probes],
        "contradictions": [{"kind": c.kind, "probe": c.probe, "earlier": c.earlier}
                           for c in (found.contradictions if found else ())],
        "budget": {"probes": len(probes), "max_probes": request["max_probes"],
                   "seconds": round(time.perf_counter() - t0, 3),
                   "capture_s": round(capture_s, 3), "deadline_s": request["deadline_s"],
                   "cut_short": found.cut_short if found else None},
        "split": split,
    }
    if refusals is not None:
        doc["refusals"] = refusals
    return doc


def _outcome(found: SearchResult, n: int, check: Mapping[str, Any] | None) -> dict[str, Any]:
    """The outcome and its exit code (the module docstring's rule)."""
    found_doc = _found(found, n)
    if check is not None and not check["passed"]:
        return {"status": "split_check_failed", "exit_code": EXIT_ERROR,
                "message": f"{found_doc['message']}; the split's composed outputs failed the "
                           f"numeric gate against the whole graph on the CPU "
                           f"(max |diff| {check['max_abs_diff']})"}
    if found.unjudged:
        ranges = ", ".join(f"[{p.start}, {p.stop}) {p.outcome.verdict}" for p in found.unjudged)
        return {"status": "not_judged", "exit_code": EXIT_ERROR,
                "message": f"{found_doc['message']}; {len(found.unjudged)} range(s) not judged "
                           f"(refused for another reason than the partitioner's, or failed): "
                           f"{ranges}"}
    return found_doc


def _found(found: SearchResult, n: int) -> dict[str, Any]:
    short = {"max_probes": " (cut short by --max-probes)", "deadline": " (cut short by --deadline)",
             None: ""}[found.cut_short]
    if found.regions == ((0, n),) and len(found.probes) == 1:
        return {"status": "whole", "exit_code": EXIT_OK,
                "message": f"the route takes the whole graph ({n} nodes) in one probe"}
    if found.regions:
        covered = sum(b - a for a, b in found.regions)
        return {"status": "found", "exit_code": EXIT_OK,
                "message": f"{len(found.regions)} region(s) accepted, {covered} of {n} nodes, in "
                           f"{len(found.probes)} probes{short}"}
    return {"status": "no_region", "exit_code": EXIT_REFUSED,
            "message": f"no region of at least {found.min_region} node(s) was accepted in "
                       f"{len(found.probes)} probes{short}"}


def _regions(found: SearchResult, g: BisectGraph,
             costs: Sequence[cost.NodeCost]) -> list[dict[str, Any]]:
    out = []
    for start, stop in found.regions:
        probe = next(p.index for p in found.probes
                     if (p.start, p.stop) == (start, stop) and p.accepted)
        ops = Counter(n.op_type for n in g.nodes[start:stop])
        out.append({"start": start, "stop": stop, "first_node": g.nodes[start].name,
                    "last_node": g.nodes[stop - 1].name, "op_types": dict(sorted(ops.items())),
                    "shares": cost.shares(costs, start, stop).to_dict(), "probe": probe})
    return out


def _declined(found: SearchResult, g: BisectGraph) -> list[dict[str, Any]]:
    """Nodes in no region, by op type, with the reason of the smallest declined probe over them.

    A node whose smallest probe not accepted was not judged (a budget or gate refusal, an
    error) is not declined: its range is in the record's ``not_judged``.
    """
    covered = {i for a, b in found.regions for i in range(a, b)}
    by_op: dict[str, dict[str, Any]] = {}
    for node in g.nodes:
        if node.position in covered:
            continue
        held = [p for p in found.probes if not p.accepted and p.start <= node.position < p.stop]
        best = min(held, key=lambda p: (p.stop - p.start, p.index)) if held else None
        if best is not None and not best.judged:
            continue
        entry = by_op.setdefault(node.op_type, {"op_type": node.op_type, "nodes": [],
                                                "reason": None, "probe": None})
        entry["nodes"].append(node.name)
        if best is not None and (entry["probe"] is None or best.stop - best.start < _span(
                found, entry["probe"])):
            entry["reason"], entry["probe"] = best.outcome.reason, best.index
    return [by_op[k] for k in sorted(by_op)]


def _span(found: SearchResult, index: int) -> int:
    probe = found.probes[index]
    return probe.stop - probe.start


def _unjudged_doc(p: Probe) -> dict[str, Any]:
    """A range the search could not judge: its probe, and the refusal or error it ended in."""
    detail = p.outcome.detail if isinstance(p.outcome.detail, ProbeDetail) else None
    return {"start": p.start, "stop": p.stop, "probe": p.index, "verdict": p.outcome.verdict,
            "code": detail.code if detail else None, "cause": detail.cause if detail else None,
            "reason": p.outcome.reason}


def _probe_doc(p: Any) -> dict[str, Any]:
    detail = p.outcome.detail if isinstance(p.outcome.detail, ProbeDetail) else None
    return {"index": p.index, "start": p.start, "stop": p.stop, "phase": p.phase,
            "verdict": p.outcome.verdict, "accepted": p.accepted, "fact": p.outcome.fact,
            "reason": p.outcome.reason,
            "seconds": round(detail.seconds, 3) if detail else 0.0,
            "code": detail.code if detail else None, "cause": detail.cause if detail else None,
            "node_fraction": detail.node_fraction if detail else None,
            "off_target": {k: list(v) for k, v in detail.off_target.items()} if detail else {}}


def _check_split(run: SplitRun, values: Mapping[str, Any], g: BisectGraph, art: Artifact,
                 feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The composed split's outputs against the whole graph's on the CPU (the capture run).

    Judged by the numeric gate's rules: the format's tolerance (each output by its own format),
    and where that fails, the whole graph's float64 answer (the tie-break) or fp32's noise tier.
    """
    reference = {n: np.asarray(values[n]) for n in g.outputs}
    gate = parity.compare(run.outputs, reference, fmt=art.format, reference_kind="same_graph_cpu",
                          formats=art.output_formats)
    if not gate.passed:
        gate = tiebreak.settle(gate, art, feeds, run.outputs, reference)
    diffs = [float(np.max(np.abs(run.outputs[n].astype(np.float64) - reference[n].astype(np.float64))))
             for n in g.outputs if run.outputs[n].size and run.outputs[n].dtype.kind in "fiu"]
    tb = gate.tiebreak or {}
    return {"passed": gate.passed, "max_abs_diff": max(diffs) if diffs else None,
            "outputs": len(reference), "summary": gate.summary,
            "tier": (gate.tier or {}).get("decided", "default"),
            "tiebreak": tb.get("status")}
