"""Where xstage keeps its state: ``XSTAGE_HOME`` or the platform's user data dir.

Layout (DESIGN §7): ``envs/`` route environments, ``cache/`` probes and staged worker
packages, ``records/`` every ``external`` record, ``logs/`` worker logs.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["cache_dir", "envs_dir", "home", "logs_dir", "records_dir"]


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


def logs_dir() -> Path:
    """One log file per worker: its fd 1 and fd 2."""
    return _sub("logs")
