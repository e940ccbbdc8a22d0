"""A stage or worker client in a forked child: refused there, and never the parent's loss.

The attacks, each in a process of its own (a script) so the fork happens outside pytest:
parent and child both call (the child used to read the parent's answers and the parent
the child's); a child's ``close()`` (a ``with`` block unwinding in it) used to shut down
the parent's worker; a child kept the worker's death pipe open, so a SIGKILLed parent's
worker lived on as long as the child did. What multiprocessing's fork start method and
DataLoader workers do.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import psutil

_PARENT_AND_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from xstage import errors
    from xstage.client import WorkerClient
    rng = np.random.default_rng(0)
    with WorkerClient(sys.executable, depth=2) as w:
        w.load(sys.argv[1])
        x = rng.standard_normal((8, 256)).astype(np.float32)
        want = w.run({"x": x})["y"].copy()
        w.submit({"x": x}).result()  # the pump thread exists at the fork
        pid = os.fork()
        if pid == 0:
            refused = []
            for name, call in [("run", lambda: w.run({"x": x})),
                               ("submit", lambda: w.submit({"x": x})),
                               ("input_slots", w.input_slots), ("ping", w.ping),
                               ("load", lambda: w.load(sys.argv[1]))]:
                try:
                    call()
                except errors.UsageError as exc:
                    if isinstance(exc, errors.ForkedStage) and str(os.getppid()) in str(exc):
                        refused.append(name)
            print("child refused", " ".join(refused), flush=True)
            sys.exit(0)  # unwinds the with block in the child: close() must not end the worker
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        for _ in range(20):  # the worker is the parent's still, and answers only it
            np.testing.assert_array_equal(w.run({"x": x})["y"], want)
        np.testing.assert_array_equal(w.submit({"x": x}).result()["y"], want)
        print("parent ok", flush=True)
    """
)


def test_a_forked_child_is_refused_and_its_close_leaves_the_parents_worker(graphs):
    done = subprocess.run([sys.executable, "-c", _PARENT_AND_CHILD, str(graphs["mlp"])],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child refused run submit input_slots ping load" in done.stdout
    assert "parent ok" in done.stdout


_PARENT_KILLED = textwrap.dedent(
    """
    import os, sys, time
    from xstage.client import WorkerClient
    w = WorkerClient(sys.executable)
    w.start()
    w.load(sys.argv[1])
    child = os.fork()
    if child == 0:
        time.sleep(600)  # a long-lived child (a DataLoader worker) outliving its parent
        os._exit(0)
    print(w.pid, child, flush=True)
    time.sleep(600)
    """
)


def test_a_killed_parents_worker_exits_while_a_forked_child_lives(graphs):
    """The child closed its copies of the death pipe and the control socket at the fork."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT_KILLED, str(graphs["mlp"])],
                              stdout=subprocess.PIPE, env=dict(os.environ))
    child = None
    try:
        worker_pid, child_pid = map(int, parent.stdout.readline().split())
        worker, child = psutil.Process(worker_pid), psutil.Process(child_pid)
        parent.kill()
        parent.wait()
        assert child.is_running()
        _, alive = psutil.wait_procs([worker], timeout=60.0)
        assert not alive, f"worker {worker_pid} outlived its killed client"
    finally:
        parent.kill()
        if child is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
