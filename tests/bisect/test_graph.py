"""The bisect graph: stable order, names, cuts (QDQ: only between a Q and its DQ), regions, costs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from chains import chain
from onnx import TensorProto, helper, numpy_helper

from xstage import errors
from xstage.bisect.cost import node_flops, shares
from xstage.bisect.graph import capture, load_graph


def _save(model: onnx.ModelProto, tmp_path, name: str = "g.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _diamond() -> onnx.ModelProto:
    """x → a, b (two branches) → Add; the file lists the nodes out of order, names repeated."""
    w = numpy_helper.from_array(np.arange(4, dtype="f4").reshape(2, 2), "w")
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="same"),
             helper.make_node("MatMul", ["x", "w"], ["a"], name="same"),
             helper.make_node("Relu", ["x"], ["b"], name="")]
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_order_is_topological_stable_and_names_map_to_one_position(tmp_path) -> None:
    g = load_graph(_save(_diamond(), tmp_path), "onnx:fp32")
    assert [n.op_type for n in g.nodes] == ["MatMul", "Relu", "Add"]
    assert [n.index for n in g.nodes] == [1, 2, 0]
    assert g.renamed == 2  # the second "same" and the empty name
    assert len({n.name for n in g.nodes}) == 3
    assert all(g.position[n.name] == n.position for n in g.nodes)


def test_a_node_reading_an_undefined_value_is_an_artifact_error(tmp_path) -> None:
    model = chain(3, [])
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(errors.ArtifactError, match="nowhere"):
        load_graph(_save(model, tmp_path), "onnx:fp32")


def test_regions_compute_what_the_whole_graph_computed(tmp_path) -> None:
    g = load_graph(_save(_diamond(), tmp_path), "onnx:fp32")
    x = np.random.default_rng(0).standard_normal((2, 2)).astype("f4")
    values = capture(g, {"x": x})
    for start, stop in [(0, 1), (1, 3), (0, 3), (2, 3)]:
        inputs, outputs = g.write_region(start, stop, tmp_path / f"r{start}{stop}.onnx", values)
        session = ort.InferenceSession(str(tmp_path / f"r{start}{stop}.onnx"),
                                       providers=["CPUExecutionProvider"])
        got = session.run(outputs, {n: values[n] for n in inputs})
        for name, value in zip(outputs, got, strict=True):
            np.testing.assert_array_equal(value, values[name])
    assert g.boundary(2, 3) == (["a", "b"], ["y"])
    assert g.boundary(0, 1) == (["x"], ["a"])


def _qdq_mlp(tmp_path):
    """An A16W8 MLP made by xstage quantize (weights' DQ first in the file, as it writes them)."""
    from xstage import builtin_graphs
    from xstage.export.quantize import quantize_a16w8

    src = builtin_graphs.write(builtin_graphs.mlp(width=16, depth=2, batch=2), tmp_path / "mlp.onnx")
    quantize_a16w8(src, tmp_path / "mlp-a16w8.onnx", synthetic=4)
    return tmp_path / "mlp-a16w8.onnx"


def test_a_qdq_graph_is_cut_only_between_a_q_and_its_dq(tmp_path) -> None:
    g = load_graph(_qdq_mlp(tmp_path), "onnx:a16w8")
    values = capture(g, {"x": np.random.default_rng(0).standard_normal((2, 16)).astype("f4")})
    cuts = g.cuts(values)
    assert cuts[0] == 0 and cuts[-1] == len(g) and len(cuts) > 2
    for cut in cuts[1:-1]:
        inputs, _ = g.boundary(cut, len(g))
        crossing = [n for n in inputs if n not in g.inputs]
        assert crossing and all(g.nodes[g._producer[n]].op_type == "QuantizeLinear" for n in crossing)
        assert g.nodes[cut].op_type == "DequantizeLinear"
    # the weights' DequantizeLinear sit just before their Gemm, not first in the file
    assert g.nodes[0].op_type == "QuantizeLinear"


def test_a_region_of_a_qdq_graph_passes_the_parents_format_check(tmp_path) -> None:
    from xstage.artifact import inspect_artifact

    g = load_graph(_qdq_mlp(tmp_path), "onnx:a16w8")
    values = capture(g, {"x": np.random.default_rng(0).standard_normal((2, 16)).astype("f4")})
    cuts = g.cuts(values)
    g.write_region(cuts[1], cuts[2], tmp_path / "region.onnx", values)
    assert inspect_artifact(tmp_path / "region.onnx", fmt="onnx:a16w8").format == "onnx:a16w8"


def test_flops_follow_the_issue_formulas() -> None:
    assert node_flops("MatMul", [(3, 4, 5), (5, 6)], [(3, 4, 6)]) == 2 * 3 * 4 * 6 * 5
    assert node_flops("Gemm", [(4, 5), (5, 6)], [(4, 6)]) == 2 * 4 * 6 * 5
    assert node_flops("Gemm", [(5, 4), (5, 6)], [(4, 6)]) == 2 * 4 * 6 * 5  # transA
    # Conv: 2 · output elements · C_in/group · kernel elements
    assert node_flops("Conv", [(1, 8, 10, 10), (16, 4, 3, 3)], [(1, 16, 8, 8)]) == 2 * 16 * 64 * 4 * 9
    assert node_flops("Relu", [(2, 3)], [(2, 3)]) == 6
    assert node_flops("Relu", [None], [None]) == 0


def test_shares_count_each_initializer_once(tmp_path) -> None:
    g = load_graph(_save(_diamond(), tmp_path), "onnx:fp32")
    values = capture(g, {"x": np.ones((2, 2), "f4")})
    costs = g.costs(values)
    whole = shares(costs, 0, 3).to_dict()
    assert whole["params"] == whole["params_total"] == 4
    assert whole["flops_total"] == 2 * 2 * 2 * 2 + 4 + 4
    first = shares(costs, 0, 1).to_dict()
    assert first["param_share"] == 1.0 and first["node_share"] == pytest.approx(1 / 3)
