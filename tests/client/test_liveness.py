"""Workers die, hang and lie; the client notices at once, says why, and leaks nothing."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest

from tests.client.conftest import (
    EVENT_TIMEOUT,
    Background,
    fault_env,
    stop_on_run_env,
    wait_stopped,
    wait_until,
)
from xstage import errors
from xstage.client import Deadlines, WorkerClient, WorkerState


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def _killed_mid_call(w: WorkerClient, x: np.ndarray) -> BaseException | None:
    """``w.run(x)`` while its worker, a ``stop-on-run`` one, stops itself as it takes the run;
    then SIGKILL it: the call is in flight by order, never by a race with the compute. What
    the call raised (None)."""
    call = Background(lambda: w.run({"x": x}))
    assert w.pid is not None
    wait_stopped(w.pid)
    os.kill(w.pid, signal.SIGKILL)
    return call.raised()


def test_sigkill_mid_call_is_reported(graphs, fault_python):
    """A worker killed during a call: WorkerDied naming the signal; then dead.

    How fast: ``benchmarks/liveness.py`` (``sigkill_*``).
    """
    x = np.ones(4096, np.float32)
    with WorkerClient(fault_python, env=stop_on_run_env(2)) as w:
        w.load(graphs["slice"])
        w.run({"x": x})  # run 1: the region path is set up
        exc = _killed_mid_call(w, x)
        assert isinstance(exc, errors.WorkerDied), exc
        assert exc.exit_status == -signal.SIGKILL
        assert "killed by signal 9 (SIGKILL)" in str(exc)
        assert w.state is WorkerState.DEAD
        with pytest.raises(errors.StageClosed, match="died earlier"):
            w.run({"x": x})


def test_sigkill_mid_inline_call_is_reported(graphs, fault_python):
    x = np.ones(4096, np.float32)
    with WorkerClient(fault_python, shm_mode="off", env=stop_on_run_env(1)) as w:
        w.load(graphs["slice"])
        exc = _killed_mid_call(w, x)
        assert isinstance(exc, errors.WorkerDied) and "SIGKILL" in str(exc), exc


_CLIENT = textwrap.dedent(
    """
    import sys, time
    from xstage.client import WorkerClient
    w = WorkerClient(sys.argv[2])
    w.start()
    w.load(sys.argv[1])
    print(w.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("when", ["idle", "compiling"])
def test_killed_client_makes_its_worker_exit(graphs, fault_python, tmp_path, when):
    """The death pipe (stdin): SIGKILL the client and its worker exits, even mid-call.

    "compiling": the client dies once the worker has stamped that it took the call (seconds
    of MatMul), so its main thread is busy by order, not after a sleep. The wait is a liveness
    bound; how fast it goes is ``benchmarks/liveness.py``'s figure.
    """
    script = _CLIENT
    stamps = tmp_path / "stamps"
    if when == "compiling":  # the worker's main thread is busy when the client dies
        script = script.replace("print(w.pid, flush=True)", "print(w.pid, flush=True)\n"
                                "import numpy as np, threading\n"
                                "threading.Thread(target=w.run, args=({'x': np.ones((1536,1536),"
                                " 'float32')},), daemon=True).start()")
    client = subprocess.Popen([sys.executable, "-c", script, str(graphs["slow"]), fault_python],
                              stdout=subprocess.PIPE, env=stop_on_run_env(stop=False, stamps=stamps))
    try:
        pid = int(client.stdout.readline())
        worker = psutil.Process(pid)
        if when == "compiling":
            wait_until((stamps / "started-1").exists, "the worker taking the call")
        client.kill()
        client.wait()
        gone, alive = psutil.wait_procs([worker], timeout=EVENT_TIMEOUT)
        assert not alive, f"worker {pid} still alive {EVENT_TIMEOUT:.0f}s after its client died"
    finally:
        client.kill()


def test_no_hello_is_a_hello_timeout(fault_python):
    w = WorkerClient(fault_python, deadlines=Deadlines(spawn=1, hello=1), env=fault_env("no-hello"))
    with pytest.raises(errors.WorkerTimeout):
        w.start()
    assert w.state is WorkerState.DEAD and not _children()


def test_garbage_instead_of_hello_is_a_protocol_error(fault_python):
    w = WorkerClient(fault_python, env=fault_env("garbage"))
    with pytest.raises(errors.RemoteProtocolError, match="magic"):
        w.start()
    assert not _children()


@pytest.mark.parametrize(("fault", "message"), [
    ("bad-hash", "package hash differs"),
    ("bad-auth", "does not prove the session secret"),
])
def test_hello_that_does_not_check_out_is_refused(fault_python, fault, message):
    w = WorkerClient(fault_python, env=fault_env(fault))
    with pytest.raises(errors.RemoteProtocolError, match=message):
        w.start()
    assert not _children()


def test_crash_names_exit_status_and_log_tail(fault_python, graphs):
    w = WorkerClient(fault_python, env=fault_env("crash-after-hello"))
    w.start()
    with pytest.raises(errors.WorkerDied) as info:
        w.load(graphs["mlp"])
    assert info.value.exit_status == 3
    assert "exited with status 3" in str(info.value)
    assert "crashing on purpose" in info.value.log_tail
    w.close()


def test_reply_to_the_wrong_request_is_a_protocol_error(fault_python, graphs):
    w = WorkerClient(fault_python, env=fault_env("wrong-reply"))
    w.start()
    with pytest.raises(errors.RemoteProtocolError, match="expected loaded #1, the worker sent pong #42"):
        w.load(graphs["mlp"])
    assert w.state is WorkerState.DEAD and not _children()


def test_garbage_descriptor_in_the_region_is_a_protocol_error(fault_python, graphs):
    w = WorkerClient(fault_python, env=fault_env("garbage-descriptor"))
    w.start()
    w.load(graphs["slice"])
    with pytest.raises(errors.RemoteProtocolError, match="nbytes 8 does not match shape"):
        w.run({"x": np.ones(4096, np.float32)})
    assert w.state is WorkerState.DEAD and not _children()


@pytest.mark.parametrize("shm_mode", ["auto", "off"])
def test_hung_call_is_a_call_timeout_and_the_worker_is_killed(fault_python, graphs, shm_mode):
    w = WorkerClient(fault_python, deadlines=Deadlines(call=1.0), shm_mode=shm_mode,
                     env=fault_env("hang-on-run"))
    w.start()
    w.load(graphs["slice"])
    pid = w.pid
    with pytest.raises(errors.CallTimeout, match="call deadline of 1 s passed"):
        w.run({"x": np.ones(4096, np.float32)})
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert w.state is WorkerState.DEAD


def test_close_ends_the_whole_process_group(graphs):
    """A grandchild the worker started is ended with it."""
    with WorkerClient(sys.executable) as w:
        pgid = os.getpgid(w.pid)
        assert pgid == w.pid  # its own session and group
    assert not _children()


@pytest.mark.parametrize("cycles", [10, pytest.param(100, marks=pytest.mark.slow(
    reason="a soak: the ten cycles of the default run take the same path"))])
def test_hundred_start_kill_cycles_leave_nothing_behind(graphs, monkeypatch, cycles):
    """With the named-region fallback forced: no stray process, no /dev/shm name (10 cycles by
    default, the hundred with --run-slow)."""
    mine = f"/dev/shm/xstage-{os.getpid()}-*"  # this process creates them: not a neighbour's
    before = set(glob.glob(mine))
    x = np.ones(4096, np.float32)
    for _i in range(cycles):
        w = WorkerClient(sys.executable, shm_mode="named")
        w.start()
        w.load(graphs["slice"])
        assert w.link.region.kind == "named"
        w.run({"x": x})
        os.kill(w.pid, signal.SIGKILL)
        with pytest.raises(errors.WorkerDied):
            w.run({"x": x})
        w.close()
    assert set(glob.glob(mine)) - before == set()
    assert not _children()


def test_sigkill_over_tcp_is_reported(graphs, fault_python):
    """Across the TCP transport too, a dead worker is noticed at once."""
    x = np.ones(4096, np.float32)
    with WorkerClient(fault_python, transport="tcp", env=stop_on_run_env(3)) as w:
        w.load(graphs["slice"])
        w.run({"x": x})
        w.run({"x": x})  # the lean path from here on
        exc = _killed_mid_call(w, x)
        assert isinstance(exc, errors.WorkerDied) and "SIGKILL" in str(exc), exc
