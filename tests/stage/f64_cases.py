"""The cases that check the float64 evaluator's table against onnxruntime's fp32 CPU kernels.

For a row (domain, op, since_version) of ``xstage.stage.f64_table.CHECKED``:

* the node cases of ``onnx.backend.test.case.node`` for that op (the onnx wheel's own; it ships
  them as generators, each at the op's newest version, and ``python -m
  onnx.backend.test.cmd_tools generate-data -o DIR`` writes the same ones out), taken at the
  row's version: as they are where they resolve to it, else converted down by
  ``onnx.version_converter``, else with the opset stamp alone where the node is valid at that
  version (``onnx.checker`` with full shape inference decides);
* the cases of :data:`BUILT` for versions no node case reaches.

A case counts only where every float input and output is float32 (the fp32 kernel is what the
answer is checked against) and onnxruntime loads and runs it. The answer must match
onnxruntime's outputs: the same shapes, the same non-finite positions, integers exactly, and
floats within :data:`RTOL` of the output's scale (fp32 kernels round each step; the evaluator
does not).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: A float output matches when ``|x - o| <= RTOL·max|x| + RTOL·|x|`` everywhere (x the float64
#: answer, o onnxruntime's fp32 output). Measured over the 1561 cases of the sweep: the largest
#: ``max|x - o| / max|x|`` is 6.9e-7 (a ReduceMean over 120 elements), then 4.3e-7 (GRU),
#: 1e-5 leaves 14x; a wrong semantics is off by whole values (the light
#: SqueezeNet's opset-13 reading: 1.0 where onnxruntime says 1e-3).
RTOL = 1e-5


@dataclass(frozen=True)
class Case:
    """One check: a model at the row's version, its inputs, and where it came from."""

    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    how: str  # "as written", "converted", "restamped", "built"


@functools.cache
def _node_cases() -> dict[str, list[Any]]:
    """Every node case of the onnx wheel, by op type (generated once per process: ~10 s)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    by_op: dict[str, list[Any]] = {}
    for case in cases:
        if "_expanded" in case.name or case.kind != "node":
            continue
        ops = {n.op_type for n in case.model.graph.node}
        if len(ops) == 1:
            by_op.setdefault(ops.pop(), []).append(case)
    return by_op


def _version_of(model: onnx.ModelProto, op: str, domain: str = "") -> int | None:
    from xstage.stage import f64_table

    for d, o, since, _ in f64_table.rows_of(model):
        if o == op and d == domain:
            return since
    return None


def _valid(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return False
    return True


def _ir_for(version: int) -> int:
    """An IR version every onnxruntime here loads for a default-domain opset."""
    return 7 if version <= 12 else 8 if version <= 17 else 9 if version <= 20 else 10


def at_version(model: onnx.ModelProto, op: str, version: int) -> tuple[onnx.ModelProto, str] | None:
    """``model`` with ``op`` resolving to ``version``, and how it got there; None if it cannot."""
    if _version_of(model, op) == version:
        return model, "as written"
    try:
        from onnx import version_converter

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = version_converter.convert_version(model, version)
        converted.ir_version = min(converted.ir_version, _ir_for(version))
        if _version_of(converted, op) == version and _valid(converted):
            return converted, "converted"
    except Exception:  # no adapter for this op or version: try the stamp alone
        pass
    stamped = onnx.ModelProto()
    stamped.CopyFrom(model)
    del stamped.opset_import[:]
    stamped.opset_import.append(helper.make_opsetid("", version))
    stamped.ir_version = _ir_for(version)
    if _version_of(stamped, op) == version and _valid(stamped):
        return stamped, "restamped"
    return None


def _fp32_only(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> bool:
    """Whether every float input and output is float32 (and every input is a plain tensor)."""
    if any(not isinstance(a, np.ndarray) for a in inputs.values()):
        return False
    if any(a.dtype.kind == "f" and a.dtype != np.float32 for a in inputs.values()):
        return False
    floats = {TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
    for value in model.graph.output:
        if not value.type.HasField("tensor_type") or value.type.tensor_type.elem_type in floats:
            return False
    return all(v.type.HasField("tensor_type") for v in model.graph.input)


def cases(row: tuple[str, str, int], limit: int | None = None) -> Iterator[Case]:
    """The cases that check ``row`` (node cases first, then :data:`BUILT`), at most ``limit``."""
    domain, op, version = row
    count = 0
    for case in _node_cases().get(op, []) if domain == "" else []:
        if limit is not None and count >= limit:
            return
        if not case.data_sets:
            continue
        names = [v.name for v in case.model.graph.input]
        inputs = dict(zip(names, case.data_sets[0][0], strict=False))
        if len(inputs) != len(names) or not _fp32_only(case.model, inputs):
            continue
        found = at_version(case.model, op, version)
        if found is not None:
            count += 1
            yield Case(case.name, found[0], inputs, found[1])
    for name, build in BUILT.get(row, ()):
        if limit is not None and count >= limit:
            return
        model, inputs = build()
        count += 1
        yield Case(name, model, inputs, "built")


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray] | str:
    """onnxruntime's CPU EP outputs, or why it did not run the case."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return list(session.run(None, inputs))
    except Exception as exc:  # not implemented there, or a case it rejects
        return f"onnxruntime: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def mismatch(name: str, x: np.ndarray, o: np.ndarray) -> str | None:
    """Why the float64 answer ``x`` does not match onnxruntime's ``o``; None when it does."""
    x, o = np.asarray(x), np.asarray(o)
    if x.shape != o.shape:
        return f"{name}: shape {x.shape} != onnxruntime's {o.shape}"
    if o.dtype.kind != "f":
        if x.dtype.kind == "f" or not np.array_equal(x, o):
            return f"{name}: {x.dtype} {x.ravel()[:6]} != onnxruntime's {o.dtype} {o.ravel()[:6]}"
        return None
    x64, o64 = x.astype(np.float64), o.astype(np.float64)
    if not np.array_equal(np.isnan(x64), np.isnan(o64)) or \
            not np.array_equal(np.where(np.isinf(x64), x64, 0), np.where(np.isinf(o64), o64, 0)):
        return f"{name}: non-finite positions differ"
    fin = np.isfinite(x64)
    if not fin.any():
        return None
    scale = float(np.max(np.abs(x64[fin])))
    err = np.abs(x64[fin] - o64[fin])
    bound = RTOL * scale + RTOL * np.abs(x64[fin])
    if np.any(err > bound):
        worst = int(np.argmax(err - bound))
        return (f"{name}: off by {err[worst]:.3g} at {x64[fin][worst]:.6g} (scale {scale:.3g}, "
                f"bound {bound[worst]:.3g})")
    return None


def check(case: Case, folder: Path) -> str | None:
    """Run ``case`` both ways: None when the evaluator matches onnxruntime, else why not.

    Returns ``"skip: ..."`` where onnxruntime does not run the case.
    """
    from xstage.stage import tiebreak

    want = onnxruntime_outputs(case.model, case.inputs)
    if isinstance(want, str):
        return "skip: " + want
    path = folder / f"{case.name}.onnx"
    onnx.save(case.model, str(path))
    try:
        got = tiebreak.evaluate_float64(path, case.inputs)
    except tiebreak.Unavailable as exc:
        return f"the evaluator: {exc}"
    names = [v.name for v in case.model.graph.output]
    problems = [p for n, o in zip(names, want, strict=True)
                if (p := mismatch(n, got[n], o)) is not None]
    return "; ".join(problems) or None


# --------------------------------------------------------------------------- built cases


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], version: int,
           inits: list[Any] | None = None, check: bool = True) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "built", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)],
                              ir_version=_ir_for(version))
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _f(name: str, shape: list[int]) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _softmax_coerced(op: str, version: int, axis: int | None) -> Any:
    """Softmax/LogSoftmax on (2, 3, 4, 5) at an old opset: the input coerced to 2-D at ``axis``."""
    def build() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        attrs = {} if axis is None else {"axis": axis}
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        model = _model([node], [_f("x", [2, 3, 4, 5])], [_f("y", [2, 3, 4, 5])], version)
        return model, {"x": _rand(2, 3, 4, 5)}
    return build


def _light_squeezenet_tail(version: int) -> Any:
    """The light SqueezeNet's head at its own opset: GlobalAveragePool → Softmax on (1, C, 1, 1)."""
    def build() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
                 helper.make_node("Softmax", ["p"], ["y"])]
        model = _model(nodes, [_f("x", [1, 10, 3, 3])], [_f("y", [1, 10, 1, 1])], version)
        return model, {"x": _rand(1, 10, 3, 3, seed=1)}
    return build


#: row → [(name, builder)]: cases built for versions no node case of the wheel reaches.
BUILT: dict[tuple[str, str, int], list[tuple[str, Any]]] = {}
for _op in ("Softmax", "LogSoftmax"):
    for _version in (1, 11, 13):
        BUILT[("", _op, _version)] = [
            (f"built_{_op.lower()}{_version}_default_axis", _softmax_coerced(_op, _version, None)),
            (f"built_{_op.lower()}{_version}_axis_2", _softmax_coerced(_op, _version, 2)),
            (f"built_{_op.lower()}{_version}_axis_neg1", _softmax_coerced(_op, _version, -1)),
        ]
BUILT[("", "Softmax", 1)].append(("built_squeezenet_tail_opset9", _light_squeezenet_tail(9)))


def _single(op: str, version: int, inputs: dict[str, np.ndarray], out_type: int,
            consts: dict[str, np.ndarray] | None = None, **attrs: Any) -> Any:
    """One ``op`` node on ``inputs`` (graph inputs) and ``consts`` (initializers), output ``y``."""
    def build() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        values = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                  for n, a in inputs.items()]
        inits = [numpy_helper.from_array(a, n) for n, a in (consts or {}).items()]
        names = [*inputs, *(consts or {})]
        node = helper.make_node(op, names, ["y"], **attrs)
        model = _model([node], values, [helper.make_tensor_value_info("y", out_type, None)],
                       version, inits, check=False)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        onnx.checker.check_model(model, full_check=True)
        return model, dict(inputs)
    return build


_X = _rand(2, 3, 4, 5, seed=2)
for _version in (9, 13, 21):
    BUILT[("", "Cast", _version)] = [
        (f"built_cast{_version}_int64_to_float", _single(
            "Cast", _version, {"x": np.arange(-6, 6, dtype=np.int64).reshape(3, 4)}, TensorProto.FLOAT,
            to=TensorProto.FLOAT)),
        (f"built_cast{_version}_float_to_int64", _single(
            "Cast", _version, {"x": _X * 7}, TensorProto.INT64, to=TensorProto.INT64)),
        (f"built_cast{_version}_float_to_int32", _single(
            "Cast", _version, {"x": _X * 7}, TensorProto.INT32, to=TensorProto.INT32)),
        (f"built_cast{_version}_float_to_float", _single(
            "Cast", _version, {"x": _X}, TensorProto.FLOAT, to=TensorProto.FLOAT)),
        (f"built_cast{_version}_bool_to_float", _single(
            "Cast", _version, {"x": _X > 0}, TensorProto.FLOAT, to=TensorProto.FLOAT)),
    ]
for _version in (1, 11, 13):
    BUILT[("", "ReduceMean", _version)] = [
        (f"built_reducemean{_version}_last_axis", _single(
            "ReduceMean", _version, {"x": _X}, TensorProto.FLOAT, axes=[-1])),
        (f"built_reducemean{_version}_axes_0_2_no_keepdims", _single(
            "ReduceMean", _version, {"x": _X}, TensorProto.FLOAT, axes=[0, 2], keepdims=0)),
        (f"built_reducemean{_version}_all", _single("ReduceMean", _version, {"x": _X}, TensorProto.FLOAT)),
    ]
BUILT[("", "Squeeze", 11)] = [
    ("built_squeeze11_axis_0", _single("Squeeze", 11, {"x": _rand(1, 3, 1, 5)}, TensorProto.FLOAT, axes=[0])),
    ("built_squeeze11_axes_neg", _single("Squeeze", 11, {"x": _rand(1, 3, 1, 5)}, TensorProto.FLOAT,
                                         axes=[-2, 0])),
    ("built_squeeze11_all", _single("Squeeze", 11, {"x": _rand(1, 3, 1, 5)}, TensorProto.FLOAT)),
]
BUILT[("", "Unsqueeze", 1)] = [
    ("built_unsqueeze1_axis_0", _single("Unsqueeze", 1, {"x": _rand(3, 5)}, TensorProto.FLOAT, axes=[0])),
    ("built_unsqueeze1_axes_0_3", _single("Unsqueeze", 1, {"x": _rand(3, 5)}, TensorProto.FLOAT,
                                          axes=[0, 3])),
]
_EMPTY = np.zeros(0, np.float32)
_SCALES = np.array([1, 1, 2, 2], np.float32)
BUILT[("", "Resize", 11)] = [
    ("built_resize11_nearest_asymmetric_floor", _single(  # PP-OCR det v4's upsampling
        "Resize", 11, {"x": _rand(1, 2, 3, 4)}, TensorProto.FLOAT, {"roi": _EMPTY, "scales": _SCALES},
        mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    ("built_resize11_nearest_default", _single(
        "Resize", 11, {"x": _rand(1, 2, 3, 4)}, TensorProto.FLOAT, {"roi": _EMPTY, "scales": _SCALES})),
    ("built_resize11_linear_half_pixel", _single(
        "Resize", 11, {"x": _rand(1, 2, 3, 4)}, TensorProto.FLOAT, {"roi": _EMPTY, "scales": _SCALES},
        mode="linear")),
    ("built_resize11_linear_align_corners", _single(
        "Resize", 11, {"x": _rand(1, 2, 3, 4)}, TensorProto.FLOAT, {"roi": _EMPTY, "scales": _SCALES},
        mode="linear", coordinate_transformation_mode="align_corners")),
    ("built_resize11_nearest_sizes", _single(
        "Resize", 11, {"x": _rand(1, 2, 3, 4)}, TensorProto.FLOAT,
        {"roi": _EMPTY, "scales": _EMPTY, "sizes": np.array([1, 2, 7, 9], np.int64)},
        mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
]
