"""Large copies on several CPUs (``client/copies.py``): where does splitting pay?

For each size, one ``np.copyto`` on the calling thread against ``CopyPool(N).copyto`` for each N
in ``--threads``, interleaved round by round, medians. Two kinds of copy, as the client makes
them: ``into`` a preallocated buffer (``Region.write`` into a slot, ``out=``) and ``fresh`` (a
new output array: its first touch included, ``CopyPool.empty_copy``). Each call copies between
one of several buffer pairs in turn, together larger than a last-level cache, so the lines are
not already in this core's cache (in the client they were last touched by the worker's core).

Every copy here is split, whatever the machine's load (the client wakes helpers only onto free
CPUs, ``copies.free_helpers``; here that check is off, so the figures are the split's own).
The size where the split starts to pay on a machine is what ``copies.MIN_BYTES`` is set from
(docs/performance.md#copies). Run:
``python benchmarks/copies.py [--threads 1,2,4] [--rounds N] [--json]``. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from xstage.client import copies

SIZES = (512 << 10, 1 << 20, 2 << 20, 4_800_000, 8_800_000, 32 << 20)
#: Bytes the rotation of buffer pairs covers at least (beyond a last-level cache).
SPAN = 256 << 20


def measure(size: int, pools: dict[int, copies.CopyPool], rounds: int, calls: int) -> dict:
    """One size: every arm interleaved round by round; medians in µs and × one thread."""
    pairs = max(2, min(64, SPAN // (2 * size)))
    srcs = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8) for i in range(pairs)]
    dsts = [np.empty_like(s) for s in srcs]
    arms: dict[str, list[float]] = {}
    k = 0

    def timed(name: str, fn: Callable[[np.ndarray, np.ndarray], object]) -> None:
        nonlocal k
        ts = []
        for _ in range(calls):
            k = (k + 1) % pairs
            t0 = time.perf_counter_ns()
            fn(dsts[k], srcs[k])
            ts.append(time.perf_counter_ns() - t0)
        arms.setdefault(name, []).append(statistics.median(ts))

    for _ in range(rounds):
        timed("into, 1 thread", lambda d, s: np.copyto(d, s))
        timed("fresh, 1 thread", lambda d, s: np.array(s, copy=True))
        for t, pool in pools.items():
            timed(f"into, +{t}", pool.copyto)
            timed(f"fresh, +{t}", lambda d, s, p=pool: p.empty_copy(s))
    med = {name: statistics.median(v) / 1e3 for name, v in arms.items()}
    return {"bytes": size, "us": med,
            "ratio": {n: med[n] / med[n.split(",")[0] + ", 1 thread"] for n in med}}


def gil_released(size: int = 32 << 20, copies_n: int = 20) -> dict:
    """Does ``np.copyto`` let go of the GIL? A pure-Python counter thread counts while this
    thread copies, then while it sleeps: near-equal rates say the copy released the GIL."""
    src = np.ones(size, np.uint8)
    dst = np.empty_like(src)
    stop, count = [False], [0]

    def spin() -> None:
        while not stop[0]:
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    c0, t0 = count[0], time.perf_counter()
    for _ in range(copies_n):
        np.copyto(dst, src)
    copying = (count[0] - c0) / (time.perf_counter() - t0)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.05)
    idle = (count[0] - c0) / (time.perf_counter() - t0)
    stop[0] = True
    t.join()
    return {"counts_per_s_while_copying": copying, "counts_per_s_while_sleeping": idle,
            "ratio": copying / idle if idle else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=None,
                        help="comma-separated helper counts (default: 1, 2, 4, … below the CPUs)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10, help="copies per arm and round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    helpers = [int(t) for t in args.threads.split(",")] if args.threads else \
        [t for t in (1, 2, 4, 8) if t < cpus] or [1]
    copies._read_load = lambda: None  # split every copy: see the docstring
    pools = {t: copies.CopyPool(t, min_bytes=0) for t in helpers}
    rows = []
    try:
        for size in SIZES:
            rows.append(measure(size, pools, args.rounds, args.calls))
    finally:
        for pool in pools.values():
            pool.close()
    gil = gil_released()
    doc = {"benchmark": "copies", "cpus": cpus, "min_bytes": copies.MIN_BYTES, "gil": gil,
           "default_helpers": copies.COPY_THREADS, "load": os.getloadavg(), "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{cpus} CPUs allowed, load {doc['load'][0]:.2f}; default helpers here "
          f"{copies.COPY_THREADS}, split from {copies.MIN_BYTES} B; medians, µs (× one thread)")
    print(f"GIL: a Python thread counted {gil['counts_per_s_while_copying']:.3g}/s while this one "
          f"copied 32 MiB, {gil['counts_per_s_while_sleeping']:.3g}/s while it slept "
          f"({gil['ratio']:.2f}×: np.copyto releases the GIL when near 1)")
    names = list(rows[0]["us"])
    print(f"{'bytes':>10}  " + "  ".join(f"{n:>18}" for n in names))
    for row in rows:
        cells = [f"{row['us'][n]:>9.1f} ({row['ratio'][n]:.2f}×)" for n in names]
        print(f"{row['bytes']:>10}  " + "  ".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
