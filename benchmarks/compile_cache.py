"""Cold and warm opens through ort-openvino: what the compile cache saves.

For each graph (the built-in vision tower, and a third-party graph: the PP-OCRv4 detector where
``--ppocr`` exists), ``--opens`` fresh opens (a new worker each, ``open_stage`` to a placed and
gated stage) of each kind, interleaved:

* ``off``: ``XSTAGE_COMPILE_CACHE=off``, no cache handed to the runtime (the baseline);
* ``cold``: the graph's compile cache entries removed first (``xstage.compile_cache.clear``), so
  the open compiles and seals a new entry (``miss``);
* ``warm``: the next open: the entry the cold open sealed is verified and handed to OpenVINO;
  ``hit`` when OpenVINO read it, ``unread`` when it compiled again and wrote it anew
  (``xstage.compile_cache`` rule 6);
* ``warm again``: the open after that: ``hit`` again, or ``unreadable`` (an entry the runtime
  wrote anew is not handed over again, so the runtime compiles without a cache).

The statuses are printed beside the figures: a warm figure means a cache was read only where
its status is ``hit``. ``benchmarks/openvino_cache.py`` takes the compile itself apart.

Per open: the compile phase (the worker's session creation, where OpenVINO compiles:
``worker.runtime.load_s`` less ``ep_bind_s``, the plugin EP's registration and device pick that
precede it and that no cache can skip; both shown beside it, with the client's ``load`` span),
the warm-up (the profiled runs; after a profile the session is built again unprofiled, which
compiles again), and the whole open
(``open_stage``'s wall time, proof and gate included: they run on every open). Medians, and the
warm/cold ratio of each.

Run: ``PYTHONPATH=src XSTAGE_PYTHON_ORT_OPENVINO=… python benchmarks/compile_cache.py [--opens 5]
[--ppocr PATH] [--json OUT.json]``. Uses the caller's XSTAGE_HOME (its compile caches are
cleared). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from xstage import compile_cache, open_stage
from xstage.builtin_graphs import builtin_artifact

PPOCR_DEFAULT = "/work/main/.devtree/graphs/ch_PP-OCRv4_det_infer.onnx"
#: the opens of one round, in order (the module docstring says what each is)
KINDS = ("off", "cold", "warm", "warm again")


def one_open(graph: Path, shapes: dict | None, off: bool = False) -> dict:
    if off:
        os.environ[compile_cache.ENV] = "off"
    else:
        os.environ.pop(compile_cache.ENV, None)
    t0 = time.perf_counter()
    with open_stage(graph, route="ort-openvino", shapes=shapes, record_on_close=False) as stage:
        wall = time.perf_counter() - t0
        rec = stage.record()
    phases = {p["name"]: p["dur_us"] / 1e6 for p in rec["detail"]["phases"]}
    runtime = rec["worker"]["runtime"]
    return {"status": rec["worker"]["compile_cache"]["status"],
            "compile_s": runtime["load_s"] - runtime.get("ep_bind_s", 0.0),
            "ep_bind_s": runtime.get("ep_bind_s", 0.0), "worker_load_s": runtime["load_s"],
            "load_span_s": phases.get("load"), "warmup_s": phases.get("warm-up"), "open_s": wall,
            "placed": rec["proof"]["verdict"], "parity": rec["parity"]["verdict"]}


def bench(name: str, graph: Path, shapes: dict | None, opens: int, say) -> dict:
    rows: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for i in range(opens):
        compile_cache.clear()
        for kind in KINDS:
            row = one_open(graph, shapes, off=kind == "off")
            rows[kind].append(row)
            say(f"  {name} {kind} {i + 1}: {row}")
    keys = ("compile_s", "ep_bind_s", "worker_load_s", "load_span_s", "warmup_s", "open_s")
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in keys} for kind, rs in rows.items()}
    return {"graph": name, "opens": opens, "median": med,
            "statuses": {k: sorted({r["status"] for r in rs}) for k, rs in rows.items()},
            "verdicts": sorted({(r["placed"], r["parity"]) for rs in rows.values() for r in rs}),
            "ratio": {kind: {k: (med[kind][k] / med["cold"][k] if med["cold"][k] else float("nan"))
                      for k in med["cold"]} for kind in KINDS},
            "rows": rows}


def table(results: list[dict]) -> str:
    head = " | ".join(f"{kind} ({'/'.join(r_status)})" for kind, r_status in results[0]["statuses"].items())
    lines = [f"| graph | phase | {head} | warm / cold; warm again / cold |",
             "|---|---|" + "---|" * len(KINDS) + "---|"]
    names = {"compile_s": "compile (session creation)", "ep_bind_s": "plugin EP bind (register, pick)",
             "worker_load_s": "worker's load (bind + session)", "load_span_s": "load (client span)",
             "warmup_s": "warm-up", "open_s": "whole open (proof and gate included)"}
    for r in results:
        for key, label in names.items():
            cells = " | ".join(f"{r['median'][kind][key] * 1e3:.0f} ms" for kind in KINDS)
            lines.append(f"| {r['graph']} | {label} | {cells} "
                         f"| {r['ratio']['warm'][key]:.2f}; {r['ratio']['warm again'][key]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opens", type=int, default=5)
    ap.add_argument("--ppocr", default=PPOCR_DEFAULT)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    graphs = [("vision-tower-tiny", builtin_artifact("vision-tower-tiny"), None)]
    if Path(args.ppocr).is_file():
        work = Path(tempfile.mkdtemp(prefix="xstage-compile-cache-"))
        graphs.append(("PP-OCRv4 det 1x3x320x320", Path(shutil.copy(args.ppocr, work / "ppocr-det.onnx")),
                       {"x": (1, 3, 320, 320)}))
    else:
        say(f"skipping PP-OCRv4 det: {args.ppocr} is absent")
    results = [bench(name, graph, shapes, args.opens, say) for name, graph, shapes in graphs]
    print(table(results))
    for r in results:
        print(f"{r['graph']}: statuses {r['statuses']}, verdicts {r['verdicts']}")
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
