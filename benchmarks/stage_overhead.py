"""What running a stage through xstage costs over running it in-process with onnxruntime.

The same graph, the same session options and threads, in interleaved batches (so machine
noise lands on both arms alike): ``in-process`` is an ``onnxruntime.InferenceSession`` in
this interpreter; ``xstage`` is ``xstage.open_stage(..., route="ort-cpu")`` — a worker in
its own process, the profiled warm-up already behind it — called through ``Stage.__call__``
(validation and the shared-memory transport included). Medians and their ratio are printed;
the target is ≤ 1.05 for a graph of ≥ 5 ms compute.

Run: ``python benchmarks/stage_overhead.py [--json] [--threads N] [--graph PATH --shape ...]``.
Not a test: nothing asserts.
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

import onnxruntime as ort

from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.inputs import parse_shapes, synthesize
from xstage.stage import open_stage

#: After a batch, onnxruntime's pool threads of the arm that just ran spin for a while; a gap
#: lets them park so the next arm does not share its cores with them.
GAP_S = 0.02


def _graphs(tmp: Path) -> list[tuple[str, Path, dict]]:
    small = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64, seed=7),
                                 tmp / "mlp-small.onnx")
    large = builtin_graphs.write(builtin_graphs.mlp(width=1024, depth=8, batch=128, seed=7),
                                 tmp / "mlp-large.onnx")
    return [("mlp 512x6 b64", small, {}), ("mlp 1024x8 b128", large, {})]


def measure(graph: Path, shapes: dict, threads: int | None, rounds: int, per_round: int) -> dict:
    art = inspect_artifact(graph)
    feeds = synthesize(art.inputs, shapes=shapes)
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    stage = open_stage(graph, route="ort-cpu", inputs=feeds, threads=threads)
    local, remote, compute = [], [], []
    try:
        for _ in range(5):
            session.run(names, feeds)
            stage(feeds)
        for _ in range(rounds):
            time.sleep(GAP_S)
            for _ in range(per_round):
                t0 = time.perf_counter()
                session.run(names, feeds)
                local.append(time.perf_counter() - t0)
            time.sleep(GAP_S)
            for _ in range(per_round):
                t0 = time.perf_counter()
                stage(feeds)
                remote.append(time.perf_counter() - t0)
                compute.append(stage.last_timing.get("worker_ns", 0) / 1e9)
    finally:
        stage.close()
    med_local, med_remote = statistics.median(local), statistics.median(remote)
    return {
        "in_process_ms": med_local * 1e3,
        "xstage_ms": med_remote * 1e3,
        "worker_compute_ms": statistics.median(compute) * 1e3,
        "ratio": med_remote / med_local,
        "samples": len(local),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads, both arms")
    parser.add_argument("--graph", help="an ONNX graph instead of the built-in MLPs")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x640x640")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        graphs = ([(Path(args.graph).name, Path(args.graph), parse_shapes(args.shape))]
                  if args.graph else _graphs(Path(tmp)))
        rows = []
        for label, path, shapes in graphs:
            row = measure(path, shapes, args.threads, args.rounds, args.per_round)
            row["graph"] = label
            rows.append(row)
    doc = {"benchmark": "stage_overhead", "threads": args.threads, "cpus": os.cpu_count(),
           "python": sys.version.split()[0], "onnxruntime": ort.__version__, "results": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{'graph':<22}{'in-process':>12}{'xstage':>10}{'worker':>10}{'ratio':>8}")
    for r in rows:
        print(f"{r['graph']:<22}{r['in_process_ms']:>10.3f}ms{r['xstage_ms']:>8.3f}ms"
              f"{r['worker_compute_ms']:>8.3f}ms{r['ratio']:>8.3f}")


if __name__ == "__main__":
    main()
