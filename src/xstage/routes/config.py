"""Where a route's interpreter may be configured: ``./xstage.toml`` and the user config file.

Both files share one shape::

    [routes.ort-openvino]
    python = "/path/to/venv/bin/python"   # relative paths are relative to this file

A value without a path separator (``python3.9``) is looked up on ``PATH``. The user config
file is ``platformdirs.user_config_dir("xstage")/config.toml``, or ``XSTAGE_CONFIG`` when set
(tests point it at a temporary file so a developer's own config never leaks in).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

try:  # Python 3.11+; tomli is the same parser, installed on 3.10 (pyproject.toml)
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "PROJECT_CONFIG_NAME",
    "ConfigFile",
    "load",
    "project_config_path",
    "resolve_python_value",
    "user_config_path",
]

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


def load(path: Path) -> ConfigFile:
    """Read one config file; never raises (a broken file is reported in ``error``)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ConfigFile(path=path, exists=False)
    except OSError as exc:
        return ConfigFile(path=path, exists=True, error=f"cannot read {path}: {exc.strerror}")
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
