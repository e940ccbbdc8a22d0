"""The bisect record: its own kind (``xstage.bisect``) and its own schema file.

The schema ships beside the ``external`` record's, as ``xstage/record/schema/bisect-v1.json``,
and is checked by the same subset validator (``xstage.record._validate``). Writing follows the
``external`` record: deterministic text (``xstage.record.dumps_record``), validated before a
byte is written, then one atomic rename.

.. versionadded:: 0.3
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from xstage.errors import RecordError
from xstage.home import atomic_write
from xstage.record import dumps_record
from xstage.record._validate import Validator

__all__ = ["KIND", "SCHEMA_VERSION", "load_bisect_schema", "read_bisect_record",
           "validate_bisect_record", "write_bisect_record"]

KIND = "xstage.bisect"
#: The version this xstage writes; it reads any ``1.x``.
SCHEMA_VERSION = "1.0"
_MAJOR = 1
_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)$")


@functools.cache
def load_bisect_schema() -> dict[str, Any]:
    """The shipped ``bisect-v1.json``."""
    text = resources.files("xstage.record").joinpath("schema", "bisect-v1.json").read_text(
        encoding="utf-8")
    return dict(json.loads(text))


@functools.cache
def _validator() -> Validator:
    return Validator(load_bisect_schema())


def validate_bisect_record(doc: Any, *, source: str | os.PathLike[str] | None = None) -> None:
    """Check a bisect record: its kind and version first, then the schema.

    Raises:
        RecordError: not an object, not of kind ``xstage.bisect``, a version that is not
            ``1.x``, or a schema violation (named by its JSON path).
    """
    what = f"bisect record {source}" if source is not None else "bisect record"
    if not isinstance(doc, Mapping) or doc.get("kind") != KIND:
        raise RecordError(f"{what} is not of kind {KIND}",
                          remedy="pass a record written by xstage bisect")
    match = _VERSION.match(str(doc.get("schema_version")))
    if match is None or int(match.group(1)) != _MAJOR:
        raise RecordError(f"{what} has schema_version {doc.get('schema_version')!r}; this xstage "
                          f"reads {_MAJOR}.x (writes {SCHEMA_VERSION})",
                          remedy="re-run xstage bisect to write a current record")
    issue = _validator().first_error(doc)
    if issue is not None:
        raise RecordError(f"{what} does not match bisect schema {_MAJOR} at {issue.json_path}: "
                          f"{issue.message}", remedy="re-run xstage bisect rather than editing it")


def write_bisect_record(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate ``doc`` and write it to ``path`` atomically; returns the path.

    Raises:
        RecordError: the document is not JSON data or violates the schema (nothing written).
        OSError: the folder or file cannot be written.
    """
    text = dumps_record(doc)
    validate_bisect_record(json.loads(text))
    return atomic_write(path, text.encode("utf-8"))


def read_bisect_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one bisect record.

    Raises:
        RecordError: unreadable, not JSON, or anything ``validate_bisect_record`` rejects.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read bisect record {path}: {exc}") from None
    validate_bisect_record(doc, source=path)
    return dict(doc)
