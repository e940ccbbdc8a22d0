"""The record: the versioned JSON document every ``xstage external`` run writes, refused or not.

The schema ships as ``xstage/record/schema/record-v1.json`` (draft 2020-12). ``write_record``
validates and writes deterministically (sorted keys, temp file + ``os.replace``);
``read_record`` validates and rejects an unknown major version, naming both (a value outside an
enum of a known major reads with an ``UnknownValueWarning``); ``summary`` is the
human digest both ``external`` and ``report`` print.

.. versionadded:: 0.1
"""

from __future__ import annotations

from xstage.record.io import (
    SCHEMA_MAJOR,
    SCHEMA_VERSION,
    UnknownValueWarning,
    dumps_record,
    host_block,
    load_schema,
    read_record,
    records_path,
    utc_now,
    validate_record,
    write_record,
)
from xstage.record.summary import summary, summary_rows

__all__ = [
    "SCHEMA_MAJOR",
    "SCHEMA_VERSION",
    "UnknownValueWarning",
    "dumps_record",
    "host_block",
    "load_schema",
    "read_record",
    "records_path",
    "summary",
    "summary_rows",
    "utc_now",
    "validate_record",
    "write_record",
]
