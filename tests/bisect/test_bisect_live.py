"""``xstage bisect`` live: real probes (workers of the route), real OpenVINO, seeded chains.

Probes are workers (about a second each here), so the graphs are small and the tests few: one
seeded chain through the CLI (regions exact within 1 + 2·(k+1)·⌈log2 n⌉ probes, the split
placed part by part and equal to the original on the CPU), a graph taken whole (one probe), a
graph declined everywhere (exit 2 with the record), a missing route (exit 2, nothing probed).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from chains import chain, seeded

from xstage.bisect import bisect, probe_bound, run_split
from xstage.bisect.record import read_bisect_record

SEED = 21


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xstage", "bisect", *args], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, COLUMNS="160", **(env or {})))


@pytest.fixture(scope="module")
def split_run(tmp_path_factory, openvino_python):
    """One seeded chain bisected through the CLI, with --out and --json."""
    root = tmp_path_factory.mktemp("bisect-chain")
    n, k = 14, 2
    declined = seeded(SEED, n, k)
    bound = 1 + 2 * (k + 1) * math.ceil(math.log2(n))
    assert bound == probe_bound(n, k)
    print(f"seed {SEED}: n={n}, declined at {declined}, --max-probes {bound} "
          f"= 1 + 2·(k+1)·⌈log2 n⌉")
    graph = root / "chain.onnx"
    onnx.save(chain(n, declined), graph)
    done = _cli("--graph", str(graph), "--route", "ort-openvino", "--max-probes", str(bound),
                "--out", str(root / "split"), "--json", str(root / "record.json"),
                env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    return {"root": root, "graph": graph, "n": n, "declined": declined, "bound": bound,
            "done": done, "python": openvino_python}


def test_a_seeded_chain_is_bisected_exactly_within_the_bound(split_run) -> None:
    done = split_run["done"]
    assert done.returncode == 0, done.stderr
    record = read_bisect_record(split_run["root"] / "record.json")
    n, declined = split_run["n"], split_run["declined"]
    expected, start = [], 0
    for d in [*declined, n]:
        if d > start:
            expected.append([start, d])
        start = d + 1
    assert [[r["start"], r["stop"]] for r in record["regions"]] == expected
    assert record["budget"]["probes"] <= split_run["bound"]
    assert record["budget"]["cut_short"] is None
    print(f"{record['budget']['probes']} probes (bound {split_run['bound']}) in "
          f"{record['budget']['seconds']} s")
    assert [d["op_type"] for d in record["declined_ops"]] == ["Hardmax"]
    assert "left on the CPU: Hardmax" in record["declined_ops"][0]["reason"]
    assert record["probes"][0]["phase"] == "whole" and not record["probes"][0]["accepted"]
    assert "Hardmax" in record["probes"][0]["off_target"]
    shares = sum(r["shares"]["node_share"] for r in record["regions"])
    assert shares == pytest.approx((n - len(declined)) / n)
    assert "accepted regions" in done.stdout and "Hardmax" in done.stdout


def test_the_split_is_placed_part_by_part_and_equal_to_the_original(split_run) -> None:
    record = json.loads((split_run["root"] / "record.json").read_text())
    split = record["split"]
    assert split["check"]["passed"] is True
    assert [p["placed"] for p in split["parts"] if p["kind"] == "region"] == [True] * len(record["regions"])
    assert {p["kind"] for p in split["parts"]} == {"region", "cpu"}
    for part in split["parts"]:
        if part["kind"] == "region":
            assert (split_run["root"] / "split" / (part["graph"] + ".manifest.json")).is_file()


def test_run_split_returns_the_original_outputs_with_each_parts_proof(split_run, monkeypatch) -> None:
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(split_run["python"]))
    x = np.random.default_rng(3).standard_normal((4, 8)).astype("f4")
    run = run_split(split_run["root"] / "split", {"x": x})
    whole = ort.InferenceSession(str(split_run["graph"]), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(run.outputs["y"], whole.run(["y"], {"x": x})[0], rtol=1e-5, atol=1e-6)
    regions = [p for p in run.parts if p.kind == "region"]
    assert regions and all(p.proof is not None and p.proof.verdict == "placed"
                           and p.proof.node_fraction == 1.0 and p.route == "ort-openvino"
                           for p in regions)
    assert all(p.proof is None for p in run.parts if p.kind == "cpu")


def test_a_graph_taken_whole_finishes_in_one_probe(tmp_path, monkeypatch, openvino_python) -> None:
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(openvino_python))
    onnx.save(chain(8, []), tmp_path / "whole.onnx")
    result = bisect(tmp_path / "whole.onnx", route="ort-openvino")
    assert result.exit_code == 0
    assert result.regions == ((0, 8),)
    assert len(result.record["probes"]) == 1
    assert result.record["outcome"]["status"] == "whole"


def test_a_graph_declined_everywhere_reports_no_region_and_exits_2(tmp_path, openvino_python) -> None:
    onnx.save(chain(2, [0, 1]), tmp_path / "declined.onnx")
    done = _cli("--graph", str(tmp_path / "declined.onnx"), "--route", "ort-openvino",
                "--json", str(tmp_path / "r.json"),
                env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    record = read_bisect_record(tmp_path / "r.json")
    assert record["outcome"]["status"] == "no_region"
    assert record["regions"] == []
    assert all(not p["accepted"] for p in record["probes"])
    assert record["declined_ops"][0]["op_type"] == "Hardmax"


def _alloc_chain() -> onnx.ModelProto:
    """Sin, Tanh, Hardmax, Neg; then ``alloc`` (ConstantOfShape of the input ``n``: floats no
    shape inference can size) summed into the chain by ``add``; Sigmoid, Abs. A probe that holds
    ``alloc`` is placed and passes its gate, then the ledger refuses it (``peak_over_budget``):
    a fact about the budget, not about what the route's partitioner takes."""
    from onnx import TensorProto, helper

    one = helper.make_tensor("v", TensorProto.FLOAT, [1], [1e-9])
    nodes = [helper.make_node("Sin", ["x"], ["v0"], name="n0_Sin"),
             helper.make_node("Tanh", ["v0"], ["v1"], name="n1_Tanh"),
             helper.make_node("Hardmax", ["v1"], ["v2"], name="n2_Hardmax"),
             helper.make_node("Neg", ["v2"], ["v3"], name="n3_Neg"),
             helper.make_node("ConstantOfShape", ["n"], ["big"], name="alloc", value=one),
             helper.make_node("ReduceSum", ["big"], ["s"], name="sum", keepdims=0),
             helper.make_node("Add", ["v3", "s"], ["v4"], name="add"),
             helper.make_node("Sigmoid", ["v4"], ["v5"], name="n7_Sigmoid"),
             helper.make_node("Abs", ["v5"], ["y"], name="n8_Abs")]
    graph = helper.make_graph(
        nodes, "alloc_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8)),
                               helper.make_tensor_value_info("n", TensorProto.INT64, (1,))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 8))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.slow(reason="a second live bisect (13 s here); a range the budget refuses is not judged in "
                        "tests/bisect/test_search.py, by default")
def test_a_range_the_ledger_refuses_is_not_judged_and_the_split_passes_the_gate(tmp_path) -> None:
    """Only the partitioner's answer is a decline: on ort-cpu (whose partitioner takes every
    node) the probes that hold ``alloc`` are refused by the ledger, so their ranges are *not
    judged* (exit 1, the regions still written), never declined; the split's composed outputs
    pass the numeric gate's rules."""
    onnx.save(_alloc_chain(), tmp_path / "alloc.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(5).standard_normal((4, 8)).astype("f4"),
             n=np.array([16 << 20], np.int64))  # 64 MiB of floats, past a tiny graph's budget
    done = _cli("--graph", str(tmp_path / "alloc.onnx"), "--route", "ort-cpu",
                "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "split"),
                "--json", str(tmp_path / "r.json"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    record = read_bisect_record(tmp_path / "r.json")
    print(json.dumps({k: record[k] for k in ("outcome", "not_judged", "declined_ops")}, indent=1))
    print(json.dumps(record["split"]["check"]))
    alloc = record["order"]["names"].index("alloc")
    assert record["outcome"]["status"] == "not_judged"
    assert record["not_judged"] and all(u["start"] <= alloc < u["stop"] for u in record["not_judged"])
    assert {u["cause"] for u in record["not_judged"]} == {"peak_over_budget"}
    assert record["declined_ops"] == []  # alloc is not "declined"
    assert {p["fact"] for p in record["probes"]} == {"accepted", "not_judged"}  # none declined
    assert all(p["fact"] == "not_judged" for p in record["probes"] if p["code"] == "budget_exceeds_device")
    assert record["regions"] and record["split"]["check"]["passed"] is True
    assert "not judged" in done.stdout and "passed the numeric gate" in done.stdout
