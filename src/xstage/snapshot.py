"""One private copy of an artifact's files, hashed while copied: the bytes every reader opens.

An artifact's files are copied once into a staging folder under
``XSTAGE_HOME/cache/artifacts/``, each hashed as it is written (a reflink where the filesystem
has them: ``FICLONE`` on Linux, then the clone is hashed), and the folder is renamed to
``<sha256>/``. Every reader of the artifact (the inspection, the reference arm, the worker, the
float64 tie-break, bisect's probes, the exporters) opens that copy and nothing else, so a file
swapped or rewritten beside the user's graph after the hash is never what runs. The copy keeps
the graph's file names (and a sidecar's folder beside the graph), so external-data references
resolve inside it.

Rules:

1. Files are mode 0400 in 0700 folders, owned by the user: a copy, never a hard link to the
   user's file (an in-place write would change a hard link's bytes too).
2. The source is opened once, without following a final symlink (the caller resolved the real
   path; a link swapped in after that is an ``ArtifactError``), and must keep its size, inode
   and modification time while it is copied; a change while copying is an ``ArtifactError``.
3. Processes sharing one ``XSTAGE_HOME`` meet under one lock (``locks/artifacts.lock``):
   a new folder is renamed into place, or, when another process made the same ``<sha256>/``
   first, each freshly hashed file replaces its namesake there (one atomic rename each), so what
   this process runs is what it hashed.
4. The cache holds at most ``XSTAGE_ARTIFACT_CACHE_BYTES`` (:data:`CACHE_BYTES_DEFAULT`); past
   it, the least recently used snapshots go first (use: a folder's modification time, touched at
   each use). A snapshot in use is never evicted: this process's pins (:func:`release` drops
   one), and on POSIX any process's, through a shared ``flock`` each pinned folder holds (one
   descriptor per folder in use, closed by its last release or the process's end).
5. A staging folder is ``.tmp-*`` and held under an exclusive ``flock`` while it is built; one
   whose builder died (its lock free) is removed by the next eviction.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ParamSpec, TypeVar

from xstage import errors
from xstage.home import cache_dir, locked, locks_dir

__all__ = [
    "CACHE_BYTES_DEFAULT", "CACHE_BYTES_ENV", "CachedSnapshot", "Snapshot", "SnapshotFile", "Staging",
    "artifacts_dir", "cache_bytes", "clear", "list_snapshots", "pinned", "release", "releasing",
]

#: The variable that caps the snapshot cache, in bytes (``20GiB``, ``512MiB``, a byte count).
CACHE_BYTES_ENV = "XSTAGE_ARTIFACT_CACHE_BYTES"
#: Its default: 20 GiB (a few large towers; a snapshot bigger than the cap is still kept while
#: it is in use).
CACHE_BYTES_DEFAULT = 20 << 30

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_BLOCK = 1 << 20
_SHA = re.compile(r"^[0-9a-f]{64}$")
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1 << 10, "M": 1000**2, "MB": 1000**2,
          "MIB": 1 << 20, "G": 1000**3, "GB": 1000**3, "GIB": 1 << 30, "T": 1000**4,
          "TB": 1000**4, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot: its name inside it, where it was copied from, its hash and size."""

    name: str
    source: Path
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Snapshot:
    """A committed snapshot: ``folder`` is ``cache/artifacts/<sha256>/``, ``graph`` the file
    readers open (its name is the source graph's)."""

    sha256: str
    folder: Path
    graph: Path
    files: tuple[SnapshotFile, ...]

    @property
    def bytes(self) -> int:
        """The files' total size."""
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class CachedSnapshot:
    """One snapshot as ``xstage cache list`` shows it."""

    sha256: str
    folder: Path
    files: tuple[str, ...]
    bytes: int
    last_used: float
    in_use: bool

    def to_dict(self) -> dict[str, Any]:
        """The JSON view (``last_used``: seconds since the epoch)."""
        return {"sha256": self.sha256, "folder": str(self.folder), "files": list(self.files),
                "bytes": self.bytes, "last_used": self.last_used, "in_use": self.in_use}


def artifacts_dir() -> Path:
    """``XSTAGE_HOME/cache/artifacts``, created 0700, as an absolute real path: a worker started
    in another folder (or a Windows worker, through ``xstage.host.wsl.to_windows_path``) is
    handed the snapshot's path as it is, whatever ``XSTAGE_HOME`` was written as."""
    root = (cache_dir() / "artifacts").resolve()
    root.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(root, 0o700)
    return root


def cache_bytes(text: str | None = None) -> int:
    """``XSTAGE_ARTIFACT_CACHE_BYTES`` (or ``text``) in bytes; unset is the default.

    Raises:
        UsageError: a value that is not a size (``20GiB``, ``512MB``, ``1.5G``, a byte count).
    """
    raw = os.environ.get(CACHE_BYTES_ENV) if text is None else text
    if raw is None or not raw.strip():
        return CACHE_BYTES_DEFAULT
    m = _SIZE.match(raw)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise errors.UsageError(f"{CACHE_BYTES_ENV}={raw!r} is not a size",
                                remedy="write it like 20GiB, 512MiB or a byte count (0 keeps only "
                                       "the snapshots in use)")
    return int(float(m.group(1)) * _UNITS[unit])


# --------------------------------------------------------------------------- pins


_PINS_LOCK = threading.Lock()
#: snapshot folder -> [count, fd of the folder holding a shared flock (-1 without flock)]; by
#: folder, not by hash: a process may use two homes (one fd per folder in use, closed at release)
_PINS: dict[Path, list[int]] = {}


def _flock(fd: int, exclusive: bool, wait: bool) -> bool:
    """``flock`` on POSIX (True when taken); True on Windows, where pins are this process's only."""
    if sys.platform == "win32":
        return True
    import fcntl

    how = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        return False
    return True


def _open_dir(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if sys.platform != "win32" else -1


_SCOPE = threading.local()  # .taken: the pins this thread took inside a ``releasing`` call


def releasing(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate a one-shot reader (an exporter, bisect): the pins its thread takes during the
    call and has not released by its end are released then (a stage it opened and closed has
    released its own)."""
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        outer = getattr(_SCOPE, "taken", None)
        _SCOPE.taken = []
        try:
            return func(*args, **kwargs)
        finally:
            taken, _SCOPE.taken = _SCOPE.taken, outer
            for folder in taken:
                release(folder)

    return wrapper


def _pin(folder: Path) -> None:
    """One more use of the snapshot (called under the cache lock, the folder in place)."""
    taken = getattr(_SCOPE, "taken", None)
    if taken is not None:
        taken.append(folder)
    with _PINS_LOCK:
        entry = _PINS.get(folder)
        if entry is not None:
            entry[0] += 1
            return
        fd = _open_dir(folder)
        if fd >= 0:
            _flock(fd, exclusive=False, wait=True)
        _PINS[folder] = [1, fd]


def release(folder: Path) -> None:
    """One use of the snapshot in ``folder`` ended (:attr:`Snapshot.folder`); after the last,
    eviction may take it. A folder this process does not pin: nothing."""
    taken = getattr(_SCOPE, "taken", None)
    if taken is not None and folder in taken:
        taken.remove(folder)
    with _PINS_LOCK:
        entry = _PINS.get(folder)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            del _PINS[folder]
            if entry[1] >= 0:
                os.close(entry[1])  # the shared flock goes with it


def pinned() -> dict[Path, int]:
    """This process's pins: snapshot folder -> uses."""
    with _PINS_LOCK:
        return {folder: entry[0] for folder, entry in _PINS.items()}


def _busy(folder: Path) -> bool:
    """A pin holds the folder, in this process or (POSIX) another."""
    if folder in pinned():
        return True
    if sys.platform == "win32":
        return False
    try:
        fd = _open_dir(folder)
    except OSError:
        return False
    try:
        return not _flock(fd, exclusive=True, wait=False)
    finally:
        os.close(fd)  # an exclusive lock taken to test is released with it


# --------------------------------------------------------------------------- copying


def _reflink(src_fd: int, dst_fd: int) -> bool:
    """Clone ``src`` into ``dst`` (copy on write) where the filesystem can; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import fcntl

    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
    except OSError:  # EOPNOTSUPP (ext4, tmpfs), EXDEV (another filesystem), EINVAL
        return False
    return True


def _hash_fd(fd: int) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, _BLOCK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def _copy_hashed(source: Path, target: Path) -> tuple[str, int]:
    """Copy ``source`` to a new ``target``, hashing the bytes ``target`` holds.

    Raises:
        ArtifactError: the source cannot be opened (or became a symlink), is not a regular
            file, or changed while it was copied.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        src = os.open(source, flags)
    except OSError as exc:
        raise errors.ArtifactError(
            f"cannot read {source}: {exc.strerror or exc}"
            + (" (it became a symlink after its real path was resolved)"
               if exc.errno == errno.ELOOP else ""),
            remedy="check the file; leave the artifact's files alone while xstage reads them") from exc
    try:
        before = os.fstat(src)
        if not stat.S_ISREG(before.st_mode):
            raise errors.ArtifactError(f"{source} is not a regular file",
                                       remedy="pass the graph file itself")
        dst = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        try:
            if _reflink(src, dst):
                digest, size = _hash_fd(dst)  # the clone's bytes are fixed: hash what it holds
            else:
                h, size = hashlib.sha256(), 0
                while chunk := os.read(src, _BLOCK):
                    h.update(chunk)
                    size += len(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(dst, view):]
                digest = h.hexdigest()
        finally:
            os.close(dst)
        after = os.fstat(src)
    finally:
        os.close(src)
    if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns,
                                                               after.st_ino) or size != after.st_size:
        raise errors.ArtifactError(f"{source} changed while it was being copied",
                                   remedy="run again once nothing writes the artifact")
    os.chmod(target, 0o400)
    return digest, size


def _check_name(name: str) -> PurePosixPath:
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or pure.name in ("", "."):
        raise errors.ArtifactError(f"{name!r} is not a file name inside the artifact's folder",
                                   remedy="keep external data beside the graph")
    return pure


class Staging:
    """A snapshot being built: ``add`` each file, then ``commit`` it under its hash.

    Use it as a context manager: leaving the block without a commit removes the staging folder.
    """

    def __init__(self) -> None:
        root = artifacts_dir()
        self.folder = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        self._fd = _open_dir(self.folder)
        if self._fd >= 0:
            _flock(self._fd, exclusive=True, wait=True)  # live: eviction leaves it alone
        self.files: list[SnapshotFile] = []
        self._graph: str | None = None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def path(self, name: str) -> Path:
        """Where the file ``name`` sits in the staging folder (before the commit)."""
        return self.folder / _check_name(name)

    def add(self, source: Path, name: str) -> SnapshotFile:
        """Copy ``source`` in as ``name`` (a relative POSIX name; the first added is the graph).

        Raises:
            ArtifactError: see :func:`_copy_hashed`; a name that leaves the folder.
            NoSpace: the cache's file system is full.
        """
        pure = _check_name(name)
        target = self.folder / pure
        for parent in reversed(target.relative_to(self.folder).parents[:-1]):
            (self.folder / parent).mkdir(mode=0o700, exist_ok=True)
        with errors.naming_full_disk(self.folder.parent,
                                     what=f"copy {source} into the artifact cache"):
            digest, size = _copy_hashed(source, target)
        entry = SnapshotFile(pure.as_posix(), source, digest, size)
        self.files.append(entry)
        if self._graph is None:
            self._graph = entry.name
        return entry

    def commit(self, sha256: str) -> Snapshot:
        """Put the files under ``cache/artifacts/<sha256>/``, pinned for this process.

        Side effects: takes the cache lock; may evict least recently used snapshots past the
        cap (never one in use); removes the staging folder.

        Raises:
            ValueError: ``sha256`` is not 64 lowercase hex digits, or nothing was added.
            UsageError: a malformed ``XSTAGE_ARTIFACT_CACHE_BYTES``.
        """
        if not _SHA.match(sha256) or self._graph is None:
            raise ValueError(f"cannot commit {sha256!r} with {len(self.files)} files")
        root = self.folder.parent
        final = root / sha256
        cap = cache_bytes()  # a malformed variable fails before anything moves
        with locked(locks_dir() / "artifacts.lock"):
            self._unlock()  # eviction waits for the cache lock; the folder's lock would stop the pin
            if not final.is_dir():
                os.rename(self.folder, final)
            else:  # made by another process (or an earlier use): our hashed copies replace theirs
                for entry in self.files:
                    here = final / entry.name
                    here.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    try:
                        os.replace(self.folder / entry.name, here)
                    except PermissionError:  # Windows: a reader holds it open; it is the same hash
                        if not here.is_file() or here.stat().st_size != entry.bytes:
                            raise
            os.utime(final)
            _pin(final)
            _evict(root, cap, keep=sha256)
        self.discard()
        return Snapshot(sha256, final, final / self._graph, tuple(self.files))

    def _unlock(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Remove the staging folder (after a commit, what the commit left of it)."""
        self._unlock()
        if self.folder.exists():
            _remove(self.folder)


# --------------------------------------------------------------------------- the cache


def _remove(folder: Path) -> None:
    """Remove a folder of read-only files (Windows refuses to unlink those until chmod)."""
    def again(func: Any, path: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
            func(path)

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=again)
    else:
        shutil.rmtree(folder, onerror=again)


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _entries(root: Path) -> list[tuple[float, Path]]:
    out = []
    for folder in root.iterdir():
        if _SHA.match(folder.name):
            with contextlib.suppress(OSError):
                out.append((folder.stat().st_mtime, folder))
    return out


def _evict(root: Path, cap: int, keep: str | None) -> list[str]:
    """Remove least recently used snapshots until the cache fits ``cap`` (under the lock).

    Skips ``keep`` and every snapshot in use; removes staging folders whose builder is gone.
    """
    for stale in root.glob(".tmp-*"):
        if stale.is_dir() and not _busy(stale):
            _remove(stale)
    entries = sorted(_entries(root))
    sizes = {folder: _size(folder) for _, folder in entries}
    total = sum(sizes.values())
    gone = []
    for _, folder in entries:
        if total <= cap:
            break
        if folder.name == keep or _busy(folder):
            continue
        _drop(root, folder)
        total -= sizes[folder]
        gone.append(folder.name)
    return gone


def _drop(root: Path, folder: Path) -> None:
    """Out of the cache at once (a rename), then removed."""
    trash = root / f".tmp-gone-{folder.name[:12]}-{os.getpid()}-{time.monotonic_ns()}"
    os.rename(folder, trash)
    _remove(trash)


def list_snapshots() -> list[CachedSnapshot]:
    """Every snapshot in the cache, least recently used first."""
    root = artifacts_dir()
    out = []
    for mtime, folder in sorted(_entries(root)):
        files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                             if p.is_file() and not p.name.startswith(".")))
        out.append(CachedSnapshot(folder.name, folder, files, _size(folder), mtime, _busy(folder)))
    return out


def clear() -> tuple[list[str], list[str]]:
    """Remove every snapshot not in use; (removed, kept because in use), by sha256."""
    root = artifacts_dir()
    removed, kept = [], []
    with locked(locks_dir() / "artifacts.lock"):
        for _, folder in sorted(_entries(root)):
            if _busy(folder):
                kept.append(folder.name)
            else:
                _drop(root, folder)
                removed.append(folder.name)
    return removed, kept
