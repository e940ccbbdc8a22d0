"""Record the doorbell's wait traces from real runs: the fixtures of the wait policy's tests.

Nothing in ``tests/fixtures/waits`` is written by hand. Each scenario starts a real worker
(``WorkerClient`` on this interpreter's onnxruntime) with ``XSTAGE_WAIT_TRACE`` set, makes
real calls through the shared region, and keeps both sides' traces: every decision of the
policy (``xstage_remote/waitpolicy.py``) with its inputs (the load sample, the expected
answer time) and what the wait then saw (seconds spun, the longest yield, how the spin ended,
seconds to the answer). Times are rounded to the nanosecond, and a trace keeps its first ``--waits``
waits.

Scenarios:

* ``quiet``: 64 B calls back to back (``slice_graph(16, 16)``), nothing else started.
* ``busy``: the same beside one busy-looping process per CPU (``benchmarks/_busy.py``).
* ``busy_crowd``: ``busy`` with ``XSTAGE_CROWD_BLOCKS=1`` (the policy's rule 6 on).
* ``idle_caller``: a 64 B call every 3 ms (the caller "busy elsewhere" between calls): the
  worker's answers-come-slowly case.
* ``long_call``: an MLP whose call takes about a millisecond: the caller's long-call case.

Run: ``PYTHONPATH=src python scripts/record_wait_traces.py [--out tests/fixtures/waits]``.
Each run's machine and load differ, so the traces do too; the tests check rules, not figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "waits"
SCENARIOS = ("quiet", "busy", "busy_crowd", "idle_caller", "long_call")

#: One scenario in a fresh interpreter (the trace directory is read when ``shm`` is imported).
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[4])
from _busy import Neighbours
from xstage import builtin_graphs
from xstage.client import WorkerClient
scenario, tmp, calls = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if scenario == "long_call":
    graph = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=4, batch=64, seed=3),
                                 tmp / "g.onnx")
    feeds = {"x": np.ones((64, 512), np.float32)}
else:
    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), tmp / "g.onnx")
    feeds = {"x": np.ones(16, np.float32)}
hogs = (os.cpu_count() or 1) if scenario in ("busy", "busy_crowd") else 0
with Neighbours(hogs) as neighbours, WorkerClient(sys.executable) as client:
    client.load(graph)
    neighbours.busy()
    for _ in range(calls):
        client.run(feeds)
        if scenario == "idle_caller":
            time.sleep(0.003)
    neighbours.quiet()
    print(json.dumps(client.waits()))
"""


def _rounded(doc: dict, waits: int) -> dict:
    def r(v: object) -> object:
        return round(v, 9) if isinstance(v, float) else v

    def rounded(values: list | None) -> list | None:
        return None if values is None else [r(v) for v in values]

    doc["waits"] = [dict(w, expected=r(w["expected"]), decision=rounded(w["decision"]),
                         wait=rounded(w["wait"])) for w in doc["waits"][:waits]]
    return doc


def record(scenario: str, out: Path, calls: int, waits: int) -> list[Path]:
    """Run one scenario in a child interpreter; write its caller and worker traces."""
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        env = dict(os.environ, XSTAGE_WAIT_TRACE=str(traces), XSTAGE_HOME=str(Path(tmp) / "home"),
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
        if scenario == "busy_crowd":
            env["XSTAGE_CROWD_BLOCKS"] = "1"
        done = subprocess.run([sys.executable, "-c", CHILD, scenario, tmp, str(calls),
                               str(REPO / "benchmarks")], env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{scenario}: the child failed:\n{done.stderr}")
        written = []
        for path in sorted(traces.glob("wait-*.json")):
            doc = json.loads(path.read_text())
            doc.update(scenario=scenario, recorded=time.strftime("%Y-%m-%d"),
                       python=sys.version.split()[0], load_at_start=os.getloadavg()[0])
            target = out / f"{scenario}-{doc['role']}.json"
            target.write_text(json.dumps(_rounded(doc, waits), separators=(",", ":")) + "\n")
            written.append(target)
        print(f"{scenario}: {done.stdout.strip()}", file=sys.stderr)
        return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--waits", type=int, default=1500, help="waits kept per trace")
    parser.add_argument("--only", choices=SCENARIOS, action="append")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in args.only or SCENARIOS:
        for path in record(scenario, args.out, args.calls, args.waits):
            print(path)


if __name__ == "__main__":
    main()
