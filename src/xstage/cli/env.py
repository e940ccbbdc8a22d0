"""Placeholder registration for `xstage env` (filled in by its own module)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass
