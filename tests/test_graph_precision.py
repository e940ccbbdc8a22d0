"""A format is what the graph computes (``xstage.graph_precision``): per output, A16W8 only where
every compute op on its path takes 8-bit weights and 16-bit activations through Q/DQ; the random
ops a graph holds."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs, errors, graph_precision
from xstage.artifact import inspect_artifact

V = helper.make_tensor_value_info


def _model(nodes, inits, outputs=("y",), opset=21):
    graph = helper.make_graph(nodes, "g", [V("x", TensorProto.FLOAT, [2, 4])],
                              [V(o, TensorProto.FLOAT, [2, 4]) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _qdq(name, src, bits=16):
    """``src`` → Q → DQ (activation, ``bits`` wide), and its constants."""
    dtype = {16: np.uint16, 8: np.uint8}[bits]
    inits = [numpy_helper.from_array(np.array(0.01, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(0, dtype), f"{name}_z")]
    return ([helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])],
            inits)


def _weight(name, dtype=np.int8):
    inits = [numpy_helper.from_array(np.ones((4, 4), dtype), name),
             numpy_helper.from_array(np.array(0.1, np.float32), f"{name}_s")]
    return [helper.make_node("DequantizeLinear", [name, f"{name}_s"], [f"{name}_dq"])], inits


def _quantized_matmul(prefix, src, out):
    q, qi = _qdq(prefix, src)
    w, wi = _weight(f"{prefix}w")
    return q + w + [helper.make_node("MatMul", [f"{prefix}_dq", f"{prefix}w_dq"], [out])], qi + wi


def _write(tmp_path, model, name="g.onnx"):
    return builtin_graphs.write(model, tmp_path / name)


def test_every_matmul_quantized_is_a16w8(tmp_path):
    nodes, inits = _quantized_matmul("a", "x", "m")
    more, more_inits = _quantized_matmul("b", "m", "y")
    art = inspect_artifact(_write(tmp_path, _model(nodes + more, inits + more_inits)))
    assert (art.format, dict(art.output_formats)) == ("onnx:a16w8", {})


def test_a_lone_16_bit_pair_on_an_fp32_graph_is_fp32_and_declaring_a16w8_is_a_usage_error(tmp_path):
    """The attack: one Q/DQ pair on an fp32 MLP made every output A16W8 (its ~300x looser
    tolerance, no OpenVINO f32 pin)."""
    model = builtin_graphs.mlp(width=16, depth=2, batch=2)
    q, qi = _qdq("lone", "y0")
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.extend([*q, helper.make_node("Identity", ["lone_dq"], ["y"])])
    model.graph.initializer.extend(qi)
    path = _write(tmp_path, model)
    assert inspect_artifact(path).format == "onnx:fp32"
    with pytest.raises(errors.UsageError, match="the graph is onnx:fp32"):
        inspect_artifact(path, fmt="onnx:a16w8")


@pytest.mark.parametrize("why", ["float weight", "16-bit weight", "unquantized activation"])
def test_one_compute_op_not_a16w8_makes_its_output_float(tmp_path, why):
    nodes, inits = _quantized_matmul("a", "x", "m")
    if why == "float weight":
        inits.append(numpy_helper.from_array(np.ones((4, 4), np.float32), "wf"))
        nodes.append(helper.make_node("MatMul", ["m", "wf"], ["y"]))
    elif why == "16-bit weight":
        w, wi = _weight("w16", np.int16)
        q, qi = _qdq("b", "m")
        nodes += w + q + [helper.make_node("MatMul", ["b_dq", "w16_dq"], ["y"])]
        inits += wi + qi
    else:
        w, wi = _weight("bw")
        nodes += w + [helper.make_node("MatMul", ["m", "bw_dq"], ["y"])]
        inits += wi
    assert inspect_artifact(_write(tmp_path, _model(nodes, inits))).format == "onnx:fp32"


def test_a_graph_with_an_a16w8_output_and_an_fp32_one_judges_each_by_its_own(tmp_path):
    nodes, inits = _quantized_matmul("a", "x", "y")
    inits.append(numpy_helper.from_array(np.ones((4, 4), np.float32), "wf"))
    nodes.append(helper.make_node("MatMul", ["x", "wf"], ["z"]))
    art = inspect_artifact(_write(tmp_path, _model(nodes, inits, outputs=("y", "z"))))
    assert (art.format, dict(art.output_formats)) == ("onnx:fp32", {"y": "onnx:a16w8"})


def test_an_output_with_no_compute_op_takes_the_artifacts_format(tmp_path):
    nodes, inits = _quantized_matmul("a", "x", "y")
    nodes.append(helper.make_node("Relu", ["x"], ["r"]))
    art = inspect_artifact(_write(tmp_path, _model(nodes, inits, outputs=("y", "r"))))
    assert (art.format, dict(art.output_formats)) == ("onnx:a16w8", {})


def test_8_bit_activations_beside_16_bit_ones_judge_the_path_by_a8w8(tmp_path):
    """A path with an A8W8 product is judged by A8W8's (looser) rules, even beside A16W8 ones;
    an output whose path has A16W8 products only keeps A16W8's."""
    nodes, inits = _quantized_matmul("a", "x", "m")
    q, qi = _qdq("b", "m", bits=8)
    w, wi = _weight("bw")
    nodes += q + w + [helper.make_node("MatMul", ["b_dq", "bw_dq"], ["y"])]
    art = inspect_artifact(_write(tmp_path, _model(nodes, inits + qi + wi, outputs=("y", "m"))))
    assert (art.format, dict(art.output_formats)) == ("onnx:a8w8", {"m": "onnx:a16w8"})


def test_random_ops_are_found_and_dropout_only_when_it_may_train():
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "on"), numpy_helper.from_array(np.array(False), "off")]
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r"], name="noise"),
             helper.make_node("Add", ["x", "r"], ["a"]),
             helper.make_node("Dropout", ["a", "ratio", "off"], ["b"], name="eval_drop"),
             helper.make_node("Dropout", ["b", "ratio", "on"], ["c"], name="train_drop"),
             helper.make_node("Dropout", ["c"], ["y"], name="plain_drop")]
    model = _model(nodes, inits, opset=17)
    assert graph_precision.onnx_random_ops(model) == ("RandomUniformLike (noise)", "Dropout (train_drop)")


def test_the_builtin_graphs_keep_their_format():
    from xstage.builtin_graphs import builtin_artifact

    for name in ("vision-tower-tiny", "code2wav-tiny", "code2wav-stream-tiny"):
        art = inspect_artifact(builtin_artifact(name))
        assert (art.format, dict(art.output_formats), art.random_ops) == ("onnx:fp32", {}, ()), name
