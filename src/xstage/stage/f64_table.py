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
cases built there for versions no case reaches. The rows are those of 124 common ops, at every
since_version up to 22, where at least one case ran on onnxruntime and none disagreed
(docs/external.md lists what was left out, and why); they cover every (op, version) of the
light model zoo (``onnx/backend/test/data/light``, opset 9), the third-party test graphs
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
    "Abs": (6, 13), "Acos": (7, 22), "Acosh": (9, 22), "Add": (7, 13, 14), "And": (7,), "ArgMax":
    (1, 11, 12, 13), "ArgMin": (1, 11, 12, 13), "Asin": (7, 22), "Asinh": (9, 22), "Atan": (7, 22),
    "Atanh": (9, 22), "AveragePool": (7, 10, 11, 19, 22), "BatchNormalization": (7, 9), "Cast": (9,
    13, 21), "Ceil": (6, 13), "Celu": (12,), "Clip": (11, 12, 13), "Concat": (4, 11, 13),
    "Constant": (1, 9, 11, 12, 13, 19, 21), "ConstantOfShape": (9, 20, 21), "Conv": (1, 11, 22),
    "ConvTranspose": (1, 11, 22), "Cos": (7, 22), "Cosh": (9, 22), "DepthToSpace": (11, 13), "Div":
    (7, 13, 14), "Dropout": (7, 10, 12, 13, 22), "Elu": (6, 22), "Equal": (7, 11, 13, 19), "Erf":
    (9, 13), "Exp": (6, 13), "Expand": (8, 13), "Flatten": (1, 9, 11, 13, 21), "Floor": (6, 13),
    "GRU": (7, 14, 22), "Gather": (1, 11, 13), "GatherElements": (11, 13), "GatherND": (11, 12, 13),
    "Gelu": (20,), "Gemm": (7, 9, 11, 13), "GlobalAveragePool": (1, 22), "GlobalMaxPool": (1, 22),
    "Greater": (7, 9, 13), "GreaterOrEqual": (12, 16), "HardSigmoid": (6, 22), "HardSwish": (14,
    22), "Hardmax": (13,), "Identity": (1, 13, 14, 16, 19, 21), "If": (1, 11, 13, 16, 19, 21),
    "InstanceNormalization": (6, 22), "LRN": (1, 13), "LSTM": (7, 14, 22), "LayerNormalization":
    (17,), "LeakyRelu": (6, 16), "Less": (7, 9, 13), "LessOrEqual": (12, 16), "Log": (6, 13),
    "LogSoftmax": (1, 11, 13), "MatMul": (1, 9, 13), "Max": (6, 8, 12, 13), "MaxPool": (1, 8, 10,
    11, 12, 22), "Mean": (6, 8, 13), "Min": (6, 8, 12, 13), "Mish": (18, 22), "Mod": (10, 13),
    "Mul": (7, 13, 14), "Neg": (6, 13), "Not": (1,), "Or": (7,), "PRelu": (7, 9, 16), "Pad": (11,
    13, 18, 19, 21), "Pow": (7, 12, 13, 15), "Reciprocal": (6, 13), "ReduceL2": (18,),
    "ReduceLogSumExp": (18,), "ReduceMax": (1, 11, 12, 13, 18, 20), "ReduceMean": (1, 11, 13, 18),
    "ReduceMin": (1, 11, 12, 13, 18, 20), "ReduceProd": (1, 11, 13, 18), "ReduceSum": (13,),
    "ReduceSumSquare": (18,), "Relu": (6, 13, 14), "Reshape": (5, 13, 14, 19, 21), "Resize": (11,),
    "Round": (11, 22), "ScatterElements": (11, 13, 16, 18), "ScatterND": (11, 13, 16, 18), "Selu":
    (6, 22), "Shape": (1, 13, 15, 19, 21), "Sigmoid": (6, 13), "Sign": (9, 13), "Sin": (7, 22),
    "Sinh": (9, 22), "Size": (1, 13, 19, 21), "Slice": (10, 11, 13), "Softmax": (1, 11, 13),
    "Softplus": (1, 22), "Softsign": (1, 22), "SpaceToDepth": (1, 13), "Split": (2, 11, 13, 18),
    "Sqrt": (6, 13), "Squeeze": (11, 13, 21), "Sub": (7, 13, 14), "Sum": (6, 8, 13), "Tan": (7, 22),
    "Tanh": (6, 13), "Tile": (6, 13), "TopK": (10, 11), "Transpose": (1, 13, 21), "Trilu": (14,),
    "Unsqueeze": (1, 13, 21), "Where": (9, 16), "Xor": (7,),
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
