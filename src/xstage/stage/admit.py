"""``admit``: one candidate through every gate — an ``Admission``, or the ``Refusal`` that stopped it.

The gates, in order (each one's verdict comes from a pure module; this module only runs them):

1. **Budget** (``xstage.ledger``): the stage's reservations must fit its pool *before* a worker
   starts; the hold is taken atomically in the shared ``Ledger``.
2. **Start and warm up** (``xstage.routes.launch``, ``xstage.client``): the route's worker loads
   the artifact and runs it in one profiled call (an ONNX worker runs it four times: the proof
   times runs 2-4); everything the proof rests on is collected then.
3. **Proof** (``xstage.evidence``): the stage ran where it was asked — on the planned EP
   (``evidence.onnx``/``evidence.torch``) and on the planned device
   (``evidence.attestation``: conflict case (c), ``device_mismatch``; unattested off the CPU,
   ``unmeasured``).
4. **Numeric gate** (``xstage.parity``): it computed what the reference computes, and each arm
   computed it the same way twice (``xstage.stage.gate``: else ``nondeterministic``; a stage
   with state over three calls, state outputs included); when the fp32 comparison fails on
   float criteria, ``xstage.stage.tiebreak`` evaluates the graph in float64 and the stage
   passes if it is no further from that than the reference is.
5. **Measured peak** (``xstage.ledger.measured``): the worker's own peak fits the budget.

Every call of rules 2-4 runs at depth 1 (one slot set in the shared region, so the client touches
one set's pages, docs/memory.md); the region is then widened to the stage's depth, in the same
visit to the worker, before the verdicts are read.

Whatever fails, one cleanup path (an ``ExitStack``) closes the worker and gives the hold back;
only an admission keeps them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from xstage import errors, evidence, parity
from xstage import ledger as ledger_mod
from xstage.artifact import Artifact
from xstage.client import WorkerClient
from xstage.evidence import attestation, detail
from xstage.ledger import footprint, measured
from xstage.planner import Candidate
from xstage.refusal import Refusal
from xstage.routes.launch import load_options, open_worker
from xstage.stage import crash, refusals, tiebreak
from xstage.stage import gate as gate_mod
from xstage.stage.ledger import Holding, Ledger
from xstage.stage.reference import ReferenceOverBudget
from xstage.stage.setup import Setup
from xstage.stage.state import state_bytes

__all__ = ["Admission", "Attempt", "Setup", "WarmUp", "admit", "attempt"]


@dataclass(frozen=True)
class WarmUp:
    """What the profiled warm-up left: outputs, the worker's evidence, and who ran it."""

    outputs: Mapping[str, np.ndarray]
    timing: Mapping[str, Any]
    info: Mapping[str, Any]
    profile: bytes | None
    worker: Mapping[str, Any]  # hello, runtime info, evidence digest: in every later refusal
    notes: tuple[str, ...]
    target: str  # the torch device string, or the EP name for ONNX
    #: (phase, start, end) in the client's ``perf_counter_ns``: spawn + hello, load, warm-up, evidence
    phases: tuple[tuple[str, int, int], ...] = ()
    #: the gate's calls (the warm-up's; with state, GATE_CALLS from the initial state, state
    #: outputs included), and the verdict of the same computed again against them (None: bit
    #: for bit the same)
    #: (``xstage.stage.gate``: checked as each call came back, never held)
    #: An ``Admission`` keeps neither ``outputs`` nor ``calls``: they are let go once judged.
    calls: tuple[Mapping[str, np.ndarray], ...] = ()
    again: parity.Parity | None = None
    #: torch-cuda: the page-locked region as the stage serves (the region of ``depth`` sets
    #: that replaced the gate's one-set region: ``WorkerClient.widen``), else None
    pinned_region: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Admission:
    """A candidate that passed every gate, holding its worker and its share of the ledger."""

    setup: Setup
    candidate: Candidate
    client: WorkerClient
    ledger: Ledger
    holding: Holding
    proof: evidence.PlacementProof
    parity: parity.Parity
    ledger_doc: Mapping[str, Any]
    warm: WarmUp
    attestation: attestation.Attestation | None = None
    notes: tuple[str, ...] = field(default=())
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Attempt:
    """One candidate's outcome, and its record ``detail`` block once its worker warmed up.

    Attributes:
        outcome: the ``Admission``, or the ``Refusal`` that stopped the candidate.
        detail: the candidate's phases and per-node placement (``xstage.evidence.detail``);
            None where no worker warmed up. A refused record takes the last one.
    """

    outcome: Admission | Refusal
    detail: Mapping[str, Any] | None = None


def admit(cand: Candidate, setup: Setup, say: Callable[[str], None]) -> Admission | Refusal:
    """Run ``cand`` through the gates (:func:`attempt`): its outcome alone.

    Raises:
        ArtifactError, WorkerError: as :func:`attempt`.
    """
    return attempt(cand, setup, say).outcome


def attempt(cand: Candidate, setup: Setup, say: Callable[[str], None]) -> Attempt:
    """Run ``cand`` through the gates (module docstring); see there for the order.

    Raises:
        ArtifactError: the route's worker could not load or run the artifact.
        WorkerError: the worker timed out, or died where ``xstage.stage.crash`` keeps it an
            error (the reference arm, or an artifact the reference arm cannot run either).
    """
    spec, shapes = cand.route.spec, {n: tuple(a.shape) for n, a in setup.feeds.items()}
    pins = cand.pool != ledger_mod.HOST_POOL and spec.pins_region(setup.ep_options)
    slots = spec.serves_device_tensors(setup.ep_options)
    held = footprint.reservations(setup.artifact, spec.memory_cost(cand.route.versions), cand.pool,
                                  shapes, route=cand.route.name,
                                  graph_pool=spec.captures_graph(setup.ep_options))
    # a GPU stage's page-locked region: host RAM, held beside the device budget
    locked = footprint.pinned_region(setup.artifact, shapes, setup.depth,
                                     route=cand.route.name) if pins else []
    if slots:  # device tensors: K sets of device slots, in the stage's own pool
        held.append(footprint.device_slots(setup.artifact, shapes, setup.depth, cand.pool,
                                           route=cand.route.name))
    if setup.state:
        held.append(ledger_mod.Reservation(
            "state", state_bytes(setup.state, setup.artifact), cand.pool, "session", "D",
            f"{len(setup.state)} state pair(s) kept in the worker: each value and its initial "
            "copy, at their declared shapes"))
    budget = ledger_mod.make_budget(held, pool=cand.pool)
    pinned = ledger_mod.make_budget(locked, pool=ledger_mod.HOST_POOL) if locked else None
    book = setup.ledger if setup.ledger is not None else Ledger.default()
    holding, fit = book.reserve(
        budget, f"{setup.artifact.path.name} on {cand.device} ({cand.route.name})", setup.devices,
        also=(pinned,) if pinned else ())
    spots = ledger_mod.blind_spots(cand.kind, cand.pool)
    if holding is None:  # rule 1: refused before any worker starts
        return Attempt(refusals.budget_refusal(cand, fit, measured.record_block(budget, fit, None,
                                                                                spots=spots)))
    with ExitStack() as cleanup:
        cleanup.callback(book.release, holding)
        try:
            client, warm = _start_and_warm_up(cand, setup, cleanup)
        except _CompileFailed as failed:
            return Attempt(failed.refusal)
        except crash.CandidateDied as dead:  # rule 2: refused if the reference arm runs it
            return Attempt(_crashed(cand, setup, dead))
        proof = _prove(setup, warm)
        doc = _detail(cand, setup, warm)
        attested = _attest(cand, setup, warm, proof)
        conflict = attestation.judge(attested)
        if conflict == "device_mismatch" or (conflict and proof.verdict == "placed"):
            return Attempt(refusals.attestation_refusal(cand, attested, conflict, proof,
                                                        warm.worker), doc)
        if proof.verdict != "placed":
            return Attempt(refusals.declined_refusal(cand, proof, warm.worker, attested), doc)
        try:
            gate, reference = _gate(setup, warm)
        except ReferenceOverBudget as over:  # its worker would not fit beside this one
            return Attempt(refusals.reference_budget_refusal(cand, over, measured.record_block(
                over.budget, over.fit, None, spots=spots)), doc)
        if gate.verdict != "passed" and not setup.state:  # float criteria: the tie-break decides
            gate = tiebreak.settle(gate, setup.artifact, setup.feeds, warm.outputs, reference,
                                   setup.reference)
        elif gate.verdict != "passed":  # stateful: no tie-break, so fp32's noise tier decides
            gate = tiebreak.settle_stateful(gate, _both_calls(warm), reference)
        if gate.verdict != "passed":
            return Attempt(refusals.gate_refusal(cand, gate, proof, setup.reference.kind,
                                                 warm.worker), doc)
        try:
            gate = _every_set(setup, client, warm, gate)
        except errors.WorkerDied as exc:
            return Attempt(_crashed(cand, setup, crash.CandidateDied(exc, "warming up",
                                                                     client.log_path)), doc)
        except errors.WorkerRaised as exc:  # a set could not run what set 0 ran
            raise refusals.load_failed(cand, setup.artifact, exc, client.log_path,
                                       client.hello) from exc
        if gate.verdict != "passed":
            return Attempt(refusals.gate_refusal(cand, gate, proof, setup.reference.kind,
                                                 warm.worker), doc)
        memory, profiled = _stage_memory(warm.info)
        peak = measured.check_measured(
            budget.budget_bytes, _measured_peak(cand.pool, warm.timing, memory, warm.info))
        ledger_doc = measured.record_block(budget, fit, peak, memory=memory, spots=spots,
                                           profiled=profiled)
        if pinned is not None:
            ledger_doc["host_pinned"] = measured.pinned_block(pinned, warm.pinned_region)
        if peak.cause:
            return Attempt(refusals.peak_refusal(cand, peak, ledger_doc, warm.worker, proof, gate),
                           doc)
        cleanup.pop_all()  # admitted: the worker and the hold now belong to the Stage
        kept = replace(warm, outputs={}, calls=())  # the gate's copies: judged, not kept
        return Attempt(Admission(setup=setup, candidate=cand, client=client, ledger=book,
                                 holding=holding, proof=proof, parity=gate, ledger_doc=ledger_doc,
                                 warm=kept, attestation=attested, notes=warm.notes, detail=doc),
                       doc)


def _gate(setup: Setup, warm: WarmUp) -> tuple[parity.Parity, Mapping[str, np.ndarray]]:
    """Rule 4: the outputs against the reference arm's, each arm computing them twice.

    A stateful stage's calls from the initial state, state outputs included (``xstage.stage.gate``).
    """
    return gate_mod.judge(setup, warm.calls or (warm.outputs,), warm.again)


def _every_set(setup: Setup, client: WorkerClient, warm: WarmUp,
               gate: parity.Parity) -> parity.Parity:
    """The passed gate, failed where a slot set of the serving region answers otherwise.

    ``WorkerClient.check_sets`` runs the gate's inputs in each set and compares each set's
    answer with set 0's in the worker, bit for bit; :attr:`parity.Parity.slot_sets` records it.
    Only a stage that answered bit for bit the same twice is held to it: one with state serves
    in one set, and one that computes differently each time is the nondeterminism rule's. A set
    that differs is judged as a second computation (:func:`xstage.parity.self_agreement`), its
    outputs named ``<output> (slot set k)``; no named tolerance admits it.
    """
    if setup.depth < 2 or setup.state or warm.again is not None or gate.determinism:
        return gate
    info, first, other = client.check_sets(setup.feeds)
    if not info:
        return gate
    checked = replace(gate, slot_sets={"sets": info.get("sets"), "differs": info.get("differs"),
                                       **({"skipped": info["skipped"]} if info.get("skipped") else {})})
    k = info.get("differs")
    if k is None:
        return checked
    tag = f" (slot set {k})"
    check = parity.self_agreement({n + tag: a for n, a in first.items()},
                                  {n + tag: a for n, a in other.items()})
    if check.passed:  # within SELF_TOLERANCE: the same numbers, summed in another order
        return checked
    return parity.nondeterministic(checked, {"stage": check}, setup.artifact.random_ops, named=False)


def _both_calls(warm: WarmUp) -> dict[str, np.ndarray]:
    """A stateful stage's gate calls, named as the gate names them (``y``, ``y (call n)``)."""
    return gate_mod.named(warm.calls or (warm.outputs,))


def _start_and_warm_up(cand: Candidate, setup: Setup,
                       cleanup: ExitStack) -> tuple[WorkerClient, WarmUp]:
    """Rule 2: start the worker, load, run once profiled, collect what the proof rests on.

    Every call to the worker happens here, in one visit, so the proof and the gate after it
    read plain data.
    """
    art = setup.artifact
    options = load_options(cand.route, device=cand.device, ep_options=setup.ep_options,
                           session=setup.session, fmt=art.format, profile=True,
                           output_names=[o.name for o in art.outputs], compile_cache_of=art)
    cache = options.pop("compile_cache")  # the runtime's own, verified (xstage.compile_cache)
    if setup.state:
        options["state"] = [pair.option() for pair in setup.state]
    cleanup.callback(lambda: cache.discard() if not sealed else None)
    sealed = False
    t_spawn = time.perf_counter_ns()
    # depth 1 until the gate's calls are done (then ``widen``): they touch one set's pages
    client = open_worker(cand.route, deadlines=setup.deadlines, depth=1,
                         generation=setup.generation, first_id=setup.first_id)
    cleanup.callback(client.close)
    phase = "loading"
    try:
        t_ready = time.perf_counter_ns()
        client.load(art.path, runtime=options.get("runtime", "ort"), options=options)
        t_loaded, phase = time.perf_counter_ns(), "warming up"
        outputs = client.run(setup.feeds, phase="warmup")
        t_warm, phase = time.perf_counter_ns(), "reporting its evidence"
        timing = dict(client.last_timing)
        info, profile = client.evidence()
        t_evidence, phase = time.perf_counter_ns(), "warming up"
        client.fit_region({**setup.feeds, **outputs})  # symbolic dims: slots sized from real ones
        calls, again = gate_mod.stage_runs(client, setup.feeds, setup.state, outputs)
        attached = client.widen(setup.depth, setup.concurrency)  # the depth it serves at
    except errors.WorkerDied as exc:
        raise crash.CandidateDied(exc, phase, client.log_path) from exc
    except errors.WorkerRaised as exc:
        if _ep_compile_failure(art, options, exc.message):
            worker = {"hello": client.hello, "log": str(client.log_path)}
            raise _CompileFailed(refusals.compile_refusal(cand, art, exc, client.log_path,
                                                          worker)) from exc
        raise refusals.load_failed(cand, art, exc, client.log_path, client.hello) from exc
    cache.seal()
    sealed = True
    worker = {"hello": client.hello, "runtime": dict((client.loaded or {}).get("info") or {}),
              "evidence_sha256": _digest(info, profile), "compile_cache": cache.to_dict()}
    acc = info.get("accelerator")
    pinned = (attached or {}).get("pinned_region") or (
        acc.get("pinned_region") if isinstance(acc, dict) else None)
    target = options["device"] if art.runtime == "torch" else options["ep"]["name"]
    phases = (("spawn + hello", t_spawn, t_ready), ("load", t_ready, t_loaded),
              ("warm-up", t_loaded, t_warm), ("evidence", t_warm, t_evidence))
    return client, WarmUp(outputs=outputs, timing=timing, info=info, profile=profile,
                          worker=worker, notes=(*options.get("notes", []), *_serving_notes(info)),
                          target=target,
                          phases=phases, calls=tuple(calls), again=again,
                          pinned_region=pinned if isinstance(pinned, dict) else None)


def _serving_notes(info: Mapping[str, Any]) -> tuple[str, ...]:
    """What the worker's serving set-up said (a CUDA graph that could not be captured)."""
    acc = info.get("accelerator")
    graph = acc.get("cuda_graph") if isinstance(acc, dict) else None
    note = graph.get("note") if isinstance(graph, dict) else None
    return (note,) if isinstance(note, str) else ()


def _crashed(cand: Candidate, setup: Setup, dead: crash.CandidateDied) -> Refusal:
    """A candidate's worker died loading or warming up (``xstage.stage.crash``'s rules).

    Raises:
        WorkerDied: the candidate is the reference arm, or the reference arm cannot run the
            artifact either (the remedy says which).
    """
    try:
        check = crash.reference_runs(cand, setup)
    except LookupError as why:
        died = dead.died
        raise errors.WorkerDied(
            died.message, exit_status=died.exit_status, pid=died.pid, log_tail=died.log_tail,
            generation=died.generation,
            remedy=f"{why}; {died.remedy or 'see the worker log'}") from died
    return refusals.crash_refusal(cand, setup.artifact, dead.died, dead.phase, dead.log,
                                  crash.death(dead.died), check)


class _CompileFailed(Exception):
    """The EP claimed nodes and failed to compile them: carries the refusal out of the warm-up."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


#: How onnxruntime names an EP's own failure: its log tag (``[OpenVINO-EP]``) or the fused
#: subgraph it compiles (``OpenVINOExecutionProvider_OpenVINO-EP-subgraph_2_1``).
_EP_FAILURE = re.compile(r"\[[A-Za-z]+-EP\]|EP-subgraph_\d+|ExecutionProvider_\w+-subgraph")


def _ep_compile_failure(art: Artifact, options: Mapping[str, Any], message: str) -> bool:
    """A load or first run that failed inside a non-CPU EP compiling what it had claimed.

    The ONNX reference arm already ran the graph on the CPU (``open_stage`` runs it first), so
    a failure that names the EP's own subgraph or log tag is the EP's, not the graph's.
    """
    ep = (options.get("ep") or {}).get("name")
    return (art.runtime == "onnxruntime" and bool(ep) and ep != evidence.CPU_EP
            and bool(_EP_FAILURE.search(message)))


def _prove(setup: Setup, warm: WarmUp) -> evidence.PlacementProof:
    """Rule 3: the proof, from the torch profiler's op log or onnxruntime's profile and plan."""
    info = warm.info
    if setup.artifact.runtime == "torch":
        return evidence.prove_torch(
            ops=info.get("ops"), output_devices=info.get("output_devices"),
            target_device=warm.target, min_placement=setup.min_placement,
            torch_version=info.get("torch"), kernels=info.get("kernels"))
    return evidence.prove(
        target_ep=warm.target, requested_ep=info.get("requested_ep"),
        session_providers=info.get("session_providers") or [],
        available_providers=info.get("available_providers") or [],
        profile_text=warm.profile.decode("utf-8", "replace") if warm.profile else None,
        assignment=info.get("assignment") if isinstance(info.get("assignment"), list) else None,
        fallback_banner=info.get("fallback_banner"), graph_nodes=list(setup.nodes),
        min_placement=setup.min_placement, ort_version=info.get("onnxruntime"),
        node_names=info.get("node_names") if isinstance(info.get("node_names"), dict) else None,
        ep_report=info.get("ep_report") if isinstance(info.get("ep_report"), dict) else None)


def _detail(cand: Candidate, setup: Setup, warm: WarmUp) -> dict[str, Any]:
    """The record's ``detail`` block: the client's phases, and the per-node placement (ONNX).

    Times are µs on the client's ``perf_counter`` since the worker's spawn began. The worker's
    profile has a clock of its own; it is placed on the client's by Cristian's method on the
    warm-up call (docs/reports.md): the worker computed for ``worker_ns`` inside the client's
    round trip, so its first profiled run began half the rest of the round trip after the call
    was sent, give or take that half.
    """
    origin = warm.phases[0][1] if warm.phases else 0
    phases = [{"name": name, "start_us": round((t0 - origin) / 1e3, 1), "dur_us": round((t1 - t0) / 1e3, 1)}
              for name, t0, t1 in warm.phases]
    placement = None
    if setup.artifact.runtime == "onnxruntime":
        info = warm.info
        placement = detail.placement_detail(
            profile_text=warm.profile, assignment=info.get("assignment"),
            node_names=info.get("node_names") if isinstance(info.get("node_names"), dict) else None,
            graph_nodes=list(setup.nodes), target_ep=warm.target)
    offset = uncertainty = None
    worker_ns = warm.timing.get("worker_ns")
    runs = (placement or {}).get("runs") or []
    warm_phase = next((p for p in phases if p["name"] == "warm-up"), None)
    if warm_phase and isinstance(worker_ns, int) and runs and isinstance(runs[0].get("ts_us"), int):
        slack = max(0.0, warm_phase["dur_us"] - worker_ns / 1e3) / 2
        offset = round(warm_phase["start_us"] + slack - runs[0]["ts_us"], 1)
        uncertainty = round(slack, 1)
    clock = {"client": "perf_counter", "origin": "spawn + hello began",
             "profile_offset_us": offset, "profile_offset_uncertainty_us": uncertainty,
             "method": "cristian: the warm-up call's worker compute centred in its round trip"}
    doc = {"device": cand.device, "route": cand.route.name, "clock": clock, "phases": phases,
           "calls": [],
           "warmup_worker_us": worker_ns / 1e3 if isinstance(worker_ns, int) else None,
           "placement": placement}
    if setup.artifact.runtime == "torch" and isinstance(warm.info.get("ops"), list):
        doc["ops"] = warm.info["ops"]  # the op log the proof judged: the per-op table's (torch)
    return doc


def _attest(cand: Candidate, setup: Setup, warm: WarmUp,
            proof: evidence.PlacementProof) -> attestation.Attestation:
    """Rule 3, layer 3: the device the worker's reports attest, against the planned one."""
    info = warm.info
    if setup.artifact.runtime == "torch":
        # torch attests by its tensors: the target device where the proof counted work there.
        # (Outputs off the device are the proof's own cause, ``outputs_off_device``.)
        seen = [warm.target] if proof.nodes_on_target else []
        return attestation.attest(planned=cand.device, torch_devices=seen)
    log = info.get("runtime_log")
    bound = info.get("bound_device")
    applied = info.get("ep_options_as_applied") or info.get("ep_options")
    memory = info.get("device_memory")
    pci, twins = _identity(cand.device, setup.devices)
    return attestation.attest(
        planned=cand.device, ep=str(info.get("requested_ep") or warm.target),
        ep_device=bound if isinstance(bound, dict) else None,
        ep_options=applied if isinstance(applied, dict) else None,
        runtime_log="\n".join(str(x) for x in log) if isinstance(log, list) else None,
        gpu_memory=memory if isinstance(memory, dict) else None, planned_pci=pci, twins=twins,
        device_id_picks_gpu=cand.route.spec.device_id_picks_gpu, gpu_vendor=cand.route.spec.gpu_vendor)


def _identity(device_id: str, rows: tuple[Any, ...]) -> tuple[str | None, int]:
    """The planned device's PCI address, and how many devices of the table are its model.

    A model is (kind, vendor, PCI id or name); 1 means the device has no twin.
    """
    devices = [getattr(row, "device", row) for row in rows]
    me = next((d for d in devices if getattr(d, "id", None) == device_id), None)
    if me is None:
        return None, 1

    def model(d: Any) -> tuple[Any, ...]:  # the PCI id where sysfs gave one, else the name
        return (d.kind, d.vendor, (getattr(d, "details", None) or {}).get("pci_id") or d.name)

    twins = sum(1 for d in devices if model(d) == model(me))
    return getattr(me, "pci_address", None), max(twins, 1)


def _digest(info: Mapping[str, Any], profile: bytes | None) -> str:
    """sha256 of the evidence the proof rests on (the worker's info and its profile)."""
    h = hashlib.sha256(json.dumps(info, sort_keys=True, default=str).encode())
    h.update(b"\0" + (profile or b""))
    return h.hexdigest()


def _stage_memory(info: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The worker's memory reading for the ledger, and what its profiled warm-up held.

    An ONNX worker tells the stage's own peak apart from the profiler's (``stage_memory``,
    docs/memory.md "The profiler's memory"): where it served on from an unprofiled session, its
    reading after that session's run is the stage's; the profiled peak is the proof's, kept
    beside it in the record.
    """
    memory = dict(info["memory"]) if isinstance(info.get("memory"), dict) else {}
    stage = info.get("stage_memory")
    if not isinstance(stage, dict) or not isinstance(stage.get("peak"), int):
        return memory, None
    basis = "unprofiled" if stage.get("basis") == "unprofiled" else "profiled"
    if basis == "unprofiled" and isinstance(stage.get("detail"), dict):
        memory = {**stage["detail"], "peak": stage["peak"]}
    profiled = stage.get("profiled_peak")
    return memory, {"basis": basis,
                    "profiled_peak": profiled if isinstance(profiled, int) else None,
                    "profile_bytes": stage.get("profile_bytes")}


def _measured_peak(pool: str, warm: Mapping[str, Any], memory: Mapping[str, Any],
                   info: Mapping[str, Any]) -> int | None:
    """The worker's peak for the budget's pool.

    Host RAM: its own high-water mark (after the warm-up, which covers the load), or, where the
    stage serves from an unprofiled session, that session's (``_stage_memory``); a device
    pool: the device's peak where the runtime reports one, else None.
    """
    if pool != ledger_mod.HOST_POOL:
        device = info.get("device_memory")
        value = device.get("peak") if isinstance(device, dict) else None
        return int(value) if isinstance(value, int) and value > 0 else None
    stage = info.get("stage_memory")
    if isinstance(stage, dict) and stage.get("basis") == "unprofiled":
        value = memory.get("peak")
        return int(value) if isinstance(value, int) and value > 0 else None
    values = [v for v in (warm.get("peak"), memory.get("peak")) if isinstance(v, int) and v > 0]
    return max(values) if values else None
