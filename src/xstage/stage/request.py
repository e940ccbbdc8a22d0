"""The record's ``request`` block: what the caller asked for, built once, by the API.

Every record (placed, refused, error) carries this block; the CLI only adds the timing plan
(``runs``, ``warmup``) it asked ``Stage.measure`` for. The keys are the union of what the API
and the CLI wrote before they shared this builder, so older records keep their shape.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["build_request", "describe_feeds"]


def build_request(
    *,
    device: str | None,
    prefer: Sequence[str] | None,
    route: str | None,
    offload: bool,
    min_placement: float,
    tolerance: float | None,
    ep_options: Mapping[str, str] | None,
    threads: int | None,
    graph_opt_level: str | None,
    inputs: object,
    seed: int,
) -> dict[str, Any]:
    """The request block before the inputs are resolved (``tensors`` empty until then)."""
    from_file = isinstance(inputs, str | os.PathLike)
    return {
        "device": device, "prefer": list(prefer) if prefer else None, "route": route,
        "offload": offload, "min_placement": min_placement, "tolerance": tolerance,
        "ep_options": dict(ep_options or {}), "threads": threads,
        "graph_opt_level": graph_opt_level, "runs": 0, "warmup": 0,
        "inputs": {
            "source": "synthesized" if inputs is None else ("npz" if from_file else "caller"),
            "path": str(inputs) if from_file else None,
            "seed": seed if inputs is None else None,
            "tensors": {},
        },
    }


def describe_feeds(request: dict[str, Any], feeds: Mapping[str, np.ndarray]) -> None:
    """Record the resolved inputs' dtypes and shapes in ``request`` (in place)."""
    request["inputs"]["tensors"] = {
        name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in feeds.items()}
