"""Every built-in stage and every third-party test graph, on every ONNX route here, on two trees.

A change to the proof or the gate must leave each verdict unchanged or explain it: this runs
``xstage external`` for each (graph, route) once with each tree's ``src`` first on the path and
prints one Markdown row per pair, the two outcomes side by side::

    XSTAGE_PYTHON_ORT_OPENVINO=<the ort-openvino env's python> \\
        python3 scripts/verdict_sweep.py BEFORE/src AFTER/src --cache .test-cache

The third-party graphs come from the test cache (``tests/thirdparty.py`` fetches them; a graph
not there is skipped, saying so), their inputs from the same module's seeded ``write_inputs``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import thirdparty  # noqa: E402

BUILTINS = ("vision-tower-tiny", "code2wav-tiny")
ROUTES = ("ort-cpu", "ort-openvino")


def _outcome(src: str, argv: list[str], home: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "r.json"
        env = dict(os.environ, PYTHONPATH=src, XSTAGE_HOME=str(home))
        done = subprocess.run([sys.executable, "-m", "xstage", "external", *argv, "--runs", "2",
                               "--json", str(record)],
                              capture_output=True, text=True, env=env, timeout=900)
        if not record.exists():
            return f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['?'])[-1][:120]}"
        doc = json.loads(record.read_text())
    outcome = doc.get("outcome") or {}
    refusals = outcome.get("refusals") or []
    if refusals:
        last = refusals[-1]
        return f"exit {done.returncode} refused {last.get('code')}/{last.get('cause')}"
    proof, parity = doc.get("proof") or {}, doc.get("parity") or {}
    return (f"exit {done.returncode} {proof.get('verdict')} {proof.get('fraction')}, gate "
            f"{parity.get('verdict')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--cache", default=str(REPO / ".test-cache"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xstage-sweep-"))
    graphs: list[tuple[str, list[str]]] = [(name, ["--builtin", name]) for name in BUILTINS]
    for graph in thirdparty.GRAPHS.values():
        path = thirdparty.cached(graph.name, Path(args.cache) / "thirdparty")
        if path is None:
            print(f"skipped {graph.name}: not in {args.cache}/thirdparty", file=sys.stderr)
            continue
        inputs = thirdparty.write_inputs(graph.name, work / f"{graph.name}.npz")
        graphs.append((graph.name, ["--graph", str(path), "--inputs", str(inputs)]))
    print("| graph | route | before | after |\n|---|---|---|---|")
    for name, argv in graphs:
        for route in ROUTES:
            row = [_outcome(tree, [*argv, "--route", route], work / f"home-{i}")
                   for i, tree in enumerate((args.before, args.after))]
            print(f"| {name} | {route} | {row[0]} | {row[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
