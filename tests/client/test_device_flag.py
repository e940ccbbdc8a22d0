"""The device-tensor call's plumbing without a GPU (docs/torch.md, "Device tensors in, device
tensors out"): the ``device_slots`` frame and a request flagged ``FLAG_DEVICE_TENSORS`` reach a
real worker, which refuses both by name when it has no device slots (an ONNX worker), and serves
host calls after."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from xstage import errors
from xstage.client import WorkerClient
from xstage_remote import shm


class _FlagOnly:
    """A stand-in for ``DeviceSlots`` that writes the host inputs but flags a device request."""

    def __init__(self) -> None:
        self.on_device: dict[int, bool] = {}

    def takes(self, inputs):
        return False  # host arrays: checked as usual

    def holds(self, s, feeds):
        self.on_device[s] = True
        return True

    def write(self, feeds, s):
        return shm.FLAG_DEVICE_TENSORS


def test_a_worker_without_device_slots_refuses_the_frame_and_the_flag(graphs):
    x = np.ones((8, 256), np.float32)
    with WorkerClient(sys.executable) as w:
        w.load(graphs["mlp"])
        with pytest.raises(errors.WorkerRaised, match="torch runtime"):
            w.request({"op": "device_slots"}, "device_slots_ready", "call")
        w.pipeline.device = _FlagOnly()  # type: ignore[assignment]
        with pytest.raises(errors.WorkerRaised, match="worker without device slots"):
            w.run({"x": x})  # the synchronous path
        with pytest.raises(errors.WorkerRaised, match="worker without device slots"):
            w.submit({"x": x}).result(timeout=60)  # the queued path
        w.pipeline.device = None
        assert w.run({"x": x})["y"].shape[0] == 8  # and the worker still serves
