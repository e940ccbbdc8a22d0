"""How fast a worker's death, a passed deadline and a hung probe are noticed, and probe parallelism.

The tests assert that each of these happens (``WorkerDied``, ``CallTimeout``, the probe killed,
probes overlapping); the figures live here, because a wall-clock bound in a test fails on a
loaded machine. Each figure is the median of ``--rounds`` tries:

* ``sigkill_<transport>_s`` — a worker SIGKILLed mid-call (a MatMul chain of seconds) to
  ``WorkerDied`` in the caller, for the shared region, inline frames and TCP (target < 2 s).
* ``call_deadline_overshoot_s`` — ``CallTimeout`` after a 1 s call deadline, minus that second.
* ``client_death_to_worker_exit_s`` — a client SIGKILLed; its worker gone (the death pipe).
* ``probe_timeout_s`` — a probe of an interpreter that sleeps 30 s, with a 0.5 s timeout.
* ``probe_many_3x1s_s`` — three probes that take 1 s each, run together (target well under 3 s).

Run: ``python benchmarks/liveness.py [--json] [--rounds N]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import psutil

from xstage import builtin_graphs, errors
from xstage.client import Deadlines, WorkerClient
from xstage.routes.probe import ProbeRequest, probe_many, run_probe

N = 1536


def slow_graph(depth: int = 160) -> onnx.ModelProto:
    """Seconds of MatMul: a call that is still running when the worker is killed."""
    return builtin_graphs.matmul_chain(depth, N, name="slow")

def sigkill_to_died(graph: Path, **client: object) -> float:
    x = np.ones((N, N), np.float32)
    with WorkerClient(sys.executable, **client) as w:  # type: ignore[arg-type]
        w.load(graph)
        threading.Timer(0.5, os.kill, args=(w.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        try:
            w.run({"x": x})
        except errors.WorkerDied:
            return time.monotonic() - 0.5 - t0
    raise RuntimeError("the call finished before the kill: make the graph slower")


def deadline_overshoot(graph: Path) -> float:
    w = WorkerClient(sys.executable, deadlines=Deadlines(call=1.0))
    try:
        w.start()
        w.load(graph)
        t0 = time.monotonic()
        try:
            w.run({"x": np.ones((N, N), np.float32)})
        except errors.CallTimeout:
            return time.monotonic() - t0 - 1.0
    finally:
        w.close()
    raise RuntimeError("the call finished within its deadline: make the graph slower")


_CLIENT = textwrap.dedent(
    """
    import sys, time
    from xstage.client import WorkerClient
    w = WorkerClient(sys.executable)
    w.start()
    w.load(sys.argv[1])
    print(w.pid, flush=True)
    time.sleep(600)
    """
)


def client_death_to_worker_exit(graph: Path) -> float:
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, str(graph)], stdout=subprocess.PIPE)
    try:
        worker = psutil.Process(int(client.stdout.readline()))  # type: ignore[union-attr]
        time.sleep(0.3)
        client.kill()
        client.wait()
        t0 = time.monotonic()
        psutil.wait_procs([worker], timeout=30)
        return time.monotonic() - t0
    finally:
        client.kill()


def fake_python(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xstage-bench-") as tmp:
        folder = Path(tmp)
        os.environ["XSTAGE_HOME"] = str(folder / "home")
        graph = builtin_graphs.write(slow_graph(), folder / "slow.onnx")
        sleeper = fake_python(folder, "python-sleeps", "sleep 30 & sleep 30")
        ones = [fake_python(folder, f"python{i}", "sleep 1; exit 2") for i in range(3)]
        arms: dict[str, Callable[[], float]] = {
            "sigkill_shm_s": lambda: sigkill_to_died(graph),
            "sigkill_inline_s": lambda: sigkill_to_died(graph, shm_mode="off"),
            "sigkill_tcp_s": lambda: sigkill_to_died(graph, transport="tcp"),
            "call_deadline_overshoot_s": lambda: deadline_overshoot(graph),
            "client_death_to_worker_exit_s": lambda: client_death_to_worker_exit(graph),
            "probe_timeout_s": lambda: timed(lambda: run_probe(ProbeRequest(str(sleeper)), timeout=0.5)),
            "probe_many_3x1s_s": lambda: timed(lambda: probe_many([ProbeRequest(str(p)) for p in ones])),
        }
        figures = {name: statistics.median(arm() for _ in range(args.rounds)) for name, arm in arms.items()}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, seconds in figures.items():
        print(f"{name:32s} {seconds:7.3f} s")


if __name__ == "__main__":
    main()
