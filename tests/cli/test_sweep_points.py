"""``xstage.cli._sweep``: the points of ``--sweep`` and ``--batch`` (pure parsing)."""

from __future__ import annotations

import pytest

from xstage.cli._sweep import batch_points, check_points, parse_batches, sweep_points
from xstage.errors import UsageError


def test_sweeps_of_two_inputs_run_their_ith_shapes_together():
    points = sweep_points(["a=1x8;2x8", "b=1x4;2x4"])
    assert [p.shapes for p in points] == [{"a": (1, 8), "b": (1, 4)}, {"a": (2, 8), "b": (2, 4)}]
    assert points[1].label == "a=2x8 b=2x4"


def test_sweeps_of_different_lengths_are_refused():
    with pytest.raises(UsageError, match="the same number of shapes.*a has 2, b has 1"):
        sweep_points(["a=1x8;2x8", "b=1x4"])


def test_batch_sets_a_named_first_dimension_and_fills_an_unnamed_one():
    points = batch_points(parse_batches("2,4"), [("x", ("batch", 8)), ("m", ("?", 3)), ("k", (1, 2))])
    assert [(p.dims, p.shapes, p.batch) for p in points] == [
        ({"batch": 2}, {"m": (2, 3)}, 2), ({"batch": 4}, {"m": (4, 3)}, 4)]


def test_batch_over_an_unnamed_shape_with_other_free_dimensions_names_sweep():
    with pytest.raises(UsageError, match=r"input m's dimensions are unnamed and not fixed") as info:
        batch_points([1], [("m", ("?", "?"))])
    assert info.value.remedy == "sweep its whole shape: --sweep m=DIMS;DIMS…"


def test_a_repeated_batch_is_refused():
    with pytest.raises(UsageError, match="names 2 twice"):
        parse_batches("1,2,2")


@pytest.mark.parametrize(("sweep", "why"), [
    ("y=1x8;2x8", "--sweep names 'y', which is not an input"),
    ("x=1x8;2x9", "--sweep x=2x9 contradicts the declared ['batch', 8]"),
    ("x=1x8;2x8x1", "--sweep x=2x8x1 contradicts the declared ['batch', 8]"),
])
def test_every_point_is_checked_against_the_inputs_before_any_runs(sweep, why):
    """The second point's fault is found before the first point runs, naming --sweep."""
    with pytest.raises(UsageError) as info:
        check_points(sweep_points([sweep]), [("x", ("batch", 8))])
    assert str(info.value) == why


def test_points_the_inputs_take_pass():
    check_points(sweep_points(["x=1x8;4x8"]), [("x", ("batch", 8)), ("m", ("?", 3))])
