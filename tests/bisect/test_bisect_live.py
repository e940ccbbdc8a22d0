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
            assert (split_run["root"] / "split" / part["graph"] + ".manifest.json").is_file()


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
