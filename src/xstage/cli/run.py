"""``xstage run``: the built-in graph through every resolved route, checked against the CPU.

The main job until ``xstage external`` lands: it proves, on this machine, that each route
that resolved really starts its interpreter, loads a graph and computes the same numbers as
onnxruntime in this process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from xstage import builtin_graphs, errors
from xstage.cli._output import Output
from xstage.home import cache_dir
from xstage.routes import ROUTE_NAMES, resolve_all
from xstage.routes.launch import load_options, open_worker

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run the built-in graph through every resolved route",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--route", action="append", choices=ROUTE_NAMES, metavar="ROUTE",
                   help="only this route (repeatable); default: every resolved ONNX route")
    p.add_argument("--calls", type=int, default=50, help="timed calls per route (default 50)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def _builtin_graph() -> Any:
    path = cache_dir() / "builtin" / "mlp-256x4.onnx"
    if not path.exists():
        builtin_graphs.write(builtin_graphs.mlp(), path)
    return path


def run(args: argparse.Namespace, out: Output) -> int:
    import onnxruntime as ort

    if args.calls < 1:
        raise errors.UsageError("--calls must be at least 1")
    graph = _builtin_graph()
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    reference = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    statuses = resolve_all()
    wanted = set(args.route or [])
    rows: list[dict[str, Any]] = []
    failed = False
    for status in statuses:
        if wanted and status.name not in wanted:
            continue
        row: dict[str, Any] = {"route": status.name, "status": status.status}
        rows.append(row)
        if not status.resolved:
            row.update(outcome="skipped", why=f"missing ({status.reason_code.value})"
                       if status.reason_code else "missing")
            if wanted:
                failed = True
            continue
        if status.spec.runtime != "onnxruntime":
            row.update(outcome="skipped", why="torch routes run .pt2 stages (not built in yet)")
            continue
        try:
            row.update(_run_route(status, graph, x, reference, args.calls, out))
        except errors.XstageError as exc:
            failed = True
            row.update(outcome="error", why=exc.message)
    if args.json:
        out.json({"graph": str(graph), "routes": rows})
    else:
        ran = [r for r in rows if r["outcome"] != "skipped"]
        out.table(
            f"built-in graph {graph.name} (8x256 fp32, 4 layers) vs onnxruntime CPU in-process",
            ["route", "device", "outcome", "python / ort", "session providers", "max |diff|",
             "call / worker ms"],
            [[r["route"], r.get("device", ""), r["outcome"] + (f": {r['why']}" if r.get("why") else ""),
              f"{r.get('python', '')} / {r.get('onnxruntime', '')}",
              ", ".join(p.replace("ExecutionProvider", "") for p in r.get("providers", [])),
              f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else "",
              f"{r['call_ms']:.3f} / {r['worker_ms']:.3f}" if "call_ms" in r else ""]
             for r in ran],
        )
        skipped = [f"{r['route']} ({r['why']})" for r in rows if r["outcome"] == "skipped"]
        if skipped:
            out.result("not run: " + "; ".join(skipped) + ". `xstage devices` says why and what to do.")
    return 1 if failed else 0


def _run_route(status: Any, graph: Any, x: np.ndarray, reference: np.ndarray, calls: int,
               out: Output) -> dict[str, Any]:
    options = load_options(status)
    out.log(f"{status.name}: starting {status.interpreter}")
    with open_worker(status) as worker:
        loaded = worker.load(graph, options=options)
        y = worker.run({"x": x})["y"]
        times, worker_times = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            worker.run({"x": x})
            times.append(time.perf_counter() - t0)
            worker_times.append(worker.last_timing.get("worker_ns", 0) / 1e9)
        hello = worker.hello or {}
    versions = hello.get("worker", {}).get("versions", {})
    info = loaded.get("info", {})
    diff = float(np.max(np.abs(y.astype(np.float64) - reference)))
    providers = list(info.get("providers", []))
    ok = diff <= 1e-4 and providers and providers[0] == options["ep"]["name"]
    return {
        "outcome": "ok" if ok else "mismatch",
        "device": options.get("device"),
        "python": versions.get("python"),
        "onnxruntime": versions.get("onnxruntime"),
        "providers": providers,
        "max_abs_diff": diff,
        "call_ms": statistics.median(times) * 1e3,
        "worker_ms": statistics.median(worker_times) * 1e3,
        "why": "" if ok else "numbers or providers differ from what was asked",
    }
