"""``build_record``: the one builder of every ``xstage external`` record, placed, refused or failed.

The API (``Stage.record``, ``Refused.record``) and the CLI's error path all call it, so the
three outcomes share one shape and one ``request`` block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xstage._version import __version__
from xstage.exit_codes import exit_code_for
from xstage.record.io import SCHEMA_VERSION, host_block, utc_now
from xstage.refusal import Refusal

if TYPE_CHECKING:
    from xstage.artifact import Artifact
    from xstage.planner import Candidate, Plan

__all__ = ["build_record"]


def build_record(
    *,
    argv: Sequence[str],
    started: str,
    request: Mapping[str, Any],
    status: str,
    exit_code: int | None = None,
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
    device_attestation: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
    serving: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The versioned record every ``external`` run writes, placed, refused or failed.

    ``exit_code`` defaults to the one ``status`` implies (``xstage.exit_codes``).
    ``device_attestation`` is the attested device of the chosen candidate, or of the last one
    refused after its worker ran (docs/design.md §5 layer 3); None where no worker ran.
    ``detail`` (schema 1.x, optional) is what ``xstage report`` draws: the client's phases and
    calls, the per-node placement and the profiled kernels; left out where no worker ran.
    ``serving`` is an API stage's depth, restart policy and generations (absent otherwise).
    """
    candidates = _candidates(plan, tried)
    chosen_cand = next((c for c, o, _ in tried if o == "chosen"), None)
    chosen = ({"device": chosen_cand.device, "route": chosen_cand.route.name}
              if chosen_cand is not None else None)
    err = None
    if error is not None:
        err = {"type": type(error).__name__, "message": getattr(error, "message", str(error)),
               "remedy": getattr(error, "remedy", None)}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": "xstage.external",
        "xstage_version": __version__,
        "argv": list(argv),
        "started": started,
        "finished": utc_now(),
        "host": host_block(),
        "outcome": {"status": status, "exit_code": exit_code_for(status) if exit_code is None else exit_code,
                    "refusals": [r.to_dict() for r in refusals], "error": err},
        "artifact": artifact.to_dict() if artifact else None,
        "request": dict(request),
        "plan": None if plan is None and not tried else {
            "chosen": chosen, "candidates": candidates, **_plan_mode(plan), **_fallthrough(plan),
            # A stage on the reference arm ran where the gate's reference runs: no offload.
            **({"on_reference_arm": chosen_cand.route.spec.reference_arm}
               if chosen_cand is not None else {})},
        "worker": dict(worker) if worker else None,
        "proof": dict(proof) if proof else None,
        "parity": dict(parity_doc) if parity_doc else None,
        "timings": dict(timings) if timings else None,
        "memory": dict(memory) if memory else None,
        "ledger": dict(ledger) if ledger else None,
        "device_attestation": dict(device_attestation) if device_attestation else None,
    }
    if detail is not None:
        doc["detail"] = dict(detail)
    if serving is not None:
        doc["serving"] = dict(serving)
    return doc


def _candidates(plan: Plan | None,
                tried: Sequence[tuple[Candidate, str, Refusal | None]]) -> list[dict[str, Any]]:
    """Every (device, route) pair: those tried in order, then the plan's untried and refused."""
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
    return candidates


def _fallthrough(plan: Plan | None) -> dict[str, Any]:
    """``plan.fallthrough``: the refusals the planner decided for a whole device (no route, or
    no device), which have no (device, route) candidate to sit in. Kept in every record, a
    placed one too, so a stage placed on a later preferred device still says why each earlier
    one said no (docs/external.md)."""
    if plan is None:
        return {}
    return {"fallthrough": [r.to_dict() for r in plan.refusals
                            if r.route is None or r.device is None]}


def _plan_mode(plan: Plan | None) -> dict[str, Any]:
    """How the candidates were chosen, and which of them are reference arms (schema 1.2)."""
    if plan is None:
        return {}
    arms = sorted({c.route.name for c in plan.candidates if c.route.spec.reference_arm})
    return {"mode": plan.mode, "reference_arms": arms}
