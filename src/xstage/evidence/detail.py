"""Per-node placement detail: which provider ran each original node, and the profiled kernels.

Pure: the same evidence :func:`xstage.evidence.prove` judges (the profile's text, onnxruntime's
plan, the node names the session ran with) in, plain data out, for the record's ``detail``
block that ``xstage report`` draws (docs/reports.md). It decides nothing: the verdict is the
proof's. The rules:

1. **Nodes.** One row per original node of the graph (subgraph nodes included), in graph order.
   Its provider comes from the plan (``source: plan``) where the plan lists it (members of fused
   partitions included), else from a name-checked kernel event that stands for it
   (``source: execution``), else it is None (``source: null``: onnxruntime folded or fused it
   away and neither layer names it).
2. **Names.** Plan and event names are mapped back to the original node through
   :func:`xstage.evidence.names.check_names`, as the proof does; a name that fails the check
   is kept as written, flagged ``checked: false``, and never coloured as a node.
3. **Partitions.** An EP's fused kernel ``<EPType>_<EP>-subgraph_<k>_<n>`` (op ``<EP>-subgraph_<k>``)
   is the EP's ``k``-th partition; the plan lists that EP's subgraphs in the same order, so its
   ``k``-th subgraph's nodes are the partition's members — only when both count the same
   number of partitions for that EP (otherwise ``partition`` stays None and the time is the
   partition's alone).
4. **Time.** Kernel time sums the timed runs (2–4, as the proof's time fraction does); a node
   that is its own kernel gets that time, a fused partition's time stays with the partition.
5. **Session.** The profile's load spans (``model_loading_*``, ``session_initialization``).
6. **Outputs.** Each node's output value names, where they passed the name check (Model Explorer
   matches node data to a node by them).
7. **Kernels.** Every kernel event of every profiled run (compute, copies, control flow), with
   its run, start and duration in the profile's own clock (µs since profiling began), at most
   :data:`MAX_KERNELS` of them (``kernels_dropped`` counts the rest).

.. versionadded:: 0.2
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xstage.evidence.names import check_names, session_names
from xstage.evidence.onnx import _TIMED_RUNS, _is_copy, _kernel_node_name, _split_runs
from xstage.evidence.profile import parse_profile

__all__ = ["MAX_KERNELS", "placement_detail"]

#: The most kernel events one record keeps (a 1000-node graph profiled four times is 4000).
MAX_KERNELS = 20_000

#: The profile's own spans of the load, shown beside the client's (the rest are per run).
_SESSION_EVENTS = ("model_loading_uri", "model_loading_array", "session_initialization")
_PARTITION = re.compile(r"^(?P<ep>.+)-subgraph_(?P<k>\d+)$")


def _plan_rows(assignment: Any) -> list[tuple[int, str, str, str]]:
    """``(subgraph index, ep, op_type, name)`` for each plan entry, or none for a bad plan."""
    rows: list[tuple[int, str, str, str]] = []
    if not isinstance(assignment, Sequence) or isinstance(assignment, (str, bytes)):
        return rows
    for i, sub in enumerate(assignment):
        if not isinstance(sub, Mapping) or not isinstance(sub.get("ep"), str):
            continue
        nodes = sub.get("nodes")
        if not isinstance(nodes, Sequence) or isinstance(nodes, (str, bytes)):
            continue
        for node in nodes:
            if isinstance(node, Mapping) and isinstance(node.get("op_type"), str):
                name = node.get("name")
                rows.append((i, sub["ep"], node["op_type"], name if isinstance(name, str) else ""))
    return rows


def _partition_members(
    assignment: Any,
    rows: Sequence[tuple[int, str, str, str]],
    originals: Mapping[str, str],
    seen: Mapping[str, set[str]],
) -> dict[str, str]:
    """Rule 3: original node → partition label, for EPs whose partition counts agree."""
    subgraphs: dict[str, list[int]] = {}
    for index, ep, _, _ in rows:
        if index not in subgraphs.setdefault(ep, []):
            subgraphs[ep].append(index)
    members: dict[str, str] = {}
    for ep, labels in seen.items():
        order = subgraphs.get(ep, [])
        numbered = sorted(labels, key=lambda label: int(_PARTITION.match(label).group("k")))  # type: ignore[union-attr]
        if not order or len(order) != len(numbered):
            continue
        for index, label in zip(order, numbered, strict=True):
            for i, _, _, name in rows:
                if i == index and originals.get(name):
                    members[originals[name]] = label
    return members


def placement_detail(
    *,
    profile_text: str | bytes | None,
    assignment: Any,
    node_names: Mapping[str, Any] | None,
    graph_nodes: Sequence[Mapping[str, Any]],
    target_ep: str,
) -> dict[str, Any]:
    """The record's per-node view of one ONNX stage's evidence (rules in the module docstring).

    Args:
        profile_text: the profiled warm-up's onnxruntime profile, or None.
        assignment: onnxruntime's plan as the worker reported it, or None.
        node_names: the worker's ``node_names`` report (renamed copies mapped back), or None.
        graph_nodes: the graph's nodes, ``[{"name", "op_type"}]``, in graph order.
        target_ep: the EP the stage was asked to run on.

    Returns:
        ``{"target_ep", "names_checked", "nodes", "partitions", "runs", "session_events",
        "timed_runs", "kernels", "kernels_dropped"}``; the shapes are the schema's ``detail`` block.
    """
    names = session_names(graph_nodes, node_names)
    parsed = parse_profile(profile_text)
    events = list(parsed.events)
    per_run = _split_runs(events)
    runs = [e for e in events if e["cat"] == "Session" and e["name"] == "model_run"]
    timed = tuple(i for i in _TIMED_RUNS if i <= len(per_run)) if len(per_run) > 1 else (1,) * bool(per_run)
    plan = _plan_rows(assignment)
    entries = [
        (_kernel_node_name(e["name"]), e["op_name"] or "", e["provider"]) for run in per_run for e in run
    ]
    entries += [(name, op, None) for _, _, op, name in plan]
    check = check_names(entries, names) if names is not None else None
    originals: Mapping[str, str] = check.originals if check is not None else {}

    walk = _walk_kernels(per_run, originals, timed)

    plan_provider: dict[str, str] = {}
    for _, ep, _, name in plan:
        original = originals.get(name)
        if original:
            plan_provider.setdefault(original, ep)
    members = _partition_members(assignment, plan, originals, walk.seen_parts)
    outputs: dict[str, list[str]] = {}
    for value, producer in names.values.items() if names is not None else ():
        outputs.setdefault(producer, []).append(value)
    rows = []
    for node in graph_nodes:
        name = str(node.get("name") or "")
        provider = plan_provider.get(name) or walk.exec_provider.get(name)
        source = "plan" if name in plan_provider else "execution" if name in walk.exec_provider else None
        rows.append(
            {
                "name": name,
                "op_type": str(node.get("op_type") or ""),
                "provider": provider,
                "source": source,
                "partition": members.get(name),
                "kernel_time_us": walk.own_time.get(name),
                "outputs": outputs.get(name, []),
            }
        )
    partitions = _partitions(walk, members)
    return {
        "target_ep": target_ep,
        "names_checked": bool(check is not None and check.passed),
        "nodes": rows,
        "partitions": partitions,
        "runs": [{"run": i, "ts_us": r.get("ts"), "dur_us": r["dur"]} for i, r in enumerate(runs, start=1)],
        "session_events": [
            {"name": e["name"], "ts_us": e.get("ts"), "dur_us": e["dur"]}
            for e in events
            if e["cat"] == "Session" and e["name"] in _SESSION_EVENTS
        ],
        "timed_runs": list(timed),
        "kernels": walk.kernels,
        "kernels_dropped": walk.dropped,
    }


@dataclass
class _KernelWalk:
    """What one pass over the profiled runs' kernels gathers (rules 3-5 of the module docstring)."""

    kernels: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0
    own_time: dict[str, int] = field(default_factory=dict)  # timed µs of a node's own kernels
    part_time: dict[tuple[str, str], int] = field(default_factory=dict)  # (provider, partition)
    seen_parts: dict[str, set[str]] = field(default_factory=dict)
    exec_provider: dict[str, str] = field(default_factory=dict)


def _walk_kernels(
    per_run: Sequence[Sequence[Mapping[str, Any]]], originals: Mapping[str, str], timed: tuple[int, ...]
) -> _KernelWalk:
    walk = _KernelWalk()
    kernels, own_time, part_time = walk.kernels, walk.own_time, walk.part_time
    seen_parts, exec_provider = walk.seen_parts, walk.exec_provider
    for index, run in enumerate(per_run, start=1):
        for e in run:
            name = _kernel_node_name(e["name"])
            op = e["op_name"] or ""
            provider = e["provider"] or "<unknown provider>"
            original = originals.get(name)
            part = _PARTITION.match(op)
            label = op if part else (original if original else name)
            if part:
                seen_parts.setdefault(provider, set()).add(op)
            if len(kernels) < MAX_KERNELS:
                kernels.append(
                    {
                        "run": index,
                        "ts_us": e.get("ts"),
                        "dur_us": e["dur"],
                        "provider": provider,
                        "op": op,
                        "node": label,
                        "checked": original is not None,
                        "kind": "copy" if _is_copy(op, name) else "compute",
                    }
                )
            else:
                walk.dropped += 1
            if original is None or _is_copy(op, name):
                continue
            if part:
                if index in timed:
                    part_time[provider, op] = part_time.get((provider, op), 0) + e["dur"]
                continue
            exec_provider.setdefault(original, provider)
            if index in timed:
                own_time[original] = own_time.get(original, 0) + e["dur"]

    return walk


def _partitions(walk: _KernelWalk, members: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each fused partition: its provider, timed kernel µs and member count (0 µs when seen
    only outside the timed runs)."""
    part_time, seen_parts = walk.part_time, walk.seen_parts
    partitions = [
        {
            "name": op,
            "provider": provider,
            "kernel_time_us": us,
            "nodes": sum(1 for label in members.values() if label == op),
        }
        for (provider, op), us in sorted(part_time.items())
    ]
    for provider, labels in sorted(seen_parts.items()):
        for op in sorted(labels - {op for (p, op) in part_time if p == provider}):
            partitions.append(
                {
                    "name": op,
                    "provider": provider,
                    "kernel_time_us": 0,
                    "nodes": sum(1 for label in members.values() if label == op),
                }
            )
    return partitions
