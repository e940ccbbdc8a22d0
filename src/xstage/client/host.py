"""What the pipeline and the device slots ask of their worker client: public members only.

A protocol, not ``WorkerClient`` itself: ``client/worker.py`` builds the pipeline
(``client/pipeline.py``) and the device slots (``client/device_slots.py``), so naming the class
there, even for type checking alone, would close an import cycle (docs/architecture.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from xstage import errors
from xstage.client.deadlines import Deadlines
from xstage.client.outputs import Outputs
from xstage_remote import wire

__all__ = ["CallHost"]


class CallHost(Protocol):
    """A worker client as its call path sees it (``WorkerClient`` is one).

    ``link`` is its transport (``client/transport.py``; the shared region's where a region is
    attached); ``lock`` is held by whoever drives the worker.
    """

    route: str
    generation: int
    deadlines: Deadlines
    state: Any
    link: Any
    lock: threading.RLock
    last_timing: dict[str, int]
    close_requested: bool
    closed_why: str | None
    state_uncertain: Any
    reset_next: bool
    inputs: list[dict[str, Any]]
    tuning: Any

    @property
    def pid(self) -> int | None:
        """The worker's process id once spawned."""

    def take_id(self) -> int:
        """The next request id (ids never repeat in a stage)."""

    def take_reset(self) -> int:
        """``shm.FLAG_RESET_STATE`` when ``reset_state()`` asked for it (once), else 0."""

    def request(self, header: dict[str, Any], reply: str, phase: str,
                arrays: Mapping[str, np.ndarray] | None = None) -> wire.Frame:
        """One frame each way, the reply checked (``expect``)."""

    def recv(self, phase: str, seconds: float | None, *, fresh: bool = True) -> wire.Frame:
        """Read one frame within ``seconds``."""

    def expect(self, frame: wire.Frame, op: str, rid: int) -> wire.Frame:
        """``frame`` checked as the reply ``op`` to request ``rid`` (``WorkerRaised`` if not)."""

    def call_inline(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
                    phase: str, flags: int) -> Outputs:
        """A synchronous call as one frame each way, nothing queued or in flight."""

    def call_timeout(self, phase: str, seconds: float | None) -> None:
        """End the worker and raise the phase's timeout."""

    def abort(self) -> None:
        """Kill the worker's process group, reap it, release the transport."""

    def died(self) -> errors.WorkerDied:
        """``WorkerDied`` for a worker found dead (it is reaped and released)."""

    def death_of(self, how: str, *, exit_status: int | None, log_tail: str) -> errors.WorkerDied:
        """``WorkerDied`` naming this worker and how it ended."""

    def closed_under_call(self) -> errors.StageClosed:
        """``StageClosed`` for a call that ``close()`` from another thread ended."""

    def state_settled(self, req: Any) -> None:
        """The interrupted request ``req`` never ran: the state stands."""

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the worker wrote."""
