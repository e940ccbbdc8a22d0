"""How long ``xstage devices --json`` takes in a fresh process once the probe cache is warm.

The figure a user waits for each time they look at the device table; the target is under a
second. It was a test's assertion until a loaded 2-core machine took 1.25 s: a wall-clock bound
belongs here, where it is printed, not in the test suite, where it flakes.

Run: ``python benchmarks/devices_cached.py [--json] [--rounds N]``. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    argv = [sys.executable, "-m", "xstage", "devices", "--json"]
    with tempfile.TemporaryDirectory(prefix="xstage-bench-") as tmp:
        env = dict(os.environ, XSTAGE_HOME=tmp, XSTAGE_CONFIG=str(Path(tmp) / "no-user-config.toml"))
        t0 = time.monotonic()
        subprocess.run(argv, env=env, capture_output=True, check=True, timeout=300)
        cold = time.monotonic() - t0
        warm = []
        for _ in range(args.rounds):
            t0 = time.monotonic()
            subprocess.run(argv, env=env, capture_output=True, check=True, timeout=60)
            warm.append(time.monotonic() - t0)
    figures = {"cold_s": cold, "cached_min_s": min(warm), "cached_median_s": statistics.median(warm)}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, seconds in figures.items():
        print(f"{name:16s} {seconds:7.3f} s")


if __name__ == "__main__":
    main()
