"""``xstage sanitize IN.onnx OUT.onnx [--assume-finite NAME[,NAME...]|all] [--for qnn|dml] [--json[=PATH]]``.

Rewrite only where provably safe, or where the user vouches for it.

Every site each rewrite looked at is listed, applied or skipped with the reason; the output
passes onnx.checker and computes bitwise what the input computes on onnxruntime's CPU EP
(with --inputs, or inputs synthesized at --shape/--dim; a symbolic dimension left open makes
the check "unchecked", never a guess). --assume-finite removes the NaN guards (Where(IsNaN(x),
c, x)) on the values named (or all): each such removal is checked on sample inputs (--inputs,
or 8 synthesized) and kept when the outputs are bitwise equal or within fp32's tight tier (the
difference reported), else reverted and reported. --for qnn: every rewrite, NaN guards assumed
finite (QNN's converter has no IsNaN); --for dml: Reshape allowzero only. Exit 0 written; 1 an
unreadable graph or an output that would differ (nothing is written then); 64 a usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from xstage.cli._flags import add_input_flags, add_json_flag, resolve_out
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK
from xstage.inputs import parse_dims, parse_shapes

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sanitize", help="make a graph acceptable to device runtimes, safely",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="IN.onnx")
    p.add_argument("dst", metavar="OUT.onnx",
                   help="the sanitized graph: a .onnx file, or a folder (IN.onnx's name in it)")
    add_json_flag(p, "the report", files=("src", "dst", "inputs"))
    add_input_flags(p, npz_help="inputs for the equality check; default: synthesized")
    p.add_argument("--assume-finite", metavar="NAME[,NAME...]|all",
                   help="remove the NaN guards on these values (or all): you vouch they are "
                   "never NaN; checked on sample inputs, reverted where the outputs move")
    p.add_argument("--for", dest="preset", choices=["qnn", "dml"],
                   help="the rewrites a toolchain needs: qnn (every rewrite, NaN guards assumed "
                   "finite), dml (Reshape allowzero only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: Output) -> int:
    from xstage.export import sanitize_onnx  # onnx and onnx-ir: imported when sanitizing

    dst = resolve_out("OUT.onnx", args.dst, suffixes=(".onnx",), name=Path(args.src).name)
    assume = args.assume_finite
    if assume is not None and assume != "all":
        assume = [name for name in assume.split(",") if name]
    report = sanitize_onnx(args.src, dst, inputs=args.inputs, shapes=parse_shapes(args.shape),
                           dims=parse_dims(args.dim), assume_finite=assume, preset=args.preset)
    out.emit(report)
    rows = [[escape(s["rewrite"]), escape(s["node"]), s["verdict"], escape(s.get("assumed") or ""),
             escape(s["reason"])] for s in report["sites"]]
    if rows:
        out.table(f"xstage sanitize {escape(args.src)} → {escape(str(dst))}",
                  ["rewrite", "node", "verdict", "assumed finite", "why"], rows)
    else:
        out.result("no site needed a rewrite")
    files = ", ".join(f"{f['path']} ({f['bytes']} B)" for f in report["files"])
    if report["assumption"] is not None:
        out.result(f"assumption check ({report['assumption']['status']}): "
                   f"{escape(report['assumption']['detail'])}")
    out.result(f"wrote {escape(files)}; onnx.checker {report['checker']}; "
               f"outputs {escape(report['parity']['detail'])}")
    return EXIT_OK
