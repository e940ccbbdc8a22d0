"""``scripts/longest_functions.py``: the longest functions first, qualified, with a --max check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "longest_functions.py"

CODE = '''\
def short():
    return 1


class Box:
    @property
    def long(self):
        a = 1
        b = 2
        return a + b

    def inner_host(self):
        def helper():
            return 0
        return helper
'''


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_longest_first_with_path_line_and_qualified_name(tmp_path: Path):
    (tmp_path / "m.py").write_text(CODE)
    done = _run("3", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [(r[0], r[1].rsplit("/", 1)[-1], r[2]) for r in rows] == [
        ("5", "m.py:6", "Box.long"),  # the decorator counts
        ("4", "m.py:12", "Box.inner_host"),
        ("2", "m.py:1", "short"),
    ]


def test_max_fails_when_one_is_longer(tmp_path: Path):
    (tmp_path / "m.py").write_text(CODE)
    assert _run("--root", str(tmp_path), "--max", "5").returncode == 0
    over = _run("--root", str(tmp_path), "--max", "4")
    assert over.returncode == 1 and "1 function(s) over 4 lines" in over.stderr


def test_it_runs_on_src_by_default():
    done = _run()
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 10 and "src/xstage/" in done.stdout


def test_the_source_keeps_its_function_limits():
    """No function in src/ over 100 lines; open_stage's code at most 60 lines, its docstring
    aside (the docstring documents every argument: the public API's rule)."""
    src = SCRIPT.parents[1] / "src"
    done = _run("5", "--root", str(src), "--max", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    listing = _run("100000", "--root", str(src)).stdout.splitlines()
    open_stage = [line for line in listing if line.endswith(" open_stage")]
    assert open_stage and int(open_stage[0].split()[0]) <= 60, open_stage
