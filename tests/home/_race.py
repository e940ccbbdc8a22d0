"""N processes started together on one ``XSTAGE_HOME``: a barrier through files, then a snippet.

Each child writes ``ready-<i>``, waits for ``go``, runs its snippet and exits; the parent
waits for every ``ready`` before it writes ``go``, so the snippets start within a few
milliseconds of one another. Every wait is bounded (a subprocess timeout, a barrier timeout),
so a hang fails the test instead of holding the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

_PRELUDE = """
import os, sys, time
from pathlib import Path
_barrier = Path(sys.argv[1]); _me = int(sys.argv[2])
(_barrier / f"ready-{_me}").write_text("")
_until = time.monotonic() + 60
while not (_barrier / "go").exists():
    if time.monotonic() > _until:
        sys.exit("the barrier never opened")
    time.sleep(0.001)
"""


@dataclass
class Ended:
    """How one child ended."""

    rc: int
    out: str
    err: str


def race(snippet: str, n: int, barrier: Path, *, timeout: float = 240.0,
         env: dict[str, str] | None = None) -> list[Ended]:
    """Run ``snippet`` in ``n`` processes released together; their ends, in order."""
    barrier.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, [full_env.get("PYTHONPATH")])])
    procs = [
        subprocess.Popen([sys.executable, "-c", _PRELUDE + snippet, str(barrier), str(i)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                         start_new_session=True)
        for i in range(n)
    ]
    try:
        until = time.monotonic() + 60
        while len(list(barrier.glob("ready-*"))) < n and time.monotonic() < until:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.005)
        (barrier / "go").write_text("")
        ends = []
        deadline = time.monotonic() + timeout
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            ends.append(Ended(p.returncode, out, err))
        return ends
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
