"""Transport cost of one worker call, side by side with its floor and the usual alternatives.

Each payload is moved by every arm in interleaved rounds (so machine noise lands on all arms
alike), and medians are compared as ratios. Two phases in one run: the shared-memory arms
with their floor, then the socket and pickle arms with theirs (their megabytes of traffic
would otherwise flush the caches the first phase lives in, which measures the neighbours):

* ``floor``     — in-process ``np.copyto`` of the same input and output bytes into
                  preallocated buffers: the cost of touching the bytes once each way.
* ``xstage``    — ``WorkerClient.run`` on ``ort-cpu`` through the shared region (validation
                  included, a fresh output array per call). The worker reports its own time
                  (onnxruntime's Slice); *overhead* is the round trip minus that.
* ``xstage-out``— the same with ``out=`` (a preallocated output, as the floor has).
* ``inline``    — the same worker with the region off: tensors inline on the control socket.
* ``tcp-auth``  — the same worker over the TCP connect-back (``transport="tcp"``): inline
                  frames as authenticated records, HMAC-SHA256 on every one (docs/security.md).
* ``tcp``       — a TCP-loopback stream to an echo process carrying the same bytes.
* ``mp-pickle`` — ``multiprocessing`` with pickled numpy arrays to a child process.

Each row also carries ``mac_us_per_mib``: HMAC-SHA256 over 1 MiB in this process, the single-core
rate of the MAC the ``tcp-auth`` arm pays on each end, measured in the same run; and per arm
``gbps_each_way``: input bytes over half the overhead.

For the shared-memory arms the overhead is split into the caller's two copies (``copies``,
as the client measures them) and the rest: the copies alone show how far the floor — a copy
whose lines one core owns — is from a copy into lines the worker's core touched last.

Run: ``python benchmarks/transport.py [--json] [--rounds N]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xstage import builtin_graphs
from xstage.client import WorkerClient
from xstage_remote import shm

PAYLOADS = [
    ("64 B", 16, 16),
    ("1 MiB + 1 MiB", 262_144, 262_144),
    ("4.8 MB + 4.0 MB", 1_200_000, 1_000_000),
]


# --------------------------------------------------------------------------- peers
def _tcp_echo(port_q: mp.Queue, n_in: int, n_out: int) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(n_in * 4)
    view = memoryview(buf)
    while True:
        got = 0
        while got < len(buf):
            k = conn.recv_into(view[got:])
            if k == 0:
                return
            got += k
        conn.sendall(view[: n_out * 4])


def _mp_child(conn, n_out: int) -> None:  # type: ignore[no-untyped-def]
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x[:n_out].copy())


# --------------------------------------------------------------------------- arms
class Arm:
    def __init__(self, name: str, call: Callable[[], int], close: Callable[[], None],
                 timing: Callable[[], dict] | None = None) -> None:
        self.name, self.call, self.close, self.timing = name, call, close, timing
        self.rt: list[int] = []
        self.worker: list[int] = []
        self.copies: list[int] = []  # the caller's copy-in + copy-out, shared path only


def _xstage_arm(name: str, graph: Path, x: np.ndarray, n_out: int, *, shm_mode: str,
                use_out: bool, transport: str = "local") -> Arm:
    client = WorkerClient(sys.executable, shm_mode=shm_mode, transport=transport)
    client.start()
    client.load(graph)
    out = {"y": np.empty(n_out, np.float32)} if use_out else None
    feeds = {"x": x}

    def call() -> int:
        client.run(feeds, out=out)
        return client.last_timing.get("worker_ns", 0)

    return Arm(name, call, client.close, lambda: client.last_timing)


def _tcp_arm(x: np.ndarray, n_out: int) -> Arm:
    q: mp.Queue = mp.Queue()
    proc = mp.Process(target=_tcp_echo, args=(q, x.size, n_out), daemon=True)
    proc.start()
    sock = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = np.empty(n_out, np.float32)
    view = memoryview(out).cast("B")
    data = memoryview(x).cast("B")

    def call() -> int:
        sock.sendall(data)
        got = 0
        while got < len(view):
            got += sock.recv_into(view[got:])
        return 0

    def close() -> None:
        sock.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()

    return Arm("tcp", call, close)


def _mp_arm(x: np.ndarray, n_out: int) -> Arm:
    parent, child = mp.Pipe()
    proc = mp.Process(target=_mp_child, args=(child, n_out), daemon=True)
    proc.start()

    def call() -> int:
        parent.send(x)
        parent.recv()
        return 0

    def close() -> None:
        parent.send(None)
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()

    return Arm("mp-pickle", call, close)


def _floor_arm(x: np.ndarray, n_out: int) -> Arm:
    a = np.empty_like(x)
    y = x[:n_out].copy()
    b = np.empty_like(y)

    def call() -> int:
        np.copyto(a, x)
        np.copyto(b, y)
        return 0

    return Arm("floor", call, lambda: None)


# --------------------------------------------------------------------------- run
ARMS = ("xstage", "xstage-out", "inline", "tcp-auth", "tcp", "mp-pickle")


def mac_us_per_mib(repeats: int = 30) -> float:
    """Median µs of HMAC-SHA256 over 1 MiB on one core (the tcp-auth arm's MAC)."""
    data = os.urandom(1 << 20)
    key = os.urandom(32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        hmac.new(key, data, hashlib.sha256).digest()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def measure(rounds: int, calls: int, tmp: Path, only: tuple[str, ...] = ARMS) -> list[dict]:
    results = []
    for label, n_in, n_out in PAYLOADS:
        graph = builtin_graphs.write(builtin_graphs.slice_graph(n_in, n_out), tmp / f"s{n_in}.onnx")
        x = np.random.default_rng(0).standard_normal(n_in).astype(np.float32)
        makers = {
            "xstage": lambda g=graph, x=x, n=n_out: _xstage_arm("xstage", g, x, n, shm_mode="auto",
                                                              use_out=False),
            "xstage-out": lambda g=graph, x=x, n=n_out: _xstage_arm("xstage-out", g, x, n,
                                                                  shm_mode="auto", use_out=True),
            "inline": lambda g=graph, x=x, n=n_out: _xstage_arm("inline", g, x, n, shm_mode="off",
                                                              use_out=False),
            "tcp-auth": lambda g=graph, x=x, n=n_out: _xstage_arm("tcp-auth", g, x, n,
                                                                shm_mode="off", use_out=False,
                                                                transport="tcp"),
            "tcp": lambda x=x, n=n_out: _tcp_arm(x, n),
            "mp-pickle": lambda x=x, n=n_out: _mp_arm(x, n),
        }
        arms = [_floor_arm(x, n_out)] + [makers[name]() for name in only]
        try:
            per_round = max(1, calls // rounds) if n_in > 1000 else max(1, 4 * calls // rounds)
            for arm in arms:  # warm-up: first touches, allocator, caches
                for _ in range(50):
                    arm.call()
            for _ in range(rounds):
                for arm in arms:
                    for _ in range(per_round):
                        t0 = time.perf_counter_ns()
                        w = arm.call()
                        arm.rt.append(time.perf_counter_ns() - t0)
                        arm.worker.append(w)
                        t = arm.timing() if arm.timing else {}
                        if "copy_out_ns" in t:
                            arm.copies.append(t["copy_in_ns"] + t["copy_out_ns"])
                    # A worker spins SPIN_SECONDS after its last call; let it fall asleep so
                    # the next arm is not measured against a core someone else is burning.
                    time.sleep(3 * shm.SPIN_SECONDS)
        finally:
            for arm in arms:
                arm.close()
        floor = statistics.median(arms[0].rt)
        row = {"payload": label, "bytes_in": n_in * 4, "bytes_out": n_out * 4,
               "floor_us": floor / 1e3, "mac_us_per_mib": mac_us_per_mib(), "arms": {}}
        for arm in arms[1:]:
            over = [r - w for r, w in zip(arm.rt, arm.worker, strict=True)]
            med_over = statistics.median(over)
            row["arms"][arm.name] = {
                "round_trip_us": statistics.median(arm.rt) / 1e3,
                "worker_us": statistics.median(arm.worker) / 1e3,
                "overhead_us": med_over / 1e3,
                "half_round_trip_us": med_over / 2e3,
                "ratio_vs_memcpy": med_over / floor if floor else None,
                "gbps_each_way": n_in * 4 / (med_over / 2) if med_over > 0 else None,
                "samples": len(arm.rt),
            }
            if arm.copies:
                # The overhead split: the caller's two copies (one each way, across cores:
                # the worker touched those lines last) and everything else (validation,
                # descriptors, both wake-ups, the worker's bookkeeping).
                copies = statistics.median(arm.copies)
                row["arms"][arm.name].update(copies_us=copies / 1e3,
                                             copies_vs_memcpy=copies / floor if floor else None,
                                             rest_us=(med_over - copies) / 1e3)
        first = "xstage" if "xstage" in row["arms"] else next(iter(row["arms"]))
        row["ratio_vs_memcpy"] = row["arms"][first]["ratio_vs_memcpy"]
        results.append(row)
    return results


#: Arms that move megabytes through sockets or pickle flush the caches the shared-memory arms
#: live in, so they are interleaved with their own floor in a second phase of the same run.
PHASES = (("xstage", "xstage-out"), ("inline", "tcp-auth", "tcp", "mp-pickle"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=400, help="calls per arm and payload")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms besides the floor (default: {','.join(ARMS)})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        wanted = [a for a in args.arms.split(",") if a]
        results = []
        for phase in PHASES:
            arms = tuple(a for a in phase if a in wanted)
            if not arms:
                continue
            rows = measure(args.rounds, args.calls, Path(tmp), arms)
            if not results:
                results = rows
            else:
                for row, more in zip(results, rows, strict=True):
                    row["arms"].update(more["arms"])
                    row.setdefault("floor_us_by_phase", [row["floor_us"]]).append(more["floor_us"])
    doc = {"benchmark": "transport", "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "results": results}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{'payload':<18}{'arm':<12}{'round trip':>12}{'worker':>10}{'overhead':>10}"
          f"{'half RTT':>10}{'× floor':>9}{'GB/s':>7}{'copies':>10}{'× floor':>9}{'rest':>9}")
    for row in results:
        print(f"{row['payload']:<18}{'floor':<12}{row['floor_us']:>10.1f}µs   "
              f"(HMAC-SHA256: {row['mac_us_per_mib']:.0f} µs/MiB, "
              f"{(1 << 20) / row['mac_us_per_mib'] / 1e3:.2f} GB/s on one core)")
        for name, a in row["arms"].items():
            line = (f"{'':<18}{name:<12}{a['round_trip_us']:>10.1f}µs{a['worker_us']:>8.1f}µs"
                    f"{a['overhead_us']:>8.1f}µs{a['half_round_trip_us']:>8.1f}µs"
                    f"{a['ratio_vs_memcpy']:>9.2f}{a['gbps_each_way'] or 0:>7.2f}")
            if "copies_us" in a:
                line += (f"{a['copies_us']:>8.1f}µs{a['copies_vs_memcpy']:>9.2f}"
                         f"{a['rest_us']:>7.1f}µs")
            print(line)


if __name__ == "__main__":
    main()
