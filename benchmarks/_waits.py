"""The doorbell decisions made between two ``WorkerClient.waits()`` readings (benchmarks' helper)."""

from __future__ import annotations


def waits_delta(after: dict, before: dict) -> dict:
    """Per side, the rule and outcome counts that grew from ``before`` to ``after`` (zeros left out)."""
    delta = {}
    for side, now in after.items():
        then = before.get(side, {})
        side_delta = {}
        for key in ("rules", "outcomes"):
            counts = {k: v - then.get(key, {}).get(k, 0) for k, v in now.get(key, {}).items()}
            side_delta[key] = {k: v for k, v in counts.items() if v}
        delta[side] = side_delta
    return delta
