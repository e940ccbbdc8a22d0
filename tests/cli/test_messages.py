"""Exit codes that mean it, and messages that name only what the command has: a name outside the
closed sets is a usage error (64) naming the known ones; a known one absent here stays a refusal
(2); cheap arguments are checked before expensive work; XSTAGE_DEBUG=1 is offered only for
unexpected errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from xstage import builtin_graphs

ENV = {k: v for k, v in os.environ.items() if k != "XSTAGE_DEBUG"}


def _xstage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstage", *args], capture_output=True, text=True,
                          env=dict(ENV, XSTAGE_HOME=os.environ["XSTAGE_HOME"]), timeout=300)


@pytest.mark.parametrize(("args", "says"), [
    (["--device", "tpu"], "unknown device class 'tpu'"),
    (["--prefer", "npu,quantum:ibm"], "unknown device class 'quantum'"),
    (["--route", "ort-nonesuch"], "unknown route 'ort-nonesuch'"),
    (["--pool", "nopool=1GiB"], "unknown memory pool 'nopool'"),
])
def test_a_name_outside_the_closed_sets_is_a_usage_error_naming_the_known_ones(args, says):
    done = _xstage("external", *args, "--runs", "1")
    assert done.returncode == 64, done.stdout + done.stderr
    assert says in done.stderr
    known = {"unknown device": "gpu_integrated", "unknown route": "ort-openvino",
             "unknown memory": "host_ram"}
    assert next(v for k, v in known.items() if says.startswith(k)) in done.stderr
    assert "XSTAGE_DEBUG" not in done.stderr and "Traceback" not in done.stderr


def test_a_known_device_absent_here_stays_a_refusal():
    done = _xstage("external", "--device", "npu:intel", "--runs", "1")
    assert done.returncode == 2 and "device_unreachable_from_this_process" in done.stdout


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--runs", "100000000", "each timed run is kept"),
    ("--runs", "0", "each timed run is kept"),
    ("--warmup", "5000", "warm-up runs are untimed"),
])
def test_runs_and_warmup_have_bounds_that_say_why(flag, value, why):
    done = _xstage("external", flag, value)
    assert done.returncode == 64 and why in done.stderr, done.stderr


def test_quantize_blames_its_own_flag_for_a_bad_calibration_file(tmp_path):
    graph = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "m.onnx")
    bad = tmp_path / "bad"
    bad.mkdir()
    np.savez(bad / "s0.npz", not_an_input=np.zeros(3, np.float32))
    done = _xstage("quantize", str(graph), str(tmp_path / "q.onnx"), "--scheme", "a16w8",
                   "--calibration", str(bad))
    assert done.returncode != 0 and "--calibration" in done.stderr, done.stderr
    assert "--inputs" not in done.stderr and "Traceback" not in done.stderr


def test_the_no_torch_hint_names_the_extra_not_this_machine(tmp_path):
    pytest.importorskip("onnx")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is importable here")
    except ImportError:
        pass
    done = _xstage("export", "vision-tower", "--config", "tiny", "--out", str(tmp_path / "t.onnx"))
    assert done.returncode != 0
    assert "xstage[export]" in done.stderr and "local disk" not in done.stderr and "==" not in done.stderr
