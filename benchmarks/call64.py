"""One 64 B call on the authenticated socket path, taken apart piece by piece.

Both ends run in this one thread over a TCP loopback pair: a ``WorkerClient`` wired to an
``xstage_remote.worker.Worker`` (a real onnxruntime session of ``slice_graph(16, 16)``), each
with its ``wire.Channel``. A call is driven step by step, as ``WorkerClient.run`` and the
worker's ``serve`` loop make it, and each step is timed with the thread's CPU clock
(``time.thread_time_ns``; the clock's own cost, measured with an empty step, is taken off).
No wake-ups, no waiting: what is left is the CPU each piece costs. ``whole`` rows time the
real entry points (``WorkerClient.run`` with the worker's turn inside its receive, and the
worker's one-frame turn) for the same calls. The ``floor`` row sends the same two frames with
the fewest steps Python can take (``floor``): what any implementation of this protocol in
Python pays on this machine; its half is the least half round trip the socket path can reach
here with both ends awake (the target is 15 µs: docs/performance.md).

``--busy N`` runs everything beside N CPU-burning processes (``benchmarks/_busy.py``), for a
busy machine's before/after (with ``--compare``, each tree's processes run beside them too).

Run: ``PYTHONPATH=src python benchmarks/call64.py [--calls N] [--rounds N] [--json]
[--compare SRC] [--busy N]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _sockets import tcp_pair  # noqa: E402  (beside this file)

from xstage import builtin_graphs
from xstage.client import WorkerClient
from xstage.client.deadlines import DeadlineSocket
from xstage.client.worker import WorkerState
from xstage_remote import memory, shm, sockspin, wire
from xstage_remote import worker as remote

SECRET = "5e" * 16
DIGEST = hashlib.sha256(b"benchmarks/call64.py").digest()


def _channel_of(c: WorkerClient) -> wire.Channel:
    """The client's channel: its transport's, or (a tree before transports) its own."""
    return c.link.channel if hasattr(c, "link") else c._channel  # type: ignore[attr-defined]


def wired(graph: str) -> tuple[WorkerClient, remote.Worker]:
    """A client and a worker in this process, joined by a TCP pair and two channels."""
    a, b = tcp_pair()
    wch = wire.Channel(b, SECRET, DIGEST, "worker")
    if not hasattr(remote, "ChannelStream") and sockspin.AVAILABLE:
        # A tree before the worker's streams (--compare): its ``main`` installed the spin for
        # the next request, which ``Worker`` then took from the channel; a tree with them
        # installs it in ``Worker`` (``ChannelStream``). Both ends then spin as they ship.
        sockspin.install(wch, shm.WORKER_SPIN_SECONDS, sockspin.nonblocking_poll(b))
    w = remote.Worker(b, None, 1, wch)
    c = WorkerClient(sys.executable, shm_mode="off", transport="tcp")
    if hasattr(c, "link"):  # a tree with transports (client/transport.py)
        from xstage.client.transport import SocketChannel

        c.link = SocketChannel(a, wire.Channel(a, SECRET, DIGEST, "client"))
    else:  # before them: the client's own socket and channel (--compare)
        c._io = DeadlineSocket(a)
        c._channel = wire.Channel(c._io, SECRET, DIGEST, "client")
    c._ctl = a
    channel = _channel_of(c)
    c.state = WorkerState.READY
    c.hello = {"features": remote.FEATURES}
    real_recv = channel.recv

    def recv(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not channel._end - channel._start:  # nothing buffered: the worker's turn
            turn(w)
        return real_recv(*args, **kwargs)

    channel.recv = recv  # type: ignore[method-assign]
    c.load(graph)
    del channel.recv  # the pieces drive each end by hand
    return c, w


def turn(w: remote.Worker) -> None:
    """The worker's ``serve`` loop for one frame (no region on TCP): ``Worker.turn``, or
    where a tree has none (before the socket path's "sockdiet"), its loop's steps."""
    if hasattr(w, "turn"):
        w.turn()
        return
    frame = w.recv()
    w.check_generation(frame)
    {"load": w.on_load, "run": w.on_run}[frame.op](frame)


def _channels(c: WorkerClient, w: remote.Worker) -> tuple:
    """Both ends' channels in this tree or an older one (``--compare``): the client's through
    its transport (``link``), the worker's through its stream (``worker_transport``)."""
    ch = c.link.channel if hasattr(c, "link") else c._channel
    return ch, getattr(w, "channel", None) or w.stream.channel


def pieces(c: WorkerClient, w: remote.Worker, x: np.ndarray, calls: int) -> dict[str, float]:
    """Median-free mean thread-CPU ns per step over ``calls`` calls, driven step by step."""
    clock = time.thread_time_ns
    tot: dict[str, int] = {}
    ch, wch = _channels(c, w)
    assert ch is not None and wch is not None

    def add(name: str, ns: int) -> None:
        tot[name] = tot.get(name, 0) + ns

    rt = w.runtime
    names = [o["name"] for o in rt.outputs]
    for _ in range(calls):
        t0 = clock()
        t1 = clock()
        add("(the clock itself)", t1 - t0)
        feeds = c._check_inputs({"x": x})
        t2 = clock()
        add("client: _check_inputs", t2 - t1)
        rid = c.take_id()
        parts = wire.encode_fast(c.link.codec, "run", rid, 1, feeds, None)
        t3 = clock()
        add("client: encode_fast (run)", t3 - t2)
        c.link.io.start(c.deadlines.call)
        t4 = clock()
        add("client: deadline start", t4 - t3)
        ch.send_parts(parts)
        t5 = clock()
        add("client: Channel.send_parts (MAC + send)", t5 - t4)
        frame = wch.recv(codec=w.codec)
        t6 = clock()
        add("worker: Channel.recv (recv + MAC + head)", t6 - t5)
        w.check_generation(frame)
        arrays = frame.arrays()
        w.check_feeds(arrays)
        t7 = clock()
        add("worker: generation, arrays, check_feeds", t7 - t6)
        outs = rt.session.run(names, arrays)
        t8 = clock()
        add("worker: session.run (onnxruntime)", t8 - t7)
        outputs = dict(zip(names, outs, strict=True))
        rt._after_first_run(arrays)
        t9 = clock()
        add("worker: runtime.run's wrapping", t9 - t8)
        rss, peak = memory.read_cached()
        t10 = clock()
        add("worker: memory.read_cached", t10 - t9)
        timing = {"worker_ns": 7000, "rss": rss, "peak": peak}
        rparts = wire.encode_fast(w.codec, "result", frame.id, 1, outputs, timing=timing)
        t11 = clock()
        add("worker: encode_fast (result)", t11 - t10)
        wch.send_parts(rparts)
        t12 = clock()
        add("worker: Channel.send_parts (MAC + send)", t12 - t11)
        reply = ch.recv(codec=c.link.codec)
        t13 = clock()
        add("client: Channel.recv (recv + MAC + head)", t13 - t12)
        c.expect(reply, "result", rid)
        c.last_timing = dict(reply.header["timing"])
        c.link.collect(reply.arrays(), {})
        t14 = clock()
        add("client: _expect, timing, arrays, _collect", t14 - t13)
    clock_ns = tot.pop("(the clock itself)") / calls
    out = {k: max(0.0, v / calls - clock_ns) for k, v in tot.items()}
    out["(the clock itself, taken off each step)"] = clock_ns
    return out


def wholes(c: WorkerClient, w: remote.Worker, x: np.ndarray, calls: int) -> dict[str, float]:
    """CPU ns per call of the real entry points: the client's ``run`` (the worker's turn
    inside, timed apart and taken off) and the worker's turn alone."""
    clock = time.thread_time_ns
    ch = _channel_of(c)
    assert ch is not None
    real = wire.Channel.recv
    worker_ns = [0]

    def recv(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not ch._end - ch._start:
            t0 = clock()
            turn(w)
            worker_ns[0] += clock() - t0
        return real(ch, *args, **kwargs)

    ch.recv = recv  # type: ignore[method-assign]
    t0 = clock()
    for _ in range(calls):
        c.run({"x": x})
    total = clock() - t0
    del ch.recv
    return {"whole: client run() (the worker's turn taken off)": (total - worker_ns[0]) / calls,
            "whole: the worker's turn (recv .. send_parts)": worker_ns[0] / calls}


def floor(c: WorkerClient, w: remote.Worker, x: np.ndarray, calls: int) -> dict[str, float]:
    """CPU ns per round trip of the fewest steps Python can take for one authenticated 64 B
    call on this connection: the same two frames (the signature's kept lanes, so the same
    bytes), the id packed, the tensor copied in, the record sealed, one send; one receive, the
    tag checked, the id read, the payload copied out. No checks, no runtime, no function of
    ours in between: what any Python implementation of this protocol pays (the kernel's TCP
    and the MAC included). The worker's compute is left out, as the half round trip leaves
    it out."""
    clock = time.thread_time_ns
    ch, wch = _channels(c, w)
    lane = c.link.lane if hasattr(c, "link") else c._lane  # (a tree before the client's Transport)
    assert ch is not None and wch is not None and lane is not None
    req = lane[1] if isinstance(lane, tuple) else lane  # (key, lane) before sockdiet
    res = w.codec.lane(wire.FAST_RESULT, 1, {o["name"]: x for o in w.runtime.outputs})
    assert res is not None
    a, b = ch.sock, wch.sock
    a = getattr(a, "sock", a)  # the DeadlineSocket's socket
    pack = wire.COUNTER.pack_into
    unpack = wire.COUNTER.unpack_from
    tag = wire.TAG_BYTES
    keys = (ch._seal_mac, wch._check_mac, wch._seal_mac, ch._check_mac)
    rbuf = bytearray(4096)
    rview = memoryview(rbuf)
    data = x.data.cast("B")
    start, end = req._places[0][1:]
    rstart, rend = res._places[0][1:]
    dont = socket.MSG_DONTWAIT

    def seal(lane, mac, counter):  # type: ignore[no-untyped-def]
        n, buf, view = lane.n, lane.buf, lane.view
        pack(buf, n, counter)
        inner = mac._inner.copy()
        inner.update(view[n:n + 8])
        inner.update(view[:n])
        outer = mac._outer.copy()
        outer.update(inner.digest())
        buf[n + 8:] = outer.digest()
        return buf

    def opened(sock, mac, n, at, to):  # type: ignore[no-untyped-def]
        k = sock.recv_into(rview, 0, dont)
        inner = mac._inner.copy()
        inner.update(rview[n:n + 8])
        inner.update(rview[:n])
        outer = mac._outer.copy()
        outer.update(inner.digest())
        if k != n + 8 + tag or not hmac.compare_digest(outer.digest(), rview[n + 8:n + 8 + tag]):
            raise SystemExit("floor: a record did not verify")
        unpack(rbuf, wire.PREFIX.size + 8)
        return np.frombuffer(bytearray(rview[at:to]), np.float32)

    t0 = clock()
    for i in range(calls):
        req.view[start:end] = data
        a.send(seal(req, keys[0], i))
        got = opened(b, keys[1], req.n, start, end)
        res.view[rstart:rend] = got.data.cast("B")
        b.send(seal(res, keys[2], i))
        opened(a, keys[3], res.n, rstart, rend)
    return {"floor: the fewest steps, both ends (no runtime)": (clock() - t0) / calls}


def compare(other_src: str, rounds: int, calls: int, busy: int = 0) -> None:
    """The whole-call rows under ``other_src`` (before) and this tree (after), interleaved."""
    import subprocess

    own = str(Path(__file__).resolve().parents[1] / "src")
    got: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for r in range(rounds):
        # The order alternates per round: with a fixed order the second process of each pair
        # measured up to 20% apart from the first, either way, with the same tree in both.
        pair = (("before", other_src), ("after", own))
        for arm, src in pair if r % 2 == 0 else pair[::-1]:
            done = subprocess.run([sys.executable, __file__, "--whole", "--calls", str(calls)],
                                  env=dict(os.environ, PYTHONPATH=src), capture_output=True,
                                  text=True, timeout=600, check=True)
            for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items():
                got[arm].setdefault(k, []).append(v / 1e3)
    print(f"CPU µs per 64 B call, in one thread (median of {rounds} rounds of {calls}); "
          f"before = {other_src}; {busy} busy neighbours; load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for k in got["after"]:
        b, a = statistics.median(got["before"][k]), statistics.median(got["after"][k])
        print(f"  {k:<52}before {b:>6.2f}  after {a:>6.2f}  after/before {a / b:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", metavar="SRC",
                        help="the whole-call rows under another tree's src/ (before) and this "
                        "one (after), one process each per round, interleaved")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="run with N CPU-burning processes beside it for the whole run "
                        "(benchmarks/_busy.py), to show a busy machine did not get worse")
    parser.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.busy < 0:
        parser.error("--busy takes a number of processes >= 0")
    if args.busy and not args.whole:
        from _busy import Neighbours  # noqa: E402  (beside this file)

        with Neighbours(args.busy) as neighbours:
            neighbours.busy()
            _main(args)
        return
    _main(args)


def _main(args: argparse.Namespace) -> None:
    if args.compare:
        compare(args.compare, args.rounds, args.calls, args.busy)
        return
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
        graph = str(builtin_graphs.write(builtin_graphs.slice_graph(16, 16), Path(tmp) / "s.onnx"))
        c, w = wired(graph)
        wholes(c, w, x, 300)
        if args.whole:
            print(json.dumps(wholes(c, w, x, args.calls)))
            return
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for k, v in {**pieces(c, w, x, args.calls), **wholes(c, w, x, args.calls),
                         **floor(c, w, x, args.calls)}.items():
                rows.setdefault(k, []).append(v)
    med = {k: statistics.median(v) / 1e3 for k, v in rows.items()}
    if args.json:
        print(json.dumps({"benchmark": "call64", "load_average": os.getloadavg(),
                          "us": med}, indent=2))
        return
    print(f"one 64 B call, thread CPU µs per step (median of {args.rounds} rounds of "
          f"{args.calls}); load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    client = sum(v for k, v in med.items() if k.startswith("client:"))
    worker = sum(v for k, v in med.items() if k.startswith("worker:"))
    for k, v in med.items():
        print(f"  {k:<58}{v:>7.2f}")
    print(f"  {'sum of the client steps':<58}{client:>7.2f}")
    print(f"  {'sum of the worker steps':<58}{worker:>7.2f}")
    whole = med["whole: client run() (the worker's turn taken off)"] \
        + med["whole: the worker's turn (recv .. send_parts)"] \
        - med["worker: session.run (onnxruntime)"] - med["worker: runtime.run's wrapping"]
    least = med["floor: the fewest steps, both ends (no runtime)"]
    print(f"  half round trip from CPU alone, the runtime's run left out (as worker_ns is): "
          f"whole call {whole / 2:.2f}, floor {least / 2:.2f} ({whole / least:.2f}x)")


if __name__ == "__main__":
    main()
