"""``xstage.stage.crash``: a dead candidate's worker as data, and who may clear the artifact."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from xstage import errors
from xstage.stage import crash


def _died(status, tail="line 1\nline 2"):
    return errors.WorkerDied("the worker died", exit_status=status, log_tail=tail)


def test_a_sigkill_is_a_possible_out_of_memory_kill():
    got = crash.death(_died(-signal.SIGKILL))
    assert got["signal"] == signal.SIGKILL and got["signal_name"] == "SIGKILL"
    assert got["possible_oom_kill"] is True and got["exit_status"] is None


def test_an_abort_and_an_exit_status_are_not():
    abort = crash.death(_died(-signal.SIGABRT))
    assert abort["signal_name"] == "SIGABRT" and abort["possible_oom_kill"] is False
    status = crash.death(_died(3))
    assert status["exit_status"] == 3 and status["signal"] is None
    assert status["possible_oom_kill"] is False


def test_the_log_tail_keeps_the_last_lines_only():
    tail = "\n".join(f"line {i}" for i in range(100))
    kept = crash.death(_died(1, tail))["log_tail"].splitlines()
    assert len(kept) == crash.TAIL_LINES and kept[-1] == "line 99"


def test_the_reference_arm_is_never_cleared_by_itself():
    """Rule 1: the candidate is the reference arm, so its death stays an error."""
    cand = SimpleNamespace(route=SimpleNamespace(name="ort-cpu", spec=SimpleNamespace(reference_arm=True)))
    with pytest.raises(LookupError, match="is the reference arm"):
        crash.reference_runs(cand, SimpleNamespace())


def test_no_reference_route_here_keeps_the_death_an_error():
    """Rule 3: nothing can clear the artifact when the reference arm is not resolved."""
    cand = SimpleNamespace(route=SimpleNamespace(name="ort-openvino",
                                                 spec=SimpleNamespace(reference_arm=False)))
    missing = SimpleNamespace(resolved=False, reason="no onnxruntime in that interpreter")
    art = SimpleNamespace(format="onnx:fp32", runtime="onnxruntime")
    report = SimpleNamespace(route=lambda name: missing if name == "ort-cpu" else None)
    with pytest.raises(LookupError, match="no onnxruntime"):
        crash.reference_runs(cand, SimpleNamespace(report=report, artifact=art))
    with pytest.raises(LookupError, match="not resolved"):
        crash.reference_runs(cand, SimpleNamespace(report=None, artifact=art))
