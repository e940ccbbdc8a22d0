"""``xstage external``: open a stage where the evidence allows, time it, write the record.

Exit codes: 0 placed and passed; 2 refused (every planner or gate decision, including a
pinned route that is missing); 1 error (corrupt graph, inputs that do not match, a worker
that died); 64 usage error. Every run but a usage error writes a record under
``XSTAGE_HOME/records/`` (and to ``--json PATH``).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.cli._flags import add_input_flags, add_json_flag, bounded_int
from xstage.cli._output import Output
from xstage.cli._summary import show_summary
from xstage.client.deadlines import parse_timeouts
from xstage.cluster import parse_resources
from xstage.exit_codes import EXIT_OK, EXIT_REFUSED
from xstage.home import check_output, write_output
from xstage.inputs import parse_dims, parse_shapes
from xstage.ledger import parse_pool_arg
from xstage.record import dumps_record, records_path, write_record
from xstage.routes import ROUTE_NAMES
from xstage.stage import open_stage
from xstage.stage.ledger import Ledger
from xstage.stage.request import check_criteria

__all__ = ["MAX_RUNS", "MAX_WARMUP", "register"]

#: ``--runs``' bound: every timed run's compute, round trip and transport are kept for the
#: percentiles and the record; a longer soak is a benchmark's job (benchmarks/).
MAX_RUNS = 100_000
RUNS_WHY = "each timed run is kept for the percentiles and the record; soak longer with benchmarks/"
#: ``--warmup``'s bound: warm-up runs are untimed; past a thousand they only delay the timing.
MAX_WARMUP = 1_000
WARMUP_WHY = "warm-up runs are untimed; more than a thousand only delays the timed runs"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "external", help="open a stage on a device, prove where it ran, gate its numbers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--graph", metavar="PATH",
                       help="the stage's graph (.onnx); default: the built-in MLP stage")
    which.add_argument("--builtin", metavar="NAME",
                       help="a shipped artifact: vision-tower-tiny, code2wav-tiny, "
                       "code2wav-stream-tiny, mlp-512x6-b64")
    p.add_argument("--format", dest="fmt", metavar="FMT",
                   help="onnx:fp32|onnx:fp16|onnx:a16w8|onnx:a8w8 (inferred when omitted)")
    p.add_argument("--component", metavar="NAME", help="the stage's name (inferred)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--device", metavar="ID", help="require this device; never substitute")
    where.add_argument("--prefer", metavar="ID,ID,...", help="try devices in order, fall through")
    where.add_argument("--offload", action="store_true",
                       help="what no --device, --prefer or --route does: every resolved route "
                       "except the reference arm (ort-cpu, torch-cpu) first, in plan order, "
                       "falling through; the reference arm last")
    p.add_argument("--route", metavar="NAME",
                   help=f"pin a route: {', '.join(ROUTE_NAMES)}, or ort-plugin:NAME for a "
                   "[plugins.NAME] table")
    p.add_argument("--min-placement", type=float, default=0.5, metavar="F",
                   help="fraction of the nodes and of the kernel time the target EP must both "
                   "take (default 0.5)")
    add_input_flags(p, npz_help="inputs (no pickle); default: synthesized")
    p.add_argument("--reference", metavar="PATH", help="fp32 graph to check against")
    p.add_argument("--tolerance", metavar="F|K=V,...",
                   help="the numeric gate's criteria: a number sets rel_l2; or any of "
                   "rel_l2=X,abs_rms=Y,cosine=Z,elem=B (and elem_a=A,elem_rtol=R); the rest keep "
                   "their defaults, tighter and looser values both apply")
    p.add_argument("--ep-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an execution provider option (repeatable; wins over the route's hook)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="intra-op threads (both arms), 1 to the CPU count; 0 the default")
    p.add_argument("--graph-opt-level", metavar="L",
                   choices=["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                            "ORT_ENABLE_ALL"], help="onnxruntime graph optimization level")
    p.add_argument("--runs", type=bounded_int(1, MAX_RUNS, RUNS_WHY), default=20, metavar="N",
                   help=f"timed runs, 1 to {MAX_RUNS} (default 20)")
    p.add_argument("--warmup", type=bounded_int(0, MAX_WARMUP, WARMUP_WHY), default=3, metavar="K",
                   help=f"unprofiled runs after the profiled one, 0 to {MAX_WARMUP} (default 3)")
    p.add_argument("--compare-cpu", action="store_true", help="time the reference arm too")
    p.add_argument("--save-outputs", metavar="OUT.npz", help="save one run's outputs")
    p.add_argument("--pool", action="append", default=[], metavar="NAME=SIZE",
                   help="plan for a pool of this size, e.g. host_ram=4GiB or "
                   "vram:gpu_discrete:nvidia:0=8GB (GiB and GB both accepted)")
    p.add_argument("--cluster", choices=["ray"],
                   help="run the stage on a node of a Ray cluster that has --resource "
                   "(RAY_ADDRESS, or the local one); docs/cluster.md")
    p.add_argument("--resource", action="append", default=[], metavar="NAME=AMOUNT",
                   help="a Ray resource the node must have (repeatable), e.g. npu=1")
    p.add_argument("--placement-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for a node with the resources to be free (default 60)")
    add_json_flag(p, "the record", files=("graph", "inputs", "reference", "save_outputs"))
    p.add_argument("--timeout", action="append", default=[], metavar="PHASE=SECONDS",
                   help="a worker deadline (repeatable): spawn, hello, load, warmup, call, "
                        "shutdown; a worker past one is killed")
    p.set_defaults(func=run)


def _ep_options(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.UsageError(f"--ep-option {item!r} is not KEY=VALUE",
                                    remedy="e.g. --ep-option device_type=CPU")
        out[key] = value
    return out


def parse_tolerance(text: str | None) -> float | dict[str, float] | None:
    """``--tolerance``: a bare number (rel_l2, as before) or ``KEY=VALUE,...`` criteria.

    Raises:
        UsageError: not a number and not ``KEY=VALUE`` pairs, a repeated or unknown key, or a
            value that is not a number (the checks of each value follow in ``open_stage``).
    """
    if text is None:
        return None
    text = text.strip()
    if "=" not in text:
        try:
            value = float(text)
        except ValueError:
            raise errors.UsageError(
                f"--tolerance {text!r} is neither a number nor KEY=VALUE pairs",
                remedy="e.g. --tolerance 1e-3 or --tolerance rel_l2=1e-3,elem=1e-4") from None
        if not value >= 0 or value == float("inf"):
            raise errors.UsageError(f"--tolerance {text} must be a finite number >= 0")
        return value
    criteria: dict[str, float] = {}
    for item in text.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key or not raw:
            raise errors.UsageError(f"--tolerance: {item!r} is not KEY=VALUE",
                                    remedy="e.g. --tolerance rel_l2=1e-3,abs_rms=1e-2,cosine=0.999,elem=0")
        if key in criteria:
            raise errors.UsageError(f"--tolerance names {key} twice")
        try:
            criteria[key] = float(raw)
        except ValueError:
            raise errors.UsageError(f"--tolerance {key}={raw!r} is not a number") from None
    return check_criteria(criteria)


def _write(doc: dict[str, Any], args: argparse.Namespace, out: Output) -> Path:
    """The record under ``XSTAGE_HOME/records`` first, then ``--json``'s copy (or stdout).

    Raises:
        XstageError: ``--json`` could not be written (the home record already was).
    """
    path = write_record(doc, records_path(
        (doc.get("artifact") or {}).get("component"), args.graph or "builtin"))
    out.log(f"record: {path}")
    out.emit_record(doc, dumps_record(doc), path)
    return path


def _save_outputs(stage: Any, target: str, record: Path) -> None:
    """``--save-outputs``: one run's outputs, after the record is safe.

    Raises:
        XstageError: the file could not be written (the record already was).
    """
    outputs = stage(stage.inputs)
    buffer = io.BytesIO()  # np.savez(path) would add .npz to a path without it: a sibling
    np.savez(buffer, **outputs)
    try:
        write_output(target, buffer.getvalue(), flag="--save-outputs")
    except OSError as exc:
        raise errors.XstageError(
            f"could not write --save-outputs {target}: {exc.strerror or exc}",
            remedy=f"the record is at {record}; choose a writable --save-outputs path") from None


def run(args: argparse.Namespace, out: Output) -> int:
    argv = ["xstage", *sys.argv[1:]]
    if args.save_outputs:
        check_output(args.save_outputs, flag="--save-outputs")
    # Imported here: builtin_graphs imports onnx (~0.7 s), which `xstage --help` need not pay.
    from xstage.builtin_graphs import builtin_artifact, builtin_stage

    graph = (Path(args.graph) if args.graph
             else builtin_artifact(args.builtin) if args.builtin else builtin_stage())
    prefer = [p for p in args.prefer.split(",") if p] if args.prefer else None
    if args.resource and not args.cluster:
        raise errors.UsageError("--resource needs --cluster", remedy="add --cluster ray")
    try:
        with out.progress("proving and gating"):
            stage = _open(args, graph, prefer, out)
    except errors.UsageError:
        raise
    except errors.XstageError as exc:  # refused or failed: the API's record, with the timing plan
        return _refused_or_raise(exc, args, argv, out)
    with stage:
        with out.progress("timing", total=args.runs, unit="runs") as bar:
            stage.measure(runs=args.runs, warmup=args.warmup, compare_cpu=args.compare_cpu,
                          progress=lambda n: bar.update(completed=n))
        if out.verbosity > 0:  # the doorbell's spin-or-block decisions over the timed runs
            for side, summary in stage.waits().items():
                if summary.get("line"):
                    out.log(f"doorbell ({side}): {summary['line']}")
        doc = stage.record(argv=argv)
        path = _write(doc, args, out)  # the record first: a failed --save-outputs keeps it
        show_summary(doc, out, title="xstage external")
        if args.save_outputs:
            _save_outputs(stage, args.save_outputs, path)
    return EXIT_OK


def _open(args: argparse.Namespace, graph: Path, prefer: list[str] | None, out: Output) -> Any:
    """``open_stage`` with the command's flags."""
    return open_stage(
        graph, device=args.device, prefer=prefer, route=args.route, offload=args.offload,
        min_placement=args.min_placement, inputs=args.inputs,
        reference=args.reference or "auto", tolerance=parse_tolerance(args.tolerance),
        ep_options=_ep_options(args.ep_option), threads=args.threads,
        graph_opt_level=args.graph_opt_level, fmt=args.fmt, component=args.component,
        shapes=parse_shapes(args.shape), dims=parse_dims(args.dim), on_event=out.log,
        ledger=Ledger(capacity=dict(parse_pool_arg(p) for p in args.pool)) if args.pool else None,
        deadlines=parse_timeouts(args.timeout), record_on_close=False,  # it writes its own
        cluster=args.cluster, resources=parse_resources(args.resource),
        placement_timeout=args.placement_timeout)


def _refused_or_raise(exc: errors.XstageError, args: argparse.Namespace, argv: list[str], out: Output) -> int:
    """A refusal: its record written and summarized, exit 2. Any other error: its record, re-raised.

    Raises:
        XstageError: ``exc`` itself, when it is not a refusal.
    """
    if exc.record is not None:
        doc = {**exc.record, "argv": argv,
               "request": {**exc.record["request"], "runs": args.runs, "warmup": args.warmup}}
        _write(doc, args, out)
        if isinstance(exc, errors.Refused):
            show_summary(doc, out, title="xstage external")
    if not isinstance(exc, errors.Refused):
        raise exc
    out.error(exc.message)
    if exc.remedy:
        out.hint(exc.remedy)
    return EXIT_REFUSED
