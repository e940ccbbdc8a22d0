"""One self-contained HTML page per record (``xstage report --html``) or pair (``xstage compare``).

The page is a single file: inline CSS, the plots as inline SVG (:mod:`xstage.report.plots`), no
script, no font, image or stylesheet from anywhere else, so it opens offline and can be mailed
or attached to a bug. Every piece of text that came from a record — node names, messages, paths
— is escaped (``html.escape``, its control characters written as ``\\xNN`` first); the SVG is
matplotlib's, whose text it escapes itself.

Order on the page (docs/reports.md): the outcome and the refusals first, then the split by op type,
the kernel timeline, the round trip and its distribution, parity per output, the ledger against
the measured peak, and the provenance.

.. versionadded:: 0.2
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xstage.record._text import visible
from xstage.report import plots
from xstage.report.view import CompareView, ReportView

__all__ = ["render_compare", "render_report"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1040px;
padding:18px 24px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.outcome{padding:12px 16px;border-radius:6px;margin:12px 0;font-size:16px}
.placed{background:#e6f4ea;border-left:6px solid #1e8e3e}
.refused{background:#fef7e0;border-left:6px solid #f29900}
.error{background:#fce8e6;border-left:6px solid #d93025}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{background:#f6f6f6;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#666;font-size:12px}.changed{background:#fff4d6}
code{font-size:12px;background:#f3f3f3;padding:1px 3px;border-radius:3px;word-break:break-all}
figure{margin:8px 0}svg{max-width:100%;height:auto}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
"""


def _e(value: Any) -> str:
    return html.escape(visible("—" if value is None else value), quote=True)


def _table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Sequence[int] = (),
    classes: Sequence[str] | None = None,
) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="n">{_e(v)}</td>' if j in numeric else f"<td>{_e(v)}</td>" for j, v in enumerate(row)
        )
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _figure(svg: str | None, missing: str) -> str:
    return f"<figure>{svg}</figure>" if svg else f'<p class="muted">{_e(missing)}</p>'


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return _e(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _outcome(view: ReportView) -> str:
    parts = [
        f'<div class="outcome {_e(view.status)}" id="outcome"><b>{_e(view.status)}</b> '
        f"(exit {view.exit_code}) — {_e(view.headline)}</div>"
    ]
    if view.refusals:
        rows = [
            (
                r.get("code"),
                r.get("cause"),
                r.get("device"),
                r.get("route"),
                r.get("message"),
                r.get("remedy"),
            )
            for r in view.refusals
        ]
        parts.append(
            "<h2>Refusals</h2>" + _table(["code", "cause", "device", "route", "message", "remedy"], rows)
        )
    if view.error:
        parts.append(
            "<h2>Error</h2>"
            + _table(
                ["type", "message", "remedy"],
                [(view.error.get("type"), view.error.get("message"), view.error.get("remedy"))],
            )
        )
    if view.candidates:
        rows = [
            (c.get("device"), c.get("route"), c.get("status"), (c.get("refusal") or {}).get("cause"))
            for c in view.candidates
        ]
        parts.append("<h2>Candidates</h2>" + _table(["device", "route", "status", "refusal cause"], rows))
    return "".join(parts)


def _split(view: ReportView) -> str:
    proof = view.proof or {}
    out = ["<h2>Split by op type</h2>"]
    if proof:
        out.append(
            f'<p id="split-summary">verdict <b>{_e(proof.get("verdict"))}</b> on '
            f"{_e(proof.get('target_ep'))}: node fraction {_pct(proof.get('node_fraction'))} "
            f"({_e(proof.get('node_basis') or proof.get('basis'))}), "
            f"time fraction {_pct(proof.get('time_fraction'))}, "
            f"kernel fraction {_pct(proof.get('kernel_fraction'))}; "
            f"decided by {_e(proof.get('decided_by'))}; evidence from {_e(view.proof_source)}.</p>"
        )
        cpu = proof.get("cpu_nodes") or {}
        if cpu:
            listed = "; ".join(
                f"{op}: {', '.join(names[:8])}{' …' if len(names) > 8 else ''}"
                for op, names in sorted(cpu.items())
            )
            out.append(f'<p id="left-on-cpu">left on the CPU: {_e(listed)}</p>')
        else:
            out.append('<p id="left-on-cpu">left on the CPU: nothing</p>')
    else:
        out.append('<p class="muted">no placement evidence in this record (no worker warmed up).</p>')
    for note in view.notes:
        out.append(f'<p class="muted">{_e(note)}</p>')
    if view.split:
        out.append(_figure(plots.split_chart(view), ""))
        rows = [
            (
                s.op_type,
                s.target_nodes,
                s.cpu_nodes,
                s.other_nodes,
                s.unseen_nodes,
                s.target_us,
                s.cpu_us,
                s.other_us,
            )
            for s in view.split
        ]
        target = view.target_ep or "target"
        out.append(
            _table(
                [
                    "op type",
                    f"nodes on {target}",
                    "nodes on CPU",
                    "other",
                    "fused/folded",
                    "µs on target",
                    "µs on CPU",
                    "µs other",
                ],
                rows,
                numeric=range(1, 8),
            )
        )
    return "".join(out)


def _timeline(view: ReportView) -> str:
    out = ["<h2>Kernel timeline</h2>"]
    out.append(
        _figure(
            plots.timeline_chart(view), "no profiled kernels in this record (no detail block, or no profile)."
        )
    )
    if view.runs:
        timed = set(view.timed_runs)
        rows = [
            (r.get("run"), r.get("dur_us"), "yes" if r.get("run") in timed else "no (start-up)")
            for r in view.runs
        ]
        out.append(_table(["profiled run", "µs", "timed"], rows, numeric=[1]))
    return "".join(out)


def _calls(view: ReportView) -> str:
    out = ["<h2>Round trip</h2>"]
    t = view.timings or {}
    if t:
        rows = []
        for key in ("compute", "round_trip", "transport", "reference"):
            block = t.get(key)
            if isinstance(block, Mapping):
                rows.append(
                    (
                        key.replace("_", " "),
                        *(_num(block.get(k)) for k in ("p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms")),
                    )
                )
        out.append(_table(["ms", "p50", "p90", "p99", "min", "max"], rows, numeric=range(1, 6)))
        out.append(
            f'<p class="muted">{_e(t.get("runs"))} timed calls after {_e(t.get("warmup"))} warm-ups.</p>'
        )
    out.append(_figure(plots.latency_chart(view), "no per-call samples in this record."))
    if view.calls:
        n = len(view.calls)

        def med(values: list[float]) -> str:
            ordered = sorted(values)
            return f"{ordered[len(ordered) // 2] / 1e3:.3f}"

        rows2 = [
            ("copy in (client)", med([c.copy_in_us or 0 for c in view.calls])),
            ("compute (worker)", med([c.compute_us for c in view.calls])),
            ("copy out (client)", med([c.copy_out_us or 0 for c in view.calls])),
            ("transport (the rest)", med([c.transport_us for c in view.calls])),
            ("round trip", med([c.round_trip_us for c in view.calls])),
        ]
        out.append(_table([f"median of {n} calls", "ms"], rows2, numeric=[1]))
    if view.phases:
        rows3 = [
            (p.get("name"), f"{float(p['start_us']) / 1e3:.1f}", f"{float(p['dur_us']) / 1e3:.1f}")
            for p in view.phases
        ]
        out.append(
            "<p>Phases before the first call (client clock):</p>"
            + _table(["phase", "starts at ms", "ms"], rows3, numeric=[1, 2])
        )
    return "".join(out)


def _parity(view: ReportView) -> str:
    out = ["<h2>Parity per output</h2>"]
    p = view.parity
    if not p:
        return out[0] + '<p class="muted">the numeric gate did not run (no worker, or refused before it).</p>'
    out.append(
        f"<p>verdict <b>{_e(p.get('verdict'))}</b>: {_e(p.get('summary'))} "
        f"(tolerance {_e(p.get('tolerance_key'))}, {_e(p.get('tolerance_source'))}).</p>"
    )
    out.append(_figure(plots.parity_chart(view), ""))
    rows = [
        (
            o.name,
            "passed" if o.passed else "failed",
            o.criterion,
            o.rule,
            _num(o.rel_l2),
            _num(o.cosine, 7),
            _num(o.max_abs),
            f"{o.n_bad}/{o.size}" if o.size is not None else "—",
        )
        for o in view.outputs
    ]
    out.append(
        _table(
            [
                "output",
                "verdict",
                "criterion that decided",
                "rule",
                "rel_l2",
                "cosine",
                "max |Δ|",
                "elements out of bound",
            ],
            rows,
            numeric=[4, 5, 6],
        )
    )
    if p.get("tiebreak"):
        out.append(f'<p class="muted">float64 tie-break: {_e(p.get("tiebreak"))}</p>')
    return "".join(out)


def _ledger(view: ReportView) -> str:
    out = ["<h2>Memory</h2>"]
    led = view.ledger
    if not led:
        return out[0] + '<p class="muted">no budget was computed for this record.</p>'
    out.append(_figure(plots.ledger_chart(view), ""))
    rows = [
        (
            r.get("purpose"),
            f"{int(r.get('bytes', 0)) / 2**20:.2f}",
            r.get("lifetime"),
            r.get("evidence"),
            r.get("basis"),
        )
        for r in led.get("reservations") or []
    ]
    out.append(_table(["reservation", "MiB", "lifetime", "evidence", "basis"], rows, numeric=[1]))

    def mib(value: Any) -> str:
        return f"{value / 2**20:.1f} MiB" if isinstance(value, int) else "—"

    ratio = led.get("budget_over_measured")
    out.append(
        f"<p>verdict <b>{_e(led.get('verdict'))}</b>: budget {mib(led.get('budget_bytes'))} "
        f"({_e(led.get('phase'))} phase) in {_e((led.get('pool') or {}).get('name'))}; the worker's "
        f"measured peak {mib(led.get('measured_peak_bytes'))}"
        f"{f', budget/measured {ratio:.2f}' if isinstance(ratio, (int, float)) else ''}.</p>"
    )
    return "".join(out)


def _provenance(view: ReportView) -> str:
    rows = list(view.provenance)
    if view.clock:
        c = view.clock
        rows.append(
            (
                "clocks",
                f"client {c.get('client')} from '{c.get('origin')}'; the worker's profile "
                f"placed at +{_num(c.get('profile_offset_us'), 9)} µs "
                f"± {_num(c.get('profile_offset_uncertainty_us'))} µs ({c.get('method')})",
            )
        )
    return "<h2>Provenance</h2>" + _table(["", ""], rows)


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body>{body}"
        '<p class="muted">written by xstage report: one file, no script, opens offline.</p>'
        "</body></html>\n"
    )


def render_report(view: ReportView) -> str:
    """The HTML page of one record (see the module docstring for what it holds, in order)."""
    body = (
        f"<h1>xstage report — {_e(view.title)}</h1>"
        f'<p class="muted">{_e(view.route)} on {_e(view.device)} · artifact sha256 '
        f"<code>{_e(view.artifact_sha256)}</code></p>"
        + _outcome(view)
        + _split(view)
        + _timeline(view)
        + _calls(view)
        + _parity(view)
        + _ledger(view)
        + _provenance(view)
    )
    return _page(f"xstage report — {view.title} — {view.status}", body)


def render_compare(cmp: CompareView) -> str:
    """The HTML page of two records side by side, changed rows highlighted."""
    a, b = cmp.a, cmp.b
    warn = (
        ""
        if cmp.same_artifact
        else (
            '<div class="outcome refused">the two records are of different artifacts '
            f"(sha256 {_e((a.artifact_sha256 or '')[:12])} vs {_e((b.artifact_sha256 or '')[:12])}): "
            "compared anyway.</div>"
        )
    )
    changes = "".join(f"<li>{_e(c)}</li>" for c in cmp.changes) or "<li>nothing</li>"
    rows = [(r.section, r.label, r.a, r.b) for r in cmp.rows]
    classes = ["changed" if r.changed else "" for r in cmp.rows]
    moved = ""
    if cmp.moved:
        moved = "<h2>Nodes that changed side</h2>" + _table(
            ["node", f"A ({a.route})", f"B ({b.route})"], cmp.moved
        )
    figures = []
    for label, view in (("A", a), ("B", b)):
        figures.append(
            f"<h2>{label}: {_e(view.route)} on {_e(view.device)} — split by op type</h2>"
            + _figure(plots.split_chart(view), "no split to draw.")
        )
        figures.append(_figure(plots.latency_chart(view), "no per-call samples."))
    body = (
        f"<h1>xstage compare — {_e(a.title)}</h1>{warn}"
        f'<h2>What changed (A → B)</h2><ul id="changes">{changes}</ul>'
        + _table(
            ["", "", f"A: {a.route} on {a.device}", f"B: {b.route} on {b.device}"], rows, classes=classes
        )
        + moved
        + "".join(figures)
    )
    return _page(f"xstage compare — {a.title}", body)
