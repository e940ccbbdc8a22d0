"""``WorkerClient.widen``: the region re-laid out at another depth while the worker serves on.

``open_stage`` proves and gates a stage at depth 1 and widens it to its depth once admitted
(docs/memory.md, "The client's peak while opening a stage"); these tests drive the client alone.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from xstage import errors
from xstage.client import WorkerClient


def _x(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((8, 256)).astype(np.float32)}


def test_widen_replaces_the_region_with_k_sets_and_calls_go_on(graphs):
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(graphs["mlp"])
        narrow = w.link.region
        assert narrow.n_sets == 1
        want = [np.array(w.run(_x(i))["y"]) for i in range(3)]
        attached = w.widen(3, concurrency=2)
        assert attached["concurrent"] == 2 and "pinned_region" not in attached  # no CUDA here
        wide = w.link.region
        assert wide is not narrow and wide.n_sets == 3
        assert narrow.closed  # the old mapping is let go
        assert (w.depth, w.concurrency, w.concurrent) == (3, 2, 2)
        for s in range(3):
            assert wide.capacity("in", "x", s) == narrow.capacity("in", "x", 0)
        futures = [w.submit(_x(i)) for i in range(3)]  # three in flight, one per set
        for fut, y in zip(futures, want, strict=True):
            np.testing.assert_array_equal(fut.result(timeout=60)["y"], y)
        np.testing.assert_array_equal(w.run(_x(0))["y"], want[0])


def test_widen_to_the_same_depth_keeps_the_region(graphs):
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(graphs["mlp"])
        region = w.link.region
        assert w.widen(2) is None  # nothing attached: the region serves on
        assert w.link.region is region


def test_widen_without_a_region_keeps_the_depth_for_the_one_fit_region_attaches(graphs):
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(graphs["symbolic"])
        assert w.link.region is None
        assert w.widen(2) is None
        x = np.ones((3, 2), np.float32)
        assert w.fit_region({"x": x, "y": x})
        assert w.link.region.n_sets == 2
        np.testing.assert_array_equal(w.run({"x": x})["y"], -x)


@pytest.mark.parametrize(("depth", "concurrency", "what"),
                         [(0, 1, "depth"), (65, 1, "depth"), (2, 3, "concurrency"),
                          (True, 1, "depth")])
def test_widen_out_of_range_is_a_usage_error_and_changes_nothing(graphs, depth, concurrency,
                                                                  what):
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(graphs["mlp"])
        region = w.link.region
        with pytest.raises(errors.UsageError, match=what):
            w.widen(depth, concurrency)
        assert w.link.region is region and w.depth == 1


def test_a_wider_region_over_the_ceiling_leaves_the_one_set_region_serving(graphs, monkeypatch):
    """K sets over ``XSTAGE_MAX_REGION_BYTES`` while one fits: the one-set region stays (its
    calls still go through it, not inline)."""
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(graphs["mlp"])
        one_set = w.link.region.size
    monkeypatch.setenv("XSTAGE_MAX_REGION_BYTES", str(one_set))
    with WorkerClient(sys.executable, depth=1) as w:
        w.load(graphs["mlp"])
        region = w.link.region
        assert region is not None and region.n_sets == 1
        assert w.widen(3) is None
        assert w.link.region is region and w.depth == 3
        want = np.array(w.run(_x(5))["y"])
        futures = [w.submit(_x(5)) for _ in range(3)]  # queued behind the one set
        for fut in futures:
            np.testing.assert_array_equal(fut.result(timeout=60)["y"], want)
        assert w.link.region is region
