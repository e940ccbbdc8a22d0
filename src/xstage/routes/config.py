"""Where a route's interpreter may be configured: ``./xstage.toml`` and the user config file.

Both files share one shape::

    [routes.ort-openvino]
    python = "/path/to/venv/bin/python"   # relative paths are relative to this file

A value without a path separator (``python3.9``) is looked up on ``PATH``. The user config
file is ``platformdirs.user_config_dir("xstage")/config.toml``, or ``XSTAGE_CONFIG`` when set
(tests point it at a temporary file so a developer's own config never leaks in).

A project file names interpreters and libraries that xstage runs and loads, and a cloned
repository or an unpacked archive is owned by the user who fetched it, so ownership proves
nothing: ``./xstage.toml`` is used only once trusted (docs/routes.md, "Project files";
docs/security.md). ``xstage config trust [PATH]`` records its real path and the sha256 of its
bytes in the user config::

    [[trusted]]
    path = "/home/me/project/xstage.toml"
    sha256 = "9f2c..."

A file with no matching record (never trusted, or changed since) is named in one line on stderr
(the ``xstage.config`` logger) and ignored: nothing in it loads or runs. The file is read once
and parsed from the bytes that were hashed. A file named on the command line
(``--project-config PATH``, ``named_project_config``) is the user's explicit choice and is used
without a record. The user config itself must be the user's own, writable by no one else
(``xstage.home.check_owned``'s rule); another user's is ignored the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

try:  # Python 3.11+; tomli is the same parser, installed on 3.10 (pyproject.toml)
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from xstage.errors import UsageError

__all__ = [
    "PROJECT_CONFIG_NAME",
    "ConfigFile",
    "load",
    "named_project_config",
    "project_config",
    "project_config_path",
    "resolve_python_value",
    "trust",
    "user_config",
    "user_config_path",
]

_log = logging.getLogger("xstage.config")
#: (path, sha256) already named as ignored in this process: each is said once.
_SAID: set[tuple[str, str]] = set()
#: The project file named on the command line for this run (``named_project_config``).
_NAMED: list[Path] = []

PROJECT_CONFIG_NAME = "xstage.toml"


def project_config_path(cwd: str | os.PathLike[str] | None = None) -> Path:
    """``./xstage.toml`` of ``cwd`` (default: the current directory)."""
    return Path(cwd if cwd is not None else os.getcwd()) / PROJECT_CONFIG_NAME


def user_config_path(environ: dict[str, str] | None = None) -> Path:
    """The user config file: ``XSTAGE_CONFIG`` or ``<user_config_dir>/xstage/config.toml``."""
    env = os.environ if environ is None else environ
    if env.get("XSTAGE_CONFIG"):
        return Path(env["XSTAGE_CONFIG"]).expanduser()
    return Path(platformdirs.user_config_dir("xstage")) / "config.toml"


@dataclass(frozen=True)
class ConfigFile:
    """One config file as read: its data, or why it could not be used.

    Attributes:
        path: where it was looked for.
        exists: whether the file is there.
        data: the parsed TOML (empty when missing or broken).
        error: a one-line reason when the file exists and cannot be used.
    """

    path: Path
    exists: bool
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def route_python(self, route: str) -> str | None:
        """The raw ``python`` value for ``route``, or None when this file names none.

        Raises:
            ValueError: the value is present but not a non-empty string.
        """
        routes = self.data.get("routes", {})
        if not isinstance(routes, dict):
            raise ValueError(f"{self.path}: [routes] must be a table")
        table = routes.get(route)
        if table is None:
            return None
        if not isinstance(table, dict):
            raise ValueError(f"{self.path}: [routes.{route}] must be a table")
        value = table.get("python")
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"{self.path}: [routes.{route}] python must be a non-empty string, got {value!r}"
            )
        return value


def _read(path: Path) -> bytes | ConfigFile:
    """A config file's bytes, or the ``ConfigFile`` that says it is absent or unreadable."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return ConfigFile(path=path, exists=False)
    except OSError as exc:
        return ConfigFile(path=path, exists=True, error=f"cannot read {path}: {exc.strerror}")


def load(path: Path, raw: bytes | None = None) -> ConfigFile:
    """Read one config file (or parse ``raw``, its bytes already read); never raises.

    A broken file is reported in ``error``.
    """
    if raw is None:
        read = _read(path)
        if isinstance(read, ConfigFile):
            return read
        raw = read
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return ConfigFile(path=path, exists=True, error=f"{path} is not valid TOML: {exc}")
    return ConfigFile(path=path, exists=True, data=data)


def resolve_python_value(value: str, *, base: Path) -> str:
    """An interpreter value as a path: ``~`` expanded, relative to ``base``, or from PATH.

    A bare command name that PATH does not know is returned unchanged, so the caller reports
    it as not found under the name the user wrote.
    """
    value = value.strip()
    if os.sep not in value and "/" not in value and (os.altsep is None or os.altsep not in value):
        found = shutil.which(value)
        return found if found else value
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    return str(path)


# ---------------------------------------------------------------------------- trust


def _say_once(path: Path, digest: str, line: str) -> None:
    if (str(path), digest) not in _SAID:
        _SAID.add((str(path), digest))
        _log.warning("%s", line)


def _own_file_problem(path: Path) -> str | None:
    """Why ``path`` (or its folder) is not the current user's, or None.

    Owned by the user (or root), and not writable by all (a group-writable file of a user's
    own group, as a umask of 002 makes, is allowed).
    """
    for where in (path, path.parent):
        try:
            st = os.stat(where)
        except OSError:
            return None
        if os.name == "posix" and (st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o002):
            return (f"{where} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:04o}, "
                    "not yours alone")
    return None


def user_config(environ: Mapping[str, str] | None = None) -> ConfigFile:
    """The user config file as read, or an empty one when it is not the user's own.

    Another user's file, or one others may write, could name interpreters for you: it is
    named once on stderr and ignored (a missing one is simply missing).
    """
    path = user_config_path(dict(os.environ if environ is None else environ))
    loaded = load(path)
    if loaded.exists and not loaded.error:
        problem = _own_file_problem(path)
        if problem is not None:
            _say_once(path, "owner", f"xstage: ignoring the user config {path}: {problem} "
                      f"(fix: chown and chmod go-w it, or point XSTAGE_CONFIG elsewhere)")
            return ConfigFile(path=path, exists=False)
    return loaded


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _trusted(path: Path, digest: str) -> bool:
    """A ``[[trusted]]`` record of this process's user config names ``path`` with ``digest``.

    The trust is the invoking user's: read from this process's user config, whatever
    environment a resolution is asked about.
    """
    records = user_config().data.get("trusted", [])
    return isinstance(records, list) and _trusted_in(records, path, digest)


@contextlib.contextmanager
def named_project_config(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Use ``path`` as the project file for the block (``--project-config``), trusted.

    Raises:
        UsageError: ``path`` is not a file.
    """
    target = Path(path).expanduser().resolve()
    if not target.is_file():
        raise UsageError(f"--project-config {path}: no such file",
                         remedy="name an xstage.toml that exists")
    _NAMED.append(target)
    try:
        yield target
    finally:
        _NAMED.remove(target)


def project_config(cwd: str | os.PathLike[str] | None = None) -> ConfigFile:
    """The project file to use: the one named for this run, else ``./xstage.toml`` if trusted.

    An untrusted or changed ``./xstage.toml`` is named in one line (once per content) and
    comes back as missing; so does one of a folder others may write, or another user's.
    """
    if _NAMED:
        return load(_NAMED[-1])
    path = project_config_path(cwd)
    raw = _read(path)
    if isinstance(raw, ConfigFile):
        return raw
    real = Path(os.path.realpath(path))
    digest = _digest(raw)
    problem = _own_file_problem(real)
    if problem is not None:
        _say_once(real, digest, f"xstage: ignoring {path}: {problem}; nothing in it loads or "
                  "runs (a project file must be yours, in a folder only you may write)")
        return ConfigFile(path=path, exists=False)
    if not _trusted(real, digest):
        _say_once(real, digest, f"xstage: ignoring {path}: not trusted"
                  f"{' in this version' if _path_known(real) else ''} (sha256 {digest[:12]}); "
                  f"nothing in it loads or runs. Read it, then: xstage config trust {path}")
        return ConfigFile(path=path, exists=False)
    return load(path, raw)


def _path_known(path: Path) -> bool:
    records = user_config().data.get("trusted", [])
    return isinstance(records, list) and any(
        isinstance(r, dict) and r.get("path") == str(path) for r in records)


def trust(path: str | os.PathLike[str] | None = None,
          environ: Mapping[str, str] | None = None) -> tuple[Path, str, Path]:
    """Record ``path`` (default ``./xstage.toml``) as trusted in the user config.

    Appends a ``[[trusted]]`` table with the file's real path and the sha256 of its bytes
    (nothing when that record exists). Returns (the file, its sha256, the user config).

    Raises:
        UsageError: the file is missing, is not the user's (or its folder is not), or the
            user config is not the user's own or has a ``trusted``
            value that is not an array of tables.
    """
    target = Path(path) if path is not None else project_config_path()
    try:
        raw = target.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {target}: {exc.strerror}",
                         remedy="name an xstage.toml that exists: xstage config trust PATH") from None
    real = Path(os.path.realpath(target))
    problem = _own_file_problem(real)
    if problem is not None:
        raise UsageError(f"{target} cannot be trusted: {problem}",
                         remedy="copy it into a folder of your own that no one else may write, "
                         "read it, and trust the copy")
    digest = _digest(raw)
    config = user_config_path(dict(os.environ if environ is None else environ))
    current = load(config)
    if current.error:
        raise UsageError(current.error, remedy=f"fix {config} first")
    if current.exists:
        check_file = _own_file_problem(config)
        if check_file is not None:
            raise UsageError(f"the user config {config}: {check_file}",
                             remedy="chown and chmod go-w it, or point XSTAGE_CONFIG elsewhere")
    records = current.data.get("trusted", [])
    if not isinstance(records, list):
        raise UsageError(f"{config}: trusted must be an array of tables [[trusted]]",
                         remedy=f"fix {config}")
    if not _trusted_in(records, real, digest):
        text = config.read_text(encoding="utf-8") if current.exists else ""
        if text:
            text += "\n" if text.endswith("\n") else "\n\n"
        text += f"[[trusted]]\npath = {json.dumps(str(real))}\nsha256 = \"{digest}\"\n"
        config.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    return real, digest, config


def _trusted_in(records: list[Any], path: Path, digest: str) -> bool:
    return any(isinstance(r, dict) and r.get("path") == str(path) and r.get("sha256") == digest
               for r in records)
