"""``xstage report``: both output modes, and broken files (exit 1, one error line, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import record_docs

from xstage.cli.main import EXIT_ERROR, EXIT_OK, main
from xstage.record import SCHEMA_VERSION, summary, write_record


@pytest.fixture
def refused_file(tmp_path: Path) -> Path:
    return write_record(record_docs.refused(), tmp_path / "refused.json")


def test_human_mode_prints_the_summary(capsys, refused_file: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["report", str(refused_file)]) == EXIT_OK  # a valid record of a refused run
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out
    # Worded as the CLI's error line words a refusal: code (cause) route on device: message.
    assert "execution_provider_declined_graph (declined) ort-openvino on cpu: " in out
    assert "cpu via ort-openvino: refused (execution_provider_declined_graph/declined)" in out
    assert "left on the CPU: Det" in out
    assert "refused (exit 2)" in out
    for line in summary(record_docs.refused()):
        assert line.split(": ", 1)[0] in out


def test_human_mode_prints_brackets_as_written(capsys, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    doc = record_docs.refused()
    doc["outcome"]["refusals"][0]["message"] = "inputs [input_ids] and [bold]x[/bold] do not match"
    path = write_record(doc, tmp_path / "r.json")
    assert main(["report", str(path)]) == EXIT_OK
    assert "inputs [input_ids] and [bold]x[/bold] do not match" in capsys.readouterr().out


def test_json_mode_prints_the_validated_record(capsys, refused_file: Path):
    assert main(["report", str(refused_file), "--json"]) == EXIT_OK
    captured = capsys.readouterr()
    assert json.loads(captured.out) == record_docs.refused()
    assert captured.err == ""


def test_quiet_human_mode_still_validates(capsys, tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["report", "-q", str(broken)]) == EXIT_ERROR
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("content", "says"), [
    ('{"schema_version": "1.0", "kind": ', "is not valid JSON: Expecting value at line 1 column 35"),
    ('{"schema_version": "3.0"}',
     f"has schema_version 3.0 (major 3); this xstage reads major 1 (writes {SCHEMA_VERSION})"),
    ('{"hello": 1}', "has no schema_version"),
    (None, "does not match record schema 1 at $.outcome.refusals[0].cause: 'tolerance' is not one of"),
])
@pytest.mark.parametrize("json_mode", [False, True])
def test_broken_record_exits_1_with_one_line(capsys, tmp_path: Path, content, says, json_mode):
    path = tmp_path / "r.json"
    if content is None:
        doc = record_docs.refused()
        doc["outcome"]["refusals"][0]["cause"] = "tolerance"
        content = json.dumps(doc)
    path.write_text(content)
    argv = ["report", str(path)] + (["--json"] if json_mode else [])
    assert main(argv) == EXIT_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, captured.err
    assert says in errors[0]
    assert str(path) in errors[0]
    assert "Traceback" not in captured.err


def test_missing_file_exits_1(capsys, tmp_path: Path):
    assert main(["report", str(tmp_path / "nope.json")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "cannot read record" in err and "No such file or directory" in err


def test_as_a_process_no_traceback(tmp_path: Path):
    """The installed entry point: exit 1, one error line on stderr, nothing on stdout."""
    path = tmp_path / "r.json"
    path.write_bytes(b"\x00\x01garbage")
    env = dict(os.environ, COLUMNS="200")
    env.pop("XSTAGE_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "xstage", "report", str(path)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: record {path} is not valid JSON: Expecting value at line 1 column 1"
    ]


def test_usage_error_without_a_record(capsys):
    with pytest.raises(SystemExit) as info:
        main(["report"])
    assert info.value.code == 64
