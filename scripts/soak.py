"""A soak of one worker: many calls through the shared region, and the tail of their overhead.

The busy-machine target asks for the p99 of a 10,000-call soak to stay within 5× its p50, quiet. Each call is
``WorkerClient.run`` on ``ort-cpu`` with the transport benchmark's stage (``slice_graph``:
onnxruntime's own work is one small copy, reported by the worker and taken off), back to back
after a warm-up. Printed: the overhead's p50, p90, p99, p99.9 and max, p99/p50, the calls over
1 ms, and the doorbell's decisions on both sides. ``--busy N`` runs the same beside N
busy-looping processes (``benchmarks/_busy.py``), ``--gap`` leaves the caller idle between
calls (an engine doing its own work), ``--elements`` sets the payload (float32 each way).

Run: ``PYTHONPATH=src python scripts/soak.py [--calls 10000] [--busy N] [--json]``. Not a test:
nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _busy import Neighbours  # noqa: E402  (the benchmarks' neighbours)

from xstage import builtin_graphs  # noqa: E402
from xstage.client import WorkerClient  # noqa: E402

QUANTILES = (0.5, 0.9, 0.99, 0.999)


def quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile of already sorted values."""
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values))) - 1))
    return sorted_values[i]


def soak(calls: int, elements: int, busy: int, gap_s: float, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Neighbours(busy) as neighbours:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        graph = builtin_graphs.write(builtin_graphs.slice_graph(elements, elements),
                                     Path(tmp) / "slice.onnx")
        feeds = {"x": np.random.default_rng(0).standard_normal(elements).astype(np.float32)}
        with WorkerClient(sys.executable) as client:
            client.load(graph)
            for _ in range(warmup):
                client.run(feeds)
            neighbours.busy()
            waits_of = getattr(client, "waits", dict)  # an older tree (a before/after run) has none
            before = waits_of()
            overhead = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                client.run(feeds)
                overhead.append(time.perf_counter_ns() - t0 - client.last_timing.get("worker_ns", 0))
                if gap_s:
                    time.sleep(gap_s)
            waits = waits_of()
            neighbours.quiet()
    us = sorted(v / 1e3 for v in overhead)
    figures = {f"p{q * 100:g}_us": quantile(us, q) for q in QUANTILES}
    p50 = figures["p50_us"]
    return {
        "calls": calls, "bytes_each_way": elements * 4, "busy_processes": busy,
        "gap_ms": gap_s * 1e3, "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
        **figures, "max_us": us[-1], "p99_over_p50": figures["p99_us"] / p50 if p50 else None,
        "over_1ms": sum(v > 1000 for v in us),
        "waits": {side: _delta(waits.get(side, {}), before.get(side, {})) for side in waits},
    }


def _delta(after: dict, before: dict) -> dict:
    return {key: {k: v - before.get(key, {}).get(k, 0) for k, v in after.get(key, {}).items()
                  if v - before.get(key, {}).get(k, 0)} for key in ("rules", "outcomes")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--elements", type=int, default=16, help="float32 elements each way")
    parser.add_argument("--busy", type=int, default=0, metavar="N")
    parser.add_argument("--gap", type=float, default=0.0, metavar="SECONDS",
                        help="the caller's idle time between calls")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.calls < 1 or args.busy < 0 or args.gap < 0:
        parser.error("--calls >= 1, --busy >= 0 and --gap >= 0")
    doc = {"benchmark": "soak", **soak(args.calls, args.elements, args.busy, args.gap, args.warmup)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{doc['calls']} calls, {doc['bytes_each_way']} B each way, "
          f"{doc['busy_processes']} busy processes, gap {doc['gap_ms']:g} ms "
          f"(load average {doc['load_before']:.2f} on {doc['cpus']} CPUs)")
    print("overhead: " + ", ".join(f"p{q * 100:g} {doc[f'p{q * 100:g}_us']:.1f} µs"
                                   for q in QUANTILES)
          + f", max {doc['max_us']:.0f} µs; p99/p50 {doc['p99_over_p50']:.2f} (target ≤ 5); "
            f"{doc['over_1ms']} calls over 1 ms")
    for side, counts in doc["waits"].items():
        rules = ", ".join(f"{k} {v}" for k, v in counts["rules"].items()) or "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in counts["outcomes"].items()) or "none"
        print(f"doorbell ({side}): decided: {rules}; ended: {outcomes}")


if __name__ == "__main__":
    main()
