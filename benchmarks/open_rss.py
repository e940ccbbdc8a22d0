"""The client's peak memory while ``open_stage`` opens a large stage: where do the bytes go?

Each measurement runs in a fresh process (``--child``): it builds a ``y = x`` stage of ``--mib``
MiB in and the same out (``builtin_graphs.slice_graph``, float32), reads its RSS, then opens the
stage on ``--route`` (default ``ort-cpu``; the gate's reference arm and float64 tie-break run in
the client's process as ``open_stage`` chooses today) while a thread samples the RSS every 2 ms
(psutil), and reports the peak minus the RSS before the open, against the stage's I/O bytes
(in + out). ``ru_maxrss`` (the kernel's own high-water mark) is reported beside the sampled
peak. With ``--trace`` the child also runs ``tracemalloc`` (numpy reports its buffers to it) and
prints the allocation sites live at the highest traced total, largest first: where the bytes go.

Run: ``PYTHONPATH=src python benchmarks/open_rss.py [--mib 256] [--trace] [--src SRC ...]``;
``--src`` runs the same measurement with another tree's ``src`` first on the path (a before and
after in one run). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MIB = 1 << 20


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _Peak:
    """The process's RSS sampled every ``every`` seconds; with ``trace``, the tracemalloc
    snapshot at the highest traced total."""

    def __init__(self, every: float, trace: bool) -> None:
        self.peak, self.trace, self.snapshot, self.traced_peak = 0, trace, None, 0
        self.main = threading.get_ident()
        #: The opening thread's stack (xstage frames) each time the RSS rose 128 MiB past the
        #: last one noted.
        self.rises: list[tuple[int, list[str]]] = []
        self._noted = 0
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import tracemalloc

        while not self._stop.wait(self._every):
            now = _rss()
            if now > self._noted + 128 * MIB:
                self._noted = now
                frame, stack = sys._current_frames().get(self.main), []
                while frame is not None:
                    name = frame.f_code.co_filename
                    if "xstage" in name or "onnxruntime" in name or "onnx/" in name:
                        stack.append(f"{Path(name).name}:{frame.f_lineno}")
                    frame = frame.f_back
                self.rises.append((now, stack[:7]))
            self.peak = max(self.peak, now)
            if self.trace:
                now = tracemalloc.get_traced_memory()[0]
                if now > self.traced_peak + 16 * MIB:
                    self.traced_peak = now
                    self.snapshot = tracemalloc.take_snapshot()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def child(mib: int, route: str, trace: bool, folder: str) -> dict:
    import numpy as np

    import xstage
    from xstage import builtin_graphs

    n = mib * MIB // 4
    graph = builtin_graphs.write(builtin_graphs.slice_graph(n, n), Path(folder) / "big.onnx")
    import onnxruntime  # noqa: F401  (imported before the baseline, as a caller has it)

    if trace:
        import tracemalloc

        tracemalloc.start(25)
    before = _rss()
    sampler = _Peak(0.002, trace)
    t0 = time.perf_counter()
    stage = xstage.open_stage(str(graph), route=route)
    opened_s = time.perf_counter() - t0
    sampler.stop()
    after_open = _rss()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    out = stage({"x": np.ones(n, np.float32)})
    assert out["y"].shape == (n,)
    stage.close()
    result = {"mib_in": mib, "mib_out": mib, "io_bytes": 2 * mib * MIB, "route": route,
              "xstage": xstage.__file__, "rss_before": before, "peak_rss": sampler.peak,
              "ru_maxrss": maxrss,
              "rss_after_open": after_open, "open_s": round(opened_s, 2)}
    result["peak_minus_before"] = result["peak_rss"] - before
    result["rises"] = [{"mib_over_before": round((rss - before) / MIB), "at": stack}
                       for rss, stack in sampler.rises]
    result["x_io"] = round(result["peak_minus_before"] / result["io_bytes"], 2)
    if trace and sampler.snapshot is not None:
        result["traced_peak"] = sampler.traced_peak
        sites = []
        for stat in sampler.snapshot.statistics("traceback")[:8]:
            frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback
                      if "xstage" in f.filename or "onnx" in f.filename][-6:]
            sites.append({"mib": round(stat.size / MIB, 1), "where": frames})
        result["sites_at_traced_peak"] = sites
    return result


def run(src: str | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="open-rss-") as folder:
        done = subprocess.run(
            [sys.executable, __file__, "--child", "--mib", str(args.mib), "--route", args.route,
             "--folder", folder] + (["--trace"] if args.trace else []),
            env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB in, and the same out")
    parser.add_argument("--route", default="ort-cpu")
    parser.add_argument("--trace", action="store_true", help="tracemalloc: the sites at the peak")
    parser.add_argument("--src", action="append", default=[],
                        help="another tree's src to measure too (repeatable)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.mib, args.route, args.trace, args.folder)))
        return
    results = [run(src, args) for src in [None, *args.src]]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for r in results:
        print(f"{r['xstage']}: {r['mib_in']} MiB in + {r['mib_out']} MiB out on {r['route']}: "
              f"RSS before {r['rss_before'] / MIB:.0f} MiB, peak {r['peak_rss'] / MIB:.0f} MiB "
              f"(ru_maxrss {r['ru_maxrss'] / MIB:.0f}), peak - before "
              f"{r['peak_minus_before'] / MIB:.0f} MiB = {r['x_io']}x the I/O bytes; "
              f"open {r['open_s']} s")
        print("  where the RSS rose (MiB over the RSS before; the opening thread's innermost frames):")
        for rise in r["rises"]:
            print(f"    {rise['mib_over_before']:8d} MiB  {' <- '.join(rise['at'])}")
        if r.get("sites_at_traced_peak"):
            print("  tracemalloc: live allocation sites at the highest traced total:")
        for site in r.get("sites_at_traced_peak", []):
            print(f"    {site['mib']:8.1f} MiB  {' <- '.join(reversed(site['where']))}")


if __name__ == "__main__":
    main()
