"""The numeric gate's float64 tie-break: what it costs, and what it decides, on real graphs.

Three measurements, one JSON line per row (stdout), so a before/after pair is two runs of
this file with ``PYTHONPATH`` pointing at two trees:

* ``--kernels``: which ops onnxruntime's CPU EP has a double kernel for, read from its kernel
  registry (why the tie-break does not run a double-widened graph on onnxruntime).
* ``--times``: per graph, the float64 evaluation's seconds with onnx's own kernels and with
  xstage's (:mod:`xstage.stage.f64_kernels`), measured back to back in one process, and
  their ratio. Both arms pass through the same widening.
* ``--gate`` (the default): per graph and route, ``open_stage`` as a user runs it: the
  verdict, the rule that decided each output, the tie-break's status, its worst ratios
  (rule T1 rel_l2, rule T2 the worst magnitude band) and its seconds.

Graphs: the built-ins (``mlp-512x6-b64`` built here, ``vision-tower-tiny``,
``code2wav-tiny``), the pinned third-party graphs already in ``--thirdparty`` (default
``.test-cache/thirdparty``; ``tests/thirdparty.py`` fetches them), and any ``--extra PATH``
(an exported tower, a ``.pt2`` for torch-cpu). Routes: ort-cpu and ort-openvino for ONNX,
torch-cpu for ``.pt2``; a route's interpreter comes from ``XSTAGE_PYTHON_<ROUTE>`` as usual.

Run (from the repository root)::

    PYTHONPATH=src python benchmarks/tiebreak.py --kernels
    PYTHONPATH=src python benchmarks/tiebreak.py --times [--extra tower.onnx]
    XSTAGE_PYTHON_ORT_OPENVINO=... XSTAGE_PYTHON_TORCH_CPU=... \\
        PYTHONPATH=src python benchmarks/tiebreak.py --gate [--extra tower.onnx --extra tower.pt2]

Not a test: nothing asserts. Times on a shared machine are noisy: compare ratios taken in
one run, and say the load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from xstage import builtin_graphs

_ROOT = Path(__file__).resolve().parent.parent


def _graphs(thirdparty: Path, extra: list[str], tmp: Path) -> list[tuple[str, Path, dict | None]]:
    sys.path.insert(0, str(_ROOT / "tests"))
    import thirdparty as tp  # tests/thirdparty.py: pinned graphs and their inputs

    rows: list[tuple[str, Path, dict | None]] = [
        ("mlp-512x6-b64", builtin_graphs.write(
            builtin_graphs.mlp(width=512, depth=6, batch=64, seed=7), tmp / "mlp.onnx"), None)]
    rows += [(b, builtin_graphs.builtin_artifact(b), None) for b in ("vision-tower-tiny", "code2wav-tiny")]
    for name in tp.GRAPHS:
        path = tp.cached(name, thirdparty)
        if path:
            rows.append((name, Path(path), tp.inputs(name)))
    rows += [(Path(p).stem, Path(p), None) for p in extra]
    return rows


def kernels() -> None:
    """Print the ai.onnx ops the CPU EP registers, split by whether any kernel takes double."""
    from onnxruntime.capi import _pybind_state as capi

    ops: dict[str, bool] = {}
    for k in capi.get_all_opkernel_def():
        if k.provider != "CPUExecutionProvider" or k.domain not in ("", "ai.onnx"):
            continue
        double = any("double" in ",".join(v) for v in k.type_constraints.values())
        ops[k.op_name] = ops.get(k.op_name, False) or double
    import onnxruntime

    print(json.dumps({"onnxruntime": onnxruntime.__version__, "ops": len(ops),
                      "with_double": sum(ops.values()),
                      "without_double": sorted(o for o, d in ops.items() if not d)}))


def _feeds(path: Path, given: dict | None) -> dict[str, np.ndarray]:
    from xstage.artifact import inspect_artifact
    from xstage.inputs import synthesize

    return dict(given) if given is not None else synthesize(inspect_artifact(path).inputs)


def times(graphs: list[tuple[str, Path, dict | None]]) -> None:
    """Float64 evaluation seconds, onnx's kernels vs xstage's, back to back."""
    from xstage.stage import f64_kernels, tiebreak

    for name, path, given in graphs:
        if path.suffix != ".onnx":
            continue
        feeds = _feeds(path, given)
        row: dict[str, Any] = {"graph": name}
        outs: dict[str, dict[str, np.ndarray]] = {}
        for arm, kernels_ in (("onnx_kernels", ()), ("xstage_kernels", f64_kernels.KERNELS)):
            saved = f64_kernels.KERNELS
            f64_kernels.KERNELS = tuple(kernels_)
            started = time.monotonic()
            try:
                outs[arm] = tiebreak.evaluate_float64(path, feeds, time_limit_s=600)
                row[f"{arm}_s"] = round(time.monotonic() - started, 2)
            except tiebreak.Unavailable as exc:
                row[f"{arm}_s"] = f"unavailable: {exc}"
            finally:
                f64_kernels.KERNELS = saved
        if len(outs) == 2:
            a, b = outs["onnx_kernels"], outs["xstage_kernels"]
            row["max_rel_diff"] = max(float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(b[k])) or 1.0))
                                      for k in b if b[k].dtype.kind == "f" and b[k].size)
            row["speedup"] = round(row["onnx_kernels_s"] / max(row["xstage_kernels_s"], 1e-3), 1)
        print(json.dumps(row), flush=True)


def _gate_row(name: str, path: Path, given: dict | None, route: str) -> dict[str, Any]:
    from xstage import errors
    from xstage.stage import open_stage

    row: dict[str, Any] = {"graph": name, "route": route}
    gate: dict[str, Any] | None = None
    started = time.monotonic()
    try:
        with open_stage(path, route=route, inputs=given) as stage:
            row["verdict"] = "placed"
            gate = stage.parity.to_dict()
    except errors.Refused as exc:
        row["verdict"] = "refused: " + ", ".join(f"{r.code.value}/{r.cause}" for r in exc.refusals)
        gate = next((r.evidence["parity"] for r in exc.refusals if "parity" in r.evidence), None)
    except errors.XstageError as exc:
        row["verdict"] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
    row["open_s"] = round(time.monotonic() - started, 1)
    if gate:
        row["gate"] = gate["verdict"]
        row["rules"] = {o["name"]: o["rule"] + ("" if o["passed"] else " (failed)") for o in gate["outputs"]}
        tb = gate.get("tiebreak")
        if tb:
            row["tiebreak"] = tb.get("status")
            row["tiebreak_s"] = tb.get("seconds")
            for o in tb.get("outputs") or []:
                t1 = (o.get("stage_rel_l2") or 0.0) / max(o.get("reference_rel_l2") or 0.0, 1.19e-7)
                row.setdefault("T1", {})[o["name"]] = round(t1, 2)
                if o.get("worst_band"):
                    row.setdefault("T2", {})[o["name"]] = round(o["worst_band"]["ratio"], 2)
            if tb.get("reason"):
                row["reason"] = tb["reason"]
    return row


def gate(graphs: list[tuple[str, Path, dict | None]]) -> None:
    """``open_stage`` per graph and route: verdicts, rules, the tie-break's figures."""
    for name, path, given in graphs:
        routes = ("torch-cpu",) if path.suffix == ".pt2" else ("ort-cpu", "ort-openvino")
        for route in routes:
            print(json.dumps(_gate_row(name, path, given, route)), flush=True)


def main() -> None:
    """Parse the flags and run the chosen measurement."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--kernels", action="store_true", help="onnxruntime's double kernels")
    mode.add_argument("--times", action="store_true", help="float64 evaluation seconds")
    mode.add_argument("--gate", action="store_true", help="open_stage verdicts (the default)")
    ap.add_argument("--thirdparty", default=str(_ROOT / ".test-cache" / "thirdparty"))
    ap.add_argument("--extra", action="append", default=[], help="another graph or .pt2")
    ap.add_argument("--only", help="comma-separated graph names")
    args = ap.parse_args()
    if args.kernels:
        kernels()
        return
    with tempfile.TemporaryDirectory() as tmp:
        graphs = _graphs(Path(args.thirdparty), args.extra, Path(tmp))
        if args.only:
            graphs = [g for g in graphs if g[0] in args.only.split(",")]
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        (times if args.times else gate)(graphs)


if __name__ == "__main__":
    main()
