"""Where xstage keeps its state: ``XSTAGE_HOME`` or the platform's user data dir.

Layout: ``envs/`` route environments, ``cache/`` probes and staged worker packages,
``records/`` every ``external`` record, ``logs/`` worker logs.

A home is yours or it is not used (docs/security.md): xstage runs code from it (the staged
worker package, route environments) and reads records and logs back, so the home and each
folder in it must be owned by the current user and writable by no one else, as ssh asks of
``~/.ssh`` and git of a repository (``safe.directory``). xstage creates them ``0700`` whatever
the umask; one that exists and is another user's, or group- or world-writable, is a
``UsageError`` naming the path, its owner, its mode and the fix. Files written under the home
are ``0600``.

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
from typing import IO

import platformdirs

from xstage.errors import UsageError, naming_full_disk

__all__ = [
    "LOG_KEEP_DEFAULT", "atomic_write", "cache_dir", "check_output", "check_owned", "envs_dir",
    "file_mode", "hold_log", "home", "home_path", "locked", "locks_dir", "log_keep", "logs_dir", "owned_dir",
    "prune_logs", "records_dir", "try_lock", "write_output",
]

#: File systems that keep no POSIX owner or mode (every file shows one owner and ``0777``):
#: Windows drives under WSL (``drvfs``, ``9p``), FAT, NTFS through FUSE, SMB.
_NO_POSIX_MODES = ("drvfs", "9p", "vfat", "msdos", "exfat", "ntfs", "ntfs3", "fuseblk", "cifs",
                   "smb3")


def home_path() -> Path:
    """Where the state root is (``XSTAGE_HOME`` or the user data dir); nothing is created."""
    env = os.environ.get("XSTAGE_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir("xstage"))


def home() -> Path:
    """The state root: created ``0700`` on first use, else checked to be yours.

    Raises:
        UsageError: it is another user's, or group- or world-writable (``check_owned``).
    """
    return owned_dir(home_path(), parents=True)


def owned_dir(path: Path, *, parents: bool = False) -> Path:
    """``path`` as a folder of the current user's: made ``0700`` if missing, else checked.

    ``parents``: missing folders above it are made too (with the umask's mode: they are not
    xstage's). Two processes making it at once both end with the checked folder.

    Raises:
        UsageError: it exists and is not the current user's, or others may write it.
    """
    try:
        os.mkdir(path, 0o700)
    except FileNotFoundError:
        if not parents:
            raise
        path.parent.mkdir(parents=True, exist_ok=True)
        return owned_dir(path)
    except FileExistsError:
        check_owned(path)
        return path
    if os.name == "posix":
        os.chmod(path, 0o700)  # whatever the umask took away or left
    return path


def check_owned(path: Path) -> None:
    """``path`` must be owned by the current user with no group or other write bit.

    On POSIX only (Windows homes are the user profile's, guarded by its ACL).

    Raises:
        UsageError: another owner, or a group or other write bit; the message names the path,
            the owner, the mode and the fix (a mount without POSIX modes is said so).
    """
    if os.name != "posix":
        return
    st = os.stat(path)
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{path} is in the place of an xstage folder but is not a folder",
                         remedy="remove it, or point XSTAGE_HOME at a folder of your own")
    if st.st_uid == me and not st.st_mode & 0o022:
        return
    owner = _user_name(st.st_uid)
    mode = stat.S_IMODE(st.st_mode)
    what = (f"{path} is owned by {owner} (uid {st.st_uid}) with mode {mode:04o}; xstage runs "
            "code and reads records from its home, so each of its folders must be yours "
            f"({_user_name(me)}, uid {me}) and writable by no one else")
    fstype = _fs_type(path)
    if fstype in _NO_POSIX_MODES:
        raise UsageError(
            f"{what}. It is on a {fstype} mount, which keeps no POSIX owners or modes (a "
            "Windows drive under WSL, a FAT or SMB volume)",
            remedy="put XSTAGE_HOME on a Linux file system (unset it for the default under "
            "your home folder), or remount the drive with POSIX metadata "
            "(WSL: -o metadata, then chmod 700 the folder)")
    if st.st_uid == me:
        fix = f"chmod go-w {path} (or chmod 700 {path})"
    else:
        fix = (f"point XSTAGE_HOME at a folder of your own (unset it for "
               f"{Path(platformdirs.user_data_dir('xstage'))}), or, if {path} is really "
               f"yours, chown {_user_name(me)} {path} && chmod 700 {path}")
    raise UsageError(what, remedy=fix)


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def _fs_type(path: Path) -> str | None:
    """The file system type of the mount ``path`` is on (Linux ``/proc/self/mounts``)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as handle:
            mounts = [line.split() for line in handle]
    except OSError:
        return None
    target = os.path.realpath(path)
    best: tuple[int, str | None] = (-1, None)
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best[0]:
            best = (len(point), fields[2])
    return best[1]


def file_mode(path: str | os.PathLike[str]) -> int:
    """The mode a file xstage writes gets: ``0600`` under the home, ``0644`` elsewhere."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(home_path()))
    except ValueError:
        return 0o644
    return 0o600


def _sub(name: str) -> Path:
    return owned_dir(home() / name)


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


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None,
                 make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file and one atomic rename.

    ``mode``: the file's mode; by default ``file_mode(path)`` (private under the home).

    Side effects: creates the parent folder (unless ``make_parents`` is False: an output the
    user named, ``write_output``); the temporary file (``.<name>.*.tmp`` beside the target) is
    removed on any failure. Two processes writing the same path at once each rename a complete
    file; the last rename wins.

    Raises:
        NoSpace: its file system is full (an ``OSError`` too).
        OSError: the folder cannot be made or written.
    """
    target = Path(path)
    with naming_full_disk(target):
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, file_mode(target) if mode is None else mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target


#: Paths that name one of this process's open files (``/dev/stdout`` links to the first): the
#: kernel resolves them, and they are always written in place, never replaced.
_FD_PREFIXES = ("/dev/fd/", "/proc/self/fd/", "/dev/stdout", "/dev/stderr")


def _named(flag: str, path: object) -> str:
    """The flag and its path as the user typed them: ``--json PATH``, ``--per-op csv=PATH``."""
    return f"{flag}{path}" if flag.endswith("=") else f"{flag} {path}"


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
                f"{_named(flag, target)} is a symbolic link owned by another user (uid {info.st_uid}): "
                "xstage does not write through it", remedy="choose a path you own")
        link = Path(os.readlink(target))
        target = link if link.is_absolute() else target.parent / link
    raise UsageError(f"{_named(flag, target)}: too many levels of symbolic links",
                     remedy="choose another path")


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
        suffix = Path(path).suffix or (".csv" if flag.endswith("csv=") else ".file")
        example = "record.json" if flag == "--json" else "out" + suffix
        raise UsageError(f"{_named(flag, path)} is a folder, not a file",
                         remedy=f"name a file in it, e.g. {_named(flag, Path(path) / example)}")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{_named(flag, path)}: the folder {folder} does not exist",
                         remedy=f"create it first (mkdir -p {folder}) or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{_named(flag, path)}: the folder {folder} is not writable",
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


def try_lock(path: str | os.PathLike[str], *, shared: bool = False) -> IO[bytes] | None:
    """Take a lock on ``path`` (a lock file, created if missing) without waiting: exclusive, or
    ``shared`` with other shared holders.

    Returns the open file that holds it (closing it lets go; so does the process ending), or
    None while another open file holds it in a mode that excludes this one, in this process or
    another. On Windows a shared lock is not taken (the file is returned open, holding nothing):
    msvcrt has exclusive locks only.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle = open(target, "a+b")  # noqa: SIM115 - returned: it holds the lock
    try:
        if sys.platform == "win32":
            import msvcrt

            if not shared:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


#: ``XSTAGE_LOG_KEEP``'s default: the newest 100 worker logs, none older than 30 days.
LOG_KEEP_DEFAULT = "100,30d"
#: A log touched this recently may belong to a live worker: never pruned.
_LOG_GRACE_SECONDS = 60.0


def hold_log(fd: int) -> None:
    """Mark the log open on ``fd`` as a live worker's: a shared ``flock`` on its open file.

    The lock belongs to the open file description, which the worker inherits as its fd 1 and
    2: it holds while the worker (or anything it started) keeps the log open, whatever this
    process does, and ``prune_logs`` never takes a log so held. On Windows nothing is marked
    and the one-minute grace alone applies.
    """
    if sys.platform != "win32":
        import fcntl

        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)


def _unlink_unless_held(path: Path) -> bool:
    """Delete a log no live worker holds (``hold_log``); False when one does or it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if sys.platform != "win32":
            import fcntl

            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a live worker's (or another pruner's, deleting it now)
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


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

    Called at each worker's start. A live worker's log is never deleted, however old: the
    client holds a shared ``flock`` on it that the worker inherits (``hold_log``), and a log
    that cannot be locked exclusively is skipped. Logs modified in the last minute are kept
    too whatever the limits; a file another process deleted first is skipped.

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
        if over and age > _LOG_GRACE_SECONDS and _unlink_unless_held(path):
            gone.append(path)
    return gone
