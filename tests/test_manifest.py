"""Manifests are validated before anything in them is used: keys, types, paths, hashes."""

from __future__ import annotations

import json

import pytest

from xstage import builtin_graphs, errors
from xstage.artifact import inspect_artifact
from xstage.manifest import (
    find_manifest,
    legacy_manifest_path,
    read_manifest,
    validate_manifest,
    write_manifest,
)


def _export(tmp_path, **over):
    path = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "tower.onnx")
    kwargs = dict(component="vision_tower", fmt="onnx:fp32", files=[path],
                  source={"kind": "config", "config": "tiny"}, exporter={"xstage": "test"},
                  inputs=[{"name": "x", "dtype": "float32", "shape": [8, 256]}],
                  outputs=[{"name": "y", "dtype": "float32", "shape": [8, 256]}], opset=17)
    kwargs.update(over)
    return path, write_manifest(path, **kwargs)


def test_written_manifest_reads_back_and_lists_hashed_files(tmp_path):
    path, where = _export(tmp_path)
    doc = read_manifest(where)
    (entry,) = doc["files"]
    art = inspect_artifact(path)
    assert entry == {"path": "tower.onnx", "sha256": art.files[0]["sha256"], "bytes": art.bytes}
    assert doc["kind"] == "xstage.artifact" and doc["manifest_version"] == 1


_STREAM = {"input": "x", "output": "y", "chunk": 256, "left_context": 4, "samples_per_frame": 1,
           "lookahead_samples": 0}


def test_a_stream_block_that_fits_the_signature_reads_back(tmp_path):
    _, where = _export(tmp_path, stream=_STREAM)
    assert read_manifest(where)["stream"] == _STREAM


def _mutated(tmp_path, change):
    path, where = _export(tmp_path)
    doc = json.loads(where.read_text())
    change(doc)
    where.write_text(json.dumps(doc))
    return path, where


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(extra=1), "unknown keys"),
    (lambda d: d.pop("component"), "lacks 'component'"),
    (lambda d: d.update(format="onnx:int4"), "format 'onnx:int4'"),
    (lambda d: d.update(opset="21"), "'opset' has the wrong type"),
    (lambda d: d.update(manifest_version=2), "manifest_version 2"),
    (lambda d: d.update(kind="other"), "kind is 'other'"),
    (lambda d: d.update(files=[]), "lists no files"),
    (lambda d: d["files"][0].update(sha256="xyz"), "bad path or sha256"),
    (lambda d: d["files"].append(dict(d["files"][0])), "listed twice"),
    (lambda d: d["files"][0].update(path="../outside.onnx"), "escapes its folder"),
    (lambda d: d["files"][0].update(path="/etc/passwd"), "escapes its folder"),
    (lambda d: d["files"][0].update(path="C:/x.onnx"), "escapes its folder"),
    (lambda d: d.update(fp32_source="../../fp32.onnx"), "fp32_source '../../fp32.onnx' escapes"),
    (lambda d: d.update(inputs=[{"name": "x"}]), "inputs must be"),
    # dims: whole numbers in [0, 2^40] or a symbolic name; before, -4, [4] and true passed here
    # and broke later as a raw ValueError or TypeError
    (lambda d: d["inputs"][0].update(shape=[-4, 256]), r"inputs 'x' has shape \[-4, 256\]: each "
     r"dim must be a whole number from 0 to 2\^40 or a symbolic name, not -4"),
    (lambda d: d["inputs"][0].update(shape=[[4], 256]), r"not \[4\]"),
    (lambda d: d["outputs"][0].update(shape=[True, 256]), r"outputs 'y' .* not true"),
    (lambda d: d["outputs"][0].update(shape=[8, 2.5]), r"not 2.5"),
    (lambda d: d["outputs"][0].update(shape=[8, None]), r"not null"),
    (lambda d: d["inputs"][0].update(shape=[8, ""]), r"not \"\""),
    (lambda d: d["inputs"][0].update(shape=[8, 1 << 41]), r"not 2199023255552"),
    (lambda d: d["inputs"][0].update(shape=[1 << 21, 1 << 20]), r"more than 2\^40 elements"),
    (lambda d: d["inputs"][0].update(shape=[1] * 33), r"rank 33, more than 32"),
    # a windowed decoder's stream block (docs/export.md, the streaming window): x [8, 256] as 256
    # frames, y as their audio
    (lambda d: d.update(stream=dict(_STREAM, chunk="256")), "stream needs non-negative integers"),
    (lambda d: d.update(stream=dict(_STREAM, output="wav")), "stream input 'x' and output 'wav'"),
    (lambda d: d.update(stream=dict(_STREAM, lookahead_samples=1)),
     r"stream: x \[8, 256\] and y \[8, 256\] are not a chunk of 256 frames and its 255 samples"),
])
def test_rejects_bad_manifests_before_using_them(tmp_path, change, message):
    path, _ = _mutated(tmp_path, change)
    with pytest.raises(errors.ArtifactError, match=message):
        inspect_artifact(path)


def test_symbolic_and_empty_dims_still_read(tmp_path):
    """A graph's symbolic names (any spelling, ``?`` for unknown) and a dim of 0 (an empty
    context) are valid shapes."""
    def change(d):
        d["inputs"][0]["shape"] = ["batch size", 256]
        d["outputs"][0]["shape"] = ["?", 0]
    _, where = _mutated(tmp_path, change)
    doc = read_manifest(where)
    assert doc["inputs"][0]["shape"] == ["batch size", 256] and doc["outputs"][0]["shape"] == ["?", 0]


def test_rejects_a_file_that_changed_after_export(tmp_path):
    path, where = _export(tmp_path)
    builtin_graphs.write(builtin_graphs.mlp(seed=5), path)  # re-exported over it, manifest stale
    with pytest.raises(errors.ArtifactError, match="does not match"):
        inspect_artifact(path)


def test_rejects_a_manifest_that_does_not_list_its_graph(tmp_path):
    path, where = _export(tmp_path)
    other = builtin_graphs.write(builtin_graphs.mlp(seed=3), tmp_path / "other.onnx")
    doc = json.loads(where.read_text())
    doc["files"] = [{"path": "other.onnx", "sha256": inspect_artifact(other).sha256,
                     "bytes": other.stat().st_size}]
    where.write_text(json.dumps(doc))
    with pytest.raises(errors.ArtifactError, match="does not list tower.onnx"):
        inspect_artifact(path)


def test_rejects_a_listed_file_that_is_missing(tmp_path):
    path, where = _export(tmp_path)
    doc = json.loads(where.read_text())
    doc["files"].append({"path": "tower.onnx.data", "sha256": "0" * 64, "bytes": 1})
    where.write_text(json.dumps(doc))
    with pytest.raises(errors.ArtifactError, match="tower.onnx.data, which is missing"):
        inspect_artifact(path)


def test_validate_names_the_manifest(tmp_path):
    with pytest.raises(errors.ArtifactError, match="m.json: is not a JSON object"):
        validate_manifest([], tmp_path / "m.json")


def _fp16_weights(model):
    """fp16 weights, each cast to float32 where it is used (fp32 I/O): an onnx:fp16 graph."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    casts = []
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            name = init.name
            init.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype("float16"), name + "_fp16"))
            casts.append(helper.make_node("Cast", [name + "_fp16"], [name], to=TensorProto.FLOAT))
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def test_fp32_source_from_the_manifest_is_the_reference(tmp_path):
    """An fp16 artifact is gated against its fp32 source, named by the manifest."""
    from xstage.stage import open_stage

    fp32 = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "tower-fp32.onnx")
    path = builtin_graphs.write(_fp16_weights(builtin_graphs.mlp()), tmp_path / "tower.onnx")
    write_manifest(path, component="vision_tower", fmt="onnx:fp16", files=[path],
                   source={"kind": "config"}, exporter={}, inputs=[], outputs=[],
                   fp32_source=fp32.name)
    with open_stage(path, route="ort-cpu") as st:
        assert st.parity.to_dict()["reference_kind"] == "fp32_source"


def test_the_manifest_is_named_after_the_whole_file(tmp_path):
    path, where = _export(tmp_path)
    assert where.name == "tower.onnx.manifest.json" and find_manifest(path) == where


def test_an_earlier_stem_manifest_is_read_only_when_it_lists_this_file(tmp_path):
    path, where = _export(tmp_path)
    legacy = legacy_manifest_path(path)
    where.rename(legacy)  # the earlier layout, listing tower.onnx: still this graph's
    assert legacy.name == "tower.manifest.json" and find_manifest(path) == legacy
    assert inspect_artifact(path).format_source == "manifest"
    doc = json.loads(legacy.read_text())
    doc["files"] = [{**doc["files"][0], "path": "tower.pt2"}]  # another format's, same stem
    doc["format"] = "pt:fp32"
    legacy.write_text(json.dumps(doc))
    assert find_manifest(path) is None
    art = inspect_artifact(path)  # opens: the stem's manifest is the .pt2's, not this graph's
    assert art.format == "onnx:fp32" and art.format_source == "inferred"


def test_two_formats_of_one_stem_keep_their_own_manifests(tmp_path):
    onnx_path, onnx_manifest = _export(tmp_path)
    pt = tmp_path / "tower.pt2"
    pt.write_bytes(b"not read here")
    pt_manifest = write_manifest(pt, component="vision_tower", fmt="pt:fp32", files=[pt],
                                 source={"kind": "config"}, exporter={"xstage": "test"},
                                 inputs=[], outputs=[])
    assert pt_manifest.name == "tower.pt2.manifest.json" and onnx_manifest.is_file()
    assert find_manifest(onnx_path) == onnx_manifest and find_manifest(pt) == pt_manifest
    assert inspect_artifact(onnx_path).format_source == "manifest"


def test_an_unreadable_stem_manifest_is_an_artifact_error(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "tower.onnx")
    legacy_manifest_path(path).write_text("{not json")
    with pytest.raises(errors.ArtifactError, match="tower.manifest.json is not readable JSON"):
        inspect_artifact(path)
