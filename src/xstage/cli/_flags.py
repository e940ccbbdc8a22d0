"""Flags several commands share, defined once so their names and help stay the same."""

from __future__ import annotations

import argparse

__all__ = ["add_input_flags"]


def add_input_flags(p: argparse.ArgumentParser, *, npz_help: str | None) -> None:
    """``--shape``/``--dim`` (fixing what synthesized inputs look like), and ``--inputs`` when
    ``npz_help`` says what the file is for."""
    if npz_help is not None:
        p.add_argument("--inputs", metavar="FILE.npz", help=npz_help)
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x640x640",
                   help="fix an input's shape (repeatable)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="fix a symbolic dimension (repeatable)")
