"""``xstage external``'s benchmark flags (docs/throughput.md): percentiles, the per-op table,
throughput at a depth, sweeps. Real workers on the built-in MLP through ort-cpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest


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
