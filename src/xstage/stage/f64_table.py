"""The float64 evaluator's checked table: which (domain, op, since_version) it may evaluate.

The tie-break's float64 answer is only as right as the evaluator's kernel for each node, *at
the version the graph's opset gives it*: onnx's ``ReferenceEvaluator`` fills a node's missing
attributes from the newest schema, so an opset-9 ``Softmax`` (the ``axis`` default 1, the input
coerced to 2-D) was evaluated as Softmax-13 (per axis, default -1): the onnx wheel's own
``light_squeezenet.onnx`` came out all ones. A graph is evaluated only when every node (in
subgraphs too) resolves, by its domain's opset, to a row of :data:`CHECKED`; otherwise the
tie-break is ``unavailable`` naming the first node that does not.

Each row is checked against onnxruntime's fp32 CPU kernel at that version by
``tests/stage/test_f64_table.py``: on the node cases of ``onnx.backend.test.case.node`` (the
onnx wheel's own, written at each op's newest version), converted down to the row's version
(``onnx.version_converter``, or the opset stamp alone where the node is valid there), and on
cases built there for versions no case reaches. The rows cover every (op, version) of the light
model zoo (``onnx/backend/test/data/light``, opset 9), the third-party test graphs
(``tests/thirdparty.py``, opsets 11-18) and the built-ins (opsets 17 and 21).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CHECKED", "Row", "rows_of", "since_version", "unchecked"]

#: One row: (domain, op type, since_version); the default domain is ``""``.
Row = tuple[str, str, int]

#: op type → the since_versions of the default domain that are checked.
_DEFAULT_DOMAIN: Mapping[str, tuple[int, ...]] = {
    "Abs": (13,), "Add": (7, 14), "And": (7,), "AveragePool": (7, 11),
    "BatchNormalization": (9,), "Cast": (9, 13, 21), "Clip": (11, 12, 13), "Concat": (4, 11, 13),
    "Constant": (11, 12, 13), "ConstantOfShape": (9,), "Conv": (1, 11), "ConvTranspose": (11,),
    "Cos": (7,), "Div": (7, 14), "Dropout": (7,), "Equal": (13,), "Erf": (13,), "Exp": (13,),
    "Expand": (13,), "Flatten": (13,), "Gather": (13,), "Gelu": (20,), "Gemm": (9, 13),
    "GlobalAveragePool": (1,), "GreaterOrEqual": (16,), "HardSigmoid": (6,),
    "Identity": (1, 16), "If": (16,), "LRN": (1,), "LSTM": (14,), "LayerNormalization": (17,),
    "Log": (13,), "LogSoftmax": (1, 11, 13), "MatMul": (9, 13), "MaxPool": (8, 11),
    "Mul": (7, 14), "Neg": (13,), "Not": (1,), "Or": (7,), "Pad": (13, 18), "Pow": (12, 15),
    "Reciprocal": (13,), "ReduceMean": (1, 11, 13, 18), "ReduceSum": (13,), "Relu": (6, 14),
    "Reshape": (5, 14, 21), "Resize": (11,), "Shape": (1, 15), "Sigmoid": (6, 13), "Sin": (7,),
    "Size": (13,), "Slice": (11, 13), "Softmax": (1, 11, 13), "Split": (18,), "Sqrt": (6, 13),
    "Squeeze": (11, 13, 21), "Sub": (7, 14), "Sum": (8,), "Tanh": (13,),
    "Transpose": (1, 13, 21), "Unsqueeze": (1, 13, 21), "Where": (16,),
}

#: Every checked row.
CHECKED: frozenset[Row] = frozenset(
    ("", op, version) for op, versions in _DEFAULT_DOMAIN.items() for version in versions)


def since_version(domain: str, op: str, opset: int) -> int | None:
    """The since_version of ``op`` under ``opset`` of ``domain``; None where onnx knows no schema."""
    import onnx.defs

    try:
        return int(onnx.defs.get_schema(op, opset, domain).since_version)
    except Exception:  # onnx.defs.SchemaError: an unknown op, domain or version
        return None


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node of ``graph`` and of its subgraphs (If, Loop, Scan bodies), depth first."""
    from onnx import AttributeProto

    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)


def rows_of(model: Any) -> list[tuple[str, str, int | None, str]]:
    """Each node of ``model`` as (domain, op, since_version or None, the node's name or op)."""
    opsets = {o.domain if o.domain != "ai.onnx" else "": int(o.version) for o in model.opset_import}
    out = []
    for node in _nodes(model.graph):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = opsets.get(domain)
        since = None if opset is None else since_version(domain, node.op_type, opset)
        out.append((domain, node.op_type, since, node.name or node.op_type))
    return out


def unchecked(model: Any) -> list[str]:
    """The nodes of ``model`` outside :data:`CHECKED`, each as ``Op-since (domain) 'name'``.

    ``Op (domain)`` where onnx has no schema for it (a custom domain).
    """
    found = []
    for domain, op, since, name in rows_of(model):
        if since is None or (domain, op, since) not in CHECKED:
            label = op if since is None else f"{op}-{since}"
            found.append(f"{label}{f' ({domain})' if domain else ''} {name!r}")
    return found
