"""The heads-up (``shm.Doorbell.heads_up``): a caller whose input copy is long wakes a sleeping
worker before it copies, against one that rings only once the request is published.

One worker, one process, the two arms alternating in rounds (the caller's pipeline's
``heads_up_ns``: 0 off, ``shm.HEADS_UP_SECONDS`` on), a Slice graph whose 4.8 MB input and
4.0 MB output make the copies long and the compute short: back to back, the copies outlast the
worker's idle spin, so it sleeps before every request. Per arm, medians of each call's parts
(one clock in both processes, the region's stamps): ``caller`` from the call to the publish
(the copy in, and the heads-up), ``to worker`` from the publish to the worker's start (its
wake-up), ``worker``, ``back`` (its answer, the wake-up of the caller, the copy out), and the
round trip. The worker's doorbell line says how it waited.

By default the heads-up is on only where the caller may run on 4 CPUs or more
(``pipeline._heads_up_default``); here both arms are forced, to show the cost on a small
machine as well. ``--assume-free-cpu`` makes the load reader report a free CPU (a loaded
machine: say so when quoting it).

Run: ``PYTHONPATH=src python benchmarks/heads_up.py [--rounds N] [--calls N] [--mb IN,OUT]
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

PARTS = ("caller", "to worker", "worker", "back", "round trip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=60, help="calls per arm and round")
    parser.add_argument("--mb", default="4.8,4.0", help="input and output megabytes")
    parser.add_argument("--assume-free-cpu", action="store_true",
                        help="the load reader reports a free CPU (see the docstring)")
    args = parser.parse_args()
    if args.assume_free_cpu:
        doorbell._read_load = lambda: waitpolicy.Load(1, 2)  # the doorbell reads it
    mb_in, mb_out = (float(v) for v in args.mb.split(","))
    n_in, n_out = int(mb_in * 1e6 / 4), int(mb_out * 1e6 / 4)
    arms = {"off": 0, "on": int(shm.HEADS_UP_SECONDS * 1e9)}
    parts: dict[str, dict[str, list[float]]] = {a: {p: [] for p in PARTS} for a in arms}
    rung = dict.fromkeys(arms, 0)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        graph = builtin_graphs.write(builtin_graphs.slice_graph(n_in, n_out), Path(tmp) / "g.onnx")
        x = np.random.default_rng(0).standard_normal(n_in).astype(np.float32)
        with WorkerClient(sys.executable) as client:
            client.load(graph)
            pipe, bell = client._pipe, client.link.bell
            assert bell is not None
            heads_up = bell.heads_up

            current = ["off"]

            def counted(coming_ns: int) -> bool:
                sent = heads_up(coming_ns)
                rung[current[0]] += sent
                return sent

            bell.heads_up = counted  # type: ignore[method-assign]
            for _ in range(30):
                client.run({"x": x})
            rung.update(dict.fromkeys(arms, 0))  # the warm-up's are not an arm's
            for _ in range(args.rounds):
                for arm, ns in arms.items():
                    pipe.heads_up_ns = ns
                    current[0] = arm
                    for _ in range(args.calls):
                        m0 = time.monotonic_ns()
                        client.run({"x": x})
                        m1 = time.monotonic_ns()
                        t = client.last_timing
                        row = (t["published_ns"] - m0, t["start_ns"] - t["published_ns"],
                               t["end_ns"] - t["start_ns"], m1 - t["end_ns"], m1 - m0)
                        for p, v in zip(PARTS, row, strict=True):
                            parts[arm][p].append(v / 1e3)
            worker_line = client.waits().get("worker", {}).get("line")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load {load:.2f}, {mb_in} MB in, {mb_out} MB out, "
          f"{args.rounds} rounds x {args.calls} calls per arm, heads-up from "
          f"{shm.HEADS_UP_SECONDS * 1e6:.0f} µs of copy")
    print(f"{'arm':<6}" + "".join(f"{p:>13}" for p in PARTS) + "   heads-ups sent")
    med = {a: {p: statistics.median(v) for p, v in parts[a].items()} for a in arms}
    for arm in arms:
        print(f"{arm:<6}" + "".join(f"{med[arm][p]:>10.1f} µs" for p in PARTS)
              + f"   {rung[arm]}")
    print(f"on/off round trip {med['on']['round trip'] / med['off']['round trip']:.3f}; "
          f"to worker {med['off']['to worker']:.1f} → {med['on']['to worker']:.1f} µs")
    print(f"worker's waits: {worker_line}")


if __name__ == "__main__":
    main()
