"""``xstage bisect`` on the third-party graphs and the built-in tiny vision tower: one table.

For each graph: the outcome, the regions, the probe count and the wall time of one bisect on a
route (default ``ort-openvino``), with the inputs ``tests/thirdparty.py`` gives each graph (fixed
seed; ``silero-vad`` gets its ``.npz`` with sr=16000). Every record is written into ``--out``.

Run from the repository root (the OpenVINO env of the test cache; minutes on a loaded VM)::

    XSTAGE_PYTHON_ORT_OPENVINO=.test-cache/ort-openvino/envs/ort-openvino/bin/python \\
        PYTHONPATH=src:tests python3 scripts/bisect_graphs.py --out /tmp/bisect-records

On a quiet 16-core machine add ``--max-probes``/``--deadline`` as needed; the figures in the
report came from this command on the 2-core development VM, loaded by other work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import thirdparty  # noqa: E402

from xstage import errors  # noqa: E402
from xstage.bisect import bisect  # noqa: E402
from xstage.bisect.record import write_bisect_record  # noqa: E402
from xstage.builtin_graphs import builtin_artifact  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--route", default="ort-openvino")
    ap.add_argument("--cache", default=".test-cache/thirdparty", help="the third-party graphs' cache")
    ap.add_argument("--out", default="bisect-records", help="folder for the records")
    ap.add_argument("--max-probes", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None)
    ap.add_argument("--only", action="append", default=[], help="graph names (repeatable)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases: list[tuple[str, Path, dict]] = []
    for name in thirdparty.GRAPHS:
        path = thirdparty.fetch(name, args.cache)
        cases.append((name, path, {"inputs": thirdparty.inputs(name)}))
    cases.append(("vision-tower-tiny", builtin_artifact("vision-tower-tiny"), {}))
    rows = []
    for name, path, kw in cases:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            result = bisect(path, route=args.route, max_probes=args.max_probes,
                            deadline=args.deadline, on_probe=lambda a, b, o, name=name: print(
                                f"  {name}: probe [{a}, {b}) {o.verdict}", flush=True), **kw)
            record = result.record
        except errors.Refused as exc:
            record = exc.record
        wall = time.perf_counter() - t0
        write_bisect_record(record, out / f"{name}.json")
        regions = [(r["start"], r["stop"]) for r in record["regions"]]
        rows.append({"graph": name, "nodes": record["artifact"]["nodes"],
                     "outcome": record["outcome"]["status"], "regions": regions,
                     "probes": record["budget"]["probes"], "wall_s": round(wall, 1),
                     "cut_short": record["budget"]["cut_short"],
                     "contradictions": len(record["contradictions"]),
                     "declined": {d["op_type"]: len(d["nodes"]) for d in record["declined_ops"]}})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| graph | nodes | outcome | regions | probes | wall s | contradictions | declined |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['graph']} | {r['nodes']} | {r['outcome']} | {r['regions']} | {r['probes']} | "
              f"{r['wall_s']} | {r['contradictions']} | {r['declined']} |")
    print(f"\n(host: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
