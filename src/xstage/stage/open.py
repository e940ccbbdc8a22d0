"""``open_stage``: the candidate loop — a ``Stage`` only when the evidence says yes.

Everything the candidates share is resolved once, before any worker starts (the artifact, the
checked inputs, the reference arm, the plan); then each candidate goes through
``xstage.stage.admit`` in plan order. The first admission becomes the ``Stage``; every refusal
is kept, and with ``--prefer``, ``--offload`` or no selector the next candidate is tried. When
none is admitted, ``Refused`` carries every refusal and the record. docs/architecture.md lists
the modules one artifact passes through, in order.

``open_stage``'s arguments: where (``device``, ``prefer`` — devices in order —, a pinned
``route``, or ``offload``: every resolved route but the reference arm first, in plan order, and
the reference arm last); the proof's bar (``min_placement``); the gate's (``tolerance``: a
number, relative L2, or ``xstage.parity.CRITERIA`` names to values, each replacing that
criterion's default, tighter or looser); ``depth``: requests in flight at once
(``Stage.submit``, ``Stage.map``; docs/serving.md); ``restart``: ``"never"`` or ``"on_death"``
(a dead worker is replaced by generation n+1, proven and gated again; at most ``max_restarts``
in ``restart_window`` seconds); ``record_on_close``: ``Stage.close()`` writes the stage's
record under ``XSTAGE_HOME/records``; ``cluster="ray"`` with ``resources``: the stage on a Ray
node that has them, opened there by that node's ``open_stage`` (a ``ClusterStage``; a node free
within ``placement_timeout`` seconds, else refused; docs/cluster.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.artifact import Artifact, graph_nodes, inspect_artifact
from xstage.client import Deadlines
from xstage.cluster import open_on_cluster
from xstage.device_table import DeviceReport
from xstage.device_table import devices as device_report
from xstage.inputs import resolve_feeds
from xstage.planner import Candidate, Plan, check_ep_options, make_plan
from xstage.record.build import build_record
from xstage.record.io import utc_now
from xstage.refusal import Refusal
from xstage.signature import check_inputs
from xstage.snapshot import release
from xstage.stage import refusals
from xstage.stage.admit import Admission, Setup, attempt
from xstage.stage.gate import reference_runs
from xstage.stage.handle import Stage
from xstage.stage.ledger import Ledger
from xstage.stage.reference import OnnxReference, ReferenceOverBudget, TorchReference, make_reference
from xstage.stage.request import MAX_DEPTH, Resolved, StageRequest, describe_feeds
from xstage.stage.state import declared_state, initial_values

__all__ = ["MAX_DEPTH", "open_request", "open_stage"]


def open_stage(
    artifact: str | os.PathLike[str], *, device: str | None = None,
    prefer: Sequence[str] | None = None, route: str | None = None, offload: bool = False,
    min_placement: float = 0.5, tolerance: float | Mapping[str, float] | None = None,
    reference: str | os.PathLike[str] = "auto", reference_arm: str = "worker",
    inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None, dims: Mapping[str, int] | None = None,
    fmt: str | None = None, component: str | None = None,
    ep_options: Mapping[str, str] | None = None, threads: int | None = None,
    graph_opt_level: str | None = None, session_config: Mapping[str, str] | None = None,
    deadlines: Deadlines | None = None,
    report: DeviceReport | None = None, ledger: Ledger | None = None,
    on_event: Callable[[str], None] | None = None, depth: int = 2, concurrency: int = 1,
    restart: str = "never",
    max_restarts: int = 3, restart_window: float = 60.0, record_on_close: bool = True,
    cluster: str | None = None, resources: Mapping[str, float] | None = None, placement_timeout: float = 60.0,
) -> Stage:
    """Open ``artifact`` where the plan and the evidence allow, and return the admitted stage.

    Each candidate of the plan goes through the gates in order (budget, start, profiled
    warm-up, proof, numeric gate, measured peak); the first one admitted becomes the stage.
    With no ``device``, ``prefer`` or ``route`` the plan is an offload: every resolved route
    but the reference arm first, the reference arm last (docs/external.md, "The plan").

    Args:
        artifact: the stage's graph: an ``.onnx`` (its external-data files beside it) or a
            ``.pt2`` torch program.
        device: require this device id or class (``cpu``, ``npu``, ``gpu_discrete:nvidia``);
            never substituted. An unknown class is a ``UsageError``.
        prefer: device ids or classes to try in order, falling through on refusal.
        route: pin one route (``ort-openvino``, ``ort-cpu`` for the reference arm itself, …).
        offload: the offload explicitly (what no selector does); with a selector, a
            ``UsageError``.
        min_placement: the fraction of the nodes and of the kernel time the target must both
            take for ``placed`` (0 to 1).
        tolerance: the numeric gate: a number (relative L2), or ``xstage.parity.CRITERIA``
            names to values, each replacing that criterion's default.
        reference: the graph the gate compares against: ``"auto"`` (the fp32 source the
            manifest names, else the artifact itself) or a path.
        reference_arm: where an ONNX stage's reference runs: ``"worker"`` (the ort-cpu route's
            worker, charged to the ledger's host pool while the gate runs, and the float64
            tie-break in a child process; nothing of it stays in this process) or
            ``"in_process"`` (onnxruntime in this process, for the stage's life, in no budget).
            A torch program's reference is always a torch-cpu worker.
        inputs: the warm-up's and the gate's inputs: a mapping of input name to array, an
            ``.npz`` path, or None (synthesized from the signature, seeded).
        shapes: the shape of a synthesized input, by input name.
        dims: the size of a symbolic dimension, by its name.
        fmt: the artifact's declared format (``onnx:fp32``, ``onnx:fp16``, ``onnx:a16w8``,
            ``pt:fp32``, ``pt:fp16``); inferred when None, checked against the graph when given.
        component: the stage's name in the record (inferred from the manifest or file name).
        ep_options: execution provider options, over the route's hook's own.
        threads: intra-op threads for both arms (None: the runtime's default).
        graph_opt_level: onnxruntime's graph optimization level (``ORT_ENABLE_ALL``, …).
        session_config: onnxruntime session config entries for the worker's session
            (``{"session.intra_op.allow_spinning": "0"}``; onnxruntime's ``perf_test -C``);
            the reference arm's session is built as always (docs/throughput.md, "Session
            config").
        deadlines: per-phase worker deadlines (spawn, hello, load, warm-up, call, shutdown).
        report: the device table to plan against (default: ``xstage.devices()``, cached).
        ledger: the memory ledger the stage is budgeted in (default: the process-wide one);
            a pool it names must be one of this machine's.
        on_event: called with one line per step (what ``--verbose`` prints).
        depth: requests in flight at once (``Stage.submit``, ``Stage.map``), 1 to 64.
        concurrency: of those, how many the worker computes at once, 1 to ``depth``: threads
            over the one session where the runtime can (onnxruntime); one at a time for a stage
            with state or a runtime that cannot (``Stage.concurrency`` says what was granted).
        restart: ``"never"`` or ``"on_death"`` (a dead worker is replaced by the next
            generation, proven and gated again).
        max_restarts: with ``"on_death"``, the most restarts within ``restart_window``.
        restart_window: the window of ``max_restarts``, in seconds.
        record_on_close: ``Stage.close()`` writes the stage's record under
            ``XSTAGE_HOME/records``.
        cluster: ``"ray"``: open the stage on a Ray node that has ``resources``
            (docs/cluster.md); None: here.
        resources: the Ray resources the node must have, with ``cluster``.
        placement_timeout: seconds to wait for a node with the resources to be free.

    Returns:
        The admitted ``Stage`` (a ``ClusterStage`` with ``cluster``): call it with a mapping of
        input name to array.

    Raises:
        Refused: every candidate was refused (``.refusals``, ``.record``).
        UsageError: conflicting selectors, bad shapes or dims.
        ArtifactError: the graph (or reference) cannot be read or loaded.
        InputError: inputs that do not match the stage.
        WorkerError: a worker died or timed out (it is not a refusal: exit 1).
    """
    return open_request(StageRequest.build(
        artifact, device=device, prefer=prefer, route=route, offload=offload,
        min_placement=min_placement, tolerance=tolerance, reference=reference,
        reference_arm=reference_arm, inputs=inputs, shapes=shapes, dims=dims, fmt=fmt,
        component=component, ep_options=ep_options, threads=threads,
        graph_opt_level=graph_opt_level, session_config=session_config, deadlines=deadlines,
        report=report, ledger=ledger,
        on_event=on_event, depth=depth, concurrency=concurrency, restart=restart,
        max_restarts=max_restarts, restart_window=restart_window,
        record_on_close=record_on_close, cluster=cluster, resources=resources,
        placement_timeout=placement_timeout))


def open_request(request: StageRequest) -> Stage:
    """``open_stage`` for a request already built (``StageRequest.build``: the CLI's path too).

    Raises:
        Refused, UsageError, ArtifactError, InputError, WorkerError: as ``open_stage``.
    """
    if request.cluster is not None:  # the node's own open_stage decides there (docs/cluster.md)
        return open_on_cluster(open_stage, request)
    started = utc_now()
    art: Artifact | None = None
    resolved = Resolved()  # what the record says was found, as far as it got
    held: list[Path] = []  # the snapshots this stage reads (released on failure, or at close)
    try:
        art = inspect_artifact(request.artifact, fmt=request.fmt, component=request.component)
        held += [art.snapshot.folder] if art.snapshot is not None else []
        if request.session_config and art.runtime == "torch":
            raise errors.UsageError(
                f"--session-config entries are onnxruntime's, and {Path(request.artifact).name} "
                "is a torch program (a torch route runs it)",
                remedy="leave --session-config out for a .pt2 (docs/throughput.md, \"Session config\")")
        nodes = graph_nodes(art)
        feeds, pairs, init = _feeds_and_state(art, request)
        resolved = Resolved(tensors=describe_feeds(feeds))
        report = request.report or device_report()
        _check_pools(request.ledger, report)
        plan = make_plan(report, art.format, device=request.device, prefer=request.prefer,
                         route=request.route, offload=request.offload)
        check_ep_options(plan, request.ep_option_map(), pinned=request.route is not None)
        ref = _reference_arm(art, request, report, {**feeds, **init})
        held += [ref.snapshot] if ref.snapshot is not None else []
        resolved = Resolved(resolved.tensors, _arm_name(ref))
        first = _reference_first(ref, feeds, pairs, init) if plan.candidates else None
        setup = Setup(request=request, resolved=resolved, artifact=art, feeds=feeds,
                      reference=ref, nodes=nodes,
                      devices=tuple(row.device for row in report.devices), started=started,
                      depth=1 if pairs else request.depth,  # state carries from call to call
                      concurrency=1 if pairs else request.concurrency,
                      state=pairs, state_init=init, report=report, snapshots=tuple(held),
                      reference_calls=first)
        return _first_admitted(plan, setup, request.on_event or _quiet)
    except BaseException as exc:
        _release(held)
        if isinstance(exc, errors.XstageError) and not isinstance(exc, errors.UsageError | errors.Refused):
            exc.record = build_record(argv=(), started=started, request=request.to_record(resolved),
                                      status="error", error=exc, artifact=art)  # an error's record
        raise


def _reference_arm(art: Artifact, request: StageRequest, report: DeviceReport,
                   inputs: Mapping[str, np.ndarray]) -> Any:
    """The gate's reference arm, built before any candidate starts (at ``inputs``' shapes).

    A plan with no candidate is refused as planned: the caller runs no reference call for it.
    """
    book = request.ledger if request.ledger is not None else Ledger.default()
    return make_reference(art, request.reference, request.reference_session_options(), report,
                          where=request.reference_arm, ledger=book,
                          shapes={n: tuple(a.shape) for n, a in inputs.items()},
                          deadlines=request.deadlines)


def _arm_name(ref: Any) -> str:
    """Where the reference runs, as the record's request names it."""
    return "in_process" if isinstance(ref, OnnxReference) else "worker"


def _reference_first(ref: Any, feeds: Mapping[str, np.ndarray], pairs: Any,
                     init: Mapping[str, np.ndarray]) -> Any:
    """An ONNX stage's reference calls for the gate, computed before any candidate starts.

    They do not depend on the candidate, so the reference arm runs once, alone (its worker
    charged to the host pool, then closed), and inputs it cannot run fail before any worker of
    a candidate starts. None for a torch program (its torch-cpu worker starts only when a gate
    needs it) and where the reference worker does not fit the pool now: the gate runs it beside
    the candidate's worker then, and its budget is checked again there.

    Raises:
        ArtifactError: the reference graph does not load on onnxruntime's CPU EP.
        InputError: the inputs do not run on it.
    """
    if isinstance(ref, TorchReference):
        return None
    try:
        return reference_runs(ref, feeds, pairs, init)
    except ReferenceOverBudget:
        return None


def _release(held: Sequence[Path]) -> None:
    """The snapshots a stage that did not open was reading: eviction may take them again."""
    for folder in held:
        release(folder)


def _check_pools(ledger: Ledger | None, report: DeviceReport) -> None:
    """A pool the ledger was given a capacity for must be one of this machine's pools.

    Raises:
        UsageError: an unknown pool (``--pool nopool=1GiB``), naming the known ones.
    """
    if ledger is None:
        return
    known = [p["name"] for p in report.pools()]
    unknown = [name for name in ledger.named_pools if name not in known]
    if unknown:
        raise errors.UsageError(f"unknown memory pool {unknown[0]!r}",
                                remedy=f"pools here: {', '.join(known) or 'none'} (xstage devices "
                                "lists them)")


def _feeds_and_state(art: Artifact, request: StageRequest) -> tuple[dict[str, np.ndarray], Any, Any]:
    """The caller's inputs, resolved and checked, and the state pairs with their initial values.

    Big-endian inputs are converted once, for both arms; a state pair's input is the worker's
    to keep, not the caller's to give.
    """
    pairs = declared_state(art)
    held = {p.input for p in pairs}
    declared = [spec for spec in art.inputs if spec.name not in held]
    feeds = resolve_feeds(declared, request.input_value, shapes=dict(request.shapes),
                          dims=dict(request.dims))
    return check_inputs(feeds, declared), pairs, initial_values(pairs, art)


def _first_admitted(plan: Plan, setup: Setup, say: Callable[[str], None]) -> Stage:
    """Try the plan's candidates in order; the first admission is the stage."""
    tried: list[tuple[Candidate, str, Refusal | None]] = []
    refused: list[Refusal] = list(plan.refusals)
    detail: Mapping[str, Any] | None = None  # the last warmed-up candidate's (a refused record's)
    request = setup.request
    for cand in plan.candidates:
        say(f"trying {cand.route.name} on {cand.device}")
        tries = attempt(cand, setup, say)
        detail = tries.detail if tries.detail is not None else detail
        outcome = tries.outcome
        if isinstance(outcome, Admission):
            tried.append((cand, "chosen", None))
            return Stage(outcome, plan=plan, tried=tried, say=say, restart=request.restart,
                         max_restarts=request.max_restarts,
                         restart_window=request.restart_window,
                         record_on_close=request.record_on_close)
        refused.append(outcome)
        tried.append((cand, "refused", outcome))
        say(f"refused: {outcome.message}")
        if not plan.fall_through:
            break
    last_ledger = next((r.evidence["ledger"] for r in reversed(refused) if "ledger" in r.evidence),
                       None)
    attested = next((r.evidence["device_attestation"] for r in reversed(refused)
                     if "device_attestation" in r.evidence), None)
    last = refused[-1].evidence if refused else {}
    record = build_record(argv=(), started=setup.started,
                          request=request.to_record(setup.resolved), status="refused",
                          refusals=refused, artifact=setup.artifact, plan=plan, tried=tried,
                          ledger=last_ledger, device_attestation=attested, detail=detail,
                          # a stage refused for its peak was placed and gated: both verdicts stay
                          proof=_block(last, "proof"), parity_doc=_block(last, "parity"))
    raise refusals.refused(refused, setup.artifact, record)


def _block(evidence: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """The last refusal's proof or gate verdict where it carries one (a gate or peak refusal)."""
    value = evidence.get(key)
    return value if isinstance(value, Mapping) else None


def _quiet(_message: str) -> None:
    """The default ``on_event``: say nothing."""
