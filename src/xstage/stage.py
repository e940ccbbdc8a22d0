"""``open_stage``: plan, start, prove, gate — and a ``Stage`` only when the evidence says yes.

A stage is admitted when one profiled warm-up shows it ran where it was asked (the proof, from
``evidence``) and computed what the reference computes (the gate, from ``parity``). Every
candidate that fails either test is closed and kept as a refusal; with ``--prefer`` (or no
selector) the next one is tried. Inputs are checked before any worker starts.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors, evidence, footprint, parity
from xstage import ledger as ledger_mod
from xstage._version import __version__
from xstage.artifact import Artifact, inspect_artifact
from xstage.client import Deadlines, WorkerClient
from xstage.device_table import DeviceReport
from xstage.device_table import devices as device_report
from xstage.evidence_torch import prove_torch
from xstage.inputs import SEED, resolve_feeds
from xstage.launch import load_options, open_worker
from xstage.ledger_state import Holding, Ledger
from xstage.planner import Candidate, Plan, make_plan
from xstage.record import SCHEMA_VERSION, host_block, utc_now
from xstage.reference_torch import TorchReference
from xstage.refusal import Refusal, RefusalCode
from xstage.signature import check_inputs
from xstage.timings import summarize

__all__ = ["Stage", "build_record", "open_stage"]

class _Reference:
    """The reference arm: the fp32 graph on onnxruntime's CPU EP, in this process."""

    def __init__(self, path: Path, kind: str, session_opts: Mapping[str, Any]) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3  # onnxruntime's warnings are not the user's business here
        if session_opts.get("intra_op_num_threads"):
            so.intra_op_num_threads = int(session_opts["intra_op_num_threads"])
        if session_opts.get("graph_optimization_level"):
            so.graph_optimization_level = getattr(
                ort.GraphOptimizationLevel, session_opts["graph_optimization_level"])
        self.path, self.kind = path, kind
        try:
            self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise errors.ArtifactError(
                f"the reference graph {path} does not load on onnxruntime's CPU EP: {exc}",
                remedy="check the graph (or --reference)") from exc
        self.names = [o.name for o in self.session.get_outputs()]
        self._outputs: dict[str, np.ndarray] | None = None

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._outputs is None:
            try:
                values = self.session.run(self.names, dict(feeds))
            except Exception as exc:
                raise errors.InputError(f"the inputs do not run on the reference graph: {exc}",
                                        remedy="check input names, dtypes and shapes") from exc
            self._outputs = dict(zip(self.names, values, strict=True))
        return self._outputs

    def time(self, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            self.session.run(self.names, dict(feeds))
            times.append(time.perf_counter() - t0)
        return times


def build_record(
    *,
    argv: Sequence[str],
    started: str,
    request: Mapping[str, Any],
    status: str,
    exit_code: int,
    refusals: Sequence[Refusal] = (),
    error: BaseException | None = None,
    artifact: Artifact | None = None,
    plan: Plan | None = None,
    tried: Sequence[tuple[Candidate, str, Refusal | None]] = (),
    worker: Mapping[str, Any] | None = None,
    proof: Mapping[str, Any] | None = None,
    parity_doc: Mapping[str, Any] | None = None,
    timings: Mapping[str, Any] | None = None,
    memory: Mapping[str, Any] | None = None,
    ledger: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The versioned record every ``external`` run writes, placed, refused or failed."""
    candidates = []
    seen = set()
    for cand, outcome, refusal in tried:
        seen.add((cand.device, cand.route.name))
        candidates.append({"device": cand.device, "route": cand.route.name, "status": outcome,
                           "refusal": refusal.to_dict() if refusal else None})
    if plan is not None:
        for cand in plan.candidates:
            if (cand.device, cand.route.name) not in seen:
                candidates.append({"device": cand.device, "route": cand.route.name,
                                   "status": "not_tried", "refusal": None})
        for refusal in plan.refusals:
            if refusal.route is None or refusal.device is None:
                continue  # not a (device, route) pair: it stands in outcome.refusals alone
            candidates.append({"device": refusal.device, "route": refusal.route,
                               "status": "refused", "refusal": refusal.to_dict()})
    chosen = next(({"device": c.device, "route": c.route.name} for c, o, _ in tried
                   if o == "chosen"), None)
    err = None
    if error is not None:
        err = {"type": type(error).__name__, "message": getattr(error, "message", str(error)),
               "remedy": getattr(error, "remedy", None)}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "xstage.external",
        "xstage_version": __version__,
        "argv": list(argv),
        "started": started,
        "finished": utc_now(),
        "host": host_block(),
        "outcome": {"status": status, "exit_code": exit_code,
                    "refusals": [r.to_dict() for r in refusals], "error": err},
        "artifact": artifact.to_dict() if artifact else None,
        "request": dict(request),
        "plan": None if plan is None and not tried else {"chosen": chosen, "candidates": candidates},
        "worker": dict(worker) if worker else None,
        "proof": dict(proof) if proof else None,
        "parity": dict(parity_doc) if parity_doc else None,
        "timings": dict(timings) if timings else None,
        "memory": dict(memory) if memory else None,
        "ledger": dict(ledger) if ledger else None,
    }


class Stage:
    """An admitted stage: call it like a function; it knows where it ran and how well.

    Calls are serialized by the worker client's lock. After the worker dies every call
    raises ``StageClosed``; ``close()`` is idempotent and the stage is a context manager.
    """

    def __init__(self, *, client: WorkerClient, candidate: Candidate, artifact: Artifact,
                 plan: Plan, tried: list[tuple[Candidate, str, Refusal | None]],
                 proof: evidence.PlacementProof, parity_result: parity.Parity,
                 reference: _Reference, feeds: Mapping[str, np.ndarray],
                 request: Mapping[str, Any], started: str, notes: Sequence[str],
                 ledger: Ledger, holding: Holding, ledger_doc: dict[str, Any],
                 evidence_digest: str | None = None) -> None:
        self._client = client
        self._evidence_digest = evidence_digest
        self.candidate = candidate
        self.artifact = artifact
        self.plan = plan
        self.proof = proof
        self.parity = parity_result
        self.timings: dict[str, Any] | None = None
        self.notes = list(notes)
        self._tried = tried
        self._reference = reference
        self._feeds = feeds
        self._request = dict(request)
        self._started = started
        self._lock = threading.Lock()
        self._ledger = ledger
        self._holding: Holding | None = holding
        #: What the ledger holds for this stage while it is open.
        self.budget: ledger_mod.Budget = holding.budget
        self._ledger_doc = ledger_doc
        #: Things that went wrong after admission and did not stop the stage (a call whose
        #: peak passed the budget); they go into the record.
        self.warnings: list[str] = []

    @property
    def device(self) -> str:
        return self.candidate.device

    @property
    def route(self) -> str:
        return self.candidate.route.name

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by name in graph order; a dtype or shape mismatch raises ``InputError``."""
        return self._run(inputs)

    def _run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        try:
            out = self._client.run(inputs)
        except (errors.WorkerDied, errors.StageClosed):
            self._ledger.release(self._holding)  # its memory went with its worker
            self._holding = None
            raise
        peak = self._client.last_timing.get("peak")
        limit = self._ledger_doc["budget_bytes"]
        if peak and peak > limit and not self.warnings:
            self.warnings.append(
                f"a call's peak {ledger_mod.format_bytes(peak)} passed the budget of "
                f"{ledger_mod.format_bytes(limit)} (the stage was not stopped)")
        return out

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()
        self._ledger.release(self._holding)
        self._holding = None

    def measure(self, *, runs: int = 20, warmup: int = 3, compare_cpu: bool = False,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Unprofiled warm-ups, then ``runs`` timed calls on the checked inputs."""
        if runs < 1 or warmup < 0:
            raise errors.UsageError("--runs must be >= 1 and --warmup >= 0")
        for _ in range(warmup):
            self._run(self._feeds)
        compute, round_trip = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            self._run(self._feeds)
            round_trip.append(time.perf_counter() - t0)
            compute.append(self._client.last_timing.get("worker_ns", 0) / 1e9)
            if progress:
                progress(i + 1)
        ref = self._reference.time(self._feeds, runs) if compare_cpu else None
        self.timings = summarize(compute, round_trip, warmup=warmup, reference_s=ref)
        self._request.update(runs=runs, warmup=warmup)
        return self.timings

    def record(self, *, argv: Sequence[str] = ()) -> dict[str, Any]:
        """The record of this stage so far (validated and written by ``xstage.record``)."""
        hello = self._client.hello or {}
        timing = self._client.last_timing
        return build_record(
            argv=argv, started=self._started, request=self._request, status="placed",
            exit_code=0, artifact=self.artifact, plan=self.plan, tried=self._tried,
            worker={"route": self.route, "interpreter": self._client.interpreter,
                    "hello": hello, "log": str(self._client.log_path) if self._client.log_path else None,
                    "notes": self.notes,
                    "runtime": dict((self._client.loaded or {}).get("info") or {}),
                    "evidence_sha256": self._evidence_digest},
            proof=self.proof.to_dict(), parity_doc=self.parity.to_dict(), timings=self.timings,
            memory={"rss_bytes": timing.get("rss"), "peak_bytes": timing.get("peak")},
            ledger={**self._ledger_doc, "warnings": list(self.warnings)},
        )


def _graph_nodes(path: Path) -> list[dict[str, str]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    out: list[dict[str, str]] = []

    def walk(graph: Any) -> None:
        for node in graph.node:
            out.append({"name": node.name, "op_type": node.op_type})
            for attr in node.attribute:
                if attr.g and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return out


def open_stage(
    artifact: str | os.PathLike[str],
    *,
    device: str | None = None,
    prefer: Sequence[str] | None = None,
    route: str | None = None,
    min_placement: float = 0.5,
    inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] = "auto",
    tolerance: float | None = None,
    ep_options: Mapping[str, str] | None = None,
    threads: int | None = None,
    graph_opt_level: str | None = None,
    fmt: str | None = None,
    component: str | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, int] | None = None,
    deadlines: Deadlines | None = None,
    report: DeviceReport | None = None,
    on_event: Callable[[str], None] | None = None,
    ledger: Ledger | None = None,
) -> Stage:
    """Open ``artifact`` where the plan and the evidence allow; see the module docstring.

    Raises:
        Refused: every candidate was refused (``.refusals``, ``.record``).
        UsageError: conflicting selectors, bad shapes or dims.
        ArtifactError: the graph (or reference) cannot be read or loaded.
        InputError: inputs that do not match the stage.
        WorkerError: a worker died or timed out (it is not a refusal: exit 1).
    """
    say = on_event or (lambda _msg: None)
    started = utc_now()
    if not 0.0 <= min_placement <= 1.0:
        raise errors.UsageError(f"--min-placement {min_placement} is outside [0, 1]")
    art = inspect_artifact(artifact, fmt=fmt, component=component)
    session_opts: dict[str, Any] = {}
    if threads:
        session_opts["intra_op_num_threads"] = threads
    if graph_opt_level:
        session_opts["graph_optimization_level"] = graph_opt_level
    feeds = resolve_feeds(art.inputs, inputs, shapes=shapes, dims=dims)
    if reference == "auto":
        source = art.manifest.get("fp32_source")
        if source and art.format != "onnx:fp32":
            ref_path, ref_kind = (art.path.parent / source).resolve(), "fp32_source"
        else:
            ref_path, ref_kind = art.path, "same_graph_cpu"
    else:
        ref_path, ref_kind = Path(reference), "user"
    request = {"device": device, "prefer": list(prefer) if prefer else None, "route": route,
               "min_placement": min_placement, "tolerance": tolerance,
               "ep_options": dict(ep_options or {}), "threads": threads,
               "graph_opt_level": graph_opt_level, "runs": 0, "warmup": 0,
               "inputs": {
                   "source": "synthesized" if inputs is None else (
                       "npz" if isinstance(inputs, str | os.PathLike) else "caller"),
                   "path": str(inputs) if isinstance(inputs, str | os.PathLike) else None,
                   "seed": SEED if inputs is None else None,
                   "tensors": {n: {"dtype": str(a.dtype), "shape": list(a.shape)}
                               for n, a in feeds.items()}}}
    check_inputs(feeds, art.inputs)
    is_torch = art.format.startswith("pt:")
    report = report or device_report()
    ref: Any
    ref_out: dict[str, np.ndarray] | None
    if is_torch:  # the fp32 program on torch-cpu, in a worker, once a candidate has run
        ref = TorchReference(report, ref_path, "torch_cpu" if ref_kind == "same_graph_cpu"
                             else ref_kind, [o.name for o in art.outputs])
        ref_kind, ref_out = ref.kind, None
    else:
        ref = _Reference(ref_path, ref_kind, session_opts)
        ref_out = ref.outputs(feeds)  # bad inputs fail here, before any worker starts
    plan = make_plan(report, art.format, device=device, prefer=prefer, route=route)
    tried: list[tuple[Candidate, str, Refusal | None]] = []
    refusals: list[Refusal] = list(plan.refusals)
    nodes = [] if is_torch else _graph_nodes(art.path)
    book = ledger if ledger is not None else Ledger.default()
    rows = [row.device for row in report.devices]
    shapes = {name: tuple(arr.shape) for name, arr in feeds.items()}
    last_ledger: dict[str, Any] | None = None
    for cand in plan.candidates:
        say(f"trying {cand.route.name} on {cand.device}")
        row = report.device(cand.device)
        pool = row.device.pool if row else ledger_mod.HOST_POOL
        kind = row.device.kind if row else "cpu"
        budget = ledger_mod.make_budget(
            footprint.reservations(art, cand.route.name, pool, shapes,
                                   versions=cand.route.versions), pool=pool)
        holding, fit = book.reserve(budget, f"{art.path.name} on {cand.device} ({cand.route.name})",
                                    rows)
        spots = ledger_mod.blind_spots(kind, pool)
        if holding is None:  # before any worker starts
            last_ledger = ledger_mod.record_block(budget, fit, None, spots=spots)
            refusal = Refusal(
                code=RefusalCode.BUDGET_EXCEEDS_DEVICE, cause=fit.cause or "over_budget",
                device=cand.device, route=cand.route.name,
                message=f"{cand.route.name} on {cand.device}: {fit.message()}",
                remedy=fit.remedy(), evidence={"ledger": last_ledger})
            refusals.append(refusal)
            tried.append((cand, "refused", refusal))
            say(f"refused: {refusal.message}")
            if not plan.fall_through:
                break
            continue
        options = load_options(cand.route, device=cand.device, ep_options=ep_options,
                               session=session_opts, fmt=art.format, profile=True,
                               output_names=[o.name for o in art.outputs])
        try:
            client = open_worker(cand.route, deadlines=deadlines)
        except BaseException:
            book.release(holding)
            raise
        try:
            client.load(art.path, runtime=options.get("runtime", "ort"), options=options)
            outputs = client.run(feeds, phase="warmup")
            warm = dict(client.last_timing)
            info, profile = client.evidence()
            client.fit_region({**feeds, **outputs})  # symbolic dims: slots sized from real ones
        except errors.WorkerRaised as exc:
            log = client.log_path
            client.close()
            book.release(holding)
            if is_torch:
                saved_by = (art.manifest.get("exporter") or {}).get("torch", "an unknown torch")
                remedy = (f"the program was saved by torch {saved_by}; export it with the torch "
                          f"this route runs (see docs/torch.md for what loads where); the full "
                          f"message is in the worker log {log}")
            else:
                remedy = ("check the graph loads in that route's onnxruntime "
                          f"({client.hello and client.hello['worker']['versions'].get('onnxruntime')}); "
                          f"the full message is in the worker log {log}")
            raise errors.ArtifactError(
                f"{cand.route.name} could not load or run {art.path.name}: "
                f"{_first_line(exc.message)}", remedy=remedy) from exc
        except BaseException:
            client.close()
            book.release(holding)
            raise
        if is_torch:
            proof = prove_torch(ops=info.get("ops"), output_devices=info.get("output_devices"),
                                target_device=options["device"], min_placement=min_placement,
                                torch_version=info.get("torch"), kernels=info.get("kernels"))
        else:
            proof = _prove_onnx(options, info, profile, nodes, min_placement)
        refusal = None
        gate = None
        # Who ran it, with the digest of what the proof rests on: in every refusal from here.
        ran = {"hello": client.hello, "runtime": dict((client.loaded or {}).get("info") or {}),
               "evidence_sha256": _digest(info, profile)}
        if proof.verdict != "placed":
            refusal = Refusal(
                code=RefusalCode.EP_DECLINED, cause=proof.cause or "unmeasured",
                device=cand.device, route=cand.route.name,
                message=_declined_message(proof, cand),
                remedy=_declined_remedy(proof),
                evidence={**proof.to_dict(), "worker": ran})
        else:
            if ref_out is None:
                try:
                    ref_out = ref.outputs(feeds)
                except BaseException:
                    client.close()
                    book.release(holding)
                    raise
            gate = parity.compare(outputs, ref_out, fmt=art.format, reference_kind=ref_kind,
                                  tolerance=tolerance)
            if gate.verdict != "passed":
                refusal = Refusal(
                    code=RefusalCode.NUMERIC_GATE_FAILED, cause=gate.cause or "tolerance",
                    device=cand.device, route=cand.route.name,
                    message=f"{cand.route.name} on {cand.device} ran the stage and disagreed "
                    f"with the {ref_kind.replace('_', ' ')} reference: {gate.summary}",
                    remedy="look at the decided criterion; for OpenVINO check the precision "
                    "hint; --tolerance F relaxes the relative criterion when the difference "
                    "is expected",
                    evidence={"parity": gate.to_dict(), "proof": proof.to_dict(), "worker": ran})
        if refusal is None:
            memory = info.get("memory") if isinstance(info.get("memory"), dict) else {}
            peak = _measured_peak(pool, warm, memory, info)
            measured = ledger_mod.check_measured(budget.budget_bytes, peak)
            last_ledger = ledger_mod.record_block(budget, fit, measured, memory=memory, spots=spots)
            if measured.cause:
                refusal = Refusal(
                    code=RefusalCode.BUDGET_EXCEEDS_DEVICE, cause=measured.cause,
                    device=cand.device, route=cand.route.name,
                    message=f"{cand.route.name} on {cand.device}: {measured.message()}",
                    remedy=_budget_remedy(measured),
                    evidence={"ledger": last_ledger, "worker": ran})
        if refusal is not None:
            refusals.append(refusal)
            tried.append((cand, "refused", refusal))
            client.close()
            book.release(holding)
            say(f"refused: {refusal.message}")
            if not plan.fall_through:
                break
            continue
        assert gate is not None and last_ledger is not None
        tried.append((cand, "chosen", None))
        return Stage(client=client, candidate=cand, artifact=art, plan=plan, tried=tried,
                     proof=proof, parity_result=gate, reference=ref, feeds=feeds,
                     request=request, started=started, notes=options.get("notes", []),
                     ledger=book, holding=holding, ledger_doc=last_ledger,
                     evidence_digest=ran["evidence_sha256"])
    record = build_record(argv=(), started=started, request=request, status="refused",
                          exit_code=2, refusals=refusals, artifact=art, plan=plan, tried=tried,
                          ledger=last_ledger)
    raise errors.Refused(
        _refused_message(refusals, art), refusals=refusals, record=record,
        remedy=refusals[-1].remedy if refusals else "xstage devices shows what this machine has")


def _digest(info: Mapping[str, Any], profile: bytes | None) -> str:
    """sha256 of the evidence the proof rests on (the worker's info and its profile)."""
    import hashlib
    import json

    h = hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode())
    h.update(b"\0" + (profile or b""))
    return h.hexdigest()


def _prove_onnx(options: Mapping[str, Any], info: Mapping[str, Any], profile: bytes | None,
                nodes: list[dict[str, str]], min_placement: float) -> evidence.PlacementProof:
    return evidence.prove(
        target_ep=options["ep"]["name"], requested_ep=info.get("requested_ep"),
        session_providers=info.get("session_providers") or [],
        available_providers=info.get("available_providers") or [],
        profile_text=profile.decode("utf-8", "replace") if profile else None,
        assignment=info.get("assignment") if isinstance(info.get("assignment"), list) else None,
        fallback_banner=info.get("fallback_banner"), graph_nodes=nodes,
        min_placement=min_placement, ort_version=info.get("onnxruntime"))


def _measured_peak(pool: str, warm: Mapping[str, Any], memory: Mapping[str, Any],
                   info: Mapping[str, Any]) -> int | None:
    """The worker's peak for the budget's pool: its own high-water mark for host RAM (after
    the warm-up, which covers the load), the device's peak where the runtime reports one."""
    if pool != ledger_mod.HOST_POOL:
        device = info.get("device_memory")
        value = device.get("peak") if isinstance(device, dict) else None
        return int(value) if isinstance(value, int) and value > 0 else None
    values = [v for v in (warm.get("peak"), memory.get("peak")) if isinstance(v, int) and v > 0]
    return max(values) if values else None


def _budget_remedy(measured: ledger_mod.Measured) -> str:
    if measured.cause == "peak_unreported":
        return ("this route's worker does not report the memory of its pool; nothing can confirm "
                "the budget (see docs/memory.md for what each route reports)")
    return ("the stage holds more than its estimate: report the record (the reservations show "
            "what was expected), or run it with a smaller input")


def _first_line(text: str, limit: int = 240) -> str:
    """A runtime's multi-line message cut to the line that names the cause.

    onnxruntime and OpenVINO stack their context (source paths, C++ signatures, "Exception
    from src/…") above the cause, which comes last ("CPU plug-in doesn't support …").
    """
    lines = [re.sub(r"\s+", " ", ln).strip() for ln in text.splitlines() if ln.strip()]
    noise = re.compile(r"^(Exception from |Check '.*' failed at )|\.(cc|cpp|h):\d+|::")
    useful = [ln for ln in lines if not noise.search(ln)]
    line = useful[-1] if useful else (lines[0] if lines else text.strip())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _declined_message(proof: evidence.PlacementProof, cand: Candidate) -> str:
    where = f"{cand.route.name} on {cand.device}"
    if proof.cause == "provider_swapped":
        return (f"{where}: the session does not hold {proof.target_ep} "
                f"(it holds {', '.join(proof.session_providers) or 'nothing'})")
    if proof.cause == "unmeasured":
        return f"{where}: no usable placement evidence (unmeasured never passes)"
    frac = proof.fraction or 0.0
    left = ", ".join(f"{op}×{len(names)}" for op, names in sorted(proof.cpu_nodes.items()))
    return (f"{where}: {proof.target_ep} took {frac:.1%} by {proof.basis} "
            f"(needs {proof.min_placement:.1%}); left on the CPU: {left or 'nothing'}")


def _declined_remedy(proof: evidence.PlacementProof) -> str:
    if proof.cause == "provider_swapped":
        return "the EP is not in that build or failed to initialise: see the worker log and xstage devices"
    if proof.cause == "unmeasured":
        return "the profile could not be read; see the worker log (profiling must be allowed)"
    return ("lower --min-placement to accept the split, or change the graph so the EP takes the "
            "ops it left on the CPU")


def _refused_message(refusals: Sequence[Refusal], art: Artifact) -> str:
    if not refusals:
        return f"no device here can run {art.path.name}"
    last = refusals[-1]
    more = f" ({len(refusals) - 1} more in the record)" if len(refusals) > 1 else ""
    return f"{last.code.value} ({last.cause}): {last.message}{more}"
