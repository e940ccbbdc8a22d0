"""``xstage.open_stage`` as a library: a Stage that is placed, proven, gated, and honest when it dies."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import onnxruntime as ort
import pytest

import xstage
from xstage import builtin_graphs, errors
from xstage.record import validate_record


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("g") / "mlp.onnx")


def test_open_stage_is_placed_gated_and_callable(mlp):
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(mlp)).run(None, {"x": x})[0]
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        assert stage.proof.verdict == "placed" and stage.parity.passed
        assert (stage.device, stage.route) == ("cpu", "ort-cpu")
        out = stage({"x": x})
        assert list(out) == ["y"]
        np.testing.assert_array_equal(out["y"], ref)
        timings = stage.measure(runs=3, warmup=1)
        assert timings["runs"] == 3 and timings["compute"]["p50_ms"] > 0
        validate_record(stage.record(argv=["test"]))
    with pytest.raises(errors.StageClosed):
        stage({"x": x})


def test_a_wrong_dtype_is_an_error_naming_the_expected_one(mlp):
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        with pytest.raises(errors.InputError, match="is float64, the stage expects float32"):
            stage({"x": np.ones((8, 256))})
        with pytest.raises(errors.InputError, match=r"expects \(8, 256\)"):
            stage({"x": np.ones((4, 256), np.float32)})


def test_inputs_are_checked_before_any_worker_starts(mlp):
    import psutil

    before = set(p.pid for p in psutil.Process().children(recursive=True))
    with pytest.raises(errors.InputError):
        xstage.open_stage(mlp, route="ort-cpu", inputs={"x": np.ones((8, 256), np.int64)})
    assert set(p.pid for p in psutil.Process().children(recursive=True)) == before


def test_a_dead_worker_makes_a_dead_stage_that_says_so_on_every_call(mlp):
    stage = xstage.open_stage(mlp, route="ort-cpu")
    x = np.ones((8, 256), np.float32)
    os.kill(stage.worker_pid, signal.SIGKILL)
    with pytest.raises(errors.WorkerDied):
        stage({"x": x})
    for _ in range(2):
        with pytest.raises(errors.StageClosed, match="died earlier"):
            stage({"x": x})
    stage.close()


def test_calls_from_threads_are_serialized(mlp):
    sess = ort.InferenceSession(str(mlp))
    xs = [np.random.default_rng(i).standard_normal((8, 256)).astype(np.float32) for i in range(6)]
    refs = [sess.run(None, {"x": x})[0] for x in xs]
    bad = []
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        def work(i):
            for _ in range(10):
                if not np.array_equal(stage({"x": xs[i]})["y"], refs[i]):
                    bad.append(i)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert bad == []


def test_refused_carries_structured_refusals_and_a_valid_record(mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(tmp_path / "missing-python"))
    with pytest.raises(xstage.Refused) as info:
        xstage.open_stage(mlp, route="ort-openvino")
    (refusal,) = info.value.refusals
    assert refusal.code is xstage.RefusalCode.DEVICE_UNREACHABLE and refusal.cause == "route_missing"
    assert "missing-python" in refusal.message and refusal.remedy
    validate_record(info.value.record)


def test_plan_lists_what_open_stage_would_try(mlp):
    """Here (no route env) the offload has only the reference arm: it is the last candidate."""
    p = xstage.plan(mlp)
    assert p.mode == "offload" and p.candidates[-1].route.name == "ort-cpu"
    assert p.candidates[-1].device == "cpu"


@pytest.mark.parametrize("selector", [{"offload": True}, {"device": "cpu"}, {"prefer": ["cpu"]},
                                      {"route": "ort-cpu"}])
def test_plan_takes_every_selector_open_stage_takes(mlp, selector):
    p = xstage.plan(mlp, **selector)
    assert p.candidates[-1].route.name == "ort-cpu"


def test_open_stage_with_no_selector_offloads_and_labels_the_reference_arm(mlp):
    """No route but the reference arm resolves here: placed there, and the record says so."""
    with xstage.open_stage(mlp, record_on_close=False) as stage:
        assert stage.route == "ort-cpu"
        rec = stage.record()
    assert rec["request"]["offload"] is True and rec["plan"]["mode"] == "offload"
    assert rec["plan"]["on_reference_arm"] is True
    validate_record(rec)


def test_inputs_that_are_not_a_mapping_are_an_input_error(mlp):
    """``st([x])``, ``st(None)``: an ``InputError`` naming what a call takes (an AttributeError
    before); ``open_stage(inputs=[...])`` likewise."""
    with pytest.raises(xstage.InputError, match="mapping of input name to array"):
        xstage.open_stage(mlp, route="ort-cpu", inputs=[np.zeros((8, 256), np.float32)])
    with xstage.open_stage(mlp, route="ort-cpu", record_on_close=False) as stage:
        for bad in ([np.zeros((8, 256), np.float32)], None):
            with pytest.raises(xstage.InputError, match="not (list|NoneType)"):
                stage(bad)
        with pytest.raises(xstage.InputError):
            stage.submit([1])
        stage(stage.inputs)  # the stage still serves


def test_a_closed_stage_is_an_xstage_error(mlp):
    stage = xstage.open_stage(mlp, route="ort-cpu", record_on_close=False)
    stage.close()
    with pytest.raises(xstage.XstageError) as caught:
        stage(stage.inputs)
    assert isinstance(caught.value, xstage.StageClosed) and isinstance(caught.value, RuntimeError)
