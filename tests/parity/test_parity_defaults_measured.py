"""The measurements behind the fp16 and A16W8 defaults (the comments in xstage/parity.py).

Each test reproduces one number a default is justified by, on the built-in MLP with this
interpreter's onnxruntime CPU EP, and checks that the default admits it with headroom and
that the next-tighter default would refuse it. Run with ``-s`` to see the numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from parity_graphs import mlp_fp16, mlp_input, run_cpu

from xstage import builtin_graphs
from xstage.parity import compare, default_tolerance


@pytest.fixture(scope="module")
def a16w8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The built-in MLP (fp32) and its A16W8 QDQ quantization (QUInt16 activations, QInt8 weights)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    folder = tmp_path_factory.mktemp("a16w8")
    source = builtin_graphs.write(builtin_graphs.mlp(), folder / "mlp.onnx")
    target = folder / "mlp.a16w8.onnx"

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(7)
            self._feeds = iter([{"x": rng.standard_normal((8, 256)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self._feeds, None)

    quantize_static(
        str(source), str(target), Calibration(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt16, weight_type=QuantType.QInt8, per_channel=False,
    )
    return source, target


def test_fp16_artifact_against_its_fp32_source():
    """fp16 vs its fp32 source: rel_l2 ~4.9e-4 passes the fp16 default, fails the fp32 one.

    This is also the number that puts the fp32 default (1e-4) below fp16 compute.
    """
    model = builtin_graphs.mlp()
    x = mlp_input()
    (reference,) = run_cpu(model.SerializeToString(), {"x": x})
    (half,) = run_cpu(mlp_fp16(model).SerializeToString(), {"x": x.astype(np.float16)})
    output = half  # float16, read against the float32 source (rule 2's exception)
    parity = compare({"y": output}, {"y": reference}, fmt="onnx:fp16", reference_kind="fp32_source")
    (m,) = parity.outputs
    print(f"\nfp16 MLP vs fp32 source: {m.criterion}; max_abs/rms {m.max_abs / m.rms_ref:.2e}")
    assert parity.passed and m.rule == "rel_l2"
    assert 1e-4 < m.rel_l2 < default_tolerance("onnx:fp16", "fp32_source").rel_l2 / 5
    widened = output.astype(np.float32)  # as if an fp32 artifact had computed in fp16
    as_fp32 = compare({"y": widened}, {"y": reference}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert as_fp32.cause == "tolerance" and as_fp32.outputs[0].rule == "rel_l2"


def test_a16w8_artifact_against_its_fp32_source(a16w8):
    """A16W8 vs fp32 source: rel_l2 ~2.2e-2 passes the A16W8 default, fails the fp16 one."""
    source, target = a16w8
    x = mlp_input()
    (reference,) = run_cpu(str(source), {"x": x})
    (output,) = run_cpu(str(target), {"x": x})
    parity = compare({"y": output}, {"y": reference}, fmt="onnx:a16w8", reference_kind="fp32_source")
    (m,) = parity.outputs
    print(f"\nA16W8 MLP vs fp32 source: {m.criterion}; max_abs/rms {m.max_abs / m.rms_ref:.2e}")
    assert parity.passed and m.rule == "rel_l2"
    assert 5e-3 < m.rel_l2 < default_tolerance("onnx:a16w8", "fp32_source").rel_l2 / 3
    as_fp16 = compare({"y": output}, {"y": reference}, fmt="onnx:fp16", reference_kind="fp32_source")
    assert as_fp16.cause == "tolerance"


def test_a16w8_same_graph_fused_against_simulated(a16w8):
    """The same QDQ graph, fused integer kernels (ENABLE_ALL) vs simulated (DISABLE_ALL).

    rel_l2 ~9e-3: two legitimate realizations of one quantized graph. It passes the A16W8
    same-graph default and would fail the fp32 one.
    """
    _, target = a16w8
    x = mlp_input()
    (reference,) = run_cpu(str(target), {"x": x}, "ORT_ENABLE_ALL")
    (output,) = run_cpu(str(target), {"x": x}, "ORT_DISABLE_ALL")
    parity = compare({"y": output}, {"y": reference}, fmt="onnx:a16w8", reference_kind="same_graph_cpu")
    (m,) = parity.outputs
    print(f"\nA16W8 MLP, DISABLE_ALL vs ENABLE_ALL: {m.criterion}; max_abs/rms {m.max_abs / m.rms_ref:.2e}")
    assert parity.passed
    assert 1e-3 < m.rel_l2 < default_tolerance("onnx:a16w8", "same_graph_cpu").rel_l2 / 2
    widened = output.astype(np.float32)  # as if an fp32 artifact had computed in fp16
    as_fp32 = compare({"y": widened}, {"y": reference}, fmt="onnx:fp32", reference_kind="same_graph_cpu")
    assert as_fp32.cause == "tolerance" and as_fp32.outputs[0].rule == "rel_l2"


def test_a16w8_graph_really_is_quantized(a16w8):
    """The artifact the two tests above measure holds Q/DQ pairs with 16-bit activations."""
    _, target = a16w8
    model = onnx.load(str(target))
    ops = {node.op_type for node in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    zero_points = [i for i in model.graph.initializer if i.name.endswith("zero_point")]
    assert any(i.data_type == onnx.TensorProto.UINT16 for i in zero_points)
    assert any(i.data_type == onnx.TensorProto.INT8 for i in zero_points)
