"""``xstage external`` on the onnx wheel's light model zoo, on ort-cpu and ort-openvino: one table.

The nine ``onnx/backend/test/data/light/*.onnx`` graphs (opset 9 CNNs whose weights are
``ConstantOfShape`` fills) each run once per route on one seeded input (1, 3, 224, 224). Per
row: the verdict (exit code, refusal code and cause), the gate's figures (its rule and rel L2,
the tie-break's status) and the float64 figures: the graph's float64 answer at its own opset
(``xstage.stage.tiebreak.evaluate_float64``), and the stage's and the CPU EP reference's rel L2
and max abs from it. The stage's outputs come from ``--save-outputs`` where it was admitted, and
from the record's tie-break rows where it was refused after one ran.

Run from the repository root (minutes on a loaded 2-core VM)::

    XSTAGE_PYTHON_ORT_OPENVINO=/work/.test-cache/ort-openvino/envs/ort-openvino/bin/python \\
        PYTHONPATH=src python3 scripts/light_zoo.py --out /tmp/light-zoo

``--markdown`` prints the table as Markdown (as ``docs/external.md`` carries it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from xstage.stage import tiebreak

ROUTES = ("ort-cpu", "ort-openvino")


def _light() -> list[Path]:
    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return sorted(Path(p) for p in glob.glob(str(root / "*.onnx")))


def _input(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    (value,) = [v for v in model.graph.input if v.name not in inits]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def _distance(a: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    a64, x64 = np.asarray(a, np.float64).ravel(), np.asarray(x, np.float64).ravel()
    keep = np.isfinite(x64) & np.isfinite(a64)
    d = a64[keep] - x64[keep]
    norm = float(np.linalg.norm(x64[keep]))
    return (float(np.linalg.norm(d)) / norm if norm else float("nan")), float(np.max(np.abs(d), initial=0.0))


def _run(path: Path, route: str, feeds_npz: Path, out: Path) -> dict[str, Any]:
    record, saved = out / f"{path.stem}.{route}.json", out / f"{path.stem}.{route}.outputs.npz"
    for stale in (record, saved):
        stale.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "xstage", "external", "--graph", str(path), "--route", route,
            "--inputs", str(feeds_npz), "--runs", "1", "--warmup", "1", "--json", str(record),
            "--save-outputs", str(saved)]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    doc = json.loads(record.read_text()) if record.exists() else None
    outputs = dict(np.load(saved)) if saved.exists() else None
    return {"exit": done.returncode, "doc": doc, "outputs": outputs, "seconds": time.monotonic() - started,
            "stderr": done.stderr[-800:]}


def _parity(doc: dict[str, Any] | None) -> dict[str, Any]:
    if not doc:
        return {}
    refusals = (doc.get("outcome") or {}).get("refusals") or []
    if refusals and refusals[-1].get("code") == "numeric_gate_failed":
        return (refusals[-1].get("evidence") or {}).get("parity") or {}
    return doc.get("parity") or {}


def _verdict(run: dict[str, Any]) -> str:
    doc = run["doc"] or {}
    refusals = (doc.get("outcome") or {}).get("refusals") or []
    if run["exit"] == 0:
        return "placed, passed"
    if refusals:
        return f"refused {refusals[-1].get('code')}/{refusals[-1].get('cause')}"
    return f"exit {run['exit']}: {run['stderr'].strip().splitlines()[-1] if run['stderr'].strip() else ''}"


def _gate_text(gate: dict[str, Any]) -> str:
    if not gate:
        return "—"
    worst = max((o for o in gate.get("outputs") or [] if o.get("rel_l2") is not None),
                key=lambda o: o["rel_l2"], default=None)
    text = f"{gate.get('verdict')}"
    if worst is not None:
        text += f", rel_l2 {worst['rel_l2']:.1e} (rule {worst['rule']})"
    tb = gate.get("tiebreak") or {}
    if tb:
        code = tb.get("reason_code")
        text += f"; tie-break {tb.get('status')}" + (f" ({code})" if code else "")
    if gate.get("tier"):
        text += f"; {gate['tier'].get('decided')} tier {gate['tier'].get('verdict')}"
    return text


def _f64_text(run: dict[str, Any], exact: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> str:
    name = next(iter(exact))
    r_rel, r_max = _distance(reference[name], exact[name])
    if run["outputs"] is not None and name in run["outputs"]:
        s_rel, s_max = _distance(run["outputs"][name], exact[name])
        return f"stage {s_rel:.1e} / {s_max:.1e}, reference {r_rel:.1e} / {r_max:.1e}"
    rows = (_parity(run["doc"]).get("tiebreak") or {}).get("outputs") or []
    if rows:
        row = rows[0]
        return (f"stage {row['stage_rel_l2']:.1e} / {row['stage_max_abs']:.1e}, reference "
                f"{row['reference_rel_l2']:.1e} / {row['reference_max_abs']:.1e} (tie-break)")
    return f"stage —, reference {r_rel:.1e} / {r_max:.1e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="light-zoo", help="folder for the records and outputs")
    ap.add_argument("--routes", default=",".join(ROUTES), help="comma-separated routes")
    ap.add_argument("--only", default="", help="comma-separated model stems (default: all nine)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args()
    if "ort-openvino" in args.routes and not os.environ.get("XSTAGE_PYTHON_ORT_OPENVINO"):
        print("set XSTAGE_PYTHON_ORT_OPENVINO to the ort-openvino env's python", file=sys.stderr)
        return 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in _light():
        if args.only and path.stem not in args.only.split(","):
            continue
        feeds = _input(path)
        feeds_npz = out / f"{path.stem}.inputs.npz"
        np.savez(feeds_npz, **feeds)
        exact = tiebreak.evaluate_float64(path, feeds)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
        for route in args.routes.split(","):
            run = _run(path, route, feeds_npz, out)
            gate = _gate_text(_parity(run["doc"]))
            rows.append((path.stem.removeprefix("light_"), route, _verdict(run), gate,
                         _f64_text(run, exact, reference)))
            print(" | ".join(rows[-1]), f"({run['seconds']:.0f} s)", file=sys.stderr, flush=True)
    head = ("model", "route", "verdict", "gate", "float64 (rel L2 / max abs)")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in [head, *rows]:
            print("  ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
