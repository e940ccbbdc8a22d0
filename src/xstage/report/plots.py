"""The report's pictures: matplotlib figures written as inline SVG text.

Why matplotlib: it is the best-kept plotting library of the Python scientific stack, it draws
every chart here (stacked bars, broken bars for a timeline, histograms, log axes) without a
browser, and its SVG backend writes vector text that a page can inline — so the report stays
one file that opens offline, with no script and no CDN. It is an optional dependency (the
``report`` extra); nothing else in xstage imports it. Figures are built on
``matplotlib.figure.Figure`` directly (no pyplot: no global state, no GUI backend), and written
with ``svg.fonttype = "none"`` (text stays text: smaller, searchable, selectable),
a fixed ``svg.hashsalt`` and no date, so the same record draws the same bytes; ``text.parse_math``
is off, so a node name with ``$`` in it is text, not mathtext.

Each function takes a :class:`~xstage.report.view.ReportView` and returns one ``<svg>``
element as text, or None when the record has nothing to draw.

.. versionadded:: 0.2
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from xstage import errors
from xstage.report.view import CPU_EP, ReportView

__all__ = [
    "PALETTE",
    "latency_chart",
    "ledger_chart",
    "parity_chart",
    "provider_color",
    "split_chart",
    "timeline_chart",
]

#: Colours by role: the target EP, the CPU EP, any other provider, nodes neither layer names.
PALETTE = {
    "target": "#1f77b4",
    "cpu": "#ff7f0e",
    "other": "#2ca02c",
    "unseen": "#9e9e9e",
    "copy": "#d62728",
    "transport": "#8c564b",
    "compute": "#1f77b4",
    "copy_in": "#e377c2",
    "copy_out": "#bcbd22",
}
_MAX_OPS = 24  # op types drawn in the split chart (the table lists them all)


def provider_color(provider: str | None, target: str | None) -> str:
    """The colour of ``provider``: target blue, CPU orange, another green, unknown grey."""
    if provider is None:
        return PALETTE["unseen"]
    if provider == target:
        return PALETTE["target"]
    return PALETTE["cpu"] if provider == CPU_EP else PALETTE["other"]


def _matplotlib() -> Any:
    try:
        import matplotlib
        import matplotlib.ticker
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise errors.XstageError(
            "the HTML report draws its plots with matplotlib, which is not installed",
            remedy="pip install 'xstage[report]' (or pip install matplotlib)",
        ) from exc
    return matplotlib, Figure


@contextmanager
def _figure(width: float, height: float) -> Iterator[Any]:
    matplotlib, figure_cls = _matplotlib()
    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "xstage",
            "text.parse_math": False,
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        yield figure_cls(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    svg = text[start:] if start >= 0 else text
    # Width and height in pt would fix the size; a viewBox alone lets the page scale it.
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", svg, count=1)


def split_chart(view: ReportView) -> str | None:
    """Nodes per op type (target, CPU, other, unseen) and their kernel time, side by side."""
    rows = [s for s in view.split if not s.partition][:_MAX_OPS]
    parts = [s for s in view.split if s.partition]
    if not rows and not parts:
        return None
    with _figure(9.5, 0.9 + 0.26 * max(len(rows), len(parts) + 1, 3)) as fig:
        left, right = fig.subplots(1, 2, width_ratios=[3, 2])
        labels = [s.op_type for s in rows][::-1]
        y = range(len(labels))
        acc = [0.0] * len(labels)
        for key, attr in (
            ("target", "target_nodes"),
            ("cpu", "cpu_nodes"),
            ("other", "other_nodes"),
            ("unseen", "unseen_nodes"),
        ):
            values = [float(getattr(s, attr)) for s in rows][::-1]
            left.barh(
                list(y),
                values,
                left=acc,
                color=PALETTE[key],
                label={
                    "target": view.target_ep or "target",
                    "cpu": CPU_EP,
                    "other": "other EP",
                    "unseen": "fused/folded away",
                }[key],
            )
            acc = [a + v for a, v in zip(acc, values, strict=True)]
        left.set_yticks(list(y), labels)
        left.set_xlabel("nodes")
        left.set_title("nodes by op type and provider", loc="left")
        fig.legend(loc="outside lower center", fontsize=7, frameon=False, ncols=4)
        bars = [
            (s.op_type, s.target_us, s.cpu_us, s.other_us)
            for s in rows
            if s.target_us + s.cpu_us + s.other_us
        ]
        bars += [(s.op_type, s.target_us, s.cpu_us, s.other_us) for s in parts]
        bars = bars[:_MAX_OPS][::-1]
        names = [b[0] for b in bars]
        yy = list(range(len(bars)))
        right.barh(yy, [b[1] for b in bars], color=PALETTE["target"])
        right.barh(yy, [b[2] for b in bars], left=[b[1] for b in bars], color=PALETTE["cpu"])
        right.barh(yy, [b[3] for b in bars], left=[b[1] + b[2] for b in bars], color=PALETTE["other"])
        right.set_yticks(yy, names)
        right.set_xlabel("kernel time, timed runs (µs)")
        right.set_title("kernel time", loc="left")
        return _svg(fig)


def timeline_chart(view: ReportView) -> str | None:
    """The profiled runs' kernels, one lane per provider, on the profile's clock."""
    kernels = [k for k in view.kernels if isinstance(k.get("ts_us"), int)]
    if not kernels:
        return None
    providers = sorted(
        {str(k["provider"]) for k in kernels}, key=lambda p: (p != view.target_ep, p != CPU_EP, p)
    )
    lanes = providers + ["copies"] if any(k.get("kind") == "copy" for k in kernels) else providers
    t0 = min(int(k["ts_us"]) for k in kernels)
    with _figure(9.5, 0.9 + 0.45 * len(lanes)) as fig:
        ax = fig.subplots()
        for i, lane in enumerate(lanes):
            spans = [
                ((int(k["ts_us"]) - t0) / 1e3, max(int(k["dur_us"]), 1) / 1e3)
                for k in kernels
                if (lane == "copies" and k.get("kind") == "copy")
                or (lane != "copies" and k.get("kind") != "copy" and k["provider"] == lane)
            ]
            color = PALETTE["copy"] if lane == "copies" else provider_color(lane, view.target_ep)
            ax.broken_barh(spans, (i - 0.35, 0.7), facecolors=color, linewidth=0)
        span = max((int(k["ts_us"]) + int(k["dur_us"]) - t0) / 1e3 for k in kernels) or 1.0
        for run in view.runs:
            if isinstance(run.get("ts_us"), int):
                start = (int(run["ts_us"]) - t0) / 1e3
                ax.axvspan(start, start + int(run["dur_us"]) / 1e3, color="#000000", alpha=0.05, linewidth=0)
                if int(run["dur_us"]) / 1e3 >= 0.04 * span:  # a label only where it fits
                    ax.text(start, len(lanes) - 0.4, f"run {run['run']}", fontsize=7, va="bottom")
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(-0.6, len(lanes) + 0.1)
        ax.set_xlabel("ms since the first profiled kernel (worker's profile clock)")
        ax.set_title("kernels of the profiled runs, per provider", loc="left")
        return _svg(fig)


def latency_chart(view: ReportView) -> str | None:
    """Each timed call's round trip split into copy in, compute, copy out, transport; the distribution."""
    calls = view.calls
    if not calls:
        return None
    with _figure(9.5, 3.0) as fig:
        left, right = fig.subplots(1, 2, width_ratios=[3, 2])
        x = list(range(1, len(calls) + 1))
        acc = [0.0] * len(calls)
        for key, values in (
            ("copy_in", [(c.copy_in_us or 0) / 1e3 for c in calls]),
            ("compute", [c.compute_us / 1e3 for c in calls]),
            ("copy_out", [(c.copy_out_us or 0) / 1e3 for c in calls]),
            ("transport", [c.transport_us / 1e3 for c in calls]),
        ):
            left.bar(x, values, bottom=acc, color=PALETTE[key], label=key.replace("_", " "), width=0.8)
            acc = [a + v for a, v in zip(acc, values, strict=True)]
        left.set_xlabel("timed call")
        left.set_ylabel("ms")
        left.set_title("round trip, call by call", loc="left")
        left.legend(fontsize=7, frameon=False, ncols=4, loc="upper right")
        trips = sorted(c.round_trip_us / 1e3 for c in calls)
        right.hist(trips, bins=min(30, max(5, len(trips) // 2)), color=PALETTE["target"], alpha=0.8)
        for q, style in ((0.5, "-"), (0.9, "--")):
            value = trips[min(len(trips) - 1, int(q * (len(trips) - 1) + 0.5))]
            right.axvline(value, color="#333333", linestyle=style, linewidth=1)
            right.text(value, right.get_ylim()[1] * 0.95, f" p{int(q * 100)}", fontsize=7, va="top")
        right.set_xlabel("round trip (ms)")
        right.set_ylabel("calls")
        right.set_title("distribution", loc="left")
        return _svg(fig)


def ledger_chart(view: ReportView) -> str | None:
    """The reservations, stacked, against the budget and the worker's measured peak."""
    ledger = view.ledger
    if not ledger or not ledger.get("reservations"):
        return None
    reservations: Sequence[dict[str, Any]] = ledger["reservations"]
    with _figure(9.5, 2.2) as fig:
        ax = fig.subplots()
        left = 0.0
        cmap = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"]
        for i, r in enumerate(reservations):
            mib = int(r["bytes"]) / 2**20
            ax.barh(
                [0], [mib], left=left, color=cmap[i % len(cmap)], label=f"{r['purpose']} ({r['evidence']})"
            )
            left += mib
        for value, label, style in (
            (ledger.get("budget_bytes"), "budget", "-"),
            (ledger.get("measured_peak_bytes"), "measured peak", "--"),
        ):
            if isinstance(value, int):
                ax.axvline(value / 2**20, color="#222222", linestyle=style, linewidth=1.2)
                ax.text(value / 2**20, 0.45, f" {label} {value / 2**20:.1f} MiB", fontsize=7)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 0.8)
        ax.set_xlabel("MiB")
        ax.set_title(
            f"reservations in {ledger.get('pool', {}).get('name')} against the measured peak", loc="left"
        )
        fig.legend(fontsize=7, frameon=False, ncols=4, loc="outside lower center")
        return _svg(fig)


def parity_chart(view: ReportView) -> str | None:
    """Each output's relative L2 error against the tolerance that applied (log scale)."""
    outputs = [o for o in view.outputs if isinstance(o.rel_l2, (int, float))]
    if not outputs:
        return None
    tolerance = (view.parity or {}).get("tolerance") or {}
    bound = tolerance.get("rel_l2")
    with _figure(9.5, 0.8 + 0.3 * len(outputs)) as fig:
        ax = fig.subplots()
        y = list(range(len(outputs)))
        values = [max(float(o.rel_l2 or 0), 1e-12) for o in outputs]  # 0 (bit-exact) drawn at the axis' floor
        ax.barh(y, values, color=[PALETTE["target"] if o.passed else PALETTE["copy"] for o in outputs])
        if isinstance(bound, (int, float)) and bound > 0:
            ax.axvline(bound, color="#222222", linestyle="--", linewidth=1)
            ax.text(bound, len(outputs) - 0.5, f" rel_l2 bound {bound:g}", fontsize=7)
        ax.set_xscale("log")
        ticker = _matplotlib()[0].ticker
        ax.xaxis.set_major_formatter(ticker.LogFormatter())  # plain "1e-05": mathtext is off
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        low = min(
            [v for v in values if v > 1e-12]
            + ([bound] if isinstance(bound, (int, float)) and bound > 0 else [1.0])
        )
        ax.set_xlim(low / 100, max(values + [low]) * 10)
        ax.set_yticks(y, [o.name for o in outputs])
        ax.set_xlabel("relative L2 error against the reference")
        ax.set_title("parity per output", loc="left")
        return _svg(fig)
