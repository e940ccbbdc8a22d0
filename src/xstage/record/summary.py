"""The one human summary of a record: ``xstage external`` prints it, ``xstage report`` again.

Pure: a validated record in, ``(field, text)`` rows out, in reading order — what happened,
what ran, where, why we believe it, how well, how fast, what it cost, what was refused, and
where the record came from. Rendering (a table) is the CLI's.

Cases for the objects other layers own:

1. A proof with ``target_ep`` and node counts reads as a sentence (ops on a torch device, nodes
   on the EP by plan, or the share of kernel time), then what was left on the CPU.
2. Parity outputs that carry ``passed`` and ``criterion`` get one row each.
3. Timings with compute/round trip/transport blocks read as p50s, then the speedup if timed.
4. Anything else — an older record, a layer that added or renamed fields — is shown generically
   (``xstage.record._text``), so the summary never breaks on a valid record.

.. versionadded:: 0.1
.. versionchanged:: 0.1
   One summary for both commands: ``external`` prints no table of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from xstage.record._text import fmt, fmt_bytes, scalars, verdict_text

__all__ = ["ledger_rows", "summary", "summary_rows"]

Rows = list[tuple[str, str]]
_HUMAN_PROOF = ("target_ep", "nodes_on_target", "nodes_total")
_HUMAN_TIMINGS = ("compute", "round_trip", "transport", "runs", "warmup")


def _ms(block: Mapping[str, Any] | None, key: str = "p50_ms") -> str:
    return f"{block[key]:.3f} ms" if block and block.get(key) is not None else "-"


def _outcome(doc: Mapping[str, Any]) -> Rows:
    outcome = doc["outcome"]
    head = f"{outcome['status']} (exit {outcome['exit_code']})"
    error = outcome.get("error")
    if error:
        head += f": {error['type']}: {error['message']}"
    rows = [("outcome", head)]
    if error and error.get("remedy"):
        rows.append(("remedy", str(error["remedy"])))
    return rows


def _stage(doc: Mapping[str, Any]) -> Rows:
    art = doc.get("artifact")
    if not art:
        return [("stage", "-")]
    component = f", component {art['component']}" if art.get("component") else ""
    files = len(art.get("files") or [])
    size = fmt_bytes(art["bytes"]) + (f" in {files} files" if files > 1 else "")
    return [("stage", f"{art['path']} — {art['format']} ({art['format_source']}){component}, "
                      f"sha256 {art['sha256'][:12]}, {size}")]


def _request(doc: Mapping[str, Any]) -> Rows:
    request = doc["request"]
    asked = [f"{k}={fmt(v)}" for k, v in sorted(request.items())
             if v not in (None, {}, []) and not isinstance(v, Mapping)]
    if isinstance(request.get("inputs"), Mapping):
        asked.append(f"inputs={request['inputs'].get('source')}")
    for key in ("ep_options", "session_config"):
        if isinstance(request.get(key), Mapping) and request[key]:
            asked.append(f"{key}=" + ",".join(f"{k}={v}" for k, v in sorted(request[key].items())))
    return [("request", " ".join(asked))]


def _versions(worker: Mapping[str, Any]) -> Mapping[str, Any]:
    hello = worker.get("hello") or {}
    inner = hello.get("worker") if isinstance(hello.get("worker"), Mapping) else hello
    versions = inner.get("versions") if isinstance(inner, Mapping) else None
    return versions if isinstance(versions, Mapping) else {}


def _placement(doc: Mapping[str, Any]) -> Rows:
    plan, worker = doc.get("plan"), doc.get("worker")
    if not plan:
        return []
    chosen = plan.get("chosen")
    rows: Rows = []
    if chosen and worker:
        v, runtime = _versions(worker), worker.get("runtime") or {}
        engine = (f"torch {runtime['torch']} on {runtime.get('device')}" if runtime.get("torch")
                  else f"onnxruntime {v.get('onnxruntime')}")
        arm = " — the reference arm, not an offload" if plan.get("on_reference_arm") else ""
        rows.append(("placed on", f"{chosen['device']} via {chosen['route']}{arm} "
                                  f"(python {v.get('python')}, {engine})"))
    else:
        rows.append(("plan", f"chosen {chosen['device']} via {chosen['route']}" if chosen
                     else "nothing chosen"))
    if plan.get("mode") == "offload":
        rows.append(("offload", _offload_why(plan)))
    elif chosen and plan.get("on_reference_arm"):
        rows.append(("reference arm", f"{chosen['route']} runs the numeric gate's reference: the "
                     "stage ran where its reference runs, so nothing was offloaded"))
    for cand in plan["candidates"]:
        text = f"{cand['device']} via {cand['route']}: {cand['status']}"
        if cand.get("refusal"):
            text += f" ({cand['refusal']['code']}/{cand['refusal']['cause']})"
        rows.append(("candidate", text))
    return rows + _fallthrough(doc)


def _fallthrough(doc: Mapping[str, Any]) -> Rows:
    """Each device the plan refused whole (``plan.fallthrough``), unless ``outcome.refusals``
    (printed as ``refused``) already says it: a placed record's road not taken."""
    said = [r for r in doc["outcome"].get("refusals") or []]
    rows: Rows = []
    for r in (doc.get("plan") or {}).get("fallthrough") or []:
        if r not in said:
            where = r["device"] or "-"
            rows.append(("fell through", f"{where}: {r['code']} ({r['cause']}) {r['message']}"))
    return rows


def _offload_why(plan: Mapping[str, Any]) -> str:
    """Which route ran under the offload (the default plan), and why that one."""
    arms = set(plan.get("reference_arms") or ())
    offload = [c for c in plan["candidates"] if c["route"] not in arms]
    refused = ", ".join(f"{c['route']} on {c['device']}: {c['refusal']['cause']}"
                        for c in offload if c["status"] == "refused" and c.get("refusal"))
    chosen = plan.get("chosen")
    if chosen is None:
        return "every route refused the stage, the reference arm too"
    if chosen["route"] not in arms:
        after = f", after {refused}" if refused else ""
        return (f"{chosen['route']} on {chosen['device']} was the first offload route admitted"
                f"{after}; the reference arm ({', '.join(sorted(arms)) or 'none'}) was not needed")
    if not offload:
        return (f"no route here but the reference arm runs this format; it ran on "
                f"{chosen['route']} (xstage devices shows what is missing)")
    return f"no offload route was admitted ({refused}); it ran on the reference arm {chosen['route']}"


def _worker(doc: Mapping[str, Any]) -> Rows:
    worker = doc.get("worker")
    if not worker:
        return []
    versions = _versions(worker)
    text = f"{worker['route']}: {worker['interpreter']}"
    if versions:
        text += " (" + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ")"
    rows = [("worker", text)]
    if worker.get("log"):
        rows.append(("worker log", str(worker["log"])))
    rows.extend(("route hook", note) for note in worker.get("notes") or [])
    cache = worker.get("compile_cache")
    if isinstance(cache, Mapping) and cache.get("status"):
        text = str(cache["status"])
        if cache.get("status") in ("hit", "miss", "rebuilt", "unread", "unreadable"):
            text += (f" ({fmt_bytes(cache.get('bytes'))} in {cache.get('files')} files, "
                     f"key {str(cache.get('key'))[:12]})")
        if cache.get("reason"):
            text += f": {cache['reason']}"
        rows.append(("compile cache", text))
    return rows


def _proof(doc: Mapping[str, Any]) -> Rows:
    """The proof's rows, then the event fraction where the record carries it."""
    rows = _proof_rows(doc)
    proof = doc.get("proof")
    if rows and isinstance(proof, Mapping) and proof.get("event_fraction") is not None:
        rows.append(("event fraction", f"{proof['event_fraction']:.1%} of the first run's kernel "
                     f"events on {proof.get('target_ep')} (the event count: recorded, not what "
                     "decides)"))
    return rows


def _proof_rows(doc: Mapping[str, Any]) -> Rows:
    proof = doc.get("proof")
    if not proof:
        return []
    if not all(k in proof for k in _HUMAN_PROOF):
        return [("proof", verdict_text(proof))]  # case 4
    basis = proof.get("basis")
    if str(proof["target_ep"]).startswith("torch:"):  # case 1: the torch profiler's op log
        how = (f"{proof['nodes_on_target']}/{proof['nodes_total']} ops on {proof['target_ep']} "
               f"(op log of the warm-up), {proof.get('copies') or 0} host/device copies")
        if proof.get("time_fraction") is not None:
            how += f", {proof['time_fraction']:.1%} of op time"
    elif proof.get("node_basis") and proof.get("node_fraction") is not None:  # records from 0.2 on
        time = proof.get("time_fraction")
        how = (f"{proof['node_fraction']:.1%} of the nodes ({proof['node_basis']}), "
               + (f"{time:.1%}" if time is not None else "n/a") + f" of kernel time on {proof['target_ep']}")
        if proof.get("decided_by"):
            how += f"; the {proof['decided_by']} decided"
        if basis == "execution (plan incomplete)":
            how += " (plan incomplete)"
    elif basis == "plan":
        how = f"{proof['nodes_on_target']}/{proof['nodes_total']} nodes on {proof['target_ep']} (plan)"
        if proof.get("time_fraction") is not None:
            how += f", {proof['time_fraction']:.1%} of kernel time"
    else:
        how = f"{(proof.get('time_fraction') or 0):.1%} of kernel time on {proof['target_ep']}"
    left = proof.get("cpu_nodes") or {}
    return [("proof", f"{proof['verdict']}: {how}"),
            ("left on CPU", "; ".join(f"{op}: {', '.join(n)}" for op, n in left.items())
             if left else "nothing")]


def _device(doc: Mapping[str, Any]) -> Rows:
    """The attested device (records from before it existed have none: no row)."""
    att = doc.get("device_attestation")
    if not isinstance(att, Mapping):
        return []
    seen = att.get("observed") or "unattested"
    return [("device", f"{seen} (planned {att.get('planned')}; {att.get('source')}"
                       + (f": {att['detail']}" if att.get("detail") else "") + ")")]


def _parity(doc: Mapping[str, Any]) -> Rows:
    parity = doc.get("parity")
    if not parity:  # refused: the gate's criteria and tie-break of each gate refusal
        rows: Rows = []
        for r in doc["outcome"].get("refusals") or []:
            gate = (r.get("evidence") or {}).get("parity")
            if isinstance(gate, Mapping):
                rows += _gate_extras(gate)
        return rows
    outputs = parity.get("outputs") or []
    if not outputs or not all("passed" in o and "criterion" in o for o in outputs):
        return [("parity", verdict_text(parity)), *_gate_extras(parity)]  # case 4
    return [*((f"parity {o['name']}", f"{'passed' if o['passed'] else 'FAILED'}: {o['criterion']}")
              for o in outputs), *_gate_extras(parity)]  # case 2


def _tiebreak_text(tiebreak: Mapping[str, Any]) -> str:
    """The tie-break's row: its status, the graph whose float64 answer decided, each output's
    two distances (and whether the output is ill-conditioned), or why it was unavailable."""
    graph = tiebreak.get("graph")
    of = f" (float64 of {graph.get('name')}, {graph.get('kind')})" if isinstance(graph, Mapping) else ""
    detail = tiebreak.get("reason") or "; ".join(
        f"{o['name']}: stage {fmt(o['stage_rel_l2'])} vs reference {fmt(o['reference_rel_l2'])} "
        "rel_l2 from float64" + (", ill-conditioned (the reference arm itself is beyond the format's "
                                 "tolerance of float64)" if o.get("ill_conditioned") else "")
        for o in tiebreak.get("outputs") or [])
    return f"{tiebreak.get('status')}{of}: {detail}"


def _gate_extras(parity: Mapping[str, Any]) -> Rows:
    """Every gate criterion that is not the default, and the float64 tie-break, when present."""
    rows: Rows = []
    changed = parity.get("non_default") or []
    tol, default = parity.get("tolerance") or {}, parity.get("tolerance_defaults") or {}
    field = {"cosine": "min_cosine"}
    if changed:
        rows.append(("gate criteria", "not the default: " + ", ".join(
            f"{k}={fmt(tol.get(field.get(k, k)))} (default {fmt(default.get(field.get(k, k)))})"
            for k in changed)))
    tiebreak = parity.get("tiebreak")
    if isinstance(tiebreak, Mapping):
        rows.append(("float64 tie-break", _tiebreak_text(tiebreak)))
    tier = parity.get("tier")
    if isinstance(tier, Mapping):
        rows.append(("gate tier", f"{tier.get('decided')} (elem_a={fmt(tier.get('elem_a'))}, not "
                                  f"{fmt(tier.get('tight_elem_a'))}), {tier.get('verdict')}: "
                                  f"{tier.get('why')}"))
        rows.append(("noise tier misses", str(tier.get("cannot_catch"))))
    dequantized = parity.get("dequantized")
    if dequantized:
        rows.append(("dequantized", ", ".join(str(n) for n in dequantized)
                     + ": QuantizeLinear outputs compared as (q - zero_point)·scale"))
    return rows + _judged_rows(parity)


def _judged_rows(parity: Mapping[str, Any]) -> Rows:
    """The outputs judged by their own format, and an arm that disagreed with itself."""
    rows: Rows = []
    formats = parity.get("formats")
    if isinstance(formats, Mapping) and formats:
        rows.append(("judged formats", ", ".join(f"{k}: {v}" for k, v in formats.items())
                     + f" (the artifact: {parity.get('format')})"))
    det = parity.get("determinism")
    if isinstance(det, Mapping):
        arms = det.get("arms") if isinstance(det.get("arms"), Mapping) else {}
        said = ("refused" if not det.get("tolerance_named") else "admitted by the named --tolerance"
                if parity.get("verdict") == "passed" else "decided by the named --tolerance")
        ops = ", ".join(str(o) for o in det.get("random_ops") or []) or "none found in the graph"
        rows.append(("nondeterministic", f"{said}: the {', the '.join(arms)} disagreed with "
                     f"itself on two computations of the same inputs; random ops: {ops}"))
    sets = parity.get("slot_sets")
    if isinstance(sets, Mapping):
        rows.append(("slot sets", f"not checked: {sets['skipped']}" if sets.get("skipped") else
                     f"{sets.get('sets')} checked: set {sets['differs']} answered the gate's inputs "
                     "otherwise than set 0" if sets.get("differs") is not None else
                     f"{sets.get('sets')} checked: each answered the gate's inputs bit for bit as set 0"))
    return rows


def _timings(doc: Mapping[str, Any]) -> Rows:
    t = doc.get("timings")
    if not t:
        return []
    if not all(k in t for k in _HUMAN_TIMINGS):
        return [("timings", scalars(t))]  # case 4
    rows = [("timings", f"compute {_ms(t['compute'])} · round trip {_ms(t['round_trip'])} · transport "
                        f"{_ms(t['transport'])} (p50 of {t['runs']} runs after {t['warmup']} warm-ups)")]
    for series, label in (("round_trip", "round trip"), ("compute", "compute")):
        if _is_percentiles(t.get("percentiles"), series):
            rows.append((f"{label} pctl", _percentile_text(t["percentiles"], series)))
    if isinstance(t.get("throughput"), Mapping):
        rows.append(("throughput", _throughput_text(t["throughput"])))
    if t.get("speedup_vs_reference"):
        rows.append(("vs CPU", f"reference {_ms(t.get('reference'))} → "
                               f"{t['speedup_vs_reference']:.2f}× speedup"))
    return rows


def _is_percentiles(value: Any, series: str) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(p, Mapping) and {"key", "needs_runs", f"{series}_ms"} <= p.keys() for p in value)


def _percentile_text(entries: list[Mapping[str, Any]], series: str) -> str:
    """Case 3: ``p50 1.200 ms · p99 n/a (needs ≥ 100 runs)``."""
    return " · ".join(
        f"{p['key']} {p[f'{series}_ms']:.3f} ms" if p[f"{series}_ms"] is not None
        else f"{p['key']} n/a (needs ≥ {p['needs_runs']} runs)" for p in entries)


def _throughput_text(t: Mapping[str, Any]) -> str:
    """Case 3: requests/s at a depth, then the latency percentiles of those requests."""
    rps = t.get("requests_per_s")
    text = (f"{rps:.1f} requests/s" if isinstance(rps, int | float) else "-")
    if isinstance(t.get("items_per_s"), int | float):
        text += f" ({t['items_per_s']:.1f} items/s at batch {t.get('batch')})"
    text += f" at depth {t.get('depth')}"
    if isinstance(t.get("concurrency"), int):
        text += f", {t['concurrency']} computed at once"
    text += f" ({t.get('requests')} requests in {fmt(t.get('wall_s'))} s)"
    if _is_percentiles(t.get("percentiles"), "latency"):
        text += "; latency " + _percentile_text(t["percentiles"], "latency")
    if t.get("note"):
        text += f"; {t['note']}"
    return text


def _memory(doc: Mapping[str, Any]) -> Rows:
    memory = doc.get("memory")
    if not memory:
        return []
    return [("memory", f"rss {fmt_bytes(memory['rss_bytes'])}, peak {fmt_bytes(memory['peak_bytes'])}")]


def ledger_rows(ledger: Mapping[str, Any] | None) -> Rows:
    """The ledger's lines: budget against pool, measured peak, reservations, blind spots."""
    if not ledger:
        return []
    pool = ledger["pool"]
    held = f", {fmt_bytes(ledger['held_bytes'])} held by open stages" if ledger["held_bytes"] else ""
    rows = [("budget", f"{fmt_bytes(ledger['budget_bytes'])} in {pool['name']} "
                       f"({ledger['phase']} phase) of {fmt_bytes(pool['capacity_bytes'])} "
                       f"({pool['source']}){held}")]
    if ledger.get("measured_peak_bytes"):
        extra = ", ".join(f"{k} {fmt_bytes(ledger[k + '_bytes'])}" for k in ("uss", "pss")
                          if ledger.get(k + "_bytes"))
        rows.append(("measured", f"worker peak {fmt_bytes(ledger['measured_peak_bytes'])}"
                                 f"{f' ({extra})' if extra else ''}: budget/measured "
                                 f"{ledger['budget_over_measured']:.2f}"))
    if ledger.get("peak_basis") == "unprofiled" and ledger.get("profiled_peak_bytes"):
        rows.append(("profiled", f"warm-up peak {fmt_bytes(ledger['profiled_peak_bytes'])} with "
                                 "the profiler's events, the proof's cost: the stage serves from "
                                 "an unprofiled session, measured apart"))
    verdict = ledger["verdict"] + (f" ({ledger['cause']})" if ledger.get("cause") else "")
    rows.append(("ledger", verdict + " · " + " · ".join(
        f"{r['purpose']} {fmt_bytes(r['bytes'])} {r['evidence']}" for r in ledger["reservations"])))
    rows.extend(("blind spot", spot) for spot in ledger.get("blind_spots") or [])
    rows.extend(("warning", w) for w in ledger.get("warnings") or [])
    return rows


def _refusals(doc: Mapping[str, Any]) -> Rows:
    """Each refusal as the CLI's error line words it (``code (cause) route on device: …``)."""
    rows: Rows = []
    for r in doc["outcome"].get("refusals") or []:
        where = " on ".join(x for x in (r.get("route"), r.get("device")) if x)
        text = r["message"] if r["message"].startswith(where) else f"{where}: {r['message']}"
        rows.append(("refused", f"{r['code']} ({r['cause']}) {text}"))
        rows.append(("remedy", r["remedy"]))
    return rows


def _provenance(doc: Mapping[str, Any]) -> Rows:
    host = doc["host"]
    return [("when", f"{doc['started']} → {doc['finished']}"),
            ("host", f"{host['hostname']} ({host['platform']}, Python {host['python']})"),
            ("xstage", f"{doc['xstage_version']}, record schema {doc['schema_version']}")]


def _cluster(doc: Mapping[str, Any]) -> Rows:
    """Where a cluster stage ran (the record's ``cluster`` block, docs/cluster.md)."""
    block = doc.get("cluster")
    if not block:
        return []
    asked = ", ".join(f"{k}={v:g}" for k, v in block["resources"].items()) or "nothing"
    if not block.get("node_id"):
        return [("cluster", f"Ray {block['ray_version']}: no node placed ({asked})")]
    ledger = block.get("ledger") or {}
    return [("cluster", f"Ray node {block['hostname']} ({block['node_id']}, "
                        f"{block.get('address')}) for {asked}; generation "
                        f"{block.get('generation', 1)}; charged to that node's "
                        f"{ledger.get('pool') or 'ledger'}")]


_SECTIONS: tuple[Callable[[Mapping[str, Any]], Rows], ...] = (
    _outcome, _stage, _request, _cluster, _placement, _worker, _proof, _device, _parity, _timings, _memory,
    lambda doc: ledger_rows(doc.get("ledger")), _refusals, _provenance,
)


def summary_rows(doc: Mapping[str, Any]) -> Rows:
    """The summary of a (validated) record as ``(field, text)`` rows, in reading order."""
    return [row for section in _SECTIONS for row in section(doc)]


def summary(doc: Mapping[str, Any]) -> list[str]:
    """The summary as plain ``field: text`` lines."""
    return [f"{field}: {text}" for field, text in summary_rows(doc)]
