"""Default tolerances, their keys, and the `--tolerance F` override."""

from __future__ import annotations

import numpy as np
import pytest

from xstage.parity import (
    DEFAULT_TOLERANCES,
    FORMATS,
    REFERENCE_KINDS,
    Tolerance,
    compare,
    default_tolerance,
)


def test_every_format_and_reference_kind_has_a_default():
    """Every (format, reference kind) pair has a default; nothing else does."""
    assert set(DEFAULT_TOLERANCES) == {(f, k) for f in FORMATS for k in REFERENCE_KINDS}
    for (fmt, kind), tol in DEFAULT_TOLERANCES.items():
        assert default_tolerance(fmt, kind) is tol


def test_defaults_get_looser_as_precision_drops():
    """fp32 < fp16 < A16W8 (same graph) < A16W8 vs fp32, on every threshold."""
    ladder = [
        default_tolerance("onnx:fp32", "same_graph_cpu"),
        default_tolerance("onnx:fp16", "fp32_source"),
        default_tolerance("onnx:a16w8", "same_graph_cpu"),
        default_tolerance("onnx:a16w8", "fp32_source"),
    ]
    for tighter, looser in zip(ladder, ladder[1:], strict=False):
        assert tighter.rel_l2 < looser.rel_l2 and tighter.abs_rms < looser.abs_rms
        assert tighter.min_cosine >= looser.min_cosine


def test_fp32_default_values_are_pinned():
    """The fp32 default is pinned: changing it is a decision (see the comment in parity.py)."""
    assert default_tolerance("onnx:fp32", "same_graph_cpu") == Tolerance(1e-4, 1e-3, 0.999)
    assert default_tolerance("pt:fp32", "torch_cpu") == Tolerance(1e-4, 1e-3, 0.999)


def test_fp32_default_rejects_tf32_and_fp16_and_bf16_level_error():
    """The fp32 default sits below TF32 (5.65e-4, seed) and fp16 compute (4.9e-4, measured)."""
    tol = default_tolerance("onnx:fp32", "same_graph_cpu")
    assert tol.rel_l2 < 4.9e-4 < 5.65e-4
    assert tol.rel_l2 > 9.10e-06 * 10  # the 890M's DirectML fp32 (seed) with 10x headroom


def test_unknown_format_names_the_valid_ones():
    """An unknown format is a ValueError listing every valid format."""
    with pytest.raises(ValueError) as info:
        default_tolerance("onnx:int4", "same_graph_cpu")
    assert str(info.value) == (
        "unknown artifact format 'onnx:int4'; valid formats: "
        "onnx:fp32, onnx:fp16, onnx:a16w8, onnx:a8w8, pt:fp32, pt:fp16"
    )


def test_unknown_reference_kind_names_the_valid_ones():
    """An unknown reference kind is a ValueError listing every valid kind."""
    with pytest.raises(ValueError) as info:
        compare({"y": np.ones(1)}, {"y": np.ones(1)}, fmt="onnx:fp32", reference_kind="gpu")
    assert str(info.value) == (
        "unknown reference kind 'gpu'; valid kinds: same_graph_cpu, fp32_source, torch_cpu, user"
    )


def test_float_tolerance_overrides_rel_l2_only():
    """`--tolerance F` (a float) replaces rel_l2 only; every other criterion keeps its default.

    A uniform 2e-3 relative error passes rel_l2 at 3e-3, and rule 8 (rtol 1e-4 at fp32) still
    refuses it: a bare number loosens the relative criterion, not the element-wise one.
    Naming both (`rel_l2=3e-3,elem_rtol=3e-3`) passes it.
    """
    r = np.linspace(0.1, 1.0, 100).astype(np.float32)
    y = r * np.float32(1.002)  # rel_l2 2e-3, max_abs 2e-3 > 1e-3·rms
    default = compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert default.verdict == "failed"
    loose = compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu", tolerance=3e-3)
    assert loose.tolerance_source == "override" and not loose.tolerance_is_default
    assert loose.tolerance == Tolerance(3e-3, 1e-3, 0.999)
    assert loose.non_default == ("rel_l2",)
    assert loose.verdict == "failed" and loose.cause == "elementwise"
    assert "rel_l2 2.0e-03 <= 3.0e-03" in loose.outputs[0].criterion
    both = compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu",
                   tolerance={"rel_l2": 3e-3, "elem_rtol": 3e-3})
    assert both.passed and both.tolerance_key == "onnx:fp32/same_graph_cpu"
    assert both.outputs[0].criterion.startswith("rel_l2 2.0e-03 <= 3.0e-03")
    assert both.summary == "passed: 1 output within the onnx:fp32/same_graph_cpu tolerance (override); " \
        "worst rel_l2 2.0e-03 (y)"


def test_float_tolerance_zero_demands_bit_equality_or_the_absolute_branch():
    """`--tolerance 0`: rel_l2 must be 0, so only the absolute branch can still pass."""
    r = np.linspace(0.1, 1.0, 100).astype(np.float32)
    parity = compare({"y": r.copy()}, {"y": r}, fmt="onnx:fp32", reference_kind="user", tolerance=0)
    assert parity.passed and parity.outputs[0].criterion.startswith("rel_l2 0.0e+00 <= 0.0e+00")


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf")])
def test_rejects_a_negative_or_nonfinite_float_tolerance(bad):
    """A numeric tolerance must be finite and >= 0 (a malformed argument raises)."""
    with pytest.raises(ValueError, match="rel_l2 override"):
        compare({"y": np.ones(1)}, {"y": np.ones(1)}, fmt="onnx:fp32", reference_kind="user", tolerance=bad)


def test_rejects_a_tolerance_of_the_wrong_type():
    """A tolerance that is neither a Tolerance, a number nor None is a TypeError (bool included)."""
    for bad in ("1e-3", True):
        with pytest.raises(TypeError, match="tolerance must be"):
            compare({"y": np.ones(1)}, {"y": np.ones(1)}, fmt="pt:fp32", reference_kind="user", tolerance=bad)


@pytest.mark.parametrize(
    "fields, message",
    [
        ((-1.0, 1e-3, 0.9), "must be >= 0"),
        ((1e-3, -1.0, 0.9), "must be >= 0"),
        ((1e-3, 1e-3, 1.5), r"min_cosine must be in \[-1, 1\]"),
        ((float("nan"), 1e-3, 0.9), "rel_l2 must be a finite number"),
    ],
)
def test_tolerance_rejects_bad_thresholds(fields, message):
    """Tolerance validates its thresholds when built."""
    with pytest.raises(ValueError, match=message):
        Tolerance(*fields)
