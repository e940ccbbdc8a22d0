"""The authenticated socket path, layer by layer: where a call's time goes.

``transport.py``'s ``tcp-auth`` arm times a whole ``WorkerClient.run`` over the TCP
connect-back. This script takes that call apart, in one run, on TCP loopback:

* **Layers** (two processes, an echo of the same bytes, arms interleaved in rounds; medians):
  ``tcp`` a bare echo (the floor: two wake-ups and the kernel's copies), ``frames`` plain
  frames (``wire.send_frame``/``recv_frame``), ``fast`` binary call frames (``XSB1``,
  ``wire.FastCodec``), ``channel`` and ``chan-fast`` the same two as authenticated records
  (``wire.Channel``), and ``xstage`` the whole call (``WorkerClient.run``,
  ``transport="tcp"``, a Slice graph): its overhead is the round trip minus the worker's own
  time, as in ``transport.py``. Each layer's difference from the one below is its cost.
  Beside each: both ends' CPU time over the wall time of the same calls (main threads,
  ``/proc/PID/schedstat``): above 1 the two ends ran at once (the MACs overlapped), below 1
  someone waited for a CPU.
* **CPU per frame** (one thread, both ends over a TCP loopback pair, the thread's CPU clock,
  which a loaded machine does not inflate with waiting): encoding, sealing, the kernel's send
  and receive, checking the tag, checking the header, the arrays; and the system calls a
  64 B round trip makes on each side (counted by wrapping the sockets).
* **The MAC** on one core: HMAC-SHA256 (``hmac.digest`` and the records' prepared ``_Mac``),
  keyed BLAKE2b and BLAKE2s, per MiB and per 100-byte record (the candidates the issue
  names; the records use ``wire.MAC_NAME``).

Targets: 64 B half round trip ≤ 15 µs over loopback, and ≥ 1 GB/s each way at
1 MiB in + 1 MiB out with the MAC. ``--pin`` puts the two ends of each layer on different
CPUs (``sched_setaffinity``), to show what overlap of the two ends' MACs gives where the
scheduler would otherwise run both on one CPU. Not a test: nothing asserts.

``--compare SRC`` times the whole call under another tree (``SRC``, e.g. the parent
commit's ``src/`` in a worktree: before) and this one (after), one process pair per arm and
round, interleaved, and prints the medians of the rounds and their ratio. The ``chan-mt`` arm
(1 MiB) is ``channel`` with its payload records hashed on threads (``wire.MAC_THREADS``, at
least 2), beside ``channel`` hashed in the thread that sends or receives. ``chan-v0`` and
``chan-mt-v0`` are the two as they were before ``c9f0e0f`` (two sends per payload record; a
threaded reader that waits out every pending tag before it blocks), and the ``-256k`` arms
today's channel with the records of before (256 KiB, where 512 KiB is now the default): an A/B
of both changes in one run. After the layers, one line per 1 MiB arm says whether the issue's target (≥ 1 GB/s
each way) is met. ``benchmarks/channel_timeline.py`` takes one 1 MiB round trip apart.

``--together`` puts every arm's two ends on one CPU, the one the measuring process runs on
(the echo processes pin themselves there, the xstage worker inherits it): on a virtual
machine whose idle vCPUs halt, a wake-up on another CPU costs tens of µs that every arm pays
alike (docs/performance.md#channel); on one CPU each arm's time is its CPU work. ``--compare`` times
the ``tcp`` and ``chan-fast`` arms in the same rounds as the two trees' whole calls, and
prints the whole call's ratio to ``tcp``.

``--busy N`` runs everything beside N CPU-burning processes (``benchmarks/_busy.py``), for a
busy machine's before/after; ``--small`` leaves out the 1 MiB payload.

Run: ``PYTHONPATH=src python benchmarks/channel.py [--json] [--rounds N] [--pin]
[--together] [--compare SRC] [--busy N] [--small]``.
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
from _sockets import tcp_pair  # noqa: E402  (beside this file)

from xstage_remote import wire

SECRET = "5e" * 16
DIGEST = hashlib.sha256(b"benchmarks/channel.py").digest()
PAYLOADS = [("64 B", 16), ("1 MiB", 262_144)]
RESULT = {"worker_ns": 5000, "rss": 10**8, "peak": 10**9}  # a reply's usual timing block
TARGET_BYTES = 1 << 20  # the 1 MiB each way


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu % (os.cpu_count() or 1)})


# --------------------------------------------------------------------------- layers
class _Before(wire.Channel):
    """The channel's large frames as they went before ``c9f0e0f`` (the A/B arms ``chan-v0``
    and ``chan-mt-v0``): records of 256 KiB, the head record alone, then each payload
    record's bytes and its trailer in two sends; a reader hashing on threads waits for every
    pending tag before it blocks for bytes."""

    def __init__(self, *args) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args)
        self.chunk_bytes = 1 << 18

    def _send_record(self, ahead, chunk):  # type: ignore[no-untyped-def]
        wire.send_parts(self.sock, ahead)
        wire.send_parts(self.sock, chunk)
        return [self._seal(chunk)]

    def _send_sealed_ahead(self, ahead, records):  # type: ignore[no-untyped-def]
        pool = wire._mac_pool(self.mac_threads)
        first = self.sent
        self.sent += len(records)
        counters = [wire.COUNTER.pack(first + i) for i in range(len(records))]
        tags = [pool.submit(self._seal_mac.tag, c, chunk) for c, chunk in zip(counters, records,
                                                                                strict=True)]
        wire.send_parts(self.sock, ahead)
        for counter, chunk, tag in zip(counters, records, tags, strict=True):
            wire.send_parts(self.sock, chunk)
            wire.send_parts(self.sock, [counter + tag.result()])

    def _verify_ready(self, pending, waker):  # type: ignore[no-untyped-def]
        while pending and pending[0][3] is not None:
            part, tag, start, trailer = pending.pop(0)
            self._verify((part,), trailer, f"payload at byte {start}", tag.result())


def _channel(layer: str, sock: socket.socket, role: str) -> wire.Channel | None:
    """The layer's channel end: ``chan-mt*`` arms hash on threads (``wire.MAC_THREADS``, at
    least 2), the others in the thread that sends or receives; the ``-v0`` arms send and
    wait as before (``_Before``), the ``-256k`` arms use 256 KiB records."""
    if not layer.startswith("chan"):
        return None
    cls = _Before if layer.endswith("-v0") else wire.Channel
    channel = cls(sock, SECRET, DIGEST, role)
    channel.mac_threads = max(2, wire.MAC_THREADS) if layer.startswith("chan-mt") else 0
    if layer.endswith("-256k"):  # today's sends and waits, the records of before
        channel.chunk_bytes = 1 << 18
    return channel


def _echo(port_q: mp.Queue, layer: str, n: int, cpu: int | None) -> None:
    _pin(cpu)
    srv = socket.create_server(("127.0.0.1", 0))
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if layer == "tcp":
        buf = bytearray(n * 4)
        view = memoryview(buf)
        while True:
            got = 0
            while got < len(buf):
                k = conn.recv_into(view[got:])
                if k == 0:
                    return
                got += k
            conn.sendall(view)
    channel = _channel(layer, conn, "worker")
    codec = wire.FastCodec(["x"], ["y"])
    while True:
        try:
            frame = channel.recv(codec=codec) if channel else wire.recv_frame(conn, codec=codec)
        except EOFError:
            return
        header = {"op": "result", "id": frame.id, "gen": 1, "timing": RESULT}
        arrays = {"y": frame.arrays()["x"]}
        if frame.fast:  # binary call frames (the "fast" and "chan-fast" layers)
            parts = wire.encode_fast(codec, "result", frame.id, 1, arrays, timing=RESULT)
            if channel:
                channel.send_parts(parts)
            else:
                wire.send_encoded(conn, parts)
        elif channel:
            channel.send(header, arrays)
        else:
            wire.send_frame(conn, header, arrays)


def _cpu_ns(pid: int) -> int:
    """CPU time a process's main thread has run, in ns (``/proc/PID/schedstat``), or 0."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


class Layer:
    def __init__(self, name: str, call: Callable[[], int], close: Callable[[], None],
                 peer: int | None = None) -> None:
        self.name, self.call, self.close, self.peer = name, call, close, peer
        self.over: list[int] = []
        self.wall = self.cpu = 0  # ns, over the measured calls: both ends' CPU against the wall

    def cpu_now(self) -> int:
        return _cpu_ns(os.getpid()) + (_cpu_ns(self.peer) if self.peer else 0)


def _together_cpu() -> int:
    """The CPU this process runs on now (``--together`` puts every arm's two ends there)."""
    try:
        return os.sched_getcpu()  # type: ignore[attr-defined,no-any-return]
    except (AttributeError, OSError):
        return min(os.sched_getaffinity(0))


def _socket_layer(layer: str, x: np.ndarray, pin: bool, cpu: int | None = None) -> Layer:
    q: mp.Queue = mp.Queue()
    where = cpu if cpu is not None else (1 if pin else None)
    proc = mp.Process(target=_echo, args=(q, layer, x.size, where), daemon=True)
    proc.start()
    sock = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    channel = _channel(layer, sock, "client")
    data = memoryview(x).cast("B")
    back = bytearray(len(data))
    view = memoryview(back)
    ids = iter(range(1 << 62))
    codec = wire.FastCodec(["x"], ["y"])

    def call() -> int:
        if layer.endswith("fast"):  # binary call frames: plain, or as authenticated records
            parts = wire.encode_fast(codec, "run", next(ids), 1, {"x": x})
            if channel:
                channel.send_parts(parts)
                channel.recv(codec=codec).arrays()
            else:
                wire.send_encoded(sock, parts)
                wire.recv_frame(sock, codec=codec).arrays()
            return 0
        if layer == "tcp":
            sock.sendall(data)
            got = 0
            while got < len(view):
                got += sock.recv_into(view[got:])
            return 0
        header = {"op": "run", "id": next(ids), "gen": 1}
        if channel:
            channel.send(header, {"x": x})
            channel.recv().arrays()
        else:
            wire.send_frame(sock, header, {"x": x})
            wire.recv_frame(sock).arrays()
        return 0

    def close() -> None:
        sock.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()

    return Layer(layer, call, close, proc.pid)


def _xstage_layer(x: np.ndarray, tmp: Path) -> Layer:
    from xstage import builtin_graphs
    from xstage.client import WorkerClient

    graph = builtin_graphs.write(builtin_graphs.slice_graph(x.size, x.size), tmp / f"s{x.size}.onnx")
    client = WorkerClient(sys.executable, shm_mode="off", transport="tcp")
    client.start()
    client.load(graph)

    def call() -> int:
        client.run({"x": x})
        return int(client.last_timing.get("worker_ns", 0))

    return Layer("xstage", call, client.close, client.pid)


def layers(rounds: int, calls: int, pin: bool, with_worker: bool,
           together: bool = False) -> list[dict]:
    rows = []
    cpu = _together_cpu() if together else None
    if cpu is not None:
        _pin(cpu)  # the xstage worker inherits it; each echo process pins itself there
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        for label, n in PAYLOADS:
            x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            names = ("tcp", "frames", "fast", "channel", "chan-fast") + (
                ("chan-256k", "chan-v0", "chan-mt", "chan-mt-256k", "chan-mt-v0")
                if n > 1000 else ())
            arms = [_socket_layer(name, x, pin, cpu) for name in names]
            if with_worker:
                arms.append(_xstage_layer(x, Path(tmp)))
            if pin:
                _pin(0)
            try:
                per_round = max(1, calls // rounds) if n > 1000 else max(1, 4 * calls // rounds)
                for arm in arms:
                    for _ in range(30):
                        arm.call()
                for _ in range(rounds):
                    for arm in arms:
                        cpu0, wall0 = arm.cpu_now(), time.perf_counter_ns()
                        for _ in range(per_round):
                            t0 = time.perf_counter_ns()
                            worker = arm.call()
                            arm.over.append(time.perf_counter_ns() - t0 - worker)
                        arm.wall += time.perf_counter_ns() - wall0
                        arm.cpu += arm.cpu_now() - cpu0
            finally:
                for arm in arms:
                    arm.close()
                if pin and hasattr(os, "sched_setaffinity"):
                    os.sched_setaffinity(0, range(os.cpu_count() or 1))
            row: dict = {"payload": label, "bytes_each_way": n * 4, "arms": {}}
            for arm in arms:
                med = statistics.median(arm.over)
                row["arms"][arm.name] = {"half_round_trip_us": med / 2e3,
                                         "gbps_each_way": n * 4 / (med / 2),
                                         "both_ends_cpu_over_wall": arm.cpu / arm.wall,
                                         "samples": len(arm.over)}
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- CPU per frame
class _Counting:
    """A socket that counts the system calls the channel makes through it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.calls = sock, 0

    def sendall(self, data) -> None:  # type: ignore[no-untyped-def]
        self.calls += 1
        self.sock.sendall(data)

    def sendmsg(self, buffers) -> int:  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.sock.sendmsg(buffers)

    def recv_into(self, *args) -> int:  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.sock.recv_into(*args)


def cpu_per_frame(repeats: int = 25, per: int = 200) -> dict:
    """Median thread-CPU µs of each step of one 64 B reply frame (the client reads it)."""
    a, b = tcp_pair()
    ca, cb = _Counting(a), _Counting(b)
    tx, rx = wire.Channel(ca, SECRET, DIGEST, "worker"), wire.Channel(cb, SECRET, DIGEST, "client")
    y = np.zeros(16, np.float32)
    header = {"op": "result", "id": 3, "gen": 1, "timing": RESULT}
    parts = wire.encode_frame(header, {"y": y})
    raw = bytes(parts[1])
    blob = b"".join(bytes(p) for p in parts) + bytes(wire.TRAILER_BYTES)
    sink = bytearray(1 << 16)
    mac = wire._Mac(os.urandom(32))
    counter = wire.COUNTER.pack(1)
    head, tensors = wire._validate_head(raw, 64)
    frame = wire.Frame(head, np.zeros(64, np.uint8), tensors)
    codec = wire.FastCodec(["x"], ["y"])
    fast_raw = bytes(wire.encode_fast(codec, "result", 3, 1, {"y": y}, timing=RESULT)[1])

    def tcp_send() -> None:
        a.sendall(blob)
        b.recv_into(sink)

    steps = {
        "encode (encode_frame)": lambda: wire.encode_frame(header, {"y": y}),
        "seal or verify (MAC of one record)": lambda: mac.tag(counter, [blob]),
        "kernel: TCP send + receive": tcp_send,
        "header check (_validate_head)": lambda: wire._validate_head(raw, 64),
        "binary encode (encode_fast)": lambda: wire.encode_fast(codec, "result", 3, 1, {"y": y},
                                                                timing=RESULT),
        "binary header check (FastCodec)": lambda: codec.decode_head(fast_raw, 64),
        "arrays (Frame.arrays)": frame.arrays,
        "whole frame (Channel.send + recv)": lambda: (tx.send(header, {"y": y}), rx.recv().arrays()),
        "whole binary frame (send_parts + recv)": lambda: (
            tx.send_parts(wire.encode_fast(codec, "result", 3, 1, {"y": y}, timing=RESULT)),
            rx.recv(codec=codec).arrays()),
    }
    clock = time.thread_time_ns
    got: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = clock()
            for _ in range(per):
                fn()
            got[name].append((clock() - t0) / per / 1e3)
    before = ca.calls, cb.calls
    tx.send(header, {"y": y})
    rx.recv()
    syscalls = {"send side": ca.calls - before[0], "receive side": cb.calls - before[1]}
    a.close()
    b.close()
    return {"steps_us": {k: statistics.median(v) for k, v in got.items()},
            "socket_calls_per_small_frame": syscalls}


# --------------------------------------------------------------------------- the MAC
def mac_costs(repeats: int = 15) -> dict:
    key = os.urandom(32)
    big = os.urandom(1 << 20)
    small = os.urandom(100)
    prepared = wire._Mac(key)
    b2b = hashlib.blake2b(key=key, digest_size=32)
    b2s = hashlib.blake2s(key=key, digest_size=32)

    def copy_update(h):  # type: ignore[no-untyped-def]
        def run(data: bytes) -> bytes:
            m = h.copy()
            m.update(data)
            return m.digest()
        return run

    macs = {
        "HMAC-SHA256 (hmac.digest)": lambda d: hmac.digest(key, d, "sha256"),
        "HMAC-SHA256 (prepared, the records')": lambda d: prepared.tag(b"", [d]),
        "keyed BLAKE2b-256": copy_update(b2b),
        "keyed BLAKE2s-256": copy_update(b2s),
    }
    out = {}
    for name, fn in macs.items():
        per_mib, per_rec = [], []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn(big)
            per_mib.append((time.perf_counter_ns() - t0) / 1e3)
            t0 = time.perf_counter_ns()
            for _ in range(500):
                fn(small)
            per_rec.append((time.perf_counter_ns() - t0) / 500 / 1e3)
        mib = min(per_mib)  # the single-core rate: the least disturbed repeat
        out[name] = {"us_per_mib": mib, "gbps": (1 << 20) / mib / 1e3,
                     "us_per_100_byte_record": min(per_rec)}
    return out


# --------------------------------------------------------------------------- before/after
def _xstage_arm(n: int, calls: int) -> dict:
    """The whole-call layer alone, in this process (run by ``compare`` under either tree)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        arm = _xstage_layer(x, Path(tmp))
        try:
            for _ in range(30):
                arm.call()
            cpu0, peer0 = time.thread_time_ns(), _cpu_ns(arm.peer or 0)
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                worker = arm.call()
                arm.over.append(time.perf_counter_ns() - t0 - worker)
            client_cpu, worker_cpu = time.thread_time_ns() - cpu0, _cpu_ns(arm.peer or 0) - peer0
        finally:
            arm.close()
    return {"half_round_trip_us": statistics.median(arm.over) / 2e3,
            "client_cpu_us_per_call": client_cpu / calls / 1e3,
            "worker_cpu_us_per_call": worker_cpu / calls / 1e3}


def compare(other_src: str, rounds: int, calls: int, together: bool = False) -> list[dict]:
    """``WorkerClient.run`` over TCP under another source tree (before) and this one
    (after), one process pair per arm and round, the arms interleaved: medians of rounds.

    The ``tcp`` echo and the ``chan-fast`` layer (this tree) are timed in the same rounds,
    between the two, so the whole call stands beside its floor in one run. ``together``:
    every arm's two ends on the CPU this process runs on (the arms' processes inherit it).
    """
    import subprocess

    own = str(Path(__file__).resolve().parents[1] / "src")
    cpu = _together_cpu() if together else None
    if cpu is not None:
        _pin(cpu)
    rows = []
    for label, n in PAYLOADS:
        each = calls if n < 1000 else max(20, calls // 4)
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        refs = [_socket_layer(name, x, False, cpu) for name in ("tcp", "chan-fast")]
        got: dict[str, list[dict]] = {"before": [], "after": []}
        try:
            for ref in refs:
                for _ in range(30):
                    ref.call()
            for r in range(rounds):
                # the order alternates per round (call64.py measured a fixed order's second
                # process up to 20% apart from its first, either way, one tree on both sides)
                pair = (("before", other_src), ("after", own))
                for arm, src in pair if r % 2 == 0 else pair[::-1]:
                    env = dict(os.environ, PYTHONPATH=src)
                    done = subprocess.run([sys.executable, __file__, "--arm", str(n), "--calls",
                                           str(each)],
                                          env=env, capture_output=True, text=True, timeout=600)
                    got[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    for ref in refs:  # the floor, between and beside the two trees' arms
                        for _ in range(max(1, each // 2)):
                            t0 = time.perf_counter_ns()
                            ref.call()
                            ref.over.append(time.perf_counter_ns() - t0)
        finally:
            for ref in refs:
                ref.close()
        row: dict = {"payload": label, "bytes_each_way": n * 4, "together": together}
        for ref in refs:
            half = statistics.median(ref.over) / 2e3
            row[ref.name] = {"half_round_trip_us": half, "gbps_each_way": n * 4 / (half * 1e3)}
        for arm, runs in got.items():
            row[arm] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            row[arm]["gbps_each_way"] = n * 4 / (row[arm]["half_round_trip_us"] * 1e3)
        row["after_over_before"] = (row["after"]["half_round_trip_us"]
                                    / row["before"]["half_round_trip_us"])
        row["after_over_tcp"] = row["after"]["half_round_trip_us"] / row["tcp"]["half_round_trip_us"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200, help="calls per layer and payload")
    parser.add_argument("--pin", action="store_true",
                        help="run the two ends of each layer on different CPUs")
    parser.add_argument("--together", action="store_true",
                        help="every arm's two ends on one CPU, the one this process runs on "
                        "(no wake-up of an idle CPU in any arm)")
    parser.add_argument("--no-worker", action="store_true",
                        help="leave out the whole-call layer (no onnxruntime worker)")
    parser.add_argument("--compare", metavar="SRC",
                        help="time the whole call under another tree's src/ (before) and this "
                        "one (after), interleaved, e.g. --compare ../main/src")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="run with N CPU-burning processes beside it for the whole run "
                        "(benchmarks/_busy.py), to show a busy machine did not get worse")
    parser.add_argument("--small", action="store_true",
                        help="64 B only (leave out the 1 MiB payload)")
    parser.add_argument("--arm", type=int, help=argparse.SUPPRESS)  # one compare run
    args = parser.parse_args()
    if args.small:
        PAYLOADS[:] = PAYLOADS[:1]
    if args.busy and not args.arm:
        from _busy import Neighbours  # noqa: E402  (beside this file)

        with Neighbours(args.busy) as neighbours:
            neighbours.busy()
            _main(args)
        return
    _main(args)


def _main(args: argparse.Namespace) -> None:
    if args.arm:
        print(json.dumps(_xstage_arm(args.arm, args.calls)))
        return
    if args.compare:
        rows = compare(args.compare, args.rounds, args.calls, args.together)
        if args.json:
            print(json.dumps({"benchmark": "channel-compare", "load_average": os.getloadavg(),
                              "rows": rows}, indent=2))
            return
        print(f"WorkerClient.run over TCP, before = {args.compare}, after = this tree; "
              f"{'both ends on one CPU' if args.together else 'free placement'}; "
              f"{args.busy} busy neighbours; "
              f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
        for row in rows:
            for name in ("tcp", "chan-fast"):
                a = row[name]
                print(f"  {row['payload']:<7}{name:<10}half round trip "
                      f"{a['half_round_trip_us']:>8.1f} µs  {a['gbps_each_way']:>5.2f} GB/s")
            for arm in ("before", "after"):
                a = row[arm]
                print(f"  {row['payload']:<7}{arm:<8}half round trip {a['half_round_trip_us']:>8.1f} µs"
                      f"  {a['gbps_each_way']:>5.2f} GB/s  CPU per call: client "
                      f"{a['client_cpu_us_per_call']:.0f} µs, worker {a['worker_cpu_us_per_call']:.0f} µs")
            print(f"  {row['payload']:<7}after / before {row['after_over_before']:.2f}, "
                  f"after / tcp {row['after_over_tcp']:.2f}")
        return
    doc = {"benchmark": "channel", "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "sha_ni": _has_sha_ni(), "load_average": os.getloadavg(), "mac": wire.MAC_NAME,
           "macs": mac_costs(), "cpu_per_frame": cpu_per_frame(),
           "layers": layers(args.rounds, args.calls, args.pin, not args.no_worker,
                            args.together),
           "pinned": args.pin, "together": args.together}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{doc['cpus']} CPUs, sha_ni={doc['sha_ni']}, {args.busy} busy neighbours, load average "
          f"{', '.join(f'{v:.1f}' for v in doc['load_average'])}, pinned={args.pin}, "
          f"together={args.together}")
    print("\nlayers (median; each layer's cost is its difference from the one above):")
    for row in doc["layers"]:
        for name, a in row["arms"].items():
            print(f"  {row['payload']:<7}{name:<13}half round trip {a['half_round_trip_us']:>9.1f} µs"
                  f"   {a['gbps_each_way']:>6.2f} GB/s each way"
                  f"   both ends' CPU / wall {a['both_ends_cpu_over_wall']:.2f}")
    for row in doc["layers"]:
        arms = row["arms"]
        if "xstage" in arms:
            print(f"  {row['payload']:<7}xstage / tcp "
                  f"{arms['xstage']['half_round_trip_us'] / arms['tcp']['half_round_trip_us']:.2f}"
                  f", xstage / chan-fast "
                  f"{arms['xstage']['half_round_trip_us'] / arms['chan-fast']['half_round_trip_us']:.2f}")
    for row in doc["layers"]:
        if row["bytes_each_way"] < TARGET_BYTES:
            continue
        print(f"\ntarget: {row['payload']} in + out at >= 1 GB/s each way with "
              f"{doc['mac']} (half round trip <= {TARGET_BYTES / 1e3:.1f} µs):")
        for name, a in row["arms"].items():
            if name.startswith("chan") or name == "xstage":
                verdict = "met" if a["gbps_each_way"] >= 1.0 else "missed"
                print(f"  {name:<13}{a['gbps_each_way']:5.2f} GB/s each way: {verdict}")
    print("\nCPU per 64 B frame (thread clock, median µs):")
    for name, us in doc["cpu_per_frame"]["steps_us"].items():
        print(f"  {name:<40}{us:>7.2f}")
    print(f"  socket calls per small frame: {doc['cpu_per_frame']['socket_calls_per_small_frame']}")
    print(f"\nMAC on one core (records use {doc['mac']}):")
    for name, m in doc["macs"].items():
        print(f"  {name:<40}{m['us_per_mib']:>7.0f} µs/MiB  {m['gbps']:.2f} GB/s"
              f"   {m['us_per_100_byte_record']:.2f} µs per 100 B record")


def _has_sha_ni() -> bool | None:
    try:
        with open("/proc/cpuinfo") as f:
            return " sha_ni" in f.read()
    except OSError:
        return None


if __name__ == "__main__":
    main()
