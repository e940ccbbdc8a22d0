"""Run a machine tool (``nvidia-smi``, ``powershell.exe``, ``wslinfo``, ``taskkill``), read its output.

The one helper through which code outside ``client``/``routes`` (the hardware probes in
``xstage.host``) starts a process.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["run_tool"]


def run_tool(argv: Sequence[str], timeout: float, *, check: bool = True) -> str | None:
    """What ``argv`` prints on stdout, or None when the tool could not answer.

    None when the tool is not on PATH, cannot start, or runs past ``timeout`` seconds; with
    ``check``, a non-zero exit is None too. Its stdin is closed, so a tool that asks for input
    fails instead of waiting.
    """
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 or not check else None
