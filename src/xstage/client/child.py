"""A child process of this client's own interpreter, running one xstage function.

For work that needs the client's own packages (onnx, which the worker package cannot import)
but must not live in the caller's process: the numeric gate's float64 tie-break
(``xstage.stage.tiebreak``). The child gets this xstage's source folder first on its path, its
stdout and stderr go to a log file (never to the caller's terminal), and it is killed at its
deadline. What it computes travels through files in a folder the caller gives it
(``np.load(allow_pickle=False)`` on the way back: no pickle, ever).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChildResult", "run_function"]

#: The folder that holds this ``xstage`` package (``src/`` in a checkout): first on the child's path.
_SOURCE = Path(__file__).resolve().parents[2]
#: What the child runs (``module`` and ``function`` are the caller's identifiers, never data).
_CALL = "import sys; from {module} import {function} as f; sys.exit(f(sys.argv[1:]))"
#: The log lines kept in a result.
TAIL_LINES = 20


@dataclass(frozen=True)
class ChildResult:
    """How the child ended.

    ``returncode`` is its exit status (negative: the signal), ``timed_out`` whether its deadline
    killed it, ``log_tail`` the last lines of its log.
    """

    returncode: int
    timed_out: bool
    log_tail: str


def run_function(module: str, function: str, args: list[str], *, folder: Path,
                 timeout_s: float) -> ChildResult:
    """Run ``module.function(args)`` in a child of this interpreter; its log: ``folder/child.log``.

    The function's return value is the child's exit status. Waits at most ``timeout_s``
    seconds, then kills it (``timed_out``). Never raises for how the child ended; the caller
    reads its files and the result.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_SOURCE), *filter(None, [env.get("PYTHONPATH")])])
    log = folder / "child.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter, our own module
            [sys.executable, "-c", _CALL.format(module=module, function=function), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(folder))
        try:
            code, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            proc.kill()
            code, timed_out = proc.wait(), True
    text = log.read_text("utf-8", "replace").splitlines()
    return ChildResult(code, timed_out, "\n".join(text[-TAIL_LINES:]))
