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


def _reads_its_cache(python: Path) -> bool:
    """Whether the env's OpenVINO can read a CPU cache blob back: the blob is an IR model, and
    onnxruntime-openvino 1.24.1 ships OpenVINO's ONNX reader only (docs/performance.md,
    compile_cache)."""
    site = sorted(python.parent.parent.glob("lib/python3*/site-packages"))[0]
    return any(site.glob("onnxruntime*/**/libopenvino_ir_frontend*"))


def _ident(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_a_miss_is_sealed_and_a_tampered_entry_is_rebuilt(ov, mlp, openvino_python):
    first = _open(mlp)
    assert first["status"] == "miss" and first["files"] >= 1 and first["bytes"] > 0
    folder = Path(first["folder"])
    assert folder.parent == ov / "cache" / "compiled" and folder.name == first["key"]
    manifest = json.loads((folder / "manifest.json").read_text())
    blobs = sorted((folder / "files").rglob("*.blob"))
    assert blobs and set(manifest["files"]) == {p.relative_to(folder / "files").as_posix()
                                                  for p in (folder / "files").rglob("*") if p.is_file()}
    assert manifest["inputs"]["route"] == "ort-openvino"
    assert "cache_dir" not in manifest["inputs"]["ep_options"] and "unread" not in manifest

    blob = blobs[0]  # attack: a blob changed behind the manifest's back is never handed over
    blob.chmod(0o600)
    blob.write_bytes(blob.read_bytes() + b"\0")
    second = _open(mlp)
    assert second["status"] == "rebuilt"
    name = blob.relative_to(folder / "files").as_posix()
    assert second["reason"] == f"{name} is not the file that was sealed"
    warm = "hit" if _reads_its_cache(openvino_python) else "unread"
    assert _open(mlp)["status"] == warm  # verified and handed over (rule 6 says what the runtime did)

    (folder / "files" / "stray.blob").write_bytes(b"x")  # a file nobody sealed
    assert _open(mlp) == {**first, "status": "rebuilt", "reason": "stray.blob is not in the manifest",
                          "files": first["files"], "bytes": first["bytes"]}


def test_a_runtime_that_compiles_again_is_unread_then_not_handed_over(ov, mlp, openvino_python):
    """Attack (rule 6): onnxruntime-openvino 1.24.1's OpenVINO cannot read its CPU blob back; it
    removed it, compiled again and wrote it anew on every warm open while the record said hit."""
    if _reads_its_cache(openvino_python):
        pytest.skip("this env's OpenVINO reads its cache back (the hit path is tested below)")
    first = _open(mlp)
    folder = Path(first["folder"])
    blob = sorted((folder / "files").rglob("*.blob"))[0]
    sealed = _ident(blob)
    second = _open(mlp)
    assert second["status"] == "unread" and _ident(blob) != sealed  # the runtime wrote it anew
    name = blob.relative_to(folder / "files").as_posix()
    assert second["reason"] == (f"the runtime compiled again and wrote {name} anew instead of reading "
                                "it; the entry is not handed over again under this key "
                                "(xstage cache clear --compiled tries again)")
    mark = json.loads((folder / "manifest.json").read_text())["unread"]
    assert mark["file"] == name
    assert [e.unread for e in compile_cache.list_entries()] == [mark["at"]]  # xstage cache list
    kept = _ident(blob)
    third = _open(mlp)  # not handed over: the runtime compiles without it and leaves it alone
    assert third["status"] == "unreadable" and _ident(blob) == kept
    assert third["reason"] == (f"the runtime compiled again instead of reading {name} ({mark['at']}): "
                               "not handed over (xstage cache clear --compiled tries again)")
    assert (third["key"], third["files"], third["bytes"]) == (first["key"], first["files"], first["bytes"])
    compile_cache.clear()
    assert _open(mlp)["status"] == "miss"


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


def _compiles(folder: Path, data: bytes = b"blob") -> Path:
    """What a runtime does with the folder it is handed when it compiles: writes its file anew."""
    path = folder / "model.blob"
    if path.exists():
        path.unlink()
    path.write_bytes(data)
    return path


def test_a_hit_is_what_the_runtime_did_with_the_folder(xstage_home):
    """Rule 6 on the entry alone: a runtime that reads its files leaves them (hit); one that
    writes them anew makes the open unread, and the entry is not handed over again."""
    art = SimpleNamespace(sha256="c" * 64, format="onnx:fp32", runtime="onnxruntime")
    miss = compile_cache.prepare(_route(), art, _options())
    _compiles(Path(miss.options["cache_dir"]))
    miss.seal()
    assert miss.status == "miss" and miss.files == 1

    hit = compile_cache.prepare(_route(), art, _options())
    assert hit.status == "hit" and set(hit.handed) == {"model.blob"}
    hit.seal()  # the runtime read the file and left it
    assert hit.status == "hit" and hit.reason is None

    options = _options()
    again = compile_cache.prepare(_route(), art, options)
    assert again.status == "hit" and options["ep"]["options"]["cache_dir"] == again.options["cache_dir"]
    _compiles(Path(again.options["cache_dir"]))  # the same bytes, written anew: a full compile
    again.seal()
    assert again.status == "unread" and again.reason is not None and "model.blob anew" in again.reason
    assert again.to_dict()["status"] == "unread"

    options = _options()
    after = compile_cache.prepare(_route(), art, options)
    assert (after.status, after.options, after.files) == ("unreadable", {}, 1)
    assert "cache_dir" not in options["ep"]["options"]
    after.seal()  # nothing handed over, nothing written
    assert after.status == "unreadable"
    assert compile_cache.prepare(_route(onnxruntime="1.25.0"), art, _options()).status == "miss"


def test_an_entry_the_runtime_wrote_nothing_into_is_no_hit(xstage_home):
    """A runtime that ignores the cache option compiles and writes nothing: the next open has
    nothing to read, so it is a miss that says why, not a hit (seen with the OpenVINO plugin EP,
    which ignores ``cache_dir``)."""
    art = SimpleNamespace(sha256="d" * 64, format="onnx:fp32", runtime="onnxruntime")
    first = compile_cache.prepare(_route(), art, _options())
    first.seal()  # the runtime wrote no file
    assert (first.status, first.files) == ("miss", 0)
    second = compile_cache.prepare(_route(), art, _options())
    assert second.status == "miss" and "no file" in (second.reason or "")
    _compiles(Path(second.options["cache_dir"]))
    second.seal()
    assert compile_cache.prepare(_route(), art, _options()).status == "hit"


def _plugin_route():
    spec = SimpleNamespace(compile_cache=(("cache_dir", "{dir}"),),
                           plugin_compile_cache=(("load_config:CACHE_DIR", "{dir}"),))
    return SimpleNamespace(name="ort-openvino", spec=spec, versions={"onnxruntime": "1.30.0"})


def _plugin_options(load_config):
    return {"device": "cpu", "session": {}, "ep": {
        "name": "OpenVINOExecutionProvider", "plugin": {"module": "onnxruntime_ep_openvino"},
        "options": {"load_config": json.dumps(load_config)}}}


def test_the_openvino_plugin_ep_gets_its_cache_in_load_config(xstage_home):
    """The plugin EP reads CACHE_DIR from load_config's device section (it ignores
    ``cache_dir``): the section keeps what the route's hook put there, the key does not depend
    on the folder, and a CACHE_DIR of the user's own is theirs (``user``)."""
    art = SimpleNamespace(sha256="e" * 64, format="onnx:fp32", runtime="onnxruntime")
    options = _plugin_options({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}})
    entry = compile_cache.prepare(_plugin_route(), art, options)
    folder = str(Path(entry.folder) / "files")
    assert entry.status == "miss" and entry.options == {"load_config:CACHE_DIR": folder}
    ep_options = options["ep"]["options"]
    assert "cache_dir" not in ep_options
    assert json.loads(ep_options["load_config"]) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "f32", "CACHE_DIR": folder}}
    hint = {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    again = compile_cache.prepare(_plugin_route(), art, _plugin_options(hint))
    assert again.key == entry.key
    npu = _plugin_options({})
    npu["device"] = "npu:intel:0"
    compile_cache.prepare(_plugin_route(), art, npu)
    assert set(json.loads(npu["ep"]["options"]["load_config"])) == {"NPU"}
    users = _plugin_options({"CPU": {"CACHE_DIR": "/somewhere/of/theirs"}})
    assert compile_cache.prepare(_plugin_route(), art, users).status == "user"
    assert json.loads(users["ep"]["options"]["load_config"]) == {"CPU": {"CACHE_DIR": "/somewhere/of/theirs"}}


@pytest.mark.parametrize("load_config", ["notjson", "[1, 2]", '{"CPU": 3}'])
def test_a_load_config_the_cache_cannot_go_into_leaves_the_cache_out(xstage_home, load_config):
    """A user's own malformed ``load_config`` is no place for the plugin's CACHE_DIR: the cache
    is off, saying why, the option goes to the runtime as given (which judges it), and nothing
    raises here."""
    art = SimpleNamespace(sha256="f" * 64, format="onnx:fp32", runtime="onnxruntime")
    options = _plugin_options({})
    options["ep"]["options"]["load_config"] = load_config
    entry = compile_cache.prepare(_plugin_route(), art, options)
    assert entry.status == "off" and "load_config" in (entry.reason or "")
    assert options["ep"]["options"]["load_config"] == load_config


def test_an_entry_another_open_is_compiling_into_is_left_to_it(xstage_home):
    """Rule 7: a second open of the same key while the first compiles into the entry (its
    runtime has written part of it, nothing sealed) neither empties the entry nor writes into it:
    it compiles without the cache, saying so. The first seals what its runtime wrote, and the
    next opens hit it, two at once. ``clear`` leaves an entry being built or read."""
    art = SimpleNamespace(sha256="1" * 64, format="onnx:fp32", runtime="onnxruntime")
    first = compile_cache.prepare(_route(), art, _options())
    blob = _compiles(Path(first.options["cache_dir"]))
    options = _options()
    second = compile_cache.prepare(_route(), art, options)
    assert (second.status, second.key, second.folder) == ("off", first.key, None)
    assert second.reason == compile_cache.BUILDING and "cache_dir" not in options["ep"]["options"]
    assert blob.read_bytes() == b"blob"  # the first open's file, untouched
    second.seal()
    second.discard()  # neither touches the entry
    assert compile_cache.clear() == [] and blob.exists()
    first.seal()
    assert (first.status, first.files) == ("miss", 1)
    third = compile_cache.prepare(_route(), art, _options())
    fourth = compile_cache.prepare(_route(), art, _options())  # two readers at once
    assert (third.status, fourth.status) == ("hit", "hit")
    assert compile_cache.clear() == [] and blob.exists()  # read now: left
    third.seal()
    fourth.seal()
    assert compile_cache.clear() == [first.key] and not blob.exists()


def test_an_entry_whose_builder_died_is_rebuilt(xstage_home):
    """A builder that ended without sealing let go of the build lock with its process (here: its
    lock file closed): the next open finds an entry that does not verify and rebuilds it."""
    art = SimpleNamespace(sha256="2" * 64, format="onnx:fp32", runtime="onnxruntime")
    dead = compile_cache.prepare(_route(), art, _options())
    _compiles(Path(dead.options["cache_dir"]), b"half")
    dead.building.close()  # what the process's end does
    after = compile_cache.prepare(_route(), art, _options())
    assert after.status == "rebuilt" and after.reason is not None
    assert not any(Path(after.options["cache_dir"]).iterdir())  # emptied for this build
    after.discard()
    assert not Path(after.folder).exists()
