"""The records the report tests read: real ones, written by ``xstage external``.

``docs/reports/records/`` holds what ``scripts/report_examples.py`` made (placed, split, refused
and error on ort-openvino; PP-OCR's classifier on ort-cpu and ort-openvino); none is written by
hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xstage.record import read_record

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "reports" / "records"


@pytest.fixture(scope="session")
def records() -> dict[str, dict]:
    return {p.stem: read_record(p) for p in sorted(RECORDS.glob("*.json"))}
