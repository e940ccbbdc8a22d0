"""Concurrent runs (docs/serving.md, "Concurrent runs"): up to ``concurrency`` of a stage's
requests in flight computed at once in its worker, on threads over one onnxruntime session.

Results are checked against sequential calls, never against the clock: whether the threads
overlapped on a given machine is the scheduler's business, what each request gets back is not.
"""

from __future__ import annotations

import numpy as np
import pytest

import xstage
from tests.stage.test_state import X, _accumulator
from xstage import builtin_graphs, errors


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Milliseconds per call, so requests are in the worker together."""
    return builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64, seed=5),
                                tmp_path_factory.mktemp("g") / "wide.onnx")


def test_each_request_gets_its_own_outputs_when_runs_overlap(wide):
    """Twelve different inputs through four slot sets computed four at a time: every result is
    what a call of its own input alone returns (a shared I/O binding, the bug this guards
    against, handed one set's outputs to another's request)."""
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((64, 512)).astype(np.float32) for _ in range(12)]
    with xstage.open_stage(wide, route="ort-cpu", depth=4, concurrency=4, record_on_close=False) as stage:
        assert stage.concurrency == 4
        want = [stage({"x": x})["y"] for x in xs]
        for _ in range(3):
            got = list(stage.map(({"x": x} for x in xs), depth=4))
            for y, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(y["y"], w)
        assert stage.record()["serving"]["concurrency"] == 4
        tp = stage.measure_throughput({"x": xs[0]}, depth=4, requests=8)
        assert tp["requests"] == 8 and tp["depth"] == 4 and tp["concurrency"] == 4


def test_concurrency_defaults_to_one_at_a_time(wide):
    with xstage.open_stage(wide, route="ort-cpu", depth=3, record_on_close=False) as stage:
        assert stage.concurrency == 1 and stage.record()["serving"]["concurrency"] == 1


@pytest.mark.parametrize("concurrency", [0, 3, 1.5, True])
def test_concurrency_outside_one_to_the_depth_is_a_usage_error(wide, concurrency):
    with pytest.raises(errors.UsageError, match=r"concurrency=.* is outside 1\.\.2 \(the depth\)"):
        xstage.open_stage(wide, route="ort-cpu", depth=2, concurrency=concurrency)


def test_a_stage_with_state_computes_one_at_a_time(tmp_path):
    """State carries from call to call: its stage runs at depth 1, so one at a time, and its
    throughput says it was asked for more."""
    with xstage.open_stage(_accumulator(tmp_path), route="ort-cpu", depth=4, concurrency=4,
                           record_on_close=False) as stage:
        assert stage.depth == 1 and stage.concurrency == 1
        tp = stage.measure_throughput({"x": X}, depth=4, requests=3)
        assert tp["depth"] == 1 and "state pairs runs one request at a time" in tp["note"]


def test_a_stage_opened_at_depth_1_says_its_depth_not_state(wide):
    """A stateless stage opened at depth 1 and driven at 4 is served at 1, and the note says
    why: its depth, not state pairs it does not have."""
    with xstage.open_stage(wide, route="ort-cpu", depth=1, record_on_close=False) as stage:
        tp = stage.measure_throughput({"x": np.ones((64, 512), np.float32)}, depth=4, requests=3)
        assert tp["depth"] == 1 and tp["note"] == "depth 4 asked, served at 1: the stage's depth is 1"


def test_a_throughput_run_with_wrong_inputs_raises_and_the_stage_serves_on(wide):
    """The throughput driver submits from the last request's callback: an error there reaches
    the caller, and nothing is left in flight."""
    with xstage.open_stage(wide, route="ort-cpu", depth=4, concurrency=4, record_on_close=False) as stage:
        with pytest.raises(errors.InputError):
            stage.measure_throughput({"x": np.zeros((3, 3), np.float32)}, depth=4, requests=8)
        x = np.ones((64, 512), np.float32)
        tp = stage.measure_throughput({"x": x}, depth=4, requests=20)
        assert tp["requests"] == 20
        np.testing.assert_array_equal(stage({"x": x})["y"], stage({"x": x})["y"])


def test_session_config_entries_are_in_the_worker_session_and_its_record(wide):
    """``session_config`` reaches the worker's real onnxruntime session: the record holds each
    entry as the session reads it back."""
    spin = {"session.intra_op.allow_spinning": "0"}
    with xstage.open_stage(wide, route="ort-cpu", depth=2, concurrency=2, session_config=spin,
                           record_on_close=False) as stage:
        rec = stage.record()
        assert rec["request"]["session_config"] == spin
        assert rec["worker"]["runtime"]["session_config"] == spin
        assert rec["outcome"]["status"] == "placed"


def _gather_after_matmuls(path):
    """Six 512x512 MatMuls (milliseconds of work) and then a Gather whose index is an input: an
    index out of range fails the run inside onnxruntime, after the work."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, [512, 512],
                           (rng.standard_normal((512, 512)) * 0.05).astype(np.float32).ravel())
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k}", "w"], [f"h{k + 1}"]) for k in range(6)]
    nodes.append(helper.make_node("Gather", ["h6", "i"], ["y"], axis=0))
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512]),
                          helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    import onnx

    onnx.save(model, path)
    return path


def test_requests_that_fail_while_runs_overlap_each_get_their_own_error(tmp_path):
    """Runs that overlap finish in any order, and a failed run's error frame comes on the
    control stream in that order: each failed request gets its own error, each good one its
    outputs, and the stage serves on. (Before, a second failure's frame read while the client
    waited for the first killed the stage with a protocol error.) Whatever order the runs
    finish in, the assertions are the same."""
    graph = _gather_after_matmuls(tmp_path / "gather.onnx")
    x = np.full((64, 512), 1e-2, np.float32)
    good, bad = {"x": x, "i": np.array([1], np.int64)}, {"x": x, "i": np.array([1000], np.int64)}
    with xstage.open_stage(graph, route="ort-cpu", depth=4, concurrency=4, inputs=good,
                           record_on_close=False) as stage:
        want = stage(good)["y"]
        for _ in range(3):
            futures = [stage.submit(bad if j % 2 == 0 else good) for j in range(8)]
            for j, fut in enumerate(futures):
                if j % 2 == 0:
                    with pytest.raises(errors.WorkerRaised, match="1000"):
                        fut.result(timeout=120)
                else:
                    np.testing.assert_array_equal(fut.result(timeout=120)["y"], want)
        assert stage.health()["state"] == "serving"
        np.testing.assert_array_equal(stage(good)["y"], want)
