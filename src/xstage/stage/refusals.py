"""Every refusal and admission-failure message the API writes, keyed by (code, cause).

A reader looking for "what does xstage say when X" finds it here, one builder per gate; the
remedies that do not depend on the run come from the registry of causes
(``xstage.refusal.REGISTRY``). The planner's own refusals (``no_exported_graph``,
``device_unreachable_from_this_process``) are written where they are decided, in
``xstage.planner``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from xstage import errors
from xstage.artifact import Artifact
from xstage.evidence import PlacementProof
from xstage.evidence.attestation import Attestation
from xstage.ledger import Fit, Measured
from xstage.parity import Parity
from xstage.planner import Candidate
from xstage.refusal import REGISTRY, Refusal, RefusalCode

__all__ = ["REMEDIES", "attestation_refusal", "budget_refusal", "compile_refusal", "crash_refusal",
           "declined_refusal", "gate_refusal", "load_failed", "peak_refusal", "refused"]

_DECLINED, _GATE, _BUDGET = (RefusalCode.EP_DECLINED, RefusalCode.NUMERIC_GATE_FAILED,
                             RefusalCode.BUDGET_EXCEEDS_DEVICE)

#: Remedies that do not depend on the run, from the registry (``xstage.refusal.REGISTRY``):
#: ``(code, cause)``, and ``(code, "cause:key")`` for a cause's other remedies. Budget refusals
#: before the worker starts take their remedy from the ledger's ``Fit`` (it names the pool and
#: the sizes).
REMEDIES: Mapping[tuple[RefusalCode, str], str] = {
    **{(e.code, e.cause): e.remedy for e in REGISTRY if e.remedy is not None},
    **{(e.code, f"{e.cause}:{key}"): text for e in REGISTRY for key, text in e.remedies.items()},
}


def _where(cand: Candidate) -> str:
    return f"{cand.route.name} on {cand.device}"


def budget_refusal(cand: Candidate, fit: Fit, ledger_doc: Mapping[str, Any]) -> Refusal:
    """The stage does not fit its pool: refused before any worker starts."""
    return Refusal(code=_BUDGET, cause=fit.cause or "over_budget", device=cand.device,
                   route=cand.route.name, message=f"{_where(cand)}: {fit.message()}",
                   remedy=fit.remedy(), evidence={"ledger": dict(ledger_doc)})


def reference_budget_refusal(cand: Candidate, over: Any, ledger_doc: Mapping[str, Any]) -> Refusal:
    """The gate's reference worker does not fit the pool beside the candidate's.

    Refused: its numbers could not be checked within the budget (``xstage.stage.reference``).
    """
    return Refusal(code=_BUDGET, cause=over.fit.cause or "over_budget", device=cand.device,
                   route=cand.route.name, message=f"{_where(cand)}: {over.message}",
                   remedy=over.remedy or over.fit.remedy(), evidence={"ledger": dict(ledger_doc)})


def peak_refusal(cand: Candidate, measured: Measured, ledger_doc: Mapping[str, Any],
                 worker: Mapping[str, Any], proof: PlacementProof, gate: Parity) -> Refusal:
    """The worker's measured peak passed the budget, or nothing measured it.

    The stage was placed and passed the gate before its peak was judged: the proof and the
    gate's verdict stay in the evidence (and in the refused record, ``open_stage``).
    """
    cause = measured.cause or "peak_over_budget"
    return Refusal(code=_BUDGET, cause=cause, device=cand.device, route=cand.route.name,
                   message=f"{_where(cand)}: {measured.message()} (it was {proof.verdict} and "
                           f"the gate {gate.verdict})",
                   remedy=REMEDIES[(_BUDGET, cause)],
                   evidence={"ledger": dict(ledger_doc), "worker": dict(worker),
                             "proof": proof.to_dict(), "parity": gate.to_dict()})


def declined_refusal(cand: Candidate, proof: PlacementProof, worker: Mapping[str, Any],
                     attested: Attestation | None = None) -> Refusal:
    """The proof did not show the stage on the device (declined, swapped or unmeasured)."""
    cause = proof.cause or "unmeasured"
    remedy_key = cause
    where = _where(cand)
    if cause == "outputs_off_device":
        stray = next((n for n in proof.notes if n.startswith("outputs came back")), "")
        message = (f"{where}: the stage's outputs are not on {cand.device}"
                   f"{': ' + stray if stray else ''} (its ops may have run there; what it "
                   "returns did not)")
    elif cause == "provider_swapped":
        message = (f"{where}: the session does not hold {proof.target_ep} "
                   f"(it holds {', '.join(proof.session_providers) or 'nothing'})")
    elif cause == "unmeasured" and proof.names_checked is False:
        failed = proof.name_failures[0] if proof.name_failures else "a name"
        message = (f"{where}: no usable placement evidence: a name in onnxruntime's profile or plan "
                   f"failed the name check ({failed}); unmeasured never passes")
        remedy_key = "unmeasured:names"
    elif cause == "unmeasured":
        bounds = [n for n in proof.notes if n.endswith("the node fraction cannot be known")]
        why = f" ({(bounds or proof.notes)[-1]})" if proof.notes else ""
        message = f"{where}: no usable placement evidence{why}; unmeasured never passes"
        remedy_key = "unmeasured:bounds" if bounds else cause
    elif cause == "evidence_conflict":
        message = (f"{where}: the plan puts nodes on {proof.target_ep}, but the profile cannot "
                   "confirm it (evidence_conflict; never passes)")
    else:
        frac = proof.fraction or 0.0
        left = ", ".join(f"{op}×{len(names)}" for op, names in sorted(proof.cpu_nodes.items()))
        by = f"the {proof.decided_by}" if proof.decided_by else proof.basis
        message = (f"{where}: {proof.target_ep} took {frac:.1%} by {by} "
                   f"(needs {proof.min_placement:.1%}); left on the CPU: {left or 'nothing'}")
    remedy = REMEDIES.get((_DECLINED, remedy_key), REMEDIES[(_DECLINED, "declined")])
    extra = {"device_attestation": attested.to_dict()} if attested else {}
    return Refusal(code=_DECLINED, cause=cause, device=cand.device, route=cand.route.name,
                   message=message, remedy=remedy,
                   evidence={**proof.to_dict(), **extra, "worker": dict(worker)})


def attestation_refusal(cand: Candidate, attested: Attestation, cause: str,
                        proof: PlacementProof, worker: Mapping[str, Any]) -> Refusal:
    """Conflict case (c): the device attested is not the planned one, or nothing attests it."""
    where = _where(cand)
    if cause == "device_mismatch":
        message = (f"{where}: the stage ran on {attested.observed}, not on {cand.device} "
                   f"(attested by {attested.source}: {attested.detail})")
        remedy = REMEDIES[(_DECLINED, "device_mismatch")]
    else:
        message = (f"{where}: nothing attests which device ran the stage ({attested.detail}); "
                   "unmeasured never passes")
        remedy = REMEDIES[(_DECLINED, "unmeasured:unattested")]
    # The EP's own proof may have placed the stage; on the wrong device that is no placement:
    # the evidence's verdict is the refusal's (the EP-level one is kept as ``ep_verdict``).
    verdict = "declined" if cause == "device_mismatch" else "unmeasured"
    return Refusal(code=_DECLINED, cause=cause, device=cand.device, route=cand.route.name,
                   message=message, remedy=remedy,
                   evidence={**proof.to_dict(), "verdict": verdict, "cause": cause,
                             "ep_verdict": proof.verdict,
                             "device_attestation": attested.to_dict(), "worker": dict(worker)})


def compile_refusal(cand: Candidate, art: Artifact, exc: errors.WorkerRaised, log: object,
                    worker: Mapping[str, Any]) -> Refusal:
    """The EP accepted nodes at placement, then failed to compile them: a refusal, not an error."""
    return Refusal(
        code=_DECLINED, cause="ep_compile_failed", device=cand.device, route=cand.route.name,
        message=f"{_where(cand)}: the EP took {art.path.name} and then failed to compile it: "
                f"{_first_line(exc.message)}",
        remedy=REMEDIES[(_DECLINED, "ep_compile_failed")] + f" (worker log: {log})",
        evidence={"error": exc.message[-4000:], "worker": dict(worker),
                  "device_attestation": Attestation(
                      planned=cand.device, observed=None, source="unattested",
                      detail="the EP failed to compile the stage: nothing ran").to_dict()})


def crash_refusal(cand: Candidate, art: Artifact, died: errors.WorkerDied, phase: str, log: object,
                  how: Mapping[str, Any], check: Mapping[str, Any]) -> Refusal:
    """The candidate's worker died loading or warming up, and the reference arm ran the artifact."""
    oom = (" (SIGKILL: possibly the kernel's out-of-memory killer; see dmesg)"
           if how.get("possible_oom_kill") else "")
    remedy = ("run the stage on another route (--offload goes on to the next one; --route "
              f"{check.get('route')} runs it) or device; the worker's last lines are in the "
              f"refusal's evidence and its whole log in {log}")
    if how.get("possible_oom_kill"):
        remedy = ("if the out-of-memory killer ended it (dmesg says), give the stage more memory "
                  "or smaller inputs; else " + remedy)
    return Refusal(
        code=_DECLINED, cause="ep_compile_failed", device=cand.device, route=cand.route.name,
        message=f"{_where(cand)}: its worker died while {phase} {art.path.name}: "
                f"{_first_line(died.message)}{oom}; the reference arm {check.get('route')} loads "
                "and runs it, so the route failed, not the graph",
        remedy=remedy,
        evidence={"error": died.message, "phase": phase, "worker_death": dict(how),
                  "reference_check": dict(check), "worker": {"log": str(log)},
                  "device_attestation": Attestation(
                      planned=cand.device, observed=None, source="unattested",
                      detail="the worker died before the stage ran: nothing ran").to_dict()})


def gate_refusal(cand: Candidate, gate: Parity, proof: PlacementProof, reference_kind: str,
                 worker: Mapping[str, Any]) -> Refusal:
    """It ran on the device and disagreed with the reference (or an arm with itself)."""
    whom = ("gave different numbers for the same inputs" if gate.cause == "nondeterministic"
            else f"disagreed with the {reference_kind.replace('_', ' ')} reference")
    return Refusal(
        code=_GATE, cause=gate.cause or "tolerance", device=cand.device, route=cand.route.name,
        message=f"{_where(cand)} ran the stage and {whom}: {gate.summary}",
        remedy=REMEDIES.get((_GATE, gate.cause or "tolerance"), REMEDIES[(_GATE, "tolerance")]),
        evidence={"parity": gate.to_dict(), "proof": proof.to_dict(), "worker": dict(worker)})


def load_failed(cand: Candidate, art: Artifact, exc: errors.WorkerRaised, log: object,
                hello: Mapping[str, Any] | None) -> errors.ArtifactError:
    """The route's worker could not load or run the artifact: an error (exit 1), not a refusal."""
    if art.runtime == "torch":
        exporter = art.manifest.get("exporter") or {}
        saved_by = exporter.get("torch", "an unknown torch")
        if exporter.get("pt2_for_torch"):
            remedy = (f"the program was written by torch {saved_by} for torch "
                      f"{exporter['pt2_for_torch']} (--for-torch); export it without --for-torch "
                      "for this route's torch")
        else:
            remedy = (f"the program was saved by torch {saved_by}; export it with the torch this "
                      "route runs, or for a torch 2.4 worker (torch-directml) with "
                      "`xstage export ... --for-torch 2.4`")
        remedy += f" (docs/torch.md: what loads where); the full message is in the worker log {log}"
    else:
        version = hello["worker"]["versions"].get("onnxruntime") if hello else None
        remedy = (f"check the graph loads in that route's onnxruntime ({version}); the full "
                  f"message is in the worker log {log}")
    said = exc.message.replace(str(art.path), str(art.origin))  # the user's file, not the snapshot
    return errors.ArtifactError(
        f"{cand.route.name} could not load or run {art.path.name}: {_first_line(said)}",
        remedy=remedy)


def refused(refusals: Sequence[Refusal], art: Artifact, record: dict[str, Any]) -> errors.Refused:
    """Every candidate was refused: the exception ``open_stage`` raises, record attached."""
    if refusals:
        last = refusals[-1]
        more = f" ({len(refusals) - 1} more in the record)" if len(refusals) > 1 else ""
        message = f"{last.code.value} ({last.cause}): {last.message}{more}"
    else:
        message = f"no device here can run {art.path.name}"
    return errors.Refused(
        message, refusals=refusals, record=record,
        remedy=refusals[-1].remedy if refusals else "xstage devices shows what this machine has")


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
