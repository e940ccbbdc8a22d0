"""Schema 1.3: the tie-break's record, and a reader that accepts enum values it does not know
within its major version (with a warning), while the writer stays strict."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import record_docs

from xstage.errors import RecordError
from xstage.record import SCHEMA_VERSION, UnknownValueWarning, read_record, validate_record, write_record


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _tiebreak(**extra: object) -> dict:
    return {"status": "failed", "slack": 16.0, "evaluator": "onnx.reference.ReferenceEvaluator (float64)",
            "graph": {"kind": "user", "name": "reference.onnx"}, "ill_conditioned": ["y"], "seconds": 0.1,
            "outputs": [{"name": "y", "passed": False, "stage_rel_l2": 1.0, "reference_rel_l2": 2e-2,
                         "stage_max_abs": 3.0, "reference_max_abs": 0.1, "compared": 512, "left_out": 0,
                         "finiteness_disagrees": 0, "ill_conditioned": True, "worst_band": {}}],
            **extra}


def test_this_xstage_writes_1_6():
    assert SCHEMA_VERSION == "1.6"


def test_a_1_3_record_with_an_unknown_cause_reads_with_a_warning(tmp_path):
    doc = record_docs.refused()
    doc["schema_version"] = "1.3"
    doc["outcome"]["refusals"][0]["cause"] = "cause_of_a_later_minor"
    with pytest.warns(UnknownValueWarning, match=r"schema_version 1\.3.*\$\.outcome\.refusals\[0\]\.cause: "
                      r"'cause_of_a_later_minor' is not one of"):
        read = read_record(_write(tmp_path, doc))
    assert read["outcome"]["refusals"][0]["cause"] == "cause_of_a_later_minor"


def test_the_writer_refuses_a_value_it_does_not_know(tmp_path):
    doc = record_docs.refused()
    doc["outcome"]["refusals"][0]["cause"] = "cause_of_a_later_minor"
    with pytest.raises(RecordError, match="is not one of"):
        write_record(doc, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_a_known_record_reads_without_a_warning(tmp_path):
    doc = record_docs.placed()
    doc["parity"]["tiebreak"] = _tiebreak()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_record(write_record(doc, tmp_path / "r.json"))


def test_the_tiebreak_block_is_validated(tmp_path):
    doc = record_docs.placed()
    doc["parity"]["tiebreak"] = _tiebreak(status="unavailable", reason="no finite element",
                                          reason_code="no_finite_answer")
    validate_record(doc)
    doc["parity"]["tiebreak"]["outputs"][0]["left_out"] = -1
    with pytest.raises(RecordError, match=r"\$\.parity\.tiebreak\.outputs\[0\]\.left_out"):
        read_record(_write(tmp_path, doc))
    doc["parity"]["tiebreak"] = _tiebreak(reason_code="a_later_reason")
    with pytest.warns(UnknownValueWarning, match=r"\$\.parity\.tiebreak\.reason_code"):
        read_record(_write(tmp_path, doc))


def test_an_older_tiebreak_block_keeps_validating():
    """1.2 records carry the tie-break without graph, reason_code or ill_conditioned."""
    doc = record_docs.placed()
    doc["schema_version"] = "1.2"
    doc["parity"]["tiebreak"] = {"status": "passed", "slack": 16.0, "evaluator": "x", "seconds": 0.2,
                                 "outputs": [{"name": "y", "stage_rel_l2": 1e-6, "reference_rel_l2": 1e-6,
                                              "stage_max_abs": 1e-6, "reference_max_abs": 1e-6,
                                              "worst_band": {}, "passed": True}]}
    validate_record(doc)


def test_an_unknown_major_is_rejected_naming_both_versions(tmp_path):
    doc = record_docs.placed()
    doc["schema_version"] = "3.0"
    with pytest.raises(RecordError, match=rf"schema_version 3\.0 \(major 3\); this xstage reads major 1 "
                       rf"\(writes {SCHEMA_VERSION}\)"):
        read_record(_write(tmp_path, doc))


def test_a_known_value_in_the_wrong_place_is_still_refused(tmp_path):
    """'tolerance' is a cause of numeric_gate_failed, not of the refusal's code here: a broken
    record, not a newer one."""
    doc = record_docs.refused()
    doc["outcome"]["refusals"][0]["cause"] = "tolerance"
    with pytest.raises(RecordError, match=r"\$\.outcome\.refusals\[0\]\.cause: 'tolerance' is not one of"):
        read_record(_write(tmp_path, doc))


def test_report_says_the_unknown_value_as_a_warning_and_exits_0(tmp_path, capsys):
    from xstage.cli.main import main

    doc = record_docs.refused()
    doc["schema_version"] = "1.4"
    doc["outcome"]["refusals"][0]["cause"] = "cause_of_a_later_minor"
    assert main(["report", str(_write(tmp_path, doc))]) == 0
    err = capsys.readouterr().err
    assert "cause_of_a_later_minor" in err and "read as it is" in err and "Traceback" not in err


def _next_minor() -> str:
    major, minor = SCHEMA_VERSION.split(".")
    return f"{major}.{int(minor) + 1}"


def test_a_record_of_the_next_minor_with_an_unknown_cause_reads_with_a_warning(tmp_path):
    """The rule (docs/external.md, "Timings and the record"): a new enum value is a minor bump,
    and a reader of the same major reads it, warning; nothing else of the record is loosened."""
    doc = record_docs.refused()
    doc["schema_version"] = _next_minor()
    doc["outcome"]["refusals"][0]["cause"] = "a_cause_of_the_next_minor"
    with pytest.warns(UnknownValueWarning) as caught:
        read = read_record(_write(tmp_path, doc))
    assert read["outcome"]["refusals"][0]["cause"] == "a_cause_of_the_next_minor"
    [warned] = [str(w.message) for w in caught]
    assert f"schema_version {_next_minor()}" in warned and "a_cause_of_the_next_minor" in warned
    assert "$.outcome.refusals[0].cause" in warned


def test_the_next_minor_with_an_unknown_code_reads_with_a_warning(tmp_path):
    doc = record_docs.refused()
    doc["schema_version"] = _next_minor()
    doc["outcome"]["refusals"][0]["code"] = "a_code_of_the_next_minor"
    with pytest.warns(UnknownValueWarning, match=r"\$\.outcome\.refusals\[0\]\.code"):
        read_record(_write(tmp_path, doc))


def test_the_next_major_is_rejected_naming_the_version(tmp_path):
    doc = record_docs.refused()
    doc["schema_version"] = "2.0"
    doc["outcome"]["refusals"][0]["cause"] = "a_cause_of_the_next_minor"
    named = r"schema_version 2\.0 \(major 2\); this xstage reads major 1"
    with pytest.raises(RecordError, match=named) as err:
        read_record(_write(tmp_path, doc))
    assert err.value.remedy == "upgrade xstage to read it"


def test_a_later_minors_optional_key_reads_with_a_warning(tmp_path):
    """A later minor version may add an optional key: a reader names it and reads the record."""
    major, minor = SCHEMA_VERSION.split(".")
    doc = record_docs.placed()
    doc["schema_version"] = f"{major}.{int(minor) + 1}"
    doc["a_later_block"] = {"p50_ms": 1.0}
    with pytest.warns(UnknownValueWarning, match=r"at \$: additional properties are not allowed "
                      r"\('a_later_block'\)"):
        read = read_record(_write(tmp_path, doc))
    assert read["a_later_block"] == {"p50_ms": 1.0}


def test_an_unknown_key_in_a_record_of_this_minor_is_refused(tmp_path):
    """A record that claims this minor (or an older one) and holds a key the schema does not list
    is broken, not newer; the writer refuses it too."""
    doc = record_docs.placed()
    doc["a_later_block"] = 1
    with pytest.raises(RecordError, match=r"at \$: additional properties"):
        read_record(_write(tmp_path, doc))
    doc["schema_version"] = "1.3"
    with pytest.raises(RecordError, match=r"at \$: additional properties"):
        read_record(_write(tmp_path, doc))
    doc["schema_version"] = "1.99"
    with pytest.raises(RecordError, match="additional properties"):
        write_record(doc, tmp_path / "w.json")
