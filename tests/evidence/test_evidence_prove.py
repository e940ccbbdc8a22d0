"""``prove`` on evidence recorded from real onnxruntime runs (tests/fixtures/profiles).

The fixtures are what a worker collects: the profile file's text, the plan (onnxruntime
>= 1.24), the session's providers and the fallback banner; ``capture.py`` beside them
regenerates them. Which run made which file is in its ``meta.json`` and the folder's README.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from recorded import runs_timed

from xstage.evidence import CAUSES, VERDICTS, PlacementProof, prove

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"
OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
WEBGPU = "WebGpuExecutionProvider"


def evidence(name: str) -> dict[str, Any]:
    """``prove``'s keyword arguments as the worker would pass them for one recorded run."""
    meta = json.loads((PROFILES / f"{name}.meta.json").read_text())
    plan = PROFILES / f"{name}.assignment.json"
    return {
        "target_ep": meta["requested_ep"],
        "profile_text": (PROFILES / f"{name}.profile.json").read_text(),
        "assignment": json.loads(plan.read_text()) if plan.is_file() else None,
        "session_providers": meta["session_providers"],
        "available_providers": meta["available_providers"],
        "fallback_banner": meta["fallback_banner"],
        "graph_nodes": meta["graph"]["nodes"],
        "ort_version": meta["ort_version"],
    }


def proof(name: str, **overrides: Any) -> PlacementProof:
    return prove(**{**evidence(name), **overrides})


ALL = sorted(p.name.removesuffix(".meta.json") for p in PROFILES.glob("*.meta.json"))


# ----------------------------------------------------------------------- OpenVINO (built-in EP, 1.24.1)


def test_a_graph_openvino_takes_whole_is_placed_with_node_fraction_one():
    p = proof("ov124_whole", min_placement=1.0)
    assert (p.verdict, p.cause, p.basis) == ("placed", None, "plan")
    assert (p.node_fraction, p.nodes_on_target, p.nodes_total) == (1.0, 2, 2)
    assert p.fraction == 1.0 and p.passed
    # One fused subgraph kernel, named after the subgraph, counted as a target kernel.
    assert p.kernels_by_provider == {OV: 1} and p.time_fraction == 1.0
    assert p.cpu_nodes == {} and p.off_target_nodes == {}


def test_the_det_graph_splits_with_exactly_det_on_the_cpu():
    split = proof("ov124_det", min_placement=0.999)
    assert (split.verdict, split.cause, split.basis) == ("declined", "declined", "plan")
    assert (split.nodes_on_target, split.nodes_total) == (3, 4)  # as partitioned: MatMul+Add is one Gemm
    # 1 - (original nodes on other providers: det) / (the nodes the plan lists: 4; MatMul+Add ran as one Gemm)
    assert (split.node_fraction, split.node_basis, split.original_nodes_off_target) == (0.75, "plan", 1)
    assert split.original_nodes_total == 4
    assert split.decided_by == "node fraction" and split.time_fraction > split.node_fraction
    assert split.cpu_nodes == {"Det": ("det",)}  # node by node: nothing else left the target
    assert split.off_target_nodes == {CPU: {"Det": ("det",)}}
    assert split.kernels_by_provider == {CPU: 1, OV: 1}
    assert "verdict: declined (node fraction 0.75 < min_placement 0.999)" in split.notes

    relaxed = proof("ov124_det", min_placement=0.5)
    assert (relaxed.verdict, relaxed.cause, relaxed.fraction) == ("placed", None, 0.75)
    assert relaxed.cpu_nodes == {"Det": ("det",)}


def test_a_graph_openvino_takes_none_of_is_declined_not_unmeasured():
    p = proof("ov124_none", min_placement=0.0)
    assert OV in p.session_providers  # listed by the session, and it holds zero nodes
    assert (p.verdict, p.cause, p.basis, p.fraction) == ("declined", "declined", "plan", 0.0)
    assert p.cpu_nodes == {"Det": ("det",)} and p.time_fraction == 0.0


def test_openvino_takes_an_if_whole_and_the_plan_counts_the_if_where_it_runs():
    p = proof("ov124_if")
    assert (p.nodes_on_target, p.nodes_total) == (2, 3)  # Greater and If on OpenVINO; ReduceSum on CPU
    assert p.cpu_nodes == {"ReduceSum": ("sum",)} and p.graph_node_count == 5
    assert any("listed without its branches" in note for note in p.notes)


# ----------------------------------------------------------------------- swaps


@pytest.mark.parametrize(
    "name", ["ort132_swap_cuda", "ov124_npu_absent", "ov124_fallback", "webgpu130_no_adapter"]
)
def test_a_swapped_provider_measured_on_the_cpu_is_declined_with_cause_provider_swapped(name):
    p = proof(name)
    assert p.target_ep not in p.session_providers
    assert (p.verdict, p.cause, p.swapped, p.fraction) == ("declined", "provider_swapped", True, 0.0)


def test_not_in_the_build_is_named():
    p = proof("ort132_swap_cuda")
    assert any("CUDAExecutionProvider is not in this onnxruntime build" in note for note in p.notes)


@pytest.mark.parametrize("name", ["ov124_fallback", "webgpu130_no_adapter"])
def test_the_fallback_banner_is_a_swap_by_itself(name):
    # Even with the session's providers not collected, the banner alone is enough.
    p = proof(name, session_providers=None)
    assert p.fallback_banner and p.swapped and p.cause == "provider_swapped"
    assert any("Falling back to ['CPUExecutionProvider'] and retrying." in note for note in p.notes)


def test_a_swap_with_no_evidence_is_unmeasured_never_declined():
    p = proof("ov124_npu_absent", profile_text=None, assignment=None)
    assert (p.verdict, p.cause, p.basis, p.fraction) == ("unmeasured", "provider_swapped", None, None)


def test_a_swap_contradicted_by_the_evidence_is_unmeasured():
    # The session says OpenVINO is gone, yet the plan puts every node on it: nothing to trust.
    p = proof("ov124_whole", session_providers=[CPU])
    assert (p.verdict, p.cause) == ("unmeasured", "provider_swapped")
    assert any("contradictory" in note for note in p.notes)


def test_requested_ep_absent_from_session_providers_is_a_swap():
    p = proof("ov124_whole", requested_ep="VitisAIExecutionProvider", min_placement=0.0)
    assert p.requested_ep == "VitisAIExecutionProvider" and p.cause == "provider_swapped"
    assert p.verdict == "unmeasured"  # the evidence shows OpenVINO did run: contradictory, not declined


# ----------------------------------------------------------------------- no evidence


def test_no_profile_and_no_plan_is_unmeasured():
    p = proof("ov124_whole", profile_text=None, assignment=None, min_placement=0.0)
    assert (p.verdict, p.cause, p.basis, p.fraction) == ("unmeasured", "unmeasured", None, None)
    assert not p.passed and p.profile_format is None
    assert "profile: no profile was collected" in p.notes


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9])
def test_a_truncated_profile_without_a_plan_is_unmeasured_with_a_note(cut):
    whole = evidence("ort119_cpu_mlp")["profile_text"]
    p = proof("ort119_cpu_mlp", profile_text=whole[: int(len(whole) * cut)])
    assert (p.verdict, p.cause) == ("unmeasured", "unmeasured")
    assert "profile: not used as evidence (incomplete)" in p.notes


@pytest.mark.parametrize("garbage", ["", "\x00garbage\x01", "{", "[\n]", '{"traceEvents": 3}', "[1, 2, 3]"])
def test_a_garbage_profile_without_a_plan_is_unmeasured_with_a_note(garbage):
    p = proof("ort119_cpu_mlp", profile_text=garbage, min_placement=0.0)
    assert (p.verdict, p.cause) == ("unmeasured", "unmeasured")
    assert any(note.startswith("profile: ") for note in p.notes)


def test_every_prefix_of_a_recorded_profile_is_judged_without_an_exception():
    whole = evidence("ort130_cpu_quoted")["profile_text"]
    for end in range(len(whole) + 1):
        p = proof("ort130_cpu_quoted", profile_text=whole[:end], assignment=None)
        assert p.verdict in VERDICTS
        if p.verdict == "placed":  # only a whole profile is evidence
            assert whole[:end].rstrip().endswith("]")


def test_an_empty_plan_is_not_evidence():
    p = proof("ov124_whole", profile_text=None, assignment=[])
    assert (p.verdict, p.cause) == ("unmeasured", "unmeasured")
    assert "plan: empty (no node recorded)" in p.notes


# ----------------------------------------------------------------------- execution evidence


def test_the_119_profile_is_judged_on_execution():
    assert evidence("ort119_cpu_mlp")["assignment"] is None  # 1.19 has no assignment API
    p = proof("ort119_cpu_mlp")
    assert (p.verdict, p.basis, p.profile_format) == ("placed", "execution (plan incomplete)", "json")
    # the kernels' original nodes, each once: 3 (MatMul+Add ran as one Gemm, twice; Relu; Tanh), not the
    # graph's 7
    assert (p.node_fraction, p.node_basis, p.original_nodes_total) == (1.0, "execution", 3)
    assert p.time_fraction == 1.0 and p.kernels_total == 3 and p.names_checked


@pytest.mark.parametrize("name", ["ort119_cpu_quoted", "ort130_cpu_quoted", "ort132_cpu_quoted"])
def test_names_the_worker_did_not_check_make_the_layers_unusable(name):
    # What a session run with the author's names gives: the worker now renames such a graph.
    p = proof(name)
    assert (p.verdict, p.cause, p.basis, p.names_checked) == ("unmeasured", "unmeasured", None, False)
    assert any("failed the name check (rule 1c)" in note for note in p.notes)


def test_the_cpu_route_is_placed_when_the_nodes_are_on_the_cpu():
    p = proof("ort132_cpu_mlp", min_placement=1.0)
    assert (p.verdict, p.basis, p.node_fraction) == ("placed", "plan", 1.0)
    assert p.cpu_nodes == {}  # nothing was left behind: the CPU is the target
    assert any("5 nodes as partitioned, 7 in the ONNX graph" in note for note in p.notes)


def test_unnamed_nodes_are_labelled_op_type_and_index():
    p = proof("ort132_cpu_mlp", target_ep=OV, session_providers=[OV, CPU], requested_ep=OV)
    assert p.cpu_nodes == {
        "Relu": ("Relu#0", "Relu#1"), "Tanh": ("Tanh#0",),
        "Gemm": ("/MatMulAddFusion", "/MatMulAddFusion_token_0"),
    }


def test_memcpy_kernels_are_copies_not_compute():
    # WebGPU on an H200: Det stays on the CPU and two MemcpyFromHost kernels run on the WebGPU EP.
    raw = json.loads(evidence("webgpu130_det")["profile_text"])
    memcpy = [e for e in raw if e["cat"] == "Node" and e["args"].get("op_name", "").startswith("Memcpy")]
    assert len(memcpy) == 2 and {e["args"]["provider"] for e in memcpy} == {WEBGPU}
    p = proof("webgpu130_det")
    assert (p.copies, p.copy_time_us) == (2, sum(e["dur"] for e in memcpy))
    assert p.kernels_by_provider == {CPU: 1, WEBGPU: 3}  # Gemm, Relu, Add: not the copies
    compute = [e for e in raw if e["cat"] == "Node" and e not in memcpy]
    assert p.kernel_time_total_us == sum(e["dur"] for e in compute)
    assert p.cpu_nodes == {"Det": ("det",)}


def test_a_plan_missing_the_eps_that_ran_is_not_used():
    # onnxruntime 1.30 lists only the CPU's node in the WebGPU plan: read alone it would say 0.
    assert [sg["ep"] for sg in evidence("webgpu130_det")["assignment"]] == [CPU]
    p = proof("webgpu130_det", min_placement=0.75)
    assert (p.verdict, p.basis, p.node_basis) == ("placed", "execution (plan incomplete)", "execution")
    assert (p.nodes_on_target, p.nodes_total) == (0, 1)
    # det off the target, of the 4 original nodes the name-checked kernels ran (MatMul+Add as one Gemm)
    assert (p.node_fraction, p.decided_by) == (0.75, "node fraction")
    assert p.fraction == p.node_fraction and p.kernel_fraction == 0.75
    assert any(note.startswith(f"plan: incomplete: it lists none of {WEBGPU}'s nodes") for note in p.notes)
    assert proof("webgpu130_det", min_placement=0.8).verdict == "declined"  # the node fraction decides


def test_a_plan_of_inserted_nodes_only_is_not_used():
    # The tower on WebGPU (an H100): the plan lists only the two layout Transposes onnxruntime
    # inserted for the EP; read as complete it said "0 of 0 original nodes", and declined.
    assert {n["name"] for sg in evidence("webgpu130_vision")["assignment"] for n in sg["nodes"]} \
        == {"Transpose_token_31", "Transpose_token_32"}
    p = proof("webgpu130_vision", min_placement=1.0)
    assert (p.verdict, p.basis, p.node_basis) == ("placed", "execution (plan incomplete)", "execution")
    assert p.node_fraction == 1.0 and p.kernels_by_provider == {WEBGPU: p.kernels_total}
    assert any("onnxruntime inserted" in note and "none of the graph's own" in note for note in p.notes)


def test_a_plan_of_inserted_nodes_only_does_not_hide_what_ran_on_the_cpu():
    # The control: the same plan, with the graph's Conv run on the CPU in every profiled run.
    # The execution decides and counts it: not placed at --min-placement 1.
    raw = json.loads(evidence("webgpu130_vision")["profile_text"])
    moved = 0
    for event in raw:
        if event.get("cat") == "Node" and event["name"].startswith("node_conv3d") \
                and event["name"].endswith("_kernel_time"):
            event["args"]["provider"] = CPU
            moved += 1
    assert moved
    p = proof("webgpu130_vision", profile_text=json.dumps(raw), min_placement=1.0)
    assert p.basis == "execution (plan incomplete)" and p.verdict != "placed"
    assert "Conv" in p.cpu_nodes


def test_an_unreadable_kernel_line_is_not_overlooked():
    # Without the rule, the lost CPU kernel would leave the CPU with less than it ran.
    broken = evidence("ort130_cpu_quoted")["profile_text"].replace('"quoted"', '"quo\nted"')
    p = proof("ort130_cpu_quoted", profile_text=broken, assignment=None)
    assert (p.verdict, p.cause) == ("unmeasured", "unmeasured")


def test_memcpy_nodes_of_a_plan_are_copies_not_nodes():
    plan = evidence("ov124_det")["assignment"]
    plan[0]["nodes"].append({"name": "Memcpy", "op_type": "MemcpyFromHost", "domain": ""})
    plan[1]["nodes"].append({"name": "", "op_type": "MemcpyToHost", "domain": ""})
    p = proof("ov124_det", assignment=plan)
    assert (p.plan_copies, p.nodes_on_target, p.nodes_total) == (2, 3, 4)
    assert p.cpu_nodes == {"Det": ("det",)}


def test_a_profile_of_several_runs_says_so():
    text = evidence("ov124_det")["profile_text"].rstrip().removesuffix("]")
    events = json.loads(evidence("ov124_det")["profile_text"])
    later = [{**e, "ts": e["ts"] + 10**6} for e in events]  # the same run again, a second later
    doubled = text.rstrip() + ",\n" + ",\n".join(json.dumps(e) for e in later) + "\n]\n"
    p = proof("ov124_det", profile_text=doubled, assignment=None)
    assert p.runs == 2 and p.timed_runs == (2,) and p.kernels_total == 2  # run 1 is not timed
    assert any(note.endswith("over run 2 of 2") for note in p.notes)


def test_an_empty_plan_falls_back_to_execution():
    p = proof("webgpu130_mlp", min_placement=1.0)
    assert evidence("webgpu130_mlp")["assignment"] == []
    assert (p.verdict, p.basis) == ("placed", "execution (plan incomplete)")
    assert p.kernels_by_provider == {WEBGPU: 5}


@pytest.mark.parametrize("name", ["ort132_cpu_if", "ort119_cpu_if"])
def test_control_flow_counts_its_own_time_not_its_childrens(name):
    raw = [e for e in json.loads(evidence(name)["profile_text"])
           if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    branch = [e for e in raw if e["args"]["op_name"] == "If"]
    relu = [e for e in raw if e["name"] == "then_relu_kernel_time"]
    assert len(branch) == 1 and branch[0]["dur"] > 0
    assert branch[0]["ts"] <= relu[0]["ts"] <= branch[0]["ts"] + branch[0]["dur"]  # the branch ran inside it
    p = proof(name, assignment=None)
    assert (p.control_flow_kernels, p.control_flow_time_us) == (1, branch[0]["dur"])
    assert p.control_flow_own_time_us == branch[0]["dur"] - relu[0]["dur"]
    assert p.kernels_total == 3  # ReduceSum, Greater, then_relu: the If is not a kernel of its own
    # every kernel's time once: the If's own time on the CPU, its child's as its own kernel
    assert p.kernel_time_total_us == sum(e["dur"] for e in raw) - relu[0]["dur"]
    assert p.kernel_time_by_provider_us == {CPU: p.kernel_time_total_us}


def test_the_if_counts_as_a_node_of_the_plan_where_it_runs():
    p = proof("ort132_cpu_if")
    assert (p.nodes_total, p.graph_node_count) == (5, 5)  # the If and its branches' nodes


def _timed_kernels(name: str) -> list[list[dict[str, Any]]]:
    """Runs 2-4's kernel events of a four-run fixture, each run's apart (read here, not by xstage)."""
    raw = json.loads(evidence(name)["profile_text"])
    runs = [e for e in raw if e["name"] == "model_run"]
    assert len(runs) == 4
    return [[e for e in raw if e["cat"] == "Node" and e["name"].endswith("_kernel_time")
             and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]] for r in runs[1:]]


def test_a_scan_whose_work_is_its_own_counts_it_for_the_cpu():
    # A Scan of 150 steps with a body of no node (no child kernel event) beside MatMul -> Relu -> Neg on
    # OpenVINO: before its own time counted, OpenVINO had all the kernel time (time fraction 1.0).
    runs = _timed_kernels("ov124_scan")
    scan = sum(e["dur"] for run in runs for e in run if e["args"]["op_name"] == "Scan")
    ov = sum(e["dur"] for run in runs for e in run if e["args"]["provider"] == OV)
    p = proof("ov124_scan", min_placement=0.5)
    assert p.control_flow_own_time_us == scan > 0
    assert p.kernel_time_by_provider_us == {OV: ov, CPU: scan}  # the sums over runs 2-4
    # Each run's own fraction; one run's OpenVINO kernel took 3,014 us against 54-96 in the others
    # (recorded on a quiet machine), so the median of the runs decides, not the sum (rule 1b).
    each = [sum(e["dur"] for e in run if e["args"]["provider"] == OV) / sum(e["dur"] for e in run)
            for run in runs]
    assert p.run_time_fractions == pytest.approx(each)
    assert p.time_fraction == sorted(each)[1] < ov / (ov + scan) < 1.0
    assert any("the median of the timed runs' own fractions" in n for n in p.notes)
    # The Scan is one of the four nodes the plan lists, on the CPU.
    assert (p.node_fraction, p.original_nodes_total, p.cpu_nodes) == (0.75, 4, {"Scan": ("scan",)})


def test_a_scans_own_time_is_its_event_less_its_childrens():
    # Each of 8 steps runs Add and Hardmax on the CPU and an Identity OpenVINO compiled: kernels inside
    # the Scan's event. Each kernel's time counts once, for its provider; the Scan keeps the rest.
    runs = _timed_kernels("ov124_scan_body")
    own = by_provider = 0
    totals: dict[str, int] = {}
    for run in runs:
        [scan] = [e for e in run if e["args"]["op_name"] == "Scan"]
        inside = [e for e in run if e is not scan and scan["ts"] <= e["ts"] <= scan["ts"] + scan["dur"]]
        assert {e["args"]["provider"] for e in inside} == {OV, CPU} and len(inside) == 8 * 3
        own += scan["dur"] - sum(e["dur"] for e in inside)
        for e in run:
            dur = scan["dur"] - sum(i["dur"] for i in inside) if e is scan else e["dur"]
            totals[e["args"]["provider"]] = totals.get(e["args"]["provider"], 0) + dur
            by_provider += dur
    p = proof("ov124_scan_body")
    assert p.control_flow_own_time_us == own > 0
    assert p.kernel_time_by_provider_us == totals and p.kernel_time_total_us == by_provider
    assert p.time_fraction == totals[OV] / by_provider


@pytest.mark.parametrize("route", ["ov124", "ort119_cpu"])
def test_nodes_onnxruntime_removes_count_nowhere(route):
    # MatMul -> 30 Identity -> 5 Hardmax: onnxruntime removes the Identity nodes before it partitions
    # (1.24's plan, 1.19's kernels list none). The node fraction is the graph's without them: before,
    # the plan's route counted the graph's 36 nodes, 1 - 5/36 = 0.861 on OpenVINO (placed at 0.5).
    padded, plain = proof(f"{route}_padded30"), proof(f"{route}_padded0")
    assert len(evidence(f"{route}_padded30")["graph_nodes"]) == 36
    assert padded.original_nodes_total == plain.original_nodes_total == 6
    assert (padded.node_fraction, padded.verdict) == (plain.node_fraction, plain.verdict)
    if route == "ov124":
        assert padded.node_fraction == pytest.approx(1 / 6) and padded.verdict == "declined"
        assert padded.basis == "plan"
        assert padded.cpu_nodes == {"Hardmax": tuple(f"hardmax{i}" for i in range(5))}
    else:
        assert (padded.node_fraction, padded.verdict) == (1.0, "placed")
        assert padded.basis == "execution (plan incomplete)"


def test_the_cpu_plan_lists_no_identity_either():
    p = proof("ort132_cpu_padded30")
    assert (p.basis, p.original_nodes_total, p.nodes_total, p.verdict) == ("plan", 6, 6, "placed")


@pytest.mark.parametrize("min_placement, verdict", [(0.1, "placed"), (0.5, "unmeasured"), (0.9, "declined")])
def test_a_compiled_partition_with_no_plan_bounds_the_node_fraction(min_placement, verdict):
    # Without a plan (onnxruntime < 1.24), OpenVINO's partition is one kernel: it holds at least one node
    # (1/6) and at most every node the kernels do not name (31/36, the 30 Identity nodes included).
    # Between the bounds the fraction cannot be known: unmeasured, never placed or declined.
    p = proof("ov124_padded30", assignment=None, min_placement=min_placement)
    assert p.verdict == verdict and p.node_basis == ("execution" if verdict != "unmeasured" else None)
    bound = {"placed": 1 / 6, "declined": 31 / 36, "unmeasured": None}[verdict]
    assert p.node_fraction == (pytest.approx(bound) if bound is not None else None)
    assert any("no plan lists their nodes: the node fraction is between 0.1667 and 0.8611" in n
               for n in p.notes)
    # Without the padding the bounds meet: measured, declined.
    assert proof("ov124_padded0", assignment=None, min_placement=0.5).verdict == "declined"


def test_all_zero_durations_give_no_time_fraction():
    raw = json.loads(evidence("ov124_det")["profile_text"])
    for event in raw:
        event["dur"] = 0
    p = proof("ov124_det", profile_text=json.dumps(raw), assignment=None)
    assert (p.verdict, p.cause, p.basis, p.time_fraction) == ("unmeasured", "unmeasured", None, None)
    # the plan names the target and the execution gives no time fraction: rule 5d
    p = proof("ov124_det", profile_text=json.dumps(raw))
    assert (p.verdict, p.cause, p.time_fraction) == ("unmeasured", "evidence_conflict", None)


def test_a_target_cpu_with_a_banner_is_only_noted():
    p = proof("ort132_cpu_mlp", fallback_banner="Falling back to ['CPUExecutionProvider'] and retrying.")
    assert (p.verdict, p.swapped, p.fallback_banner) == ("placed", False, True)


# ----------------------------------------------------------------------- every fixture, closed sets


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_every_recorded_run_gives_a_closed_verdict_and_plain_json(name, threshold):
    p = proof(name, min_placement=threshold)
    assert p.verdict in VERDICTS and (p.cause is None) == (p.verdict == "placed")
    assert p.cause is None or p.cause in CAUSES
    assert p.verdict != "placed" or (p.fraction is not None and p.fraction > 0 and p.fraction >= threshold)
    assert json.loads(json.dumps(p.to_dict())) == p.to_dict()


def test_the_proof_is_frozen():
    p = proof("ov124_whole")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.verdict = "declined"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.kernels_by_provider["x"] = 1  # type: ignore[index]


def test_a_proof_outside_the_closed_sets_cannot_be_built():
    good = proof("ov124_whole")
    with pytest.raises(ValueError, match="verdict must be one of"):
        dataclasses.replace(good, verdict="maybe")
    with pytest.raises(ValueError, match="a placed proof cannot have cause 'declined'"):
        dataclasses.replace(good, cause="declined")


# ----------------------------------------------------------------------- malformed arguments


@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan"), float("inf"), True, "0.5", None])
def test_rejects_min_placement_outside_0_1(bad):
    with pytest.raises(ValueError, match="min_placement must be a number in \\[0, 1\\]"):
        prove(target_ep=OV, min_placement=bad)


def test_rejects_an_empty_target():
    with pytest.raises(ValueError, match="target_ep must be a non-empty string"):
        prove(target_ep="")


@pytest.mark.parametrize(("assignment", "error", "message"), [
    ("CPU", TypeError, "assignment must be a list of subgraphs, not str"),
    ([{"nodes": []}], ValueError, r"assignment\[0\] must be a mapping with a string 'ep'"),
    ([{"ep": CPU, "nodes": "x"}], ValueError, r"assignment\[0\].nodes must be a list of nodes"),
    ([{"ep": CPU, "nodes": [{"name": "a"}]}], ValueError, r"assignment\[0\].nodes\[0\] must be a mapping"),
    ([{"ep": CPU, "nodes": [{"name": 3, "op_type": "Relu"}]}], ValueError,
     r"nodes\[0\].name must be a string"),
])
def test_rejects_an_assignment_not_of_the_workers_shape(assignment, error, message):
    with pytest.raises(error, match=message):
        prove(target_ep=CPU, assignment=assignment)


def test_rejects_provider_lists_that_are_not_lists_of_strings():
    with pytest.raises(TypeError, match="session_providers must be a list of strings or None"):
        prove(target_ep=CPU, session_providers="CPUExecutionProvider")
    with pytest.raises(TypeError, match="graph_nodes must be a list of mappings or None"):
        prove(target_ep=CPU, graph_nodes=["MatMul"])


# ----------------------------------------------------------------------- golden


def test_golden_to_dict_of_the_det_split():
    """The record's view of one proof, verbatim (re-capturing ov124_det changes its durations)."""
    assert proof("ov124_det", min_placement=0.999).to_dict() == {
        "target_ep": OV,
        "requested_ep": OV,
        "session_providers": [OV, CPU],
        "available_providers": [OV, CPU],
        "ort_version": "1.24.1",
        "verdict": "declined",
        "cause": "declined",
        "basis": "plan",
        "fraction": 0.75,
        "min_placement": 0.999,
        "swapped": False,
        "fallback_banner": False,
        "node_fraction": 0.75,
        "nodes_on_target": 3,
        "nodes_total": 4,
        "plan_copies": 0,
        "graph_node_count": 5,
        "time_fraction": 1995 / 2038,
        "kernel_fraction": 0.5,
        "event_fraction": 0.5,
        "kernels_on_target": 1,
        "kernels_total": 2,
        "kernel_time_on_target_us": 1995,
        "kernel_time_total_us": 2038,
        "kernels_by_provider": {CPU: 1, OV: 1},
        "kernel_time_by_provider_us": {CPU: 43, OV: 1995},
        "control_flow_kernels": 0,
        "control_flow_time_us": 0,
        "control_flow_own_time_us": 0,
        "copies": 0,
        "copy_time_us": 0,
        "runs": 1,
        "profile_format": "json",
        "cpu_nodes": {"Det": ["det"]},
        "off_target_nodes": {CPU: {"Det": ["det"]}},
        "notes": [
            "plan: 4 nodes (3 on OpenVINOExecutionProvider, 1 on CPUExecutionProvider)",
            "execution: 2 compute kernels a run, 2038 us (1 on CPUExecutionProvider, "
            "1 on OpenVINOExecutionProvider) over run 1 of 1",
            "execution: one profiled run: its time includes the EP's start-up costs (rule 1b times runs 2-4)",
            "node fraction (plan): 1 - 1/4 original nodes off OpenVINOExecutionProvider = 0.75 (the nodes "
            "the plan lists: one onnxruntime removed counts nowhere)",
            "plan: 4 nodes as partitioned, 5 in the ONNX graph (onnxruntime fuses some before it "
            "partitions, e.g. MatMul+Add into Gemm, and a control-flow node an EP compiles is listed "
            "without its branches)",
            "verdict: declined (node fraction 0.75 < min_placement 0.999)",
        ],
        "decided_by": "node fraction",
        "node_basis": "plan",
        "original_nodes_total": 4,
        "original_nodes_off_target": 1,
        "timed_runs": [1],
        "run_time_fractions": [0.978900883218842],
        "conflicts": [],
        "names_checked": True,
        "name_failures": [],
        "renamed": False,
    }


# ---------------------------------------------------- docs/design.md §5's conflict table, work and nodes


def _retimed(name: str, dur_by_provider: dict[str, int]) -> str:
    """A captured profile with each kernel's duration set by its provider (the CPU's share of time)."""
    raw = json.loads(evidence(name)["profile_text"])
    for e in raw:
        provider = e["args"].get("provider")
        if e["cat"] == "Node" and e["name"].endswith("_kernel_time") and provider in dur_by_provider:
            e["dur"] = dur_by_provider[provider]
    return json.dumps(raw)


def test_nodes_on_the_ep_but_the_time_on_the_cpu_is_declined_by_the_time_fraction():
    # Det on the CPU takes 98% of the kernel time while 4 of 5 nodes sit on OpenVINO.
    p = proof("ov124_det", profile_text=_retimed("ov124_det", {OV: 20, CPU: 980}), min_placement=0.5)
    assert (p.verdict, p.cause, p.basis) == ("declined", "declined", "plan")
    assert (p.node_fraction, p.time_fraction, p.decided_by) == (0.75, 0.02, "time fraction")
    assert p.fraction == 0.02 and len(p.conflicts) == 1 and "the lower decides (rule 5b)" in p.conflicts[0]


def test_both_fractions_must_reach_the_threshold():
    p = proof("ov124_det", profile_text=_retimed("ov124_det", {OV: 900, CPU: 100}), min_placement=0.85)
    assert (p.node_fraction, p.time_fraction) == (0.75, 0.9)
    assert (p.verdict, p.decided_by) == ("declined", "node fraction") and p.conflicts
    assert proof("ov124_det", profile_text=_retimed("ov124_det", {OV: 900, CPU: 100}),
                 min_placement=0.75).passed


def test_a_plan_on_the_target_with_an_unusable_execution_is_evidence_conflict():
    text = evidence("ov124_det")["profile_text"].replace("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0",
                                                         "someone_else")
    p = proof("ov124_det", profile_text=text, min_placement=0.0)
    assert (p.verdict, p.cause, p.basis) == ("unmeasured", "evidence_conflict", "plan")
    assert p.names_checked is False and not p.passed


def test_an_incomplete_plan_and_an_unusable_execution_is_unmeasured():
    text = evidence("webgpu130_det")["profile_text"].replace('"relu_kernel_time"', '"relux_kernel_time"')
    p = proof("webgpu130_det", profile_text=text, min_placement=0.0)
    assert (p.verdict, p.cause, p.basis) == ("unmeasured", "unmeasured", None)


def test_the_time_fraction_leaves_out_the_first_run():
    # Four runs: run 1 carries a 10 s OpenVINO start-up; runs 2-4 give Det on the CPU 98% of the time.
    raw = json.loads(evidence("ov124_det")["profile_text"])
    runs = []
    for k in range(4):
        for e in raw:
            e2 = {**e, "ts": e["ts"] + k * 10**8, "args": dict(e["args"])}
            if e2["cat"] == "Node" and e2["name"].endswith("_kernel_time"):
                e2["dur"] = (10**7 if k == 0 else 20) if e2["args"]["provider"] == OV else 980
            if e2["name"] == "model_run":
                e2["dur"] = max(e2["dur"], 2 * 10**7)
            runs.append(e2)
    p = proof("ov124_det", profile_text=json.dumps(runs), min_placement=0.5)
    assert (p.runs, p.timed_runs, p.kernels_total) == (4, (2, 3, 4), 2)
    assert p.kernel_time_total_us == 3 * 1000 and p.time_fraction == 0.02
    assert (p.verdict, p.decided_by) == ("declined", "time fraction")


def _runs_timed(per_run: list[dict[str, int]]) -> str:
    """ov124_det's one run repeated, run k's kernels timed by ``per_run[k]`` (by provider)."""
    return runs_timed(json.loads(evidence("ov124_det")["profile_text"]), per_run)


def test_a_delay_in_one_runs_target_kernel_does_not_carry_the_sum_past_the_threshold():
    # The false "placed" a loaded machine gave: Det on the CPU has 98% of the time in every run,
    # but one run's OpenVINO kernel was preempted for 100 ms; the sum gave OpenVINO 0.97.
    quiet, delayed = {OV: 20, CPU: 980}, {OV: 100_000, CPU: 980}
    text = _runs_timed([{OV: 10**6, CPU: 980}, quiet, delayed, quiet])
    p = proof("ov124_det", profile_text=text, min_placement=0.5)
    assert p.run_time_fractions == (0.02, pytest.approx(100_000 / 100_980), 0.02)
    assert p.kernel_time_total_us == 102_980  # the sums stay sums
    assert (p.time_fraction, p.decided_by, p.verdict) == (0.02, "time fraction", "declined")
    assert any("below their sum's 0.9" in n for n in p.notes)


def test_a_run_with_more_time_off_the_target_still_counts_through_the_sum():
    # The other way round the median would raise the fraction: the lower of the two decides.
    placed, heavy = {OV: 900, CPU: 100}, {OV: 900, CPU: 100_000}
    p = proof("ov124_det", profile_text=_runs_timed([placed, placed, heavy, placed]), min_placement=0.5)
    assert p.run_time_fractions == (0.9, pytest.approx(900 / 100_900), 0.9)
    assert p.time_fraction == pytest.approx(2700 / (2700 + 100_200)) and p.verdict == "declined"
    assert not any("median" in n for n in p.notes)


def test_two_timed_runs_take_the_lower_and_a_zero_run_leaves_the_sum():
    two = proof("ov124_det", profile_text=_runs_timed([{OV: 5, CPU: 5}, {OV: 900, CPU: 100},
                                                       {OV: 10_000, CPU: 100}]))
    assert two.timed_runs == (2, 3) and two.time_fraction == 0.9  # median_low of (0.9, 0.99)
    zero = proof("ov124_det", profile_text=_runs_timed([{OV: 5, CPU: 5}, {OV: 0, CPU: 0},
                                                        {OV: 10_000, CPU: 100}, {OV: 900, CPU: 100}]))
    assert zero.run_time_fractions == (None, pytest.approx(10_000 / 10_100), 0.9)
    assert zero.time_fraction == 10_900 / 11_100  # no median of a run that took 0 us


@pytest.mark.parametrize("name", ["ov124_det_runs4", "ort119_cpu_mlp_runs4"])
def test_a_real_four_run_profile_is_timed_over_runs_2_to_4(name):
    raw = json.loads(evidence(name)["profile_text"])
    runs = [e for e in raw if e["name"] == "model_run"]
    kernels = [e for e in raw if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    first_end = runs[0]["ts"] + runs[0]["dur"]
    later = [e for e in kernels if e["ts"] > first_end]
    p = proof(name)
    assert (p.runs, p.timed_runs) == (4, (2, 3, 4))
    assert p.kernel_time_total_us == sum(e["dur"] for e in later) < sum(e["dur"] for e in kernels)
    assert p.kernels_total * 4 == len(kernels)  # counts are of one run


def test_the_first_run_carries_openvino_s_start_up():
    raw = json.loads(evidence("ov124_det_runs4")["profile_text"])
    ov = [e["dur"] for e in raw if e["cat"] == "Node" and e["args"].get("provider") == OV]
    assert ov[0] > 5 * max(ov[1:])  # measured: 812 us, then 26, 11, 10
    p = proof("ov124_det_runs4")
    assert p.time_fraction == sum(ov[1:]) / p.kernel_time_total_us


# ----------------------------------------------------------------------- ggml (plugin EP, 1.30.0)


def test_a_graph_ggml_compiles_whole_is_placed_by_both_layers():
    # One compiled kernel, ggml_<ggml_<hash>_0>_0, on provider ggml; the plan lists every node on ggml.
    p = proof("ggml130_whole", min_placement=1.0)
    assert (p.verdict, p.cause, p.basis) == ("placed", None, "plan")
    assert (p.node_fraction, p.time_fraction) == (1.0, 1.0)
    assert p.kernels_by_provider == {"ggml": 1} and p.names_checked is True


def test_ggml_lacking_an_op_claims_nothing_and_is_declined_not_swapped():
    # The VitisAI trap on this machine: the session still lists ggml, every node runs on the CPU EP.
    ev = evidence("ggml130_det")
    assert ev["session_providers"] == ["ggml", CPU]
    p = proof("ggml130_det")
    assert (p.verdict, p.cause, p.swapped) == ("declined", "declined", False)
    assert p.fraction == 0.0 and p.kernels_by_provider == {CPU: 3}
    assert p.cpu_nodes == {"Relu": ("relu",), "Det": ("det",), "Add": ("add_det",), "Gemm": ("matmul",)}


def test_a_compiled_kernel_named_for_another_provider_fails_the_name_check():
    text = evidence("ggml130_whole")["profile_text"].replace('"provider":"ggml"', '"provider":"other"')
    text = text.replace('"provider" : "ggml"', '"provider" : "other"')
    p = proof("ggml130_whole", profile_text=text, target_ep="other", session_providers=["other", CPU],
              requested_ep="other", assignment=None)
    assert (p.verdict, p.names_checked) == ("unmeasured", False)
