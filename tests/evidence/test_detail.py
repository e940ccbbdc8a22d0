"""``placement_detail`` on evidence recorded from real onnxruntime runs (tests/fixtures/profiles)."""

from __future__ import annotations

import json
from pathlib import Path

from xstage.evidence.detail import placement_detail

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"
OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"


def _detail(name: str, target: str) -> dict:
    meta = json.loads((PROFILES / f"{name}.meta.json").read_text())
    assignment = PROFILES / f"{name}.assignment.json"
    return placement_detail(
        profile_text=(PROFILES / f"{name}.profile.json").read_text(),
        assignment=json.loads(assignment.read_text()) if assignment.exists() else None,
        node_names=None,
        graph_nodes=meta["graph"]["nodes"],
        target_ep=target,
    )


def test_the_det_split_names_each_original_node_and_its_provider():
    """Rule 1: the plan decides; Add fused into the MatMul's Gemm is named by neither layer."""
    d = _detail("ov124_det_runs4", OV)
    rows = {n["name"]: (n["provider"], n["source"]) for n in d["nodes"]}
    assert rows == {
        "matmul": (OV, "plan"),
        "add": (None, None),
        "relu": (OV, "plan"),
        "det": (CPU, "plan"),
        "add_det": (OV, "plan"),
    }
    assert d["names_checked"] is True
    assert [n["name"] for n in d["nodes"]] == ["matmul", "add", "relu", "det", "add_det"]


def test_time_is_the_timed_runs_and_the_fused_kernels_keep_theirs():
    """Rules 3-4: Det's own kernel time sums runs 2-4; OpenVINO's partitions carry the rest."""
    d = _detail("ov124_det_runs4", OV)
    assert d["timed_runs"] == [2, 3, 4] and len(d["runs"]) == 4
    det = [k for k in d["kernels"] if k["node"] == "det" and k["run"] in (2, 3, 4)]
    assert next(n for n in d["nodes"] if n["name"] == "det")["kernel_time_us"] == sum(
        k["dur_us"] for k in det
    )
    assert {p["provider"] for p in d["partitions"]} == {OV}
    assert all(n["kernel_time_us"] is None for n in d["nodes"] if n["provider"] == OV)


def test_partitions_map_to_plan_subgraphs_when_the_counts_agree():
    """Rule 3: one OpenVINO subgraph in the plan, one partition kernel in the profile."""
    d = _detail("ov124_det_runs4", OV)
    assert d["partitions"] == [
        {
            "name": "OpenVINO-EP-subgraph_1",
            "provider": OV,
            "nodes": 3,
            "kernel_time_us": d["partitions"][0]["kernel_time_us"],
        }
    ]
    assert {n["name"] for n in d["nodes"] if n["partition"]} == {"matmul", "relu", "add_det"}


def test_partitions_stay_unmapped_when_the_counts_disagree():
    """Rule 3: the same evidence with the plan's OpenVINO subgraph cut in two: no guessing."""
    meta = json.loads((PROFILES / "ov124_det_runs4.meta.json").read_text())
    plan = json.loads((PROFILES / "ov124_det_runs4.assignment.json").read_text())
    ov = plan[0]
    cut = [{"ep": OV, "nodes": ov["nodes"][:1]}, {"ep": OV, "nodes": ov["nodes"][1:]}, *plan[1:]]
    d = placement_detail(
        profile_text=(PROFILES / "ov124_det_runs4.profile.json").read_text(),
        assignment=cut,
        node_names=None,
        graph_nodes=meta["graph"]["nodes"],
        target_ep=OV,
    )
    assert all(n["partition"] is None for n in d["nodes"])
    assert d["partitions"][0]["nodes"] == 0 and d["partitions"][0]["kernel_time_us"] > 0


def test_every_kernel_of_every_run_is_kept_with_its_clock():
    d = _detail("ort132_cpu_vision", CPU)
    assert d["kernels_dropped"] == 0
    assert {k["run"] for k in d["kernels"]} == {r["run"] for r in d["runs"]}
    assert all(isinstance(k["ts_us"], int) and k["dur_us"] >= 0 for k in d["kernels"])
    assert all(k["checked"] for k in d["kernels"])
    placed = [n for n in d["nodes"] if n["provider"] == CPU]
    assert placed and all(n["source"] == "plan" for n in placed)


def test_no_evidence_is_an_empty_view_not_an_error():
    d = placement_detail(
        profile_text=None,
        assignment=None,
        node_names=None,
        graph_nodes=[{"name": "a", "op_type": "Relu"}],
        target_ep=OV,
    )
    assert d["nodes"] == [
        {
            "name": "a",
            "op_type": "Relu",
            "provider": None,
            "source": None,
            "partition": None,
            "kernel_time_us": None,
            "outputs": [],
        }
    ]
    assert d["kernels"] == [] and d["runs"] == [] and d["partitions"] == []
