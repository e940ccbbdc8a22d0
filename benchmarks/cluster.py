"""A stage called locally against the same stage through Ray, on one machine.

A local two-node Ray cluster on the loopback address (the head, and a node with the custom
resource ``fake_npu``; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` set before Ray is imported, usage
reporting off), then three arms, in interleaved rounds so machine noise lands on all alike:

* ``local``      — ``open_stage(graph, route="ort-cpu")``: this process's worker, shared region.
* ``ray``        — ``open_stage(graph, route="ort-cpu", cluster="ray", resources={"fake_npu":
                   1})``: a Ray actor on the other node runs the same stage; inputs and outputs
                   travel through Ray's object store.
* ``ray-plain``  — a plain Ray actor on the same node returning ``x[:n]`` (no xstage): Ray's own
                   floor for the same bytes.

The graph is ``builtin_graphs.slice_graph`` (``y = x[:n]``: the bytes move, almost nothing is
computed), at 64 B, 1 MiB and 8.8 MB each way. Each row: the median round trip per arm, the
worker's own compute (its stamps), and what Ray adds per call (``ray`` minus ``local``). Put
beside ``benchmarks/transport.py``'s figures (the local arm's transport) to see what the cluster
costs on top.

Run: ``python benchmarks/cluster.py [--rounds N] [--json]``. Not a test: nothing asserts.
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

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read when ray is imported
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

import xstage  # noqa: E402
from xstage import builtin_graphs  # noqa: E402

SIZES = {"64 B": 64, "1 MiB": 1 << 20, "8.8 MB": 8_800_000}


def _cluster():
    import ray
    from ray._private import services
    from ray.cluster_utils import Cluster

    assert services.get_node_ip_address() == "127.0.0.1", "Ray would not stay on the loopback"
    src = str(Path(__file__).resolve().parents[1] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=1, resources={"fake_npu": 2}, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes(timeout=120)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    return ray, cluster


class _Echo:
    def slice(self, x: np.ndarray, n: int) -> np.ndarray:
        return x[:n].copy()


def _timed(fn, *args) -> tuple[float, float]:
    t0 = time.perf_counter()
    compute = fn(*args)
    return time.perf_counter() - t0, compute


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="calls per arm and size (default 40)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    args = ap.parse_args(argv)
    ray, cluster = _cluster()
    rows = []
    try:
        echo = ray.remote(_Echo).options(num_cpus=0, resources={"fake_npu": 1}).remote()
        folder = Path(tempfile.mkdtemp(prefix="xstage-cluster-bench-"))
        for label, nbytes in SIZES.items():
            n = max(1, nbytes // 4)
            graph = builtin_graphs.write(builtin_graphs.slice_graph(n, n), folder / f"s{n}.onnx")
            x = {"x": np.random.default_rng(0).standard_normal(n).astype(np.float32)}
            local = xstage.open_stage(graph, route="ort-cpu", record_on_close=False)
            remote = xstage.open_stage(graph, route="ort-cpu", cluster="ray",
                                       resources={"fake_npu": 1}, record_on_close=False)
            try:
                rows.append(_measure(label, nbytes, local, remote, echo, x, n, args.rounds, ray))
            finally:
                local.close()
                remote.close()
            if not args.json:
                _print(rows[-1])
    finally:
        ray.shutdown()
        cluster.shutdown()
    if args.json:
        print(json.dumps({"machine_cpus": os.cpu_count(), "rows": rows}, indent=2))
    return 0


def _measure(label, nbytes, local, remote, echo, x, n, rounds, ray) -> dict:
    def call(stage):
        fut = stage.submit(x)
        fut.result()
        t = fut.timing
        return max(0, t.get("end_ns", 0) - t.get("start_ns", 0)) / 1e9

    for _ in range(3):  # warm every arm
        call(local), call(remote), ray.get(echo.slice.remote(x["x"], n))
    samples: dict[str, list[tuple[float, float]]] = {"local": [], "ray": [], "ray-plain": []}
    for _ in range(rounds):
        samples["local"].append(_timed(call, local))
        samples["ray"].append(_timed(call, remote))
        samples["ray-plain"].append(_timed(lambda: (ray.get(echo.slice.remote(x["x"], n)), 0.0)[1]))
    med = {arm: statistics.median(rt for rt, _ in s) for arm, s in samples.items()}
    comp = {arm: statistics.median(c for _, c in s) for arm, s in samples.items()}
    return {"size": label, "bytes_each_way": nbytes, "rounds": rounds,
            "round_trip_ms": {a: round(v * 1e3, 3) for a, v in med.items()},
            "compute_ms": {a: round(comp[a] * 1e3, 3) for a in ("local", "ray")},
            "ray_adds_ms": round((med["ray"] - med["local"]) * 1e3, 3),
            "ray_over_local": round(med["ray"] / med["local"], 1),
            "ray_over_plain_ray": round(med["ray"] / med["ray-plain"], 2)}


def _print(row: dict) -> None:
    rt = row["round_trip_ms"]
    print(f"{row['size']:>7}: local {rt['local']:8.3f} ms | through Ray {rt['ray']:8.3f} ms "
          f"(+{row['ray_adds_ms']:.3f} ms per call, x{row['ray_over_local']}) | plain Ray "
          f"actor {rt['ray-plain']:8.3f} ms (xstage through Ray / plain: "
          f"x{row['ray_over_plain_ray']}) | worker compute local {row['compute_ms']['local']:.3f}"
          f" / ray {row['compute_ms']['ray']:.3f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
