"""The numeric gate's reference for torch stages: the fp32 program on ``torch-cpu``.

The client has no torch of its own (a torch is ~1 GB, and the route's interpreter already
has one), so the reference runs in a ``torch-cpu`` worker, started when the gate needs it and
closed at once. Same interface as the in-process ONNX reference: ``outputs`` and ``time``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from xstage import errors
from xstage.device_table import DeviceReport
from xstage.launch import load_options, open_worker

__all__ = ["TorchReference"]


class TorchReference:
    def __init__(self, report: DeviceReport, path: Path, kind: str,
                 output_names: Sequence[str]) -> None:
        self.path, self.kind = path, kind
        self._report = report
        self._names = list(output_names)
        self._outputs: dict[str, np.ndarray] | None = None

    def _worker(self):  # type: ignore[no-untyped-def]
        status = self._report.route("torch-cpu")
        if not status.resolved:
            raise errors.RouteMissing(
                f"the numeric gate of a torch stage runs its fp32 program on torch-cpu, which "
                f"is missing here: {status.reason}",
                reason_code=status.reason_code.value if status.reason_code else "unknown",
                remedy=status.remedy or "set XSTAGE_PYTHON_TORCH_CPU to an interpreter with torch")
        client = open_worker(status)
        try:
            client.load(self.path, runtime="torch",
                        options=load_options(status, output_names=self._names))
        except BaseException:
            client.close()
            raise
        return client

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._outputs is None:
            client = self._worker()
            try:
                self._outputs = client.run(feeds)
            finally:
                client.close()
        return self._outputs

    def time(self, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
        client = self._worker()
        try:
            client.run(feeds)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                client.run(feeds)
                times.append(time.perf_counter() - t0)
            return times
        finally:
            client.close()
