"""``xstage.stage.f64_kernels``: the tie-break's BLAS kernels against onnx's own, in float64."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from xstage.stage import f64_kernels


def _model(op: str, feeds: dict[str, np.ndarray], elem: int, **attrs):
    inputs = [helper.make_tensor_value_info(n, elem, list(a.shape)) for n, a in feeds.items()]
    node = helper.make_node(op, list(feeds), ["y"], **{k: v for k, v in attrs.items() if v is not None})
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _both(op: str, feeds: dict[str, np.ndarray], theirs: bool = True, **attrs):
    """One float64 ``op`` node through ours (via new_ops) and through onnx's own kernel."""
    model = _model(op, feeds, TensorProto.DOUBLE, **attrs)
    (ours,) = ReferenceEvaluator(model, new_ops=list(f64_kernels.KERNELS)).run(None, feeds)
    return ours, (ReferenceEvaluator(model).run(None, feeds)[0] if theirs else None)


def _onnxruntime_fp32(op: str, feeds: dict[str, np.ndarray], **attrs):
    """The node on onnxruntime's CPU EP in float32 (onnx's own ConvTranspose fails on groups
    and on output_shape); the feeds are float32-exact, so only the sums' rounding differs."""
    model = _model(op, feeds, TensorProto.FLOAT, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n: a.astype(np.float32) for n, a in feeds.items()})[0]

CONV_CASES = [  # (x shape, w shape, group, strides, pads, dilations)
    ((2, 3, 9), (4, 3, 3), 1, [2], [1, 0], [1]),  # 1-D, uneven pads
    ((1, 4, 8, 7), (6, 2, 3, 3), 2, [1, 2], [1, 1, 0, 2], [2, 1]),  # groups, dilation
    ((1, 6, 10, 10), (6, 1, 3, 3), 6, [2, 2], [1, 1, 1, 1], [1, 1]),  # depthwise
    ((3, 3, 4, 32, 32), (5, 3, 2, 16, 16), 1, [2, 16, 16], [0] * 6, [1, 1, 1]),  # 3-D patchify
    ((1, 8, 5, 5), (16, 8, 1, 1), 1, [1, 1], [0] * 4, [1, 1]),  # pointwise
]


@pytest.mark.parametrize("xs,ws,group,strides,pads,dilations", CONV_CASES)
def test_conv_equals_onnx_reference(xs, ws, group, strides, pads, dilations):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    ours, theirs = _both("Conv", {"x": x, "w": w, "b": b}, group=group, strides=strides, pads=pads,
                         dilations=dilations, kernel_shape=list(ws[2:]))
    assert ours.shape == theirs.shape and ours.dtype == np.float64
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


TRANSPOSE_CASES = [  # (x shape, w shape, group, strides, pads, dilations, output_padding, output_shape)
    ((1, 4, 5, 5), (4, 3, 2, 2), 1, [2, 2], [0] * 4, [1, 1], None, None),  # PP-OCR det's upsampling
    ((2, 4, 6), (4, 2, 3), 2, [2], [1, 0], [1], [1], None),  # 1-D, groups, output_padding
    ((1, 2, 4, 3), (2, 3, 3, 3), 1, [2, 3], [1, 0, 1, 1], [2, 1], None, None),  # dilation, pads
    ((1, 2, 4, 4), (2, 2, 3, 3), 1, [2, 2], None, [1, 1], None, [8, 8]),  # output_shape
]


@pytest.mark.parametrize("xs,ws,group,strides,pads,dilations,opad,oshape", TRANSPOSE_CASES)
def test_conv_transpose_equals_onnx_reference(xs, ws, group, strides, pads, dilations, opad, oshape):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[1] * group)
    x, w, b = (a.astype(np.float32).astype(np.float64) for a in (x, w, b))
    feeds = {"x": x, "w": w, "b": b}
    attrs = {"group": group, "strides": strides, "pads": pads, "dilations": dilations,
             "output_padding": opad, "output_shape": oshape}
    ours, _ = _both("ConvTranspose", feeds, **attrs, theirs=False)
    theirs = _onnxruntime_fp32("ConvTranspose", feeds, **attrs)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * float(np.max(np.abs(ours))))


def test_a_large_convolution_is_chunked(monkeypatch):
    """Column buffers are bounded: a tiny bound gives one offset per product, the same sums."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 3, 12, 12)), rng.standard_normal((4, 3, 3, 3))
    whole = f64_kernels.conv(x, w, pads=[1, 1, 1, 1])
    monkeypatch.setattr(f64_kernels, "COLUMN_BYTES", 1)
    np.testing.assert_allclose(f64_kernels.conv(x, w, pads=[1, 1, 1, 1]), whole, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_modes_match_onnx(auto_pad):
    """SAME_* goes to onnx's own kernel; VALID is ours."""
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 2, 7, 7)), "w": rng.standard_normal((3, 2, 3, 3))}
    ours, theirs = _both("Conv", feeds, auto_pad=auto_pad, strides=[2, 2])
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_equals_onnx_reference(axis):
    x = np.random.default_rng(4).standard_normal((3, 4, 5)) * 10
    ours, theirs = _both("Softmax", {"x": x}, axis=axis)
    np.testing.assert_allclose(ours, theirs, rtol=1e-14, atol=1e-16)


def test_erf_and_gelu_are_float64_exact():
    """onnx's own Erf rounds through float32 (3e-8 off); ours is math.erf to the last bits."""
    x = np.linspace(-6, 6, 2001)
    exact = np.array([math.erf(v) for v in x])
    ours, theirs = _both("Erf", {"x": x})
    assert np.max(np.abs(theirs - exact)) > 1e-8  # the bug this kernel replaces
    np.testing.assert_allclose(ours, exact, rtol=1e-15, atol=1e-16)
    for mode in ("none", "tanh"):
        model = _model("Gelu", {"x": x}, TensorProto.DOUBLE, approximate=mode)
        model.opset_import[0].version = 20
        (ours,) = ReferenceEvaluator(model, new_ops=list(f64_kernels.KERNELS)).run(None, {"x": x})
        if mode == "none":
            want = 0.5 * x * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
        else:
            want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        np.testing.assert_allclose(ours, want, rtol=1e-13, atol=1e-300)
