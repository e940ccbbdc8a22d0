"""A stage served (docs/serving.md): ``submit`` and ``depth``, restarts with generations, state pairs.

Order is checked with the worker's stamps (docs/serving.md), never with the wall clock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys

import numpy as np
import psutil
import pytest

import xstage
from tests.client.conftest import HERE, Background, stop_on_run_env, wait_stopped, wait_until
from xstage import builtin_graphs, errors
from xstage.record import read_record, validate_record


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return builtin_graphs.write(builtin_graphs.mlp(), tmp_path_factory.mktemp("g") / "mlp.onnx")


def test_submit_returns_futures_in_order_with_the_sync_calls_results(mlp):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((8, 256)).astype(np.float32) for _ in range(5)]
    with xstage.open_stage(mlp, route="ort-cpu", depth=3) as stage:
        want = [stage({"x": x})["y"] for x in xs]
        futures = [stage.submit({"x": x}) for x in xs]
        for fut, y in zip(futures, want, strict=True):
            np.testing.assert_array_equal(fut.result(timeout=60)["y"], y)
        assert [f.generation for f in futures] == [1] * 5


@pytest.mark.parametrize("depth", [0, -1, 65, 1.5, True])
def test_a_bad_depth_is_a_usage_error(mlp, depth):
    with pytest.raises(errors.UsageError, match="depth"):
        xstage.open_stage(mlp, route="ort-cpu", depth=depth)


# ---------------------------------------------------------------------- restarts
def _kill(stage) -> None:
    os.kill(stage.worker_pid, signal.SIGKILL)


def _kill_idle(stage) -> None:
    """SIGKILL the worker and wait for its exit (an event, not a clock): it died idle."""
    pid = stage.worker_pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
               is not None, f"worker {pid} exiting")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Milliseconds per call: requests are still in flight when the worker is killed."""
    return builtin_graphs.write(builtin_graphs.mlp(width=1024, depth=8, batch=128, seed=7),
                                tmp_path_factory.mktemp("g") / "wide.onnx")


@pytest.mark.parametrize("how", ["call", "submit"])
def test_a_dead_worker_is_replaced_by_the_next_generation(mlp, how):
    """The worker dies while idle: the next request is served by generation 2, not failed."""
    x = {"x": np.ones((8, 256), np.float32)}
    with xstage.open_stage(mlp, route="ort-cpu", restart="on_death") as stage:
        want = stage(x)["y"]
        first_pid = stage.worker_pid
        _kill_idle(stage)
        got = stage(x) if how == "call" else stage.submit(x).result(timeout=300)
        np.testing.assert_array_equal(got["y"], want)  # served by generation 2
        health = stage.health()
        assert health["generation"] == 2 and stage.worker_pid != first_pid
        assert health["state"] == "serving" and health["in_flight"] == 0
        [restart] = health["restarts"]
        assert restart["generation"] == 2 and restart["outcome"] == "serving"
        assert "WorkerDied" in restart["cause"]
        assert stage.proof.verdict == "placed" and stage.parity.passed  # proven and gated again
        assert health["proof_sha256"] == stage.record()["worker"]["evidence_sha256"]


def test_health_answers_while_a_restart_admits_and_says_restarting(mlp, tmp_path, monkeypatch):
    """Generation 2's worker stops itself (SIGSTOP) in its admission's first run: the restart
    cannot end before the test resumes it, so health() must answer from what the stage holds,
    not wait for the admission; the call that started the restart is then served by it."""
    fake = tmp_path / "fakepy"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "fault_worker.py"}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    stamps = tmp_path / "stamps"
    for key, value in stop_on_run_env(1, stamps=stamps).items():
        if key.startswith("XSTAGE_FAULT"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("XSTAGE_FAULT_GEN", "2")
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_CPU", str(fake))
    x = {"x": np.ones((8, 256), np.float32)}
    # The reference arm in process: the fault worker (the ort-cpu route here) stamps only the
    # stage's own generations.
    with xstage.open_stage(mlp, route="ort-cpu", restart="on_death",
                           reference_arm="in_process") as stage:
        want = stage(x)["y"]
        first = stage.worker_pid
        _kill_idle(stage)
        box: dict = {}
        call = Background(lambda: box.update(out=stage(x)))
        wait_until(lambda: any(int(p.name[4:]) != first for p in stamps.glob("pid-*")),
                   "generation 2's worker starting")
        [second] = [int(p.name[4:]) for p in stamps.glob("pid-*") if int(p.name[4:]) != first]
        try:
            wait_stopped(second)
            asked = Background(lambda: box.update(health=stage.health()))
            assert asked.raised() is None
            health = box["health"]
            assert health["state"] == "restarting" and health["generation"] == 1
        finally:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                os.kill(second, signal.SIGCONT)
        assert call.raised() is None
        np.testing.assert_array_equal(box["out"]["y"], want)
        health = stage.health()
        assert health["state"] == "serving" and health["generation"] == 2


def test_in_flight_requests_fail_with_the_generation_and_the_queue_moves_on(wide):
    """The worker is stopped (SIGSTOP) before the requests are submitted and killed while they
    wait: the ones published to it are in flight when it dies, whatever the machine's load
    (a kill from a callback raced with the worker finishing the next request)."""
    x = {"x": np.random.default_rng(0).standard_normal((128, 1024)).astype(np.float32)}
    with xstage.open_stage(wide, route="ort-cpu", restart="on_death", depth=2) as stage:
        want = stage(x)["y"]
        done = stage.submit(x, timeout=None)
        assert done.result(timeout=300) is not None and done.generation == 1
        pid = stage.worker_pid
        os.kill(pid, signal.SIGSTOP)
        try:
            futures = [done] + [stage.submit(x, timeout=None) for _ in range(6)]
        finally:
            os.kill(pid, signal.SIGKILL)
        outcomes = []
        for fut in futures:
            exc = fut.exception(timeout=300)
            outcomes.append("died" if exc is not None else fut.generation)
            if exc is not None:
                assert isinstance(exc, errors.WorkerDied) and exc.generation == 1, exc
            else:
                np.testing.assert_array_equal(fut.result()["y"], want)
        assert outcomes[0] == 1 and outcomes[1] == "died"
        assert outcomes[-1] == 2  # a queued request, served by the next generation
        assert outcomes == sorted(outcomes, key=lambda o: {1: 0, "died": 1, 2: 2}[o])
        assert stage.health()["generation"] == 2


def test_the_restart_limit_closes_the_stage_with_the_last_cause(mlp):
    x = {"x": np.ones((8, 256), np.float32)}
    stage = xstage.open_stage(mlp, route="ort-cpu", restart="on_death", max_restarts=1)
    try:
        _kill_idle(stage)
        stage(x)  # served by generation 2
        assert stage.generation == 2
        _kill_idle(stage)
        with pytest.raises(errors.WorkerDied) as info:
            stage(x)  # the limit: no generation 3 serves it
        assert info.value.idle
        health = stage.health()
        assert health["state"] == "closed"
        assert "1 restarts within 60 s" in health["closed_cause"]
        assert [r["outcome"] for r in health["restarts"]] == ["serving", "limit"]
        with pytest.raises(errors.StageClosed, match="1 restarts within"):
            stage(x)
    finally:
        stage.close()
    doc = read_record(stage.record_path)
    assert [r["outcome"] for r in doc["serving"]["restarts"]] == ["serving", "limit"]


def test_a_refused_restart_closes_the_stage_with_the_refusal(mlp, monkeypatch):
    from xstage.refusal import Refusal, RefusalCode
    from xstage.stage import handle

    refusal = Refusal(code=RefusalCode("numeric_gate_failed"), device="cpu",
                      message="generation 2 disagreed", remedy="none", cause="tolerance",
                      route="ort-cpu")
    stage = xstage.open_stage(mlp, route="ort-cpu", restart="on_death")
    try:
        monkeypatch.setattr(handle, "admit", lambda *a, **k: refusal)
        _kill(stage)
        with pytest.raises(errors.WorkerDied):
            stage({"x": np.ones((8, 256), np.float32)})
        with pytest.raises(errors.StageClosed, match="generation 2 was refused"):
            stage({"x": np.ones((8, 256), np.float32)})
        assert stage.health()["restarts"][0]["outcome"] == "refused"
    finally:
        stage.close()
    validate_record(read_record(stage.record_path))


def test_never_restart_keeps_a_dead_stage_dead(mlp):
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        _kill(stage)
        with pytest.raises(errors.WorkerDied):
            stage({"x": np.ones((8, 256), np.float32)})
        with pytest.raises(errors.StageClosed):
            stage.submit({"x": np.ones((8, 256), np.float32)})
        assert stage.health()["restarts"] == []


def test_close_writes_the_record_once(mlp):
    stage = xstage.open_stage(mlp, route="ort-cpu", depth=3)
    stage({"x": np.ones((8, 256), np.float32)})
    stage.close()
    stage.close()
    doc = read_record(stage.record_path)
    assert doc["serving"]["depth"] == 3 and doc["serving"]["generation"] == 1
    assert doc["outcome"]["status"] == "placed"


def test_no_record_when_asked_not_to(mlp):
    stage = xstage.open_stage(mlp, route="ort-cpu", record_on_close=False)
    with pytest.raises(errors.UsageError, match="without device tensors") as bad:
        stage.device_inputs()  # in-place device inputs are torch-cuda's, opt-in
    assert "device_tensors=on" in bad.value.remedy
    stage.close()
    assert stage.record_path is None


@pytest.mark.parametrize("kwargs", [{"restart": "always"}, {"max_restarts": -1},
                                    {"restart_window": 0}, {"max_restarts": 1.5}])
def test_bad_restart_policies_are_usage_errors(mlp, kwargs):
    with pytest.raises(errors.UsageError, match="restart"):
        xstage.open_stage(mlp, route="ort-cpu", **kwargs)


# ---------------------------------------------------------------------- acall, map
def test_acall_awaits_a_result_without_blocking_the_loop(mlp):
    import asyncio

    x = {"x": np.ones((8, 256), np.float32)}
    with xstage.open_stage(mlp, route="ort-cpu") as stage:
        want = stage(x)["y"]

        async def main():
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            ticker = asyncio.ensure_future(tick())
            outs = await asyncio.gather(*(stage.acall(x) for _ in range(4)))
            ticker.cancel()
            return outs, ticks

        outs, ticks = asyncio.run(main())
        for out in outs:
            np.testing.assert_array_equal(out["y"], want)
        assert ticks > 0  # the loop ran while the calls were in flight


def test_map_keeps_order_and_depth(mlp):
    rng = np.random.default_rng(5)
    xs = [{"x": rng.standard_normal((8, 256)).astype(np.float32)} for _ in range(7)]
    with xstage.open_stage(mlp, route="ort-cpu", depth=3) as stage:
        want = [stage(x)["y"] for x in xs]
        for depth in (1, 2, 3):
            got = [out["y"] for out in stage.map(iter(xs), depth=depth)]
            np.testing.assert_array_equal(np.stack(got), np.stack(want))
        with pytest.raises(errors.UsageError, match=r"depth <= 3"):
            stage.map(xs, depth=4)
        with pytest.raises(errors.UsageError, match="depth"):
            stage.map(xs, depth=0)


def test_leaving_map_early_leaves_nothing_in_flight(mlp):
    xs = [{"x": np.ones((8, 256), np.float32)}] * 10
    with xstage.open_stage(mlp, route="ort-cpu", depth=2) as stage:
        for i, _ in enumerate(stage.map(xs)):
            if i == 2:
                break
        stage({"x": np.ones((8, 256), np.float32)})
        assert stage.health()["in_flight"] == 0


def test_a_sync_call_waiting_behind_futures_is_served_by_the_next_generation(wide):
    x = {"x": np.random.default_rng(0).standard_normal((128, 1024)).astype(np.float32)}
    with xstage.open_stage(wide, route="ort-cpu", restart="on_death", depth=2) as stage:
        want = stage(x)["y"]
        futures = [stage.submit(x, timeout=None) for _ in range(3)]
        futures[0].add_done_callback(lambda _f: _kill(stage))
        try:
            out = stage(x)  # queued behind them, or waiting for the worker
        except errors.WorkerDied as exc:  # it was in flight when the worker died
            assert exc.generation == 1
            out = stage(x)
        np.testing.assert_array_equal(out["y"], want)
        assert stage.generation == 2
        for fut in futures:
            fut.exception(timeout=300)


def test_a_stage_takes_inputs_written_in_place_and_gives_output_views(mlp):
    """``Stage.input_slots()`` and ``stage(inputs, views=True)``: the same numbers as a plain
    call (tests/client/test_in_place.py checks that nothing is copied)."""
    x = np.random.default_rng(5).standard_normal((8, 256)).astype(np.float32)
    with xstage.open_stage(mlp, route="ort-cpu", record_on_close=False) as stage:
        want = stage({"x": x})["y"].copy()
        slots = stage.input_slots()
        np.copyto(slots["x"], x)
        got = stage(slots, views=True)["y"]
        assert not got.flags.writeable
        np.testing.assert_array_equal(got, want)


_FORKED_STAGE = """
import os, sys
import numpy as np
import xstage
from xstage import errors
x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
with xstage.open_stage(sys.argv[1], route="ort-cpu", depth=2) as stage:
    want = stage({"x": x})["y"].copy()
    pid = os.fork()
    if pid == 0:
        refused = []
        for name, call in [("call", lambda: stage({"x": x})),
                           ("submit", lambda: stage.submit({"x": x})),
                           ("map", lambda: list(stage.map([{"x": x}]))),
                           ("health", stage.health), ("reset_state", stage.reset_state),
                           ("record", stage.record)]:
            try:
                call()
            except errors.ForkedStage:
                refused.append(name)
            except BaseException as exc:
                print(name, repr(exc), flush=True)
        print("child refused", " ".join(refused), flush=True)
        stage.__exit__(None, None, None)  # what the with block does unwinding in the child
        # (os._exit: onnxruntime's in-process session of the reference arm, collected at
        # interpreter exit, waits forever on its thread pool's lock in a forked child)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    np.testing.assert_array_equal(stage({"x": x})["y"], want)
    assert stage.health()["state"] == "serving"
    records = os.path.join(os.environ["XSTAGE_HOME"], "records")
    print("records before close", len(os.listdir(records)) if os.path.isdir(records) else 0,
          flush=True)
print("parent ok", flush=True)
"""


def test_a_stage_in_a_forked_child_is_refused_and_the_parent_serves_on(mlp):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FORKED_STAGE, str(mlp)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child refused call submit map health reset_state record" in done.stdout
    assert "records before close 0" in done.stdout  # the child's unwinding wrote none
    assert "parent ok" in done.stdout
