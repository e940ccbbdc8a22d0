"""After an interrupted call of a stage with state, the next call knows what state it runs on.

The attack: Ctrl-C during a stateful call whose request the worker has taken; the next call
used to run on the state the interrupted one left, silently. Now it raises ``StateUncertain``
until ``reset_state()`` (docs/serving.md, "State that stays in the worker"), unless the
interrupted request never ran (withdrawn before the worker took it: its answer says so). On the
socket an interrupt inside an inline read closes the stage (``StageClosed``).

Ordered, not raced: "started", the worker stops itself (SIGSTOP) as it takes the call, and
the interrupt is sent once it has; "withdrawn", the test stops the worker before the call and
interrupts once the request is published in the region, so the worker cannot have taken it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.client.conftest import stop_on_run_env
from xstage import builtin_graphs

HARD_TIMEOUT = 420

_SCRIPT = textwrap.dedent(
    """
    import faulthandler, json, os, signal, sys, threading, time
    import numpy as np
    import psutil
    from xstage import errors
    from xstage.client import WorkerClient
    python, path, shm_mode, when = sys.argv[1:5]
    LIMIT = 120.0  # a liveness bound on each awaited event, never a speed one
    faulthandler.dump_traceback_later(3 * LIMIT, exit=True)
    X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)

    def until(check, what):
        end = time.monotonic() + LIMIT
        while not check():
            if time.monotonic() > end:
                print(json.dumps({"outcome": "hung", "message": what}), flush=True)
                os._exit(1)
            time.sleep(0.002)

    w = WorkerClient(python, shm_mode=shm_mode)
    w.start()
    w.load(path, options={"state": [{"input": "h_in", "output": "h_out", "init": "zeros"}]})
    w.run({"x": X})  # run 1: the state is X
    pid = w.pid
    proc = psutil.Process(pid)
    stopped = lambda: proc.status() == psutil.STATUS_STOPPED
    if when == "started":  # the worker stops itself as it takes run 2 (fault_worker.py)
        ready = stopped
    else:  # stopped while idle: run 2 is published and cannot be taken
        last = w.link.region.req_id(0)
        os.kill(pid, signal.SIGSTOP)
        until(stopped, "the worker stopping")
        ready = lambda: w.link.region.req_id(0) != last
    main = threading.main_thread().ident
    fired = threading.Event()

    def ctrl_c(signum, frame):
        if not fired.is_set():
            fired.set()
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, ctrl_c)

    def interrupt():
        until(ready, "call A reaching the worker")
        while not fired.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            fired.wait(0.5)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        w.run({"x": X})
        print(json.dumps({"outcome": "not-interrupted"}), flush=True)
        sys.exit(0)
    except KeyboardInterrupt:
        pass
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    try:
        outcome = {"outcome": "ran", "y": w.run({"x": X})["y"].tolist()}
    except errors.StateUncertain as exc:
        outcome = {"outcome": "uncertain", "message": str(exc)}
        try:
            w.submit({"x": X})
            outcome["submit"] = "accepted"
        except errors.StateUncertain:
            outcome["submit"] = "uncertain"
        w.reset_state()
        out = w.run({"x": X})
        outcome.update(after_reset=out["y"].tolist(), state_reset=out.state_reset)
    except errors.StageClosed as exc:
        outcome = {"outcome": "closed", "message": str(exc)}
    print(json.dumps(outcome), flush=True)
    w.close()
    """
)


@pytest.fixture(scope="module")
def acc(tmp_path_factory: pytest.TempPathFactory):
    return builtin_graphs.write(builtin_graphs.accumulator(4, 4),
                                tmp_path_factory.mktemp("g") / "acc.onnx")


@pytest.mark.parametrize(("shm_mode", "when", "expected"), [
    ("auto", "started", "uncertain"),
    ("auto", "withdrawn", "ran"),
    ("off", "started", "closed"),
], ids=["region-started", "region-withdrawn", "socket-started"])
def test_the_call_after_an_interrupted_stateful_call(acc, fault_python, stamps, shm_mode, when,
                                                     expected):
    if when == "started":
        python, env = fault_python, stop_on_run_env(2, stamps=stamps)
    else:
        python, env = sys.executable, None
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT, python, str(acc), shm_mode, when],
                              capture_output=True, text=True, timeout=HARD_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scenario hung for {HARD_TIMEOUT}s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-4000:]
    result = json.loads(lines[-1])
    assert result["outcome"] == expected, (result, done.stderr[-4000:])
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    if expected == "uncertain":
        assert "interrupted" in result["message"]
        assert result["submit"] == "uncertain"
        assert result["after_reset"] == x.tolist() and result["state_reset"]
    elif expected == "ran":  # the interrupted request never ran: the state is run 1's
        assert result["y"] == (2 * x).tolist()
    else:
        assert "interrupted" in result["message"]
