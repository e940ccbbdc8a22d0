"""A 64 B call through the shared region under two source trees, quiet and busy, interleaved.

The per-call CPU of a busy machine: ``--compare SRC`` runs the same call (``WorkerClient.run`` on
``ort-cpu``, a Slice graph, 16 float32 each way) under another tree's ``src/`` (*before*, e.g.
the parent commit's) and under this tree (*after*), each in its own client process that keeps
one worker for the whole run, beside a TCP-loopback echo of the same bytes (``tcp``, as in
``benchmarks/transport.py``). Rounds interleave the arms (their order rotates) and the states:
*quiet*, then with ``--busy N`` CPU-burning processes beside them (``benchmarks/_busy.py``).
Without ``--compare`` only this tree and the TCP echo run.

Per arm and state, medians over rounds of:

* ``half_us``: half of (round trip − the worker's reported compute), the median call.
* ``client_cpu_us``: the caller's CPU per call (``time.thread_time_ns`` around the calls).
* ``worker_cpu_us``: the worker's CPU per call, all its threads (``/proc/PID/task/*/schedstat``).
* ``client_rq_us``: the caller's time per call runnable but not running (schedstat field 2).
* ``client_nvcsw``: the caller's non-voluntary context switches per call (preempted).

CPU per call is steadier than wall time on a loaded machine; quote both, with the load average
printed at the top. Run:
``PYTHONPATH=src python3 benchmarks/hotpath.py [--compare ../other/src] [--busy N]
[--rounds R] [--calls N] [--json]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _waits import waits_delta  # noqa: E402  (beside this file)

FIELDS = ("half_us", "client_cpu_us", "worker_cpu_us", "client_rq_us", "client_nvcsw")


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _schedstat(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable and waiting) summed over ``pid``'s threads."""
    run = wait = 0
    for t in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue
        run += int(fields[0])
        wait += int(fields[1])
    return run, wait


def _nvcsw(pid: int) -> int:
    total = 0
    for t in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def _describe(counts: dict) -> str:
    rules = ", ".join(f"{k} {v}" for k, v in counts.get("rules", {}).items()) or "none"
    ends = ", ".join(f"{k} {v}" for k, v in counts.get("outcomes", {}).items()) or "none"
    return f"decided: {rules}; ended: {ends}"


def serve() -> None:
    """One arm's client process: a worker kept for the run; each stdin line N runs N calls
    and answers one JSON line (``FIELDS``)."""
    import tempfile

    import numpy as np

    from xstage import builtin_graphs
    from xstage.client import WorkerClient

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("XSTAGE_HOME", str(Path(tmp) / "home"))
        n = int(os.environ.get("HOTPATH_FLOATS", "16"))
        graph = builtin_graphs.write(builtin_graphs.slice_graph(n, n), Path(tmp) / "s.onnx")
        client = WorkerClient(sys.executable)
        client.start()
        client.load(graph)
        feeds = {"x": np.ones(n, np.float32)}
        me = os.getpid()
        try:
            for line in sys.stdin:
                n = int(line)
                for _ in range(min(100, n)):  # warm: the policy follows the state
                    client.run(feeds)
                over = []
                waits0 = client.waits()
                run0, wait0 = _schedstat(me)
                peer0 = _schedstat(client.pid)[0]
                nv0 = _nvcsw(me)
                cpu0 = time.thread_time_ns()
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    client.run(feeds)
                    over.append(time.perf_counter_ns() - t0
                                - client.last_timing.get("worker_ns", 0))
                cpu = time.thread_time_ns() - cpu0
                peer = _schedstat(client.pid)[0] - peer0
                wait = _schedstat(me)[1] - wait0
                nv = _nvcsw(me) - nv0
                waits = waits_delta(client.waits(), waits0)
                print(json.dumps({"half_us": statistics.median(over) / 2e3,
                                  "client_cpu_us": cpu / n / 1e3,
                                  "worker_cpu_us": peer / n / 1e3,
                                  "client_rq_us": wait / n / 1e3,
                                  "client_nvcsw": nv / n,
                                  "waits": waits}),
                      flush=True)
        finally:
            client.close()


class _Child:
    def __init__(self, src: str, extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, PYTHONPATH=src, **(extra or {}))
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def measure(self, n: int) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("an arm's client process ended (its stderr is above)")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _tcp(n: int, arm) -> dict:  # type: ignore[no-untyped-def]
    cpu0 = time.thread_time_ns()
    rt = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        arm.call()
        rt.append(time.perf_counter_ns() - t0)
    return {"half_us": statistics.median(rt) / 2e3,
            "client_cpu_us": (time.thread_time_ns() - cpu0) / n / 1e3}


def run(compare: str | None, busy: int, rounds: int, calls: int,
        after: str | None = None, envs: dict[str, dict[str, str]] | None = None) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE))
    from _busy import Neighbours
    from transport import _tcp_arm

    own = after or str(HERE.parent / "src")
    envs = envs or {}
    children = {"after": _Child(own, envs.get("after"))}
    if compare:
        children = {"before": _Child(compare, envs.get("before")), **children}
    floats = int(os.environ.get("HOTPATH_FLOATS", "16"))
    tcp = _tcp_arm(np.ones(floats, np.float32), floats)
    names = list(children) + ["tcp"]
    got: dict[str, dict[str, list[dict]]] = {s: {a: [] for a in names} for s in ("quiet", "busy")}
    states = ("quiet", "busy") if busy else ("quiet",)
    try:
        with Neighbours(busy) as nb:
            for r in range(rounds):
                for state in states:
                    getattr(nb, state)()
                    order = names[r % len(names):] + names[:r % len(names)]
                    for name in order:
                        if name == "tcp":
                            for _ in range(100):
                                tcp.call()
                            got[state][name].append(_tcp(calls, tcp))
                        else:
                            got[state][name].append(children[name].measure(calls))
    finally:
        for child in children.values():
            child.close()
        tcp.close()
    table: dict = {}
    for state in states:
        for name in names:
            runs = got[state][name]
            row: dict = {k: statistics.median(x[k] for x in runs) for k in FIELDS
                         if k in runs[0]}
            if runs and runs[-1].get("waits"):  # the decisions of the last round, per side
                row["waits"] = {side: _describe(w) for side, w in runs[-1]["waits"].items()}
            table.setdefault(state, {})[name] = row
        tcp_half = table[state]["tcp"]["half_us"]
        for name in children:
            table[state][name]["x_tcp"] = table[state][name]["half_us"] / tcp_half
        if compare:
            b, a = table[state]["before"], table[state]["after"]
            table[state]["after_over_before"] = {k: a[k] / b[k] for k in FIELDS if b.get(k)}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="SRC",
                        help="another tree's src/ (before), e.g. a checkout of the parent commit")
    parser.add_argument("--after", metavar="SRC",
                        help="the tree measured as after (default: this one's src/)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="also measure beside N busy-looping processes")
    parser.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the before arm's processes only "
                             "(repeatable; with --compare set to this tree's src/: a knob's A/B)")
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="the same for the after arm")
    parser.add_argument("--floats", type=int, default=16,
                        help="float32 values each way (16: the 64 B call; 262144: 1 MiB)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=1000, help="calls per arm, round and state")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # an arm
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    envs = {}
    for arm, pairs in (("before", args.before_env), ("after", args.after_env)):
        for pair in pairs:
            name, sep, value = pair.partition("=")
            if not sep or not name:
                parser.error(f"--{arm}-env takes NAME=VALUE, got {pair!r}")
            envs.setdefault(arm, {})[name] = value
    os.environ["HOTPATH_FLOATS"] = str(args.floats)  # the arms' processes read it too
    load0 = os.getloadavg()
    table = run(args.compare, args.busy, args.rounds, args.calls, args.after, envs)
    doc = {"benchmark": "hotpath", "cpus": os.cpu_count(), "busy": args.busy,
           "rounds": args.rounds, "calls": args.calls, "compare": args.compare,
           "floats": args.floats,
           "after": args.after, "envs": envs,
           "load_average": [load0, os.getloadavg()], "table": table}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{args.floats * 4} B each way through the shared region, {os.cpu_count()} CPUs, "
          f"busy = {args.busy}, "
          f"{args.rounds} rounds x {args.calls} calls; load average "
          f"{load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    for state, rows in table.items():
        for name, row in rows.items():
            if name == "after_over_before":
                print(f"  {state:<6}after/before  " + ", ".join(
                    f"{k} {v:.2f}" for k, v in row.items()))
                continue
            extra = f"  cpu/call client {row['client_cpu_us']:.1f} µs" if name == "tcp" else (
                f"  ({row['x_tcp']:.2f}x tcp)  cpu/call client {row['client_cpu_us']:.1f} "
                f"worker {row['worker_cpu_us']:.1f} µs, client rq-wait "
                f"{row['client_rq_us']:.1f} µs, preempted {row['client_nvcsw']:.2f}/call")
            print(f"  {state:<6}{name:<7}half round trip {row['half_us']:5.1f} µs{extra}")
            for side, line in (row.get("waits") or {}).items():
                print(f"  {'':<13}{side}: {line}")


if __name__ == "__main__":
    main()
