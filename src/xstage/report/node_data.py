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
  provider: the plan lists them (DESIGN §4, layer 2).
* **kernel time**: µs of the timed runs, for the nodes that are a kernel of their own, on a
  white-to-red ``gradient``. A fused partition's time belongs to no single node; it is not
  spread over its members (the page's split table shows it).

Keys: Model Explorer matches a key against a node's output tensor names (``outputsMetadata``'s
``tensor_name``) or its node id; the ONNX adapter's node ids are not part of the documented
shape, tensor names are, so each node is keyed by its first output value name (name-checked by
the worker, DESIGN §4 "Untrusted text"), and by its node name only when it has none. Names come
back as the original graph's (a renamed copy is mapped back, issue 8).

.. versionadded:: 0.2
"""

from __future__ import annotations

from typing import Any

from xstage.report.plots import PALETTE
from xstage.report.view import CPU_EP, ReportView

__all__ = ["PROVIDER_VALUES", "node_data"]

#: The provider series' values, in the thresholds' order.
PROVIDER_VALUES = {"target": 0, "cpu": 1, "other": 2}


def _key(node: dict[str, Any]) -> str:
    outputs = node.get("outputs") or []
    return str(outputs[0]) if outputs else str(node.get("name"))


def node_data(view: ReportView) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two series of one record: (provider, kernel time), each one Model Explorer file.

    Args:
        view: the record's view; its ``nodes`` come from the record's ``detail`` block.

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
        key = _key(dict(node))
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
