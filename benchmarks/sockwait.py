"""Where a 64 B call over the authenticated TCP path waits (the socket spin, ``xstage_remote/sockspin.py``).

Runs ``WorkerClient(sys.executable, shm_mode="off", transport="tcp")`` on ``slice_graph(16,
16)`` under one or more source trees, one fresh process pair per tree and round, the trees
interleaved round by round; prints per tree the median half round trip ((round trip -
``worker_ns``) / 2), the worker's own time, and per call what the scheduler saw of each main
thread (``/proc/<pid>/task/<tid>/schedstat`` and ``status``): CPU time, time runnable but not
running (waiting for a CPU), voluntary and involuntary context switches. A tree with the
socket spin also prints both sides' wait decisions (the client's ``_spin``, the worker's
``ping`` ``socket_spin``).

Run: ``PYTHONPATH=src python benchmarks/sockwait.py [--rounds N] [--calls N] [--busy N]
[--together] TREE/src [TREE/src ...]`` (no tree: this one). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _thread(pid: int, tid: int) -> tuple[int, int, int, int]:
    """(CPU ns, runnable-waiting ns, voluntary, involuntary switches) of one thread."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        run, wait, _ = (int(v) for v in f.read().split())
    vol = invol = 0
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol = int(line.split()[1])
    return run, wait, vol, invol


def one(calls: int) -> dict:
    """One process pair under the tree on ``PYTHONPATH``: its figures as a dict."""
    import numpy as np

    from xstage import builtin_graphs
    from xstage.client import WorkerClient

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
        graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), Path(tmp) / "s.onnx")
        client = WorkerClient(sys.executable, shm_mode="off", transport="tcp")
        client.start()
        try:
            client.load(graph)
            for _ in range(200):
                client.run({"x": x})
            pid = client.pid
            assert pid is not None
            me = (os.getpid(), os.getpid())
            them = (pid, pid)
            a0, w0 = _thread(*me), _thread(*them)
            over, own = [], []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                client.run({"x": x})
                t = time.perf_counter_ns() - t0
                w = int(client.last_timing["worker_ns"])
                over.append(t - w)
                own.append(w)
            a1, w1 = _thread(*me), _thread(*them)
            spin = getattr(client, "_spin", None)
            waits = {"client": spin.summary()["line"] if spin is not None else None,
                     "worker": (client.ping().get("socket_spin") or {}).get("line")}
        finally:
            client.close()

    def per_call(b: tuple[int, ...], a: tuple[int, ...]) -> dict:
        return {"cpu_us": (a[0] - b[0]) / calls / 1e3, "runnable_wait_us": (a[1] - b[1]) / calls / 1e3,
                "voluntary": (a[2] - b[2]) / calls, "involuntary": (a[3] - b[3]) / calls}

    return {"half_round_trip_us": statistics.median(over) / 2e3,
            "worker_ns_us": statistics.median(own) / 1e3,
            "client": per_call(a0, a1), "worker": per_call(w0, w1), "waits": waits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="src/ folders to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N CPU-burning processes beside it (benchmarks/_busy.py)")
    parser.add_argument("--together", action="store_true",
                        help="both ends on the CPU this process runs on")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.calls)))
        return
    trees = args.trees or [str(HERE.parent / "src")]
    if args.together and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sys.path.insert(0, str(HERE))
    from _busy import Neighbours

    got: dict[str, list[dict]] = {t: [] for t in trees}
    with Neighbours(args.busy) as neighbours:
        neighbours.busy()
        for _ in range(args.rounds):
            for tree in trees:
                done = subprocess.run([sys.executable, __file__, "--one", "--calls", str(args.calls)],
                                      env=dict(os.environ, PYTHONPATH=tree), capture_output=True,
                                      text=True, timeout=600)
                got[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"64 B WorkerClient.run over TCP, {args.rounds} rounds of {args.calls} calls, "
          f"{'both ends on one CPU' if args.together else 'free placement'}, {args.busy} busy "
          f"neighbours; load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for tree, runs in got.items():
        med = statistics.median
        rounds = ", ".join(format(r["half_round_trip_us"], ".1f") for r in runs)
        print(f"{tree}\n  half round trip median {med(r['half_round_trip_us'] for r in runs):.1f} µs "
              f"(rounds: {rounds}); worker_ns {med(r['worker_ns_us'] for r in runs):.1f} µs")
        for side in ("client", "worker"):
            print(f"  {side:<7}per call: CPU {med(r[side]['cpu_us'] for r in runs):.1f} µs, "
                  f"runnable but waiting {med(r[side]['runnable_wait_us'] for r in runs):.1f} µs, "
                  f"switches voluntary {med(r[side]['voluntary'] for r in runs):.2f} "
                  f"involuntary {med(r[side]['involuntary'] for r in runs):.2f}")
        for r in runs[:1]:
            for side, line in r["waits"].items():
                if line:
                    print(f"  {side} waits (first round): {line}")


if __name__ == "__main__":
    main()
