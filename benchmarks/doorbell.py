"""The doorbell's wake-up: eventfds against the socketpair (and a futex), quiet and busy.

Two parts, in one run, each measured quiet and then beside ``--busy N`` busy-looping processes
(``benchmarks/_busy.py``), in interleaved rounds so machine noise lands on every arm alike:

* ``primitives``: two forked processes ping-pong one word through a shared page and wake each
  other with nothing else in the loop: ``eventfd`` (a blocking read), ``eventfd+poll`` (poll
  on the eventfd and a second fd, as the doorbell waits while it watches the control socket),
  ``socket`` (``select`` then ``recv`` on a socketpair, the old doorbell) and ``futex``
  (``syscall(SYS_futex)`` through ctypes on the shared word; x86-64 Linux). Median round trip.
* ``worker``: a 64 B call to a real worker (``WorkerClient`` on ``ort-cpu``, a Slice graph),
  the doorbell ``eventfd`` against ``socket`` (``XSTAGE_DOORBELL=socket``), each with both
  sides forced to block (``blocked``: spin budgets 0) and with the wait policy deciding
  (``policy``). Overhead = round trip − the worker's compute.

Run: ``PYTHONPATH=src python3 benchmarks/doorbell.py [--busy N] [--rounds R] [--json]``. Not a
test: nothing asserts.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import select
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _busy import Neighbours  # noqa: E402  (beside this file)

PRIMITIVES = ("eventfd", "eventfd+poll", "socket", "futex")
_U32 = struct.Struct("<I")
_ONE = struct.pack("=Q", 1)


def _futex():  # type: ignore[no-untyped-def]
    """(wait, wake) on a shared word through ``syscall(SYS_futex)``, or None off x86-64 Linux."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    sys_futex, futex_wait, futex_wake = 202, 0, 1  # shared (not FUTEX_PRIVATE): two processes
    call = libc.syscall
    call.restype = ctypes.c_long

    def wait(addr: int, value: int) -> None:
        call(sys_futex, ctypes.c_void_p(addr), futex_wait, value, None, None, 0)

    def wake(addr: int) -> None:
        call(sys_futex, ctypes.c_void_p(addr), futex_wake, 1, None, None, 0)

    return wait, wake


def _ping_pong(kind: str, calls: int) -> list[int]:
    """Round trips (ns) of one word between two processes woken by ``kind``."""
    mm = mmap.mmap(-1, 4096)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    a, b = socket.socketpair()
    e1, e2 = os.eventfd(0), os.eventfd(0)  # blocking reads: the eventfd arm
    p1, p2 = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
    futex = _futex()
    pid = os.fork()
    if pid == 0:  # the echo side
        try:
            poll = select.poll()
            poll.register(p1, select.POLLIN)
            poll.register(b, select.POLLIN)
            for i in range(1, calls + 1):
                if kind == "eventfd":
                    os.read(e1, 8)
                    os.write(e2, _ONE)
                elif kind == "eventfd+poll":
                    poll.poll()
                    os.read(p1, 8)
                    os.write(p2, _ONE)
                elif kind == "socket":
                    select.select([b], [], [], None)
                    b.recv(4096)
                    b.send(b"\0")
                else:
                    assert futex is not None
                    while _U32.unpack_from(mm, 0)[0] != i:
                        futex[0](base, i - 1)
                    _U32.pack_into(mm, 64, i)
                    futex[1](base + 64)
        finally:
            os._exit(0)
    poll = select.poll()
    poll.register(p2, select.POLLIN)
    poll.register(a, select.POLLIN)
    times = []
    perf = time.perf_counter_ns
    for i in range(1, calls + 1):
        t0 = perf()
        if kind == "eventfd":
            os.write(e1, _ONE)
            os.read(e2, 8)
        elif kind == "eventfd+poll":
            os.write(p1, _ONE)
            poll.poll()
            os.read(p2, 8)
        elif kind == "socket":
            a.send(b"\0")
            select.select([a], [], [], None)
            a.recv(4096)
        else:
            assert futex is not None
            _U32.pack_into(mm, 0, i)
            futex[1](base)
            while _U32.unpack_from(mm, 64)[0] != i:
                futex[0](base + 64, i - 1)
        times.append(perf() - t0)
    os.waitpid(pid, 0)
    for fd in (e1, e2, p1, p2):
        os.close(fd)
    a.close()
    b.close()
    return times


def _clients(tmp: Path):  # type: ignore[no-untyped-def]
    """Four workers on one 64 B Slice graph: (doorbell, waiting) → (client, feeds)."""
    from xstage import builtin_graphs
    from xstage.client import WorkerClient

    graph = builtin_graphs.write(builtin_graphs.slice_graph(16, 16), tmp / "s16.onnx")
    feeds = {"x": np.random.default_rng(0).standard_normal(16).astype(np.float32)}
    out = {}
    names = ("XSTAGE_DOORBELL", "XSTAGE_SPIN_SECONDS", "XSTAGE_WORKER_SPIN_SECONDS")
    saved = {k: os.environ.get(k) for k in names}  # each client's tuning reads them once
    try:
        for bell in ("eventfd", "socket"):
            for waiting in ("blocked", "policy"):
                os.environ["XSTAGE_DOORBELL"] = bell
                for k in names[1:]:
                    if waiting == "blocked":
                        os.environ[k] = "0"
                    elif saved[k] is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = saved[k]  # type: ignore[assignment]
                client = WorkerClient(sys.executable, shm_mode="auto")
                client.start()
                client.load(graph)
                assert client.link.bell is not None and client.link.bell.kind == bell
                out[f"{bell} {waiting}"] = client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=1000, help="calls per arm, round and state")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="busy-looping processes for the busy half (default: one per CPU)")
    args = parser.parse_args()
    kinds = [k for k in PRIMITIVES if k != "futex" or _futex() is not None]
    states = ("quiet", "busy") if args.busy else ("quiet",)
    prim = {s: {k: [] for k in kinds} for s in states}
    calls = {s: {} for s in states}
    with tempfile.TemporaryDirectory() as tmp, Neighbours(args.busy) as neighbours:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        clients, feeds = _clients(Path(tmp))
        try:
            for c in clients.values():
                for _ in range(200):
                    c.run(feeds)
            for _ in range(args.rounds):
                for state in states:
                    neighbours.busy() if state == "busy" else neighbours.quiet()
                    for kind in kinds:
                        prim[state][kind] += _ping_pong(kind, args.calls)
                    for name, c in clients.items():
                        over = calls[state].setdefault(name, [])
                        for _ in range(args.calls):
                            t0 = time.perf_counter_ns()
                            c.run(feeds)
                            over.append(time.perf_counter_ns() - t0 - c.last_timing["worker_ns"])
                        time.sleep(0.01)  # let a spinning worker fall asleep
        finally:
            neighbours.quiet()
            for c in clients.values():
                c.close()
    doc: dict = {"benchmark": "doorbell", "cpus": os.cpu_count(), "busy_processes": args.busy,
                 "python": sys.version.split()[0], "primitives_round_trip_us": {},
                 "call_overhead_us": {}}
    for state in states:
        doc["primitives_round_trip_us"][state] = {
            k: statistics.median(v) / 1e3 for k, v in prim[state].items()}
        doc["call_overhead_us"][state] = {
            k: statistics.median(v) / 1e3 for k, v in calls[state].items()}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    for state in states:
        print(f"{state}: wake-up primitives, median round trip (µs)")
        for k, v in doc["primitives_round_trip_us"][state].items():
            print(f"  {k:<14}{v:8.1f}")
        print(f"{state}: 64 B call through a worker, median overhead (µs)")
        for k, v in doc["call_overhead_us"][state].items():
            print(f"  {k:<18}{v:8.1f}")


if __name__ == "__main__":
    main()
