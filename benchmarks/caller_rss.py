"""What opening a large stage leaves in the caller's process: its RSS, and what it imported.

Each round is a fresh interpreter that imports xstage, opens the built-in MLP once, calls and
closes it, and reads its RSS after ``gc.collect()`` (the baseline); then opens a graph of
``--mib`` MiB of fp32 weights (an MLP built here, its weights as external data, or
embedded with ``--embedded``), calls it once, closes it (keeping the stage object, as an
engine keeps its own), collects, and reads its RSS again. The figure is the second reading
minus the first, the median of ``--rounds`` fresh processes; beside it, the same while the
stage is open and after the object is dropped. Every ``--src`` tree is measured in the same
run, rounds interleaved, so the figures sit side by side (``--src /path/to/main/src --src
src``: before and after).

    PYTHONPATH=src python3 benchmarks/caller_rss.py --src /work/main/src --src src

The engine-side import list (every top-level module the round imported, and whether
onnxruntime is among them) is printed for each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: One round, in a fresh interpreter (argv: graph, route, reference_arm or "").
ROUND = r"""
import gc, json, sys
before = set(sys.modules)
import psutil
import xstage
from xstage.builtin_graphs import builtin_stage

graph, route, arm = sys.argv[1], sys.argv[2], sys.argv[3]
kw = {"reference_arm": arm} if arm else {}

kept = []  # an engine keeps its stage object after close(): so does this round

def rss():
    gc.collect()
    return psutil.Process().memory_info().rss

def once(path):
    stage = xstage.open_stage(path, route=route, record_on_close=False, **kw)
    stage(stage.inputs)
    held = rss()
    stage.close()
    kept.append(stage)
    return held, rss()

_, base = once(builtin_stage())
open_, big = once(graph)
kept.clear()
mods = sorted({m.split(".")[0] for m in sys.modules} - {m.split(".")[0] for m in before})
print(json.dumps({"base": base, "open": open_, "big": big, "dropped": rss(), "modules": mods,
                  "onnxruntime": "onnxruntime" in sys.modules}))
"""


def build(folder: Path, mib: int, embedded: bool) -> Path:
    """An MLP (MatMul + Add + Relu) of ``mib`` MiB of fp32 weights, 2048 wide."""
    width = 2048
    depth = max(1, round(mib * 2**20 / (width * width * 4)))
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Tanh", [prev], ["y"]))
    graph = helper.make_graph(nodes, "big_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, width])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / f"mlp-{mib}mib{'-embedded' if embedded else ''}.onnx"
    onnx.save(model, str(path), save_as_external_data=not embedded, all_tensors_to_one_file=True,
              location=f"{path.stem}.bin", size_threshold=0)
    return path


def one_round(src: str, graph: Path, route: str, arm: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", ROUND, str(graph), route, arm], env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise SystemExit(f"a round under {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", action="append", default=[],
                   help="an xstage source tree to measure (repeatable; default: src)")
    p.add_argument("--mib", type=int, default=128, help="the large graph's weights (default 128)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per tree (default 3)")
    p.add_argument("--embedded", action="store_true", help="weights inside the .onnx file")
    p.add_argument("--route", default="ort-cpu", help="the route both stages are opened on")
    p.add_argument("--reference-arm", default="",
                   help="passed to open_stage where given (a tree that has the argument)")
    args = p.parse_args()
    trees = args.src or ["src"]
    with tempfile.TemporaryDirectory(prefix="xstage-rss-") as tmp:
        graph = build(Path(tmp), args.mib, args.embedded)
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
        print(f"graph: {graph.name}, {size / 2**20:.1f} MiB on disk; route {args.route}; "
              f"{args.rounds} fresh processes per tree")
        rounds: dict[str, list[dict]] = {t: [] for t in trees}
        for _ in range(args.rounds):
            for tree in trees:  # interleaved: whatever else the machine does lands on both
                rounds[tree].append(one_round(tree, graph, args.route, args.reference_arm))
        for tree, got in rounds.items():
            print(f"\n{tree}: baseline {statistics.median(r['base'] for r in got) / 2**20:.1f} MiB "
                  f"(median); over it, median (rounds):")
            for key, what in (("open", "while open, after one call"),
                              ("big", "after close(), the stage object kept"),
                              ("dropped", "after the stage object is dropped")):
                deltas = [(r[key] - r["base"]) / 2**20 for r in got]
                print(f"  {what:<40} {statistics.median(deltas):+7.1f} MiB "
                      f"({', '.join(f'{d:+.1f}' for d in deltas)})")
            print(f"  onnxruntime imported: {got[-1]['onnxruntime']}")
            print(f"  imported: {' '.join(got[-1]['modules'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
