"""Compile caches (``xstage.compile_cache``): OpenVINO's ``cache_dir`` under the home, keyed,
verified against its manifest before each use, rebuilt when it does not verify; the proof and
the gate run on every open, hit or miss. Real workers through ``ort-openvino``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import xstage
from xstage import builtin_graphs, compile_cache
from xstage.cli.main import main


@pytest.fixture
def ov(monkeypatch, openvino_python, xstage_home):
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(openvino_python))
    return xstage_home


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("g")
    return builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), folder / "mlp.onnx")


def _open(graph: Path, **kw) -> dict:
    with xstage.open_stage(graph, route="ort-openvino", record_on_close=False, **kw) as stage:
        rec = stage.record()
    assert rec["proof"]["verdict"] == "placed" and rec["parity"]["verdict"] == "passed"  # every open
    return rec["worker"]["compile_cache"]


def test_a_miss_is_sealed_then_hit_and_a_tampered_entry_is_rebuilt(ov, mlp):
    first = _open(mlp)
    assert first["status"] == "miss" and first["files"] >= 1 and first["bytes"] > 0
    folder = Path(first["folder"])
    assert folder.parent == ov / "cache" / "compiled" and folder.name == first["key"]
    manifest = json.loads((folder / "manifest.json").read_text())
    blobs = sorted((folder / "files").rglob("*.blob"))
    assert blobs and set(manifest["files"]) == {p.relative_to(folder / "files").as_posix()
                                                  for p in (folder / "files").rglob("*") if p.is_file()}
    assert manifest["inputs"]["route"] == "ort-openvino"
    assert "cache_dir" not in manifest["inputs"]["ep_options"]

    second = _open(mlp)
    assert second["status"] == "hit" and second["key"] == first["key"] and second["reason"] is None

    blob = blobs[0]  # attack: a blob changed behind the manifest's back is never handed over
    blob.chmod(0o600)
    blob.write_bytes(blob.read_bytes() + b"\0")
    third = _open(mlp)
    assert third["status"] == "rebuilt"
    name = blob.relative_to(folder / "files").as_posix()
    assert third["reason"] == f"{name} is not the file that was sealed"
    assert _open(mlp)["status"] == "hit"

    (folder / "files" / "stray.blob").write_bytes(b"x")  # a file nobody sealed
    assert _open(mlp) == {**first, "status": "rebuilt", "reason": "stray.blob is not in the manifest",
                          "files": first["files"], "bytes": first["bytes"]}


def test_the_users_own_cache_dir_and_off_leave_the_home_alone(ov, mlp, tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert _open(mlp, ep_options={"cache_dir": str(mine)})["status"] == "user"
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert _open(mlp)["status"] == "off"
    assert not (ov / "cache" / "compiled").exists() or not any((ov / "cache" / "compiled").iterdir())


def test_cache_list_and_clear_show_and_remove_the_entries(ov, mlp, capsys):
    key = _open(mlp)["key"]
    capsys.readouterr()
    assert main(["cache", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["compiled"]
    assert [(e["key"], e["route"], e["sealed"]) for e in listed] == [(key, "ort-openvino", True)]
    assert main(["cache", "clear", "--compiled", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["removed_compiled"] == [key] and doc["removed"] == []
    assert compile_cache.list_entries() == []


def _route(**versions):
    spec = SimpleNamespace(compile_cache=(("cache_dir", "{dir}"),))
    return SimpleNamespace(name="ort-openvino", spec=spec, versions={"onnxruntime": "1.24.1", **versions})


def _options(**ep):
    return {"device": "cpu", "session": {}, "ep": {"name": "OpenVINOExecutionProvider",
                                                    "options": {"device_type": "CPU", **ep}}}


@pytest.mark.parametrize(("route", "options", "artifact_sha"), [
    (_route(onnxruntime="1.25.0"), _options(), "a" * 64),  # another runtime version
    (_route(), _options(num_streams="2"), "a" * 64),  # an option that changes compilation
    (_route(), _options(), "b" * 64),  # other bytes
])
def test_the_key_changes_with_what_changes_compilation(xstage_home, route, options, artifact_sha):
    art = SimpleNamespace(sha256="a" * 64, format="onnx:fp32", runtime="onnxruntime")
    base = compile_cache.prepare(_route(), art, _options())
    other_art = SimpleNamespace(sha256=artifact_sha, format="onnx:fp32", runtime="onnxruntime")
    other = compile_cache.prepare(route, other_art, options)
    assert base.key != other.key
    assert options["ep"]["options"]["cache_dir"] == str(Path(other.folder) / "files")
    same = compile_cache.prepare(_route(python="3.12.0"), art, _options())  # python is not in the key
    assert same.key == base.key
