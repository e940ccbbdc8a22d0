"""Measure the ledger's budget against the worker's peak for A16W8 graphs (docs/memory.md).

    PYTHONPATH=src XSTAGE_PYTHON_ORT_OPENVINO=/path/to/ort-openvino/bin/python \\
        python3 scripts/a16w8_footprint.py [--graphs NAME,...] [--routes ort-cpu,ort-openvino]
                                           [--out DIR] [--json FILE]

Each graph is quantized with ``xstage quantize --scheme a16w8 --calibration-synthetic 4`` (the
built-ins from the package; the third-party graphs of ``tests/thirdparty.py`` from
``XSTAGE_TEST_CACHE/thirdparty``, default ``.test-cache/thirdparty``), then, per route, the
ledger's budget is computed exactly as ``open_stage`` computes it (``footprint.reservations`` +
``make_budget`` in ``host_ram``) and one worker of the route loads the quantized graph and runs
the profiled warm-up as admission does; its peak is read as admission reads it
(``xstage.stage.admit._stage_memory`` / ``_measured_peak``). The proof and the gate are not run:
this measures memory only. One line per (graph, route): budget, measured peak, budget/measured.

Exit status 1 when any budget/measured is under ``--min-ratio`` (default 1.1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

#: name -> (where the fp32 graph comes from, the quantize/measure shape flags)
GRAPHS: dict[str, tuple[str, tuple[str, ...]]] = {
    "vision-tower-tiny": ("builtin", ()),
    "code2wav-tiny": ("builtin", ()),
    "mlp-512x6-b64": ("builtin", ()),
    "ppocr-cls-v2": ("thirdparty", ("--shape", "x=1x3x48x192")),
    "ppocr-rec-v4": ("thirdparty", ("--shape", "x=1x3x48x320")),
    "ppocr-det-v4": ("thirdparty", ("--shape", "x=1x3x640x640")),
}
#: Not here: silero-vad-op18, whose quantized copy holds no Q/DQ node (onnxruntime's quantizer
#: leaves its If branches alone), so it is not an A16W8 graph.


def _source(name: str) -> Path:
    """The fp32 graph ``name``: a built-in, or a third-party graph from the test cache."""
    kind, _ = GRAPHS[name]
    if kind == "builtin":
        from xstage.builtin_graphs import builtin_artifact

        return builtin_artifact(name)
    sys.path.insert(0, str(ROOT / "tests"))
    import thirdparty

    cache = Path(os.environ.get("XSTAGE_TEST_CACHE", ROOT / ".test-cache")) / "thirdparty"
    return thirdparty.fetch(name, cache)


def _flags(args: tuple[str, ...]) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    shapes: dict[str, tuple[int, ...]] = {}
    dims: dict[str, int] = {}
    for flag, value in zip(args[0::2], args[1::2], strict=True):
        key, _, rest = value.partition("=")
        if flag == "--shape":
            shapes[key] = tuple(int(d) for d in rest.split("x"))
        else:
            dims[key] = int(rest)
    return shapes, dims


def quantize(name: str, out: Path) -> Path:
    """``xstage quantize --scheme a16w8`` of graph ``name`` into ``out`` (its manifest beside)."""
    target = out / f"{name}.a16w8.onnx"
    if not target.exists():
        src = out / f"{name}.onnx"  # the quantized graph's manifest names its source beside it
        origin = _source(name)
        shutil.copyfile(origin, src)
        sidecar = origin.with_name(origin.stem + ".manifest.json")
        if sidecar.exists():
            shutil.copyfile(sidecar, src.with_name(src.stem + ".manifest.json"))
        subprocess.run([sys.executable, "-m", "xstage", "quantize", str(src), str(target),
                        "--scheme", "a16w8", "--calibration-synthetic", "4", "-q",
                        *GRAPHS[name][1]], check=True, cwd=out, timeout=1800)
    return target


def measure(path: Path, route: str, name: str) -> dict[str, Any]:
    """The budget ``open_stage`` would hold for ``path`` on ``route``, and the worker's peak."""
    from xstage.artifact import inspect_artifact
    from xstage.device_table import devices
    from xstage.inputs import resolve_feeds
    from xstage.ledger import HOST_POOL, footprint, make_budget
    from xstage.routes.launch import load_options, open_worker
    from xstage.stage import admit

    status = devices().route(route)
    if not status.resolved:
        raise SystemExit(f"{route} is not resolved here: {status.reason}")
    art = inspect_artifact(path)
    shapes, dims = _flags(GRAPHS[name][1])
    feeds = resolve_feeds(art.inputs, None, shapes=shapes, dims=dims)
    real = {n: tuple(a.shape) for n, a in feeds.items()}
    held = footprint.reservations(art, status.spec.memory_cost(status.versions), HOST_POOL, real,
                                  route=route)
    budget = make_budget(held, pool=HOST_POOL)
    options = load_options(status, fmt=art.format, profile=True,
                           output_names=[o.name for o in art.outputs])
    client = open_worker(status)
    try:
        client.load(art.path, runtime="ort", options=options)
        client.run(feeds, phase="warmup")
        timing = dict(client.last_timing)
        info, _ = client.evidence()
    finally:
        client.close()
    memory, _ = admit._stage_memory(info)
    peak = admit._measured_peak(HOST_POOL, timing, memory, info) or 0
    return {"graph": name, "route": route, "artifact_bytes": art.bytes,
            "budget_bytes": budget.budget_bytes, "peak_bytes": peak,
            "ratio": round(budget.budget_bytes / peak, 3) if peak else None,
            "reservations": {r.purpose: r.bytes for r in budget.reservations}}


def main(argv: list[str] | None = None) -> int:
    """Quantize, measure, print one line per (graph, route); 1 when a ratio is under the bar."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default=",".join(GRAPHS))
    parser.add_argument("--routes", default="ort-cpu,ort-openvino")
    parser.add_argument("--out", type=Path, default=None, help="where the quantized graphs go")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--min-ratio", type=float, default=1.1)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="a16w8-footprint-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.graphs.split(","):
        path = quantize(name, out)
        for route in args.routes.split(","):
            row = measure(path, route, name)
            rows.append(row)
            print(f"{name:18s} {route:13s} artifact {row['artifact_bytes'] / MiB:7.2f} MiB  "
                  f"budget {row['budget_bytes'] / MiB:7.1f} MiB  peak {row['peak_bytes'] / MiB:7.1f} "
                  f"MiB  budget/measured {row['ratio']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    low = [r for r in rows if not r["ratio"] or r["ratio"] < args.min_ratio]
    for r in low:
        print(f"under {args.min_ratio}: {r['graph']} on {r['route']} ({r['ratio']})", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
