"""What one 64 B worker call executes on each end, counted: a figure where timings are noise.

A shared machine's timings of a microsecond-scale call move by more than the few percent a
change of the hot path costs; what each end executes per call does not. This counts, for
``--calls`` calls of ``slice_graph(16, 16)`` (64 B in, 64 B out) on the shared region
(``shm_mode="auto"``), on the authenticated TCP socket (``transport="tcp"``) and inline on the
local socketpair (``shm_mode="off"``): Python
function calls (``sys.setprofile``'s ``call`` events), calls of built-ins and C methods
(``c_call``) and bytecode instructions executed (``sys.settrace`` with ``f_trace_opcodes``:
attribute loads and every other step a call count does not see):

* the client: the caller's thread inside ``WorkerClient.run`` (the measured calls only);
* the worker: its main thread over its whole life, in two workers (one served the warm-up calls
  alone, the other the warm-up and the measured calls), the difference over ``--calls``. The
  worker is started through a wrapper interpreter that starts the counters before its bootstrap
  runs and writes them before ``os._exit``.

Both ends spin 0 seconds (``XSTAGE_SPIN_SECONDS`` and ``XSTAGE_WORKER_SPIN_SECONDS`` = 0), so
no spin loop's turns, which depend on timing, are counted: each end blocks in the kernel at
once. A wait can still find its answer already there and skip its block (the doorbell's
``_sleep``, ``_block_eventfd``, its ready checks), so the totals move by a few instructions
between runs; compare the other functions one by one (``--top``).

``--compare SRC`` (repeatable) counts under another tree's ``src/`` too, one process each, its
column before this tree's; ``--top N`` lists, per row, the N functions whose counts differ most
between the first tree and this one.

Run: ``PYTHONPATH=src python benchmarks/callcount.py [--calls N] [--compare SRC]... [--top N]
[--json]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

#: The counters, for this thread: ``calls`` (Python functions by "file:name"), ``c``
#: (built-ins and C methods by name: a bound method as the key would keep its object alive),
#: ``ops`` (bytecode instructions executed, by function: attribute loads and every other step a
#: call count does not see). ``start()`` and ``stop()`` turn them on and off.
_COUNTER = r"""
import collections, os, sys
counts = {"py": collections.Counter(), "c": collections.Counter(), "ops": collections.Counter()}
_py, _cc, _ops = counts["py"], counts["c"], counts["ops"]
def _name(code):
    return "%s:%s" % (os.path.basename(code.co_filename), code.co_name)
def _prof(frame, event, arg):
    if event == "call":
        _py[_name(frame.f_code)] += 1
    elif event == "c_call":
        _cc[getattr(arg, "__qualname__", "?")] += 1
def _op(frame, event, arg):
    if event == "opcode":
        _ops[_name(frame.f_code)] += 1
    return _op
def _trace(frame, event, arg):
    frame.f_trace_opcodes = True
    return _op
def start():
    sys.setprofile(_prof)
    sys.settrace(_trace)
def stop():
    sys.settrace(None)
    sys.setprofile(None)
"""

#: The wrapper interpreter's Python side: count in the worker's main thread from its first
#: line, write the counts to ``$CALLCOUNT_OUT`` at ``os._exit``. The worker is started
#: ``-E -s -c BOOTSTRAP root worker ...``.
_BOOT = r"""
import json, os, sys
args = sys.argv[1:]
while args[0] in ("-E", "-s"):
    args.pop(0)
assert args[0] == "-c"
code, sys.argv = args[1], ["-c", *args[2:]]
counter = {}
exec(compile(open(os.environ["CALLCOUNT_COUNTER"]).read(), "<counter>", "exec"), counter)
real_exit = os._exit
def dump(code_):
    counter["stop"]()
    with open(os.environ["CALLCOUNT_OUT"], "w") as f:
        json.dump(counter["counts"], f)
    real_exit(code_)
os._exit = dump
counter["start"]()
exec(compile(code, "<bootstrap>", "exec"), {"__name__": "__main__"})
"""

KINDS = ("py", "c", "ops")


def _counted(fn, calls: int) -> dict:
    """Per-function counts of ``fn()`` called ``calls`` times in this thread."""
    counter: dict = {}
    exec(compile(_COUNTER, "<counter>", "exec"), counter)
    counter["start"]()
    try:
        for _ in range(calls):
            fn()
    finally:
        counter["stop"]()
    counts = counter["counts"]
    for kind in KINDS:  # the loop's own steps
        counts[kind].pop("callcount.py:_counted", None)
        counts[kind].pop("callcount.py:<lambda>", None)
    counts["c"].pop("setprofile", None)
    counts["c"].pop("settrace", None)
    return counts


def _session(interp: str, graph: str, arm: str, warm: int, calls: int, out: str) -> dict:
    """One worker's life: ``warm`` calls, then ``calls`` counted ones; the client's counts."""
    import numpy as np

    from xstage.client import WorkerClient

    os.environ["CALLCOUNT_OUT"] = out
    kw = {"region": {"shm_mode": "auto"}, "tcp": {"shm_mode": "off", "transport": "tcp"},
          "inline": {"shm_mode": "off"}}[arm]
    client = WorkerClient(interp, **kw)
    client.start()
    client.load(graph)
    x = {"x": np.random.default_rng(0).standard_normal(16).astype(np.float32)}
    for _ in range(warm):
        client.run(x)
    counts = _counted(lambda: client.run(x), calls)
    client.close()
    return counts


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def measure(calls: int, warm: int = 300) -> dict:
    """Per-call counts: ``{arm: {end: {"py": {fn: n}, "c": {fn: n}}}}`` (this tree's import)."""
    # Before any import of xstage: a tree before ``TransportTuning`` read them at import.
    os.environ["XSTAGE_SPIN_SECONDS"] = "0"
    os.environ["XSTAGE_WORKER_SPIN_SECONDS"] = "0"
    from xstage import builtin_graphs

    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        os.environ["XSTAGE_HOME"] = str(t / "home")
        boot = t / "boot.py"
        boot.write_text(_BOOT)
        (t / "counter.py").write_text(_COUNTER)
        os.environ["CALLCOUNT_COUNTER"] = str(t / "counter.py")
        interp = t / "python"
        interp.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{boot}" "$@"\n')
        interp.chmod(interp.stat().st_mode | stat.S_IXUSR)
        graph = str(builtin_graphs.write(builtin_graphs.slice_graph(16, 16), t / "s.onnx"))
        for arm in ("region", "tcp", "inline"):
            base = str(t / f"{arm}-0.json")
            full = str(t / f"{arm}-1.json")
            _session(str(interp), graph, arm, warm, 0, base)
            client = _session(str(interp), graph, arm, warm, calls, full)
            w0, w1 = _load(base), _load(full)
            worker = {kind: {k: (w1[kind].get(k, 0) - w0[kind].get(k, 0)) / calls
                             for k in set(w1[kind]) | set(w0[kind])} for kind in KINDS}
            rows[arm] = {
                "client": {kind: {k: n / calls for k, n in client[kind].items()}
                           for kind in KINDS},
                "worker": {kind: {k: n for k, n in v.items() if abs(n) > 1e-9}
                           for kind, v in worker.items()},
            }
    return rows


#: What a wait executes, which depends on whether its answer was already there (the doorbell's
#: and the socket spin's code, the policy's, the ready checks; the doorbell lived in ``shm.py``
#: before ``doorbell.py``): left out of the ``rest`` column.
_WAIT_FILES = ("doorbell.py", "waitpolicy.py", "sockspin.py")
_WAIT_NAMES = {"ring", "wake", "_wake", "heads_up", "_decide", "_consume", "wait", "_announced",
               "_spin_until_coming", "_catch_up", "_tell_cpu", "_learn", "_sleep", "_block",
               "_block_eventfd", "_spin", "_shares_cpu", "read_load", "<lambda>", "set_flag",
               "flag", "closed"}


def _waits(key: str) -> bool:
    file, _, name = key.partition(":")
    return file in _WAIT_FILES or (file in ("shm.py", "region.py") and name in _WAIT_NAMES)


def _totals(rows: dict) -> dict:
    """``{"region client": {"py": n, "c": n, "ops": n, "rest": n}, ...}``: per-call totals;
    ``rest``: the instructions outside the waits (``_waits``)."""
    return {f"{arm} {end}": {**{kind: sum(d[kind].values()) for kind in KINDS},
                             "rest": sum(n for k, n in d["ops"].items() if not _waits(k))}
            for arm, ends in rows.items() for end, d in ends.items()}


def _print(got: dict, calls: int, top: int) -> None:
    """One line per arm and end: each tree's Python calls, C calls and instructions per call;
    with ``top``, the functions whose counts differ most between the first tree and the last."""
    totals = {tree: _totals(rows) for tree, rows in got.items()}
    trees = list(got)
    print(f"per 64 B call ({calls} calls; both ends spin 0): Python calls / C calls / "
          f"bytecode instructions (those outside the waits), by tree: " + ", ".join(trees))
    for name in totals[trees[-1]]:
        cells = "   ".join(f"{t[name]['py']:6.2f} / {t[name]['c']:6.2f} / {t[name]['ops']:7.1f} "
                           f"({t[name]['rest']:6.1f})" for t in totals.values())
        print(f"  {name:<14} {cells}")
    if not top or len(trees) < 2:
        return
    first, last = got[trees[0]], got[trees[-1]]
    for arm, ends in last.items():
        for end in ends:
            for kind in KINDS:
                b, a = first[arm][end][kind], last[arm][end][kind]
                diff = sorted(((a.get(k, 0) - b.get(k, 0), k) for k in set(a) | set(b)),
                              key=lambda d: -abs(d[0]))
                shown = [(d, k) for d, k in diff[:top] if abs(d) > 0.005]
                if shown:
                    print(f"  {arm} {end} {kind}: " + "; ".join(f"{k} {d:+.2f}" for d, k in shown))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--compare", metavar="SRC", action="append", default=[],
                        help="another tree's src/ (repeatable): its counts first, this tree's last")
    parser.add_argument("--top", type=int, default=0, metavar="N",
                        help="list the N functions whose counts differ most between the first "
                        "tree and this one")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw:
        print(json.dumps(measure(args.calls)))
        return
    own = str(Path(__file__).resolve().parents[1] / "src")
    got = {}
    for src in [*args.compare, own]:
        done = subprocess.run([sys.executable, __file__, "--raw", "--calls", str(args.calls)],
                              env=dict(os.environ, PYTHONPATH=src), capture_output=True,
                              text=True, timeout=1800, check=True)
        got["this tree" if src == own else src] = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(got))
        return
    _print(got, args.calls, args.top)


if __name__ == "__main__":
    main()
