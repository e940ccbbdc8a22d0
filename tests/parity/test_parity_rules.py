"""The numeric gate's rules, one case each (xstage.parity module docstring, rules 1-7)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from xstage.parity import ABS_FLOOR_EPS, Tolerance, abs_floor, compare

FP32 = {"fmt": "onnx:fp32", "reference_kind": "same_graph_cpu"}  # rel 1e-4, abs 1e-3, cos 0.999


def ramp(n: int = 100, dtype=np.float32) -> np.ndarray:
    """A reference with no zeros and rms ~0.58."""
    return np.linspace(-1.0, 1.0, n + 1)[1:].astype(dtype)


def only(parity):
    (metrics,) = parity.outputs
    return metrics


def test_rel_l2_within_tolerance_passes_naming_rel_l2():
    """Rule 7, first branch: rel_l2 <= t_rel passes and the criterion says so."""
    r = ramp()
    y = (r.astype(np.float64) * (1 + 1e-6)).astype(np.float32)
    parity = compare({"y": y}, {"y": r}, **FP32)
    m = only(parity)
    assert parity.verdict == "passed" and parity.cause is None and m.passed
    assert m.rule == "rel_l2"
    assert m.criterion.startswith(f"rel_l2 {m.rel_l2:.1e} <= 1.0e-04, cosine ")


def test_rel_l2_is_computed_in_float64():
    """The metrics are float64: ‖y−r‖/‖r‖, cosine, max_abs and rms(ref) match numpy's float64."""
    rng = np.random.default_rng(3)
    r = rng.standard_normal(1000).astype(np.float32)
    y = r + rng.standard_normal(1000).astype(np.float32) * np.float32(1e-5)
    m = only(compare({"y": y}, {"y": r}, **FP32))
    y64, r64 = y.astype(np.float64), r.astype(np.float64)
    assert m.rel_l2 == pytest.approx(np.linalg.norm(y64 - r64) / np.linalg.norm(r64), rel=1e-12)
    assert m.cosine == pytest.approx(y64 @ r64 / np.linalg.norm(y64) / np.linalg.norm(r64), abs=1e-15)
    assert m.max_abs == pytest.approx(np.abs(y64 - r64).max(), rel=1e-12)
    assert m.rms_ref == pytest.approx(np.sqrt(np.mean(r64**2)), rel=1e-12)


def test_absolute_branch_passes_when_rel_l2_fails():
    """Rule 7, second branch: rel_l2 > t_rel but every element within t_abs·rms(ref) passes.

    A flat error of 5e-4·rms: rel_l2 = 5e-4 > 1e-4, max_abs = 5e-4·rms <= 1e-3·rms. Rule 8's
    fp32 bound (1e-5·rms + 1e-4·|r|) refuses that flat error at the defaults: here it is
    widened to the absolute branch's own bound, so rule 7 decides alone.
    """
    r = np.where(np.arange(1000) % 2, 1.0, -1.0).astype(np.float32)  # rms exactly 1
    y = r + np.float32(5e-4)
    assert compare({"y": y}, {"y": r}, **FP32).cause == "elementwise"
    m = only(compare({"y": y}, {"y": r}, **FP32, tolerance={"elem_a": 1e-3}))
    assert m.passed and m.rule == "max_abs" and m.n_bad == 0
    assert m.abs_bound == pytest.approx(1e-3)
    assert m.criterion.startswith("rel_l2 5.0e-04 > 1.0e-04 but max_abs 5.0e-04 <= 1.0e-03·rms(ref)=1.0e-03")


def test_both_branches_failing_names_both_numbers():
    """Rule 7: failing rel_l2 and max_abs gives cause tolerance and a criterion with both."""
    r = np.where(np.arange(1000) % 2, 1.0, -1.0).astype(np.float32)
    y = r.copy()
    y[:10] += np.float32(0.05)  # rel_l2 = 0.05·sqrt(10/1000) = 5e-3; max_abs 5e-2
    parity = compare({"y": y}, {"y": r}, **FP32)
    m = only(parity)
    assert parity.verdict == "failed" and parity.cause == "tolerance"
    assert m.criterion == (
        "rel_l2 5.0e-03 > 1.0e-04 and max_abs 5.0e-02 > 1.0e-03·rms(ref)=1.0e-03, "
        f"cosine {m.cosine:.6f} >= 0.999"
    )


def test_cosine_fails_where_the_or_passes_sign_flip_near_zero():
    """Rule 7's cosine: a sign flip on a near-zero reference passes the floor, fails the cosine.

    r ~ 1e-8: max_abs = 2e-8 is under the float32 floor (4·eps = 4.8e-7), so the OR passes;
    the output points the other way (cosine -1), so the gate fails.
    """
    r = ramp() * np.float32(1e-8)
    parity = compare({"y": -r}, {"y": r}, **FP32)
    m = only(parity)
    assert parity.verdict == "failed" and parity.cause == "tolerance"
    assert m.rule == "cosine" and m.cosine == pytest.approx(-1.0)
    assert m.criterion == (
        "cosine -1.000000 < 0.999 (rel_l2 2.0e+00 > 1.0e-04 but max_abs 2.0e-08 <= "
        "floor 4·eps(float32)=4.8e-07)"
    )


def test_integers_compare_exactly():
    """Rule 4: equal int64 arrays pass as `exact (int64)`, with no float metrics."""
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    m = only(compare({"ids": a}, {"ids": a.copy()}, **FP32))
    assert m.passed and m.rule == "exact" and m.criterion == "exact (int64)"
    assert m.rel_l2 is None and m.cosine is None


def test_integers_off_by_one_fail_whatever_the_tolerance():
    """Rule 4: one int differing by 1 fails even with a huge rel_l2 tolerance."""
    a = np.arange(100, dtype=np.int32)
    b = a.copy()
    b[7] += 1
    parity = compare({"ids": b}, {"ids": a}, **FP32, tolerance=10.0)
    m = only(parity)
    assert parity.cause == "tolerance"
    assert m.criterion == "int32 differs at 1 of 100 positions (max_abs 1)"


def test_bools_compare_exactly():
    """Rule 4: bools are exact too."""
    a = np.array([True, False, True])
    assert compare({"m": a}, {"m": a.copy()}, **FP32).passed
    m = only(compare({"m": ~a}, {"m": a}, **FP32))
    assert not m.passed and m.criterion == "bool differs at 3 of 3 positions (max_abs 1)"


def test_nan_at_the_same_positions_passes_and_is_excluded():
    """Rule 5: NaN/Inf at the same positions match, and the float metrics skip them."""
    r = ramp(10)
    r[[2, 5]] = [np.nan, np.inf]
    y = r.copy()
    y[0] *= np.float32(1 + 1e-7)
    m = only(compare({"y": y}, {"y": r}, **FP32))
    assert m.passed and m.rule == "rel_l2"
    assert (m.nan_count, m.inf_count, m.ref_nan_count, m.ref_inf_count) == (1, 1, 1, 1)
    assert m.mismatched_nonfinite == 0 and np.isfinite(m.rel_l2)


def test_nan_at_different_positions_fails_with_cause_nonfinite():
    """Rule 5: NaN where the reference is finite fails, cause `nonfinite`, with the count."""
    r = ramp(100)
    y = r.copy()
    y[[1, 50, 99]] = np.nan
    parity = compare({"y": y}, {"y": r}, **FP32)
    m = only(parity)
    assert parity.verdict == "failed" and parity.cause == "nonfinite"
    assert m.rule == "nonfinite" and m.mismatched_nonfinite == 3
    assert m.criterion == "nonfinite positions differ at 3 of 100"


def test_inf_of_the_other_sign_is_a_nonfinite_mismatch():
    """Rule 5: +Inf against -Inf is a mismatch (kind for kind, not just "nonfinite")."""
    r = np.array([1.0, np.inf, 2.0], np.float32)
    y = np.array([1.0, -np.inf, 2.0], np.float32)
    assert compare({"y": y}, {"y": r}, **FP32).cause == "nonfinite"


def test_everything_nonfinite_at_the_same_places_passes():
    """Rule 5: an output that is NaN everywhere, as is the reference, passes (nothing to measure)."""
    r = np.full(4, np.nan, np.float32)
    m = only(compare({"y": r.copy()}, {"y": r}, **FP32))
    assert m.passed and m.criterion == "all 4 values nonfinite, at the same positions"


def test_nonfinite_cause_wins_over_tolerance():
    """The cause is `nonfinite` when any output failed rule 5, even if another failed rule 7."""
    r = ramp()
    bad = r.copy()
    bad[0] = np.nan
    parity = compare({"a": r + 1, "b": bad}, {"a": r, "b": r}, **FP32)
    assert parity.cause == "nonfinite"
    assert parity.summary.startswith("failed (nonfinite): 2 of 2 outputs")
    assert "b: nonfinite positions differ at 1 of 100" in parity.summary


def test_empty_output_passes():
    """Rule 3: zero elements (with matching dtype and shape) pass as `empty`."""
    e = np.zeros((0, 4), np.float32)
    m = only(compare({"y": e}, {"y": e.copy()}, **FP32))
    assert m.passed and m.rule == "empty" and m.criterion == "empty"


def test_all_zero_reference_uses_the_floor_alone():
    """Rule 6: rms(ref) = 0, so max_abs is held to the dtype's floor (4·eps) alone."""
    r = np.zeros(50, np.float32)
    y = r.copy()
    y[3] = 1e-7
    m = only(compare({"y": y}, {"y": r}, **FP32))
    assert m.passed and m.rule == "all_zero_reference"
    assert m.rel_l2 is None and m.cosine is None
    assert m.abs_bound == pytest.approx(ABS_FLOOR_EPS * np.finfo(np.float32).eps)
    assert m.criterion == "all-zero reference: max_abs 1.0e-07 <= floor 4·eps(float32)=4.8e-07"


def test_all_zero_reference_with_a_real_error_fails():
    """Rule 6: an all-zero reference against an output of 1e-3 fails."""
    r = np.zeros(50, np.float32)
    y = r.copy()
    y[3] = 1e-3
    m = only(compare({"y": y}, {"y": r}, **FP32))
    assert not m.passed
    assert m.criterion == "all-zero reference: max_abs 1.0e-03 > floor 4·eps(float32)=4.8e-07"


def test_zero_output_against_a_nonzero_reference_fails_with_cosine_undefined():
    """Rule 7: an all-zero output has no direction (cosine None) and rel_l2 = 1: it fails."""
    r = ramp()
    m = only(compare({"y": np.zeros_like(r)}, {"y": r}, **FP32))
    assert not m.passed and m.cosine is None and m.rel_l2 == pytest.approx(1.0)
    assert m.criterion.endswith("cosine undefined (zero output)")


def test_dtype_mismatch_is_a_failure_not_a_cast():
    """Rule 2: float16 against a float32 reference fails, naming both dtypes."""
    r = ramp()
    parity = compare({"y": r.astype(np.float16)}, {"y": r}, **FP32)
    m = only(parity)
    assert parity.cause == "tolerance" and m.rule == "dtype"
    assert m.criterion == "dtype float16 != reference float32"


def test_shape_mismatch_is_a_failure_not_a_broadcast():
    """Rule 2: (2, 3) against (3, 2) fails, naming both shapes."""
    a = np.ones((2, 3), np.float32)
    m = only(compare({"y": a}, {"y": a.reshape(3, 2)}, **FP32))
    assert m.rule == "shape" and m.criterion == "shape (2, 3) != reference (3, 2)"


def test_dtype_and_shape_mismatch_both_named():
    """Rule 2: when both differ, the criterion names both."""
    m = only(compare({"y": np.ones(3, np.float16)}, {"y": np.ones(4, np.float32)}, **FP32))
    assert m.criterion == "dtype float16 != reference float32; shape (3) != reference (4)"


def test_missing_output_is_a_failure():
    """Rule 1: a reference output the stage did not return fails, after the stage's outputs."""
    r = ramp()
    parity = compare({"a": r}, {"a": r, "b": r}, **FP32)
    assert [m.name for m in parity.outputs] == ["a", "b"]
    a, b = parity.outputs
    assert a.passed and not b.passed and b.rule == "missing"
    assert b.criterion == "missing: the reference has it (float32 (100)), the outputs do not"
    assert parity.cause == "tolerance"


def test_unexpected_output_is_a_failure():
    """Rule 1: an output the reference lacks fails (names must match both ways)."""
    r = ramp()
    m = only(compare({"extra": r}, {}, **FP32))
    assert m.rule == "unexpected"
    assert m.criterion == "unexpected: the outputs have it (float32 (100)), the reference does not"


def test_outputs_keep_graph_order():
    """Per-output metrics follow the outputs' order, not the reference's or the alphabet."""
    r = ramp()
    parity = compare({"z": r, "a": r, "m": r}, {"a": r, "m": r, "z": r}, **FP32)
    assert [m.name for m in parity.outputs] == ["z", "a", "m"]


def test_float16_outputs_against_their_fp32_source_tier():
    """float16 outputs: metrics from float16 values, the fp16 tier, the float16 floor."""
    r = ramp(256).astype(np.float16)
    y = (r.astype(np.float32) * np.float32(1.001)).astype(np.float16)
    parity = compare({"y": y}, {"y": r}, fmt="onnx:fp16", reference_kind="fp32_source")
    m = only(parity)
    assert parity.passed and m.dtype == "float16" and m.rule == "rel_l2"
    assert m.rel_l2 == pytest.approx(1e-3, rel=0.2)
    assert abs_floor(np.float16) == pytest.approx(4 * 2.0**-10)


def test_bfloat16_outputs_are_compared_as_floats():
    """bfloat16 (ml_dtypes) outputs are floats: NaN handled, metrics in float64, its own floor."""
    bf16 = ml_dtypes.bfloat16
    r = ramp(64).astype(bf16)
    y = r.copy()
    y[5] = bf16(float(r[5]) + 2.0**-6)  # one ulp-ish bump of a value near -0.84
    m = only(compare({"y": y}, {"y": r}, fmt="pt:fp16", reference_kind="torch_cpu"))
    assert m.dtype == "bfloat16" and m.rel_l2 is not None and m.rel_l2 > 0
    assert abs_floor(bf16) == pytest.approx(4 * 2.0**-7)
    r2 = r.copy()
    r2[0] = bf16(np.nan)
    assert compare({"y": r}, {"y": r2}, fmt="pt:fp16", reference_kind="torch_cpu").cause == "nonfinite"


def test_bfloat16_against_float32_is_a_dtype_mismatch():
    """A bfloat16 output against a float32 reference is rule 2, not a silent upcast."""
    r = ramp()
    m = only(compare({"y": r.astype(ml_dtypes.bfloat16)}, {"y": r}, **FP32))
    assert m.criterion == "dtype bfloat16 != reference float32"


def test_to_dict_is_plain_json():
    """`to_dict()` round-trips through strict JSON (no NaN literals, no numpy scalars)."""
    r = ramp()
    bad = r.copy()
    bad[0] = np.inf
    parity = compare({"a": r, "b": bad, "i": np.arange(3)}, {"a": r, "b": r, "i": np.arange(3)}, **FP32)
    doc = json.loads(json.dumps(parity.to_dict(), allow_nan=False))
    assert doc["verdict"] == "failed" and doc["cause"] == "nonfinite"
    assert doc["tolerance"] == {"rel_l2": 1e-4, "abs_rms": 1e-3, "min_cosine": 0.999, "elem": 0.0,
                                "elem_a": 1e-7, "elem_rtol": 1e-4}
    assert doc["non_default"] == [] and doc["tiebreak"] is None
    assert doc["tolerance_key"] == "onnx:fp32/same_graph_cpu" and doc["tolerance_default"] is True
    assert [o["name"] for o in doc["outputs"]] == ["a", "b", "i"]
    assert doc["outputs"][0]["shape"] == [100]


def test_passing_summary_names_the_worst_output():
    """The one-line summary of a pass names the tolerance key and the worst rel_l2."""
    r = ramp()
    parity = compare({"a": r, "b": r * np.float32(1 + 1e-5)}, {"a": r, "b": r}, **FP32)
    assert parity.summary.startswith(
        "passed: 2 outputs within the onnx:fp32/same_graph_cpu tolerance (default); worst rel_l2 1.0e-05 (b)")


def test_arrays_are_not_modified():
    """compare() leaves its inputs as they were."""
    r = ramp()
    y = r.copy()
    y[0] = np.nan
    before = (r.copy(), y.copy())
    compare({"y": y}, {"y": r}, **FP32)
    np.testing.assert_array_equal(r, before[0])
    np.testing.assert_array_equal(y, before[1])


def test_rejects_a_value_that_is_not_an_array():
    """Malformed arguments raise: a list is not a numpy array (TypeError names the key)."""
    with pytest.raises(TypeError, match=r"outputs\['y'\] is a list, not a numpy array"):
        compare({"y": [1.0]}, {"y": np.ones(1)}, **FP32)


def test_rejects_a_reference_that_is_not_a_mapping():
    """Malformed arguments raise: the reference must be a mapping."""
    with pytest.raises(TypeError, match="reference must be a mapping"):
        compare({"y": np.ones(1)}, [np.ones(1)], **FP32)


def test_rejects_an_unsupported_dtype():
    """Malformed arguments raise: object arrays are not numbers the gate can compare."""
    with pytest.raises(ValueError, match=r"reference\['y'\] has dtype object"):
        compare({"y": np.ones(1)}, {"y": np.array([None])}, **FP32)


def test_rejects_nothing_to_compare():
    """Malformed arguments raise: two empty mappings are a caller's bug, not a verdict."""
    with pytest.raises(ValueError, match="nothing to compare"):
        compare({}, {}, **FP32)


def test_explicit_tolerance_object_is_used_as_given():
    """A whole Tolerance replaces the default and is reported as `explicit`."""
    r = ramp()
    tol = Tolerance(rel_l2=0.5, abs_rms=0.0, min_cosine=-1.0, elem_rtol=0.5)
    parity = compare({"y": r * np.float32(1.2)}, {"y": r}, **FP32, tolerance=tol)
    assert parity.passed and parity.tolerance is tol and parity.tolerance_source == "explicit"
    assert not parity.tolerance_is_default
    assert parity.non_default == ("rel_l2", "abs_rms", "cosine", "elem_rtol")


def test_byte_order_is_not_a_dtype_mismatch():
    """A big-endian reference (e.g. from an .npz written elsewhere) holds the same float32s."""
    r = ramp()
    assert compare({"y": r}, {"y": r.astype(">f4")}, **FP32).passed


def test_all_nonfinite_output_reports_no_magnitudes():
    """With no finite position left, max_abs and rms(ref) are None, not a made-up 0."""
    r = np.array([np.nan, np.inf], np.float32)
    m = only(compare({"y": r.copy()}, {"y": r}, **FP32))
    assert m.passed and m.max_abs is None and m.rms_ref is None


def test_fp16_output_against_an_fp32_source_reference_is_compared():
    """Rule 2's exception: an fp16 artifact's float16 output is read against its fp32 source."""
    r = ramp(256)
    y = (r * np.float32(1.001)).astype(np.float16)
    parity = compare({"y": y}, {"y": r}, fmt="onnx:fp16", reference_kind="fp32_source")
    m = only(parity)
    assert parity.passed and m.rule == "rel_l2"
    assert m.dtype == "float16" and m.reference_dtype == "float32"
    assert m.criterion.endswith("[float16 output, float32 reference]")


def test_the_widening_exception_uses_the_coarser_floor():
    """Rule 2's exception: with float16 against float32, the floor is float16's (4·2^-10)."""
    r = np.zeros(8, np.float32)
    y = np.full(8, 1e-3, np.float16)
    m = only(compare({"y": y}, {"y": r}, fmt="pt:fp16", reference_kind="torch_cpu"))
    assert m.passed and m.abs_bound == pytest.approx(4 * 2.0**-10)
    assert "floor 4·eps(float16)" in m.criterion


def test_no_widening_against_the_same_graph():
    """Rule 2: the same fp16 graph on the CPU returns float16 too, so float32 there is a mismatch."""
    r = ramp()
    m = only(compare({"y": r.astype(np.float16)}, {"y": r}, fmt="onnx:fp16", reference_kind="same_graph_cpu"))
    assert m.rule == "dtype"


def test_no_widening_for_integers():
    """Rule 2's exception is for floats only: int32 against int64 stays a mismatch."""
    a = np.arange(4)
    m = only(compare({"y": a.astype(np.int32)}, {"y": a}, fmt="onnx:a16w8", reference_kind="fp32_source"))
    assert m.criterion == "dtype int32 != reference int64"
