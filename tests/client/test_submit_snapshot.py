"""``submit()`` takes its inputs as they are when it returns (docs/serving.md, "Requests").

The attack: one buffer reused for eight submits at depth 2, refilled after each ``submit``
returns, while the worker is stopped (SIGSTOP) so that six of the eight are still queued in the
client when the buffer changes. Each request must answer its own fill, on the shared region
and on the socket, in little- and big-endian byte order alike. Ordered, not raced: nothing is
answered before the test resumes the worker.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

from xstage import builtin_graphs
from xstage.client import WorkerClient

N = 1024


@pytest.fixture(scope="module")
def slice_graph(tmp_path_factory: pytest.TempPathFactory):
    return builtin_graphs.write(builtin_graphs.slice_graph(N, N),
                                tmp_path_factory.mktemp("g") / "copy.onnx")


@pytest.mark.parametrize("order", ["<", ">"], ids=["little", "big"])
@pytest.mark.parametrize("shm_mode", ["auto", "off"], ids=["region", "socket"])
def test_a_reused_buffer_gives_each_fill_its_own_answer(slice_graph, shm_mode, order):
    buf = np.zeros(N, np.dtype(np.float32).newbyteorder(order))
    with WorkerClient(sys.executable, depth=2, shm_mode=shm_mode) as client:
        client.load(slice_graph)
        os.kill(client.pid, signal.SIGSTOP)
        try:
            futures = []
            for i in range(8):
                buf[...] = i + 1
                futures.append(client.submit({"x": buf}, timeout=None))
            buf[...] = -1  # after the last submit: no request may see this
        finally:
            os.kill(client.pid, signal.SIGCONT)
        got = [float(f.result(timeout=120)["y"][0]) for f in futures]
        assert got == [float(i + 1) for i in range(8)]
        for i, f in enumerate(futures):
            assert (f.result()["y"] == i + 1).all()
