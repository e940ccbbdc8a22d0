"""Timing samples of a stage's runs, summarized: compute, round trip, and their difference.

Pure. The worker's own compute time comes back with every call; the round trip is measured
around the public call; transport is what the difference leaves (copies, wake-ups, checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["summarize"]


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


def summarize(
    compute_s: Sequence[float],
    round_trip_s: Sequence[float],
    *,
    warmup: int,
    reference_s: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The record's ``timings`` object from per-run samples (seconds).

    ``reference_s`` are the reference arm's times for the same inputs (``--compare-cpu``);
    the speedup is their median over the stage's median round trip.
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
    }
    if reference_s and round_trip_s:
        doc["speedup_vs_reference"] = float(np.median(reference_s) / np.median(round_trip_s))
    return doc
