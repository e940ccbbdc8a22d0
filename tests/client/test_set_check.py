"""``xstage_remote.set_check`` on a real onnxruntime runtime and a real region of three sets.

The worker's side of ``check_sets``: the gate's inputs written into every set as given (a 0-d
input stays 0-d: OpenVINO refuses a 1-d copy of it, onnxruntime's CPU EP does not), each set run
through its own binding, each answer compared with set 0's byte for byte. The fault, a set run
through another set's binding (its addresses), is injected into the runtime's own binding cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.client.conftest import ranks_graph
from xstage_remote import ort_runtime, shm, wire
from xstage_remote.set_check import check_sets

SETS = 3


@pytest.fixture
def ranks(tmp_path: Path) -> Path:
    path = tmp_path / "ranks.onnx"
    path.write_bytes(ranks_graph().SerializeToString())
    return path


FEEDS = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "s": np.array(2.0, np.float32),
         "k": np.array([1, 2], np.int64)}


def _served(path: Path):
    runtime = ort_runtime.load(str(path), {})
    ins = [(n, wire.tag_of_dtype(a.dtype), a.nbytes) for n, a in FEEDS.items()]
    outs = [(o["name"], o["dtype"], 64) for o in runtime.outputs]
    slots, size = shm.plan_layout(ins, outs, sets=SETS)
    region = shm.Region.create(size, slots, n_sets=SETS)
    views = [{o["name"]: region.view("out", o["name"], wire.dtype_of_tag(o["dtype"]),
                                     tuple(o["shape"]), k) for o in runtime.outputs}
             for k in range(SETS)]
    return runtime, region, views


def test_every_set_answers_alike_and_a_0d_input_stays_0d(ranks: Path) -> None:
    runtime, region, views = _served(ranks)
    seen: list[tuple[int, dict[str, tuple[int, ...]]]] = []
    real = runtime.run_into

    def run_into(feeds, out_views, slot_set=0):  # records what each set was fed, runs it for real
        seen.append((slot_set, {n: a.shape for n, a in feeds.items()}))
        return real(feeds, out_views, slot_set)

    runtime.run_into = run_into
    try:
        info, arrays = check_sets(runtime, region, tuple(FEEDS), views, FEEDS)
        assert info == {"sets": SETS, "differs": None} and arrays == {}
        assert [s for s, _ in seen] == [0, 1, 2]
        assert all(shapes == {"x": (4, 3), "s": (), "k": (2,)} for _, shapes in seen)
        for k in range(SETS):  # each set's own slots hold the answer
            np.testing.assert_array_equal(views[k]["y"], FEEDS["x"] * 2)
            assert views[k]["total"].shape == () and float(views[k]["total"]) == 66.0
    finally:
        region.close()


def test_a_set_bound_to_another_sets_memory_is_named_with_both_answers(ranks: Path) -> None:
    runtime, region, views = _served(ranks)
    real = runtime.run_into

    def run_into(feeds, out_views, slot_set=0):  # set 2 reuses set 1's binding (its addresses)
        if slot_set == 2:
            runtime._bindings[2] = runtime._bindings[1]
        return real(feeds, out_views, slot_set)

    runtime.run_into = run_into
    try:
        info, arrays = check_sets(runtime, region, tuple(FEEDS), views, FEEDS)
        assert info == {"sets": 3, "differs": 2}
        assert sorted(arrays) == ["set0/total", "set0/twice", "set0/y",
                                  "setk/total", "setk/twice", "setk/y"]
        np.testing.assert_array_equal(arrays["set0/y"], FEEDS["x"] * 2)
        assert not np.array_equal(arrays["setk/y"], arrays["set0/y"])  # set 2's own slot, unwritten
    finally:
        region.close()


def test_the_client_asks_only_a_worker_that_offers_it_and_only_with_two_sets(ranks: Path) -> None:
    """Through ``WorkerClient.check_sets``: a region of one set has nothing to compare; a worker
    whose hello lacks ``check-sets`` is not asked (docs/wire.md: no peer relies on a capability the
    other did not offer); one that offers it answers for every set."""
    import sys

    from xstage.client import WorkerClient

    with WorkerClient(sys.executable, depth=1) as client:
        client.load(ranks)
        assert client.check_sets(FEEDS) == ({}, {}, {})  # one set
        client.widen(3)
        info, first, other = client.check_sets(FEEDS)
        assert info == {"sets": 3, "differs": None} and first == other == {}
        offered = client.hello
        client.hello = {**offered, "features": [f for f in offered["features"] if f != "check-sets"]}
        assert client.check_sets(FEEDS) == ({"sets": 0, "skipped": "the worker does not offer "
                                             "check-sets"}, {}, {})
        client.hello = offered
        np.testing.assert_array_equal(client.run(FEEDS)["y"], FEEDS["x"] * 2)  # serves on
