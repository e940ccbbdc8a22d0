"""The gate of docs/external.md §4: rule 8 (element-wise), criteria by name, declared shapes, the
tie-break's pure half. Every array here is computed (bf16 through ml_dtypes rounding, the way a bf16
kernel stores its result), not written by hand.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xstage.parity import (
    CRITERIA,
    DEFAULT_TOLERANCES,
    TIEBREAK_SLACK,
    compare,
    magnitude_bands,
    settle_tiebreak,
    tiebreak_applies,
    tiebreak_unavailable,
)

FP32 = {"fmt": "onnx:fp32", "reference_kind": "same_graph_cpu"}


def _bf16(a: np.ndarray) -> np.ndarray:
    """``a`` stored in bfloat16 and read back as float32 (8 mantissa bits, 2^-9 rounding)."""
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _block_beside_large_values(block_scale: float, fraction: float = 0.01, n: int = 20000):
    rng = np.random.default_rng(3)
    r = (rng.standard_normal(n) * 1e4).astype(np.float32)  # exact values of scale 1e4
    k = int(n * fraction)
    r[:k] = (rng.standard_normal(k) * block_scale).astype(np.float32)
    y = r.copy()
    y[:k] = _bf16(r[:k])  # the block computed (stored) in bf16
    return y, r, k


def test_a_wrong_block_of_one_percent_beside_large_exact_values_fails_at_the_defaults():
    """1% of the elements in bf16 (scale 1e2) beside exact values of scale 1e4.

    The norm hides it (rel_l2 ~1e-6, rule 7 passes); rule 8 counts the elements outside
    1e-7·rms + 1e-4·|r| and B = 0 refuses them, naming the worst one.
    """
    y, r, k = _block_beside_large_values(1e2)
    parity = compare({"boxes": y}, {"boxes": r}, **FP32)
    (m,) = parity.outputs
    assert m.rel_l2 < 1e-4  # rule 7 alone would pass it
    assert parity.verdict == "failed" and parity.cause == "elementwise" and m.rule == "elementwise"
    assert 0 < m.n_bad <= k and m.n_allowed == 0
    assert m.criterion.startswith(f"elementwise: {m.n_bad} of {r.size} elements outside")
    worst = int(m.criterion.split("worst at [")[1].split("]")[0])
    assert worst < k  # the worst element is in the block


def test_the_headline_block_fails_at_the_defaults():
    """The headline case (docs/external.md §4): 1% in bf16 at scale 1 beside exact values of scale 1e4.

    Its errors (up to ~1e-2) sit under 1e-5·rms, the old a; rule 8 at a = 1e-7 refuses them,
    and the float64 tie-break (here the exact values themselves) does not overturn it: in the
    block's own magnitude band the stage is off by bf16 rounding, the reference not at all.
    """
    y, r, k = _block_beside_large_values(1.0)
    gate = compare({"y": y}, {"y": r}, **FP32)
    (m,) = gate.outputs
    assert gate.cause == "elementwise" and 0 < m.n_bad <= k
    assert compare({"y": y}, {"y": r}, **FP32, tolerance={"elem_a": 1e-5}).passed  # the old a
    assert tiebreak_applies(gate) is None
    settled = settle_tiebreak(gate, {"y": y}, {"y": r}, {"y": r.astype(np.float64)})
    (row,) = settled.tiebreak["outputs"]
    assert settled.verdict == "failed" and settled.tiebreak["status"] == "failed"
    assert row["worst_band"]["magnitude"][1] < 8 and row["worst_band"]["ratio"] > 1000


def _noisy_fp32(x: np.ndarray, seed: int, depth_noise: float) -> np.ndarray:
    """``x`` as an fp32 arm computes it: rounded, plus reordering noise of ``depth_noise``·rms
    spread over every element (independent per arm), as a deep graph's noise is."""
    rng = np.random.default_rng(seed)
    rms = float(np.sqrt(np.mean(x * x)))
    return (x + rng.standard_normal(x.shape) * depth_noise * rms).astype(np.float32)


def test_the_headline_block_fails_beside_large_values_with_deep_fp32_noise():
    """The same block beside large values that carry a deep graph's fp32 noise (1e-6·rms, the
    towers measured here reach 1.6e-6 rel_l2): a global norm or max from float64 no longer
    tells the block apart (the large values' errors are ~1e-2 too), its magnitude band does.
    Without the block, the same noise passes: both arms are equally far from float64."""
    rng = np.random.default_rng(5)
    n, k = 20000, 200
    exact = rng.standard_normal(n) * 1e4
    exact[:k] = rng.standard_normal(k)  # the small path, computed exactly enough in fp32
    ref = _noisy_fp32(exact, 1, 1e-6)
    ref[:k] = exact[:k].astype(np.float32)
    stage = _noisy_fp32(exact, 2, 1e-6)
    stage[:k] = exact[:k].astype(np.float32)
    clean = compare({"y": stage}, {"y": ref}, **FP32)
    assert clean.cause == "elementwise"  # deep noise goes to the tie-break at a = 1e-7 ...
    assert settle_tiebreak(clean, {"y": stage}, {"y": ref}, {"y": exact}).passed  # ... which passes it
    blocked = stage.copy()
    blocked[:k] = _bf16(stage[:k])
    gate = compare({"y": blocked}, {"y": ref}, **FP32)
    assert gate.cause == "elementwise"
    settled = settle_tiebreak(gate, {"y": blocked}, {"y": ref}, {"y": exact})
    (row,) = settled.tiebreak["outputs"]
    assert settled.verdict == "failed"
    assert row["stage_max_abs"] < TIEBREAK_SLACK * row["reference_max_abs"]  # a max would pass it
    assert row["stage_rel_l2"] < TIEBREAK_SLACK * row["reference_rel_l2"]  # so would the norm


def test_a_tiny_scale_output_computed_in_bf16_fails():
    """An output of scale 1e-8 from bf16 inputs and weights: rule 7's floor (4.8e-7) would pass
    it at any precision; rule 8 has no absolute scale under which everything passes."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    r = (x @ w * np.float32(1e-8)).astype(np.float32)
    y = _bf16(_bf16(x) @ _bf16(w) * np.float32(1e-8))
    parity = compare({"y": y}, {"y": r}, **FP32)
    (m,) = parity.outputs
    assert m.max_abs < 4.8e-7 and "floor 4·eps(float32)" in m.criterion  # rule 7 passed on the floor
    assert parity.cause == "elementwise" and m.n_bad > 0


def test_fp32_reorderings_go_to_the_tiebreak_and_pass_it():
    """A float32 matmul in another summation order moves every element a little: rule 8 at
    a = 1e-7 sends it to float64, where the stage is as close as the reference; the old a
    (1e-5) passed it outright."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 256)) / 22).astype(np.float32)
    r = x @ w
    y = np.zeros_like(r)
    for i in range(0, 512, 64):  # blocked accumulation
        y += x[:, i:i + 64] @ w[i:i + 64]
    assert not np.array_equal(y, r)
    assert compare({"y": y}, {"y": r}, **FP32, tolerance={"elem_a": 1e-5}).passed
    gate = compare({"y": y}, {"y": r}, **FP32)
    assert gate.cause == "elementwise" and tiebreak_applies(gate) is None
    exact = x.astype(np.float64) @ w.astype(np.float64)
    settled = settle_tiebreak(gate, {"y": y}, {"y": r}, {"y": exact})
    assert settled.passed and settled.tiebreak["outputs"][0]["worst_band"]["ratio"] < 4


def test_magnitude_bands_partition_by_octave_with_a_minimum_size():
    x = np.concatenate([np.full(100, 3.0), np.full(10, 0.3), np.full(70, 0.01), np.zeros(5)])
    bands = magnitude_bands(x, min_size=64)
    assert sorted(np.concatenate(bands).tolist()) == list(range(x.size))
    assert [b.size for b in bands] == [100, 85]  # 0.3's short octave joins the smaller ones
    assert [b.size for b in magnitude_bands(x[:20], min_size=64)] == [20]
    assert magnitude_bands(np.zeros(3))[0].size == 3


@pytest.mark.parametrize("fmt,kind", sorted(DEFAULT_TOLERANCES))
def test_every_default_has_rule_8_fields_and_b_zero_for_float_formats(fmt, kind):
    tol = DEFAULT_TOLERANCES[(fmt, kind)]
    assert tol.elem_a > 0 and tol.elem_rtol > 0
    if "a16w8" not in fmt and "a8w8" not in fmt:  # quantized formats allow B > 0
        assert tol.elem == 0.0


def test_criteria_by_name_tighten_and_loosen():
    """`--tolerance rel_l2=X,abs_rms=Y,cosine=Z,elem=B`: any subset, both directions apply."""
    r = np.linspace(0.1, 1.0, 1000).astype(np.float32)
    y = r * np.float32(1 + 2e-5)  # rel_l2 2e-5: passes the fp32 defaults
    assert compare({"y": y}, {"y": r}, **FP32).passed
    tighter = compare({"y": y}, {"y": r}, **FP32, tolerance={"rel_l2": 1e-6, "abs_rms": 1e-6})
    assert tighter.verdict == "failed" and tighter.non_default == ("rel_l2", "abs_rms")
    assert tighter.tolerance.min_cosine == 0.999  # the rest keep their defaults

    bad = r.copy()
    bad[:5] *= np.float32(1.001)  # 5 of 1000 elements 0.1% off: rule 8 refuses at B = 0
    assert compare({"y": bad}, {"y": r}, **FP32).cause == "elementwise"
    looser = compare({"y": bad}, {"y": r}, **FP32, tolerance={"elem": 5e-3, "rel_l2": 1e-3})
    assert looser.passed and looser.outputs[0].n_bad == 5 and looser.outputs[0].n_allowed == 5
    assert looser.to_dict()["non_default"] == ["rel_l2", "elem"]
    cos = compare({"y": y}, {"y": r}, **FP32, tolerance={"cosine": 1.0})
    assert cos.tolerance.min_cosine == 1.0 and cos.non_default == ("cosine",)


def test_unknown_or_invalid_criteria_are_refused():
    r = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="unknown tolerance criteria bogus"):
        compare({"y": r}, {"y": r}, **FP32, tolerance={"bogus": 1.0})
    with pytest.raises(ValueError, match="elem"):
        compare({"y": r}, {"y": r}, **FP32, tolerance={"elem": 2.0})
    assert set(CRITERIA) == {"rel_l2", "abs_rms", "cosine", "elem", "elem_a", "elem_rtol"}


def test_a_declared_shape_the_stage_does_not_return_fails_naming_the_output():
    """A 0-d output returned as (1,) by both arms: equal to each other, wrong against the
    declaration (torch's 0-d bug hid exactly so)."""
    one = np.array([3.0], np.float32)
    parity = compare({"total": one, "y": np.ones((2, 3), np.float32)},
                     {"total": one.copy(), "y": np.ones((2, 3), np.float32)}, **FP32,
                     declared={"total": (), "y": ("batch", 3)})
    bad = {m.name: m for m in parity.failed_outputs}
    assert list(bad) == ["total"] and bad["total"].rule == "declared_shape"
    assert "the artifact declares total as ()" in bad["total"].criterion
    assert parity.cause == "tolerance"
    ok = compare({"total": np.array(3.0, np.float32)}, {"total": np.array(3.0, np.float32)},
                 **FP32, declared={"total": ()})
    assert ok.passed


def _ill_conditioned():
    """x − mean(x) over values of 1000 ± 1e-3: two fp32 means, both off the float64 answer."""
    rng = np.random.default_rng(0)
    x = (1000 + rng.standard_normal((4, 1000)) * 1e-3).astype(np.float32)
    exact = x.astype(np.float64) - x.astype(np.float64).mean(axis=1, keepdims=True)
    stage = x - x.mean(axis=1, keepdims=True, dtype=np.float32)
    ref = x - (x @ np.full((1000, 1), 1 / 1000, np.float32))
    return stage, ref, exact


def test_the_tiebreak_passes_a_stage_as_close_to_float64_as_the_reference():
    stage, ref, exact = _ill_conditioned()
    gate = compare({"y": stage}, {"y": ref}, **FP32)
    assert gate.verdict == "failed" and tiebreak_applies(gate) is None
    settled = settle_tiebreak(gate, {"y": stage}, {"y": ref}, {"y": exact})
    (row,) = settled.tiebreak["outputs"]
    assert row["stage_rel_l2"] <= TIEBREAK_SLACK * row["reference_rel_l2"]
    assert settled.passed and settled.cause is None and settled.tiebreak["status"] == "passed"
    assert settled.summary.startswith("passed by the float64 tie-break")


def test_the_tiebreak_fails_a_stage_further_from_float64():
    """The ill-conditioned output computed in float16: far further from float64 than fp32."""
    stage, ref, exact = _ill_conditioned()
    rng = np.random.default_rng(0)
    x16 = (1000 + rng.standard_normal((4, 1000)) * 1e-3).astype(np.float16).astype(np.float32)
    low = x16 - x16.mean(axis=1, keepdims=True)
    gate = compare({"y": low}, {"y": ref}, **FP32)
    settled = settle_tiebreak(gate, {"y": low}, {"y": ref}, {"y": exact})
    assert settled.verdict == "failed" and settled.tiebreak["status"] == "failed"
    assert "float64 tie-break failed" in settled.summary


def test_the_tiebreak_does_not_apply_to_facts_or_a16w8():
    r = np.ones((2, 2), np.float32)
    shape = compare({"y": r[:1]}, {"y": r}, **FP32)
    assert "shape" in (tiebreak_applies(shape) or "")
    nan = compare({"y": np.full((2, 2), np.nan, np.float32)}, {"y": r}, **FP32)
    assert "nonfinite" in (tiebreak_applies(nan) or "")
    q = compare({"y": r * 2}, {"y": r}, fmt="onnx:a16w8", reference_kind="same_graph_cpu")
    assert "A16W8" in (tiebreak_applies(q) or "")
    tight = compare({"y": r * np.float32(1.001)}, {"y": r}, **FP32, tolerance={"rel_l2": 1e-9})
    assert "tightened (rel_l2)" in (tiebreak_applies(tight) or "")
    loose = compare({"y": r * np.float32(1.001)}, {"y": r}, **FP32, tolerance={"rel_l2": 1e-3})
    assert tiebreak_applies(loose) is None  # looser criteria still fail on rule 8: float64 may decide
    kept = tiebreak_unavailable(shape, "the graph holds 900 MiB", limit_s=120.0)
    assert kept.verdict == "failed" and kept.tiebreak == {
        "status": "unavailable", "reason": "the graph holds 900 MiB", "limit_s": 120.0}
    assert kept.to_dict()["tiebreak"]["status"] == "unavailable"
