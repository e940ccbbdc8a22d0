"""The ledger's second verdict: the worker's own measured peak against the stage's budget.

The budget (``xstage.ledger.budget``) is decided before a worker starts; this module judges
what the worker reported after its warm-up, and writes the record's ``ledger`` object, which
carries both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xstage.ledger.budget import HOST_POOL, Budget, Fit, format_bytes

__all__ = ["Measured", "call_peak_warning", "check_measured", "pinned_block", "record_block"]


@dataclass(frozen=True)
class Measured:
    """The budget against the worker's own peak."""

    verdict: str  # within | over | unreported
    cause: str | None  # None | peak_over_budget | peak_unreported
    budget_bytes: int
    peak_bytes: int | None

    @property
    def budget_over_measured(self) -> float | None:
        if not self.peak_bytes:
            return None
        return self.budget_bytes / self.peak_bytes

    def message(self) -> str:
        if self.cause == "peak_unreported":
            return ("the worker reported no memory peak, so a budget of "
                    f"{format_bytes(self.budget_bytes)} could not be confirmed")
        ratio = self.budget_over_measured or 0.0
        rel = "over" if self.verdict == "over" else "within"
        return (f"measured peak {format_bytes(self.peak_bytes or 0)} is {rel} the budget of "
                f"{format_bytes(self.budget_bytes)} (budget/measured {ratio:.2f})")


def check_measured(budget_bytes: int, peak_bytes: int | None) -> Measured:
    """Compare a budget with the worker's measured peak (``None`` or 0: not reported)."""
    if not peak_bytes:
        return Measured("unreported", "peak_unreported", budget_bytes, None)
    if peak_bytes > budget_bytes:
        return Measured("over", "peak_over_budget", budget_bytes, peak_bytes)
    return Measured("within", None, budget_bytes, peak_bytes)


def record_block(budget: Budget, fit: Fit, measured: Measured | None, *,
                 memory: Mapping[str, Any] | None = None, spots: Sequence[str] = (),
                 warnings: Sequence[str] = (),
                 profiled: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record's ``ledger`` object for one stage (see the record schema).

    ``profiled`` (an ONNX worker's): which session the measured peak is of (``basis``:
    ``profiled``, the profiler's events in it, or ``unprofiled``, the session that serves) and
    the profiled warm-up's own peak (``profiled_peak``), the proof's cost beside the stage's.
    """
    cause = fit.cause or (measured.cause if measured else None)
    if cause:
        verdict = "refused"
    elif measured is None:
        verdict = "reserved"  # held, not yet (or never) measured
    else:
        verdict = "within_budget"
    memory = dict(memory or {})
    return {
        "pool": fit.pool.to_dict(),
        "held_bytes": fit.held_bytes,
        **{k: v for k, v in budget.to_dict().items() if k != "pool"},
        "measured_peak_bytes": measured.peak_bytes if measured else None,
        "measured_rss_bytes": memory.get("rss"),
        "uss_bytes": memory.get("uss"),
        "pss_bytes": memory.get("pss"),
        "budget_over_measured": measured.budget_over_measured if measured else None,
        "verdict": verdict,
        "cause": cause,
        "blind_spots": list(spots),
        "warnings": list(warnings),
        **({"peak_basis": str(profiled.get("basis")),
            "profiled_peak_bytes": profiled.get("profiled_peak")} if profiled else {}),
    }


def call_peak_warning(peak: int | None, ledger_doc: Mapping[str, Any]) -> str | None:
    """The warning for a call whose worker peak passed the stage's budget, or None.

    A call's peak is the worker's host RSS, so it is held against a budget in the host's pool
    only: a budget in a device pool (``vram:…``) counts the device's bytes, which a call does not
    report, and comparing the two would warn about memory the budget never covered.
    """
    limit = ledger_doc.get("budget_bytes")
    if not peak or not isinstance(limit, int) or (ledger_doc.get("pool") or {}).get("name") != HOST_POOL:
        return None
    if peak <= limit:
        return None
    return (f"a call's peak {format_bytes(peak)} passed the budget of {format_bytes(limit)} "
            "(the stage was not stopped)")


def pinned_block(budget: Budget, pinned: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record's ``ledger.host_pinned`` object: the page-locked region's budget in the host's
    pool against the bytes the worker registered (``accelerator.pinned_region``).

    Not a gate: a region whose registration failed is not page-locked and holds nothing more
    than any shared region (its measured bytes are None, the state says why).
    """
    state = str((pinned or {}).get("state") or "unreported")
    got = (pinned or {}).get("bytes") if state == "registered" else None
    measured = int(got) if isinstance(got, int) and got > 0 else None
    return {"pool": budget.pool, "reservations": [r.to_dict() for r in budget.reservations],
            "budget_bytes": budget.budget_bytes, "measured_bytes": measured, "state": state,
            "budget_over_measured": budget.budget_bytes / measured if measured else None}
