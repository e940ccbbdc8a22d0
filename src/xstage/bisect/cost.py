"""What a region is worth: its share of the nodes, of the parameters and of the FLOPs. Pure.

FLOPs per node, from the shapes of one real run (the capture):

* ``MatMul`` (and ``MatMulInteger``, ``QLinearMatMul``): ``2·M·N·K`` times the broadcast batch;
* ``Gemm``: ``2·M·N·K`` (``transA``/``transB`` read from the shapes of the output);
* ``Conv`` (and ``ConvTranspose``, ``QLinearConv``, ``ConvInteger``): ``2 · output elements ·
  C_in/group · kernel elements`` (``ConvTranspose``: input elements instead of output ones);
* anything else: the element count of its outputs.

Parameters are the elements of the initializers a node reads, each initializer counted once
per region (and once for the whole graph).

.. versionadded:: 0.3
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NodeCost", "Shares", "node_flops", "shares"]

Shape = tuple[int, ...]

_MATMUL = frozenset({"MatMul", "MatMulInteger"})
_CONV = frozenset({"Conv", "ConvInteger"})


@dataclass(frozen=True)
class NodeCost:
    """One node's FLOPs and the initializers it reads (name → element count)."""

    flops: int
    params: Mapping[str, int]


@dataclass(frozen=True)
class Shares:
    """A region's share of the graph: nodes, parameters and FLOPs, counts and fractions."""

    nodes: int
    nodes_total: int
    params: int
    params_total: int
    flops: int
    flops_total: int

    @staticmethod
    def _fraction(part: int, whole: int) -> float:
        return part / whole if whole else 0.0

    def to_dict(self) -> dict[str, float | int]:
        """The record's ``shares`` object."""
        return {"nodes": self.nodes, "nodes_total": self.nodes_total,
                "node_share": self._fraction(self.nodes, self.nodes_total),
                "params": self.params, "params_total": self.params_total,
                "param_share": self._fraction(self.params, self.params_total),
                "flops": self.flops, "flops_total": self.flops_total,
                "flop_share": self._fraction(self.flops, self.flops_total)}


def _count(shape: Shape | None) -> int:
    return math.prod(shape) if shape is not None else 0


def node_flops(op_type: str, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None]) -> int:
    """FLOPs of one node from its input and output shapes (see the module docstring).

    A shape that is unknown (None) counts as nothing: the formula falls back to the element
    count of the outputs that are known.
    """
    out_elems = sum(_count(s) for s in outputs)
    a = inputs[0] if inputs else None
    b = inputs[1] if len(inputs) > 1 else None
    if op_type in _MATMUL | {"QLinearMatMul"}:
        if op_type == "QLinearMatMul":
            a, b = inputs[0] if inputs else None, inputs[3] if len(inputs) > 3 else None
        if a and b and outputs and outputs[0] is not None:
            k = a[-1] if len(a) >= 1 else 1
            return 2 * _count(outputs[0]) * k  # output M·N (times batch) by K
        return out_elems
    if op_type == "Gemm" and a and outputs and outputs[0] is not None and len(outputs[0]) == 2:
        m, n = outputs[0]
        k = a[1] if a[0] == m else a[0]  # transA puts K first
        return 2 * m * n * k
    if op_type in _CONV | {"QLinearConv", "ConvTranspose"}:
        w = inputs[3] if op_type == "QLinearConv" and len(inputs) > 3 else b
        if w and len(w) >= 2 and outputs and outputs[0] is not None:
            kernel = _count(tuple(w[2:])) if len(w) > 2 else 1
            if op_type == "ConvTranspose":
                x = inputs[0]
                return 2 * _count(x) * w[1] * kernel if x else out_elems
            return 2 * _count(outputs[0]) * w[1] * kernel  # w[1] is C_in / group already
        return out_elems
    return out_elems


def shares(costs: Sequence[NodeCost], start: int, stop: int) -> Shares:
    """The share of ``costs[start:stop]`` in all of ``costs``."""
    def params(items: Sequence[NodeCost]) -> int:
        seen: dict[str, int] = {}
        for item in items:
            seen.update(item.params)
        return sum(seen.values())

    part = costs[start:stop]
    return Shares(nodes=len(part), nodes_total=len(costs), params=params(part),
                  params_total=params(costs), flops=sum(c.flops for c in part),
                  flops_total=sum(c.flops for c in costs))
