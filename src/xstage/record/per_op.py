"""The per-op table of a record (``xstage external --per-op``): where the kernel time went.

Pure: a validated record in, rows out; the CLI renders them as a table or CSV. It reads what the
record already holds and decides nothing. The rules:

1. **ONNX.** The profiled kernels of ``detail.placement`` (``xstage.evidence.detail``, rule 7),
   of the timed profiled runs only (2–4: the first run's start-up costs are left out, as the
   proof's time fraction leaves them out), grouped by (node, op, provider, kind). A fused
   partition (an EP's ``<EP>-subgraph_<k>``) is one row: its members ran as one kernel. Time is
   the mean per timed run; count is kernel events per run (a node that ran twice per run, in a
   loop's body, counts two).
2. **torch.** The warm-up's op log (``detail.ops``): one row per (op, devices), host time (on
   CUDA, the launch; the device kernels of an op, where the profiler gave them per op, as
   ``device_time_us``), count per run.
3. **Share** is each row's time over the table's total; rows are sorted by time, then name.
4. A record without either (a refused candidate that never warmed up, a cluster stage) has no
   table: ``None``, and the caller says so.

.. versionadded:: 0.2
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PerOp", "per_op", "to_csv"]

_ONNX_COLUMNS = ("node", "op", "provider", "kind", "time_us", "share", "count")
_TORCH_COLUMNS = ("op", "devices", "time_us", "device_time_us", "share", "count")


@dataclass(frozen=True)
class PerOp:
    """The table: its columns, its rows (dicts keyed by the columns), what the times are."""

    columns: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    total_us: float
    basis: str


def _onnx(placement: Mapping[str, Any]) -> PerOp | None:
    """Case 1."""
    kernels = placement.get("kernels") or []
    timed = set(placement.get("timed_runs") or [])
    picked = [k for k in kernels if k.get("run") in timed] if timed else list(kernels)
    if not picked:
        return None
    runs = len(timed) or len({k.get("run") for k in picked}) or 1
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for k in picked:
        key = (str(k.get("node")), str(k.get("op")), str(k.get("provider")), str(k.get("kind")))
        slot = groups.setdefault(key, [0.0, 0])
        slot[0] += float(k.get("dur_us") or 0)
        slot[1] += 1
    total = sum(t for t, _ in groups.values()) / runs
    rows = [{"node": node, "op": op, "provider": provider, "kind": kind, "time_us": t / runs,
             "share": (t / runs) / total if total > 0 else None,
             "count": n // runs if n % runs == 0 else n / runs}
            for (node, op, provider, kind), (t, n) in groups.items()]
    rows.sort(key=lambda r: (-r["time_us"], r["node"]))
    return PerOp(_ONNX_COLUMNS, tuple(rows), total,
                 f"mean per run over the profiled runs {sorted(timed) or 'all'} of the warm-up")


def _torch(ops: list[Mapping[str, Any]]) -> PerOp | None:
    """Case 2."""
    rows = []
    for rec in ops:
        devices = sorted(set(rec.get("in") or []) | set(rec.get("out") or []))
        rows.append({"op": str(rec.get("op")), "devices": ",".join(devices) or "-",
                     "time_us": float(rec.get("time_us") or 0.0),
                     "device_time_us": rec.get("device_time_us"), "count": rec.get("count")})
    if not rows:
        return None
    total = sum(r["time_us"] for r in rows)
    for r in rows:
        r["share"] = r["time_us"] / total if total > 0 else None
    rows.sort(key=lambda r: (-r["time_us"], r["op"]))
    return PerOp(_TORCH_COLUMNS, tuple(rows), total,
                 "host time of each op in the profiled warm-up call (on a device: its launch)")


def per_op(doc: Mapping[str, Any]) -> PerOp | None:
    """The per-op table of a record, or None when it holds no profile (rule 4)."""
    detail = doc.get("detail")
    if not isinstance(detail, Mapping):
        return None
    if isinstance(detail.get("placement"), Mapping):
        return _onnx(detail["placement"])
    if isinstance(detail.get("ops"), list):
        return _torch(detail["ops"])
    return None


def to_csv(table: PerOp) -> str:
    """The table as CSV (a header row, then one row each; times in µs, shares as fractions)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(table.columns), lineterminator="\n")
    writer.writeheader()
    for row in table.rows:
        writer.writerow({k: _csv_cell(row.get(k)) for k in table.columns})
    return buffer.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    return round(value, 6) if isinstance(value, float) else value
