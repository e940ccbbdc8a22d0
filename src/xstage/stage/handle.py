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
from xstage.client import WorkerClient
from xstage.planner import Candidate, Plan
from xstage.record.build import build_record
from xstage.refusal import Refusal
from xstage.stage.ledger import Holding, Ledger
from xstage.timings import summarize

__all__ = ["Stage"]


class Stage:
    """An admitted stage: call it like a function; it knows where it ran and how well.

    Calls are serialized by the worker client's lock. After the worker dies every call
    raises ``StageClosed``; ``close()`` is idempotent and the stage is a context manager.
    """

    def __init__(self, *, client: WorkerClient, candidate: Candidate, artifact: Artifact,
                 plan: Plan, tried: list[tuple[Candidate, str, Refusal | None]],
                 proof: evidence.PlacementProof, parity_result: parity.Parity,
                 reference: Any, feeds: Mapping[str, np.ndarray],
                 request: Mapping[str, Any], started: str, notes: Sequence[str],
                 ledger: Ledger, holding: Holding, ledger_doc: dict[str, Any],
                 evidence_digest: str | None = None) -> None:
        self._client = client
        self._evidence_digest = evidence_digest
        self.candidate = candidate
        self.artifact = artifact
        self.plan = plan
        self.proof = proof
        self.parity = parity_result
        self.timings: dict[str, Any] | None = None
        self.notes = list(notes)
        self._tried = tried
        self._reference = reference
        self._feeds = feeds
        self._request = dict(request)
        self._started = started
        self._lock = threading.Lock()
        self._ledger = ledger
        self._holding: Holding | None = holding
        #: What the ledger holds for this stage while it is open.
        self.budget: ledger_mod.Budget = holding.budget
        self._ledger_doc = ledger_doc
        #: Things that went wrong after admission and did not stop the stage (a call whose
        #: peak passed the budget); they go into the record.
        self.warnings: list[str] = []

    @property
    def device(self) -> str:
        return self.candidate.device

    @property
    def route(self) -> str:
        return self.candidate.route.name

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
        limit = self._ledger_doc["budget_bytes"]
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
        self._client.close()
        self._ledger.release(self._holding)
        self._holding = None

    def measure(self, *, runs: int = 20, warmup: int = 3, compare_cpu: bool = False,
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Unprofiled warm-ups, then ``runs`` timed calls on the checked inputs."""
        if runs < 1 or warmup < 0:
            raise errors.UsageError("--runs must be >= 1 and --warmup >= 0")
        for _ in range(warmup):
            self._run(self._feeds)
        compute, round_trip = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            self._run(self._feeds)
            round_trip.append(time.perf_counter() - t0)
            compute.append(self._client.last_timing.get("worker_ns", 0) / 1e9)
            if progress:
                progress(i + 1)
        ref = self._reference.time(self._feeds, runs) if compare_cpu else None
        self.timings = summarize(compute, round_trip, warmup=warmup, reference_s=ref)
        self._request.update(runs=runs, warmup=warmup)
        return self.timings

    def record(self, *, argv: Sequence[str] = ()) -> dict[str, Any]:
        """The record of this stage so far (validated and written by ``xstage.record``)."""
        hello = self._client.hello or {}
        timing = self._client.last_timing
        return build_record(
            argv=argv, started=self._started, request=self._request, status="placed",
            exit_code=0, artifact=self.artifact, plan=self.plan, tried=self._tried,
            worker={"route": self.route, "interpreter": self._client.interpreter,
                    "hello": hello, "log": str(self._client.log_path) if self._client.log_path else None,
                    "notes": self.notes,
                    "runtime": dict((self._client.loaded or {}).get("info") or {}),
                    "evidence_sha256": self._evidence_digest},
            proof=self.proof.to_dict(), parity_doc=self.parity.to_dict(), timings=self.timings,
            memory={"rss_bytes": timing.get("rss"), "peak_bytes": timing.get("peak")},
            ledger={**self._ledger_doc, "warnings": list(self.warnings)},
        )
