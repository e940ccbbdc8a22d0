"""The worker package as a foreign interpreter sees it: a staged copy, alone on its path.

A foreign interpreter (a Python 3.9 venv, a venv pinned to torch 2.4.1) must not see the
client's site-packages, so ``xstage_remote`` is copied once per content hash into
``cache/remote/<hash>/`` and that folder alone is put on the worker's ``sys.path``. The
same hash travels in ``hello`` (``xstage_remote.package_hash``), so both ends know they run
the same protocol code.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import xstage_remote
from xstage.home import cache_dir, locked

__all__ = ["BOOTSTRAP", "local_hash", "staged_root", "worker_argv"]

#: Run with ``-E -s``: no PYTHON* variables, no user site. The staged folder goes first on
#: ``sys.path``; the interpreter's own site-packages (its runtime) stays visible.
BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from xstage_remote.__main__ import main; main(sys.argv[2:])"
)


def local_hash() -> str:
    """The hash of the worker package this client would send."""
    return xstage_remote.package_hash()


def staged_root() -> Path:
    """A folder holding only ``xstage_remote/``, made atomically once per hash."""
    digest = local_hash()
    root = cache_dir() / "remote" / digest[:16]
    if (root / "xstage_remote" / "__init__.py").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with locked(root.parent / f".{root.name}.lock"):  # one process copies, the rest wait
        if (root / "xstage_remote" / "__init__.py").is_file():
            return root
        tmp = Path(tempfile.mkdtemp(prefix=".stage-", dir=root.parent))
        src = Path(xstage_remote.__file__).parent
        try:
            shutil.copytree(src, tmp / "xstage_remote", ignore=shutil.ignore_patterns("__pycache__"))
            if root.exists():  # a copy left half-made by a process killed before the lock existed
                shutil.rmtree(root, ignore_errors=True)
            os.replace(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def worker_argv(
    interpreter: str, *args: str, path_map: Callable[[str], str] | None = None
) -> list[str]:
    """The argv that starts ``xstage_remote`` under ``interpreter`` with ``args``.

    ``path_map`` turns the staged folder into the interpreter's view of it (a Windows path
    for a Windows Python started from WSL).
    """
    root = str(staged_root())
    return [interpreter, "-E", "-s", "-c", BOOTSTRAP, path_map(root) if path_map else root, *args]
