"""``xstage bisect``: which contiguous regions of a graph a route's partitioner takes whole.

Exit codes: 0 at least one region accepted (or the whole graph, in one probe) and every probe
judged; 2 no region of at least ``--min-region`` nodes was accepted and every probe judged, or
nothing to probe on (a record is still written); 1 a range not judged (a probe refused for
another reason than the partitioner's, or failed: the regions found are still written), a split
whose composed outputs fail the numeric gate, or an error (a graph that does not load, inputs
that do not run on it); 64 usage error. A search cut short by --max-probes or --deadline is
recorded, not an error.
Every run but a usage error writes an ``xstage.bisect`` record under ``XSTAGE_HOME/records/``
(and to ``--json PATH``). docs/bisect.md is the user's page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from xstage import errors
from xstage.bisect import bisect
from xstage.bisect.record import write_bisect_record
from xstage.bisect.search import Outcome
from xstage.cli._flags import add_input_flags, add_json_flag, check_out_folder
from xstage.cli._output import Output
from xstage.cli.external import _ep_options, parse_tolerance
from xstage.client.deadlines import parse_timeouts
from xstage.exit_codes import EXIT_REFUSED
from xstage.inputs import parse_dims, parse_shapes
from xstage.record import dumps_record, records_path
from xstage.routes import ROUTE_NAMES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bisect", help="find the regions of a graph a route takes whole, with real probes",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", metavar="PATH", required=True, help="the graph to bisect (.onnx)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--route", choices=ROUTE_NAMES, metavar="NAME",
                       help="the route every probe runs on")
    where.add_argument("--device", metavar="ID",
                       help="the device; every probe runs on its first route in the plan")
    p.add_argument("--format", dest="fmt", metavar="FMT",
                   help="onnx:fp32|onnx:fp16|onnx:a16w8|onnx:a8w8 (inferred when omitted); every region "
                   "passes the same format check")
    p.add_argument("--max-probes", type=int, metavar="N", help="a hard limit on probes")
    p.add_argument("--deadline", type=float, metavar="S",
                   help="a wall-clock limit in seconds for the whole search (each probe keeps "
                   "--timeout's deadlines)")
    p.add_argument("--min-region", type=int, default=1, metavar="K",
                   help="the smallest region reported; declined ranges are split down to it "
                   "(default 1)")
    p.add_argument("--out", metavar="DIR",
                   help="write the split artifact here (a new or empty folder): each region a "
                   "graph with a manifest, the CPU remainder, split.json; it is run once and "
                   "checked against the whole graph on the CPU")
    p.add_argument("--keep-probes", metavar="DIR", help="keep every probe's region graph here")
    add_input_flags(p, npz_help="inputs of the whole graph (no pickle); default: synthesized")
    p.add_argument("--tolerance", metavar="F|K=V,...", help="the numeric gate, as for external")
    p.add_argument("--ep-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an execution provider option (repeatable)")
    p.add_argument("--threads", type=int, metavar="N", help="intra-op threads (both arms)")
    p.add_argument("--timeout", action="append", default=[], metavar="PHASE=SECONDS",
                   help="a worker deadline for every probe (repeatable), as for external")
    add_json_flag(p, "the bisect record", files=("graph", "inputs", "out", "keep_probes"))
    p.set_defaults(func=run)


def _write(doc: dict[str, Any], args: argparse.Namespace, out: Output) -> Path:
    """The record under ``XSTAGE_HOME/records`` first, then ``--json``'s copy (or stdout).

    Raises:
        XstageError: ``--json`` could not be written (the home record already was).
    """
    path = write_bisect_record(doc, records_path(f"{Path(args.graph).stem}-bisect"))
    out.emit_record(doc, dumps_record(doc), path)
    return path


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def show(doc: dict[str, Any], out: Output) -> None:
    """The report of a bisect record: regions, declined ops, probes (with -v), budget."""
    target = doc.get("target") or {}
    out.result(f"xstage bisect: {doc['artifact']['path']} ({doc['artifact']['nodes']} nodes, "
               f"{doc['artifact']['format']}) on {target.get('route')} / {target.get('device')}")
    if doc["regions"]:
        out.table("accepted regions", ["nodes", "first → last", "ops", "node share",
                                       "param share", "FLOP share", "probe"],
                  [[f"[{r['start']}, {r['stop']})", f"{r['first_node']} → {r['last_node']}",
                    ", ".join(f"{k}×{v}" for k, v in r["op_types"].items()),
                    _percent(r["shares"]["node_share"]), _percent(r["shares"]["param_share"]),
                    _percent(r["shares"]["flop_share"]), r["probe"]] for r in doc["regions"]])
    if doc["declined_ops"]:
        out.table("declined (in no region)", ["op", "nodes", "reason (smallest declined probe)"],
                  [[d["op_type"], ", ".join(d["nodes"][:6]) + (" …" if len(d["nodes"]) > 6 else ""),
                    d["reason"] or ""] for d in doc["declined_ops"]])
    if doc.get("not_judged"):
        out.table("not judged (refused for another reason, or failed)",
                  ["nodes", "verdict", "probe", "reason"],
                  [[f"[{u['start']}, {u['stop']})", u["verdict"], u["probe"], u["reason"] or ""]
                   for u in doc["not_judged"]])
    if out.verbosity > 0:
        out.table("probes", ["#", "range", "phase", "verdict", "s"],
                  [[p["index"], f"[{p['start']}, {p['stop']})", p["phase"], p["verdict"],
                    f"{p['seconds']:.2f}"] for p in doc["probes"]])
    for c in doc["contradictions"]:
        out.warning(f"probe {c['probe']} contradicts probe {c['earlier']}: {c['kind'].replace('_', ' ')}")
    budget = doc["budget"]
    cut = f", cut short by --{budget['cut_short'].replace('_', '-')}" if budget["cut_short"] else ""
    limit = f" of {budget['max_probes']}" if budget["max_probes"] else ""
    out.result(f"{doc['outcome']['message']}; {budget['probes']}{limit} probes in "
               f"{budget['seconds']:.1f} s{cut}")
    if doc.get("split"):
        check = doc["split"]["check"] or {}
        verdict = "passed" if check.get("passed") else "FAILED"
        tier = f", {check['tier']} tier" if check.get("tier") else ""
        tb = f", float64 tie-break {check['tiebreak']}" if check.get("tiebreak") else ""
        out.result(f"split written to {doc['split']['dir']} ({len(doc['split']['parts'])} parts); "
                   f"composed outputs {verdict} the numeric gate against the whole graph on the "
                   f"CPU (max |diff| {check.get('max_abs_diff')}{tier}{tb})")


def run(args: argparse.Namespace, out: Output) -> int:
    argv = ["xstage", *sys.argv[1:]]
    check_out_folder("--out", args.out)
    check_out_folder("--keep-probes", args.keep_probes)
    with out.progress("probing", total=args.max_probes, unit="probes") as bar:

        def on_probe(start: int, stop: int, outcome: Outcome) -> None:
            bar.update(advance=1, description=f"[{start}, {stop}) {outcome.verdict}")
            out.log(f"probe [{start}, {stop}): {outcome.verdict}")

        try:
            result = bisect(
                args.graph, route=args.route, device=args.device, fmt=args.fmt,
                inputs=args.inputs, shapes=parse_shapes(args.shape), dims=parse_dims(args.dim),
                min_region=args.min_region, max_probes=args.max_probes, deadline=args.deadline,
                ep_options=_ep_options(args.ep_option), threads=args.threads,
                tolerance=parse_tolerance(args.tolerance), deadlines=parse_timeouts(args.timeout),
                out=args.out, keep_probes=args.keep_probes, on_probe=on_probe, argv=argv)
        except errors.Refused as exc:
            if exc.record is not None:
                _write({**exc.record, "argv": argv}, args, out)
            out.error(exc.message)
            if exc.remedy:
                out.hint(exc.remedy)
            return EXIT_REFUSED
    _write(result.record, args, out)
    show(result.record, out)
    return result.exit_code
