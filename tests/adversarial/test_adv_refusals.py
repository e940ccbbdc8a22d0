"""Zero false refusals, zero false placed: the profiler's memory and a crashing candidate.

Cases come from ``adv_refusals`` (seeded; ``XSTAGE_ADV_SEED`` repeats a run), their expected
ends from its oracle (construction only, no xstage code). Each case is one real
``python -m xstage external`` with real workers: ``ort-cpu`` on this interpreter's onnxruntime or
on onnxruntime 1.19 (Python 3.9), ``ort-openvino`` in its test env, and for a crash the
fault-injection worker (``tests/client/fault_worker.py``) standing in for a route's interpreter.
The default run takes one seeded case and its controls per class; ``--run-slow`` takes five.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import adv_refusals
import numpy as np
import pytest

SEED = adv_refusals.seed_from_env()
print(f"\nadversarial refusals seed: {SEED} (set {adv_refusals.SEED_ENV}={SEED} to repeat)")
FAULT_WORKER = Path(__file__).resolve().parents[1] / "client" / "fault_worker.py"
SRC = Path(__file__).resolve().parents[2] / "src"
#: class -> [cases run, as expected, false placed, false refusals]
TALLY: dict[str, list[int]] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One seeded case and its controls per class; five with ``--run-slow`` (or XSTAGE_SLOW)."""
    if "refusal_case" in metafunc.fixturenames:
        slow = metafunc.config.getoption("--run-slow") or os.environ.get("XSTAGE_SLOW", "") not in ("", "0")
        cases = adv_refusals.generate(SEED, 5 if slow else 1)
        metafunc.parametrize("refusal_case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="module")
def adv_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adv-refusals-home")


def _wrapper(folder: Path, python: Path | str, name: str) -> Path:
    """An "interpreter" that runs the fault-injection worker on ``python``."""
    script = folder / name
    script.write_text(f'#!/bin/sh\nexec "{python}" "{FAULT_WORKER}" "$@"\n')
    script.chmod(0o755)
    return script


def _env(case: adv_refusals.Case, home: Path, tmp: Path, openvino: Path, py39: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XSTAGE_PYTHON_")}
    env.update(XSTAGE_HOME=str(home), XSTAGE_CONFIG=str(home / "no-user-config.toml"),
               PYTHONPATH=str(SRC), XSTAGE_PYTHON_ORT_OPENVINO=str(openvino))
    if case.klass == "profiled_memory" and case.interpreter == "py39":
        env["XSTAGE_PYTHON_ORT_CPU"] = str(py39)
    if case.fault is not None:
        env["XSTAGE_FAULT"] = case.fault
        if case.variant in ("dies", "reference_dies"):
            env["XSTAGE_PYTHON_ORT_OPENVINO"] = str(_wrapper(tmp, openvino, "ovpython"))
        if case.variant in ("reference_dies", "reference_pinned"):
            env["XSTAGE_PYTHON_ORT_CPU"] = str(_wrapper(tmp, sys.executable, "cpupython"))
    return env


def _argv(case: adv_refusals.Case, graph: Path, feeds: Path, record: Path) -> list[str]:
    argv = [sys.executable, "-m", "xstage", "external", "--graph", str(graph), "--inputs", str(feeds),
            "--runs", "1", "--warmup", "1", "--json", str(record)]
    if case.klass == "profiled_memory":
        return [*argv, "--route", "ort-cpu", "--pool", f"host_ram={case.pool}"]
    if case.variant == "reference_pinned":
        return [*argv, "--route", "ort-cpu"]
    return [*argv, "--offload"]


def _candidates(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in (record.get("plan") or {}).get("candidates") or [] if c["status"] != "not_tried"]


def _judge(case: adv_refusals.Case, want: adv_refusals.Expected, code: int,
           record: dict[str, Any] | None, stderr: str) -> dict[str, bool]:
    """Every way the run can differ from the spec, by name."""
    checks = {"exit code": code == want.exit_code, "no traceback": "Traceback" not in stderr,
              "record written": record is not None}
    if record is None:
        return checks
    chosen = ((record.get("plan") or {}).get("chosen") or {}).get("route")
    refusals = record["outcome"]["refusals"]
    if want.exit_code == 0:
        checks["chosen"] = chosen == want.chosen
    if want.causes:
        checks["cause"] = bool(refusals) and refusals[-1]["cause"] in want.causes
    for block, verdict in want.kept.items():
        checks[f"{block} kept"] = (record.get(block) or {}).get("verdict") == verdict
    if want.refused_first:
        first = _candidates(record)[0]
        refusal = first.get("refusal") or {}
        death = (refusal.get("evidence") or {}).get("worker_death") or {}
        checks["candidate refused"] = (first["route"] == "ort-openvino"
                                       and refusal.get("cause") == want.refused_first)
        checks["signal"] = death.get("signal_name") == want.signal
        checks["possible oom"] = death.get("possible_oom_kill") is want.possible_oom
        checks["stderr tail"] = "fatal error in the op" in death.get("log_tail", "")
    if case.klass == "profiled_memory" and case.variant == "fits":
        ledger = record.get("ledger") or {}
        checks["peak apart"] = ledger.get("peak_basis") == "unprofiled"
    return checks


def test_case(refusal_case: adv_refusals.Case, adv_home: Path, tmp_path: Path,
              openvino_python: Path, py39_ort119_python: Path) -> None:
    case, want = refusal_case, adv_refusals.expected(refusal_case)
    import onnx

    graph = tmp_path / "stage.onnx"
    onnx.save(adv_refusals.build(case), graph)
    feeds = tmp_path / "inputs.npz"
    with open(feeds, "wb") as handle:
        np.savez(handle, **adv_refusals.inputs(case))
    record_path = tmp_path / "record.json"
    done = subprocess.run(_argv(case, graph, feeds, record_path), capture_output=True, text=True,
                          timeout=900, env=_env(case, adv_home, tmp_path, openvino_python,
                                                py39_ort119_python))
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    checks = _judge(case, want, done.returncode, record, done.stderr)
    placed = done.returncode == 0
    false_placed = placed and want.exit_code != 0
    false_refusal = not placed and want.exit_code == 0
    tally = TALLY.setdefault(case.klass, [0, 0, 0, 0])
    ok = all(checks.values())
    for i, hit in enumerate((True, ok, false_placed, false_refusal)):
        tally[i] += int(hit)
    print(f"\n{case.id}: {'as expected' if ok else 'NOT as expected'}; tally {TALLY}")
    assert ok, (f"seed {SEED} case {case} expected {want}; failed "
                f"{[k for k, v in checks.items() if not v]}; exit {done.returncode}\n"
                f"stderr: {done.stderr[-2500:]}")
