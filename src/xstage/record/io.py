"""Reads, validates and writes ``xstage external`` records against the shipped JSON Schema.

A reader accepts any minor version of its major: a value that no ``enum`` of the schema lists (a
cause, a status a later minor version added) reads with an :class:`UnknownValueWarning` naming
the value and its path; every other violation (a known value in the wrong place, a cause under
another code, included), and an unknown major, is a ``RecordError``. The
writer stays strict: it writes only values this schema knows.

The schema is package data (``xstage/record/schema/record-v1.json``); validation uses the
hand-written subset validator in ``xstage.record._validate`` (no runtime ``jsonschema``).
Records are deterministic: the same document always gives the same bytes (sorted keys, two-space
indent, UTF-8, one trailing newline), and a record is written to a temporary file in the target
folder and then ``os.replace``-d, so a reader never sees half a record.

.. versionadded:: 0.1
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import secrets
import socket
import sys
import tempfile
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from xstage.errors import RecordError, naming_full_disk
from xstage.home import file_mode, records_dir
from xstage.record._validate import Validator, json_path

__all__ = [
    "SCHEMA_MAJOR",
    "SCHEMA_VERSION",
    "UnknownValueWarning",
    "dumps_record",
    "host_block",
    "load_schema",
    "read_record",
    "records_path",
    "utc_now",
    "validate_record",
    "write_record",
]

#: The version this xstage writes; it reads any ``1.x``. 1.3 added the float64 tie-break's
#: record (``parity.tiebreak``: its status, the graph evaluated, each output's two distances,
#: ``ill_conditioned``, an ``unavailable`` tie-break's ``reason_code``), and readers accept
#: enum values they do not know within the major (with an :class:`UnknownValueWarning`).
SCHEMA_VERSION = "1.6"
SCHEMA_MAJOR = 1

_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class UnknownValueWarning(UserWarning):
    """Warned when a record read holds a value outside one of the schema's enums (its path and
    value in the message): a later minor version's cause or status, read as it is."""


@functools.cache
def load_schema(major: int = SCHEMA_MAJOR) -> dict[str, Any]:
    """The shipped schema document for one major version.

    Raises:
        RecordError: if this xstage ships no schema for ``major``.
    """
    name = f"record-v{major}.json"
    try:
        text = resources.files("xstage.record").joinpath("schema", name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"this xstage ships no record schema {name}") from None
    return dict(json.loads(text))


@functools.cache
def _validator(major: int) -> Validator:
    return Validator(load_schema(major))


@functools.cache
def _enum_values(major: int) -> frozenset[tuple[str, Any]]:
    """Every value any ``enum`` of schema ``major`` lists, typed (``True`` is not ``1``)."""
    found: set[tuple[str, Any]] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key == "enum" and isinstance(value, list):
                    found.update((type(v).__name__, v) for v in value if not isinstance(v, (list, dict)))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(load_schema(major))
    return frozenset(found)


def _unknown(doc: Any, path: tuple[str | int, ...], major: int) -> bool:
    """Whether the value at ``path`` is one no enum of the schema lists: a later minor version's.

    A value the schema knows in the wrong place (a cause under another code) is not unknown:
    that is a broken record, not a newer one.
    """
    value = doc
    for step in path:
        value = value[step]
    if isinstance(value, (list, dict)):
        return False
    return (type(value).__name__, value) not in _enum_values(major)


def validate_record(doc: Any, *, source: str | os.PathLike[str] | None = None,
                    unknown_values: bool = False) -> None:
    """Check a record document: its version first, then the schema.

    Args:
        doc: the parsed record.
        source: a file name to put in the messages, when the record came from a file.
        unknown_values: accept a value that no enum of the schema lists, and a key the schema
            does not list where the record's minor version is later than this xstage's,
            warning :class:`UnknownValueWarning` for each (what a reader does); the writer keeps
            the default, strict.

    Raises:
        RecordError: if the document is not an object; if ``schema_version`` is missing or is
            not ``MAJOR.MINOR``; if its major version is not one this xstage reads (the message
            names both versions); if it violates the schema (the message names the JSON path of
            the first violation).
    """
    what = f"record {source}" if source is not None else "record"
    if not isinstance(doc, Mapping):
        raise RecordError(f"{what} is not a JSON object (got {type(doc).__name__})",
                          remedy="pass a record written by xstage external")
    if "schema_version" not in doc:
        raise RecordError(f"{what} has no schema_version: not an xstage record",
                          remedy="pass a record written by xstage external")
    version = doc["schema_version"]
    match = _VERSION.match(version) if isinstance(version, str) else None
    if match is None:
        raise RecordError(f"{what} has schema_version {version!r}, which is not MAJOR.MINOR",
                          remedy="pass a record written by xstage external")
    major = int(match.group(1))
    if major != SCHEMA_MAJOR:
        newer = major > SCHEMA_MAJOR
        raise RecordError(
            f"{what} has schema_version {version} (major {major}); this xstage reads major "
            f"{SCHEMA_MAJOR} (writes {SCHEMA_VERSION})",
            remedy="upgrade xstage to read it" if newer
            else "re-run xstage external to write a current record",
        )
    # A later minor version may add enum values and optional keys (CHANGELOG.md, "Deprecation
    # policy"): a reader takes both with a warning. A key this xstage does not know in a record
    # that claims this minor or an older one is a broken record, not a newer one.
    newer_minor = int(match.group(2)) > int(SCHEMA_VERSION.split(".")[1])
    issue = None
    for found in _validator(major).iter_errors(doc):
        later = (found.keyword == "enum" and _unknown(doc, found.path, major)) \
            or (found.keyword == "additionalProperties" and newer_minor)
        if not (unknown_values and later):
            issue = found
            break
        warnings.warn(f"{what} (schema_version {version}) holds a value this xstage does not know "
                      f"(schema {SCHEMA_VERSION}) at {found.json_path}: {found.message}; read as it is",
                      UnknownValueWarning, stacklevel=2)
    if issue is not None:
        raise RecordError(
            f"{what} does not match record schema {major} at {issue.json_path}: {issue.message}",
            remedy="records are written by xstage external; re-run it rather than editing the file",
        )


def _check_json(value: Any, path: tuple[str | int, ...]) -> None:
    """Reject what ``json`` would write as non-JSON (NaN) or fail on late (numpy scalars)."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecordError(f"record value at {json_path(path)} is {value!r}: JSON has no NaN or infinity",
                              remedy="store non-finite values as null, or count them")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecordError(f"record key {key!r} at {json_path(path)} is not a string")
            _check_json(item, (*path, key))
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, (*path, index))
        return
    raise RecordError(
        f"record value at {json_path(path)} has type {type(value).__name__}, which JSON cannot hold",
        remedy="convert it to a plain int, float, str, bool, list or dict (e.g. float(x), x.tolist())",
    )


def dumps_record(doc: Mapping[str, Any]) -> str:
    """The exact text ``write_record`` writes: sorted keys, indent 2, UTF-8, trailing newline.

    Raises:
        RecordError: if a value is not JSON (NaN, infinity, a numpy scalar, …), naming its path.
    """
    _check_json(doc, ())
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_record(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate ``doc`` and write it to ``path`` atomically; returns the path.

    What is validated is the document as it will be read back (tuples become lists). Side
    effects: creates the parent folder; writes ``.<name>.*.tmp`` beside the target, then
    ``os.replace``-s it (the temporary file is removed if anything fails).

    Raises:
        RecordError: if the document is not valid JSON data or violates the schema; nothing is
            written then.
        NoSpace: its file system is full (an ``OSError`` too; nothing is left behind).
        OSError: if the folder or file cannot be written.
    """
    text = dumps_record(doc)
    validate_record(json.loads(text))
    target = Path(path)
    with naming_full_disk(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, file_mode(target))  # 0600 under XSTAGE_HOME, else 0644
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    return target


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one record file; returns the document.

    A value outside one of the schema's enums (a later minor version's), and a key the schema
    does not list in a record of a later minor version, are read with an
    :class:`UnknownValueWarning`, not refused.

    Raises:
        RecordError: if the file cannot be read or is not UTF-8; if it is not JSON (with line and
            column), has duplicate keys or NaN/Infinity; and for everything ``validate_record``
            rejects.
    """
    source = Path(path)
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise RecordError(f"cannot read record {source}: {exc.strerror or exc}",
                          remedy="check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"record {source} is not UTF-8 (byte {exc.start})",
                          remedy="pass a record written by xstage external") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"record {source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            remedy="the file is damaged or truncated; re-run xstage external to write it again",
        ) from None
    except ValueError as exc:
        raise RecordError(f"record {source} is not valid JSON: {exc}",
                          remedy="the file is damaged; re-run xstage external to write it again") from None
    validate_record(doc, source=source, unknown_values=True)
    return dict(doc)


def utc_now() -> str:
    """The current time as the record's timestamps write it (UTC, microseconds, ``Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def records_path(
    component: str | None = None,
    graph: str | os.PathLike[str] | None = None,
    *,
    now: datetime | None = None,
    folder: str | os.PathLike[str] | None = None,
) -> Path:
    """A fresh file name for one record: ``<UTC timestamp>-<name>-<6 hex>.json``.

    ``name`` is the component, else the graph's stem, else ``record``, reduced to
    ``[A-Za-z0-9._-]``. The folder defaults to ``xstage.home.records_dir()`` (created on use);
    the file itself is not created.
    """
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = component or (Path(graph).stem if graph is not None else "") or "record"
    name = _SAFE_NAME.sub("_", name).strip("._-")[:64] or "record"
    base = Path(folder) if folder is not None else records_dir()
    return base / f"{stamp}-{name}-{secrets.token_hex(3)}.json"


def _cpu_name() -> str | None:
    try:
        from xstage.host.hardware import parse_cpuinfo

        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            name = parse_cpuinfo(handle.read()).model_name
        if name:
            return name
    except OSError:
        pass
    return platform.processor() or None


def host_block() -> dict[str, Any]:
    """The record's ``host`` object for this process's machine."""
    try:
        import psutil

        memory: int | None = int(psutil.virtual_memory().total)
    except Exception:  # a host fact that cannot be read is recorded as unknown
        memory = None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "memory_bytes": memory,
    }
