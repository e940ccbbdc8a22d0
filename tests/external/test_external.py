"""``xstage external`` end to end: real workers, real sessions, real profiles."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import psutil
import pytest

from xstage.record import read_record


def _refusal(record):
    (last, *_) = reversed(record["outcome"]["refusals"])
    return last


def test_builtin_stage_on_the_reference_arm_is_placed_gated_timed_and_says_so(external):
    """``--route ort-cpu`` asks for the reference arm: exit 0, a placed proof, a passed gate,
    timings, a valid record, labelled the reference arm (never an offload)."""
    r = external("--route", "ort-cpu")
    assert r.code == 0, r.stderr
    rec = r.record
    assert rec["outcome"]["status"] == "placed" and rec["plan"]["chosen"]["route"] == "ort-cpu"
    assert rec["plan"]["on_reference_arm"] is True and rec["plan"]["mode"] == "route"
    assert "the reference arm, not an offload" in _summary_row(r.stdout, "placed on"), r.stdout
    assert "nothing was offloaded" in _summary_row(r.stdout, "reference arm")
    assert rec["proof"]["verdict"] == "placed" and rec["proof"]["fraction"] == 1.0
    assert rec["parity"]["verdict"] == "passed"
    assert rec["timings"]["runs"] == 3 and rec["timings"]["compute"]["p50_ms"] > 0
    assert rec["memory"]["peak_bytes"] > 0
    assert "Traceback" not in r.stderr


def test_openvino_takes_the_mlp_whole(external, graphs, openvino_python):
    r = external("--graph", str(graphs["mlp"]), "--route", "ort-openvino",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 0, r.stderr
    proof = r.record["proof"]
    assert proof["verdict"] == "placed" and proof["basis"] == "plan"
    assert proof["node_fraction"] == 1.0 and proof["target_ep"] == "OpenVINOExecutionProvider"
    assert any("INFERENCE_PRECISION_HINT=f32" in n for n in r.record["worker"]["notes"])
    assert r.record["device_attestation"] == {
        "planned": "cpu", "observed": "cpu", "source": "options_as_applied",
        "detail": "OpenVINO device_type=CPU"}


def _summary_row(stdout: str, key: str) -> str:
    """The text of one summary row (its continuation lines joined)."""
    rows, current = {}, None
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")] if line.startswith("│") else []
        if len(cells) == 2:
            current = cells[0] or current
            if current is not None:
                rows[current] = (rows.get(current, "") + " " + cells[1]).strip()
    return rows.get(key, "")


def test_no_selector_offloads_the_builtin_tower_and_says_which_route_ran(external, openvino_python):
    """The README's main job, no flag: every route but the reference arm first, and it says
    which ran and why."""
    r = external("--builtin", "vision-tower-tiny",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 0, r.stderr
    plan = r.record["plan"]
    assert plan["on_reference_arm"] is False
    assert plan["mode"] == "offload" and plan["reference_arms"] == ["ort-cpu"]
    assert plan["chosen"] == {"device": "cpu", "route": "ort-openvino"}
    assert [c["route"] for c in plan["candidates"]][-1] == "ort-cpu"
    assert r.record["request"]["offload"] is True
    why = _summary_row(r.stdout, "offload")
    assert "ort-openvino on cpu was the first offload route admitted" in why, r.stdout


def test_offload_falls_through_to_the_reference_arm_and_says_why(external, tmp_path):
    """``--offload`` (what no selector does) with no offload route: exit 0 on the reference arm,
    labelled so in the summary and the record."""
    r = external("--builtin", "vision-tower-tiny", "--offload",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(tmp_path / "no-python")})
    assert r.code == 0, r.stderr
    assert r.record["plan"]["chosen"]["route"] == "ort-cpu"
    assert r.record["plan"]["on_reference_arm"] is True
    assert "the reference arm, not an offload" in _summary_row(r.stdout, "placed on")
    why = _summary_row(r.stdout, "offload")
    assert "no offload route was admitted (ort-openvino on cpu: route_missing)" in why, r.stdout
    assert "reference arm ort-cpu" in why


def test_offload_with_a_selector_is_a_usage_error(external):
    r = external("--offload", "--route", "ort-cpu")
    assert r.code == 64 and "--offload chooses the routes itself" in r.stderr


def test_det_graph_splits_and_is_refused_at_0999_with_the_node_named(external, graphs,
                                                                     openvino_python):
    env = {"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)}
    r = external("--graph", str(graphs["det"]), "--route", "ort-openvino",
                 "--min-placement", "0.999", env=env)
    assert r.code == 2, r.stderr
    refusal = _refusal(r.record)
    assert refusal["code"] == "execution_provider_declined_graph" and refusal["cause"] == "declined"
    assert refusal["evidence"]["cpu_nodes"] == {"Det": ["det"]}
    assert "Det" in r.stderr and "Traceback" not in r.stderr
    ok = external("--graph", str(graphs["det"]), "--route", "ort-openvino",
                  "--min-placement", "0.5", env=env)
    assert ok.code == 0, ok.stderr
    assert ok.record["proof"]["cpu_nodes"] == {"Det": ["det"]} and ok.record["proof"]["fraction"] < 1


def test_graph_openvino_takes_none_of_is_declined(external, graphs, openvino_python):
    r = external("--graph", str(graphs["det_only"]), "--route", "ort-openvino",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 2
    refusal = _refusal(r.record)
    assert (refusal["code"], refusal["cause"]) == ("execution_provider_declined_graph", "declined")


def test_a_node_name_that_forges_openvino_events_cannot_place_a_cpu_graph(external, tmp_path,
                                                                         openvino_python):
    """Wave 1's finding, replayed: a Hardmax (which OpenVINO leaves on the CPU) whose name closes
    its profile event and adds a 10 s OpenVINO kernel was ``placed`` at 100%. The worker now runs a
    renamed copy; the proof sees only its names, and the record names the original node."""
    import onnx
    from onnx import TensorProto, helper

    forged = ('hm_kernel_time","args":{"op_name":"Hardmax","provider":"CPUExecutionProvider"}},'
              '{"cat":"Node","pid":1,"tid":1,"dur":10000000,"ts":1,"ph":"X","name":"x_kernel_time",'
              '"args":{"op_name":"OpenVINO-EP-subgraph_1","provider":"OpenVINOExecutionProvider"}},'
              '{"cat":"Node","pid":1,"tid":1,"dur":1,"ts":1,"ph":"X","name":"y')
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name=forged)], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "forged.onnx"
    onnx.save(model, str(path))
    r = external("--graph", str(path), "--route", "ort-openvino", "--min-placement", "0.999",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 2, r.stderr
    refusal = _refusal(r.record)
    assert (refusal["code"], refusal["cause"]) == ("execution_provider_declined_graph", "declined")
    proof = refusal["evidence"]
    assert (proof["renamed"], proof["names_checked"], proof["time_fraction"]) == (True, True, 0.0)
    assert proof["cpu_nodes"] == {"Hardmax": [forged]} and proof["timed_runs"] == [2, 3, 4]


def test_an_ep_option_for_another_device_is_a_usage_error(external, graphs, openvino_python):
    """device_type=NPU for a stage planned on the CPU: no re-planning, no record (docs/external.md §3);
    before, onnxruntime built the session without the EP and the proof named a swap."""
    r = external("--graph", str(graphs["mlp"]), "--route", "ort-openvino",
                 "--ep-option", "device_type=NPU",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 64 and r.record is None, r.stderr
    assert "--ep-option device_type" in r.stderr and "--device" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_loop_openvino_claims_and_cannot_compile_is_refused(external, openvino_python, tmp_path):
    """OpenVINO takes the Loop at placement, then fails to compile it: exit 2, ep_compile_failed."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import save

    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["y_in", "one"], ["y_out"])],
        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                 h.make_tensor_value_info("y_in", T.FLOAT, [4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("y_out", T.FLOAT, [4])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])])
    graph = h.make_graph(
        [h.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)], "loop",
        [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y", T.FLOAT, [4])],
        [h.make_tensor("M", T.INT64, [], [3]), h.make_tensor("cond", T.BOOL, [], [True])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, tmp_path / "loop.onnx")
    r = external("--graph", str(tmp_path / "loop.onnx"), "--route", "ort-openvino",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 2, r.stderr
    refusal = _refusal(r.record)
    assert (refusal["code"], refusal["cause"]) == ("execution_provider_declined_graph",
                                                   "ep_compile_failed")
    assert "failed to compile" in refusal["message"] and "Traceback" not in r.stderr
    assert r.record["device_attestation"]["source"] == "unattested"


def test_openvino_told_to_compute_in_bf16_fails_the_gate_naming_the_criterion(
        external, graphs, openvino_python):
    """The AMX trap, forced: every node placed, numbers 4e-3 off; the gate refuses."""
    hint = json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "bf16"}})
    r = external("--graph", str(graphs["mlp"]), "--route", "ort-openvino",
                 "--ep-option", f"load_config={hint}",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 2, r.stderr
    refusal = _refusal(r.record)
    assert (refusal["code"], refusal["cause"]) == ("numeric_gate_failed", "tolerance")
    assert refusal["evidence"]["proof"]["verdict"] == "placed"
    criterion = refusal["evidence"]["parity"]["outputs"][0]["criterion"]
    assert "rel_l2" in criterion and ">" in criterion


def test_pinned_route_that_is_missing_is_refused_with_exit_2(external, tmp_path):
    r = external("--route", "ort-openvino",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(tmp_path / "no-python")})
    assert r.code == 2
    refusal = _refusal(r.record)
    assert (refusal["code"], refusal["cause"]) == ("device_unreachable_from_this_process",
                                                   "route_missing")
    assert "no-python" in refusal["message"] and "Traceback" not in r.stderr


def test_corrupt_graph_is_an_error_with_exit_1(external, graphs):
    r = external("--graph", str(graphs["corrupt"]))
    assert r.code == 1
    assert "not a readable ONNX graph" in r.stderr and "Traceback" not in r.stderr
    assert r.record["outcome"]["status"] == "error"


def test_inputs_that_do_not_match_are_an_error_with_exit_1(external, graphs, tmp_path):
    npz = tmp_path / "bad.npz"
    np.savez(npz, x=np.ones((8, 256), np.float64))
    r = external("--graph", str(graphs["mlp"]), "--inputs", str(npz))
    assert r.code == 1, r.stderr
    assert "float64" in r.stderr and "float32" in r.stderr and "Traceback" not in r.stderr


def test_unknown_dimension_names_the_flag(external, graphs):
    r = external("--graph", str(graphs["symbolic"]))
    assert r.code == 64 and "--dim batch=N" in r.stderr
    ok = external("--graph", str(graphs["symbolic"]), "--dim", "batch=3")
    assert ok.code == 0, ok.stderr
    assert ok.record["request"]["inputs"]["tensors"]["x"]["shape"] == [3, 8]


def test_device_and_prefer_together_are_a_usage_error(external):
    r = external("--device", "cpu", "--prefer", "cpu")
    assert r.code == 64


def test_route_that_cannot_drive_the_device_is_a_usage_error(external):
    r = external("--route", "ort-cpu", "--device", "npu:amd")
    assert r.code == 64 and "cannot drive" in r.stderr


def test_a_device_this_machine_lacks_is_refused_never_substituted(external):
    r = external("--device", "npu:intel")
    assert r.code == 2
    refusal = _refusal(r.record)
    assert refusal["code"] == "device_unreachable_from_this_process"


def test_worker_that_dies_during_warmup_is_exit_1_and_leaves_no_process(external, tmp_path):
    """A worker killed in its profiled warm-up: one line naming the death, exit 1."""
    import os
    import stat
    from pathlib import Path

    fault = Path(__file__).parent.parent / "client" / "fault_worker.py"
    fake = tmp_path / "fakepy"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fault}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = external("--route", "ort-cpu", env={"XSTAGE_PYTHON_ORT_CPU": str(fake),
                                            "XSTAGE_FAULT": "crash-on-run"})
    assert r.code == 1, r.stderr
    assert "worker" in r.stderr and "exited with status 9" in r.stderr
    assert "Traceback" not in r.stderr
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - before == set()
    del os


def test_report_validates_and_prints_the_record_again(external, tmp_path):
    r = external()
    assert r.code == 0
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(r.record))
    out = subprocess.run([sys.executable, "-m", "xstage", "report", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "placed" in out.stdout and "ort-cpu" in out.stdout


def test_every_record_made_here_validates(external, graphs, tmp_path):
    """Placed, error and refused records all pass the shipped schema on reading."""
    for i, args in enumerate(((), ("--graph", str(graphs["corrupt"])), ("--device", "npu:intel"))):
        r = external(*args)
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(r.record))
        assert read_record(path)["outcome"]["exit_code"] == r.code


def test_compare_cpu_and_save_outputs(external, graphs, tmp_path):
    """--compare-cpu times the reference arm and reports a speedup; --save-outputs writes an
    npz (no pickle) with the stage's outputs by name."""
    out = tmp_path / "out.npz"
    r = external("--graph", str(graphs["mlp"]), "--compare-cpu", "--save-outputs", str(out))
    assert r.code == 0, r.stderr
    t = r.record["timings"]
    assert t["reference"]["p50_ms"] > 0 and t["speedup_vs_reference"] > 0
    with np.load(out, allow_pickle=False) as saved:
        assert list(saved.files) == ["y"] and saved["y"].shape == (8, 256)


def test_ep_option_that_is_not_key_value_is_a_usage_error(external):
    r = external("--ep-option", "device_type")
    assert r.code == 64 and "KEY=VALUE" in r.stderr


def test_a_stage_placed_on_a_later_preferred_device_keeps_the_earlier_refusals(external, graphs):
    """``--prefer npu,gpu_integrated,cpu`` on a machine with neither an NPU nor an integrated
    GPU: placed on the CPU, and the record (``plan.fallthrough``) and the summary still say why
    each earlier device said no."""
    r = external("--graph", str(graphs["mlp"]), "--prefer", "npu,gpu_integrated,cpu")
    assert r.code == 0, r.stderr
    plan = r.record["plan"]
    assert plan["chosen"]["device"] == "cpu" and r.record["outcome"]["refusals"] == []
    fell = {x["device"]: x for x in plan["fallthrough"]}
    assert {"npu", "gpu_integrated"} <= set(fell)
    for device in ("npu", "gpu_integrated"):
        assert fell[device]["code"] == "device_unreachable_from_this_process"
        assert fell[device]["cause"] == "no_route" and fell[device]["message"]
        assert re.search(rf"fell through\s*│\s*{device}: device_unreachable_from_this_process "
                         r"\(no_route\)", r.stdout), r.stdout


def test_the_seeds_event_fraction_is_recorded_beside_the_verdicts(external, graphs, openvino_python):
    """docs/external.md's worked example: at --min-placement 0.7 the event count (2 of 3
    kernel events on OpenVINO) would refuse the det graph; xstage's node fraction (3 of 4) and
    time fraction both reach it, so it is placed, and the record and summary carry both."""
    r = external("--graph", str(graphs["det"]), "--route", "ort-openvino", "--min-placement", "0.7",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 0, r.stderr
    proof = r.record["proof"]
    assert proof["verdict"] == "placed" and proof["node_fraction"] == 0.75
    assert proof["event_fraction"] == pytest.approx(2 / 3)
    assert proof["event_fraction"] < 0.7 <= proof["fraction"]
    assert proof["time_fraction"] >= proof["fraction"]
    assert re.search(r"event fraction\s*│\s*66\.7% of the first run's kernel events", r.stdout), r.stdout
