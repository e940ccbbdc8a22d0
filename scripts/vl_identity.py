"""Token for token: tiny Qwen3-VL / Qwen3.5 generation with the tower in-process and on a stage.

For each family: transformers' own generation model from tiny configs with fixed random
weights (``xstage.integrations.tiny``), ``--pairs`` (image, prompt) pairs, greedy ``generate``
with the tower in-process (the reference), then

* the control: the tower's outputs zeroed (a forward hook); the count of pairs whose tokens
  change must reach ``--min-changed`` (the model must not ignore the image);
* each route: the tower exported (``onnx:fp32`` or ``pt:fp32``, whichever the route runs),
  opened with ``xstage.open_stage(route=...)`` and put in the model with
  ``xstage.integrations.transformers.offload``; every pair generated again and compared
  (``xstage.integrations.identity.compare``).

Prints the token-identity table and writes it as JSON (``--json``). Exit status: 0 when every
route is identical or diverges only where explained, and the control holds; 1 otherwise.

Run it in the export environment (torch + transformers), with the route interpreters xstage
resolves (``XSTAGE_PYTHON_ORT_OPENVINO=...`` for the OpenVINO env):

    python scripts/vl_identity.py --pairs 16 --json vl-identity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUTES = ("ort-cpu", "ort-openvino", "torch-cpu")
FAMILIES = ("qwen3_vl", "qwen3_5")


def exported(folder: Path) -> Path | None:
    """The tower an export of this script's own arguments left in ``folder`` (``tower.*`` with its
    manifest), or None."""
    found = [p for p in folder.glob("tower.*") if not p.name.endswith(".manifest.json")
             and p.with_name(p.name + ".manifest.json").is_file()]
    return found[0] if len(found) == 1 else None


def _format_for(route: str) -> str:
    from xstage.routes.specs import get_spec

    formats = get_spec(route).formats
    return next(f for f in ("onnx:fp32", "pt:fp32") if f in formats)


def _zeroed(module: Any) -> Any:
    """A forward hook that zeroes the tower's outputs (the control)."""
    import torch

    def hook(_module: Any, _args: Any, out: Any) -> Any:
        out.pooler_output = torch.zeros_like(out.pooler_output)
        if getattr(out, "deepstack_features", None):
            out.deepstack_features = [torch.zeros_like(t) for t in out.deepstack_features]
        return out

    return module.register_forward_hook(hook)


def run_family(family: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import xstage
    from xstage.export.vision_tower import export_vision_tower
    from xstage.integrations.identity import compare, count_changed, greedy, smallest_margin
    from xstage.integrations.tiny import tiny_pairs, tiny_vl_model
    from xstage.integrations.transformers import find_module, offload

    model = tiny_vl_model(family, seed=args.seed)
    pairs = tiny_pairs(model, args.pairs, seed=args.seed)
    reference = [greedy(model, p.inputs, args.tokens) for p in pairs]
    _, tower = find_module(model, "visual")
    handle = _zeroed(tower)
    try:
        control = [greedy(model, p.inputs, args.tokens) for p in pairs]
    finally:
        handle.remove()
    changed = count_changed(reference, control)
    doc: dict[str, Any] = {"family": family, "pairs": len(pairs), "tokens": args.tokens,
                           "control_changed": changed, "reference": [g.tokens for g in reference],
                           "smallest_margin": smallest_margin(reference),
                           "routes": {}}
    artifacts: dict[str, Path] = {}
    for route in args.routes:
        fmt = _format_for(route)
        if fmt not in artifacts:
            where = family + "/" + fmt.replace(":", "-")
            artifacts[fmt] = exported(args.towers / where) if args.towers else None
            if artifacts[fmt] is None:
                report = export_vision_tower(out_dir / where / "tower", family=family,
                                             config="tiny", seed=args.seed, fmt=fmt)
                artifacts[fmt] = Path(report["path"])
        t0 = time.perf_counter()
        try:
            stage = xstage.open_stage(artifacts[fmt], route=route)
        except xstage.Refused as exc:
            doc["routes"][route] = {"refused": [r.to_dict() for r in exc.refusals]}
            continue
        opened = time.perf_counter() - t0
        with stage, offload(model, "visual", stage) as proxy:
            runs = [greedy(model, p.inputs, args.tokens) for p in pairs]
            rows = [compare(a, b).to_dict() for a, b in zip(reference, runs, strict=True)]
            doc["routes"][route] = {
                "device": stage.device, "verdict": stage.proof.verdict,
                "fraction": stage.proof.fraction, "format": fmt, "open_s": round(opened, 3),
                "check": proxy.check_figures, "stage_calls": len(proxy.calls.entries),
                "pairs": rows}
    return doc


def _cell(row: dict[str, Any]) -> str:
    if row["identical"]:
        return f"= (Δ {row['logit_diff']:.1e})"
    word = "explained" if row["explained"] else "UNEXPLAINED"
    return f"≠@{row['first_diff']} m {row['margin']:.1e} Δ {row['logit_diff']:.1e} {word}"


def print_table(doc: dict[str, Any]) -> bool:
    """The identity table of one family; True when it holds (see the module docstring)."""
    ok = True
    routes = [r for r in doc["routes"] if "pairs" in doc["routes"][r]]
    print(f"\n{doc['family']}: {doc['pairs']} pairs x {doc['tokens']} new tokens; control "
          f"(tower outputs zeroed): {doc['control_changed']}/{doc['pairs']} pairs change")
    for route, info in doc["routes"].items():
        if "refused" in info:
            ok = False
            print(f"  {route}: refused: {info['refused'][0]['message']}")
        else:
            print(f"  {route}: {info['verdict']} on {info['device']} ({info['format']}, "
                  f"fraction {info['fraction']}), opened in {info['open_s']} s")
    print("  " + "pair".ljust(6) + "".join(r.ljust(34) for r in routes))
    for i in range(doc["pairs"]):
        cells = [doc["routes"][r]["pairs"][i] for r in routes]
        ok &= all(c["identical"] or c["explained"] for c in cells)
        print("  " + str(i).ljust(6) + "".join(_cell(c).ljust(34) for c in cells))
    counts = {r: sum(c["identical"] for c in doc["routes"][r]["pairs"]) for r in routes}
    print("  identical: " + ", ".join(f"{r} {n}/{doc['pairs']}" for r, n in counts.items()))
    print(f"  the reference's smallest top-2 margin over all {doc['pairs'] * doc['tokens']} steps: "
          f"{doc['smallest_margin']:.1e}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", type=lambda s: [x for x in s.split(",") if x], default=list(FAMILIES))
    parser.add_argument("--routes", type=lambda s: [x for x in s.split(",") if x], default=list(ROUTES))
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-changed", type=float, default=0.75,
                        help="the control's bar, a fraction of the pairs (12 of 16)")
    parser.add_argument("--out", type=Path, help="where the exported towers go (default: a temp dir)")
    parser.add_argument("--towers", type=Path,
                        help="towers exported before with the same family, seed and format, as "
                             "TOWERS/<family>/<onnx-fp32|pt-fp32>/tower.*: used instead of "
                             "exporting (a missing one is exported)")
    parser.add_argument("--json", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vl-identity-") as tmp:
        out_dir = args.out or Path(tmp)
        docs = [run_family(f, args, out_dir) for f in args.families]
    ok = True
    for doc in docs:
        ok &= print_table(doc)
        need = int(-(-args.min_changed * doc["pairs"] // 1))
        if doc["control_changed"] < need:
            ok = False
            print(f"  control FAILED: {doc['control_changed']} < {need} pairs changed")
    if args.json:
        args.json.write_text(json.dumps({"families": docs, "ok": ok}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
