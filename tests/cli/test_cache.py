"""``xstage cache list|clear``: the artifact snapshots, in both output modes."""

from __future__ import annotations

import json

import pytest

from xstage import builtin_graphs, snapshot
from xstage.artifact import inspect_artifact
from xstage.cli.main import main


@pytest.fixture(autouse=True)
def no_pins_left():
    yield
    for folder, uses in snapshot.pinned().items():
        for _ in range(uses):
            snapshot.release(folder)


def _two(tmp_path):
    a = inspect_artifact(builtin_graphs.write(builtin_graphs.mlp(width=8, depth=1), tmp_path / "a.onnx"))
    b = inspect_artifact(builtin_graphs.write(builtin_graphs.mlp(width=8, depth=2), tmp_path / "b.onnx"))
    a.release()  # b stays in use by this process
    return a, b


def test_list_json_is_one_document_with_every_snapshot(tmp_path, capsys):
    a, b = _two(tmp_path)
    assert main(["cache", "list", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["kind"] == "xstage.cache" and doc["cap_bytes"] == snapshot.CACHE_BYTES_DEFAULT
    listed = {s["sha256"]: s for s in doc["snapshots"]}
    assert set(listed) == {a.sha256, b.sha256}
    assert listed[a.sha256]["files"] == ["a.onnx"] and listed[a.sha256]["bytes"] == a.bytes
    assert (listed[a.sha256]["in_use"], listed[b.sha256]["in_use"]) == (False, True)
    assert doc["total_bytes"] == a.bytes + b.bytes


def test_list_human_names_each_snapshot(tmp_path, capsys):
    a, b = _two(tmp_path)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert a.sha256[:16] in out and b.sha256[:16] in out and "a.onnx" in out and "yes" in out


def test_list_of_an_empty_cache(capsys):
    assert main(["cache", "list"]) == 0
    assert "no snapshots" in capsys.readouterr().out
    assert main(["cache", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshots"] == []


def test_clear_keeps_what_a_live_stage_reads(tmp_path, capsys):
    a, b = _two(tmp_path)
    assert main(["cache", "clear", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"kind": "xstage.cache.clear", "removed": [a.sha256], "kept_in_use": [b.sha256],
                   "removed_compiled": []}
    b.release()
    assert main(["cache", "clear"]) == 0
    captured = capsys.readouterr()
    assert "removed 1 snapshot" in captured.out
    assert snapshot.list_snapshots() == []


def test_clear_human_warns_of_a_kept_snapshot(tmp_path, capsys):
    _a, b = _two(tmp_path)
    assert main(["cache", "clear"]) == 0
    captured = capsys.readouterr()
    assert "removed 1 snapshot" in captured.out and f"kept {b.sha256[:16]}" in captured.err


def test_a_bad_cap_is_a_usage_error_naming_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(snapshot.CACHE_BYTES_ENV, "lots")
    assert main(["cache", "list"]) == 64
    err = capsys.readouterr().err
    assert "XSTAGE_ARTIFACT_CACHE_BYTES='lots' is not a size" in err and "Traceback" not in err
    path = builtin_graphs.write(builtin_graphs.mlp(width=8, depth=1), tmp_path / "a.onnx")
    assert main(["external", "--graph", str(path), "--route", "ort-cpu", "--runs", "1"]) == 64
    assert "XSTAGE_ARTIFACT_CACHE_BYTES" in capsys.readouterr().err
    assert snapshot.pinned() == {}


def test_cache_without_a_verb_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["cache"])
    assert ended.value.code == 64
