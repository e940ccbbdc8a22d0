"""Cold and warm opens through ort-openvino: what the compile cache saves.

For each graph (the built-in vision tower, and a third-party graph: the PP-OCRv4 detector where
``--ppocr`` exists), ``--opens`` fresh opens (a new worker each, ``open_stage`` to a placed and
gated stage) of each kind, interleaved:

* ``cold``: the graph's compile cache entries removed first (``xstage.compile_cache.clear``), so
  the open compiles and seals a new entry (``miss``);
* ``warm``: the entry the cold open sealed is verified and handed to OpenVINO (``hit``).

Per open: the compile phase (the worker's session creation, ``worker.runtime.load_s``, which is
where OpenVINO compiles; the client's ``load`` span beside it), the warm-up (the profiled runs;
after a profile the session is built again unprofiled, which compiles again), and the whole open
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


def one_open(graph: Path, shapes: dict | None) -> dict:
    t0 = time.perf_counter()
    with open_stage(graph, route="ort-openvino", shapes=shapes, record_on_close=False) as stage:
        wall = time.perf_counter() - t0
        rec = stage.record()
    phases = {p["name"]: p["dur_us"] / 1e6 for p in rec["detail"]["phases"]}
    return {"status": rec["worker"]["compile_cache"]["status"],
            "compile_s": rec["worker"]["runtime"]["load_s"],
            "load_span_s": phases.get("load"), "warmup_s": phases.get("warm-up"), "open_s": wall,
            "placed": rec["proof"]["verdict"], "parity": rec["parity"]["verdict"]}


def bench(name: str, graph: Path, shapes: dict | None, opens: int, say) -> dict:
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    for i in range(opens):
        compile_cache.clear()
        for kind in ("cold", "warm"):
            row = one_open(graph, shapes)
            rows[kind].append(row)
            say(f"  {name} {kind} {i + 1}: {row}")
    keys = ("compile_s", "load_span_s", "warmup_s", "open_s")
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in keys} for kind, rs in rows.items()}
    return {"graph": name, "opens": opens, "median": med,
            "statuses": {k: sorted({r["status"] for r in rs}) for k, rs in rows.items()},
            "verdicts": sorted({(r["placed"], r["parity"]) for rs in rows.values() for r in rs}),
            "ratio": {k: med["warm"][k] / med["cold"][k] for k in med["cold"]}, "rows": rows}


def table(results: list[dict]) -> str:
    lines = ["| graph | phase | cold (median) | warm (median) | warm / cold |", "|---|---|---|---|---|"]
    names = {"compile_s": "compile (session creation)", "load_span_s": "load (client span)",
             "warmup_s": "warm-up", "open_s": "whole open (proof and gate included)"}
    for r in results:
        for key, label in names.items():
            lines.append(f"| {r['graph']} | {label} | {r['median']['cold'][key] * 1e3:.0f} ms "
                         f"| {r['median']['warm'][key] * 1e3:.0f} ms | {r['ratio'][key]:.2f} |")
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
        print(f"{r['graph']}: cold opens {r['statuses']['cold']}, warm opens {r['statuses']['warm']}, "
              f"verdicts {r['verdicts']}")
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
