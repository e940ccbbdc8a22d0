"""Artifact identity and format inference: files, hashes, Q/DQ and dtypes, manifests, flags."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs, errors
from xstage.artifact import GraphNode, GraphValue, graph_facts, inspect_artifact


def _fp16_graph() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _qdq_graph(zero_point_type: int) -> onnx.ModelProto:
    """x → Q → DQ → MatMul (an int8 weight through DQ) → Relu, the activation zero point of the
    given type."""
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "scale")
    np_type = {TensorProto.UINT16: np.uint16, TensorProto.UINT8: np.uint8}[zero_point_type]
    zp = numpy_helper.from_array(np.array(0, np_type), "zp")
    w = numpy_helper.from_array(np.ones((4, 4), np.int8), "w")
    w_scale = numpy_helper.from_array(np.array(0.1, np.float32), "w_scale")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["dq"]),
         helper.make_node("DequantizeLinear", ["w", "w_scale"], ["wdq"]),
         helper.make_node("MatMul", ["dq", "wdq"], ["m"]),
         helper.make_node("Relu", ["m"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [scale, zp, w, w_scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_fp32_graph_identity_and_signature(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "mlp.onnx")
    art = inspect_artifact(path)
    assert (art.format, art.format_source, art.component) == ("onnx:fp32", "inferred", "mlp")
    assert len(art.sha256) == 64 and art.bytes == path.stat().st_size
    assert [(i.name, i.dtype, i.shape) for i in art.inputs] == [("x", "float32", (8, 256))]
    assert [o.name for o in art.outputs] == ["y"]


def test_fp16_and_a16w8_are_inferred(tmp_path):
    assert inspect_artifact(builtin_graphs.write(_fp16_graph(), tmp_path / "h.onnx")).format == "onnx:fp16"
    qdq = builtin_graphs.write(_qdq_graph(TensorProto.UINT16), tmp_path / "q16.onnx")
    assert inspect_artifact(qdq).format == "onnx:a16w8"


def test_a8w8_is_its_own_format(tmp_path):
    """8-bit activations were an error; A8W8 is now a format of its own (docs/external.md)."""
    path = builtin_graphs.write(_qdq_graph(TensorProto.UINT8), tmp_path / "q8.onnx")
    assert inspect_artifact(path).format == "onnx:a8w8"
    assert inspect_artifact(path, fmt="onnx:a8w8").format_source == "flag"
    with pytest.raises(errors.UsageError, match="the graph is onnx:a8w8"):
        inspect_artifact(path, fmt="onnx:a16w8")


def test_external_data_is_part_of_the_identity(tmp_path):
    model = builtin_graphs.mlp()
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    art = inspect_artifact(path)
    assert [f["path"].rsplit("/", 1)[-1] for f in art.files] == ["ext.onnx", "ext.onnx.data"]
    before = art.sha256
    data = tmp_path / "ext.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    assert inspect_artifact(path).sha256 != before


def test_missing_sidecar_and_escaping_sidecar_are_artifact_errors(tmp_path):
    model = builtin_graphs.mlp()
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(errors.ArtifactError, match="external data file ext.onnx.data is missing"):
        inspect_artifact(path)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../outside.data"
    onnx.save(model, tmp_path / "esc.onnx")
    with pytest.raises(errors.ArtifactError, match="escapes the graph's folder"):
        inspect_artifact(tmp_path / "esc.onnx")


def test_corrupt_and_missing_graphs_are_artifact_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    with pytest.raises(errors.ArtifactError):
        inspect_artifact(bad)
    with pytest.raises(errors.ArtifactError, match="no graph at"):
        inspect_artifact(tmp_path / "none.onnx")


def _write_manifest(path, **over):
    from xstage.manifest import write_manifest

    kwargs = dict(component="vision_tower", fmt="onnx:fp32", files=[path],
                  source={"kind": "config", "config": "tiny"}, exporter={"xstage": "test"},
                  inputs=[{"name": "x", "dtype": "float32", "shape": [8, 256]}],
                  outputs=[{"name": "y", "dtype": "float32", "shape": [8, 256]}], opset=17)
    kwargs.update(over)
    return write_manifest(path, **kwargs)


def test_manifest_names_format_and_component_and_flags_override_or_conflict(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(), tmp_path / "tower.onnx")
    where = _write_manifest(path)
    assert where.name == "tower.onnx.manifest.json"
    art = inspect_artifact(path)
    assert art.component == "vision_tower" and art.format == "onnx:fp32"
    assert art.format_source == "manifest"
    assert inspect_artifact(path, fmt="onnx:fp32").format_source == "flag"
    with pytest.raises(errors.UsageError, match="--format onnx:fp16 does not match tower.onnx: "
                       "the graph is onnx:fp32"):
        inspect_artifact(path, fmt="onnx:fp16")  # a declared format is checked against the graph
    with pytest.raises(errors.UsageError, match="conflicts with the manifest"):
        inspect_artifact(path, component="code2wav")
    where.write_text("{not json")
    with pytest.raises(errors.ArtifactError, match="manifest"):
        inspect_artifact(path)


def test_graph_facts_give_shapes_at_the_real_input_shapes_in_graph_order(tmp_path):
    """The ledger's facts: values after shape inference with the inputs fixed, nodes in order."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = builtin_graphs.write(model, tmp_path / "g.onnx")
    facts = inspect_artifact(path).graph_facts({"x": (3, 4)})
    assert facts.error is None and (facts.inputs, facts.outputs, facts.initializers) == (("x",), ("y",), ())
    assert facts.nodes == (GraphNode(("x",), ("a",)), GraphNode(("a",), ("y",)))
    assert GraphValue("a", "float16", 2, (3, 4)) in facts.values
    assert [v.name for v in facts.values][0] == "x"


def test_graph_facts_of_a_file_that_is_not_a_graph_say_why(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    facts = graph_facts(bad, {})
    assert facts.error and facts.nodes == () and facts.values == ()


def test_the_runtime_family_is_a_field_matched_against_the_route_spec(tmp_path):
    """Every onnx-or-torch branch asks ``Artifact.runtime``, the same word as ``RouteSpec.runtime``."""
    from dataclasses import replace

    from xstage.artifact import runtime_of

    assert (runtime_of("onnx:a16w8"), runtime_of("pt:fp16"), runtime_of("tflite:fp32"), runtime_of("onnx")) \
        == ("onnxruntime", "torch", None, None)
    art = inspect_artifact(builtin_graphs.builtin_stage())
    try:
        assert art.runtime == "onnxruntime"
        assert replace(art, format="pt:fp32").runtime == "torch"  # derived again, never given
        with pytest.raises(ValueError, match="init=False"):
            replace(art, runtime="torch")
        with pytest.raises(ValueError, match="of no known family"):
            replace(art, format="tflite:fp32")
    finally:
        art.release()
