"""The refusal an unmeasured proof becomes names why nothing was measured, and the fix for that.

Proofs from recorded profiles (``tests/fixtures/profiles``): a name the check does not know is not
a profile that "could not be read", and a compiled partition no plan lists is neither.
"""

from __future__ import annotations

import json
from pathlib import Path

from xstage.evidence import prove
from xstage.planner import Candidate
from xstage.routes.specs import get_spec
from xstage.routes.status import RouteStatus
from xstage.stage.refusals import declined_refusal

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"


def _candidate(route: str) -> Candidate:
    spec = get_spec(route)
    status = RouteStatus(name=route, spec=spec, status="resolved", reason_code=None, reason="", remedy="",
                         interpreter="/envs/python", interpreter_source="route_env", versions={},
                         verified=spec.verified, devices=("cpu",))
    return Candidate(device="cpu", route=status)


def _evidence(name: str) -> dict:
    meta = json.loads((PROFILES / f"{name}.meta.json").read_text())
    plan = PROFILES / f"{name}.assignment.json"
    return {"target_ep": meta["requested_ep"],
            "profile_text": (PROFILES / f"{name}.profile.json").read_text(),
            "assignment": json.loads(plan.read_text()) if plan.is_file() else None,
            "session_providers": meta["session_providers"], "graph_nodes": meta["graph"]["nodes"]}


def test_a_name_the_check_does_not_know_says_so_not_that_the_profile_was_unreadable():
    # The A16W8 graph's inserted x_q, judged with the graph's names alone (no worker report).
    proof = prove(**_evidence("ort132_cpu_qdq"))
    assert (proof.verdict, proof.cause, proof.names_checked) == ("unmeasured", "unmeasured", False)
    refusal = declined_refusal(_candidate("ort-cpu"), proof, {})
    assert "failed the name check ('x_q' is neither" in refusal.message
    assert "proof.name_failures" in refusal.remedy and "could not be read" not in refusal.remedy


def test_bounds_that_straddle_the_threshold_name_the_plan_that_would_list_the_partition():
    proof = prove(**{**_evidence("ov124_padded30"), "assignment": None}, min_placement=0.5)
    assert (proof.verdict, proof.cause) == ("unmeasured", "unmeasured")
    refusal = declined_refusal(_candidate("ort-openvino"), proof, {})
    assert "between 0.1667 and 0.8611" in refusal.message
    assert "onnxruntime >= 1.24" in refusal.remedy and "could not be read" not in refusal.remedy


def test_an_unreadable_profile_keeps_its_remedy():
    proof = prove(**{**_evidence("ort132_cpu_qdq"), "profile_text": None, "assignment": None})
    refusal = declined_refusal(_candidate("ort-cpu"), proof, {})
    assert "the profile could not be read" in refusal.remedy
