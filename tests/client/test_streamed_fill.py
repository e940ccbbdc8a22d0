"""Streamed inputs (shm.py, "Streamed inputs"): a large input copied in announced chunks.

Where the worker's device reads the region by DMA, the caller copies a large input in chunks
and stores after each how far it got (``fill``); a waiting worker hands each new ``fill`` to its
runtime, which queues the DMA of those bytes. Here the caller's side and the worker's hand-over
run without a GPU (``tests/gpu`` runs the DMA itself): the bytes, the announcements, their
order and the request counter.
"""

from __future__ import annotations

import numpy as np

from xstage_remote import region as region_mod
from xstage_remote import shm
from xstage_remote.worker import Worker

BIG = (shm.STREAM_MIN_BYTES + shm.STREAM_CHUNK_BYTES // 2) // 4  # floats: chunks and a half
IO_IN = [("x", "float32", BIG * 4), ("small", "float32", 64)]  # capacities in bytes
IO_OUT = [("y", "float32", 64)]


def _region() -> shm.Region:
    slots, size = shm.plan_layout(IO_IN, IO_OUT)
    region = shm.Region.create(size, slots)
    region.stream_fill = True
    return region


def _parts(fill: int) -> tuple[int, int, int]:
    return fill >> 48, (fill >> 32) & 0xFFFF, fill & 0xFFFFFFFF


def test_a_large_input_is_copied_whole_and_its_fill_says_so() -> None:
    region = _region()
    try:
        x = np.random.default_rng(0).standard_normal(BIG).astype(np.float32)
        assert region.fill(0) == 0
        assert region.write("in", "x", x, 0)
        seq, slot, done = _parts(region.fill(0))
        assert seq != 0 and done == x.nbytes and region.slots[slot]["name"] == "x"
        np.testing.assert_array_equal(region.view("in", "x", x.dtype, x.shape, 0), x)
        region.write("in", "small", np.ones(16, np.float32), 0)  # small: nothing announced
        assert _parts(region.fill(0)) == (seq, slot, done)
        region.publish_request(1, 0)
        region.write("in", "x", x[::-1].copy(), 0)  # every large input written: a new seq
        assert _parts(region.fill(0)) == (seq + 1, slot, x.nbytes)
        np.testing.assert_array_equal(region.view("in", "x", x.dtype, x.shape, 0), x[::-1])
    finally:
        region.close()


def test_a_large_input_not_streamed_announces_none_of_its_bytes() -> None:
    """Written in place, or not contiguous (copied at once): a new seq with 0 bytes, so bytes
    a worker queued for an earlier, withdrawn or abandoned write never stand for this one."""
    region = _region()
    try:
        x = np.random.default_rng(1).standard_normal(BIG).astype(np.float32)
        region.write("in", "x", x, 0)
        seq, slot, _ = _parts(region.fill(0))
        strided = np.repeat(x, 2)[::2]  # the same values, not contiguous
        assert region.write("in", "x", strided, 0)
        assert _parts(region.fill(0)) == (seq + 1, slot, 0)
        np.testing.assert_array_equal(region.view("in", "x", x.dtype, x.shape, 0), x)
        slots = region.slot_views("in", {"x": (x.dtype, x.shape)}, 0)
        assert region.write("in", "x", slots["x"], 0)  # in place
        assert _parts(region.fill(0)) == (seq + 2, slot, 0)
    finally:
        region.close()


def test_without_the_switch_nothing_is_announced() -> None:
    region = _region()
    region.stream_fill = False
    try:
        x = np.ones(BIG, np.float32)
        assert region.write("in", "x", x, 0) and region.fill(0) == 0
    finally:
        region.close()


class _Recorder:
    """A runtime that records what the worker hands it (the DMA a GPU runtime queues)."""

    streams_inputs = True

    def __init__(self) -> None:
        self.fills: list[tuple[int, int]] = []

    def prefetch(self, s: int, fill: int) -> None:
        self.fills.append((s, fill))


def test_a_waiting_worker_hands_each_new_fill_to_its_runtime_in_order(monkeypatch) -> None:
    """The worker's wait polls between the caller's chunk stores (here: right after each one):
    every chunk's fill is handed over once, in order, growing to the whole input; once the
    request is published the wait is ready and hands nothing more."""
    region = _region()
    try:
        worker = Worker.__new__(Worker)  # only what the wait's check reads
        worker.region, worker.runtime = region, _Recorder()
        published = [False]
        check = worker._prefetching(lambda: published[0], 0)
        real = region_mod.U64

        class Polled:  # the fill store, then one poll of the waiting worker
            @staticmethod
            def pack_into(mm, off, value):
                real.pack_into(mm, off, value)
                assert not check()

            unpack_from = staticmethod(real.unpack_from)

        monkeypatch.setattr(region_mod, "U64", Polled)
        x = np.arange(BIG, dtype=np.float32)
        region.write("in", "x", x, 0)
        monkeypatch.setattr(region_mod, "U64", real)
        assert not check()  # nothing new: nothing handed over again
        published[0] = True
        assert check()
        fills = worker.runtime.fills
        done = [_parts(f)[2] for _, f in fills]
        chunk = shm.STREAM_CHUNK_BYTES
        # the new seq with 0 bytes first, then every chunk
        assert done == [0] + [min(k, x.nbytes) for k in range(chunk, x.nbytes + chunk, chunk)]
        assert all(s == 0 and _parts(f)[:2] == _parts(region.fill(0))[:2] for s, f in fills)
        np.testing.assert_array_equal(region.view("in", "x", x.dtype, x.shape, 0), x)
    finally:
        region.close()
