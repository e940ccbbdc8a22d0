"""``settle_tiebreak``'s rules on the float64 answer itself: finiteness and ill-conditioning.

Pure: arrays in, a verdict out. Each test builds the three arms (stage, reference, float64
answer) by hand so the truth is known.
"""

from __future__ import annotations

import numpy as np

from xstage.parity import compare, settle_tiebreak

FMT = {"fmt": "onnx:fp32", "reference_kind": "same_graph_cpu"}


def _arms(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A float64 answer and an fp32 reference one rounding from it."""
    x = np.random.default_rng(seed).standard_normal(n)
    return x, x.astype(np.float32)


def _reordered(x: np.ndarray, seed: int) -> np.ndarray:
    """An fp32 arm 2e-6·rms from ``x`` (a deep graph's reordering: beyond rule 8's a = 1e-7)."""
    return (x + 2e-6 * np.random.default_rng(seed).standard_normal(x.size)).astype(np.float32)


def test_no_finite_element_of_the_answer_is_unavailable_never_a_pass():
    """Every float64 element NaN (docs/external.md §4, "Finite positions only"): the stage,
    computed in bf16-sized error, would pass on zero compared elements; now the tie-break is
    unavailable."""
    x, r = _arms()
    y = (r * np.float32(1 + 4e-3)).astype(np.float32)
    gate = compare({"y": y}, {"y": r}, **FMT)
    assert gate.verdict == "failed"
    settled = settle_tiebreak(gate, {"y": y}, {"y": r}, {"y": np.full_like(x, np.nan)})
    assert settled.verdict == "failed"
    assert settled.tiebreak["status"] == "unavailable"
    assert settled.tiebreak["reason_code"] == "no_finite_answer"
    assert "no finite element" in settled.tiebreak["reason"]


def test_positions_where_the_answer_is_nonfinite_are_left_out():
    """Half the answer NaN: the rest decides. A stage as exact as the reference passes; one 1%
    off fails; the record counts what was left out."""
    x, _ = _arms()
    r, y_ok = _reordered(x, 1), _reordered(x, 2)
    x = x.copy()
    x[::2] = np.nan
    gate = compare({"y": y_ok}, {"y": r}, **FMT)
    assert gate.verdict == "failed"
    passed = settle_tiebreak(gate, {"y": y_ok}, {"y": r}, {"y": x})
    (row,) = passed.tiebreak["outputs"]
    assert passed.passed and row["left_out"] == 256 and row["compared"] == 256
    y_bad = r * np.float32(1.01)
    failed = settle_tiebreak(compare({"y": y_bad}, {"y": r}, **FMT), {"y": y_bad}, {"y": r}, {"y": x})
    assert failed.verdict == "failed" and failed.tiebreak["status"] == "failed"


def test_stage_and_reference_disagreeing_on_finiteness_where_the_answer_is_finite_fail():
    """Where float64 is finite, a stage Inf beside a finite reference fails the tie-break,
    even with every other element exact."""
    x, _ = _arms()
    r, y = _reordered(x, 1), _reordered(x, 2)  # a float failure, so the tie-break is asked at all
    y[5] = np.inf
    r2 = r.copy()
    r2[5] = np.inf  # the gate saw both Inf (rule 5 matched); the answer is finite there
    gate = compare({"y": y}, {"y": r2}, **FMT)
    assert gate.verdict == "failed" and gate.cause != "nonfinite"
    r3 = r.copy()  # and a reference finite where the stage is not, handed to the tie-break
    settled = settle_tiebreak(gate, {"y": y}, {"y": r3}, {"y": x})
    (row,) = settled.tiebreak["outputs"]
    assert row["finiteness_disagrees"] == 1 and not row["passed"]
    assert settled.verdict == "failed"
    assert "disagree on finiteness at 1 positions" in settled.summary


def test_an_ill_conditioned_output_says_so_and_prints_both_distances():
    """The reference arm itself 2% from float64 (beyond fp32's rel_l2 1e-4 and max_abs bound):
    the row is ill_conditioned; a stage as far passes (within the slack), a stage 100x as far
    fails, and the summary carries both distances."""
    x, _ = _arms()
    rng = np.random.default_rng(1)
    r = (x + 0.02 * rng.standard_normal(x.size)).astype(np.float32)
    y = (x + 0.02 * rng.standard_normal(x.size)).astype(np.float32)
    gate = compare({"y": y}, {"y": r}, **FMT)
    settled = settle_tiebreak(gate, {"y": y}, {"y": r}, {"y": x})
    (row,) = settled.tiebreak["outputs"]
    assert settled.passed and row["ill_conditioned"] and settled.tiebreak["ill_conditioned"] == ["y"]
    assert "ill-conditioned" in settled.summary
    distances = f"stage rel_l2 {row['stage_rel_l2']:.1e} vs reference {row['reference_rel_l2']:.1e}"
    assert distances in settled.summary
    far = (x + 2.0 * rng.standard_normal(x.size)).astype(np.float32)
    refused = settle_tiebreak(compare({"y": far}, {"y": r}, **FMT), {"y": far}, {"y": r}, {"y": x})
    assert refused.verdict == "failed" and refused.tiebreak["outputs"][0]["ill_conditioned"]


def test_a_well_conditioned_output_is_not_flagged():
    x, _ = _arms()
    r, y = _reordered(x, 1), _reordered(x, 2)
    settled = settle_tiebreak(compare({"y": y}, {"y": r}, **FMT), {"y": y}, {"y": r}, {"y": x})
    assert settled.passed and settled.tiebreak["ill_conditioned"] == []
    assert "ill-conditioned" not in settled.summary
