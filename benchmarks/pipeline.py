"""Pipelined calls against sequential ones: a producer of D ms per item feeding a stage of C ms.

The producer does D ms of CPU work per item in this thread (single-threaded numpy loops, which
release the GIL; it never sleeps). The stage is a MatMul chain calibrated to C ms of compute
on one onnxruntime thread (``threads=1``). Two arms, interleaved in rounds so machine noise
lands on both:

* ``sequential``: produce an item, ``stage(item)``, repeat;
* ``map(depth=2)``: ``stage.map(items, depth=2)``: the next item is produced while the worker
  computes the one before.

The ideal throughput is ``1 / max(C, D + transport)`` items per second (``transport``: a sync
call's round trip minus the worker's compute, measured here), and sequential can reach at most
``1 / (C + D + transport)``, about 50% of it when C = D. Separately: the latency of a sync call
and of ``submit(...).result()`` on an idle stage, on a tiny stage (64 B in and out) and on the
C-ms stage, as overhead over the worker's own compute.

Run: ``PYTHONPATH=src python benchmarks/pipeline.py [--json] [--ms 2,10] [--items 60]
[--rounds 3]``. Not a test: nothing asserts. Uses only the repository, numpy, onnx and
onnxruntime (no registry access needed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from xstage import builtin_graphs, open_stage

N = 256  # the MatMul side: one 256x256 MatMul is ~0.3-1 ms on one core


def chain(depth: int, n: int = N) -> onnx.ModelProto:
    """``depth`` MatMuls of an n×n input by a fixed n×n weight."""
    return builtin_graphs.matmul_chain(depth, n, name="chain")

def tiny() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def compute_ms(stage, feeds, calls: int = 15) -> float:
    for _ in range(3):
        stage(feeds)
    times = []
    for _ in range(calls):
        stage(feeds)
        times.append(stage.last_timing["worker_ns"] / 1e6)
    return statistics.median(times)


def calibrated_stage(target_ms: float, folder: Path):
    """A chain whose worker compute is close to ``target_ms`` on one thread."""
    feeds = {"x": np.random.default_rng(2).standard_normal((N, N)).astype(np.float32)}
    depth = 8
    for _ in range(3):
        path = folder / f"chain-{depth}.onnx"
        onnx.save(chain(depth), path)
        stage = open_stage(path, route="ort-cpu", threads=1, depth=2, inputs=feeds,
                           record_on_close=False)
        got = compute_ms(stage, feeds)
        if abs(got - target_ms) <= 0.1 * target_ms:
            return stage, feeds, got
        stage.close()
        depth = max(1, round(depth * target_ms / got))
    path = folder / f"chain-{depth}.onnx"
    onnx.save(chain(depth), path)
    stage = open_stage(path, route="ort-cpu", threads=1, depth=2, inputs=feeds,
                       record_on_close=False)
    return stage, feeds, compute_ms(stage, feeds)


class Producer:
    """D ms of CPU work per item on this thread's clock: numpy loops, never a sleep."""

    def __init__(self, ms: float, template: np.ndarray) -> None:
        self.seconds = ms / 1e3
        self.a = np.random.default_rng(3).standard_normal(1 << 15).astype(np.float32)
        self.b = np.empty_like(self.a)
        self.template = template

    def item(self, i: int) -> dict[str, np.ndarray]:
        stop = time.thread_time() + self.seconds
        while time.thread_time() < stop:
            np.exp(self.a, out=self.b)
            np.sin(self.b, out=self.b)
        x = self.template.copy()
        x[0, 0] = float(i)
        return {"x": x}

    def items(self, n: int):
        for i in range(n):
            yield self.item(i)


def transport_us(stage, feeds, calls: int = 30) -> float:
    rt = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        stage(feeds)
        rt.append((time.perf_counter_ns() - t0 - stage.last_timing["worker_ns"]) / 1e3)
    return statistics.median(rt)


def latencies(stage, feeds, calls: int = 200) -> dict[str, float]:
    """Overhead over the worker's compute: a sync call, and submit().result() when idle."""
    sync, sub, submit_only = [], [], []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        stage(feeds)
        sync.append((time.perf_counter_ns() - t0 - stage.last_timing["worker_ns"]) / 1e3)
        t0 = time.perf_counter_ns()
        fut = stage.submit(feeds)
        t1 = time.perf_counter_ns()
        fut.result()
        t2 = time.perf_counter_ns()
        submit_only.append((t1 - t0) / 1e3)
        sub.append((t2 - t0 - fut.timing["worker_ns"]) / 1e3)
    return {"sync_overhead_us": statistics.median(sync),
            "submit_result_overhead_us": statistics.median(sub),
            "submit_call_us": statistics.median(submit_only)}


def run_pair(ms: float, items: int, rounds: int, folder: Path) -> dict:
    stage, feeds, c_ms = calibrated_stage(ms, folder)
    try:
        producer = Producer(ms, feeds["x"])
        t0 = time.perf_counter()
        for i in range(20):
            producer.item(i)
        d_ms = (time.perf_counter() - t0) / 20 * 1e3  # wall time of one item, as the arms see it
        tr_us = transport_us(stage, feeds)
        seq, pipe = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for item in producer.items(items):
                stage(item)
            seq.append(items / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in stage.map(producer.items(items), depth=2):
                pass
            pipe.append(items / (time.perf_counter() - t0))
        ideal = 1e3 / max(c_ms, d_ms + tr_us / 1e3)
        lat = latencies(stage, feeds, calls=30)
        return {"target_ms": ms, "compute_ms": c_ms, "produce_ms": d_ms, "transport_us": tr_us,
                "ideal_per_s": ideal, "sequential_per_s": statistics.median(seq),
                "pipelined_per_s": statistics.median(pipe),
                "sequential_vs_ideal": statistics.median(seq) / ideal,
                "pipelined_vs_ideal": statistics.median(pipe) / ideal,
                "pipelined_vs_sequential": statistics.median(pipe) / statistics.median(seq),
                "latency": lat}
    finally:
        stage.close()


def tiny_latency(folder: Path) -> dict[str, float]:
    path = folder / "tiny.onnx"
    onnx.save(tiny(), path)
    feeds = {"x": np.ones(16, np.float32)}
    with open_stage(path, route="ort-cpu", depth=2, inputs=feeds, record_on_close=False) as stage:
        for _ in range(200):
            stage(feeds)
        return latencies(stage, feeds, calls=1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--ms", default="2,10", help="C = D values in ms (comma-separated)")
    parser.add_argument("--items", type=int, default=60, help="items per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(),
               "tiny": tiny_latency(folder),
               "rows": [run_pair(float(ms), args.items, args.rounds, folder)
                        for ms in args.ms.split(",") if ms]}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(f"{doc['cpus']} CPUs, load average {doc['load_avg'][0]:.1f} at the start")
    print(f"{'C=D':>6} {'compute':>9} {'produce':>9} {'transport':>10} {'ideal/s':>8} "
          f"{'seq/s':>7} {'seq/ideal':>9} {'map2/s':>7} {'map2/ideal':>10} {'map2/seq':>8}")
    for r in doc["rows"]:
        print(f"{r['target_ms']:>4g}ms {r['compute_ms']:>7.2f}ms {r['produce_ms']:>7.2f}ms "
              f"{r['transport_us']:>8.0f}µs {r['ideal_per_s']:>8.1f} {r['sequential_per_s']:>7.1f} "
              f"{r['sequential_vs_ideal']:>9.2f} {r['pipelined_per_s']:>7.1f} "
              f"{r['pipelined_vs_ideal']:>10.2f} {r['pipelined_vs_sequential']:>8.2f}")
    print("latency, overhead over the worker's compute (median):")
    rows = [("64 B stage", doc["tiny"])] + [(f"{r['target_ms']:g} ms stage", r["latency"])
                                             for r in doc["rows"]]
    for name, lat in rows:
        print(f"  {name:<12} sync call {lat['sync_overhead_us']:7.1f}µs   submit().result() "
              f"{lat['submit_result_overhead_us']:7.1f}µs   submit() returns in "
              f"{lat['submit_call_us']:6.1f}µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
