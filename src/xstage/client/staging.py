"""The worker package as a foreign interpreter sees it: a staged copy, alone on its path.

A foreign interpreter (a Python 3.9 venv, a venv pinned to torch 2.4.1) must not see the
client's site-packages, so ``xstage_remote`` is copied once per content hash into
``cache/remote/<hash>/`` and that folder alone is put on the worker's ``sys.path``. The
same hash travels in ``hello`` (``xstage_remote.package_hash``), so both ends know they run
the same protocol code.

The staged copy is never trusted by its name: before each use every file in it is checked
against this client's own package (the same relative paths, each file's sha256; bytecode
caches only as ``.pyc`` files of the current user's that no one else may write), so a folder
planted or changed under ``cache/remote/`` is replaced, never run (docs/security.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import xstage_remote
from xstage.errors import naming_full_disk
from xstage.home import cache_dir, locked, owned_dir

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


_PACKAGE = "xstage_remote"
_MANIFEST: dict[str, str] | None = None


def _digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _files(top: Path) -> dict[str, Path]:
    """Every file under ``top`` by its ``/``-separated relative path (links included)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            found[full.relative_to(top).as_posix()] = full
    return found


def _manifest() -> dict[str, str]:
    """This client's worker package: relative path -> sha256, bytecode caches left out."""
    global _MANIFEST
    if _MANIFEST is None:
        src = Path(xstage_remote.__file__).parent
        _MANIFEST = {rel: _digest(path) for rel, path in _files(src).items()
                     if "__pycache__" not in rel.split("/")}
    return _MANIFEST


def _cache_file_ok(rel: str, path: Path) -> bool:
    """A bytecode cache file a worker's interpreter may have written.

    A ``.pyc`` (or one being written: ``.pyc.<n>``, importlib's temporary name), a regular
    file of the current user's that no one else may write.
    """
    name = rel.rsplit("/", 1)[-1]
    head, _, tail = name.rpartition(".pyc")
    if not head or (tail and not (tail[0] == "." and tail[1:].isdigit())):
        return False
    if os.name != "posix":
        return True
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def verify_staged(root: Path) -> bool:
    """Whether ``root`` holds exactly this client's worker package, file for file.

    Only ``xstage_remote/`` at its top; in it the package's files and no other (sha256 each),
    regular files, not links; ``__pycache__`` folders hold only the current user's ``.pyc``
    files, writable by no one else.
    """
    try:
        if sorted(os.listdir(root)) != [_PACKAGE]:
            return False
        want = _manifest()
        seen = set()
        for rel, path in _files(root / _PACKAGE).items():
            if "__pycache__" in rel.split("/"):
                if not _cache_file_ok(rel, path):
                    return False
                continue
            if rel not in want or path.is_symlink() or _digest(path) != want[rel]:
                return False
            seen.add(rel)
        return seen == set(want)
    except OSError:
        return False


def staged_root() -> Path:
    """A folder holding only ``xstage_remote/``, made atomically once per hash.

    Checked file by file before each use (``verify_staged``); a copy that does not match
    is replaced under the lock.
    """
    digest = local_hash()
    remote = owned_dir(cache_dir() / "remote")
    root = remote / digest[:16]
    if verify_staged(root):
        return root
    with locked(root.parent / f".{root.name}.lock"):  # one process copies, the rest wait
        if verify_staged(root):
            return root
        tmp = Path(tempfile.mkdtemp(prefix=".stage-", dir=root.parent))
        src = Path(xstage_remote.__file__).parent
        try:
            with naming_full_disk(root.parent, what="copy the worker package into"):
                shutil.copytree(src, tmp / "xstage_remote",
                                ignore=shutil.ignore_patterns("__pycache__"))
            if root.exists() or root.is_symlink():  # half-made, or not this package: gone
                if root.is_symlink() or not root.is_dir():
                    root.unlink()
                else:
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
