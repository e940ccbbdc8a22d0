"""Where the test suite's time goes: per-folder and per-file sums, and the slowest tests, from
pytest's ``--durations=0`` output.

Setup and teardown count with the test they serve, so a module-scoped export or a worker started
by a fixture lands on its test, its file and its folder (``tests/client``; a file directly under
``tests/`` is its own row). Give two outputs to compare a change (before, after)::

    python3 -m pytest -q --durations=0 > before.txt          # on the parent commit
    python3 -m pytest -q --durations=0 > after.txt           # on this one
    python3 scripts/suite_durations.py before.txt after.txt  # per folder and file, the slowest

With one output it prints the folders, the files and the slowest tests. Several outputs of one run
split by folder (``pytest tests/client --durations=0 > client.txt``, …) are read as one with
``--merge``. The sums are of the phases pytest timed, so a loaded machine's figures compare only
with figures taken under the same load. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")
TOTAL = re.compile(r"\b(?:passed|failed|skipped|error|errors)\b.* in ([0-9.]+)s")


@dataclass
class Run:
    """One saved output (or several merged): seconds per test, and pytest's own totals."""

    per_test: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    totals: list[float] = field(default_factory=list)

    def by(self, key) -> dict[str, float]:  # type: ignore[no-untyped-def]
        """Seconds summed by ``key(test node id)``."""
        sums: dict[str, float] = defaultdict(float)
        for node, seconds in self.per_test.items():
            sums[key(node)] += seconds
        return sums

    @property
    def total(self) -> float | None:
        return sum(self.totals) if self.totals else None


def file_of(node: str) -> str:
    return node.split("::")[0]


def folder_of(node: str) -> str:
    """``tests/client/test_x.py::t`` → ``tests/client``; ``tests/test_plan.py::t`` → itself."""
    parts = file_of(node).split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else file_of(node)


def read(paths: list[Path]) -> Run:
    """Every timed phase of the saved outputs, summed per test."""
    run = Run()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            match = LINE.match(line)
            if match:
                run.per_test[match[3]] += float(match[1])
            elif found := TOTAL.search(line):
                run.totals.append(float(found[1]))
    return run


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def show_one(run: Run, top: int) -> None:
    print(f"pytest total {_fmt(run.total)} s; timed phases {sum(run.per_test.values()):.1f} s")
    print("\nper folder (s):")
    for name, seconds in sorted(run.by(folder_of).items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f}  {name}")
    print(f"\nthe {top} slowest files (s):")
    for name, seconds in sorted(run.by(file_of).items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.1f}  {name}")
    print(f"\nthe {top} slowest tests (s, setup + call + teardown):")
    for name, seconds in sorted(run.per_test.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.2f}  {name}")


def show_two(before: Run, after: Run, top: int) -> None:
    print(f"pytest total {_fmt(before.total)} -> {_fmt(after.total)} s; timed phases "
          f"{sum(before.per_test.values()):.1f} -> {sum(after.per_test.values()):.1f} s")
    print("\nper folder (s): before, after, delta")
    b, a = before.by(folder_of), after.by(folder_of)
    for name in sorted(set(b) | set(a), key=lambda n: -max(b.get(n, 0.0), a.get(n, 0.0))):
        print(f"{b.get(name, 0.0):8.1f} {a.get(name, 0.0):8.1f} {a.get(name, 0.0) - b.get(name, 0.0):+8.1f}"
              f"  {name}")
    print(f"\nthe {top} files that changed most (s): before, after, delta")
    b, a = before.by(file_of), after.by(file_of)
    names = sorted(set(b) | set(a), key=lambda n: -abs(a.get(n, 0.0) - b.get(n, 0.0)))
    for name in names[:top]:
        print(f"{b.get(name, 0.0):8.1f} {a.get(name, 0.0):8.1f} {a.get(name, 0.0) - b.get(name, 0.0):+8.1f}"
              f"  {name}")
    for label, run in (("before", before), ("after", after)):
        print(f"\nthe {top} slowest tests {label} (s, setup + call + teardown):")
        for name, seconds in sorted(run.per_test.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{seconds:8.2f}  {name}")


def main(argv: list[str] | None = None) -> int:
    """Print the tables (and the deltas when given two outputs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="one or two saved pytest outputs")
    parser.add_argument("--top", type=int, default=20, help="rows of files and tests (default 20)")
    parser.add_argument("--merge", action="store_true",
                        help="read every output given as one run (a suite run folder by folder)")
    args = parser.parse_args(argv)
    if len(args.outputs) > 2 and not args.merge:
        parser.error("give one output, or two to compare (or --merge to read several as one run)")
    missing = [str(p) for p in args.outputs if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)} (save pytest's output with --durations=0 first)")
    runs = [read(args.outputs)] if args.merge else [read([p]) for p in args.outputs]
    if not any(run.per_test for run in runs):
        print("no durations found: run pytest with --durations=0", file=sys.stderr)
        return 1
    if len(runs) == 1:
        show_one(runs[0], args.top)
    else:
        show_two(runs[0], runs[1], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
