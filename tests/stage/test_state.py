"""State pairs kept in the worker: carried, reset, reset on restart, gated, charged (docs/serving.md,
"State that stays in the worker").

The stage is an accumulator: ``h_out = h_in + x`` and ``y = h_out``, with ``h_out -> h_in``
declared as a state pair, so call n from the initial state returns ``init + n·x``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import xstage
from tests.client.conftest import wait_until
from xstage import builtin_graphs, errors
from xstage.manifest import manifest_path, write_manifest
from xstage.record import read_record

X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def _accumulator(folder: Path, init: str = "zeros", shape_out: int = 4) -> Path:
    path = builtin_graphs.write(builtin_graphs.accumulator(4, shape_out), folder / "acc.onnx")
    spec = {"dtype": "float32", "shape": [4]}
    write_manifest(path, component="accumulator", fmt="onnx:fp32", files=[path],
                   source={"kind": "test"}, exporter={"xstage": "test"},
                   inputs=[{"name": "x", **spec}, {"name": "h_in", **spec}],
                   outputs=[{"name": "y", **spec},
                            {"name": "h_out", "dtype": "float32", "shape": [shape_out]}],
                   opset=17, state=[{"input": "h_in", "output": "h_out", "init": init}])
    return path


@pytest.fixture
def acc(tmp_path: Path) -> Path:
    return _accumulator(tmp_path)


def test_state_is_carried_from_call_to_call_and_never_returned(acc):
    with xstage.open_stage(acc, route="ort-cpu", depth=4) as stage:
        assert stage.depth == 1  # state carries from call to call: one at a time
        first = stage({"x": X})
        assert list(first) == ["y"] and first.state_reset
        np.testing.assert_array_equal(first["y"], X)
        second = stage({"x": X})
        np.testing.assert_array_equal(second["y"], 2 * X)
        assert not second.state_reset
        futures = [stage.submit({"x": X}) for _ in range(3)]
        got = [f.result(timeout=60)["y"] for f in futures]
        np.testing.assert_array_equal(np.stack(got), np.stack([3 * X, 4 * X, 5 * X]))


def test_reset_state_restores_the_initial_value(acc):
    with xstage.open_stage(acc, route="ort-cpu") as stage:
        stage({"x": X})
        stage({"x": X})
        stage.reset_state()
        out = stage({"x": X})
        np.testing.assert_array_equal(out["y"], X)
        assert out.state_reset
        fut = stage.submit({"x": X})
        assert not fut.result(timeout=60).state_reset and not fut.state_reset


def test_a_restarted_worker_starts_from_the_initial_state(acc):
    with xstage.open_stage(acc, route="ort-cpu", restart="on_death") as stage:
        stage({"x": X})
        stage({"x": X})
        pid = stage.worker_pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                   is not None, f"worker {pid} exiting")
        out = stage({"x": X})  # died idle: served by generation 2
        assert stage.generation == 2
        assert out.state_reset
        np.testing.assert_array_equal(out["y"], X)


def test_the_gate_ran_two_calls_and_the_ledger_holds_the_state(acc):
    stage = xstage.open_stage(acc, route="ort-cpu")
    try:
        assert "y (call 2)" in json.dumps(stage.parity.to_dict())
        [state] = [r for r in stage.budget.reservations if r.purpose == "state"]
        assert state.bytes == 2 * 4 * 4
        stage.reset_state()
    finally:
        stage.close()
    block = read_record(stage.record_path)["serving"]["state"]
    assert block == {"pairs": [{"input": "h_in", "output": "h_out", "init": "zeros"}],
                     "bytes": 32, "resets": 1}


def test_the_gate_compares_three_calls_and_every_state_output_and_serving_starts_fresh(acc):
    """A state error shows in the visible output only on a later call: the gate compares three
    calls from the initial state, the state outputs too (the worker hands them over for it)."""
    with xstage.open_stage(acc, route="ort-cpu") as stage:
        names = [o["name"] for o in stage.parity.to_dict()["outputs"]]
        assert names == ["y", "h_out", "y (call 2)", "h_out (call 2)", "y (call 3)", "h_out (call 3)"]
        first = stage({"x": X})
        assert first.state_reset and list(first) == ["y"]
        np.testing.assert_array_equal(first["y"], X)


def test_a_file_init_is_the_first_calls_state(tmp_path):
    np.save(tmp_path / "h0.npy", np.full(4, 10, np.float32))
    path = _accumulator(tmp_path, init="h0.npy")
    with xstage.open_stage(path, route="ort-cpu") as stage:
        np.testing.assert_array_equal(stage({"x": X})["y"], X + 10)


def test_a_pair_of_two_shapes_is_refused_by_name(tmp_path):
    path = _accumulator(tmp_path, shape_out=2)  # the graph declares h_out [2], h_in [4]
    with pytest.raises(errors.ArtifactError, match="one fixed shape and dtype"):
        xstage.open_stage(path, route="ort-cpu")


@pytest.mark.parametrize("pair", [
    {"input": "nope", "output": "h_out", "init": "zeros"},
    {"input": "h_in", "output": "h_out", "init": "ones"},
    {"input": "h_in", "output": "h_out", "init": "../h0.npy"},
    {"input": "h_in", "output": "h_out"},
])
def test_malformed_state_declarations_are_refused(tmp_path, pair):
    path = _accumulator(tmp_path)
    doc = json.loads(manifest_path(path).read_text())
    doc["state"] = [pair]
    manifest_path(path).write_text(json.dumps(doc))
    with pytest.raises(errors.ArtifactError, match="state"):
        xstage.open_stage(path, route="ort-cpu")


def test_a_stage_without_state_has_none_to_reset(tmp_path):
    from xstage import builtin_graphs

    mlp = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "mlp.onnx")
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        with pytest.raises(errors.UsageError, match="declares no state"):
            stage.reset_state()
