"""One 64 B call through the shared region split at its stamps, and where each process ran.

The busy-machine case taken apart: ``WorkerClient.run`` on ``ort-cpu`` (a Slice graph, 16
float32 each way) in this process, quiet and then beside ``--busy N`` busy-looping processes
(``benchmarks/_busy.py``). Per state, medians over ``--calls`` calls of:

* ``pre``: from the call to the request's publish (``published_ns``: the caller's Python and
  the input write);
* ``to_worker``: publish to the worker's ``start_ns`` (the ring, the worker's wake-up or spin,
  its Python before the run);
* ``compute``: the worker's run (``end_ns - start_ns``);
* ``back``: the worker's ``end_ns`` to the call's return (its answer, the ring, the caller's
  wake-up or spin, the output read);
* ``half``: half of (round trip − the worker's compute), as ``hotpath.py`` and ``transport.py``.

A thread samples every 2 ms which CPU the caller, the worker's main thread and each busy
process last ran on (``/proc/PID/task/TID/stat`` field 39) and prints the most common
placements. Run: ``PYTHONPATH=src python3 benchmarks/call_split.py [--busy N] [--calls N]``;
``--pin CPU`` puts the caller and its worker on one CPU (the busy processes stay free). Not a
test: nothing asserts.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from xstage import builtin_graphs
from xstage.client import WorkerClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _busy import Neighbours  # noqa: E402  (beside this file)


def _cpu_of(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, metavar="N")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--pin", type=int, default=None, metavar="CPU",
                        help="the caller and its worker on this CPU only")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp, Neighbours(args.busy) as nb:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), Path(tmp) / "s.onnx")
        if args.pin is not None:
            os.sched_setaffinity(0, {args.pin})  # the worker inherits it
        client = WorkerClient(sys.executable)
        client.start()
        client.load(graph)
        feeds = {"x": np.ones(16, np.float32)}
        me = os.getpid()
        try:
            for state in ("quiet", "busy") if args.busy else ("quiet",):
                getattr(nb, state)()
                for _ in range(300):
                    client.run(feeds)
                before = client.waits()
                stop = threading.Event()
                places: collections.Counter[tuple[int, ...]] = collections.Counter()

                def sample(stop: threading.Event = stop,
                           places: collections.Counter[tuple[int, ...]] = places) -> None:
                    while not stop.wait(0.002):
                        places[(_cpu_of(f"/proc/{me}/task/{me}/stat"),
                                _cpu_of(f"/proc/{client.pid}/task/{client.pid}/stat"),
                                *(_cpu_of(f"/proc/{p}/stat") for p in nb.pids))] += 1

                thread = threading.Thread(target=sample, daemon=True)
                thread.start()
                rows = []
                cpu0 = time.thread_time_ns()
                for _ in range(args.calls):
                    t0 = time.monotonic_ns()
                    client.run(feeds)
                    t1 = time.monotonic_ns()
                    t = client.last_timing
                    rows.append((t["published_ns"] - t0, t["start_ns"] - t["published_ns"],
                                 t["end_ns"] - t["start_ns"], t1 - t["end_ns"],
                                 (t1 - t0 - t["worker_ns"]) / 2))
                cpu = (time.thread_time_ns() - cpu0) / args.calls / 1e3
                stop.set()
                thread.join()
                med = [statistics.median(r[i] for r in rows) / 1e3 for i in range(5)]
                print(f"{state:<6}pre {med[0]:.1f}  to_worker {med[1]:.1f}  compute {med[2]:.1f}"
                      f"  back {med[3]:.1f}  half {med[4]:.1f} µs; caller CPU {cpu:.1f} µs/call")
                print(f"{'':<6}placements (caller, worker, busy...): {places.most_common(3)}")
                after = client.waits()
                for side in ("caller", "worker"):
                    delta = {k: v - before.get(side, {}).get("rules", {}).get(k, 0)
                             for k, v in after.get(side, {}).get("rules", {}).items()}
                    print(f"{'':<6}{side}: " + ", ".join(f"{k} {v}" for k, v in delta.items() if v))
        finally:
            client.close()


if __name__ == "__main__":
    main()
