"""Transport cost of one worker call, side by side with its floor and the usual alternatives.

Each payload is moved by every arm in interleaved rounds (so machine noise lands on all arms
alike), and medians are compared as ratios. Two phases in one run: the shared-memory arms
with their floor, then the socket and pickle arms with theirs (their megabytes of traffic
would otherwise flush the caches the first phase lives in, which measures the neighbours).
The 64 B payload moves no megabytes: there every arm runs in one phase, interleaved (its
xstage / TCP ratio is the busy-machine target's figure):

* ``floor``     — in-process ``np.copyto`` of the same input and output bytes into
                  preallocated buffers: the cost of touching the bytes once each way.
* ``xstage``    — ``WorkerClient.run`` on ``ort-cpu`` through the shared region (validation
                  included, a fresh output array per call). The worker reports its own time
                  (onnxruntime's Slice); *overhead* is the round trip minus that.
* ``xstage-out``— the same with ``out=`` (a preallocated output, as the floor has).
* ``xstage-inplace`` — the same with the input written in the region's slot by its producer
                  (``input_slots()``, filled once: a producer's own write is not transport)
                  and the output read as a view of its slot (``views=True``): no copy either way.
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

``--busy N`` measures every arm twice in one run: quiet, then with N CPU-burning processes beside
it (``benchmarks/_busy.py``: arithmetic in a loop, never sleeping, ended by their pids), as an
engine's decode threads and tokenizers keep a machine's cores busy. The summary puts each arm's
figure beside the TCP echo's, quiet and busy: the busy-machine target asks, for ``--busy`` equal to the core
count, the xstage arm's 64 B half round trip ≤ 1.5× the TCP arm's and its overhead at 1 MiB and
8.8 MB ≤ 0.5× the TCP arm's. ``--verbose`` prints the doorbell's decisions (spin or block, and
why) for each xstage arm.

``--copy-threads N`` is the A/B of the client's large copies (``client/copies.py``):
the ``xstage`` arms copy on the caller's thread alone, the ``xstage-pool`` arms split
copies of at least ``copies.MIN_BYTES`` across N helper threads besides it, interleaved in one
run; a line per payload puts copies, overhead and this process's CPU time per call (``CPU``:
every thread's, the helpers' included) side by side.

``--compare SRC`` times the xstage arms (``--arms``, the floor beside them) under another tree
(``SRC``, e.g. the parent commit's ``src/``: before) and this one (after): one process per tree
and round, the order alternating per round, each process one round of every arm and payload;
each row is the median of the rounds' overheads, with after / before and the spread of the
before rounds (their interquartile range over their median: a difference inside it is noise).
With ``--busy N`` each round runs twice, quiet and beside the N neighbours.

Run: ``python benchmarks/transport.py [--json] [--rounds N] [--busy N] [--copy-threads N]
[--compare SRC] [--verbose]``. Not a test: nothing asserts.
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
from xstage.client import WorkerClient, copies
from xstage_remote import shm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _busy import Neighbours  # noqa: E402  (beside this file)
from _waits import waits_delta  # noqa: E402

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
#: The two conditions each arm is measured under, round by round (``--busy``).
STATES = ("quiet", "busy")


class Arm:
    def __init__(self, name: str, call: Callable[[], int], close: Callable[[], None],
                 timing: Callable[[], dict] | None = None,
                 waits: Callable[[], dict] | None = None) -> None:
        self.name, self.call, self.close, self.timing, self.waits = name, call, close, timing, waits
        # Per state: round trips, the worker's own time, and the caller's copy-in + copy-out
        # (shared path only).
        self.rt: dict[str, list[int]] = {s: [] for s in STATES}
        self.worker: dict[str, list[int]] = {s: [] for s in STATES}
        self.copies: dict[str, list[int]] = {s: [] for s in STATES}
        # This process's CPU time per call (every thread: the copy helpers' too), per round.
        self.cpu: dict[str, list[float]] = {s: [] for s in STATES}
        #: Copies the client split across its copy helpers, of all (``--copy-threads``).
        self.split: Callable[[], int] | None = None
        self.calls = 0
        self.decisions: dict[str, dict] = {}
        #: (this process's CPU, the peer's CPU) read once after each round (``tcp``: the echo).
        self.where: Callable[[], tuple[int, int]] | None = None
        self.places: dict[str, list[tuple[int, int]]] = {s: [] for s in STATES}


def _cpu_of(pid: int) -> int:
    """The CPU ``pid``'s main thread last ran on (``/proc/PID/stat`` field 39), or -1."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def _xstage_arm(name: str, graph: Path, x: np.ndarray, n_out: int, *, shm_mode: str,
                use_out: bool, transport: str = "local", copy_threads: int | None = None,
                in_place: bool = False) -> Arm:
    client = WorkerClient(sys.executable, shm_mode=shm_mode, transport=transport)
    if copy_threads is not None:  # --copy-threads: this arm's copy helpers, whatever the default
        client._copies = copies.CopyPool(copy_threads)
    client.start()
    client.load(graph)
    out = {"y": np.empty(n_out, np.float32)} if use_out else None
    feeds = {"x": x}
    if in_place:  # the producer writes the slot itself (depth 1: the same slot every call)
        feeds = client.input_slots()
        np.copyto(feeds["x"], x)

    def call() -> int:
        client.run(feeds, out=out, views=in_place)
        return client.last_timing.get("worker_ns", 0)

    waits = getattr(client, "waits", None) if shm_mode != "off" else None
    arm = Arm(name, call, client.close, lambda: client.last_timing, waits)
    arm.split = lambda: client._copies.split
    return arm


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

    arm = Arm("tcp", call, close)
    me, echo = os.getpid(), proc.pid
    assert echo is not None
    arm.where = lambda: (_cpu_of(me), _cpu_of(echo))
    return arm


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
ARMS = ("xstage", "xstage-out", "xstage-inplace", "inline", "tcp-auth", "tcp", "mp-pickle")


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


def _summarize(arm: Arm, state: str, floor: float, n_in: int) -> dict:
    over = [r - w for r, w in zip(arm.rt[state], arm.worker[state], strict=True)]
    med_over = statistics.median(over)
    a = {
        "round_trip_us": statistics.median(arm.rt[state]) / 1e3,
        "worker_us": statistics.median(arm.worker[state]) / 1e3,
        "overhead_us": med_over / 1e3,
        "half_round_trip_us": med_over / 2e3,
        "ratio_vs_memcpy": med_over / floor if floor else None,
        "gbps_each_way": n_in * 4 / (med_over / 2) if med_over > 0 else None,
        "samples": len(arm.rt[state]),
        "client_cpu_us": statistics.median(arm.cpu[state]) / 1e3 if arm.cpu[state] else None,
    }
    if arm.copies[state]:
        # The overhead split: the caller's two copies (one each way, across cores: the
        # worker touched those lines last) and everything else (validation, descriptors,
        # both wake-ups, the worker's bookkeeping).
        copies = statistics.median(arm.copies[state])
        a.update(copies_us=copies / 1e3, copies_vs_memcpy=copies / floor if floor else None,
                 rest_us=(med_over - copies) / 1e3)
    if state in arm.decisions:
        a["waits"] = arm.decisions[state]
    if arm.places[state]:
        # The echo's yardstick depends on where its two processes run: on one CPU (socket
        # wake-ups are "sync": the woken reader takes the writer's CPU) a round trip is a
        # switch; on two, each wake-up is a cross-CPU one (in a VM, an interrupt to a CPU
        # that may be halted). Read once per round, after it.
        same = [a == b for a, b in arm.places[state] if a >= 0 and b >= 0]
        a["same_cpu_rounds"] = f"{sum(same)}/{len(same)}"
    return a


def _add_waits(total: dict, more: dict) -> None:
    for side, counts in more.items():
        for key, values in counts.items():
            into = total.setdefault(side, {}).setdefault(key, {})
            for k, v in values.items():
                into[k] = into.get(k, 0) + v


def measure(rounds: int, calls: int, tmp: Path, only: tuple[str, ...] = ARMS,
            neighbours: Neighbours | None = None,
            copy_threads: int | None = None,
            payloads: list[tuple[str, int, int]] = PAYLOADS) -> dict[str, list[dict]]:
    """Every arm, per payload, in interleaved rounds; with ``neighbours``, each round twice:
    quiet (the neighbours stopped), then busy. Returns the rows per state.

    ``copy_threads`` (``--copy-threads N``): the ``xstage`` arms copy on the caller's thread
    alone and the ``-pool`` arms on N helpers besides it (``client/copies.py``), interleaved."""
    plain = None if copy_threads is None else 0
    states = STATES if neighbours is not None and neighbours.n else STATES[:1]
    results: dict[str, list[dict]] = {state: [] for state in states}
    for label, n_in, n_out in payloads:
        graph = builtin_graphs.write(builtin_graphs.slice_graph(n_in, n_out), tmp / f"s{n_in}.onnx")
        x = np.random.default_rng(0).standard_normal(n_in).astype(np.float32)
        makers = {
            "xstage": lambda g=graph, x=x, n=n_out: _xstage_arm("xstage", g, x, n, shm_mode="auto",
                                                              use_out=False, copy_threads=plain),
            "xstage-out": lambda g=graph, x=x, n=n_out: _xstage_arm("xstage-out", g, x, n,
                                                                  shm_mode="auto", use_out=True,
                                                                  copy_threads=plain),
            "xstage-pool": lambda g=graph, x=x, n=n_out: _xstage_arm(
                "xstage-pool", g, x, n, shm_mode="auto", use_out=False, copy_threads=copy_threads),
            "xstage-out-pool": lambda g=graph, x=x, n=n_out: _xstage_arm(
                "xstage-out-pool", g, x, n, shm_mode="auto", use_out=True,
                copy_threads=copy_threads),
            "xstage-inplace": lambda g=graph, x=x, n=n_out: _xstage_arm(
                "xstage-inplace", g, x, n, shm_mode="auto", use_out=False, in_place=True),
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
                for state in states:
                    if neighbours is not None and state == "busy":
                        neighbours.busy()
                    elif neighbours is not None:
                        neighbours.quiet()
                    for arm in arms:
                        before = arm.waits() if arm.waits else {}
                        cpu0 = time.process_time_ns()
                        for _ in range(per_round):
                            t0 = time.perf_counter_ns()
                            w = arm.call()
                            arm.rt[state].append(time.perf_counter_ns() - t0)
                            arm.calls += 1
                            arm.worker[state].append(w)
                            t = arm.timing() if arm.timing else {}
                            if "copy_out_ns" in t:
                                arm.copies[state].append(t["copy_in_ns"] + t["copy_out_ns"])
                        arm.cpu[state].append((time.process_time_ns() - cpu0) / per_round)
                        if arm.where is not None:
                            arm.places[state].append(arm.where())
                        if arm.waits:
                            _add_waits(arm.decisions.setdefault(state, {}),
                                       waits_delta(arm.waits(), before))
                        # A worker spins a while after its last call; let it fall asleep so
                        # the next arm is not measured against a core someone else is burning.
                        time.sleep(3 * shm.SPIN_SECONDS)
        finally:
            if neighbours is not None:
                neighbours.quiet()
            for arm in arms:
                arm.close()
        for state in states:
            floor = statistics.median(arms[0].rt[state])
            row = {"payload": label, "bytes_in": n_in * 4, "bytes_out": n_out * 4,
                   "floor_us": floor / 1e3, "mac_us_per_mib": mac_us_per_mib(), "arms": {}}
            for arm in arms[1:]:
                row["arms"][arm.name] = _summarize(arm, state, floor, n_in)
                if arm.split is not None:  # both states together, warm-up included
                    row["arms"][arm.name]["copies_split"] = arm.split()
                    row["arms"][arm.name]["calls"] = arm.calls + 50
            first = "xstage" if "xstage" in row["arms"] else next(iter(row["arms"]))
            row["ratio_vs_memcpy"] = row["arms"][first]["ratio_vs_memcpy"]
            results[state].append(row)
    return results


def targets(rows: list[dict]) -> list[dict]:
    """The busy-machine targets' comparisons against the TCP echo, for one state's rows: the 64 B half round
    trip (≤ 1.5× the TCP arm's) and the overhead at the larger payloads (≤ 0.5×)."""
    out = []
    for row in rows:
        arms = row["arms"]
        for name in ("xstage", "xstage-inplace"):
            if name not in arms or "tcp" not in arms:
                continue
            small = row["bytes_in"] < 4096
            key, bound = ("half_round_trip_us", 1.5) if small else ("overhead_us", 0.5)
            ratio = arms[name][key] / arms["tcp"][key] if arms["tcp"][key] > 0 else None
            out.append({"payload": row["payload"], "arm": name, "figure": key,
                        "xstage": arms[name][key], "tcp": arms["tcp"][key], "ratio": ratio,
                        "bound": bound, "met": ratio is not None and ratio <= bound})
    return out


#: Arms that move megabytes through sockets or pickle flush the caches the shared-memory arms
#: live in, so they are interleaved with their own floor in a second phase of the same run.
PHASES = (("xstage", "xstage-out", "xstage-inplace", "xstage-pool", "xstage-out-pool"),
          ("inline", "tcp-auth", "tcp", "mp-pickle"))


#: Payloads this small move no megabytes: every arm runs in one phase, interleaved round by
#: round with the others (the busy-machine target's 64 B ratio is xstage's against the TCP echo's, and each
#: of the two varies with the machine's moment; measured in separate phases, the ratio also
#: carried the difference between the two moments).
SMALL_BYTES = 4096


def _run(args: argparse.Namespace, tmp: Path, neighbours: Neighbours) -> dict[str, list[dict]]:
    wanted = [a for a in args.arms.split(",") if a]
    if args.copy_threads is not None:
        wanted += [f"{a}-pool" for a in ("xstage", "xstage-out") if a in wanted]
    small = [p for p in PAYLOADS if p[1] * 4 < SMALL_BYTES]
    large = [p for p in PAYLOADS if p[1] * 4 >= SMALL_BYTES]
    every = tuple(a for phase in PHASES for a in phase if a in wanted)
    runs = [(every, small)] if small and every else []
    runs += [(tuple(a for a in phase if a in wanted), large) for phase in PHASES]
    results: dict[str, list[dict]] = {}
    for arms, payloads in runs:
        if not arms or not payloads:
            continue
        by_state = measure(args.rounds, args.calls, tmp, arms, neighbours, args.copy_threads,
                           payloads)
        for state, rows in by_state.items():
            have = {row["payload"]: row for row in results.setdefault(state, [])}
            for more in rows:
                row = have.get(more["payload"])
                if row is None:
                    results[state].append(more)
                    continue
                row["arms"].update(more["arms"])
                row.setdefault("floor_us_by_phase", [row["floor_us"]]).append(more["floor_us"])
    return results


def _print_rows(rows: list[dict], verbose: bool) -> None:
    print(f"{'payload':<18}{'arm':<16}{'round trip':>12}{'worker':>10}{'overhead':>10}"
          f"{'half RTT':>10}{'× floor':>9}{'GB/s':>7}{'CPU':>9}{'copies':>10}{'× floor':>9}"
          f"{'rest':>9}")
    for row in rows:
        print(f"{row['payload']:<18}{'floor':<16}{row['floor_us']:>10.1f}µs   "
              f"(HMAC-SHA256: {row['mac_us_per_mib']:.0f} µs/MiB, "
              f"{(1 << 20) / row['mac_us_per_mib'] / 1e3:.2f} GB/s on one core)")
        for name, a in row["arms"].items():
            line = (f"{'':<18}{name:<16}{a['round_trip_us']:>10.1f}µs{a['worker_us']:>8.1f}µs"
                    f"{a['overhead_us']:>8.1f}µs{a['half_round_trip_us']:>8.1f}µs"
                    f"{a['ratio_vs_memcpy']:>9.2f}{a['gbps_each_way'] or 0:>7.2f}"
                    f"{a['client_cpu_us'] or 0:>7.1f}µs")
            if "copies_us" in a:
                line += (f"{a['copies_us']:>8.1f}µs{a['copies_vs_memcpy']:>9.2f}"
                         f"{a['rest_us']:>7.1f}µs")
            print(line)
            if verbose and a.get("waits"):
                for side, counts in a["waits"].items():
                    print(f"{'':<30}doorbell ({side}): {describe_waits(counts)}")
            if verbose and a.get("same_cpu_rounds"):
                print(f"{'':<30}client and echo on one CPU after "
                      f"{a['same_cpu_rounds']} rounds")


def describe_waits(counts: dict) -> str:
    """``rule n, …; outcome n, …`` for one side's decisions."""
    rules = ", ".join(f"{k} {v}" for k, v in counts.get("rules", {}).items()) or "none"
    outcomes = ", ".join(f"{k} {v}" for k, v in counts.get("outcomes", {}).items()) or "none"
    return f"decided: {rules}; ended: {outcomes}"


#: The arms ``--compare`` times by default: the client's own paths.
COMPARE_ARMS = ("xstage", "xstage-out", "xstage-inplace", "inline", "tcp-auth")


def _one_round(arms: tuple[str, ...], calls: int) -> dict:
    """One round of ``arms`` at every payload, in this process (a ``--compare`` process)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        rows = measure(1, calls, Path(tmp), arms)["quiet"]
    return {row["payload"]: {name: a["overhead_us"] for name, a in row["arms"].items()}
            | {"floor": row["floor_us"]} for row in rows}


def compare(other_src: str, rounds: int, calls: int, arms: tuple[str, ...],
            neighbours: Neighbours) -> dict[str, list[dict]]:
    """Each arm's overhead under ``other_src`` (before) and this tree (after), interleaved.

    One process per tree and round (``--one-round``), the order alternating per round; with
    busy neighbours, each round quiet and then busy. Per state, a row per payload and arm:
    the medians, after / before, and the before rounds' spread (IQR / median).
    """
    import subprocess

    own = str(Path(__file__).resolve().parents[1] / "src")
    states = STATES if neighbours.n else STATES[:1]
    got: dict[str, dict[str, list[dict]]] = {s: {"before": [], "after": []} for s in states}
    for r in range(rounds):
        for state in states:
            if state == "busy":
                neighbours.busy()
            else:
                neighbours.quiet()
            pair = (("before", other_src), ("after", own))
            for tree, src in pair if r % 2 == 0 else pair[::-1]:
                done = subprocess.run(
                    [sys.executable, __file__, "--one-round", "--calls", str(calls),
                     "--arms", ",".join(arms)],
                    env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True,
                    timeout=600, check=True)
                got[state][tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    neighbours.quiet()
    out: dict[str, list[dict]] = {}
    for state in states:
        before, after = got[state]["before"], got[state]["after"]
        for payload in after[0]:
            for arm in after[0][payload]:
                b = [run[payload][arm] for run in before]
                a = [run[payload][arm] for run in after]
                q = statistics.quantiles(b, n=4) if len(b) > 1 else [b[0], b[0], b[0]]
                mb, ma = statistics.median(b), statistics.median(a)
                out.setdefault(state, []).append({
                    "payload": payload, "arm": arm, "before_us": mb, "after_us": ma,
                    "after_over_before": ma / mb if mb > 0 else None,
                    "before_spread": (q[2] - q[0]) / mb if mb > 0 else None,
                    "rounds": len(a)})
    return out


def _print_compare(results: dict[str, list[dict]], other_src: str, busy: int) -> None:
    print(f"overhead per call (round trip minus the worker's time; the floor: its round trip), "
          f"median µs; before = {other_src}, after = this tree; load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for state, rows in results.items():
        print(f"\n{state}" + (f" ({busy} busy-looping processes beside it)"
                               if state == "busy" else ""))
        for row in rows:
            ratio, spread = row["after_over_before"], row["before_spread"]
            print(f"  {row['payload']:<18}{row['arm']:<16}before {row['before_us']:>8.1f}  "
                  f"after {row['after_us']:>8.1f}  after/before "
                  f"{ratio if ratio is not None else float('nan'):.3f}  before spread "
                  f"{spread if spread is not None else float('nan'):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=400, help="calls per arm, payload and state")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms besides the floor (default: {','.join(ARMS)})")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="also measure every arm beside N busy-looping processes "
                             "(quiet and busy rounds interleaved; N = the core count for the busy target)")
    parser.add_argument("--copy-threads", type=int, default=None, metavar="N",
                        help="A/B of the client's large copies: the xstage arms on the caller's "
                             "thread alone beside -pool arms with N copy helpers (client/copies.py)"
                             ", interleaved in one run")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the doorbell's decisions (spin or block, and why) per arm")
    parser.add_argument("--compare", metavar="SRC",
                        help="the xstage arms under another tree's src/ (before) and this one "
                        "(after), one process each per round, interleaved, e.g. --compare "
                        "../main/src (--arms narrows them)")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_round:  # one --compare process
        print(json.dumps(_one_round(tuple(a for a in args.arms.split(",") if a), args.calls)))
        return
    if args.compare:
        chosen = args.arms if args.arms != ",".join(ARMS) else ",".join(COMPARE_ARMS)
        with Neighbours(args.busy) as neighbours:
            results = compare(args.compare, args.rounds, args.calls,
                              tuple(a for a in chosen.split(",") if a), neighbours)
        if args.json:
            print(json.dumps({"benchmark": "transport-compare", "busy": args.busy,
                              "load_average": os.getloadavg(), "results": results}, indent=2))
        else:
            _print_compare(results, args.compare, args.busy)
        return
    if args.busy < 0:
        parser.error("--busy takes a number of processes >= 0")
    if args.copy_threads is not None and not 0 < args.copy_threads <= copies.MAX_THREADS:
        parser.error(f"--copy-threads takes 1 to {copies.MAX_THREADS} helper threads")
    with tempfile.TemporaryDirectory() as tmp, Neighbours(args.busy) as neighbours:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        results = _run(args, Path(tmp), neighbours)
    doc: dict = {"benchmark": "transport", "python": sys.version.split()[0],
                 "cpus": os.cpu_count(), "copy_threads": args.copy_threads,
                 "copy_threads_default": copies.COPY_THREADS, "results": results["quiet"],
                 "targets": {"quiet": targets(results["quiet"])}}
    if "busy" in results:
        doc["busy"] = {"processes": args.busy, "results": results["busy"]}
        doc["targets"]["busy"] = targets(results["busy"])
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    for state, rows in results.items():
        if len(results) > 1:
            print(f"\n{state}" + (f" ({args.busy} busy-looping processes beside it)"
                                   if state == "busy" else ""))
        _print_rows(rows, args.verbose)
    for state, rows in results.items():
        for row in rows:
            for arm in ("xstage", "xstage-out"):
                a, b = row["arms"].get(arm), row["arms"].get(f"{arm}-pool")
                if a and b and "copies_us" in a and "copies_us" in b and a["copies_us"] > 0:
                    print(f"{state:<6}{row['payload']:<18}{arm}: copies {a['copies_us']:.1f} → "
                          f"{b['copies_us']:.1f} µs with {args.copy_threads} helpers "
                          f"({b['copies_us'] / a['copies_us']:.2f}×; × floor "
                          f"{a['copies_vs_memcpy']:.2f} → {b['copies_vs_memcpy']:.2f}), overhead "
                          f"{a['overhead_us']:.1f} → {b['overhead_us']:.1f} µs, process CPU/call "
                          f"{a['client_cpu_us']:.1f} → {b['client_cpu_us']:.1f} µs; "
                          f"{b['copies_split']} copies split in {b['calls']} calls")
    for state, checks in doc["targets"].items():
        for c in checks:
            print(f"{state:<6}{c['payload']:<18}{c['arm']} {c['figure']} {c['xstage']:.1f} µs = "
                  f"{c['ratio']:.2f}× tcp's {c['tcp']:.1f} µs (target ≤ {c['bound']}×: "
                  f"{'met' if c['met'] else 'missed'})")


if __name__ == "__main__":
    main()
