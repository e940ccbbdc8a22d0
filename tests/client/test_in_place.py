"""Host inputs written in place and outputs read as views (``input_slots``, ``views=True``).

A caller that fills the region's own input slots pays no copy in; one that takes views of the
output slots pays no copy out. Both must give the same numbers as the copying calls, and the
tests check that the copies really did not happen (a spy on ``np.copyto`` that sees which
buffers it writes), so a silent copy cannot pass for in place.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from xstage import builtin_graphs, errors
from xstage.client import WorkerClient
from xstage_remote import shm

N = 1 << 15  # 128 KiB of float32: above shm.IN_PLACE_MIN_BYTES
assert N * 4 >= shm.IN_PLACE_MIN_BYTES


@pytest.fixture(scope="module")
def slice_big(tmp_path_factory: pytest.TempPathFactory):
    return builtin_graphs.write(builtin_graphs.slice_graph(N, N // 2),
                                tmp_path_factory.mktemp("g") / "slice.onnx")


@pytest.fixture
def copies_into(monkeypatch: pytest.MonkeyPatch):
    """The arrays ``np.copyto`` wrote this test (every copy into a region slot goes through it,
    on the calling thread or the copy helpers')."""
    seen: list[np.ndarray] = []
    real = np.copyto

    def spy(dst, src, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(dst)
        return real(dst, src, *args, **kwargs)

    monkeypatch.setattr(np, "copyto", spy)
    return seen


def _wrote_into(seen: list[np.ndarray], slot: np.ndarray) -> bool:
    return any(np.shares_memory(dst, slot) for dst in seen)


def test_inputs_filled_in_place_are_not_copied_and_compute_the_same(slice_big, copies_into):
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    with WorkerClient(sys.executable) as client:
        client.load(slice_big)
        want = client.run({"x": x})["y"].copy()
        slots = client.input_slots()
        assert set(slots) == {"x"} and slots["x"].shape == (N,) and slots["x"].flags.writeable
        slots["x"][...] = x  # the producer writes here itself
        copies_into.clear()
        got = client.run(slots)["y"]
        assert not _wrote_into(copies_into, slots["x"])
        np.testing.assert_array_equal(got, want)
        copies_into.clear()
        client.run({"x": x})  # an array of the caller's own is copied in, as always
        assert _wrote_into(copies_into, slots["x"])


def test_output_views_are_read_only_views_valid_until_the_next_call(slice_big, copies_into):
    """Nothing is copied out; the view shows its slot, so the next call's output replaces
    what it shows (the documented lifetime)."""
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    with WorkerClient(sys.executable) as client:
        client.load(slice_big)
        copies_into.clear()
        first = client.run({"x": a}, views=True)["y"]
        slot = client.link.region.output("y", 0)
        assert np.shares_memory(first, slot) and not _wrote_into(copies_into, first)
        np.testing.assert_array_equal(first, a[: N // 2])
        assert not first.flags.writeable
        with pytest.raises(ValueError):
            first[0] = 1.0
        owned = client.run({"x": b})["y"]  # a copy of the second call's output
        np.testing.assert_array_equal(owned, b[: N // 2])
        np.testing.assert_array_equal(first, b[: N // 2])  # the view shows the slot's new bytes
        out = np.empty(N // 2, np.float32)
        got = client.run({"x": a}, out={"y": out}, views=True)["y"]
        assert got is out  # an out= array is still filled
        np.testing.assert_array_equal(out, a[: N // 2])


def test_input_slots_without_a_region_or_a_fitting_slot_is_a_usage_error(graphs, slice_big):
    with WorkerClient(sys.executable, shm_mode="off") as client:
        client.load(slice_big)
        with pytest.raises(errors.UsageError, match="without a shared region") as bad:
            client.input_slots()
        assert "shm_mode" in bad.value.remedy
        x = np.ones(N, np.float32)
        np.testing.assert_array_equal(client.run({"x": x}, views=True)["y"], x[: N // 2])
    with WorkerClient(sys.executable) as client:
        client.load(slice_big)
        with pytest.raises(errors.UsageError, match="fits"):
            client.input_slots(shapes={"x": (N + 1,)})
    with WorkerClient(sys.executable) as client:
        client.load(graphs["symbolic"])  # a symbolic dimension: no slot sized at load
        with pytest.raises(errors.UsageError):
            client.input_slots()
