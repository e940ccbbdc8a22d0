"""Where the test suite's time goes: per-file sums from pytest's ``--durations=0`` output.

Setup and teardown count with the test they serve, so a module-scoped export or a worker started
by a fixture lands on its file. Give two outputs to compare a change (before, after)::

    python3 -m pytest -q --durations=0 > before.txt          # on the parent commit
    python3 -m pytest -q --durations=0 > after.txt           # on this one
    python3 scripts/suite_durations.py before.txt after.txt  # per file, before, after, delta

With one output it prints the files and the slowest test phases. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")
TOTAL = re.compile(r"\b(?:passed|failed)\b.* in ([0-9.]+)s")


def read(path: Path) -> tuple[dict[str, float], list[tuple[float, str, str]], float | None]:
    """(seconds per file, every timed phase, pytest's own total) from one saved output."""
    per_file: dict[str, float] = defaultdict(float)
    phases = []
    total = None
    for line in path.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            seconds, when, node = float(match[1]), match[2], match[3]
            per_file[node.split("::")[0]] += seconds
            phases.append((seconds, when, node))
        elif found := TOTAL.search(line):
            total = float(found[1])
    return per_file, phases, total


def main(argv: list[str] | None = None) -> int:
    """Print the per-file table (and the delta when given two outputs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="one or two saved pytest outputs")
    parser.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    args = parser.parse_args(argv)
    if len(args.outputs) > 2:
        parser.error("give one output, or two to compare")
    missing = [str(p) for p in args.outputs if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)} (save pytest's output with --durations=0 first)")
    runs = [read(p) for p in args.outputs]
    if not any(run[0] for run in runs):
        print("no durations found: run pytest with --durations=0", file=sys.stderr)
        return 1
    if len(runs) == 1:
        per_file, phases, total = runs[0]
        print(f"pytest total {total} s; timed phases {sum(per_file.values()):.1f} s")
        for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{seconds:8.1f}  {name}")
        print()
        for seconds, when, node in sorted(phases, reverse=True)[: args.top]:
            print(f"{seconds:8.2f}  {when:8s} {node}")
        return 0
    (before, _, t0), (after, _, t1) = runs
    print(f"pytest total {t0} -> {t1} s; timed phases {sum(before.values()):.1f} -> "
          f"{sum(after.values()):.1f} s")
    names = sorted(set(before) | set(after), key=lambda n: after.get(n, 0.0) - before.get(n, 0.0))
    for name in names[: args.top]:
        b, a = before.get(name, 0.0), after.get(name, 0.0)
        print(f"{b:8.1f} {a:8.1f} {a - b:+8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
