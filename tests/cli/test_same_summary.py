"""``xstage external --json R.json`` then ``xstage report R.json``: one summary, row for row.

The two commands once printed two different tables of one record. Both now print
``xstage.record.summary``; only the title differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _xstage(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XSTAGE_HOME=str(home), COLUMNS="400")
    env.pop("XSTAGE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "xstage", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def _rows(stdout: str) -> list[str]:
    """The table without its title line (the one thing allowed to differ)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┌"))
    return lines[start:]


@pytest.mark.parametrize(("extra", "code", "says"), [
    ((), 0, "│ proof "),
    (("--pool", "host_ram=1MiB"), 2, "│ refused "),
], ids=["placed", "refused"])
def test_external_and_report_print_the_same_summary(tmp_path: Path, extra, code, says):
    record = tmp_path / "R.json"
    ran = _xstage("external", "--builtin", "vision-tower-tiny", "--runs", "2", *extra,
                  "--json", str(record), home=tmp_path / "home")
    assert ran.returncode == code, ran.stderr[-2000:]
    reported = _xstage("report", str(record), home=tmp_path / "home")
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert ran.stdout.splitlines()[0] == "xstage external"
    assert reported.stdout.splitlines()[0] == f"Record {record}"
    assert _rows(ran.stdout) == _rows(reported.stdout)
    assert says in ran.stdout and "│ xstage " in ran.stdout
