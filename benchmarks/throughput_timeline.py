"""Where a request's time goes at depth K: the stamps of every request, as medians of the gaps.

``benchmarks/throughput.py`` gives the ratio; this gives its parts. Each request of a depth-K
run carries the worker's stamps (``StageFuture.timing``: published, started, ended, on this
machine's ``time.monotonic_ns``), and this script adds when ``submit`` was called and when the
result arrived. Printed per driver, medians over the steady state (the first 4K requests left
out):

* ``run``: the worker's compute of one request (start to end);
* ``submit->published``: the client's copy of the inputs into a slot set, and the wait for a
  free set's turn (requests are published in the sets' cyclic order);
* ``published->start``: the worker taking it (its serve loop, then a run thread);
* ``end->result``: the answer back to the caller (the client's wake-up, the copy out, and the
  wait behind an older request still running: results are collected in order);
* ``runs at once``: the share of the run's wall time with 0, 1, ..., K runs in the worker.

Drivers: ``loop`` (the caller's thread waits for the oldest request, then submits the next,
as ``Stage.map`` does) and ``refill`` (each request submitted from the last one's done-callback,
as ``Stage.measure_throughput`` does: ``xstage.stage.refill``).

Run: ``PYTHONPATH=src python benchmarks/throughput_timeline.py [--route ort-cpu] [--graph mlp |
PATH.onnx] [--depth 4] [--requests 400] [--session-config KEY=VALUE]``. Not a test: nothing
asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from xstage import builtin_graphs, open_stage
from xstage.stage.refill import Refill


def _stamped(stage: Any, rows: list[tuple[Any, dict[str, int]]]) -> Any:
    """``stage.submit`` that keeps each future with its submit and result times."""
    def submit(inputs: Any) -> Any:
        stamp = {"submit": time.monotonic_ns()}
        fut = stage.submit(inputs)
        fut.add_done_callback(lambda _f: stamp.__setitem__("result", time.monotonic_ns()))
        rows.append((fut, stamp))
        return fut
    return submit


def loop(stage: Any, feeds: dict, k: int, n: int) -> list[dict[str, int]]:
    rows: list[tuple[Any, dict[str, int]]] = []
    submit, window = _stamped(stage, rows), deque()
    for _ in range(n):
        window.append(submit(feeds))
        if len(window) >= k:
            window.popleft().result()
    while window:
        window.popleft().result()
    return [{**stamp, **fut.timing} for fut, stamp in rows]


def refill(stage: Any, feeds: dict, k: int, n: int) -> list[dict[str, int]]:
    rows: list[tuple[Any, dict[str, int]]] = []
    Refill(_stamped(stage, rows), feeds, depth=k, total=n, duration=None).run()
    return [{**stamp, **fut.timing} for fut, stamp in rows]


def summary(rows: list[dict[str, int]], k: int) -> str:
    rows = sorted(rows, key=lambda r: r["submit"])[4 * k:]
    def med(a: str, b: str) -> float:
        return statistics.median(r[b] - r[a] for r in rows) / 1e3
    events = sorted([(r["start_ns"], 1) for r in rows] + [(r["end_ns"], -1) for r in rows])
    at_once: dict[int, int] = {}
    running, last = 0, events[0][0]
    for t, step in events:
        at_once[running] = at_once.get(running, 0) + t - last
        running, last = running + step, t
    total = sum(at_once.values()) or 1
    wall = (max(r["result"] for r in rows) - min(r["submit"] for r in rows)) / 1e9
    return (f"{len(rows) / wall:8.1f}/s | run {med('start_ns', 'end_ns'):8.0f} µs | submit->published "
            f"{med('submit', 'published_ns'):6.0f} | published->start {med('published_ns', 'start_ns'):6.0f} "
            f"| end->result {med('end_ns', 'result'):6.0f} | runs at once "
            + " ".join(f"{n}:{v / total:.2f}" for n, v in sorted(at_once.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--route", default="ort-cpu")
    ap.add_argument("--graph", default="mlp", help="mlp (the built-in MLP 512x6 b64) or a .onnx path")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=AxBxC",
                    help="an input's shape for a graph with dynamic dimensions")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if args.graph == "mlp":
        graph = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64),
                                     Path(tempfile.mkdtemp(prefix="xstage-timeline-")) / "mlp.onnx")
    else:
        graph = Path(args.graph)
    shapes = {name: tuple(int(d) for d in dims.split("x"))
              for name, dims in (s.split("=", 1) for s in args.shape)} or None
    config = dict(item.split("=", 1) for item in args.session_config) or None
    k = args.depth
    with open_stage(graph, route=args.route, depth=k, concurrency=k, shapes=shapes,
                    session_config=config) as stage:
        feeds = {n: np.ascontiguousarray(v) for n, v in stage.inputs.items()}
        print(f"{graph.name} on {args.route}, depth {k} (concurrency granted {stage.concurrency}), "
              f"session config {config or '-'}, {args.requests} requests")
        for name, drive, depth in (("depth 1", loop, 1), ("loop   ", loop, k), ("refill ", refill, k)):
            for _ in range(args.repeats):
                print(f"  {name} {summary(drive(stage, feeds, depth, args.requests), depth)}", flush=True)
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
