"""What a graph computes: the format each output is judged by, and the random ops it holds.

A format is what the graph computes, not what one node of it says (docs/external.md, "A format
is what the graph computes"). For an ONNX graph with Q/DQ nodes:

* An output is **A16W8** when its path (every node it depends on) holds at least one compute op
  (:data:`COMPUTE_OPS`: MatMul, Gemm, Conv, ConvTranspose, the attention ops, and the fused or
  einsum forms of the same products) and *every* compute op on it takes each float operand
  through a ``DequantizeLinear``: of an 8-bit constant (a weight), of a 32-bit constant at a
  bias position, or of a 16-bit ``QuantizeLinear`` (an activation). A compute op inside an
  ``If``/``Loop``/``Scan`` body on the path makes it not A16W8 (the body is not walked).
* An output with no compute op on its path is *neutral*: it is judged by the artifact's format.
* Every other output is judged by the float type of the graph (fp16 when most float
  initializers are float16, else fp32; ``xstage.artifact``'s rule for a graph without Q/DQ).
* An output is **A8W8** under the same rule with 8-bit activations: every compute op on its
  path takes 8-bit weights and activations through Q/DQ (what onnxruntime's ``quantize_static``
  makes by default), or a mix of A16W8 and A8W8 compute ops (judged by the looser A8W8 rules).

The artifact is ``onnx:a8w8`` when at least one output is A8W8 and none is judged by a float
type, else ``onnx:a16w8`` when at least one output is A16W8 and none is judged by a float type;
otherwise it is the float format, and the outputs that are quantized in it are listed
(:func:`onnx_output_formats`) so the gate judges them by their own format's rules.

Random ops (:func:`onnx_random_ops`, :func:`pt2_random_ops`) are named in a refusal for
``nondeterministic``; the verdict itself comes from running each arm twice.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["COMPUTE_OPS", "ONNX_RANDOM_OPS", "PT2_RANDOM_FAMILIES", "artifact_format",
           "onnx_output_formats", "onnx_random_ops", "pt2_random_ops"]

#: (domain, op type) of the ops whose precision decides an output's format, and the input
#: positions that may be a bias (a 32-bit constant through DequantizeLinear, or a float one).
COMPUTE_OPS: Mapping[tuple[str, str], tuple[int, ...]] = {
    ("", "MatMul"): (), ("", "Gemm"): (2,), ("", "Conv"): (2,), ("", "ConvTranspose"): (2,),
    ("", "Einsum"): (), ("", "Attention"): (),
    ("com.microsoft", "Attention"): (2,), ("com.microsoft", "MultiHeadAttention"): (3,),
    ("com.microsoft", "FusedMatMul"): (), ("com.microsoft", "FusedGemm"): (2,),
    ("com.microsoft", "FusedConv"): (2,),
}

#: ONNX ops that draw random numbers (Dropout only where its ``training_mode`` may be true).
ONNX_RANDOM_OPS = ("RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
                   "Bernoulli", "Multinomial", "Dropout")

#: The aten op families of a torch program that draw random numbers (name prefixes).
PT2_RANDOM_FAMILIES = ("rand", "bernoulli", "dropout", "native_dropout", "feature_dropout",
                       "alpha_dropout", "feature_alpha_dropout", "multinomial", "normal",
                       "uniform", "exponential", "poisson", "random_", "geometric", "cauchy",
                       "log_normal")

_INT8 = {2, 3}  # UINT8, INT8
_INT16 = {4, 5}  # UINT16, INT16
_INT32 = {6}
_FLOATS = {1, 10, 11, 16}
_NAMES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 1: "float32",
          10: "float16", 11: "float64", 16: "bfloat16"}


def _domain(node: Any) -> str:
    return "" if node.domain in ("", "ai.onnx") else str(node.domain)


class _Graph:
    """The top-level graph's producers, constants and value types (without external data)."""

    def __init__(self, model: Any) -> None:
        graph = model.graph
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consts: dict[str, int] = {i.name: int(i.data_type) for i in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.consts[node.output[0]] = int(value.data_type)
        self.inputs = {v.name: int(v.type.tensor_type.elem_type) for v in graph.input}

    def int_type(self, name: str) -> int | None:
        """The integer element type of ``name``: a constant's, a graph input's, a Q's output's."""
        if name in self.consts:
            return self.consts[name]
        if name in self.inputs:
            return self.inputs[name]
        node = self.producer.get(name)
        if node is not None and node.op_type == "QuantizeLinear":
            return self.q_type(node)
        return None

    def q_type(self, node: Any) -> int:
        """The element type a ``QuantizeLinear`` quantizes to (its zero point's, else uint8)."""
        for attr in node.attribute:
            if attr.name == "output_dtype" and attr.i:
                return int(attr.i)
        if len(node.input) > 2 and node.input[2]:
            known = self.int_type(node.input[2])
            if known is not None:
                return known
        return 2

    def is_const(self, name: str) -> bool:
        return name in self.consts and name not in self.inputs


def _operand_ok(g: _Graph, name: str, bias: bool, activations: set[int]) -> bool:
    """Whether one float operand of a compute op comes through a DequantizeLinear of an 8-bit
    weight, a 32-bit bias, or an activation of the ``activations`` types."""
    node = g.producer.get(name)
    if node is None or node.op_type != "DequantizeLinear" or not node.input:
        return bias and g.is_const(name) and g.consts.get(name) in _FLOATS  # a float bias
    x = node.input[0]
    if g.is_const(x):
        kind = g.consts[x]
        return kind in _INT8 or (bias and kind in _INT32)
    return g.int_type(x) in activations


def _compute_kind(g: _Graph, node: Any) -> str:
    """``a16w8`` or ``a8w8`` for a compute op whose every float operand comes through DQ (8-bit
    weights; 16-bit, or 8-bit, activations), else ``float``."""
    biases = COMPUTE_OPS[(_domain(node), node.op_type)]
    operands = []
    for i, name in enumerate(node.input):
        if not name:
            continue
        kind = g.int_type(name) if g.producer.get(name) is None else None
        if kind is not None and kind not in _FLOATS:
            continue  # an integer operand (a mask, a length): not a product's operand
        operands.append((name, i in biases))
    if all(_operand_ok(g, name, bias, _INT16) for name, bias in operands):
        return "a16w8"
    if all(_operand_ok(g, name, bias, _INT16 | _INT8) for name, bias in operands):
        return "a8w8"
    return "float"


def _has_compute(graph: Any) -> bool:
    """Whether ``graph`` (a subgraph, bodies included) holds a compute op."""
    for node in graph.node:
        if (_domain(node), node.op_type) in COMPUTE_OPS:
            return True
        for attr in node.attribute:
            if any(_has_compute(sub) for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs)):
                return True
    return False


def _path(g: _Graph, output: str) -> list[Any]:
    """Every top-level node ``output`` depends on."""
    seen: set[int] = set()
    nodes = []
    stack = [output]
    visited: set[str] = set()
    while stack:
        name = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        node = g.producer.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack.extend(i for i in node.input if i)
        for attr in node.attribute:  # names a body reads from the outer scope
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                stack.extend(_outer_names(sub))
    return nodes


def _outer_names(graph: Any) -> Iterable[str]:
    """Every value name a subgraph's nodes read (outer-scope names among them)."""
    for node in graph.node:
        yield from (i for i in node.input if i)
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield from _outer_names(sub)


def _judge(g: _Graph, output: str) -> str | None:
    """``a16w8``, ``a8w8``, ``float``, or None (no compute op on the path: neutral)."""
    kinds = set()
    for node in _path(g, output):
        if (_domain(node), node.op_type) in COMPUTE_OPS:
            kinds.add(_compute_kind(g, node))
            if "float" in kinds:
                return "float"
        for attr in node.attribute:
            if any(_has_compute(sub) for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs)):
                return "float"
    if not kinds:
        return None
    return "a8w8" if "a8w8" in kinds else "a16w8"


def _judged(model: Any) -> dict[str, str | None]:
    """Each graph output's judgement (:func:`_judge`)."""
    g = _Graph(model)
    return {o.name: _judge(g, o.name) for o in model.graph.output}


def artifact_format(model: Any, float_format: str) -> str:
    """The format of a graph with Q/DQ nodes (module docstring): ``onnx:a8w8``, ``onnx:a16w8``
    or ``float_format``."""
    judged = set(_judged(model).values())
    if "float" in judged:
        return float_format
    if "a8w8" in judged:
        return "onnx:a8w8"
    return "onnx:a16w8" if "a16w8" in judged else float_format


def onnx_output_formats(model: Any, artifact_fmt: str, float_format: str) -> dict[str, str]:
    """The outputs judged by another format than ``artifact_fmt``, each with its format.

    Empty for a graph without Q/DQ nodes, and for one whose outputs are all judged alike.
    """
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        return {}
    out = {}
    for name, judged in _judged(model).items():
        fmt = {"a16w8": "onnx:a16w8", "a8w8": "onnx:a8w8", "float": float_format}.get(
            judged or "", artifact_fmt)
        if fmt != artifact_fmt:
            out[name] = fmt
    return out


def _dropout_random(g: _Graph, node: Any) -> bool:
    """A Dropout that may train: its ``training_mode`` input is given and not a constant false."""
    if len(node.input) < 3 or not node.input[2]:
        return False
    mode = node.input[2]
    if mode in g.consts and mode not in g.inputs:
        const = next((i for i in g.graph.initializer if i.name == mode), None)
        if const is None:
            producer = g.producer.get(mode)
            const = next((a.t for a in producer.attribute if a.name == "value"), None) if producer else None
        if const is not None:
            from onnx import numpy_helper

            try:
                return bool(numpy_helper.to_array(const).any())
            except Exception:  # external data not loaded: assume it may train
                return True
    return True


def onnx_random_ops(model: Any) -> tuple[str, ...]:
    """The random ops of an ONNX graph (subgraphs included), ``op (node)`` in graph order."""
    g = _Graph(model)
    found: list[str] = []

    def walk(graph: Any) -> None:
        for node in graph.node:
            if _domain(node) == "" and node.op_type in ONNX_RANDOM_OPS and (
                    node.op_type != "Dropout" or _dropout_random(g, node)):
                found.append(f"{node.op_type} ({node.name or node.output[0]})")
            for attr in node.attribute:
                for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                    walk(sub)

    walk(model.graph)
    return tuple(found)


def pt2_random_ops(path: str | Path) -> tuple[str, ...]:
    """The random aten ops of a ``torch.export`` archive's graph (:data:`PT2_RANDOM_FAMILIES`).

    Never raises: an archive it cannot read has none it can name.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/models/model.json")), None)
            if name is None:
                return ()
            doc = json.loads(archive.read(name).decode("utf-8"))
        found: list[str] = []

        def walk(graph: Mapping[str, Any]) -> None:
            for node in graph.get("nodes") or ():
                parts = str(node.get("target", "")).split(".")
                op = parts[-2] if len(parts) >= 2 else parts[0]
                if any(op.startswith(f) for f in PT2_RANDOM_FAMILIES) and op not in found:
                    found.append(op)
                for arg in node.get("inputs") or ():  # a higher-order op's branches and bodies
                    body = (arg.get("arg") or {}).get("as_graph") if isinstance(arg, dict) else None
                    if isinstance(body, dict) and isinstance(body.get("graph"), dict):
                        walk(body["graph"])

        walk(doc["graph_module"]["graph"])
        return tuple(found)
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, TypeError, AttributeError):
        return ()
