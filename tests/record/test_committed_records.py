"""The records committed under docs/records are real records: each validates against the schema.

Every ``.json`` there is an ``xstage external`` record (a bisect's or a benchmark's JSON is kept
as its text output beside them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xstage.record import read_record

RECORDS = sorted(p for p in (Path(__file__).resolve().parents[2] / "docs" / "records").rglob("*.json")
                 if p.name != "devices.json")


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_committed_record_validates(path):
    doc = read_record(path)
    assert doc["kind"] == "xstage.external"
    worker = doc["worker"] or doc["outcome"]["refusals"][0]["evidence"]["worker"]
    runtime = worker["runtime"]
    assert runtime[runtime["runtime"]] and len(worker["evidence_sha256"]) == 64  # its version


def test_there_are_committed_records():
    assert len(RECORDS) >= 7
