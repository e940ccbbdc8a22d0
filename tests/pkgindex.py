"""Whether pip can reach its package index in this run: asked once, and a skip that says why not.

Tests marked ``network`` reach the index (pip installs into a test venv, pip downloads of pinned
wheels). Offline they would fail on pip's error, or hang on its retries; instead they skip with
the cause. Three causes, cheapest first:

* Case 1: ``XSTAGE_OFFLINE=1`` — the user says so.
* Case 2: ``PIP_NO_INDEX`` is set — pip itself is told not to use an index.
* Case 3: pip, with its own configuration (index, mirrors, proxy), cannot list the versions of
  ``pip`` within :data:`CHECK_S` seconds.

What the test cache already holds needs no index: the fixtures that fill the cache ask
:func:`require` only on a miss, so a built venv or a fetched wheel is used offline too.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

__all__ = ["CHECK_S", "require", "unreachable"]

#: The longest the index check may take (pip's start-up included).
CHECK_S = 15.0  # pip alone took over 3 s to start on a loaded 2-core VM; asked once per run
_FALSE = ("", "0", "false", "no", "off")


@functools.cache
def unreachable() -> str | None:
    """Why pip cannot reach its package index now, or None if it can (asked once per session)."""
    if os.environ.get("XSTAGE_OFFLINE") == "1":  # Case 1
        return "XSTAGE_OFFLINE=1 is set"
    if os.environ.get("PIP_NO_INDEX", "").strip().lower() not in _FALSE:  # Case 2
        return "PIP_NO_INDEX is set"
    cmd = [sys.executable, "-m", "pip", "index", "versions", "pip", "--retries", "0",
           "--timeout", str(int(CHECK_S)), "--disable-pip-version-check", "--no-cache-dir"]
    try:  # Case 3
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"pip did not reach its package index within {CHECK_S:g} s (pip index versions pip)"
    except OSError as exc:
        return f"cannot run pip ({sys.executable} -m pip): {exc.strerror or exc}"
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return f"pip could not reach its package index (pip index versions pip: {tail})"
    return None


def require(what: str) -> None:
    """Skip the running test, naming ``what`` needed the index and why it cannot be reached."""
    reason = unreachable()
    if reason is not None:
        pytest.skip(f"{what} needs the package index, which this run cannot reach: {reason}")
