"""Timing samples of a stage's runs, summarized: compute, round trip, and their difference.

Pure. The worker's own compute time comes back with every call; the round trip is measured
around the public call; transport is what the difference leaves (copies, wake-ups, checks).

Percentiles (``--percentiles``): a percentile ``q`` is reported only when the samples resolve
it, that is when at least one sample lies above it: ``needs_runs(q)`` = 1 for q ≤ 50, else
⌈100 / (100 − q)⌉ (p90 needs 10 runs, p99 100, p99.9 1000). Fewer samples give ``None`` and the
count they would need, never an interpolation between the two largest samples dressed as a tail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_PERCENTILES", "needs_runs", "parse_percentiles", "percentile_key", "summarize",
           "throughput_block"]

#: The percentiles the summary prints when none are asked for.
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)


def needs_runs(q: float) -> int:
    """How many samples a percentile ``q`` needs before one sample lies above it."""
    if q <= 50:
        return 1
    return math.ceil(round(100.0 / (100.0 - q), 9))


def percentile_key(q: float) -> str:
    """The record's name for a percentile: ``p50``, ``p99.9``."""
    return f"p{q:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99,99.9`` → sorted unique percentiles in (0, 100).

    Raises:
        ValueError: an item that is not a number, is outside (0, 100), or is repeated (the
            message names it; the CLI words it as a usage error).
    """
    out: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            q = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number") from None
        if not 0 < q < 100:
            raise ValueError(f"{item} is outside (0, 100): a percentile of the timed runs")
        if q in out:
            raise ValueError(f"{item} is named twice")
        out.append(q)
    return tuple(sorted(out))


def _stats(values_s: Sequence[float]) -> dict[str, float] | None:
    if not values_s:
        return None
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def _percentiles(series: dict[str, Sequence[float]], qs: Sequence[float]) -> list[dict[str, Any]]:
    """One entry per percentile: its key, the runs it needs, each series' value (ms) or None."""
    out = []
    for q in qs:
        entry: dict[str, Any] = {"q": q, "key": percentile_key(q), "needs_runs": needs_runs(q)}
        for name, values in series.items():
            ok = bool(values) and len(values) >= entry["needs_runs"]
            entry[f"{name}_ms"] = float(np.percentile(np.asarray(values) * 1e3, q)) if ok else None
        out.append(entry)
    return out


def throughput_block(*, depth: int, requests: int, wall_s: float, batch: int | None = None,
                     concurrency: int | None = None,
                     latency_s: Sequence[float] = (), percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                     note: str | None = None) -> dict[str, Any]:
    """The record's ``timings.throughput``: ``requests`` completed in ``wall_s`` at ``depth``.

    ``latency_s`` are each request's submit-to-result times; ``batch`` (a batch sweep's) turns
    requests/s into items/s too; ``concurrency``: how many of the ``depth`` the worker computed
    at once.
    """
    rps = requests / wall_s if wall_s > 0 else None
    return {"depth": depth, "concurrency": concurrency, "requests": requests, "wall_s": wall_s,
            "requests_per_s": rps,
            "items_per_s": rps * batch if rps is not None and batch else None, "batch": batch,
            "latency": _stats(latency_s),
            "percentiles": _percentiles({"latency": latency_s}, percentiles), "note": note}


def summarize(
    compute_s: Sequence[float],
    round_trip_s: Sequence[float],
    *,
    warmup: int,
    reference_s: Sequence[float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """The record's ``timings`` object from per-run samples (seconds).

    ``reference_s`` are the reference arm's times for the same inputs (``--compare-cpu``);
    the speedup is their median over the stage's median round trip. ``percentiles`` are
    reported for compute, round trip and transport, each with the runs it needs (module doc).
    """
    if len(compute_s) != len(round_trip_s):
        raise ValueError("compute and round-trip samples must pair up")
    transport = [max(0.0, r - c) for r, c in zip(round_trip_s, compute_s, strict=True)]
    doc: dict[str, Any] = {
        "runs": len(round_trip_s),
        "warmup": warmup,
        "compute": _stats(compute_s),
        "round_trip": _stats(round_trip_s),
        "transport": _stats(transport),
        "reference": _stats(reference_s or []),
        "speedup_vs_reference": None,
        "percentiles": _percentiles(
            {"compute": compute_s, "round_trip": round_trip_s, "transport": transport}, percentiles),
    }
    if reference_s and round_trip_s:
        doc["speedup_vs_reference"] = float(np.median(reference_s) / np.median(round_trip_s))
    return doc
