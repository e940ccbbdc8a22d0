"""The shared region's per-signature caches change no outcome.

``Region.write`` reuses a (set, slot, dtype, shape)'s packed descriptor and view;
``Region.inputs`` reuses a set's input views while the inputs' descriptor bytes are the same;
``Region.output`` reuses an output's view while its descriptor bytes are the same. Each test
changes what the cache is keyed on and checks the reader sees the change, and that a hostile
descriptor is refused on every call, cached or not.
"""

import numpy as np
import pytest

from xstage_remote import shm
from xstage_remote.wire import ProtocolError

IO_IN = [("a", "float32", 64), ("b", "int64", 64)]
IO_OUT = [("y", "float32", 64)]


@pytest.fixture
def region():
    slots, size = shm.plan_layout(IO_IN, IO_OUT, sets=2)
    r = shm.Region.create(size, slots, n_sets=2)
    yield r
    r.close()


def test_inputs_follow_a_new_shape_and_new_values(region) -> None:
    names = ("a", "b")
    for s in (0, 1):
        for shape in [(4,), (2, 2), (4,), (16,)]:
            a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + s
            b = np.arange(3, dtype=np.int64) * (s + 1)
            assert region.write("in", "a", a, s) and region.write("in", "b", b, s)
            feeds = region.inputs(s, names)
            np.testing.assert_array_equal(feeds["a"], a)
            np.testing.assert_array_equal(feeds["b"], b)
            assert feeds["a"].shape == shape


def test_a_returned_feeds_dict_is_the_callers_own(region) -> None:
    region.write("in", "a", np.ones(4, np.float32))
    region.write("in", "b", np.ones(2, np.int64))
    first = region.inputs(0, ("a", "b"))
    first["state"] = np.zeros(1)  # the worker adds its state values to the dict it gets
    assert "state" not in region.inputs(0, ("a", "b"))


def test_a_hostile_input_descriptor_is_refused_after_a_cached_one(region) -> None:
    region.write("in", "a", np.ones(4, np.float32))
    region.write("in", "b", np.ones(2, np.int64))
    region.inputs(0, ("a", "b"))
    i = region.index[(0, "in", "a")]
    off = region.desc_off + i * shm.DESC.size
    dims = [1 << 20] + [0] * (shm.MAX_RANK - 1)
    region.mm[off:off + shm.DESC.size] = shm.DESC.pack(1, 1, 0, 0, 4 << 20, *dims)
    with pytest.raises(ProtocolError):
        region.inputs(0, ("a", "b"))


def test_inputs_not_side_by_side_are_read_one_by_one() -> None:
    slots, size = shm.plan_layout(IO_IN, IO_OUT)
    # The same slots, listed with the output's descriptor between the inputs'.
    r = shm.Region.create(size, [slots[0], slots[2], slots[1]])
    try:
        for n in (4, 8, 4):
            a, b = np.arange(n, dtype=np.float32), np.arange(n, dtype=np.int64)
            r.write("in", "a", a)
            r.write("in", "b", b)
            feeds = r.inputs(0, ("a", "b"))
            np.testing.assert_array_equal(feeds["a"], a)
            np.testing.assert_array_equal(feeds["b"], b)
    finally:
        r.close()


def test_an_output_view_follows_its_descriptor(region) -> None:
    for shape in [(4,), (2, 3), (4,)]:
        y = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        region.write("out", "y", y, 1)
        view = region.output("y", 1)
        assert view.shape == shape
        np.testing.assert_array_equal(view, y)
    i = region.index[(1, "out", "y")]
    off = region.desc_off + i * shm.DESC.size
    region.mm[off] = 99  # a dtype code no slot holds
    with pytest.raises(ProtocolError):
        region.output("y", 1)


def test_a_write_that_does_not_fit_is_refused_every_time(region) -> None:
    big = np.ones(17, np.float32)  # 68 bytes into a 64-byte slot
    assert not region.write("in", "a", big)
    assert not region.write("in", "a", big)
    assert not region.write("in", "nope", np.ones(1, np.float32))
