"""``xstage report --html/--node-data/--trace`` and ``xstage compare``: exit codes, files, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xstage.cli.main import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "reports" / "records"


def test_report_writes_the_three_files(tmp_path: Path, capsys):
    args = [
        "report",
        str(RECORDS / "split.json"),
        "--html",
        str(tmp_path / "r.html"),
        "--node-data",
        str(tmp_path / "nd.json"),
        "--trace",
        str(tmp_path / "t.json"),
    ]
    assert main(args) == EXIT_OK
    err = capsys.readouterr().err
    for name in ("r.html", "nd.json", "nd.kernel-time.json", "t.json"):
        assert (tmp_path / name).stat().st_size > 0
        assert str(tmp_path / name) in err.replace("\n", "")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_report_of_a_refused_or_failed_record_still_draws(tmp_path: Path):
    for name in ("refused", "error"):
        assert (
            main(
                [
                    "report",
                    str(RECORDS / f"{name}.json"),
                    "-q",
                    "--html",
                    str(tmp_path / f"{name}.html"),
                    "--node-data",
                    str(tmp_path / f"{name}.nd.json"),
                ]
            )
            == EXIT_OK
        )
        assert "<!DOCTYPE html>" in (tmp_path / f"{name}.html").read_text()


def test_report_json_mode_keeps_stdout_one_document(tmp_path: Path, capsys):
    assert (
        main(["report", str(RECORDS / "placed.json"), "--json", "--html", str(tmp_path / "r.html")])
        == EXIT_OK
    )
    out = capsys.readouterr().out
    assert json.loads(out)["outcome"]["status"] == "placed"


def test_an_unwritable_output_is_one_error_line(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "xstage",
            "report",
            str(RECORDS / "split.json"),
            "-q",
            "--html",
            str(blocker / "r.html"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        timeout=120,
    )
    # Checked before any work: a path under a file is a folder that does not exist (64).
    assert proc.returncode == EXIT_USAGE
    assert f"--html {blocker / 'r.html'}: the folder {blocker} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compare_prints_the_table_and_what_changed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    a, b = RECORDS / "ppocr-cls.ort-cpu.json", RECORDS / "ppocr-cls.ort-openvino.json"
    assert main(["compare", str(a), str(b)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "what changed (A → B):" in out and "changed side" in out
    assert "ort-cpu" in out and "ort-openvino" in out


def test_compare_json_and_html(tmp_path: Path, capsys):
    a, b = RECORDS / "ppocr-cls.ort-cpu.json", RECORDS / "ppocr-cls.ort-openvino.json"
    assert main(["compare", str(a), str(b), "--json", "--html", str(tmp_path / "c.html")]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["same_artifact"] is True and doc["moved"] and doc["changes"]
    assert (tmp_path / "c.html").read_text().startswith("<!DOCTYPE html>")


def test_compare_of_different_artifacts_warns(capsys):
    assert main(["compare", str(RECORDS / "split.json"), str(RECORDS / "placed.json")]) == EXIT_OK
    assert "different artifacts" in capsys.readouterr().err


def test_compare_of_a_missing_record_is_an_error(tmp_path: Path, capsys):
    assert main(["compare", str(tmp_path / "nope.json"), str(RECORDS / "split.json")]) == EXIT_ERROR
    assert "cannot read record" in capsys.readouterr().err


def test_compare_needs_two_records():
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(RECORDS / "split.json")])
    assert exc.value.code == EXIT_USAGE


#: What a hostile record carries in its strings: an OSC title, a CSI clear and colour, a C1 CSI,
#: backspace and carriage return, a bidirectional override, and rich markup for a hyperlink.
HOSTILE = ("\x1b]0;pwned\x07\x1b[2J\x1b[31mRED\x1b[0m\x9b31m\x08\r\u202e"
           "[link=http://evil.example]click[/link]")
#: Sequences none of which may reach the terminal (rich's own styling is ESC [ … m, no OSC:
#: it draws a link only from markup).
ACTED_ON = ("\x1b]", "\x1b[2J", "\x1b[31mRED", "\x9b", "\x07", "\x08", "\r", "\u202e")


def _hostile(tmp_path: Path) -> tuple[Path, Path]:
    refused = json.loads((RECORDS / "refused.json").read_text())
    first = refused["outcome"]["refusals"][0]
    first["message"], first["remedy"] = "refused " + HOSTILE, "remedy " + HOSTILE
    refused["artifact"]["component"] = "comp" + HOSTILE
    error = json.loads((RECORDS / "error.json").read_text())
    error["outcome"]["error"]["message"] = "msg " + HOSTILE
    paths = tmp_path / "refused.json", tmp_path / "error.json"
    for path, doc in zip(paths, (refused, error), strict=True):
        path.write_text(json.dumps(doc))
    return paths


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_report_and_compare_escape_control_characters(tmp_path: Path, capsys, monkeypatch,
                                                      terminal: bool):
    """A record's strings reach the terminal with every control character as its escape and
    markup as written (before: ESC, OSC and C1 bytes printed raw; a compare row's markup drew
    a hyperlink)."""
    monkeypatch.setenv("COLUMNS", "2000")  # no cell folds across lines
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TERM", "xterm-256color")
    refused, error = _hostile(tmp_path)
    for args in (["report", str(refused)], ["report", str(error)],
                 ["compare", str(RECORDS / "refused.json"), str(refused)]):
        assert main(args) == EXIT_OK
        got = capsys.readouterr()
        text = got.out + got.err
        for seq in ACTED_ON:
            assert seq not in text, (args, repr(seq))
        if not terminal:
            assert "\x1b" not in text
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in text, args
        assert "[link=http://evil.example]click[/link]" in text, args


def test_the_html_page_writes_control_characters_as_escapes(tmp_path: Path):
    from xstage.record import read_record
    from xstage.report import build_view
    from xstage.report.html import render_report

    refused, _ = _hostile(tmp_path)
    page = render_report(build_view(read_record(refused)))
    assert not any(seq in page for seq in ACTED_ON)
    assert "\\x1b]0;pwned\\x07" in page and "[link=http://evil.example]" in page
