"""``open_stage``: plan, start, prove, gate — and a ``Stage`` only when the evidence says yes.

A stage is admitted when one profiled warm-up shows it ran where it was asked (the proof, from
``evidence``) and computed what the reference computes (the gate, from ``parity``). Every
candidate that fails either test is closed and kept as a refusal; with ``--prefer`` (or no
selector) the next one is tried. Inputs are checked before any worker starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors, evidence, parity
from xstage import ledger as ledger_mod
from xstage.artifact import Artifact, inspect_artifact
from xstage.client import Deadlines
from xstage.device_table import DeviceReport
from xstage.device_table import devices as device_report
from xstage.evidence.torch import prove_torch
from xstage.inputs import SEED, resolve_feeds
from xstage.ledger import footprint
from xstage.planner import Candidate, make_plan
from xstage.record import utc_now
from xstage.record.build import build_record
from xstage.refusal import Refusal, RefusalCode
from xstage.routes.launch import load_options, open_worker
from xstage.signature import check_inputs
from xstage.stage.handle import Stage
from xstage.stage.ledger import Ledger
from xstage.stage.reference import OnnxReference, TorchReference

__all__ = ["open_stage"]


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
        ref = OnnxReference(ref_path, ref_kind, session_opts)
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
            footprint.reservations(art, cand.route.spec.memory_cost(cand.route.versions), pool,
                                   shapes, route=cand.route.name), pool=pool)
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
