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
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import platformdirs

__all__ = [
    "LOG_KEEP_DEFAULT", "atomic_write", "cache_dir", "check_output", "envs_dir", "home", "locked",
    "locks_dir", "log_keep", "logs_dir", "prune_logs", "records_dir", "write_output",
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


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                 make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file and one atomic rename.

    Side effects: creates the parent folder (unless ``make_parents`` is False: an output the
    user named, ``write_output``); the temporary file (``.<name>.*.tmp`` beside the target) is
    removed on any failure. Two processes writing the same path at once each rename a complete
    file; the last rename wins.

    Raises:
        OSError: the folder cannot be made or written.
    """
    target = Path(path)
    if make_parents:
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


#: Paths that name one of this process's open files (``/dev/stdout`` links to the first): the
#: kernel resolves them, and they are always written in place, never replaced.
_FD_PREFIXES = ("/dev/fd/", "/proc/self/fd/", "/dev/stdout", "/dev/stderr")


def _followed(target: Path, flag: str) -> Path:
    """``target`` with its symlinks followed, each one owned by this user or root.

    A link owned by someone else is refused, whatever folder it sits in: in a sticky
    world-writable folder (``/tmp``) it is the attack ``fs.protected_symlinks`` stops, and
    elsewhere writing through it still writes where another user points. Following stops at a
    link into ``/proc/self/fd`` or ``/dev/fd`` (an open file of this process, not a path).

    Raises:
        UsageError: a link owned by another user, or a loop of links.
    """
    from xstage.errors import UsageError

    for _ in range(40):
        if str(target).startswith(_FD_PREFIXES):
            return target
        try:
            info = os.lstat(target)
        except (FileNotFoundError, NotADirectoryError):  # nothing there: check_output says why
            return target
        if not stat.S_ISLNK(info.st_mode):
            return target
        uid = os.getuid() if hasattr(os, "getuid") else None  # no owners to compare on Windows
        if uid is not None and info.st_uid not in (uid, 0):
            raise UsageError(
                f"{flag} {target} is a symbolic link owned by another user (uid {info.st_uid}): "
                "xstage does not write through it", remedy="choose a path you own")
        link = Path(os.readlink(target))
        target = link if link.is_absolute() else target.parent / link
    raise UsageError(f"{flag} {target}: too many levels of symbolic links", remedy="choose another path")


def _in_place(target: Path) -> bool:
    """Whether ``target`` is written where it is: an open file of this process, a character
    device or a FIFO (``/dev/null``, a pipe), never replaced by a new file."""
    if str(target).startswith(_FD_PREFIXES):
        return True
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_output(path: str | os.PathLike[str], *, flag: str = "--json") -> Path:
    """Where an output the user named will be written, checked before any work is done.

    Rules (each a usage error when broken): a symbolic link is followed only when this user or
    root owns it; an open file of this process (``/dev/stdout``), a character device or a FIFO
    is written in place; a folder is not a file; the file's folder must exist (it is never
    created) and be writable.

    Raises:
        UsageError: one of the rules above, naming the flag and the path.
    """
    from xstage.errors import UsageError

    target = _followed(Path(path), flag)
    if _in_place(target):
        return target
    if target.is_dir():
        example = "record.json" if flag == "--json" else "out" + (Path(path).suffix or ".file")
        raise UsageError(f"{flag} {path} is a folder, not a file",
                         remedy=f"name a file in it, e.g. {flag} {Path(path) / example}")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist",
                         remedy=f"create it first (mkdir -p {folder}) or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder {folder} is not writable",
                         remedy="choose a path in a folder you can write")
    return target


def write_output(path: str | os.PathLike[str], data: bytes, *, flag: str = "--json") -> Path:
    """Write an output the user named (``--json PATH``, ``--html``, …); returns where it went.

    ``check_output``'s rules, then: an open file of this process, a character device or a FIFO
    is written in place (never replaced by a file); anything else is written atomically
    (``atomic_write``) to the link's target, keeping an existing file's permissions. The folder
    is never created.

    Raises:
        UsageError: ``check_output``'s rules.
        OSError: the write itself failed.
    """
    target = check_output(path, flag=flag)
    if _in_place(target):
        # Appending: a redirected stream (``--json /dev/stderr 2>log``) keeps what it holds.
        with open(target, "ab") as handle:
            handle.write(data)
        return Path(path)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        mode = 0o644
    return atomic_write(target, data, mode=mode, make_parents=False)


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
