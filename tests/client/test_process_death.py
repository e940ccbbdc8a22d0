"""A worker's death is seen from the process, not only from its socket (docs/workers.md).

The attacks: a worker that starts a child holding the inherited control socket and then dies
(the socket never reads end-of-file: only the process can say it died); a call made after the
worker died while idle; a client killed with SIGKILL while its worker has a child of its own.
Nothing here races a clock: the deadlines are long and only the error's type is asserted; a
process's end is waited for as an event, with a liveness bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.client.conftest import EVENT_TIMEOUT, Background, fault_env, wait_until
from xstage import errors
from xstage.client import Deadlines, WorkerClient, WorkerState

#: A call deadline far past the liveness bound: a death noticed only when it passes would
#: fail the test as a hang (``Background.raised``), never pass as a ``CallTimeout``.
LONG = Deadlines(call=3600.0)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _child_exited(pid: int) -> bool:
    """Our child ``pid`` has exited, all its threads (``waitid`` without reaping: a leader
    thread shows as a zombie while its other threads still exit)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _stamped(stamps: Path, what: str) -> list[int]:
    return [int(p.name.split("-", 1)[1]) for p in stamps.glob(f"{what}-*")]


def _env(fault: str, stamps: Path) -> dict[str, str]:
    env = fault_env(fault)
    env["XSTAGE_FAULT_STAMPS"] = str(stamps)
    return env


@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_a_death_behind_a_child_holding_the_socket_is_worker_died(graphs, fault_python, stamps,
                                                                  shm_mode):
    x = np.ones(4096, np.float32)
    with WorkerClient(fault_python, env=_env("orphan-on-run", stamps), shm_mode=shm_mode,
                      deadlines=LONG) as w:
        w.load(graphs["slice"])
        exc = Background(lambda: w.run({"x": x})).raised()
        assert isinstance(exc, errors.WorkerDied), exc
        assert exc.exit_status == 9 and not exc.idle
        assert w.state is WorkerState.DEAD
        [child] = _stamped(stamps, "child")
        wait_until(lambda: _gone(child), f"the dead worker's child {child} ending")


@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_a_call_after_an_idle_death_is_never_sent(graphs, shm_mode):
    """The worker dies between calls: the next call says so (``idle``), without sending."""
    x = np.ones(4096, np.float32)
    with WorkerClient(sys.executable, shm_mode=shm_mode, deadlines=LONG) as w:
        w.load(graphs["slice"])
        w.run({"x": x})
        w.run({"x": x})  # the repeated signature's short way (lane, known inputs)
        pid = w.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _child_exited(pid), "the worker's death")
        with pytest.raises(errors.WorkerDied) as info:
            w.run({"x": x})
        assert info.value.idle and info.value.exit_status == -signal.SIGKILL
        with pytest.raises(errors.StageClosed, match="died earlier"):
            w.submit({"x": x})


_CLIENT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from xstage.client import WorkerClient
    w = WorkerClient(sys.argv[2])
    w.start()
    w.load(sys.argv[1])
    w.run({"x": np.ones(4096, np.float32)})
    print(w.pid, flush=True)
    time.sleep(3600)
    """
)


def test_a_killed_clients_worker_takes_its_children_with_it(graphs, fault_python, stamps):
    """SIGKILL the client: the worker's death-pipe watchdog ends its whole process group."""
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, str(graphs["slice"]), fault_python],
                              stdout=subprocess.PIPE, env=_env("child-at-start", stamps))
    try:
        worker = int(client.stdout.readline())
        [child] = _stamped(stamps, "child")
        assert not _gone(child)
        client.kill()
        client.wait()
        for pid, what in ((worker, "worker"), (child, "worker's child")):
            wait_until(lambda pid=pid: _gone(pid), f"the {what} {pid} ending after its client "
                       "was killed", EVENT_TIMEOUT)
    finally:
        client.kill()
        client.wait()
