"""One 1 MiB round trip through the authenticated channel, taken apart.

Two processes over TCP loopback, an echo through ``wire.Channel`` (the ``channel`` arm of
``channel.py``). Each end's socket is wrapped so that every system call the channel makes is
logged with its start and end (``time.perf_counter_ns``: CLOCK_MONOTONIC, one clock in both
processes), its bytes, and the thread's CPU clock around it. After ``--calls`` round trips,
the last one is printed as one timeline (both ends, µs from the client's first send), then a
summary per end and direction over all measured calls (medians):

* ``send``/``recv`` wall: time inside the system calls; ``blocked``: their wall minus their
  CPU (the thread waited: a full send buffer, or nothing to read yet);
* ``between``: time outside the system calls (the MAC, copies out of the buffer, Python),
  and its CPU;
* each direction's time, from the sender's first byte to the receiver's last verified
  record.

Variants, to measure rather than to guess: ``--chunk`` (payload bytes per record),
``--sndbuf``/``--rcvbuf`` (``SO_SNDBUF``/``SO_RCVBUF`` on both ends, bytes; 0 leaves the
kernel's autotuning), ``--cpu`` (both ends on one CPU), and ``--compare`` runs a list of
variants interleaved, one process pair each, and prints the medians side by side.

Run: ``PYTHONPATH=src python benchmarks/channel_timeline.py [--calls N] [--chunk BYTES]
[--sndbuf BYTES] [--rcvbuf BYTES] [--compare "chunk=262144 sndbuf=0" "sndbuf=4194304" ...]``.
Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from xstage_remote import wire

SECRET = "5e" * 16
DIGEST = hashlib.sha256(b"benchmarks/channel_timeline.py").digest()
N = 1 << 20
_now = time.perf_counter_ns
_cpu = time.thread_time_ns


def _sched() -> tuple[int, int]:
    """This thread's CPU time and time spent runnable but waiting for a CPU (ns)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0


class Tracing:
    """A socket whose every system call the channel makes is logged."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.log: list[tuple[str, int, int, int, int]] = []  # (op, t0, t1, bytes, cpu ns)

    def _call(self, op: str, fn, *args):  # type: ignore[no-untyped-def]
        t0, c0 = _now(), _cpu()
        got = fn(*args)
        t1, c1 = _now(), _cpu()
        n = got if isinstance(got, int) else len(args[0]) if op == "sendall" else 0
        self.log.append((op, t0, t1, n, c1 - c0))
        return got

    def sendall(self, data):  # type: ignore[no-untyped-def]
        return self._call("sendall", self.sock.sendall, data)

    def sendmsg(self, buffers):  # type: ignore[no-untyped-def]
        return self._call("send", self.sock.sendmsg, buffers)

    def recv_into(self, *args):  # type: ignore[no-untyped-def]
        return self._call("recv", self.sock.recv_into, *args)

    def fileno(self) -> int:
        return self.sock.fileno()


def _options(sock: socket.socket, opts: dict) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if opts.get("sndbuf"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, opts["sndbuf"])
    if opts.get("rcvbuf"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, opts["rcvbuf"])


def _apply(opts: dict) -> None:
    if opts.get("chunk"):
        wire.channel.CHUNK_BYTES = opts["chunk"]  # what a Channel made without tuning takes
    if opts.get("cpu") is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {opts["cpu"]})


def _echo(q: mp.Queue, opts: dict, calls: int) -> None:
    _apply(opts)
    srv = socket.create_server(("127.0.0.1", 0))
    q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    _options(conn, opts)
    tr = Tracing(conn)
    ch = wire.Channel(tr, SECRET, DIGEST, "worker")  # type: ignore[arg-type]
    ch.mac_threads = opts.get("mac_threads", 0)
    logs = []
    for _ in range(calls):
        tr.log = []
        s0, t0 = _sched(), _now()
        frame = ch.recv()
        t1, s1 = _now(), _sched()
        ch.send({"op": "result", "id": frame.id, "gen": 1}, {"y": frame.arrays()["x"]})
        logs.append((t0, t1, _now(), tr.log, (s0, s1, _sched())))
    q.put(logs)
    try:
        ch.recv()
    except EOFError:
        pass


def run(opts: dict, calls: int) -> dict:
    """``calls`` round trips under ``opts``; both ends' logs."""
    _apply({k: v for k, v in opts.items() if k != "cpu"})
    q: mp.Queue = mp.Queue()
    proc = mp.Process(target=_echo, args=(q, opts, calls + 5), daemon=True)
    proc.start()
    saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if opts.get("cpu") is not None and saved is not None:
        os.sched_setaffinity(0, {opts["cpu"]})
    sock = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
    _options(sock, opts)
    tr = Tracing(sock)
    ch = wire.Channel(tr, SECRET, DIGEST, "client")  # type: ignore[arg-type]
    ch.mac_threads = opts.get("mac_threads", 0)
    x = np.random.default_rng(0).integers(0, 255, N, dtype=np.uint8)
    logs = []
    for _ in range(calls + 5):
        tr.log = []
        s0, t0 = _sched(), _now()
        ch.send({"op": "run", "id": 1, "gen": 1}, {"x": x})
        t1, s1 = _now(), _sched()
        ch.recv().arrays()
        logs.append((t0, t1, _now(), tr.log, (s0, s1, _sched())))
    peer = q.get(timeout=120)
    sock.close()
    proc.join(timeout=10)
    if saved is not None:
        os.sched_setaffinity(0, saved)
    return {"client": logs[5:], "worker": peer[5:]}


def _split(log, lo: int, hi: int):  # type: ignore[no-untyped-def]
    """Send/recv wall, blocked and CPU of the calls in [lo, hi) and the rest of that span."""
    out = {"send": 0, "send_cpu": 0, "recv": 0, "recv_cpu": 0, "calls": 0}
    for op, t0, t1, _n, cpu in log:
        if t0 < lo or t0 >= hi:
            continue
        key = "recv" if op == "recv" else "send"
        out[key] += t1 - t0
        out[key + "_cpu"] += cpu
        out["calls"] += 1
    out["between"] = (hi - lo) - out["send"] - out["recv"]
    return out


def summarize(got: dict) -> dict:
    """Medians per direction (µs): each end's time in system calls, blocked, and between."""
    rows: dict[str, list[float]] = {}

    def add(key: str, ns: float) -> None:
        rows.setdefault(key, []).append(ns / 1e3)

    for (c0, c1, c2, clog, cs), (w0, w1, w2, wlog, ws) in zip(got["client"], got["worker"], strict=True):
        add("round trip / 2", (c2 - c0) / 2)
        add("in: client send", c1 - c0)
        add("in: worker last byte -> verified", w1 - max(t1 for op, _t0, t1, *_ in wlog
                                                        if op == "recv" and _t0 < w1))
        add("in: client start -> worker verified", w1 - c0)
        add("out: worker send", w2 - w1)
        add("out: worker verified -> client verified", c2 - w1)
        for side, ss in (("client", cs), ("worker", ws)):
            first, second = ("sending", "receiving") if side == "client" else ("receiving",
                                                                                "sending")
            add(f"{side} {first}: CPU", ss[1][0] - ss[0][0])
            add(f"{side} {first}: waiting for a CPU", ss[1][1] - ss[0][1])
            add(f"{side} {second}: CPU", ss[2][0] - ss[1][0])
            add(f"{side} {second}: waiting for a CPU", ss[2][1] - ss[1][1])
        for side, log, (a, b, c) in (("client", clog, (c0, c1, c2)), ("worker", wlog, (w0, w1, w2))):
            tx = _split(log, a, b) if side == "client" else _split(log, b, c)
            rx = _split(log, b, c) if side == "client" else _split(log, a, b)
            add(f"{side} sending: in sendmsg", tx["send"])
            add(f"{side} sending: blocked in sendmsg", tx["send"] - tx["send_cpu"])
            add(f"{side} sending: between calls (MAC)", tx["between"])
            add(f"{side} receiving: in recv", rx["recv"])
            add(f"{side} receiving: blocked in recv", rx["recv"] - rx["recv_cpu"])
            add(f"{side} receiving: recv calls", rx["calls"] * 1e3)
    return {k: statistics.median(v) for k, v in rows.items()}


def timeline(got: dict) -> list[str]:
    """The last round trip, both ends, µs from the client's first send."""
    c0, _, _, clog, _ = got["client"][-1]
    wlog = got["worker"][-1][3]
    ev = [(t0, t1, "client", op, n, cpu) for op, t0, t1, n, cpu in clog]
    ev += [(t0, t1, "worker", op, n, cpu) for op, t0, t1, n, cpu in wlog]
    ev.sort()
    lines = []
    last = {"client": c0, "worker": c0}
    for t0, t1, side, op, n, cpu in ev:
        gap = (t0 - last[side]) / 1e3
        last[side] = t1
        pad = "" if side == "client" else " " * 44
        lines.append(f"{(t0 - c0) / 1e3:8.1f} {pad}{side} +{gap:6.1f} {op:<7}{n:>8} B "
                     f"{(t1 - t0) / 1e3:6.1f} µs (cpu {cpu / 1e3:5.1f})")
    return lines


def _parse(text: str) -> dict:
    opts: dict = {}
    for item in text.split():
        k, _, v = item.partition("=")
        if k != "src":
            opts[k] = int(v)
    return opts


def _variant(text: str, calls: int) -> dict:
    """One variant in a process of its own; ``src=PATH`` imports the channel from another
    tree (e.g. the parent commit's ``src/`` in a worktree: before)."""
    src = next((v for k, _, v in (i.partition("=") for i in text.split()) if k == "src"),
               str(Path(__file__).resolve().parents[1] / "src"))
    done = subprocess.run([sys.executable, __file__, "--one", text, "--calls", str(calls)],
                          env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=0, help="payload bytes per record")
    parser.add_argument("--sndbuf", type=int, default=0)
    parser.add_argument("--rcvbuf", type=int, default=0)
    parser.add_argument("--cpu", type=int, help="both ends on this CPU")
    parser.add_argument("--quiet", action="store_true", help="no timeline, the summary only")
    parser.add_argument("--compare", nargs="+", metavar="OPTS",
                        help='variants, e.g. "sndbuf=0" "sndbuf=4194304 rcvbuf=4194304", run '
                        "interleaved in --rounds rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one variant of --compare
    args = parser.parse_args()
    if args.one:
        print(json.dumps(summarize(run(_parse(args.one), args.calls))))
        return
    print(f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs, CHUNK_BYTES {wire.CHUNK_BYTES}")
    if args.compare:
        per: dict[str, list[dict]] = {v: [] for v in args.compare}
        for _ in range(args.rounds):
            for v in args.compare:
                per[v].append(_variant(v, args.calls))
        keys = list(per[args.compare[0]][0])
        for i, v in enumerate(args.compare):
            print(f"  [{i}] {v}")
        print(f"{'median of rounds (µs)':<44}" + "".join(f"{f'[{i}]':>10}"
                                                        for i in range(len(args.compare))))
        for k in keys:
            print(f"{k:<44}" + "".join(
                f"{statistics.median(r[k] for r in per[v]):>10.1f}" for v in args.compare))
        base = statistics.median(r["round trip / 2"] for r in per[args.compare[0]])
        for i, v in enumerate(args.compare):
            med = statistics.median(r["round trip / 2"] for r in per[v])
            print(f"  [{i}] {N / med / 1e3:5.2f} GB/s each way, {med / base:.3f}x [0]  "
                  f"(load average now {os.getloadavg()[0]:.1f})")
        return
    opts = {"chunk": args.chunk, "sndbuf": args.sndbuf, "rcvbuf": args.rcvbuf, "cpu": args.cpu}
    got = run(opts, args.calls)
    if not args.quiet:
        print("\n".join(timeline(got)))
    for k, v in summarize(got).items():
        print(f"  {k:<44}{v:>9.1f}")


if __name__ == "__main__":
    main()
