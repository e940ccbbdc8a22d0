"""The client's large copies on several CPUs (``client/copies.py``; docs/workers.md,
"Starting").

A split copy must give what one ``np.copyto`` gives, bit for bit: every dtype, sizes that are
not a multiple of a range, odd itemsizes, strided and transposed sources, byte-order
conversion, ``out=`` arrays and a region slot set's cached write plan. Each test checks that the
split path really ran (``CopyPool.split``), so a silent fallback cannot pass for it.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from tests.client.conftest import identity_inputs
from xstage import builtin_graphs, errors
from xstage.client import WorkerClient, copies
from xstage_remote import shm

RANGE = copies.MIN_RANGE
READ_LOAD = copies._read_load  # before the autouse fixture replaces it
#: Not a multiple of a range, nor of a page: the last range is short and ends mid-page.
ODD = copies.MIN_BYTES + RANGE + 4093  # above the split size, not a multiple of a range


@pytest.fixture(autouse=True)
def _an_idle_machine(monkeypatch):
    """The split must run whatever else loads this machine: the load reads as unknown (every
    helper wakes); ``test_a_busy_machine_copies_inline`` sets it."""
    monkeypatch.setattr(copies, "_read_load", lambda: None)


@pytest.fixture
def pool():
    p = copies.CopyPool(3)
    yield p
    p.close()


def _values(dtype: np.dtype, count: int, seed: int = 0) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype)  # every bit pattern, NaNs and odd floats included


@pytest.mark.parametrize("dtype", [
    np.bool_, np.int8, np.uint16, np.int32, np.uint64, np.float16, np.float32, np.float64,
    np.complex128, "S3", "V7", np.dtype([("a", "<u2"), ("b", "u1")]),
])
def test_a_split_copy_is_bit_identical_for_every_dtype(pool, dtype) -> None:
    dtype = np.dtype(dtype)
    count = ODD // dtype.itemsize + 1
    src = _values(dtype, count) if dtype.kind != "b" else _values(np.dtype(np.uint8), count) > 127
    dst = np.zeros_like(src)
    before = pool.split
    pool.copyto(dst, src, "no")
    assert pool.split == before + 1
    assert dst.tobytes() == src.tobytes()


@pytest.mark.parametrize("shape", [(ODD // 4 + 1,), (3, 1, 333, 1031), (1, 1, 1_400_001), (7, 0, 4)])
def test_sizes_over_range_boundaries_and_empty_arrays(pool, shape) -> None:
    src = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    dst = np.full_like(src, np.nan)
    before = pool.split
    pool.copyto(dst, src)
    assert dst.tobytes() == src.tobytes()
    assert pool.split == before + (src.nbytes >= pool.min_bytes)


def test_a_transposed_and_a_strided_source(pool) -> None:
    base = np.random.default_rng(2).standard_normal((1201, 1003)).astype(np.float32)
    for src in (base.T, base[:, ::2], base[::-1], base.T[None, None]):
        assert not src.flags.c_contiguous
        dst = np.empty(src.shape, np.float32)
        before = pool.split
        pool.copyto(dst, src)
        assert pool.split == before + 1
        np.testing.assert_array_equal(dst, src)
        assert dst.tobytes() == np.ascontiguousarray(src).tobytes()


def test_byte_order_conversion_matches_numpy_and_casting_is_kept(pool) -> None:
    src = np.random.default_rng(3).standard_normal(ODD // 8).astype(">f8")
    dst, want = np.empty(src.shape, "<f8"), np.empty(src.shape, "<f8")
    np.copyto(want, src)
    before = pool.split
    pool.copyto(dst, src)
    assert pool.split == before + 1 and dst.tobytes() == want.tobytes()
    with pytest.raises(TypeError):  # the region's casting="no" refuses it, as np.copyto does
        pool.copyto(dst, src, "no")
    with pytest.raises(ValueError):  # shapes that do not match: numpy's own error
        pool.copyto(dst[:10], src)


def test_a_fresh_copy_is_owned_c_ordered_and_equal(pool) -> None:
    value = np.random.default_rng(4).standard_normal((513, 1027)).astype(np.float32)
    got = pool.empty_copy(value[:, ::-1])
    assert got.flags.c_contiguous and got.flags.owndata and got.flags.writeable
    assert got.tobytes() == np.ascontiguousarray(value[:, ::-1]).tobytes()
    small = pool.empty_copy(value[:2])
    assert small.flags.owndata and small.tobytes() == value[:2].tobytes()


def test_ranges_start_on_pages_and_cover_every_byte_once() -> None:
    dst = np.empty(ODD, np.uint8)[3:]  # a start that is not on a page
    src = np.arange(dst.size, dtype=np.uint8)
    parts = copies._ranges(dst, src, 8)
    assert len(parts) >= 2
    assert sum(d.size for d, _ in parts) == dst.size
    starts = [d.__array_interface__["data"][0] for d, _ in parts]
    assert all(a % 4096 == 0 for a in starts[1:])
    assert starts == sorted(starts) and all(d.size >= 4096 for d, _ in parts)


def test_objects_small_copies_and_a_closed_pool_copy_inline() -> None:
    pool = copies.CopyPool(2)
    objs = np.array([object()] * (pool.min_bytes // 8 + 1))
    out = np.empty_like(objs)
    pool.copyto(out, objs)
    assert pool.split == 0 and not pool.started and (out == objs).all()
    big = np.ones(pool.min_bytes // 4, np.float32)
    pool.copyto(np.empty_like(big), big)
    assert pool.split == 1 and pool.started
    threads = [t for t in threading.enumerate() if t.name.startswith("xstage-copy-")]
    pool.close()
    assert not pool.started and not any(t.is_alive() for t in threads)
    dst = np.empty_like(big)
    pool.copyto(dst, big)
    assert pool.split == 1 and (dst == 1).all()
    off = copies.CopyPool(0)
    off.copyto(dst, big * 2)
    assert off.split == 0 and not off.started and (dst == 2).all()


def test_callers_on_several_threads_each_get_their_own_bytes(pool) -> None:
    srcs = [np.full(ODD // 4 + i, i, np.float32) for i in range(6)]
    dsts = [np.empty_like(s) for s in srcs]
    errors_seen: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                dsts[i].fill(-1)
                pool.copyto(dsts[i], srcs[i])
                assert (dsts[i] == i).all()
        except BaseException as exc:
            errors_seen.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors_seen and pool.split > 0


@pytest.mark.parametrize(("threads", "load", "allowed", "want"), [
    (4, None, 16, 4), (4, (1, 16), 16, 4), (4, (14, 16), 16, 2), (4, (16, 16), 16, 0),
    (4, (40, 16), 16, 0), (4, (2, 16), 3, 1), (2, (1, 2), 2, 1), (2, (2, 2), 2, 0),
])
def test_helpers_wake_only_onto_free_cpus(threads, load, allowed, want) -> None:
    assert copies.free_helpers(threads, load, allowed) == want


def test_a_busy_machine_copies_inline_and_an_idle_one_splits(monkeypatch, pool) -> None:
    load = [(64, 2)]
    monkeypatch.setattr(copies, "_read_load", lambda: load[0])
    monkeypatch.setattr(copies, "LOAD_SAMPLE_SECONDS", 0.0)
    src = np.arange(ODD, dtype=np.uint8)
    dst = np.zeros_like(src)
    pool.copyto(dst, src)
    assert pool.split == 0 and dst.tobytes() == src.tobytes() and not pool.started
    load[0] = (1, 64)
    dst[:] = 0
    pool.copyto(dst, src)
    assert pool.split == 1 and dst.tobytes() == src.tobytes()


def test_the_load_reader_reads_this_machine() -> None:
    got = READ_LOAD()
    assert got is not None and got[0] >= 1 and got[1] >= 1  # Linux: /proc/loadavg is there


@pytest.mark.parametrize(("raw", "want"), [("0", 0), (" 3 ", 3), ("64", 64)])
def test_the_knob_takes_a_thread_count(raw, want) -> None:
    assert copies.copy_threads_default({"XSTAGE_COPY_THREADS": raw}) == (want, None)


@pytest.mark.parametrize("raw", ["four", "-1", "2.5", "65", ""])
def test_a_malformed_knob_is_named_with_a_valid_value(raw) -> None:
    threads, problem = copies.copy_threads_default({"XSTAGE_COPY_THREADS": raw})
    assert problem is not None and f"XSTAGE_COPY_THREADS={raw!r}" in problem
    assert "XSTAGE_COPY_THREADS=0" in problem and threads == copies.copy_threads_default({})[0]


@pytest.mark.parametrize(("cpus", "want"), [(1, 0), (2, 0), (3, 0), (4, 2), (8, 4), (16, 4)])
def test_the_default_pays_only_from_four_cpus(monkeypatch, cpus, want) -> None:
    monkeypatch.setattr(copies.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert copies.copy_threads_default({}) == (want, None)


def test_a_malformed_knob_stops_a_worker_before_it_starts(monkeypatch) -> None:
    monkeypatch.setenv("XSTAGE_COPY_THREADS", "x")
    client = WorkerClient(sys.executable)
    with pytest.raises(errors.UsageError, match="XSTAGE_COPY_THREADS='x' is not a whole number"):
        client.start()
    assert client.pid is None  # nothing was started


def test_the_client_builds_its_tuning_once_and_uses_its_knobs(monkeypatch) -> None:
    """``XSTAGE_COPY_THREADS`` and ``XSTAGE_SHM`` reach the client through ``tuning``."""
    monkeypatch.setenv("XSTAGE_COPY_THREADS", "3")
    monkeypatch.setenv("XSTAGE_SHM", "off")
    client = WorkerClient(sys.executable)
    assert client.tuning.copy_threads == 3 and client._copies.threads == 3
    assert client.tuning.shm == "off" and client.shm_mode == "off"
    monkeypatch.setenv("XSTAGE_COPY_THREADS", "1")  # read once: a later change is not seen
    assert client.tuning.copy_threads == 3


def test_a_region_write_plan_keeps_its_copy_and_its_bytes(pool) -> None:
    n = ODD // 4 + 3
    slots, size = shm.plan_layout([("x", "float32", n * 4)], [("y", "float32", 64)], sets=2)
    region = shm.Region.create(size, slots, n_sets=2)
    try:
        region.use_copier(pool)
        rng = np.random.default_rng(5)
        for call in range(3):  # the second and third reuse the cached plan
            for s in (0, 1):
                x = rng.standard_normal(n).astype(np.float32)
                before = pool.split
                assert region.write("in", "x", x, s)
                assert pool.split == before + 1
                view = region.inputs(s, ("x",))["x"]
                assert view.tobytes() == x.tobytes(), (call, s)
        small = np.arange(10, dtype=np.float32)
        before = pool.split
        assert region.write("in", "x", small, 0) and pool.split == before
        assert region.inputs(0, ("x",))["x"].tobytes() == small.tobytes()
        region.use_copier(None)
        assert region.write("in", "x", x, 1) and pool.split == before
    finally:
        region.close()


def _big_identity(tmp_path):
    from onnx import TensorProto, helper

    io = [("f32", TensorProto.FLOAT, [3, 333, 1031]), ("f16", TensorProto.FLOAT16, [1, 1_200_001]),
          ("u8", TensorProto.UINT8, [ODD]), ("f64", TensorProto.DOUBLE, [0, 3])]
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}_out"]) for n, *_ in io], "big_identity",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in io],
        [helper.make_tensor_value_info(f"{n}_out", t, s) for n, t, s in io])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return builtin_graphs.write(model, tmp_path / "big_identity.onnx")


def test_a_worker_round_trip_on_the_copy_threads_is_bit_exact(monkeypatch, tmp_path) -> None:
    """Inputs in and outputs out through the region, split: C order, transposed, big-endian,
    ``out=``, an empty tensor; the call's timing keys are the same."""
    monkeypatch.setattr(copies, "COPY_THREADS", 2)
    rng = np.random.default_rng(6)
    base = rng.standard_normal((1031, 333, 3)).astype(np.float32)
    feeds = {
        "f32": base.T,  # transposed: not C-contiguous
        "f16": rng.standard_normal((1, 1_200_001)).astype(">f2"),  # big-endian
        "u8": rng.integers(0, 256, ODD, dtype=np.uint8),
        "f64": np.zeros((0, 3)),
    }
    with WorkerClient(sys.executable) as w:
        w.load(_big_identity(tmp_path))
        assert w.link.region is not None and w.link.region.copier is w._copies
        assert w._copies.threads == 2
        for call in range(2):
            out = w.run(feeds)
            assert w._copies.split >= 6 * (call + 1)  # three large inputs and three outputs
            for name, value in feeds.items():
                got = out[f"{name}_out"]
                assert got.flags.c_contiguous and got.flags.owndata
                assert got.tobytes() == np.ascontiguousarray(value).astype(got.dtype).tobytes()
            assert {"copy_in_ns", "copy_out_ns", "worker_ns"} <= set(w.last_timing)
        targets = {f"{n}_out": np.empty(v.shape, np.dtype(v.dtype).newbyteorder("<"))
                   for n, v in feeds.items()}
        before = w._copies.split
        out = w.run(feeds, out=targets)
        assert w._copies.split == before + 6
        for name, value in feeds.items():
            assert out[f"{name}_out"] is targets[f"{name}_out"]
            assert targets[f"{name}_out"].tobytes() == \
                np.ascontiguousarray(value).astype(targets[f"{name}_out"].dtype).tobytes()
        helpers = [t for t in threading.enumerate() if t.name.startswith("xstage-copy-")]
        assert len(helpers) >= 2
    assert not w._copies.started and not any(t.is_alive() for t in helpers)


def test_a_client_below_four_cpus_copies_on_its_own_thread(graphs, monkeypatch) -> None:
    monkeypatch.setattr(copies, "COPY_THREADS", 0)
    with WorkerClient(sys.executable) as w:
        w.load(graphs["identity"])
        assert w.link.region is not None and w.link.region.copier is None and w._copies.threads == 0


def test_the_identity_graph_still_round_trips_with_copy_threads(graphs, monkeypatch) -> None:
    """Every small dtype and shape class of the existing graph: nothing is split, all exact."""
    monkeypatch.setattr(copies, "COPY_THREADS", 2)
    feeds = identity_inputs()
    with WorkerClient(sys.executable) as w:
        w.load(graphs["identity"])
        out = w.run(feeds)
        assert w._copies.split == 0
    for name, value in feeds.items():
        assert out[f"{name}_out"].tobytes() == value.tobytes()


def test_pipelined_requests_in_several_sets_keep_their_own_bytes(monkeypatch, tmp_path) -> None:
    """depth 3: each set's write plan splits its copy; every future gets its own request's
    values back, in order, while the next requests' inputs are written."""
    monkeypatch.setattr(copies, "COPY_THREADS", 2)
    rng = np.random.default_rng(7)
    feeds = [{"f32": rng.standard_normal((3, 333, 1031)).astype(np.float32),
              "f16": rng.standard_normal((1, 1_200_001)).astype(np.float16),
              "u8": rng.integers(0, 256, ODD, dtype=np.uint8), "f64": np.zeros((0, 3))}
             for _ in range(7)]
    with WorkerClient(sys.executable, depth=3) as w:
        w.load(_big_identity(tmp_path))
        assert w.link.region is not None and w.link.region.n_sets == 3
        futures = [w.submit(f) for f in feeds]
        for fut, sent in zip(futures, feeds, strict=True):
            got = fut.result(timeout=120)
            for name, value in sent.items():
                assert got[f"{name}_out"].tobytes() == value.tobytes(), name
        assert w._copies.split >= 6 * len(feeds) // 2  # most copies split (one at a time)


def test_inputs_the_device_reads_by_dma_are_copied_in_by_the_caller_alone() -> None:
    """torch-cuda's pinned region: the worker's device reads the inputs straight from it."""
    from xstage.client.worker import dma_reads_region

    def loaded(state):
        return {"info": {"accelerator": {"pinned_region": {"state": state}}}}

    assert dma_reads_region(loaded("pending")) and dma_reads_region(loaded("registered"))
    assert not dma_reads_region(loaded("off"))
    assert not dma_reads_region({"info": {"accelerator": {}}}) and not dma_reads_region(None)
    assert not dma_reads_region({"info": {"accelerator": "cpu"}})
