"""Where xstage keeps its state: ``XSTAGE_HOME`` or the platform's user data dir.

Layout (DESIGN §7): ``envs/`` route environments, ``cache/`` probes and staged worker
packages, ``records/`` every ``external`` record, ``logs/`` worker logs.

Several processes may share one home, all on their first use at once. Every file written
under it goes through a unique temporary name beside its target and one atomic rename
(``atomic_write``), so a reader sees the old file, the new file or none, never a partial one;
where two writers would build the same thing, they take ``locked`` first, so one builds and
the others find it built. The lock is ``fcntl.flock`` on POSIX and ``msvcrt.locking`` on
Windows, on a ``.lock`` file beside the thing it guards; both are released by the OS when the
holder dies, so a killed process never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import platformdirs

__all__ = [
    "LOG_KEEP_DEFAULT", "atomic_write", "cache_dir", "envs_dir", "home", "locked", "locks_dir",
    "log_keep", "logs_dir", "prune_logs", "records_dir",
]


def home() -> Path:
    """The state root; created on first use."""
    env = os.environ.get("XSTAGE_HOME")
    root = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("xstage"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sub(name: str) -> Path:
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def envs_dir() -> Path:
    """Route environments made by ``xstage env create``."""
    return _sub("envs")


def cache_dir() -> Path:
    """Probe results and staged copies of the worker package."""
    return _sub("cache")


def records_dir() -> Path:
    """Every record ``xstage external`` writes."""
    return _sub("records")


def locks_dir() -> Path:
    """Lock files where two processes meet over one thing (empty; they stay, see ``locked``)."""
    return _sub("locks")


def logs_dir() -> Path:
    """One log file per worker: its fd 1 and fd 2."""
    return _sub("logs")


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file and one atomic rename.

    Side effects: creates the parent folder; the temporary file (``.<name>.*.tmp`` beside the
    target) is removed on any failure. Two processes writing the same path at once each
    rename a complete file; the last rename wins.

    Raises:
        OSError: the folder cannot be made or written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a lock file, created if missing) for the block.

    Blocks until the lock is free. The lock file stays (removing it would race a waiter that
    has it open); it is empty and harmless.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle = open(target, "a+b")  # noqa: SIM115 - held open for the lock's lifetime
    try:
        if sys.platform == "win32":
            import msvcrt

            handle.seek(0)  # the lock is on byte 0, whatever the file holds
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                    break
                except OSError:
                    time.sleep(0.05)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()


#: ``XSTAGE_LOG_KEEP``'s default: the newest 100 worker logs, none older than 30 days.
LOG_KEEP_DEFAULT = "100,30d"
#: A log touched this recently may belong to a live worker: never pruned.
_LOG_GRACE_SECONDS = 60.0


def log_keep(text: str | None = None) -> tuple[int | None, float | None]:
    """``XSTAGE_LOG_KEEP`` (or ``text``) as (count, days); None is "no limit".

    The format: ``N`` (keep the newest N logs), ``Nd`` (keep logs younger than N days), both
    separated by a comma (``100,30d``, the default: a log goes when either limit is passed),
    or ``all`` (never prune).

    Raises:
        ValueError: anything else (the message names the variable and the format).
    """
    raw = os.environ.get("XSTAGE_LOG_KEEP", LOG_KEEP_DEFAULT) if text is None else text
    value = raw.strip().lower()
    if value == "all":
        return None, None
    count: int | None = None
    days: float | None = None
    for part in (p.strip() for p in value.split(",")):
        try:
            if part.endswith("d") and days is None:
                days = float(part[:-1])
                if not days >= 0 or days == float("inf"):
                    raise ValueError
            elif part.isdigit() and count is None:
                count = int(part)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"XSTAGE_LOG_KEEP={raw!r} is not N, Nd, N,Nd or all "
                f"(e.g. {LOG_KEEP_DEFAULT}: the newest 100 logs, none older than 30 days)") from None
    return count, days


def prune_logs(folder: Path | None = None, *, now: float | None = None,
               keep: tuple[int | None, float | None] | None = None) -> list[Path]:
    """Delete worker logs past ``XSTAGE_LOG_KEEP``; return the paths deleted.

    Called at each worker's start. Logs modified in the last minute are kept whatever the
    limits (they may be a live worker's); a file another process deleted first is skipped.

    Raises:
        ValueError: a malformed ``XSTAGE_LOG_KEEP`` (see ``log_keep``).
    """
    count, days = log_keep() if keep is None else keep
    if count is None and days is None:
        return []
    base = folder if folder is not None else logs_dir()
    moment = time.time() if now is None else now
    logs: list[tuple[float, Path]] = []
    for path in base.glob("worker-*.log"):
        with contextlib.suppress(OSError):
            logs.append((path.stat().st_mtime, path))
    logs.sort(key=lambda item: item[0], reverse=True)
    gone = []
    for rank, (mtime, path) in enumerate(logs):
        age = moment - mtime
        over = (count is not None and rank >= count) or (days is not None and age > days * 86400)
        if over and age > _LOG_GRACE_SECONDS:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                gone.append(path)
    return gone
