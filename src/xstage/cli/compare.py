"""``xstage compare A.json B.json``: two records of the same artifact side by side.

Routes, devices or versions: the placement (verdict, fractions, nodes left on the CPU), the
timings (p50, p90, and B's ratio to A), parity, memory, and a list of what changed from A to
B. ``--html OUT.html`` writes the same as one self-contained page, with both splits and both
latency charts. Records of different artifacts are compared anyway, with a warning. Exit 0 when
both records are valid, 1 when one is unreadable or invalid.
"""

from __future__ import annotations

import argparse

from rich.markup import escape

from xstage.cli._flags import add_json_flag
from xstage.cli._output import Output
from xstage.cli.report import read_checked, write_output
from xstage.exit_codes import EXIT_OK
from xstage.home import check_output

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="two records of the same artifact side by side, and what changed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", metavar="A.json", help="the baseline record")
    p.add_argument("b", metavar="B.json", help="the record to compare with it")
    p.add_argument("--html", metavar="OUT.html", help="write the comparison as one self-contained HTML page")
    add_json_flag(p, "the comparison", files=("a", "b", "html"))
    p.set_defaults(func=run, needs_runtime=False)  # reads records only


def run(args: argparse.Namespace, out: Output) -> int:
    from xstage.report import build_view, compare_views

    if args.html:
        check_output(args.html, flag="--html")
    cmp = compare_views(build_view(read_checked(args.a, out)), build_view(read_checked(args.b, out)))
    if not cmp.same_artifact:
        out.warning("the two records are of different artifacts (sha256 differs): compared anyway")
    out.emit({
        "same_artifact": cmp.same_artifact,
        "changes": list(cmp.changes),
        "rows": [{"section": r.section, "label": r.label, "a": r.a, "b": r.b, "changed": r.changed}
                 for r in cmp.rows],
        "moved": [{"node": n, "a": pa, "b": pb} for n, pa, pb in cmp.moved],
    })
    if not out.json_mode:
        # Record text is data, not markup: "[link=…]" in a value must print as written.
        out.table(
            escape(f"A: {args.a}  ·  B: {args.b}"),
            ["", "A", "B"],
            [[escape(f"{'* ' if r.changed else ''}{r.section}: {r.label}"), escape(str(r.a)),
              escape(str(r.b))] for r in cmp.rows],
        )
        out.result("what changed (A → B):")
        for change in cmp.changes or ("nothing",):
            out.result(f"  {escape(change)}")
    if args.html:
        from xstage.report.html import render_compare

        write_output(args.html, render_compare(cmp), "HTML comparison", out)
    return EXIT_OK
