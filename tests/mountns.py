"""A tiny tmpfs over a folder, in a private mount namespace: a full disk without filling one.

``in_tiny_tmpfs(target, size, argv)`` runs ``argv`` in a new mount namespace where ``target``
is a fresh tmpfs of ``size`` (e.g. ``"1m"``): ``unshare -rm`` (a user namespace, no root
needed where the kernel allows it), else ``unshare -m`` when the suite runs as root
(``as_root``: only that one, for a test that switches to another uid inside). Where neither
is permitted the test skips, saying why. Nothing outside the namespace sees the mount.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import pytest


def _unshare(as_root: bool) -> list[str]:
    """The ``unshare`` command line that works here, or skip saying why."""
    tool = shutil.which("unshare")
    if tool is None or os.name != "posix":
        pytest.skip("needs util-linux's unshare (a private mount namespace) on Linux")
    if as_root and os.geteuid() != 0:
        pytest.skip("runs an attacker as uid 65534 inside a private mount namespace, which "
                    "needs the suite to run as root (unshare -m)")
    tries = ([] if as_root else [[tool, "-rm"]]) + ([[tool, "-m"]] if os.geteuid() == 0 else [])
    for cmd in tries:
        ok = subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                            capture_output=True, timeout=30)
        if ok.returncode == 0:
            return cmd
    pytest.skip("a private mount namespace with a tmpfs is not permitted here (unshare -rm "
                "fails, and the suite does not run as root for unshare -m)")


def in_tiny_tmpfs(target: str, size: str, argv: Sequence[str], *,
                  env: Mapping[str, str] | None = None,
                  timeout: float = 300,
                  as_root: bool = False) -> subprocess.CompletedProcess[str]:
    """``argv`` with ``target`` a tmpfs of ``size`` in a private mount namespace (``as_root``:
    only ``unshare -m``, as real root, so the command can switch to another uid)."""
    script = (f"mount -t tmpfs -o size={shlex.quote(size)},mode=1777 tmpfs "
              f"{shlex.quote(target)} && exec {shlex.join(list(argv))}")
    return subprocess.run([*_unshare(as_root), "sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=dict(env) if env is not None else None)
