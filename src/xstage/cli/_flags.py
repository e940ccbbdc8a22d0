"""Flags several commands share, defined once so their names, help and checks stay the same."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from xstage.errors import UsageError

__all__ = ["add_input_flags", "add_json_flag", "bounded_int", "check_json_target", "check_out_folder",
           "resolve_out"]


def add_input_flags(p: argparse.ArgumentParser, *, npz_help: str | None) -> None:
    """``--shape``/``--dim`` (fixing what synthesized inputs look like), and ``--inputs`` when
    ``npz_help`` says what the file is for."""
    if npz_help is not None:
        p.add_argument("--inputs", metavar="FILE.npz", help=npz_help)
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x640x640",
                   help="fix an input's shape (repeatable)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="fix a symbolic dimension (repeatable)")


def add_json_flag(p: argparse.ArgumentParser, what: str, *, files: Sequence[str] = ()) -> None:
    """``--json[=PATH]``: ``what`` as one JSON document on stdout (no value, or ``-``) or in PATH.

    ``files`` names the command's arguments that hold its input and output files: a ``--json``
    path naming one of them is a usage error (``check_json_target``), never a clobbered input.
    """
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help=f"{what} as one JSON document: on stdout with no value (or -; everything "
                   "else goes to stderr), or written to PATH (--json=PATH)")
    p.set_defaults(json_files=tuple(files))


#: The positional arguments' metavars, for messages (``--json x.onnx names IN.onnx``).
_POSITIONALS = {"src": "IN.onnx", "dst": "OUT.onnx", "record": "RECORD.json", "a": "A.json", "b": "B.json"}


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_json_target(args: argparse.Namespace) -> None:
    """A ``--json`` path that names one of the command's files is a usage error.

    Raises:
        UsageError: ``--json`` names an input or output file of the command.
    """
    target = getattr(args, "json", None)
    if target in (None, "-"):
        return
    for dest in getattr(args, "json_files", ()):
        values = getattr(args, dest, None)
        for value in values if isinstance(values, list | tuple) else [values]:
            if value and _same(Path(target), Path(value)):
                flag = _POSITIONALS.get(dest, "--" + dest.replace("_", "-"))
                raise UsageError(f"--json {target} names the command's own file ({flag} {value}): "
                                 "writing it would replace that file",
                                 remedy="write the JSON elsewhere, or to stdout with --json -")


def bounded_int(lo: int, hi: int, why: str) -> object:
    """An argparse type: an integer in [lo, hi]; the message says why the bound exists."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi} ({why})")
        return value

    return parse


def check_out_folder(flag: str, value: str | None) -> None:
    """A folder output (``bisect --out DIR``): a folder, or a new one whose parent exists.

    Raises:
        UsageError: the path is a file, or its parent folder is missing.
    """
    if not value:
        return
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {value} is a file, not a folder", remedy=f"name a folder for {flag}")
    if not path.exists() and not path.parent.is_dir():
        raise UsageError(f"{flag} {value}: the folder {path.parent} does not exist",
                         remedy=f"create it first (mkdir -p {path.parent}) or choose another path")


def resolve_out(flag: str, value: str, *, suffixes: Sequence[str], name: str) -> Path:
    """``--out`` (or a positional output): a file whose suffix names the format, or a folder.

    Case 1: an existing folder, or a path ending in ``/`` (a new folder whose parent exists):
    the file ``name`` inside it.
    Case 2: a path whose suffix is one of ``suffixes``: that file (its folder must exist).
    Case 3: a path with no suffix that is not a folder: that file with ``suffixes[0]`` added
    (``--out tower`` → ``tower.onnx``, as the export docs have always said).
    Anything else (another suffix) is a usage error. A folder is never created beyond one new
    level, and an existing folder is never written beside (``/tmp`` never becomes ``/tmp.onnx``).

    Raises:
        UsageError: a suffix naming no format this command writes, or a missing parent folder.
    """
    path = Path(value)
    if path.is_dir() or value.endswith(("/", os.sep)):
        target = path / name
        parent = path if path.is_dir() else path.parent  # a new folder: its parent must exist
    elif path.suffix.lower() in suffixes:
        target, parent = path, path.parent
    elif path.suffix:
        raise UsageError(f"{flag} {value}: {path.suffix} names no format this command writes",
                         remedy=f"end it in {' or '.join(suffixes)}, or name a folder")
    else:
        target, parent = path.with_name(path.name + suffixes[0]), path.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {value}: the folder {parent} does not exist",
                         remedy=f"create it first (mkdir -p {parent}) or choose another path")
    return target
