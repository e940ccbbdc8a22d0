"""Model Explorer node data: each original node coloured by the provider that ran it, and its kernel time.

Google's Model Explorer overlays "node data" on a graph: a JSON file per series, in the shape of
its Python builder's ``GraphNodeData`` (``model_explorer.node_data_builder``): ``results`` keyed
by node, each ``{"value": number, "bgColor"?: css colour}``, plus optional ``thresholds``
(``[{"value", "bgColor"}]``: values up to each bound take its colour) or ``gradient``
(``[{"stop": 0..1, "bgColor"}]``, stops 0 and 1 present). :func:`node_data` writes two series:

* **provider**: ``value`` 0 for the target EP, 1 for the CPU EP, 2 for any other provider, with
  the report's colours (:data:`xstage.report.plots.PALETTE`) as ``bgColor`` and as
  ``thresholds`` (so the legend reads the same); nodes neither layer names (fused or folded away
  by onnxruntime) have no entry. Members of a fused partition are coloured by the partition's
  provider: the plan lists them (docs/design.md §5, layer 2).
* **kernel time**: µs of the timed runs, for the nodes that are a kernel of their own, on a
  white-to-red ``gradient``. A fused partition's time belongs to no single node; it is not
  spread over its members (the page's split table shows it).

Keys: Model Explorer matches ``results`` keys against its adapter's node ids, and its ONNX
adapter (``model-explorer-onnx``) takes a node's id from its name, naming unnamed nodes with
onnx-ir's ``NameFixPass`` first. Measured with ai-edge-model-explorer 0.1.34 and
model-explorer-onnx 0.4.2 on the built-in tower: keyed by output value names, 0 of 156 nodes
matched; keyed by node names, all 156. So each node is keyed by its name; an unnamed node by the
id ``ids`` gives (the CLI runs ``NameFixPass`` on the graph for it: :func:`adapter_node_ids`),
and by its first output value name only when neither is known. Names come back as the original
graph's (a renamed copy is mapped back: docs/external.md §3).

.. versionadded:: 0.2
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from xstage.report.plots import PALETTE
from xstage.report.view import CPU_EP, ReportView

__all__ = ["PROVIDER_VALUES", "adapter_node_ids", "node_data"]

#: How the evidence labels a node the graph left unnamed (``op_type@index``): not an id.
_UNNAMED_LABEL = re.compile(r"[A-Za-z0-9_.]+@\d+")

#: The provider series' values, in the thresholds' order.
PROVIDER_VALUES = {"target": 0, "cpu": 1, "other": 2}


def _key(node: dict[str, Any], ids: Mapping[str, str]) -> str:
    outputs = [str(o) for o in node.get("outputs") or []]
    name = str(node.get("name") or "")
    if name and not _UNNAMED_LABEL.fullmatch(name):
        return name
    for value in outputs:
        if value in ids:
            return ids[value]
    return outputs[0] if outputs else str(node.get("name"))


def node_data(
    view: ReportView, ids: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two series of one record: (provider, kernel time), each one Model Explorer file.

    Args:
        view: the record's view; its ``nodes`` come from the record's ``detail`` block.
        ids: output value name → Model Explorer node id, for nodes the graph leaves unnamed.

    Returns:
        Two ``GraphNodeData`` documents; empty ``results`` when the record has no per-node detail.
    """
    target = view.target_ep
    results: dict[str, Any] = {}
    times: dict[str, Any] = {}
    for node in view.nodes:
        provider = node.get("provider")
        if provider is None:
            continue
        role = "target" if provider == target else "cpu" if provider == CPU_EP else "other"
        key = _key(dict(node), ids or {})
        results[key] = {"value": PROVIDER_VALUES[role], "bgColor": PALETTE[role]}
        us = node.get("kernel_time_us")
        if isinstance(us, int) and not isinstance(us, bool):
            times[key] = {"value": us}
    provider_doc = {
        "results": results,
        "thresholds": [
            {"value": PROVIDER_VALUES[r], "bgColor": PALETTE[r]} for r in ("target", "cpu", "other")
        ],
    }
    time_doc = {
        "results": times,
        "gradient": [
            {"stop": 0, "bgColor": "#ffffff"},
            {"stop": 0.5, "bgColor": "#fdae61"},
            {"stop": 1, "bgColor": "#d7191c"},
        ],
    }
    return provider_doc, time_doc


def adapter_node_ids(graph_path: str) -> dict[str, str]:
    """Output value name → the id Model Explorer's ONNX adapter gives that value's unnamed node.

    The adapter names unnamed nodes with onnx-ir's ``NameFixPass``; running the same pass here
    gives the same ids (for the same onnx-ir version). An unreadable graph gives ``{}``.
    """
    import onnx_ir as ir
    from onnx_ir.passes.common import NameFixPass

    try:
        model = ir.load(graph_path)
    except Exception:  # the record outlived its graph, or it is not ONNX: keys fall back
        return {}
    unnamed = {id(node) for node in model.graph.all_nodes() if not node.name}
    NameFixPass()(model)
    return {
        str(value.name): str(node.name)
        for node in model.graph.all_nodes()
        if id(node) in unnamed
        for value in node.outputs
        if value.name
    }
