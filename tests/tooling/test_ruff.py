"""Ruff over the whole tree, as a test: the README's test command and ``.ci/run`` run the linter
too, so lint (with the docstring rules on the public modules, see ``pyproject.toml``) cannot drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("src", "tests", "benchmarks", "scripts")


def test_ruff_check_is_clean() -> None:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", *CHECKED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"ruff check {' '.join(CHECKED)}:\n{done.stdout}{done.stderr}"
