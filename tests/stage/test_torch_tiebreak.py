"""The float64 tie-break of a torch program: the ``.pt2`` widened to float64 on torch-cpu.

Real ``.pt2`` programs made in the export venv. ``y = x - mean(x)`` on values near 1e4 is
ill-conditioned in fp32: computed naively, the mean's rounding (up to half an ulp of 1e4,
4.9e-4) lands on outputs of scale 1e-2. Computed on ``x - x[0]`` first (exact in fp32), the same
function is right to fp32's precision. So the two programs disagree far beyond rule 7, and
float64 says which one is right: the shifted stage passes against the naive reference, the
naive stage fails against the shifted one. The program evaluated in float64 is the reference
(``--reference``), never the stage. Each program carries a parameter, a buffer and a
lifted constant, which the widening reaches; dtypes the graph names (``.to(float16)``,
``linspace(..., dtype=float32)``) are widened too, as the ONNX tie-break widens Casts. A
program that is float32 by construction (a bf16 rounding by bit trick, ``view(int32)``) cannot
be widened: its tie-break is ``unavailable``, naming the op.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import runcache

SRC = Path(__file__).resolve().parents[2] / "src"

MAKE = r'''
import sys, torch
from pathlib import Path
from xstage.manifest import write_manifest

class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((256,), 1.5))
        self.register_buffer("b", torch.full((256,), 0.25))

    def tail(self, y):
        return y * self.w * torch.tensor(2.0) + self.b

class Naive(Base):
    def forward(self, x):
        return self.tail(x - x.mean(-1, keepdim=True))

class Shifted(Base):
    def forward(self, x):
        d = x - x[:, :1]
        return self.tail(d - d.mean(-1, keepdim=True))

class Narrow(Shifted):
    def forward(self, x):
        y = super().forward(x)  # rounded to bf16 by a bit trick: float32 by construction
        return (y.view(torch.int32) & -65536).view(torch.float32)

class Casts(Shifted):
    def forward(self, x):
        return super().forward(x).to(torch.float16).float() * 0 + super().forward(x) \
            + torch.linspace(0, 0, 256, dtype=torch.float32)

out = Path(sys.argv[1])
x = torch.randn(4, 256) * 1e-2 + 1e4
for name, mod in [("naive", Naive()), ("shifted", Shifted()), ("narrow", Narrow()),
                  ("casts", Casts())]:
    path = out / (name + ".pt2")
    torch.export.save(torch.export.export(mod, (x,)), str(path))
    write_manifest(path, component="ill-" + name, fmt="pt:fp32", files=[path],
                   source={"kind": "test", "program": name},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [4, 256]}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": [4, 256]}])
'''


@pytest.fixture(scope="module")
def programs(export_python, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ill-conditioned")
    # kept in the test cache while MAKE and the code it imports are unchanged (tests/runcache.py)
    done = runcache.run(export_python, ["-c", MAKE, "{out}"], root,
                        env=dict(os.environ, PYTHONPATH=str(SRC)), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32) * 1e-2 + 1e4
    np.savez(root / "x.npz", x=x.astype(np.float32))
    return root


def _external(export_python, root: Path, stage: str, reference: str, rec: Path):
    env = dict(os.environ, XSTAGE_PYTHON_TORCH_CPU=str(export_python), COLUMNS="160")
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph",
                           str(root / f"{stage}.pt2"), "--route", "torch-cpu", "--reference",
                           str(root / f"{reference}.pt2"), "--inputs", str(root / "x.npz"),
                           "--runs", "2", "--json", str(rec)],
                          capture_output=True, text=True, timeout=600, env=env)
    return done, json.loads(rec.read_text()) if rec.exists() else {}


def test_the_right_program_passes_by_the_torch_tiebreak(export_python, programs, tmp_path):
    done, doc = _external(export_python, programs, "shifted", "naive", tmp_path / "r.json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    gate = doc["parity"]
    assert gate["verdict"] == "passed" and gate["tiebreak"]["status"] == "passed"
    assert gate["tiebreak"]["evaluator"].startswith("torch-cpu")
    (row,) = gate["tiebreak"]["outputs"]
    # The fp32 arms disagree far beyond rule 7; float64 sides with the shifted program.
    assert row["reference_rel_l2"] > 1e-3 and row["stage_rel_l2"] < row["reference_rel_l2"] / 10
    assert "float64 tie-break" in done.stdout
    # The naive reference is itself beyond fp32's tolerance of float64: said so, both distances.
    assert row["ill_conditioned"] and gate["tiebreak"]["ill_conditioned"] == ["y"]
    assert gate["tiebreak"]["graph"] == {"kind": "user", "name": "naive.pt2"}


def _refused_gate(doc: dict) -> dict:
    (refusal,) = doc["outcome"]["refusals"]
    assert refusal["code"] == "numeric_gate_failed"
    return refusal["evidence"]["parity"]


@pytest.mark.slow(reason="the .pt2 widening is the right program's test; the verdict that fails a "
                        "wrong stage is tests/stage/test_tiebreak.py's, by default")
def test_the_wrong_program_fails_the_torch_tiebreak(export_python, programs, tmp_path):
    done, doc = _external(export_python, programs, "naive", "shifted", tmp_path / "r.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    gate = _refused_gate(doc)
    assert gate["verdict"] == "failed" and gate["tiebreak"]["status"] == "failed"
    (row,) = gate["tiebreak"]["outputs"]
    assert row["stage_rel_l2"] > 1e-3 and row["stage_rel_l2"] > 10 * row["reference_rel_l2"]


def test_a_hard_coded_float32_makes_the_torch_tiebreak_unavailable(export_python, programs, tmp_path):
    """The reference program is the one evaluated in float64: a narrow reference makes the
    tie-break unavailable (a narrow stage beside a widenable reference would not)."""
    done, doc = _external(export_python, programs, "naive", "narrow", tmp_path / "r.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    gate = _refused_gate(doc)
    tiebreak = gate["tiebreak"]
    assert gate["verdict"] == "failed" and tiebreak["status"] == "unavailable"
    assert "computes view in float32" in tiebreak["reason"]


@pytest.mark.slow(reason="a third widened reference program: the widening of a .pt2 is the right "
                        "program's test, the ONNX Cast widening tests/stage/test_tiebreak.py's, by default")
def test_dtypes_the_graph_names_are_widened(export_python, programs, tmp_path):
    """``.to(float16)`` and a float32 ``linspace`` in the reference graph run in float64:
    unwidened, either one would return a narrower float and make the tie-break
    ``unavailable``; widened, its answer decides (the naive stage is far from it)."""
    done, doc = _external(export_python, programs, "naive", "casts", tmp_path / "r.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert _refused_gate(doc)["tiebreak"]["status"] == "failed"


def test_session_config_for_a_torch_program_is_a_usage_error(export_python, programs):
    """Session config entries are onnxruntime's: for a ``.pt2`` they would be dropped silently,
    so the request is refused before any worker starts (docs/throughput.md, "Session config")."""
    env = dict(os.environ, XSTAGE_PYTHON_TORCH_CPU=str(export_python), COLUMNS="160")
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph",
                           str(programs / "shifted.pt2"), "--route", "torch-cpu",
                           "--session-config", "session.intra_op.allow_spinning=0"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 64, done.stderr[-2000:]
    assert "--session-config entries are onnxruntime's" in done.stderr
    assert "Traceback" not in done.stderr
