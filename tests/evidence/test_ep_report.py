"""The EP's own operator report as a proof layer (``evidence.ep_report``, ``prove``'s rule 7).

The reports are synthetic (tests/fixtures/ep_reports/README.md: written by hand from the
documented format, each marked ``synthetic: true`` with its source); the onnxruntime layers they
are set beside are real captures of the same graph (``ov124_det``: OpenVINO takes every node but
``det``), standing in for a compiling EP whose plan shows its partition as fused nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xstage.evidence import prove
from xstage.evidence.ep_report import read_report
from xstage.evidence.names import session_names

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PROFILES = FIXTURES / "profiles"
REPORTS = FIXTURES / "ep_reports"


def report_text(name: str) -> str:
    doc = json.loads((REPORTS / f"{name}.json").read_text())
    assert doc["synthetic"] is True and doc["source"]
    return json.dumps(doc["report"])


def evidence(name: str = "ov124_det") -> dict:
    meta = json.loads((PROFILES / f"{name}.meta.json").read_text())
    return {
        "target_ep": meta["requested_ep"],
        "profile_text": (PROFILES / f"{name}.profile.json").read_text(),
        "assignment": json.loads((PROFILES / f"{name}.assignment.json").read_text()),
        "session_providers": meta["session_providers"],
        "available_providers": meta["available_providers"],
        "graph_nodes": meta["graph"]["nodes"],
        "ort_version": meta["ort_version"],
    }


def graph_names():
    meta = json.loads((PROFILES / "ov124_det.meta.json").read_text())
    return session_names(meta["graph"]["nodes"], None)


@pytest.mark.parametrize("name", sorted(p.stem for p in REPORTS.glob("*.json")))
def test_every_fixture_is_marked_synthetic_with_its_source(name):
    doc = json.loads((REPORTS / f"{name}.json").read_text())
    assert doc["synthetic"] is True and "documented format" in doc["source"]


def test_a_report_of_every_node_on_the_npu():
    report = read_report("vitisai", report_text("vitisai_all_npu"), graph_names())
    assert report.usable and (report.nodes_on_target, report.nodes_total, report.fraction) == (5, 5, 1.0)


def test_cpu_nodes_inside_the_partition_are_counted_off_the_target():
    report = read_report("vitisai", report_text("vitisai_cpu_inside"), graph_names())
    assert report.usable and report.fraction == 0.4
    assert report.off_target == {"CPU": {"Add": ("add",), "Relu": ("relu",), "Det": ("det",)}}


def test_a_report_that_claims_a_node_the_graph_does_not_have_is_unusable():
    report = read_report("vitisai", report_text("vitisai_ghost_node"), graph_names())
    assert not report.usable and report.fraction is None
    assert any("'ghost'" in p for p in report.problems)


def test_counts_that_disagree_make_it_unusable():
    report = read_report("vitisai", report_text("vitisai_counts_disagree"), graph_names())
    assert not report.usable
    assert report.problems == ("deviceStat says 4 nodes on NPU, nodeStat lists 5",)


@pytest.mark.parametrize(("text", "problem"), [
    (None, "the EP wrote no report"),
    ("{", "the report is not JSON"),
    ('{"deviceStat": []}', "the report has no nodeStat list"),
    ('{"nodeStat": [{"name": "det"}]}', "nodeStat[0] is not an object with string name, opType and device"),
    ('{"nodeStat": [{"name": "det", "opType": "Relu", "device": "NPU"}]}', "is node 'det' (Det) but its op"),
])
def test_malformed_reports_are_unusable_never_an_exception(text, problem):
    report = read_report("vitisai", text, graph_names())
    assert not report.usable and problem in report.problems[0]


def test_unknown_kind_is_a_malformed_argument():
    with pytest.raises(ValueError, match="unknown EP report kind 'other'"):
        read_report("other", "{}", graph_names())


# --------------------------------------------------------------------------- as the proof's rule 7


def test_onnxruntimes_layers_stand_when_the_report_agrees():
    p = prove(**evidence(), ep_report={"kind": "vitisai", "text": report_text("vitisai_all_npu")})
    assert (p.verdict, p.fraction, p.decided_by) == ("placed", 0.75, "node fraction")
    assert p.ep_report["fraction"] == 1.0 and p.conflicts == ()


def test_the_report_decides_where_it_is_stricter():
    plain = prove(**evidence())
    assert plain.verdict == "placed" and plain.fraction == 0.75  # onnxruntime alone: placed
    p = prove(**evidence(), ep_report={"kind": "vitisai", "text": report_text("vitisai_cpu_inside")})
    assert (p.verdict, p.cause, p.fraction) == ("declined", "declined", 0.4)
    assert p.decided_by == "EP report fraction"
    assert p.ep_report["off_target"] == {"CPU": {"Add": ["add"], "Relu": ["relu"], "Det": ["det"]}}
    assert p.conflicts == ("onnxruntime's layers 0.75, the EP's report 0.4: the lower decides (rule 7b)",)
    assert prove(**evidence(), min_placement=0.3,
                 ep_report={"kind": "vitisai", "text": report_text("vitisai_cpu_inside")}).verdict == "placed"


def test_a_report_claiming_nodes_the_graph_lacks_is_an_evidence_conflict():
    p = prove(**evidence(), ep_report={"kind": "vitisai", "text": report_text("vitisai_ghost_node")})
    assert (p.verdict, p.cause) == ("unmeasured", "evidence_conflict")
    assert p.ep_report["usable"] is False


def test_a_report_asked_for_and_not_written_never_passes():
    p = prove(**evidence(), ep_report={"kind": "vitisai", "text": None, "error": "no file"})
    assert (p.verdict, p.cause) == ("unmeasured", "unmeasured")
    assert any("EP report (vitisai): not usable: the EP wrote no report (no file)" in n for n in p.notes)


def test_a_declined_verdict_stays_declined():
    """ov124_none: OpenVINO took nothing. A report (here: of another graph, so unusable) cannot
    turn measured bad news into no news, nor a usable one raise a fraction."""
    p = prove(**evidence("ov124_none"), ep_report={"kind": "vitisai", "text": report_text("vitisai_all_npu")})
    assert (p.verdict, p.cause) == ("declined", "declined")
