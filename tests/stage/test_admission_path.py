"""One artifact's path through ``open_stage`` is the one docs/architecture.md draws.

The stage package calls each module it needs once, in order, and never climbs back: the test
runs ``open_stage`` on a built-in stage under ``sys.setprofile``, keeps only calls made from a
frame in ``xstage.stage`` to a function of another xstage module (what that module calls in
turn counts as that module, so it is not seen), collapses consecutive repeats, and compares the
sequence with the fenced list under "One artifact through open_stage" in the architecture doc.
After the planner the gate's reference arm runs in a worker of its own, through the modules a
candidate walks; from the candidate's budget on (after the reference worker), each module is
entered once, but for the call that has the worker run the gate's inputs in each slot set of the
widened region (``check_sets``): it comes after the gate's comparison, which it can only tighten.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from xstage import open_stage
from xstage.builtin_graphs import builtin_artifact
from xstage.stage.ledger import Ledger

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
HEADING = "## One artifact through `open_stage`"


def documented_path() -> list[str]:
    """The modules of the first fenced block under HEADING, one per line (first word)."""
    text = DOC.read_text(encoding="utf-8")
    assert HEADING in text, f"{DOC} has no section {HEADING!r}"
    block = re.search(r"```[a-z]*\n(.*?)```", text.split(HEADING, 1)[1], re.S)
    assert block, f"no fenced list under {HEADING!r}"
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


def _in_stage(name: str) -> bool:
    return name == "xstage.stage" or name.startswith("xstage.stage.")


def _is_xstage(name: str) -> bool:
    return name == "xstage" or name.startswith(("xstage.", "xstage_remote"))


def traced_path(**kwargs: Any) -> list[str]:
    """The collapsed module sequence of one ``open_stage`` (the stage is closed after)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_back is None:
            return
        caller = frame.f_back.f_globals.get("__name__", "")
        callee = frame.f_globals.get("__name__", "")
        if _in_stage(caller) and _is_xstage(callee) and not _in_stage(callee):
            if not seen or seen[-1] != callee:
                seen.append(callee)

    sys.setprofile(profile)
    try:
        stage = open_stage(**kwargs)
    finally:
        sys.setprofile(None)
    stage.close()
    return seen


def test_open_stage_walks_the_documented_modules_once_each():
    path = traced_path(artifact=builtin_artifact("vision-tower-tiny"), route="ort-cpu",
                       ledger=Ledger())
    assert path == documented_path()
    # before: the reference's worker (load, its calls, close)
    closed = path.index("xstage.client.worker", path.index("xstage.client.calls"))
    candidate = path[closed + 1:]
    sets = len(candidate) - 1 - candidate[::-1].index("xstage.client.calls")
    assert candidate[sets - 1] == "xstage.parity"  # the sets' runs: after the gate's comparison
    del candidate[sets]
    assert len(candidate) == len(set(candidate)), f"a module is entered twice: {candidate}"
