"""Turns one record into the short human summary that ``external`` and ``report`` both print.

Pure: a validated record in, ``(field, text)`` rows out. The objects other layers own (proof,
parity, timings) are shown generically — their verdict first, then their scalar facts and one
level of nested scalar maps — so the summary never breaks when those layers add fields.

.. versionadded:: 0.1
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xstage.ledger import format_bytes

__all__ = ["ledger_rows", "summary", "summary_rows"]

_MAX_ITEMS = 12


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(_fmt(v) for v in value) or "[]"
    return str(value)


def _bytes(n: Any) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return "-"
    return format_bytes(n)


def _is_scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (Mapping, list)) for v in value)


def _inner(obj: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_fmt(v[:_MAX_ITEMS] if isinstance(v, list) else v)}"
                    for k, v in sorted(obj.items())
                    if not isinstance(v, Mapping) and (not isinstance(v, list) or _is_scalar_list(v)))


def _scalars(obj: Mapping[str, Any], skip: tuple[str, ...] = ()) -> str:
    """``k=v`` for scalar entries, then ``k: a=1 b=2`` for flat sub-maps and lists of them."""
    flat: list[str] = []
    nested: list[str] = []
    for key in sorted(obj):
        if key in skip:
            continue
        value = obj[key]
        if isinstance(value, Mapping):
            inner = _inner(value)
            if inner:
                nested.append(f"{key}: {inner}")
        elif _is_scalar_list(value):
            flat.append(f"{key}={_fmt(value[:_MAX_ITEMS])}")
        elif isinstance(value, list):
            for index, item in enumerate(value[:_MAX_ITEMS]):
                if isinstance(item, Mapping):
                    label = item.get("name", index)
                    nested.append(f"{key} {label}: {_inner({k: v for k, v in item.items() if k != 'name'})}")
            if len(value) > _MAX_ITEMS:
                nested.append(f"{key}: … {len(value) - _MAX_ITEMS} more")
        else:
            flat.append(f"{key}={_fmt(value)}")
    parts = ([" ".join(flat)] if flat else []) + nested
    return "; ".join(parts)


def _refusal(r: Mapping[str, Any]) -> str:
    where = " ".join(p for p in (
        f"on {r['device']}" if r.get("device") else "",
        f"via {r['route']}" if r.get("route") else "",
    ) if p)
    head = f"{r.get('code')}/{r.get('cause')}" + (f" {where}" if where else "")
    return f"{head}: {r.get('message')} (remedy: {r.get('remedy')})"


def _verdict_row(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    rest = _scalars(obj, skip=("verdict",))
    return f"{obj.get('verdict')}" + (f" — {rest}" if rest else "")


def summary_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The summary of a (validated) record as ``(field, text)`` rows, in reading order."""
    rows: list[tuple[str, str]] = []
    outcome = doc["outcome"]
    head = f"{outcome['status']} (exit {outcome['exit_code']})"
    error = outcome.get("error")
    if error:
        head += f": {error['type']}: {error['message']}"
    rows.append(("outcome", head))
    if error and error.get("remedy"):
        rows.append(("remedy", str(error["remedy"])))
    for refusal in outcome["refusals"]:
        rows.append(("refusal", _refusal(refusal)))

    artifact = doc.get("artifact")
    if artifact:
        parts = [artifact["path"], artifact["format"]]
        if artifact.get("component"):
            parts.append(f"component {artifact['component']}")
        parts.append(f"sha256 {artifact['sha256'][:12]}…")
        parts.append(f"{_bytes(artifact['bytes'])} in {len(artifact['files'])} file(s)")
        parts.append(f"format from {artifact['format_source']}")
        rows.append(("artifact", ", ".join(parts)))
    else:
        rows.append(("artifact", "-"))

    request = doc["request"]
    asked = [f"{k}={_fmt(v)}" for k, v in sorted(request.items())
             if v not in (None, {}, []) and not isinstance(v, Mapping)]
    if isinstance(request.get("inputs"), Mapping):
        asked.append(f"inputs={request['inputs'].get('source')}")
    if request.get("ep_options"):
        asked.append("ep_options=" + ",".join(f"{k}={v}" for k, v in sorted(request["ep_options"].items())))
    rows.append(("request", " ".join(asked)))

    plan = doc.get("plan")
    if plan:
        chosen = plan.get("chosen")
        text = f"chosen {chosen['device']} via {chosen['route']}" if chosen else "nothing chosen"
        rows.append(("plan", text))
        for cand in plan["candidates"]:
            text = f"{cand['device']} via {cand['route']}: {cand['status']}"
            if cand.get("refusal"):
                text += f" ({cand['refusal']['code']}/{cand['refusal']['cause']})"
            rows.append(("candidate", text))

    worker = doc.get("worker")
    if worker:
        hello = worker.get("hello") or {}
        inner = hello.get("worker") if isinstance(hello.get("worker"), Mapping) else hello
        versions = inner.get("versions") if isinstance(inner, Mapping) else None
        text = f"{worker['route']}: {worker['interpreter']}"
        if isinstance(versions, Mapping) and versions:
            text += " (" + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ")"
        rows.append(("worker", text))
        if worker.get("log"):
            rows.append(("worker log", str(worker["log"])))

    for key in ("proof", "parity"):
        text = _verdict_row(doc.get(key))
        if text is not None:
            rows.append((key, text))
    timings = doc.get("timings")
    if timings:
        rows.append(("timings", _scalars(timings)))
    memory = doc.get("memory")
    if memory:
        rows.append(("memory", f"rss {_bytes(memory['rss_bytes'])}, peak {_bytes(memory['peak_bytes'])}"))
    rows.extend(ledger_rows(doc.get("ledger")))
    rows.append(("when", f"{doc['started']} → {doc['finished']}"))
    host = doc["host"]
    rows.append(("host", f"{host['hostname']} ({host['platform']}, Python {host['python']})"))
    rows.append(("xstage", f"{doc['xstage_version']}, record schema {doc['schema_version']}"))
    return rows


def ledger_rows(ledger: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The ledger's lines: budget against pool, measured peak, reservations, blind spots."""
    if not ledger:
        return []
    pool = ledger["pool"]
    held = f", {_bytes(ledger['held_bytes'])} held by open stages" if ledger["held_bytes"] else ""
    rows = [("budget", f"{_bytes(ledger['budget_bytes'])} in {pool['name']} "
                       f"({ledger['phase']} phase) of {_bytes(pool['capacity_bytes'])} "
                       f"({pool['source']}){held}")]
    if ledger.get("measured_peak_bytes"):
        extra = ", ".join(f"{k} {_bytes(ledger[k + '_bytes'])}" for k in ("uss", "pss")
                          if ledger.get(k + "_bytes"))
        rows.append(("measured", f"worker peak {_bytes(ledger['measured_peak_bytes'])}"
                                 f"{f' ({extra})' if extra else ''}: budget/measured "
                                 f"{ledger['budget_over_measured']:.2f}"))
    verdict = ledger["verdict"] + (f" ({ledger['cause']})" if ledger.get("cause") else "")
    rows.append(("ledger", verdict + " · " + " · ".join(
        f"{r['purpose']} {_bytes(r['bytes'])} {r['evidence']}" for r in ledger["reservations"])))
    rows.extend(("blind spot", spot) for spot in ledger.get("blind_spots") or [])
    rows.extend(("warning", w) for w in ledger.get("warnings") or [])
    return rows


def summary(doc: Mapping[str, Any]) -> list[str]:
    """The summary as plain ``field: text`` lines."""
    return [f"{field}: {text}" for field, text in summary_rows(doc)]
