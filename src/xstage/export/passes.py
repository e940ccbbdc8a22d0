"""Graph rewrites that device runtimes need, each applied only where it provably changes nothing.

Every pass is an ``onnx_ir`` in-place pass named ``<Verb><Object>Pass`` and records every site
it looked at in ``sites``: applied, or skipped with the reason. A skipped site is not an
error: it is a place the rewrite could not prove safe, and the report says why.

* ``ClearReshapeAllowzeroPass``: ``Reshape(allowzero=1)`` → ``allowzero=0`` where the target
  shape is a constant with no 0 (``allowzero`` only changes what a literal 0 means). DirectML
  rejects ``allowzero=1`` at session init and onnxruntime then silently rebuilds the session
  on the CPU.
* ``RemoveNanGuardPass``: ``Where(IsNaN(x), a, b)`` removed where it cannot change the result:
  both branches the same value, or ``x`` a constant with no NaN (the condition is all false),
  and the output's shape is the kept branch's. The ``IsNaN`` goes only when nothing else uses it.
  With ``assume_finite`` (value names, or ``ALL``) it also removes the guard on a value the user
  vouches is never NaN (the condition is then all false: ``b`` is kept), each such site marked
  with the value's name (``Site.assumed``): an assumption, which the sanitizer then checks on
  sample inputs and reverts where the outputs move (``xstage.export.sanitize``).
* ``PromoteScalarAxesPass``: rank-0 ``axes`` constants of ``Squeeze``/``Unsqueeze`` become
  rank 1, where every consumer of the constant is such an ``axes`` input (nothing else can
  depend on its rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["ALL", "ClearReshapeAllowzeroPass", "PromoteScalarAxesPass", "RemoveNanGuardPass",
           "Site", "SitePass"]

#: ``assume_finite`` for every guarded value.
ALL = "all"


@dataclass(frozen=True)
class Site:
    """One place a rewrite looked at, and what it did there."""

    rewrite: str
    node: str
    op_type: str
    verdict: str  # applied | skipped | reverted
    reason: str
    #: the value assumed finite where the site rests on the user's assumption, else None
    assumed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"rewrite": self.rewrite, "node": self.node, "op_type": self.op_type,
               "verdict": self.verdict, "reason": self.reason}
        if self.assumed is not None:
            out["assumed"] = self.assumed
        return out


class SitePass(ir.passes.InPlacePass):
    """An in-place pass that keeps a list of the sites it visited."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[Site] = []

    def _site(self, node: ir.Node, verdict: str, reason: str, assumed: str | None = None) -> None:
        self.sites.append(Site(type(self).__name__, node.name or "(unnamed)", node.op_type,
                               verdict, reason, assumed))


def _nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
            if n.op_type == op_type and n.domain in ("", "ai.onnx")]


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


class ClearReshapeAllowzeroPass(SitePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in _nodes(model, "Reshape"):
            attr = node.attributes.get("allowzero")
            if attr is None or attr.as_int() == 0:
                continue
            shape = _const(node.inputs[1] if len(node.inputs) > 1 else None)
            if shape is None:
                self._site(node, "skipped", "the target shape is computed at run time, so a 0 "
                           "in it cannot be ruled out")
                continue
            if np.any(shape == 0):
                self._site(node, "skipped", f"the target shape {shape.tolist()} has a literal 0: "
                           "with allowzero=1 it is an empty dimension, with 0 it would copy the "
                           "input's dimension")
                continue
            node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
            self._site(node, "applied", f"constant target shape {shape.tolist()} has no 0, so "
                       "allowzero cannot matter")
            modified = True
        return ir.passes.PassResult(model, modified)


def _static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    const = _const(value)
    if const is not None:
        return tuple(const.shape)
    if value is None or value.shape is None or not value.shape.is_static():
        return None
    return tuple(int(d) for d in value.shape)


def _broadcast_is(values: list[ir.Value], kept: ir.Value) -> bool:
    """Whether broadcasting ``values`` gives exactly ``kept``'s shape (known statically)."""
    shapes = [_static_shape(v) for v in values]
    target = _static_shape(kept)
    if target is None or any(s is None for s in shapes):
        return False
    try:
        return tuple(np.broadcast_shapes(*shapes)) == target  # type: ignore[arg-type]
    except ValueError:
        return False


class RemoveNanGuardPass(SitePass):
    def __init__(self, assume_finite: frozenset[str] | str = frozenset()) -> None:
        super().__init__()
        self.assume_finite = assume_finite

    def _assumed(self, x: ir.Value) -> bool:
        return self.assume_finite == ALL or (not isinstance(self.assume_finite, str)
                                             and x.name in self.assume_finite)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in _nodes(model, "Where"):
            cond = node.inputs[0]
            guard = cond.producer() if cond is not None else None
            if guard is None or guard.op_type != "IsNaN" or guard.domain not in ("", "ai.onnx"):
                continue
            x, a, b = guard.inputs[0], node.inputs[1], node.inputs[2]
            out = node.outputs[0]
            keep: ir.Value | None = None
            assumed: str | None = None
            if a is b:
                keep, why = b, "both branches are the same value"
            else:
                x_value = _const(x)
                if x_value is not None and not np.isnan(x_value).any():
                    keep, why = b, "the guarded value is a constant with no NaN"
                elif x is not None and self._assumed(x):
                    keep, assumed = b, x.name
                    why = (f"assumed finite: {x.name!r} is never NaN by the user's word "
                           "(--assume-finite, or --for qnn), so the condition is all false")
            if keep is None:
                self._site(node, "skipped", "the guarded value may be NaN at run time and the "
                           "branches differ: removing the guard could change the result")
                continue
            if out.is_graph_output():
                self._site(node, "skipped", "its output is a graph output (names never change)")
                continue
            if not (a is b and x is b) and not _broadcast_is([x, a, b], keep):
                self._site(node, "skipped", "the output's shape is not provably the kept "
                           "branch's (Where broadcasts)")
                continue
            out.replace_all_uses_with(keep)
            graph = node.graph
            assert graph is not None
            graph.remove(node, safe=True)
            extra = ""
            if not guard.outputs[0].uses():
                guard.graph.remove(guard, safe=True)  # type: ignore[union-attr]
            else:
                extra = "; the IsNaN stays (other consumers use it)"
            self._site(node, "applied", why + extra, assumed)
            modified = True
        return ir.passes.PassResult(model, modified)


class PromoteScalarAxesPass(SitePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        done: set[int] = set()
        for op in ("Squeeze", "Unsqueeze"):
            for node in _nodes(model, op):
                axes = node.inputs[1] if len(node.inputs) > 1 else None
                if axes is None or id(axes) in done:
                    continue
                value = _const(axes)
                if value is None or value.ndim != 0:
                    continue
                others = [u.node for u in axes.uses()
                          if not (u.node.op_type in ("Squeeze", "Unsqueeze") and u.idx == 1)]
                if others or axes.is_graph_output() or axes.is_graph_input():
                    what = others[0].op_type if others else "the graph's interface"
                    self._site(node, "skipped", f"the rank-0 axes {axes.name!r} is also used by "
                               f"{what}, which may depend on its rank")
                    continue
                promoted = ir.tensor(value.reshape(1), name=axes.name)
                if axes.const_value is not None:  # an initializer
                    axes.const_value = promoted
                else:  # a Constant node's output
                    producer = axes.producer()
                    assert producer is not None
                    producer.attributes["value"] = ir.AttrTensor("value", promoted)
                axes.shape = ir.Shape([1])
                done.add(id(axes))
                self._site(node, "applied", f"rank-0 axes {axes.name!r} = {value.item()} → [ "
                           f"{value.item()} ]; its only consumers are Squeeze/Unsqueeze axes")
                modified = True
        return ir.passes.PassResult(model, modified)
