"""Record → view model: what a report shows, as plain data, decided once for every renderer.

Pure: a record (a validated ``dict``) in, frozen dataclasses out; no files, no plotting. The
HTML page, the Model Explorer node data and the Perfetto trace all read a :class:`ReportView`,
and ``xstage compare`` reads two (:func:`compare_views`). Every record renders, placed, refused
or failed, old or new: a block the record lacks is None here and the page says so.

Rules:

1. **Which evidence.** A placed record carries its proof and gate at the top; a refused one
   carries them in its refusal's evidence (the last refusal whose worker ran). The per-node
   view is the record's ``detail`` block (schema 1.x); a record without one falls back to the
   proof's ``cpu_nodes`` (off-target op types) and its kernel time by provider.
2. **The split** is by op type: nodes on the target EP, on the CPU EP, on other providers and
   not seen by either layer (fused or folded away); kernel time (the timed runs) of the nodes
   that are their own kernel, per side. An EP's fused partitions are rows of their own.
3. **Calls** break the round trip into the client's copy in, the worker's compute, the
   client's copy out, and what is left (transport: frames, wake-ups, checks).
4. **Untrusted text** (node names, messages) is kept as written; renderers escape it.

.. versionadded:: 0.2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CPU_EP",
    "Call",
    "CompareRow",
    "CompareView",
    "OpSplit",
    "OutputParity",
    "ReportView",
    "build_view",
    "compare_views",
]

CPU_EP = "CPUExecutionProvider"


@dataclass(frozen=True)
class OpSplit:
    """One op type's (or one fused partition's) nodes and kernel time, target against CPU."""

    op_type: str
    target_nodes: int
    cpu_nodes: int
    other_nodes: int
    unseen_nodes: int
    target_us: int
    cpu_us: int
    other_us: int
    partition: bool = False


@dataclass(frozen=True)
class Call:
    """One timed call: where its round trip went (µs)."""

    start_us: float
    round_trip_us: float
    compute_us: float
    copy_in_us: float | None
    copy_out_us: float | None
    rss_bytes: int | None

    @property
    def transport_us(self) -> float:
        """What the round trip leaves after compute and the client's copies."""
        rest = self.round_trip_us - self.compute_us - (self.copy_in_us or 0) - (self.copy_out_us or 0)
        return max(0.0, rest)


@dataclass(frozen=True)
class OutputParity:
    """One output against the reference: the criterion that decided, and its numbers."""

    name: str
    passed: bool
    criterion: str
    rule: str | None
    rel_l2: float | None
    cosine: float | None
    max_abs: float | None
    n_bad: int | None
    size: int | None


@dataclass(frozen=True)
class ReportView:
    """Everything a report of one record shows (module docstring's rules)."""

    title: str
    status: str
    exit_code: int
    headline: str
    refusals: tuple[Mapping[str, Any], ...]
    error: Mapping[str, Any] | None
    candidates: tuple[Mapping[str, Any], ...]
    device: str | None
    route: str | None
    target_ep: str | None
    proof: Mapping[str, Any] | None
    proof_source: str
    split: tuple[OpSplit, ...]
    split_source: str
    nodes: tuple[Mapping[str, Any], ...]
    kernels: tuple[Mapping[str, Any], ...]
    runs: tuple[Mapping[str, Any], ...]
    timed_runs: tuple[int, ...]
    phases: tuple[Mapping[str, Any], ...]
    calls: tuple[Call, ...]
    clock: Mapping[str, Any] | None
    session_events: tuple[Mapping[str, Any], ...]
    timings: Mapping[str, Any] | None
    parity: Mapping[str, Any] | None
    outputs: tuple[OutputParity, ...]
    ledger: Mapping[str, Any] | None
    memory: Mapping[str, Any] | None
    provenance: tuple[tuple[str, str], ...]
    artifact_sha256: str | None
    notes: tuple[str, ...] = field(default=())


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _evidence(record: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, str]:
    """Rule 1: the proof and the gate, from the top of the record or from its refusal."""
    proof, parity = record.get("proof"), record.get("parity")
    if proof or parity:
        return proof, parity, "record"
    for refusal in reversed(_get(record, "outcome", "refusals") or []):
        evidence = refusal.get("evidence") or {}
        gate = evidence.get("parity")
        found = evidence.get("proof") or (evidence if "node_fraction" in evidence else None)
        if found or gate:
            return found, gate, f"refusal {refusal.get('code')} ({refusal.get('cause')})"
    return None, None, "none"


def _split_from_detail(placement: Mapping[str, Any], target: str) -> tuple[OpSplit, ...]:
    """Rule 2, from the per-node rows and the fused partitions."""
    rows: dict[str, list[int]] = {}
    for node in placement.get("nodes") or []:
        op, provider = str(node.get("op_type") or "?"), node.get("provider")
        counts = rows.setdefault(op, [0] * 7)
        slot = 3 if provider is None else 0 if provider == target else 1 if provider == CPU_EP else 2
        counts[slot] += 1
        us = node.get("kernel_time_us")
        if isinstance(us, int) and provider is not None:
            counts[4 + min(slot, 2)] += us
    ordered = sorted(rows.items(), key=lambda kv: (-sum(kv[1][:4]), kv[0]))
    out = [OpSplit(op, c[0], c[1], c[2], c[3], c[4], c[5], c[6]) for op, c in ordered]
    for part in placement.get("partitions") or []:
        provider = part.get("provider")
        us = int(part.get("kernel_time_us") or 0)
        name = f"{part.get('name')} ({part.get('nodes')} nodes fused)"
        out.append(
            OpSplit(
                name,
                0,
                0,
                0,
                0,
                us if provider == target else 0,
                us if provider == CPU_EP and provider != target else 0,
                us if provider not in (target, CPU_EP) else 0,
                partition=True,
            )
        )
    return tuple(out)


def _split_from_proof(proof: Mapping[str, Any], target: str) -> tuple[OpSplit, ...]:
    """Rule 1's fallback: the proof names only the off-target nodes, and time by provider."""
    out = []
    for op, names in sorted((proof.get("cpu_nodes") or {}).items()):
        out.append(OpSplit(op, 0, len(names), 0, 0, 0, 0, 0))
    by_provider = proof.get("kernel_time_by_provider_us") or {}
    out.append(
        OpSplit(
            "all kernels",
            int(proof.get("nodes_on_target") or 0),
            0,
            0,
            0,
            int(by_provider.get(target, 0)),
            int(by_provider.get(CPU_EP, 0)) if target != CPU_EP else 0,
            sum(int(v) for k, v in by_provider.items() if k not in (target, CPU_EP)),
            partition=True,
        )
    )
    return tuple(out)


def _calls(detail: Mapping[str, Any] | None) -> tuple[Call, ...]:
    def num(value: Any) -> float | None:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    out = []
    for c in (detail or {}).get("calls") or []:
        out.append(
            Call(
                start_us=float(c["start_us"]),
                round_trip_us=float(c["round_trip_us"]),
                compute_us=float(c["compute_us"]),
                copy_in_us=num(c.get("copy_in_us")),
                copy_out_us=num(c.get("copy_out_us")),
                rss_bytes=c.get("rss_bytes"),
            )
        )
    return tuple(out)


def _outputs(parity: Mapping[str, Any] | None) -> tuple[OutputParity, ...]:
    out = []
    for o in (parity or {}).get("outputs") or []:
        out.append(
            OutputParity(
                name=str(o.get("name")),
                passed=bool(o.get("passed")),
                criterion=str(o.get("criterion") or ""),
                rule=o.get("rule"),
                rel_l2=o.get("rel_l2"),
                cosine=o.get("cosine"),
                max_abs=o.get("max_abs"),
                n_bad=o.get("n_bad"),
                size=o.get("size"),
            )
        )
    return tuple(out)


def _headline(
    record: Mapping[str, Any], device: str | None, route: str | None, proof: Mapping[str, Any] | None
) -> str:
    outcome = record.get("outcome") or {}
    status = outcome.get("status")
    if status == "placed":
        frac = _get(proof, "fraction")
        where = f"placed on {device} via {route}"
        if isinstance(frac, (int, float)):
            where += f": {frac:.1%} of the stage on {_get(proof, 'target_ep')}"
        return where
    if status == "refused":
        refusals = outcome.get("refusals") or []
        last = refusals[-1] if refusals else {}
        return f"refused: {last.get('code')} ({last.get('cause')}) — {last.get('message')}"
    err = outcome.get("error") or {}
    return f"error: {err.get('type')} — {err.get('message')}"


def _provenance(record: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    host = record.get("host") or {}
    worker = record.get("worker") or {}
    hello = _get(worker, "hello", "worker") or {}
    art = record.get("artifact") or {}
    versions = hello.get("versions") or {}
    rows = [
        (
            "artifact",
            f"{art.get('path')} ({art.get('format')}, {art.get('bytes')} bytes)" if art else "not read",
        ),
        ("sha256", str(art.get("sha256")) if art else "—"),
        (
            "host",
            f"{host.get('hostname')} · {host.get('platform')} · {host.get('cpu')} · "
            f"Python {host.get('python')}",
        ),
        ("worker interpreter", str(worker.get("interpreter") or "no worker")),
        ("worker runtime", ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "—"),
        ("worker log", str(worker.get("log") or "—")),
        ("xstage", f"{record.get('xstage_version')}, record schema {record.get('schema_version')}"),
        ("when", f"{record.get('started')} → {record.get('finished')}"),
        ("argv", " ".join(str(a) for a in record.get("argv") or [])),
    ]
    return tuple(rows)


def build_view(record: Mapping[str, Any]) -> ReportView:
    """The view model of one record (rules in the module docstring).

    Args:
        record: a record as ``xstage.record.read_record`` returns it (validated).

    Returns:
        The :class:`ReportView`; blocks the record lacks are None or empty.
    """
    outcome = record.get("outcome") or {}
    detail = record.get("detail") or None
    proof, parity, source = _evidence(record)
    chosen = _get(record, "plan", "chosen") or {}
    device = chosen.get("device") or _get(detail, "device")
    route = chosen.get("route") or _get(detail, "route")
    placement = _get(detail, "placement")
    target = str(_get(placement, "target_ep") or _get(proof, "target_ep") or "") or None
    notes = []
    if placement:
        split, split_source = _split_from_detail(placement, target or ""), "detail"
    elif proof and target:
        split, split_source = _split_from_proof(proof, target), "proof"
        notes.append(
            "this record has no per-node detail (an older record, or a torch stage): "
            "the split shows only the proof's off-target nodes and kernel time by provider"
        )
    else:
        split, split_source = (), "none"
    if detail and outcome.get("status") == "refused" and not record.get("plan", {}).get("chosen"):
        notes.append(
            f"the detail is of the last candidate whose worker warmed up: "
            f"{detail.get('route')} on {detail.get('device')}"
        )
    art = record.get("artifact") or {}
    return ReportView(
        title=str(art.get("path") or "no artifact").rsplit("/", 1)[-1],
        status=str(outcome.get("status")),
        exit_code=int(outcome.get("exit_code", 1)),
        headline=_headline(record, device, route, proof),
        refusals=tuple(outcome.get("refusals") or ()),
        error=outcome.get("error"),
        candidates=tuple(_get(record, "plan", "candidates") or ()),
        device=device,
        route=route,
        target_ep=target,
        proof=proof,
        proof_source=source,
        split=split,
        split_source=split_source,
        nodes=tuple(_get(placement, "nodes") or ()),
        kernels=tuple(_get(placement, "kernels") or ()),
        runs=tuple(_get(placement, "runs") or ()),
        timed_runs=tuple(_get(placement, "timed_runs") or ()),
        phases=tuple(_get(detail, "phases") or ()),
        calls=_calls(detail),
        clock=_get(detail, "clock"),
        session_events=tuple(_get(placement, "session_events") or ()),
        timings=record.get("timings"),
        parity=parity,
        outputs=_outputs(parity),
        ledger=record.get("ledger"),
        memory=record.get("memory"),
        provenance=_provenance(record),
        artifact_sha256=art.get("sha256"),
        notes=tuple(notes),
    )


# ----------------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class CompareRow:
    """One quantity of two records side by side; ``changed`` when they differ."""

    section: str
    label: str
    a: str
    b: str
    changed: bool


@dataclass(frozen=True)
class CompareView:
    """Two records of the same artifact side by side, and what changed."""

    a: ReportView
    b: ReportView
    same_artifact: bool
    rows: tuple[CompareRow, ...]
    moved: tuple[tuple[str, str, str], ...]  # (node, provider in A, provider in B)
    changes: tuple[str, ...]


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    return f"{value}{unit}"


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def _mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, int) and not isinstance(value, bool) else "—"


def _in_pool(ledger: Mapping[str, Any] | None, key: str) -> str:
    """A ledger figure with the pool it counts in: a device pool's peak is not the host's RSS."""
    figure, pool = _mib(_get(ledger, key)), _get(ledger, "pool", "name")
    return f"{figure} in {pool}" if figure != "—" and pool else figure


def _ms(timings: Mapping[str, Any] | None, block: str, key: str) -> Any:
    return _get(timings, block, key)


def _worst_rel_l2(view: ReportView) -> float | None:
    values = [o.rel_l2 for o in view.outputs if isinstance(o.rel_l2, (int, float))]
    return max(values) if values else None


def _ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0:
        return f"B/A {b / a:.2f}×"
    return ""


def compare_views(a: ReportView, b: ReportView) -> CompareView:
    """Two records side by side: placement, timings, parity, memory, and what changed.

    Args:
        a: the first record's view (the baseline).
        b: the second record's view.

    Returns:
        The rows, the nodes whose provider differs, and one sentence per change.
    """
    rows: list[CompareRow] = []

    def row(section: str, label: str, va: str, vb: str) -> None:
        rows.append(CompareRow(section, label, va, vb, va != vb))

    row("run", "outcome", a.headline, b.headline)
    row("run", "route", _fmt(a.route), _fmt(b.route))
    row("run", "device", _fmt(a.device), _fmt(b.device))
    row("run", "target EP", _fmt(a.target_ep), _fmt(b.target_ep))
    row("placement", "verdict", _fmt(_get(a.proof, "verdict")), _fmt(_get(b.proof, "verdict")))
    row(
        "placement",
        "node fraction",
        _pct(_get(a.proof, "node_fraction")),
        _pct(_get(b.proof, "node_fraction")),
    )
    row(
        "placement",
        "time fraction",
        _pct(_get(a.proof, "time_fraction")),
        _pct(_get(b.proof, "time_fraction")),
    )
    row(
        "placement",
        "nodes left on CPU",
        _fmt(sum(s.cpu_nodes for s in a.split if not s.partition) or None),
        _fmt(sum(s.cpu_nodes for s in b.split if not s.partition) or None),
    )
    row(
        "placement",
        "kernel time (timed runs)",
        _fmt(_get(a.proof, "kernel_time_total_us"), " µs"),
        _fmt(_get(b.proof, "kernel_time_total_us"), " µs"),
    )
    for block, label in (
        ("compute", "compute p50"),
        ("round_trip", "round trip p50"),
        ("transport", "transport p50"),
        ("round_trip", "round trip p90"),
    ):
        key = "p90_ms" if label.endswith("p90") else "p50_ms"
        va, vb = _ms(a.timings, block, key), _ms(b.timings, block, key)
        rows.append(
            CompareRow(
                "timings",
                label,
                _fmt(va, " ms"),
                _fmt(vb, " ms") + (f" ({_ratio(va, vb)})" if _ratio(va, vb) else ""),
                va != vb,
            )
        )
    row("parity", "verdict", _fmt(_get(a.parity, "verdict")), _fmt(_get(b.parity, "verdict")))
    row("parity", "worst rel_l2", _fmt(_worst_rel_l2(a)), _fmt(_worst_rel_l2(b)))
    row("memory", "worker host RSS peak", _mib(_get(a.memory, "peak_bytes")),
        _mib(_get(b.memory, "peak_bytes")))
    row("memory", "measured peak", _in_pool(a.ledger, "measured_peak_bytes"),
        _in_pool(b.ledger, "measured_peak_bytes"))
    row("memory", "budget", _in_pool(a.ledger, "budget_bytes"), _in_pool(b.ledger, "budget_bytes"))
    row(
        "provenance",
        "worker runtime",
        dict(a.provenance).get("worker runtime", "—"),
        dict(b.provenance).get("worker runtime", "—"),
    )

    providers_a = {str(n.get("name")): n.get("provider") for n in a.nodes}
    providers_b = {str(n.get("name")): n.get("provider") for n in b.nodes}
    moved = tuple(
        (name, _provider_cell(providers_a[name]), _provider_cell(providers_b[name]))
        for name in providers_a
        if name in providers_b
        and _side(providers_a[name], a.target_ep) != _side(providers_b[name], b.target_ep)
    )
    changes = [f"{r.section}: {r.label} {r.a} → {r.b}" for r in rows if r.changed and r.section != "run"]
    if moved:
        changes.append(
            f"placement: {len(moved)} node(s) changed side (target EP, CPU EP, fused away), "
            f"e.g. {', '.join(m[0] for m in moved[:5])}"
        )
    same = a.artifact_sha256 is not None and a.artifact_sha256 == b.artifact_sha256
    return CompareView(a=a, b=b, same_artifact=same, rows=tuple(rows), moved=moved, changes=tuple(changes))


def _provider_cell(provider: Any) -> str:
    """A node's provider in one run, or what having none means: the EP fused it into a
    neighbour's kernel, so no kernel of its own was seen (docs/external.md, "The proof")."""
    return "fused away (no kernel of its own)" if provider is None else str(provider)


def _side(provider: Any, target: str | None) -> str:
    if provider is None:
        return "unseen"
    return "target" if provider == target and provider != CPU_EP else "cpu" if provider == CPU_EP else "other"
