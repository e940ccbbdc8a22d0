"""Zero false "placed" from how the timed runs differ: the proof's time fraction (rule 1b) against
profiles whose runs 2-4 an attacker, or a busy machine, makes unequal.

Each case is a real recorded profile (``tests/fixtures/profiles/ov124_det``: MatMul+Add on OpenVINO,
Det on the CPU) repeated into four runs with each run's kernel time set per provider, judged by
``prove`` at ``min_placement`` 0.5. The oracle is the work itself: where the CPU took most of the time
in every run, or in total, the stage is not placed; a control that is placed in every run is placed.
The rule's bound: a delay in two runs of three carries the median too (rule 1b, docs/external.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorded import runs_timed

from xstage.evidence import prove

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"
OV, CPU = "OpenVINOExecutionProvider", "CPUExecutionProvider"
START = {OV: 10**6, CPU: 980}  # run 1: the EP's start-up, never timed


def _judge(runs: list[dict[str, int]]) -> str:
    meta = json.loads((PROFILES / "ov124_det.meta.json").read_text())
    raw = json.loads((PROFILES / "ov124_det.profile.json").read_text())
    p = prove(target_ep=OV, profile_text=runs_timed(raw, [START, *runs]),
              assignment=json.loads((PROFILES / "ov124_det.assignment.json").read_text()),
              session_providers=meta["session_providers"], available_providers=meta["available_providers"],
              fallback_banner=meta["fallback_banner"], graph_nodes=meta["graph"]["nodes"],
              ort_version=meta["ort_version"], min_placement=0.5)
    return p.verdict


@pytest.mark.parametrize(("case", "runs", "verdict"), [
    # one run's target kernel delayed (a preemption): the CPU took 98% of every run
    ("delay-in-one-target-run", [{OV: 20, CPU: 980}, {OV: 200_000, CPU: 980}, {OV: 20, CPU: 980}],
     "declined"),
    # work that comes and goes: two light runs on the target, one run with 100x the CPU's work;
    # a median alone would place it, the sum does not
    ("cpu-work-in-one-run", [{OV: 900, CPU: 100}, {OV: 900, CPU: 100_000}, {OV: 900, CPU: 100}],
     "declined"),
    # control: placed in every run
    ("control-placed", [{OV: 900, CPU: 100}, {OV: 850, CPU: 120}, {OV: 950, CPU: 90}], "placed"),
])
def test_unequal_runs(case: str, runs: list[dict[str, int]], verdict: str) -> None:
    assert _judge(runs) == verdict, case
