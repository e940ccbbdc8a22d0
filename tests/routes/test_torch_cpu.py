"""The torch-cpu route on a real .pt2 (the tiny tower, exported in the export venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import runcache


@pytest.fixture(scope="module")
def tower_pt2(export_python, tmp_path_factory):
    """The tiny Qwen3-VL tower's .pt2, kept in the test cache while its code and inputs are
    unchanged (tests/runcache.py: a change to the exporter runs it again)."""
    root = tmp_path_factory.mktemp("pt2")
    done = runcache.run(export_python, ["-m", "xstage", "export", "vision-tower", "--family", "qwen3_vl",
                                        "--config", "tiny", "--format", "pt:fp32", "--out", "{out}/tower"],
                        root)
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "tower.pt2"


def _external(export_python, *args):
    env = dict(os.environ, XSTAGE_PYTHON_TORCH_CPU=str(export_python), COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "xstage", "external", *args, "--runs", "3"],
                          capture_output=True, text=True, timeout=600, env=env)


def test_tiny_tower_pt2_through_torch_cpu(export_python, tower_pt2, tmp_path):
    rec = tmp_path / "r.json"
    done = _external(export_python, "--graph", str(tower_pt2), "--route", "torch-cpu",
                     "--json", str(rec))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(rec.read_text())
    assert doc["artifact"]["format"] == "pt:fp32"
    assert doc["plan"]["chosen"] == {"device": "cpu", "route": "torch-cpu"}
    proof = doc["proof"]
    assert proof["verdict"] == "placed" and proof["target_ep"] == "torch:cpu"
    assert proof["nodes_on_target"] == proof["nodes_total"] > 10 and proof["basis"] == "execution"
    parity = doc["parity"]
    assert parity["verdict"] == "passed" and parity["reference_kind"] == "torch_cpu"
    assert [o["name"] for o in parity["outputs"]] == ["embeds", "deepstack_0", "deepstack_1"]
    assert doc["timings"]["runs"] == 3 and doc["timings"]["compute"]["p50_ms"] > 0
    assert doc["worker"]["runtime"]["torch"].startswith("2.") and doc["worker"]["runtime"]["device"] == "cpu"
    assert 1.0 <= doc["ledger"]["budget_over_measured"] <= 3.0
    assert "ops on torch:cpu" in done.stdout


def test_a_pt2_without_its_manifest_is_an_artifact_error(export_python, tower_pt2, tmp_path):
    lone = tmp_path / "lone.pt2"
    lone.write_bytes(Path(tower_pt2).read_bytes())
    done = _external(export_python, "--graph", str(lone), "--route", "torch-cpu")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no manifest" in done.stderr and "xstage export" in done.stderr


def test_a_torchscript_file_is_refused_with_the_remedy(export_python, tmp_path):
    script = tmp_path / "ts.pt2"
    subprocess.run([str(export_python), "-c",
                    "import torch, sys; torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), sys.argv[1])",
                    str(script)], check=True, capture_output=True, timeout=300)
    done = _external(export_python, "--graph", str(script), "--route", "torch-cpu")
    assert done.returncode == 1 and "TorchScript" in done.stderr and "torch.export" in done.stderr
