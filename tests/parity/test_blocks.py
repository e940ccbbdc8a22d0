"""A large output is judged block by block (``parity.BLOCK``): the same verdict and figures as
one whole-array comparison, and float64 temporaries of a few blocks, not of the output."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc

import numpy as np
import pytest

from xstage import parity


def _pair(n: int, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(n).astype(np.float32) * 3
    y = (r + rng.standard_normal(n).astype(np.float32) * noise).astype(np.float32)
    for arr in (y, r):  # nonfinite values at the same positions, kind for kind
        arr[[5, 400, 901]] = [np.nan, np.inf, -np.inf]
    return y, r


@pytest.mark.parametrize(("noise", "shape"), [(1e-7, (1000,)), (1e-3, (10, 100)),
                                              (0.5, (1000,)), (0.0, (4, 250))])
def test_blocks_judge_as_the_whole_array(monkeypatch, noise: float, shape: tuple[int, ...]):
    """Blocks of 7 elements against one block: every count, rule and verdict the same, every
    figure within float64 rounding, the worst element at the same place."""
    y, r = (a.reshape(shape) for a in _pair(1000, 3, noise))
    y.reshape(-1)[77] += 40  # one far element: the element-wise rule has a worst to name
    whole = parity.compare({"o": y}, {"o": r}, fmt="onnx:fp16", reference_kind="fp32_source")
    monkeypatch.setattr(parity, "BLOCK", 7)
    blocks = parity.compare({"o": y}, {"o": r}, fmt="onnx:fp16", reference_kind="fp32_source")
    assert blocks.verdict == whole.verdict
    (a,), (b,) = whole.outputs, blocks.outputs
    for f in dataclasses.fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, float) and not math.isnan(va):
            assert vb == pytest.approx(va, rel=1e-12, abs=1e-300), f.name
        elif f.name != "criterion":
            assert va == vb, f.name
    assert a.criterion.split(": |y−r|")[0] == b.criterion.split(": |y−r|")[0]


def test_integers_in_blocks(monkeypatch):
    y = np.arange(1000, dtype=np.int64)
    r = y.copy()
    r[[3, 999]] += [5, -9]
    whole = parity.compare({"o": y}, {"o": r}, fmt="onnx:fp32", reference_kind="fp32_source")
    monkeypatch.setattr(parity, "BLOCK", 7)
    blocks = parity.compare({"o": y}, {"o": r}, fmt="onnx:fp32", reference_kind="fp32_source")
    assert whole.outputs == blocks.outputs and blocks.outputs[0].max_abs == 9.0


def test_a_large_output_is_compared_in_little_memory():
    """8 Mi float32 elements (32 MiB a side): the comparison's traced peak stays under 64 MiB
    (before: about 500 MiB of float64 copies, masks and differences of the whole output)."""
    y, r = _pair(8 << 20, 1, 1e-6)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = parity.compare({"o": y}, {"o": r}, fmt="onnx:fp32", reference_kind="fp32_source")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert result.outputs[0].size == 8 << 20 and result.outputs[0].nan_count == 1
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB"
