"""``xstage report RECORD.json``: validate a record, print its summary again, and draw it.

``--html OUT.html`` writes one self-contained page (plots inline as SVG: no network, opens
offline); ``--node-data OUT.json`` writes Model Explorer node data (the provider of each
original node; its kernel time beside it, in ``OUT.kernel-time.json``); ``--trace OUT.json``
writes a Perfetto / chrome://tracing trace (client and worker as two processes, their clocks
aligned as docs/reports.md says). Exit 0 when the record is valid (whatever its outcome was),
1 when it is unreadable or invalid: the one error line names the file and, for a schema
violation, the JSON path.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from xstage import errors
from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.cli._summary import show_summary
from xstage.exit_codes import EXIT_OK
from xstage.home import check_output
from xstage.home import write_output as write_file
from xstage.record import UnknownValueWarning, read_record

__all__ = ["read_checked", "register", "write_output"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="validate a record, print its summary again, draw it (HTML, Model Explorer, Perfetto)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("record", metavar="RECORD.json", help="a record written by xstage external")
    add_json_flag(p, "the validated record", files=("record", "html", "node_data", "trace"))
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained HTML report")
    p.add_argument(
        "--node-data",
        metavar="OUT.json",
        help="write Model Explorer node data: providers (OUT.json), kernel time (OUT.kernel-time.json)",
    )
    p.add_argument("--trace", metavar="OUT.json", help="write a Perfetto / chrome://tracing trace")
    p.set_defaults(func=run, needs_runtime=False)  # reads records only


def write_output(path: str, text: str, what: str, out: Output, *, flag: str = "--html") -> Path:
    """Write one output file (``xstage.home.write_output``'s rules) and say where.

    Raises:
        UsageError: the path breaks those rules (a missing folder, another user's link).
        XstageError: the file cannot be written (the message names it and why).
    """
    try:
        written = write_file(path, text.encode("utf-8"), flag=flag)
    except OSError as exc:
        raise errors.XstageError(
            f"cannot write {what} to {path}: {exc.strerror or exc}",
            remedy="give a path in a folder you can write to",
        ) from exc
    if out.verbosity >= 0:
        out.err.print(f"{what} written to {written}", markup=False, highlight=False)
    return written


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def read_checked(path: str, out: Output) -> dict[str, Any]:
    """``read_record(path)``, each value a later minor version added said as one warning line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownValueWarning)
        doc = read_record(path)
    for warning in caught:
        if issubclass(warning.category, UnknownValueWarning):
            out.warning(str(warning.message))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return doc


def run(args: argparse.Namespace, out: Output) -> int:
    for flag, value in (("--html", args.html), ("--node-data", args.node_data), ("--trace", args.trace)):
        if value:  # before any work: a missing folder is a usage error, never created
            check_output(value, flag=flag)
    doc = read_checked(args.record, out)
    out.emit(doc)
    if not out.json_mode:
        show_summary(doc, out, title=f"Record {args.record}")
    if not (args.html or args.node_data or args.trace):
        return EXIT_OK
    from xstage.report import build_view

    view = build_view(doc)
    if args.html:
        from xstage.report.html import render_report

        write_output(args.html, render_report(view), "HTML report", out)
    if args.node_data:
        from xstage.report.node_data import adapter_node_ids, node_data

        if not view.nodes:
            out.warning(
                "this record has no per-node detail (no worker warmed up, a torch stage, or "
                "an older record): the node data is empty"
            )
        graph = (doc.get("artifact") or {}).get("path")
        providers, times = node_data(view, adapter_node_ids(graph) if graph else None)
        base = Path(args.node_data)
        write_output(str(base), _dump(providers), "Model Explorer node data (providers)", out,
                     flag="--node-data")
        write_output(
            str(base.with_name(base.stem + ".kernel-time" + (base.suffix or ".json"))),
            _dump(times),
            "Model Explorer node data (kernel time)",
            out, flag="--node-data",
        )
    if args.trace:
        from xstage.report.trace import trace_events

        pid = ((doc.get("worker") or {}).get("hello") or {}).get("worker", {}).get("pid")
        write_output(args.trace, _dump(trace_events(view, worker_pid=pid)), "Perfetto trace", out,
                     flag="--trace")
    return EXIT_OK
