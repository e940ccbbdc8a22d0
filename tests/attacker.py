"""Another user as the attacker: shell commands run as uid 65534 (``nobody``).

Where the suite runs as root, ``as_nobody`` runs ``sh -c SCRIPT`` with uid and gid 65534 and no
supplementary groups (``os.setuid`` in the child, before exec). Elsewhere the tests that need
it skip, saying why (``needs_root``). ``shared_folder`` is a ``1777`` folder under ``/tmp`` that
both users reach (pytest's own temporary folders are root's alone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534

needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0,
    reason="runs an attacker as uid 65534 (nobody), which needs the suite to run as root")


def _drop() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(script: str, *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` as uid 65534; fails the test if it fails."""
    done = subprocess.run(["/bin/sh", "-c", script], preexec_fn=_drop, cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A sticky world-writable folder under /tmp, as /tmp itself (removed after)."""
    path = Path(tempfile.mkdtemp(prefix="xstage-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
