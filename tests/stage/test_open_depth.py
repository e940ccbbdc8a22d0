"""A stage is proven and gated at depth 1, then serves at its depth (docs/memory.md, "The
client's peak while opening a stage").

The client's RSS counts every shared-region page it touched: a gate whose second computation
went to the region's second slot set wrote the inputs and read the outputs again in pages the
first set already held (the stage's I/O bytes once more). Which set each call of the open used
is read from the pipeline, never from the RSS.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

import xstage
from tests.client.conftest import fault_env, ranks_graph, wait_until
from xstage import builtin_graphs
from xstage.client.pipeline import Pipeline

FAULT_WORKER = Path(__file__).resolve().parents[1] / "client" / "fault_worker.py"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("g") / "mlp.onnx")


@pytest.fixture
def sets_used(monkeypatch):
    """(client, the region's sets, the set) of every synchronous region call, in order."""
    used: list[tuple[object, int, int]] = []
    fast = Pipeline._call_fast

    def spy(self, region, *args, **kwargs):
        used.append((self.client, region.n_sets, self.next_set))
        return fast(self, region, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "_call_fast", spy)
    return used


def _x(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((8, 256)).astype(np.float32)}


def test_the_gate_reuses_one_slot_set_and_the_stage_serves_at_its_depth(mlp, sets_used):
    """Before: the warm-up took set 0 and the gate's second computation set 1 of two."""
    with xstage.open_stage(mlp, route="ort-cpu", depth=3, concurrency=2,
                           record_on_close=False) as stage:
        client = stage._client
        opening = [(n, s) for c, n, s in sets_used if c is client]
        assert len(opening) >= 2  # the warm-up and the gate's second computation
        assert opening == [(1, 0)] * len(opening)
        assert client.link.region.n_sets == 3
        assert (stage.depth, stage.concurrency) == (3, 2)
        del sets_used[:]
        want = [np.array(stage(_x(i))["y"]) for i in range(4)]
        assert [s for c, n, s in sets_used if c is client] == [0, 1, 2, 0]  # cyclic, as before
        futures = [stage.submit(_x(i)) for i in range(4)]
        for fut, y in zip(futures, want, strict=True):
            np.testing.assert_array_equal(fut.result(timeout=60)["y"], y)


def test_a_restarted_worker_is_gated_in_one_set_and_serves_at_the_depth(mlp, sets_used):
    with xstage.open_stage(mlp, route="ort-cpu", depth=2, restart="on_death",
                           record_on_close=False) as stage:
        y = np.array(stage(_x(1))["y"])
        pid = stage.worker_pid
        os.kill(pid, signal.SIGKILL)  # it died idle: its exit is waited for, not a clock
        wait_until(lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                   is not None, f"worker {pid} exiting")
        np.testing.assert_array_equal(stage(_x(1))["y"], y)  # generation 2 serves it
        client = stage._client
        assert stage.generation == 2
        opening = [(n, s) for c, n, s in sets_used if c is client]
        assert opening[:2] == [(1, 0), (1, 0)] and client.link.region.n_sets == 2


def test_an_open_stage_keeps_none_of_the_gates_outputs(mlp):
    """The warm-up's outputs (a copy: the gate's second computation reuses their slot set) are
    judged and let go; before, the admission held them (1x the outputs) for the stage's life."""
    with xstage.open_stage(mlp, route="ort-cpu", record_on_close=False) as stage:
        warm = stage._admission.warm
        assert dict(warm.outputs) == {} and warm.calls == ()
        assert stage.parity.passed and warm.again is None  # judged: the same bits twice


@pytest.mark.parametrize(("depth", "wrong"), [(3, 2), (2, 2)])
def test_a_set_that_answers_otherwise_fails_the_gate(mlp, tmp_path, monkeypatch, depth, wrong):
    """A worker whose slot set 2 answers off by one (fault_worker.py, "wrong-in-set"): the gate's
    calls run in a region of one set and pass; at depth 3 the worker's check of every set of the
    serving region finds set 2 answering the same inputs otherwise and fails the gate, naming the
    set; at depth 2 (sets 0 and 1, the control) the stage is admitted."""
    for key, value in fault_env("wrong-in-set").items():
        if key.startswith("XSTAGE_FAULT"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("XSTAGE_FAULT_SET", str(wrong))
    fake = tmp_path / "fakepy"  # stands in for an interpreter (tests/client/conftest.py, fault_python)
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAULT_WORKER}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_CPU", str(fake))
    if depth == 2:
        with xstage.open_stage(mlp, route="ort-cpu", depth=depth, reference_arm="in_process",
                               record_on_close=False) as stage:
            assert stage.parity.verdict == "passed" and stage.depth == 2
            assert stage.parity.slot_sets == {"sets": 2, "differs": None}
        return
    with pytest.raises(xstage.Refused) as refused:
        xstage.open_stage(mlp, route="ort-cpu", depth=depth, reference_arm="in_process",
                          record_on_close=False)
    (refusal,) = refused.value.refusals
    assert refusal.code == "numeric_gate_failed" and refusal.cause == "nondeterministic"
    assert "y (slot set 2)" in refusal.message, refusal.message
    assert refusal.evidence["parity"]["slot_sets"] == {"sets": 3, "differs": 2}


def test_inputs_and_outputs_of_every_rank_are_checked_in_every_set(tmp_path):
    """The set check writes the gate's inputs into each set as given: a 0-d input stays 0-d (a
    1-d copy of it was refused by onnxruntime, "model input (shape=[]) and the tensor (shape=(1))"),
    and 0-d and integer outputs are compared byte for byte like the rest."""
    path = tmp_path / "ranks.onnx"
    path.write_bytes(ranks_graph().SerializeToString())
    with xstage.open_stage(path, route="ort-cpu", depth=3, reference_arm="in_process",
                           record_on_close=False) as stage:
        assert stage.parity.slot_sets == {"sets": 3, "differs": None}
        assert stage.record()["parity"]["slot_sets"] == {"sets": 3, "differs": None}
        out = stage({"x": np.ones((4, 3), np.float32), "s": np.float32(2.0),
                     "k": np.array([1, 2], np.int64)})
        assert out["total"].shape == () and float(out["total"]) == 12.0
        assert out["twice"].tolist() == [2, 4] and float(out["y"][0, 0]) == 2.0
