"""The record's ``request`` block: what the caller asked for, built once, by the API.

Every record (placed, refused, error) carries this block; the CLI only adds the timing plan
(``runs``, ``warmup``) it asked ``Stage.measure`` for. The keys are the union of what the API
and the CLI wrote before they shared this builder, so older records keep their shape.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xstage import errors
from xstage.parity import CRITERIA

__all__ = ["build_request", "check_criteria", "describe_feeds"]


def build_request(
    *,
    device: str | None,
    prefer: Sequence[str] | None,
    route: str | None,
    offload: bool,
    min_placement: float,
    tolerance: float | Mapping[str, float] | None,
    ep_options: Mapping[str, str] | None,
    threads: int | None,
    graph_opt_level: str | None,
    inputs: object,
    seed: int,
) -> dict[str, Any]:
    """The request block before the inputs are resolved (``tensors`` empty until then).

    Raises:
        UsageError: a tolerance mapping names an unknown criterion or an invalid value.
    """
    from_file = isinstance(inputs, str | os.PathLike)
    criteria = check_criteria(tolerance) if isinstance(tolerance, Mapping) else None
    rel_l2 = criteria.get("rel_l2") if criteria is not None else tolerance
    return {
        **({"tolerance_criteria": criteria} if criteria is not None else {}),
        "device": device, "prefer": list(prefer) if prefer else None, "route": route,
        "offload": offload, "min_placement": min_placement, "tolerance": rel_l2,
        "ep_options": dict(ep_options or {}), "threads": threads,
        "graph_opt_level": graph_opt_level, "runs": 0, "warmup": 0,
        "inputs": {
            "source": "synthesized" if inputs is None else ("npz" if from_file else "caller"),
            "path": str(inputs) if from_file else None,
            "seed": seed if inputs is None else None,
            "tensors": {},
        },
    }


def check_criteria(tolerance: Mapping[str, float]) -> dict[str, float]:
    """A tolerance mapping checked before anything starts: known criteria, sane values.

    Raises:
        UsageError: an unknown criterion (the message lists the known ones), a value that is
            not a finite number, a negative one, a cosine outside [-1, 1] or elem above 1.
    """
    out: dict[str, float] = {}
    for key, value in tolerance.items():
        if key not in CRITERIA:
            raise errors.UsageError(f"--tolerance: unknown criterion {key!r}",
                                    remedy=f"name one of {', '.join(CRITERIA)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise errors.UsageError(f"--tolerance {key}={value!r} is not a finite number")
        low, high = (-1.0, 1.0) if key == "cosine" else (0.0, 1.0 if key == "elem" else math.inf)
        if not low <= value <= high:
            raise errors.UsageError(f"--tolerance {key}={value!r} is outside [{low:g}, {high:g}]")
        out[key] = float(value)
    return out


def describe_feeds(request: dict[str, Any], feeds: Mapping[str, np.ndarray]) -> None:
    """Record the resolved inputs' dtypes and shapes in ``request`` (in place)."""
    request["inputs"]["tensors"] = {
        name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in feeds.items()}
