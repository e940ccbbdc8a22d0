"""The worker's stderr capture: what onnxruntime's C++ logger writes to fd 2 while the EP
compiles and first runs is passed on to the worker log, and the lines that speak of a fallback
(OpenVINO's "Falling back to OV CPU for execution") become evidence for device attestation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
from xstage_remote.ort_runtime import _StderrCapture
with _StderrCapture() as cap:
    os.write(2, b"[W:onnxruntime:, backend_manager.cc:130] Model compilation failed at OV NPU."
                b"Falling back to OV CPU for execution\n")
    os.write(2, b"[I:onnxruntime:] nothing to see\n")
print(repr(cap.lines))
'''


def test_fd2_is_captured_passed_on_and_the_fallback_line_kept():
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(SRC)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Falling back to OV CPU" in done.stdout and "nothing to see" not in done.stdout
    assert "Falling back to OV CPU" in done.stderr and "nothing to see" in done.stderr
