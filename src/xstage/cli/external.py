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
from rich.markup import escape

from xstage import errors
from xstage.cli._flags import add_input_flags, add_json_flag, bounded_int
from xstage.cli._output import Output
from xstage.cli._summary import show_summary
from xstage.cli._sweep import (
    SWEEP_COLUMNS,
    Point,
    batch_points,
    check_points,
    parse_batches,
    sweep_points,
    sweep_rows,
)
from xstage.client.deadlines import parse_timeouts
from xstage.cluster import parse_resources
from xstage.exit_codes import EXIT_OK, EXIT_REFUSED
from xstage.home import check_output, write_output
from xstage.inputs import parse_dims, parse_shapes
from xstage.ledger import parse_pool_arg
from xstage.record import dumps_record, records_path, write_record
from xstage.record.per_op import per_op, to_csv
from xstage.routes import ROUTE_NAMES
from xstage.stage.ledger import Ledger
from xstage.stage.open import open_request
from xstage.stage.request import MAX_DEPTH, StageRequest, check_criteria
from xstage.timings import DEFAULT_PERCENTILES, parse_percentiles

__all__ = ["MAX_RUNS", "MAX_WARMUP", "register", "stage_request"]

#: ``--runs``' bound: every timed run's compute, round trip and transport are kept for the
#: percentiles and the record; a longer soak is a benchmark's job (benchmarks/).
MAX_RUNS = 100_000
RUNS_WHY = "each timed run is kept for the percentiles and the record; soak longer with benchmarks/"
#: ``--depth``'s bound: the region's slot sets (``open_stage(depth=...)``).
DEPTH_WHY = "the shared region holds one slot set per request in flight"
#: ``--throughput``'s default depth.
THROUGHPUT_DEPTH = 4
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
    p.add_argument("--reference-arm", choices=["worker", "in_process"], default="worker",
                   help="where an ONNX stage's reference runs: the ort-cpu route's worker, "
                   "charged to the ledger while the gate runs (default), or in_process "
                   "(onnxruntime in this process, for the stage's life)")
    p.add_argument("--tolerance", metavar="F|K=V,...",
                   help="the numeric gate's criteria: a number sets rel_l2; or any of "
                   "rel_l2=X,abs_rms=Y,cosine=Z,elem=B (and elem_a=A,elem_rtol=R); the rest keep "
                   "their defaults, tighter and looser values both apply")
    p.add_argument("--ep-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an execution provider option (repeatable; wins over the route's hook)")
    p.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                   help="an onnxruntime session config entry for the worker's session "
                   "(repeatable), e.g. session.intra_op.allow_spinning=0")
    p.add_argument("--threads", type=int, metavar="N",
                   help="intra-op threads (both arms), 1 to the CPU count; 0 the default")
    p.add_argument("--graph-opt-level", metavar="L",
                   choices=["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                            "ORT_ENABLE_ALL"], help="onnxruntime graph optimization level")
    p.add_argument("--runs", type=bounded_int(1, MAX_RUNS, RUNS_WHY), default=20, metavar="N",
                   help=f"timed runs, 1 to {MAX_RUNS} (default 20)")
    p.add_argument("--warmup", type=bounded_int(0, MAX_WARMUP, WARMUP_WHY), default=3, metavar="K",
                   help=f"unprofiled runs after the profiled one, 0 to {MAX_WARMUP} (default 3)")
    p.add_argument("--percentiles", type=_percentiles, default=DEFAULT_PERCENTILES, metavar="Q,Q,...",
                   help="latency percentiles to report, e.g. 50,90,99,99.9 (default 50,90,99); one "
                   "the runs cannot resolve prints n/a and the runs it needs (p99 needs 100)")
    p.add_argument("--throughput", action="store_true",
                   help="after the timed runs, keep --depth requests in flight (Stage.map's depth) "
                   "and report requests/s with their latency percentiles")
    p.add_argument("--depth", type=bounded_int(1, MAX_DEPTH, DEPTH_WHY), default=None, metavar="K",
                   help=f"requests in flight for --throughput, 1 to {MAX_DEPTH} (default 4): the "
                   "stage's region gets K slot sets; a stage with state pairs runs at depth 1")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=bounded_int(1, MAX_RUNS, RUNS_WHY), default=None, metavar="N",
                        help="--throughput's requests (default 100)")
    amount.add_argument("--duration", type=float, default=None, metavar="S",
                        help="--throughput for S seconds instead of --requests")
    sweep = p.add_mutually_exclusive_group()
    sweep.add_argument("--sweep", action="append", default=[], metavar="NAME=DIMS;DIMS…",
                       help="one admission per shape of input NAME, e.g. x=1x8;4x8;16x8 "
                       "(repeatable for several inputs, the same count each): one table, one "
                       "record per shape, --json gets {\"shapes\": [record, …]}")
    sweep.add_argument("--batch", metavar="B,B,…",
                       help="a sweep over the free first dimension of the inputs, e.g. 1,2,4,8")
    p.add_argument("--per-op", nargs="?", const="table", default=None, metavar="csv=PATH",
                   help="the profiled warm-up's kernel time by node (provider, time, share, count; "
                   "torch stages: by op), sorted by time: a table, or csv=PATH (csv=- on stdout, "
                   "then nothing else there)")
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


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        return parse_percentiles(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. --percentiles 50,90,99,99.9)") from None


def _ep_options(items: list[str], flag: str = "--ep-option",
                example: str = "device_type=CPU") -> dict[str, str]:
    """``KEY=VALUE`` flags (``--ep-option``, ``--session-config``) as a dict, the last one winning."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.UsageError(f"{flag} {item!r} is not KEY=VALUE",
                                    remedy=f"e.g. {flag} {example}")
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


def _check_throughput(args: argparse.Namespace) -> None:
    """``--depth``, ``--requests`` and ``--duration`` belong to ``--throughput``.

    Raises:
        UsageError: one of them without ``--throughput``, or a duration that is not positive.
    """
    given = [f for f, v in (("--depth", args.depth), ("--requests", args.requests),
                            ("--duration", args.duration)) if v is not None]
    if given and not args.throughput:
        raise errors.UsageError(f"{given[0]} sets up --throughput, which was not asked for",
                                remedy=f"add --throughput, or drop {given[0]}")
    if args.duration is not None and not 0 < args.duration < float("inf"):
        raise errors.UsageError(f"--duration {args.duration} must be a positive number of seconds")


def _check_per_op(args: argparse.Namespace, out: Output) -> str | None:
    """``--per-op``'s CSV target (``-`` for stdout), None for the table; checked before any run.

    Raises:
        UsageError: a value other than ``csv=PATH``, or ``csv=-`` beside ``--json`` on stdout.
    """
    value = args.per_op
    if value in (None, "table"):
        return None
    kind, sep, target = value.partition("=")
    if kind != "csv" or not sep or not target:
        raise errors.UsageError(f"--per-op {value!r} is neither empty nor csv=PATH",
                                remedy="--per-op for the table, --per-op csv=PATH (or csv=-) for CSV")
    if target == "-":
        if out.json_mode:
            raise errors.UsageError("--per-op csv=- and --json both want stdout alone",
                                    remedy="write one of them to a file: --json=PATH or --per-op csv=PATH")
        out.out = out.err  # stdout holds the CSV alone: the summary goes to stderr
    else:
        check_output(target, flag="--per-op csv=")
    return target


def _show_per_op(doc: dict[str, Any], target: str | None, out: Output) -> None:
    """The per-op table or CSV (``xstage.record.per_op``)."""
    table = per_op(doc)
    if table is None:
        out.warning("--per-op: this record holds no profile of the stage's kernels")
        return
    if target is None:
        torch_table = "devices" in table.columns
        out.table(f"Per op ({escape(table.basis)}; total {table.total_us:.1f} µs)",
                  [c.replace("_us", " (µs)") for c in table.columns],
                  [[_cell(r.get(c), c) for c in table.columns] for r in table.rows])
        if torch_table:
            out.hint("torch: host times; on a device each op's launch (device_time_us: its kernels)")
        return
    text = to_csv(table)
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_output(target, text.encode("utf-8"), flag="--per-op csv=")
    except OSError as exc:
        raise errors.XstageError(f"could not write --per-op csv={target}: {exc.strerror or exc}",
                                 remedy="choose a writable --per-op csv=PATH") from None
    out.log(f"per-op CSV written to {target}")


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column == "share":
        return f"{value * 100:.1f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if column.endswith("_us") else f"{value:g}"
    return escape(str(value))


def run(args: argparse.Namespace, out: Output) -> int:
    argv = ["xstage", *sys.argv[1:]]
    if args.save_outputs:
        check_output(args.save_outputs, flag="--save-outputs")
    per_op_target = _check_per_op(args, out)
    _check_throughput(args)
    # Imported here: builtin_graphs imports onnx (~0.7 s), which `xstage --help` need not pay.
    from xstage.builtin_graphs import builtin_artifact, builtin_stage

    graph = (Path(args.graph) if args.graph
             else builtin_artifact(args.builtin) if args.builtin else builtin_stage())
    if args.resource and not args.cluster:
        raise errors.UsageError("--resource needs --cluster", remedy="add --cluster ray")
    if args.sweep or args.batch:
        return _run_sweep(args, graph, argv, out)
    try:
        with out.progress("proving and gating"):
            stage = _open(args, graph, out)
    except errors.UsageError:
        raise
    except errors.XstageError as exc:  # refused or failed: the API's record, with the timing plan
        return _refused_or_raise(exc, args, argv, out)
    with stage:
        doc = _measured(stage, args, argv, out)
        path = _write(doc, args, out)  # the record first: a failed --save-outputs keeps it
        show_summary(doc, out, title="xstage external")
        if args.per_op is not None:
            _show_per_op(doc, per_op_target, out)
        if args.save_outputs:
            _save_outputs(stage, args.save_outputs, path)
    return EXIT_OK


def _measured(stage: Any, args: argparse.Namespace, argv: list[str], out: Output,
              batch: int | None = None) -> dict[str, Any]:
    """The timed runs, ``--throughput``'s run, then the stage's record."""
    with out.progress("timing", total=args.runs, unit="runs") as bar:
        stage.measure(runs=args.runs, warmup=args.warmup, compare_cpu=args.compare_cpu,
                      progress=lambda n: bar.update(completed=n), percentiles=args.percentiles)
    if args.throughput:
        with out.progress(f"throughput at depth {args.depth or THROUGHPUT_DEPTH}"):
            stage.timings = {**(stage.timings or {}), "throughput": stage.measure_throughput(
                stage.inputs, depth=args.depth or THROUGHPUT_DEPTH, requests=args.requests,
                duration=args.duration, batch=batch, percentiles=args.percentiles)}
    if out.verbosity > 0:  # the doorbell's spin-or-block decisions over the timed runs
        for side, summary in stage.waits().items():
            if summary.get("line"):
                out.log(f"doorbell ({side}): {summary['line']}")
    return dict(stage.record(argv=argv))


def _sweep_points(args: argparse.Namespace, graph: Path) -> list[Point]:
    """``--sweep``'s or ``--batch``'s points (``xstage.cli._sweep``), checked before any run.

    Raises:
        UsageError: a malformed sweep, or a flag a sweep cannot take.
    """
    for flag, value in (("--save-outputs", args.save_outputs), ("--per-op", args.per_op),
                        ("--cluster", args.cluster)):
        if value:
            raise errors.UsageError(f"{flag} takes one stage; a sweep opens one per shape",
                                    remedy=f"run {flag} on the shape you want, without the sweep")
    points = sweep_points(args.sweep) if args.sweep else None
    batches = None if args.sweep else parse_batches(args.batch)
    from xstage.artifact import inspect_artifact

    art = inspect_artifact(graph, fmt=args.fmt, component=args.component)
    try:
        inputs = [(i.name, i.shape) for i in art.inputs]
    finally:
        art.release()
    if points is None:
        return batch_points(batches or [], inputs)
    check_points(points, inputs)
    return points


def _run_sweep(args: argparse.Namespace, graph: Path, argv: list[str], out: Output) -> int:
    """One admission per shape, one record each under the home, one table; ``--json`` gets
    ``{"shapes": [record, ...]}``. Exit 2 when any shape was refused, else 0."""
    points = _sweep_points(args, graph)
    docs: list[dict[str, Any]] = []
    for point in points:
        try:
            with out.progress(f"{point.label}: proving and gating"):
                stage = _open(args, graph, out, point=point)
        except errors.Refused as exc:
            doc = {**(exc.record or {}), "argv": argv}
        else:
            with stage:
                doc = _measured(stage, args, argv, out, batch=point.batch)
        path = write_record(doc, records_path((doc.get("artifact") or {}).get("component"),
                                              args.graph or "builtin"))
        out.log(f"record ({point.label}): {path}")
        docs.append(doc)
    out.table(f"xstage external: {len(points)} shapes", list(SWEEP_COLUMNS),
              [[escape(c) for c in row] for row in sweep_rows(points, docs)])
    out.emit({"shapes": docs})
    return EXIT_REFUSED if any(d["outcome"]["status"] == "refused" for d in docs) else EXIT_OK


def _open(args: argparse.Namespace, graph: Path, out: Output, point: Point | None = None) -> Any:
    """``open_stage`` with the command's flags (a sweep's point over ``--shape``/``--dim``)."""
    return open_request(stage_request(args, graph, out, point))


def stage_request(args: argparse.Namespace, graph: Path, out: Output,
                  point: Point | None = None) -> StageRequest:
    """The command's flags as the request ``open_stage`` builds from its arguments.

    ``--prefer a,b`` is the list ``["a", "b"]``; ``--depth`` (with ``--throughput``) is both
    the depth and the concurrency; the record is the command's to write (``record_on_close``
    off); ``--verbose`` lines go to ``out``.

    Raises:
        UsageError: a malformed flag value, or one ``StageRequest.build`` refuses.
    """
    prefer = [p for p in args.prefer.split(",") if p] if args.prefer else None
    shapes, dims = parse_shapes(args.shape), parse_dims(args.dim)
    if point is not None:
        shapes, dims = {**shapes, **point.shapes}, {**dims, **point.dims}
    return StageRequest.build(
        graph, device=args.device, prefer=prefer, route=args.route, offload=args.offload,
        min_placement=args.min_placement, inputs=args.inputs,
        reference=args.reference or "auto", reference_arm=args.reference_arm,
        tolerance=parse_tolerance(args.tolerance),
        ep_options=_ep_options(args.ep_option), threads=args.threads,
        session_config=_ep_options(args.session_config, "--session-config",
                                   "session.intra_op.allow_spinning=0"),
        graph_opt_level=args.graph_opt_level, fmt=args.fmt, component=args.component,
        shapes=shapes, dims=dims, on_event=out.log,
        ledger=Ledger(capacity=dict(parse_pool_arg(p) for p in args.pool)) if args.pool else None,
        deadlines=parse_timeouts(args.timeout), record_on_close=False,  # it writes its own
        cluster=args.cluster, resources=parse_resources(args.resource),
        placement_timeout=args.placement_timeout,
        **({"depth": args.depth or THROUGHPUT_DEPTH, "concurrency": args.depth or THROUGHPUT_DEPTH}
           if args.throughput else {}))


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
