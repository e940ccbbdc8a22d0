"""Which figures of docs/performance.md are stale: code they measure changed after their commit.

Reads the page: each ``### name`` entry of "Benchmarks", the paths on its ``Measures:`` line, and
each figure row's commit (the table's fourth column). For every row, asks git for the commits
after that one (``git log <commit>..HEAD -- <paths>``) that touched a measured path: none, the
figure is ``current``; some, it is ``stale`` and they are listed; a row with no commit is
``unmeasured``. Reports only: it exits 0 whatever it finds (1 only when the page or the git
history cannot be read), so a stale figure is a figure to measure again, never a failure.

Run (from the repository root): ``python3 scripts/performance_staleness.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "performance.md"
COMMIT = re.compile(r"`([0-9a-f]{7,40})`")


@dataclass
class Row:
    """One figure of an entry: its first cell, and the commit it measured (None: unmeasured)."""

    figure: str
    commit: str | None
    status: str = "unmeasured"
    changed_by: list[str] = field(default_factory=list)


@dataclass
class Entry:
    """One benchmark's section: its name, the paths it measures, its figures."""

    name: str
    measures: list[str]
    rows: list[Row]


def parse(text: str) -> list[Entry]:
    """The entries of the page's "Benchmarks" section.

    Raises:
        ValueError: an entry without a ``Measures:`` line or without a figure table.
    """
    body = text.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    entries = []
    for chunk in re.split(r"^### ", body, flags=re.M)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        measures = re.search(r"^Measures: (.+?)\n\n", chunk, flags=re.M | re.S)
        if measures is None:
            raise ValueError(f"docs/performance.md, {name}: no 'Measures:' line")
        rows = []
        for line in chunk.splitlines():
            cells = [c.strip() for c in line.split("|")[1:-1]]
            if len(cells) == 6 and cells[0] not in ("figure", "---") and not cells[0].startswith("-"):
                found = COMMIT.search(cells[3])
                rows.append(Row(cells[0], found.group(1) if found else None))
        if not rows:
            raise ValueError(f"docs/performance.md, {name}: no figure rows")
        entries.append(Entry(name, re.findall(r"`([^`]+)`", measures.group(1)), rows))
    return entries


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout


def judge(entries: list[Entry]) -> list[Entry]:
    """Each row's status from the git history (in place; returned for convenience).

    Raises:
        subprocess.CalledProcessError: a commit git does not know, or no git history.
    """
    for entry in entries:
        for row in entry.rows:
            if row.commit is None:
                continue
            _git("cat-file", "-e", f"{row.commit}^{{commit}}")
            log = _git("log", "--format=%h %ad %s", "--date=short", f"{row.commit}..HEAD", "--",
                       *entry.measures)
            row.changed_by = [line for line in log.splitlines() if line.strip()]
            row.status = "stale" if row.changed_by else "current"
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    try:
        entries = judge(parse(PAGE.read_text(encoding="utf-8")))
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError) as exc:
        print(f"error: cannot judge docs/performance.md: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([asdict(e) for e in entries], indent=1))
        return 0
    for entry in entries:
        for row in entry.rows:
            mark = {"current": "current", "unmeasured": "unmeasured",
                    "stale": f"STALE ({len(row.changed_by)} commits since {row.commit})"}[row.status]
            print(f"{entry.name:17} {mark:32} {row.figure[:70]}")
            for line in row.changed_by[:5]:
                print(f"{'':17}   {line[:100]}")
    counts = {s: sum(r.status == s for e in entries for r in e.rows)
              for s in ("current", "stale", "unmeasured")}
    print(f"\n{counts['current']} current, {counts['stale']} stale, {counts['unmeasured']} unmeasured "
          f"figures in {len(entries)} benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
