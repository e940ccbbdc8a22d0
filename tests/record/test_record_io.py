"""Writing and reading records: round trip, determinism, atomicity, and one test per rejection."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import record_docs

from xstage.errors import RecordError
from xstage.record import (
    SCHEMA_VERSION,
    dumps_record,
    host_block,
    load_schema,
    read_record,
    records_path,
    utc_now,
    validate_record,
    write_record,
)


@pytest.mark.parametrize("name", sorted(record_docs.ALL))
def test_round_trip(tmp_path: Path, name: str):
    doc = record_docs.ALL[name]()
    path = write_record(doc, tmp_path / "sub" / "r.json")
    assert path == tmp_path / "sub" / "r.json"
    assert read_record(path) == doc


def test_same_document_same_bytes(tmp_path: Path):
    """Key order in the input does not matter: sorted keys, indent 2, UTF-8, one trailing newline."""
    doc = record_docs.placed()
    shuffled = dict(reversed(list(doc.items())))
    shuffled["host"] = dict(reversed(list(doc["host"].items())))
    a = write_record(doc, tmp_path / "a.json").read_bytes()
    b = write_record(shuffled, tmp_path / "b.json").read_bytes()
    assert a == b
    assert a.endswith(b"}\n") and not a.endswith(b"\n\n")
    assert a.decode("utf-8") == dumps_record(doc)
    assert list(json.loads(a)) == sorted(doc)


def test_unicode_is_written_as_utf8_not_escaped(tmp_path: Path):
    doc = record_docs.placed()
    doc["host"]["cpu"] = "Ryzen™ AI 9 HX 370 — Strix Point"
    raw = write_record(doc, tmp_path / "r.json").read_bytes()
    assert "Ryzen™ AI 9 HX 370 — Strix Point".encode() in raw


def test_tuples_are_written_as_arrays(tmp_path: Path):
    doc = record_docs.placed()
    doc["argv"] = tuple(doc["argv"])
    assert read_record(write_record(doc, tmp_path / "r.json"))["argv"] == list(doc["argv"])


def test_write_leaves_no_temp_file_and_replaces_atomically(tmp_path: Path):
    target = tmp_path / "r.json"
    target.write_text("old")
    write_record(record_docs.placed(), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert json.loads(target.read_text())["kind"] == "xstage.external"


def test_invalid_document_writes_nothing(tmp_path: Path):
    doc = record_docs.placed()
    doc["outcome"]["exit_code"] = 3
    target = tmp_path / "r.json"
    with pytest.raises(RecordError, match=r"\$\.outcome\.exit_code"):
        write_record(doc, target)
    assert list(tmp_path.iterdir()) == []


def test_nan_is_refused_naming_its_path(tmp_path: Path):
    doc = record_docs.placed()
    doc["parity"]["outputs"][0]["rel_l2"] = float("nan")
    with pytest.raises(RecordError, match=r"\$\.parity\.outputs\[0\]\.rel_l2 is nan"):
        write_record(doc, tmp_path / "r.json")
    assert list(tmp_path.iterdir()) == []


def test_numpy_scalar_is_refused_naming_its_path(tmp_path: Path):
    doc = record_docs.placed()
    doc["timings"]["compute_ms"]["p50"] = np.float32(41.2)
    with pytest.raises(RecordError, match=r"\$\.timings\.compute_ms\.p50 has type float32") as info:
        write_record(doc, tmp_path / "r.json")
    assert "float(x)" in (info.value.remedy or "")


# -- reading: one test per rejection ------------------------------------------------------------


def _write_text(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "r.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_missing_file(tmp_path: Path):
    with pytest.raises(RecordError, match=r"cannot read record .*nope\.json: No such file"):
        read_record(tmp_path / "nope.json")


def test_a_folder_is_unreadable(tmp_path: Path):
    with pytest.raises(RecordError, match="cannot read record"):
        read_record(tmp_path)


def test_not_utf8(tmp_path: Path):
    with pytest.raises(RecordError, match=r"is not UTF-8 \(byte 1\)"):
        read_record(_write_text(tmp_path, b'{\xff}'))


def test_truncated_json_names_line_and_column(tmp_path: Path):
    text = dumps_record(record_docs.placed())
    with pytest.raises(RecordError, match=r"is not valid JSON: .* at line \d+ column \d+") as info:
        read_record(_write_text(tmp_path, text[: len(text) // 2]))
    assert "\n" not in info.value.message


def test_duplicate_key(tmp_path: Path):
    with pytest.raises(RecordError, match="duplicate key 'kind'"):
        read_record(_write_text(tmp_path, '{"kind": 1, "kind": 2}'))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(tmp_path: Path, constant: str):
    text = dumps_record(record_docs.placed()).replace('"p50": 41.2', f'"p50": {constant}')
    with pytest.raises(RecordError, match=f"{constant.lstrip('-')} is not JSON"):
        read_record(_write_text(tmp_path, text))


def test_not_an_object(tmp_path: Path):
    with pytest.raises(RecordError, match=r"is not a JSON object \(got list\)"):
        read_record(_write_text(tmp_path, "[1, 2]"))


def test_missing_schema_version(tmp_path: Path):
    doc = record_docs.placed()
    del doc["schema_version"]
    with pytest.raises(RecordError, match="has no schema_version"):
        read_record(_write_text(tmp_path, json.dumps(doc)))


@pytest.mark.parametrize("version", ["1", "v1.0", "1.0.0", 1.0, None])
def test_schema_version_that_is_not_major_minor(tmp_path: Path, version):
    doc = record_docs.placed()
    doc["schema_version"] = version
    with pytest.raises(RecordError, match="which is not MAJOR.MINOR"):
        read_record(_write_text(tmp_path, json.dumps(doc)))


def test_unknown_major_names_both_versions(tmp_path: Path):
    """Checked before the schema: a v2 record may look nothing like v1."""
    path = _write_text(tmp_path, json.dumps({"schema_version": "2.1", "totally": "different"}))
    with pytest.raises(RecordError) as info:
        read_record(path)
    message = info.value.message
    assert "schema_version 2.1 (major 2)" in message
    assert f"reads major 1 (writes {SCHEMA_VERSION})" in message
    assert info.value.remedy == "upgrade xstage to read it"


def test_older_major_is_rejected_too(tmp_path: Path):
    doc = record_docs.placed()
    doc["schema_version"] = "0.9"
    match = r"schema_version 0\.9 \(major 0\); this xstage reads major 1"
    with pytest.raises(RecordError, match=match) as info:
        read_record(_write_text(tmp_path, json.dumps(doc)))
    assert "re-run" in (info.value.remedy or "")


def test_newer_minor_of_the_same_major_is_read(tmp_path: Path):
    doc = record_docs.placed()
    doc["schema_version"] = "1.7"
    doc["proof"]["added_in_1_7"] = {"x": 1}  # minor versions add keys inside the open objects
    assert read_record(_write_text(tmp_path, json.dumps(doc)))["schema_version"] == "1.7"


def test_schema_violation_names_the_json_path_of_the_first_error(tmp_path: Path):
    """The first violation that is not an unknown enum value (a reader accepts those, warning)."""
    doc = record_docs.placed()
    doc["plan"]["candidates"][2]["status"] = "maybe"
    doc["memory"]["rss_bytes"] = -1
    doc["memory"]["peak_bytes"] = "many"
    with pytest.raises(RecordError) as info, pytest.warns(UserWarning, match="'maybe' is not one of"):
        read_record(_write_text(tmp_path, json.dumps(doc)))
    assert re.search(r"does not match record schema 1 at \$\.memory\.rss_bytes: ", info.value.message), \
        info.value.message
    assert "\n" not in info.value.message
    with pytest.raises(RecordError, match=r"at \$\.plan\.candidates\[2\]\.status: 'maybe' is not one of"):
        validate_record(doc)  # the writer's check stays strict


def test_validate_record_without_a_source_says_record():
    doc = record_docs.placed()
    doc["kind"] = "xstage.sanitize"
    with pytest.raises(RecordError, match=r"^record does not match record schema 1 at \$\.kind"):
        validate_record(doc)


# -- names, host, clock ---------------------------------------------------------------------------


def test_records_path_is_under_records_dir(xstage_home: Path):
    when = datetime(2026, 11, 29, 19, 42, 30, tzinfo=timezone.utc)
    a = records_path("vision_tower", "/x/model.onnx", now=when)
    b = records_path("vision_tower", now=when)
    assert a.parent == xstage_home / "records" and a.parent.is_dir()
    assert re.fullmatch(r"20261129T194230Z-vision_tower-[0-9a-f]{6}\.json", a.name), a.name
    assert a != b  # the random part keeps two runs in one second apart
    assert not a.exists()


@pytest.mark.parametrize(("component", "graph", "name"), [
    (None, "/models/ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_det_infer"),
    (None, None, "record"),
    ("../../etc/passwd", None, "etc_passwd"),
    ("código vocal", None, "c_digo_vocal"),
])
def test_records_path_name_is_safe(tmp_path: Path, component, graph, name):
    path = records_path(component, graph, folder=tmp_path)
    assert path.parent == tmp_path
    assert path.name.split("-", 1)[1].rsplit("-", 1)[0] == name


def test_records_path_converts_to_utc(tmp_path: Path):
    from datetime import timedelta

    when = datetime(2026, 11, 29, 21, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    assert records_path("c", now=when, folder=tmp_path).name.startswith("20261129T190000Z-c-")


def test_host_block_and_clock_fit_the_schema(tmp_path: Path):
    doc = record_docs.placed()
    doc["host"] = host_block()
    doc["started"] = doc["finished"] = utc_now()
    validate_record(doc)
    assert doc["host"]["memory_bytes"] > 0


def test_schema_ships_as_package_data():
    from importlib import resources

    files = resources.files("xstage.record").joinpath("schema")
    assert sorted(p.name for p in files.iterdir() if p.name.endswith(".json")) == [
        "bisect-v1.json", "record-v1.json"]  # bisect-v1: the xstage.bisect record (docs/bisect.md)
    assert load_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    shipped = 'xstage = ["py.typed", "record/schema/*.json", "builtins/*.onnx", "builtins/*.manifest.json"]'
    assert shipped in pyproject


def test_written_record_is_readable_by_others(tmp_path: Path):
    path = write_record(record_docs.placed(), tmp_path / "r.json")
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_validation_needs_no_jsonschema_at_run_time(tmp_path: Path):
    """The GPU machine has no jsonschema: reading, validating and writing must not import it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['jsonschema'] = None\n"
        "sys.path.insert(0, sys.argv[1]); import record_docs\n"
        "from xstage.record import read_record, write_record\n"
        "doc = read_record(write_record(record_docs.placed(), sys.argv[2]))\n"
        "assert 'jsonschema' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    out = Path(__file__).parent
    done = subprocess.run([sys.executable, "-c", code, str(out), str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
