"""An execution provider's own operator report, read as a proof layer. Pure.

onnxruntime's assignment shows a partition that an EP compiled as one fused node, so work the EP
itself leaves on its CPU inside that partition is invisible there (VitisAI's ``VITIS_EP_CPU`` in
its console summary). The VitisAI EP writes its own report, ``vitisai_ep_report.json``, where
``XLNX_ONNX_EP_REPORT_FILE`` points (the worker points it into its scratch folder and sends the
text back). Its documented shape, the part read here::

    {"deviceStat": [{"name": "all", "nodeNum": 5, "supportedOpType": [...]},
                    {"name": "CPU", "nodeNum": 1, ...}, {"name": "NPU", "nodeNum": 4, ...}],
     "nodeStat":   [{"name": "<node>", "opType": "<op>", "device": "CPU" | "NPU" | ...}, ...]}

Rules (``read_report``; :func:`xstage.evidence.onnx.prove` applies the result as its rule 7):

1. The text must be a JSON object with a ``nodeStat`` list of objects with string ``name``,
   ``opType`` and ``device``; anything else makes the report unusable (a problem, never an
   exception).
2. Names are untrusted text (docs/design.md §5): every ``nodeStat`` name must be one of the session's
   checked node names (or an onnxruntime-derived form of one) and its ``opType`` that node's op;
   a report that names a node the graph does not have is unusable.
3. A node is on the target when its ``device`` is one of the target devices (``NPU`` for
   VitisAI); every other device (``CPU``) is off it. ``deviceStat``'s counts, where present,
   must agree with ``nodeStat``'s; a disagreement is a problem.
4. The report's fraction = nodes on the target / nodes it lists.

.. versionadded:: 0.3
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xstage.evidence.names import SessionNames, check_names

__all__ = ["KINDS", "EpReport", "read_report"]

#: The reports known, with the ``device`` values that mean the target.
KINDS: Mapping[str, tuple[str, ...]] = {"vitisai": ("NPU",)}


@dataclass(frozen=True)
class EpReport:
    """What an EP's own report says, after the rules in the module docstring.

    Attributes:
        kind: the report's kind (``vitisai``).
        usable: whether rules 1-3 passed; an unusable report decides nothing.
        nodes_total: nodes it lists (``nodeStat``).
        nodes_on_target: those on a target device.
        fraction: ``nodes_on_target / nodes_total`` (None when unusable or empty).
        by_device: node counts per device, as ``nodeStat`` gives them.
        off_target: nodes off the target, ``{device: {op type: (original names, ...)}}``.
        problems: why it is unusable, or what disagreed (at most 10 kept).
    """

    kind: str
    usable: bool
    nodes_total: int = 0
    nodes_on_target: int = 0
    fraction: float | None = None
    by_device: Mapping[str, int] = field(default_factory=dict)
    off_target: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, for the proof's ``ep_report`` block."""
        return {"kind": self.kind, "usable": self.usable, "nodes_total": self.nodes_total,
                "nodes_on_target": self.nodes_on_target, "fraction": self.fraction,
                "by_device": dict(self.by_device),
                "off_target": {d: {op: list(n) for op, n in ops.items()}
                               for d, ops in self.off_target.items()},
                "problems": list(self.problems)}


def _unusable(kind: str, *problems: str) -> EpReport:
    return EpReport(kind=kind, usable=False, problems=tuple(problems)[:10])


def read_report(kind: str, text: str | None, names: SessionNames | None) -> EpReport:
    """Judge one EP report (rules 1-4 of the module docstring).

    Args:
        kind: which report (a key of :data:`KINDS`).
        text: the report as the EP wrote it, or None when it wrote none.
        names: the session's checked node names (``evidence.names.session_names``), or None
            when the graph's names are unknown (then no name can pass: the report is unusable).

    Raises:
        ValueError: ``kind`` is not a known report.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown EP report kind {kind!r}; known: {', '.join(KINDS)}")
    if text is None:
        return _unusable(kind, "the EP wrote no report")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return _unusable(kind, f"the report is not JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("nodeStat"), list):
        return _unusable(kind, "the report has no nodeStat list")
    rows: list[tuple[str, str, str]] = []
    for i, row in enumerate(doc["nodeStat"]):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str)
                                                for k in ("name", "opType", "device")):
            return _unusable(kind, f"nodeStat[{i}] is not an object with string name, opType and device")
        rows.append((row["name"], row["opType"], row["device"]))
    if names is None:
        return _unusable(kind, "no node names to check the report's against")
    check = check_names(((name, op, None) for name, op, _ in rows), names)
    if not check.passed:
        return _unusable(kind, *(f"nodeStat: {why}" for why in check.failures))
    targets = KINDS[kind]
    by_device: dict[str, int] = {}
    off: dict[str, dict[str, list[str]]] = {}
    seen: set[str] = set()
    problems: list[str] = []
    for name, op, device in rows:
        if name in seen:
            problems.append(f"nodeStat lists {name!r} twice")
            continue
        seen.add(name)
        by_device[device] = by_device.get(device, 0) + 1
        if device not in targets:
            listed = off.setdefault(device, {}).setdefault(op, [])
            listed.append(check.originals.get(name, name))
    if problems:
        return _unusable(kind, *problems)
    problems += _device_stat_disagrees(doc.get("deviceStat"), by_device, len(seen))
    on_target = sum(n for device, n in by_device.items() if device in targets)
    total = len(seen)
    return EpReport(
        kind=kind, usable=not problems, nodes_total=total, nodes_on_target=on_target,
        fraction=on_target / total if total and not problems else None, by_device=by_device,
        off_target={d: {op: tuple(n) for op, n in ops.items()} for d, ops in off.items()},
        problems=tuple(problems)[:10])


def _device_stat_disagrees(stat: Any, by_device: Mapping[str, int], total: int) -> list[str]:
    """Rule 3: ``deviceStat``'s node counts against ``nodeStat``'s (absent: nothing to compare)."""
    if stat is None:
        return []
    if not isinstance(stat, Sequence) or isinstance(stat, str | bytes):
        return ["deviceStat is not a list"]
    out = []
    for row in stat:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            out.append("a deviceStat entry has no name")
            continue
        count = row.get("nodeNum")
        if not isinstance(count, int) or isinstance(count, bool):
            out.append(f"deviceStat {row['name']!r} has no integer nodeNum")
            continue
        expected = total if row["name"] == "all" else by_device.get(row["name"], 0)
        if count != expected:
            out.append(f"deviceStat says {count} nodes on {row['name']}, nodeStat lists {expected}")
    return out
