"""``Setup``: what every candidate of one ``open_stage`` is tried with, in a module of its own.

``xstage.stage.admit`` tries each candidate with it and ``xstage.stage.crash`` reads it when a
candidate's worker dies; neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xstage import parity
from xstage.artifact import Artifact
from xstage.client import Deadlines
from xstage.device_table import DeviceReport
from xstage.stage.ledger import Ledger
from xstage.stage.request import Resolved, StageRequest
from xstage.stage.state import StatePair

__all__ = ["Setup"]


@dataclass(frozen=True)
class Setup:
    """What every candidate of one ``open_stage`` is tried with (resolved once, before the loop).

    Nothing in it changes while the candidates are tried: each candidate's outcome, and its
    record ``detail`` block, come back from :func:`attempt` as an :class:`Attempt`.

    Attributes:
        request: what the caller asked for (``xstage.stage.request.StageRequest``): the proof's
            bar, the gate's tolerance, the EP and session options, deadlines, the ledger.
        resolved: what resolving it found (the inputs' dtypes and shapes, the reference arm).
        artifact: the stage's artifact.
        feeds: the checked inputs (the warm-up and the gate run on them).
        reference: the reference arm (``xstage.stage.reference``).
        nodes: the graph's nodes (name, op type), for the ONNX proof; empty for torch.
        devices: the device table's rows (a discrete GPU's pool is read from them).
        started: when ``open_stage`` began (UTC, ISO 8601).
        depth: slot sets in the worker's region (requests in flight at once).
        state: the stage's state pairs (``xstage.stage.state``), kept in the worker;
            ``state_init`` their initial values.
        generation: the worker's generation (1, +1 for each restart); ``first_id`` its first
            request id (a restarted stage's ids continue).
        report: the device table the plan was made from: where the reference arm's route is
            found when a candidate's worker dies (``xstage.stage.crash``); None: not known.
        snapshots: the folder of each snapshot the stage reads (``xstage.snapshot``: the
            artifact's, a separate reference's), pinned while it is open.
        reference_calls: the reference arm's gate calls, computed before any candidate, and
            its second computation's self-agreement (``xstage.stage.gate.reference_runs``), or
            None: the gate computes them itself (a torch program; a reference worker that did
            not fit the pool then).
    """

    request: StageRequest
    resolved: Resolved
    artifact: Artifact
    feeds: Mapping[str, np.ndarray]
    reference: Any
    nodes: tuple[Mapping[str, str], ...]
    devices: tuple[Any, ...]
    started: str
    depth: int = 2
    concurrency: int = 1
    generation: int = 1
    first_id: int = 1
    state: tuple[StatePair, ...] = ()
    state_init: Mapping[str, np.ndarray] = field(default_factory=dict)
    report: DeviceReport | None = None
    snapshots: tuple[Path, ...] = ()
    reference_calls: tuple[list[dict[str, np.ndarray]], parity.Parity | None] | None = None

    @property
    def min_placement(self) -> float:
        """The fraction of the stage the target must take."""
        return self.request.min_placement

    @property
    def tolerance(self) -> float | Mapping[str, float] | None:
        """The gate's override: a number (rel_l2), a mapping of criteria, or None."""
        return self.request.gate_tolerance

    @property
    def ep_options(self) -> dict[str, str]:
        """The user's ``--ep-option`` values (they win over a route's hook), a fresh dict."""
        return self.request.ep_option_map()

    @property
    def session(self) -> dict[str, Any]:
        """The onnxruntime session options (threads, graph optimization level), a fresh dict."""
        return self.request.session_options()

    @property
    def deadlines(self) -> Deadlines | None:
        """Per-phase worker deadlines, or None for the defaults."""
        return self.request.deadlines

    @property
    def ledger(self) -> Ledger | None:
        """The memory ledger to hold the stage's budget in (None: the process-wide one)."""
        return self.request.ledger
