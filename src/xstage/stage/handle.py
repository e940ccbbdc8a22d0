"""``Stage``: an admitted stage, called like a function; it knows where it ran and how well."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from xstage import errors, evidence, parity
from xstage import ledger as ledger_mod
from xstage.artifact import Artifact
from xstage.planner import Candidate, Plan
from xstage.record.build import build_record
from xstage.refusal import Refusal
from xstage.stage.admit import Admission
from xstage.stage.ledger import Holding
from xstage.timings import summarize

__all__ = ["Stage"]


class Stage:
    """An admitted stage: call it like a function; it knows where it ran and how well.

    Built by ``open_stage`` from an ``Admission`` (the candidate that passed every gate) and
    the plan it came from. Calls are serialized by the worker client's lock. After the worker
    dies every call raises ``StageClosed``; ``close()`` is idempotent and the stage is a
    context manager.
    """

    def __init__(self, admission: Admission, *, plan: Plan,
                 tried: Sequence[tuple[Candidate, str, Refusal | None]]) -> None:
        self._admission = admission
        self._client = admission.client
        self._ledger = admission.ledger
        self._holding: Holding | None = admission.holding
        self._request = dict(admission.setup.request)
        self._lock = threading.Lock()
        self.candidate: Candidate = admission.candidate
        self.artifact: Artifact = admission.setup.artifact
        self.plan = plan
        self.proof: evidence.PlacementProof = admission.proof
        self.parity: parity.Parity = admission.parity
        self.notes = list(admission.notes)
        self.tried = list(tried)
        #: What the ledger holds for this stage while it is open.
        self.budget: ledger_mod.Budget = admission.holding.budget
        self.timings: dict[str, Any] | None = None
        #: Things that went wrong after admission and did not stop the stage (a call whose
        #: peak passed the budget); they go into the record.
        self.warnings: list[str] = []

    @property
    def device(self) -> str:
        """The device the stage runs on (``gpu_integrated:amd``, ``cpu``, …)."""
        return self.candidate.device

    @property
    def route(self) -> str:
        """The route that drives it (``ort-openvino``, ``torch-cuda``, …)."""
        return self.candidate.route.name

    @property
    def inputs(self) -> Mapping[str, np.ndarray]:
        """The checked inputs the stage was admitted on (the warm-up and the gate ran them)."""
        return self._admission.setup.feeds

    @property
    def last_timing(self) -> Mapping[str, int]:
        """The last call's timing from the worker (``worker_ns``, copies, ``peak``, …)."""
        return self._client.last_timing

    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid (None once it is gone)."""
        return self._client.pid

    def waits(self) -> dict[str, Any]:
        """The shared region's spin-or-block decisions so far, on both sides (``--verbose``).

        Returns:
            ``WorkerClient.waits()``: ``{"caller": …, "worker": …}``, counts by rule and by
            outcome with a ``line`` in words; empty for a side without a shared region.
        """
        return self._client.waits()

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Outputs by name in graph order; a dtype or shape mismatch raises ``InputError``."""
        return self._run(inputs)

    def _run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        try:
            out = self._client.run(inputs)
        except (errors.WorkerDied, errors.StageClosed):
            self._ledger.release(self._holding)  # its memory went with its worker
            self._holding = None
            raise
        peak = self._client.last_timing.get("peak")
        limit = self._admission.ledger_doc["budget_bytes"]
        if peak and peak > limit and not self.warnings:
            self.warnings.append(
                f"a call's peak {ledger_mod.format_bytes(peak)} passed the budget of "
                f"{ledger_mod.format_bytes(limit)} (the stage was not stopped)")
        return out

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker and give the stage's budget back to the ledger (idempotent)."""
        self._client.close()
        self._ledger.release(self._holding)
        self._holding = None

    def measure(self, *, runs: int = 20, warmup: int = 3, compare_cpu: bool = False,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Unprofiled warm-ups, then ``runs`` timed calls on the checked inputs.

        Raises:
            UsageError: ``runs`` < 1 or ``warmup`` < 0.
        """
        if runs < 1 or warmup < 0:
            raise errors.UsageError("--runs must be >= 1 and --warmup >= 0")
        feeds = self.inputs
        for _ in range(warmup):
            self._run(feeds)
        compute, round_trip = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            self._run(feeds)
            round_trip.append(time.perf_counter() - t0)
            compute.append(self._client.last_timing.get("worker_ns", 0) / 1e9)
            if progress:
                progress(i + 1)
        reference = self._admission.setup.reference
        ref = reference.time(feeds, runs) if compare_cpu else None
        self.timings = summarize(compute, round_trip, warmup=warmup, reference_s=ref)
        self._request.update(runs=runs, warmup=warmup)
        return self.timings

    def record(self, *, argv: Sequence[str] = ()) -> dict[str, Any]:
        """The record of this stage so far (validated and written by ``xstage.record``)."""
        client, timing = self._client, self._client.last_timing
        worker = {"route": self.route, "interpreter": client.interpreter,
                  "hello": client.hello or {},
                  "log": str(client.log_path) if client.log_path else None, "notes": self.notes,
                  "runtime": dict((client.loaded or {}).get("info") or {}),
                  "evidence_sha256": self._admission.warm.worker["evidence_sha256"]}
        return build_record(
            argv=argv, started=self._admission.setup.started, request=self._request,
            status="placed", artifact=self.artifact, plan=self.plan,
            tried=self.tried, worker=worker, proof=self.proof.to_dict(),
            parity_doc=self.parity.to_dict(), timings=self.timings,
            memory={"rss_bytes": timing.get("rss"), "peak_bytes": timing.get("peak")},
            ledger={**self._admission.ledger_doc, "warnings": list(self.warnings)},
            device_attestation=(self._admission.attestation.to_dict()
                                if self._admission.attestation else None))
