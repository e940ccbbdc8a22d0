"""``xstage external``'s benchmark flags (docs/throughput.md): percentiles, the per-op table,
throughput at a depth, sweeps. Real workers on the built-in MLP through ort-cpu."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import runcache


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str


def _external(*args: str) -> Ran:
    env = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}
    env.update(COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "xstage", "external", "--route", "ort-cpu", "--warmup", "0",
                           *args], capture_output=True, text=True, env=env, timeout=300)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def _usage_error(ran: Ran) -> str:
    assert ran.code == 64 and "Traceback" not in ran.stderr, ran.stderr
    (line,) = [x for x in ran.stderr.splitlines() if "error:" in x]
    return line


@pytest.mark.parametrize(("value", "why"), [("50,abc", "'abc' is not a number"), ("100", "outside (0, 100)")])
def test_a_bad_percentile_is_a_usage_error(xstage_home, value, why):
    line = _usage_error(_external("--percentiles", value))
    assert "--percentiles" in line and why in line


def test_percentiles_print_and_the_record_carries_them(xstage_home, tmp_path):
    """p99.9 of 12 runs prints n/a with the runs it needs; p90 is a number; the record has both."""
    rec = tmp_path / "r.json"
    ran = _external("--runs", "12", "--percentiles", "50,90,99.9", f"--json={rec}")
    assert ran.code == 0, ran.stderr
    assert "p99.9 n/a (needs ≥ 1000 runs)" in ran.stdout and "p90 " in ran.stdout
    entries = {p["key"]: p for p in json.loads(rec.read_text())["timings"]["percentiles"]}
    assert entries["p90"]["round_trip_ms"] > 0 and entries["p99.9"]["round_trip_ms"] is None


def test_per_op_csv_on_stdout_is_the_csv_alone_and_matches_the_record(xstage_home, tmp_path):
    """``--per-op csv=-``: stdout holds the CSV and nothing else (the summary moved to stderr);
    its rows are the record's timed profiled kernels, sorted by time, shares summing to 1."""
    rec = tmp_path / "r.json"
    ran = _external("--runs", "2", "--per-op", "csv=-", f"--json={rec}")
    assert ran.code == 0, ran.stderr
    rows = list(csv.DictReader(io.StringIO(ran.stdout)))
    assert rows and list(rows[0]) == ["node", "op", "provider", "kind", "time_us", "share", "count"]
    assert "xstage external" in ran.stderr  # the summary, on stderr
    times = [float(r["time_us"]) for r in rows]
    assert times == sorted(times, reverse=True)
    assert sum(float(r["share"]) for r in rows) == pytest.approx(1.0, abs=1e-4)
    record = json.loads(rec.read_text())
    assert {r["node"] for r in rows} == {k["node"] for k in record["detail"]["placement"]["kernels"]
                                         if k["run"] in record["detail"]["placement"]["timed_runs"]}
    assert {r["provider"] for r in rows} == {"CPUExecutionProvider"}


def test_per_op_table_and_file(xstage_home, tmp_path):
    target = tmp_path / "ops.csv"
    ran = _external("--runs", "1", "--per-op")
    assert ran.code == 0, ran.stderr
    assert "Per op (mean per run over the profiled runs [2, 3, 4]" in ran.stdout and "share" in ran.stdout
    ran = _external("--runs", "1", f"--per-op=csv={target}")
    assert ran.code == 0, ran.stderr
    assert target.read_text().startswith("node,op,provider,kind,time_us,share,count\n")


@pytest.mark.parametrize(("args", "why"), [
    (("--per-op=xml",), "--per-op 'xml' is neither empty nor csv=PATH"),
    (("--per-op=csv=-", "--json"), "--per-op csv=- and --json both want stdout alone"),
    (("--per-op=csv=/",), "--per-op csv=/ is a folder, not a file"),  # as typed, not "--per-op /"
    (("--per-op=csv=/no/such/folder/x.csv",), "--per-op csv=/no/such/folder/x.csv: the folder")])
def test_a_bad_per_op_is_a_usage_error(xstage_home, args, why):
    assert why in _usage_error(_external(*args))


_MLP_PT2 = """
import sys, torch
from pathlib import Path
from xstage.manifest import write_manifest
path = Path(sys.argv[1])
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

module = M().eval()
torch.export.save(torch.export.export(module, (torch.randn(4, 32),), strict=False), str(path))
write_manifest(path, component="mlp", fmt="pt:fp32", files=[path], source={"kind": "test"},
               exporter={"torch": torch.__version__},
               inputs=[{"name": "x", "dtype": "float32", "shape": [4, 32]}],
               outputs=[{"name": "y", "dtype": "float32", "shape": [4, 8]}])
"""


def test_per_op_of_a_torch_stage_is_by_op(xstage_home, tmp_path, export_python, torch_python, monkeypatch):
    """torch-cpu: the op log the proof judged, by op (addmm, relu), with host time and counts."""
    path = tmp_path / "mlp.pt2"
    # kept in the test cache while the code it runs is unchanged (tests/runcache.py)
    done = runcache.run(export_python, ["-c", _MLP_PT2, "{out}/mlp.pt2"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("XSTAGE_PYTHON_TORCH_CPU", str(torch_python))
    env = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(path), "--route",
                           "torch-cpu", "--runs", "1", "--per-op=csv=-"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert list(rows[0]) == ["op", "devices", "time_us", "device_time_us", "share", "count"]
    by_op = {r["op"]: r for r in rows}
    assert by_op["addmm"]["count"] == "2" and by_op["addmm"]["devices"] == "cpu"
    assert by_op["relu"]["count"] == "1"


def test_throughput_at_a_depth_prints_requests_per_second_and_records_it(xstage_home, tmp_path):
    rec = tmp_path / "r.json"
    ran = _external("--runs", "1", "--throughput", "--depth", "2", "--requests", "10", f"--json={rec}")
    assert ran.code == 0, ran.stderr
    assert "requests/s at depth 2, 2 computed at once (10 requests in" in " ".join(ran.stdout.split())
    record = json.loads(rec.read_text())
    tp = record["timings"]["throughput"]
    assert tp["requests"] == 10 and tp["depth"] == 2 and tp["concurrency"] == 2 and tp["requests_per_s"] > 0
    assert record["serving"]["depth"] == 2 and record["serving"]["concurrency"] == 2


@pytest.mark.parametrize(("args", "why"), [
    (("--depth", "2"), "--depth sets up --throughput, which was not asked for"),
    (("--throughput", "--duration", "0"), "--duration 0.0 must be a positive number of seconds")])
def test_throughput_flags_without_throughput_are_usage_errors(xstage_home, args, why):
    assert why in _usage_error(_external(*args))


def test_a_batch_sweep_admits_each_shape_and_writes_one_record_each(xstage_home, tmp_path):
    """``--batch 1,3`` over a graph with a free batch dimension: one admission per shape (the
    proof and the gate of each), one table, ``--json`` = {"shapes": [record, record]}, and each
    record under the home too."""
    import onnx

    from xstage import builtin_graphs

    model = builtin_graphs.mlp(width=16, depth=1, batch=1)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    graph = tmp_path / "mlp-batch.onnx"
    onnx.save(model, str(graph))
    out = tmp_path / "sweep.json"
    ran = _external("--graph", str(graph), "--runs", "2", "--batch", "1,3", f"--json={out}")
    assert ran.code == 0, ran.stderr
    text = " ".join(ran.stdout.split())
    assert "xstage external: 2 shapes" in text and "batch 3" in text and "items/s" in text
    doc = json.loads(out.read_text())
    assert [r["request"]["inputs"]["tensors"]["x"]["shape"] for r in doc["shapes"]] == [[1, 16], [3, 16]]
    assert {(r["proof"]["verdict"], r["parity"]["verdict"]) for r in doc["shapes"]} == {("placed", "passed")}
    assert len(list((xstage_home / "records").glob("*.json"))) == 2


@pytest.mark.parametrize(("args", "why"), [
    (("--batch", "1,2"), "--batch: no input of this graph has a free first dimension"),
    (("--batch", "1,x"), "--batch '1,x': 'x' is not a whole number >= 1"),
    (("--sweep", "x=64x512;abc"), "--sweep x: 'abc' is not D1xD2x…"),
    (("--sweep", "x=64x512;32x512"), "--sweep x=32x512 contradicts the declared [64, 512]"),
    (("--sweep", "x=64x512", "--per-op"), "--per-op takes one stage; a sweep opens one per shape"),
    (("--sweep", "x=64x512", "--batch", "1"), "not allowed with argument")])
def test_a_bad_sweep_is_a_usage_error(xstage_home, args, why):
    assert why in _usage_error(_external(*args))
