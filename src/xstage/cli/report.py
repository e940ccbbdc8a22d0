"""``xstage report RECORD.json``: validate a record against its schema and print its summary again.

Exit 0 when the record is valid (whatever its outcome was), 1 when it is unreadable or
invalid: the one error line names the file and, for a schema violation, the JSON path.
"""

from __future__ import annotations

import argparse

from xstage.cli._output import Output
from xstage.cli._summary import show_summary
from xstage.exit_codes import EXIT_OK
from xstage.record import read_record

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="validate a record and print its summary again",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("record", metavar="RECORD.json", help="a record written by xstage external")
    p.add_argument("--json", action="store_true", help="print the validated record as one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: Output) -> int:
    doc = read_record(args.record)
    if args.json:
        out.json(doc)
        return EXIT_OK
    show_summary(doc, out, title=f"Record {args.record}")
    return EXIT_OK
