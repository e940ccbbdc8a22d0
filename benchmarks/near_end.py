"""The near-end wait (waitpolicy rule 3): a caller that sleeps through a long call, against one
that sleeps until ``shm.NEAR_END_SECONDS`` before the expected answer and then spins.

Two clients of the same worker build in one process, the lead 0 (off) and the default (0.1 ms),
call an MLP of about a millisecond in interleaved rounds. Per arm: the median round trip, the
worker's compute, and ``back``: from the worker's end of compute (the region's stamp) to the
caller's return, which is where a sleeping caller pays its CPU's wake-up. The policy's line
says how many waits the rule decided.

The rule needs a CPU free in the load sample; ``--assume-free-cpu`` makes the load reader
report one (for a loaded machine, to see the mechanism; say so when quoting it).

Run: ``PYTHONPATH=src python benchmarks/near_end.py [--rounds N] [--calls N]
[--assume-free-cpu]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from xstage import builtin_graphs
from xstage.client import WorkerClient
from xstage_remote import doorbell, shm, waitpolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=100, help="calls per arm and round")
    parser.add_argument("--assume-free-cpu", action="store_true",
                        help="the load reader reports a free CPU (see the docstring)")
    args = parser.parse_args()
    if args.assume_free_cpu:
        doorbell._read_load = lambda: waitpolicy.Load(1, 2)  # the doorbell reads it
    with tempfile.TemporaryDirectory() as tmp:
        graph = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=4, batch=64, seed=3),
                                     Path(tmp) / "g.onnx")
        feeds = {"x": np.ones((64, 512), np.float32)}
        lead = shm.NEAR_END_SECONDS
        clients = {}
        saved = os.environ.get("XSTAGE_NEAR_END_SECONDS")
        for name, value in (("asleep", 0.0), ("near end", lead)):
            os.environ["XSTAGE_NEAR_END_SECONDS"] = repr(value)  # the client's tuning reads it
            client = WorkerClient(sys.executable)
            client.start()
            client.load(graph, options={"session": {"intra_op_num_threads": 1}})
            clients[name] = client
        if saved is None:
            os.environ.pop("XSTAGE_NEAR_END_SECONDS", None)
        else:
            os.environ["XSTAGE_NEAR_END_SECONDS"] = saved
        rt: dict[str, list[int]] = {k: [] for k in clients}
        work: dict[str, list[int]] = {k: [] for k in clients}
        back: dict[str, list[int]] = {k: [] for k in clients}
        try:
            for client in clients.values():
                for _ in range(50):
                    client.run(feeds)
            for _ in range(args.rounds):
                for name, client in clients.items():
                    for _ in range(args.calls):
                        t0 = time.perf_counter_ns()
                        client.run(feeds)
                        m1 = time.monotonic_ns()
                        rt[name].append(time.perf_counter_ns() - t0)
                        work[name].append(client.last_timing["worker_ns"])
                        back[name].append(m1 - client.last_timing["end_ns"])
            print(f"near-end lead {lead * 1e6:.0f} µs, {args.rounds} rounds x {args.calls} calls"
                  + (" (a free CPU assumed)" if args.assume_free_cpu else ""))
            for name, client in clients.items():
                print(f"  {name:9s} round trip p50 {statistics.median(rt[name]) / 1e3:8.1f} µs"
                      f"   worker {statistics.median(work[name]) / 1e3:8.1f} µs"
                      f"   back {statistics.median(back[name]) / 1e3:6.1f} µs"
                      f"   {client.waits()['caller'].get('line', '')}")
        finally:
            for client in clients.values():
                client.close()


if __name__ == "__main__":
    main()
