"""Proof of placement: what four profiled runs and onnxruntime's plan say about where a stage ran.

Pure: text and lists in, a frozen :class:`PlacementProof` out. No processes, no sessions. The
worker collects, for its profiled warm-up (four runs of the same inputs), the profile file's
text, onnxruntime's node assignment (the *plan*), the session's providers, the fallback banner
if one was printed, and the node names the session ran with (checked, or a renamed copy's,
with the original each stands for); :func:`prove` judges them. It raises only on malformed
*arguments* (``min_placement`` outside [0, 1], an assignment that is not the worker's shape);
bad news — no profile, a profile that does not parse, a name that is not ours, an EP that took
nothing, a provider swapped behind our back, layers that contradict each other — is a verdict
with a cause and notes, never an exception. The stage layer turns a verdict other than
``placed`` into the refusal ``execution_provider_declined_graph`` with
:attr:`PlacementProof.cause` (docs/design.md §5, §7).

The rules follow docs/design.md §5's layers, then its conflict table, then the verdict; each helper
cites its number (``_check_arguments`` is rule 0, it judges no evidence):

1. **Execution** (docs/design.md §5, layer 1; ``_read_execution``).
   a. The profile is read by :func:`parse_profile`; one that is not whole (it ends early, or a
      line could not be read) is not used: a kernel we did not see could be the one on the CPU.
   b. Runs: the profile is split by its ``model_run`` events (by their time span; by file order
      when a span is missing). The time fraction sums runs 2–4, leaving out the first run's
      start-up costs; a profile of one run is used whole, with a note. Where the median of the
      timed runs' own fractions (the lower middle of two) is below the sum's, it is the time
      fraction, with a note: a busy machine only adds time, and one preempted run's delay
      inside a target kernel must not carry the sum past the threshold (measured: a Scan of
      10,338 empty steps on the CPU beside an OpenVINO MatMul, 0.0006 of the time on OpenVINO
      quiet, summed to 0.647 on a machine at load 10-14). It never raises the fraction.
   c. Names (docs/design.md §5, "Untrusted text"; :mod:`xstage.evidence.names`): every kernel event's
      name must be one of the node names the session ran with, or an onnxruntime-derived form
      of one, and agree with its ``op_name``. One failure makes the execution layer unusable.
   d. Kernels: events of category ``Node`` named ``*_kernel_time``, grouped by ``args.provider``;
      ``Memcpy*`` kernels are copies, counted as not on the target. Time fraction = kernel time
      on the target / all kernel time (copies included in the whole), summed over the timed
      runs; kernel counts are of one run (the last timed).
   e. Control flow: an ``If``/``Loop``/``Scan`` kernel's event holds its children's (its body's
      kernels, which have events of their own, each counted for its provider). Its *own* time —
      its event less its direct children's (the kernels that started inside its span, on its
      thread, and inside no control-flow kernel nested in it) — counts for the provider that ran
      it: a Scan on the CPU whose steps do work with no kernel of their own is CPU time
      (measured: a Scan of 150 empty steps, ``ov124_scan``). An event with no timestamp cannot
      be split: its whole time counts off the target.
2. **Plan** (layer 2; ``_read_plan``; onnxruntime >= 1.24, session config
   ``session.record_ep_graph_assignment_info``).
   a. Which EP each node was assigned to, members of fused partitions included, as
      partitioned (``MatMul`` + ``Add`` may already be one ``Gemm``); ``Memcpy*`` nodes are copies.
   b. Its names pass the same check as 1c, or the plan is not used.
   c. Node fraction = 1 − (original nodes the plan put on other providers) / the original
      nodes the plan lists (``node_basis: plan``): what onnxruntime runs after its optimizations,
      each member of a fused or compiled partition once, a control-flow node where it runs;
      copies and nodes onnxruntime inserted are no original nodes, and a node it removed (an
      ``Identity``, a constant-folded shape computation) counts nowhere — never the graph's own
      node count, which padding with removable nodes would steer (``ov124_padded30``).
3. **Device attestation** (layer 3): not judged here. Which device the EP bound is checked
   before this proof, in its own pure module; docs/design.md §5's conflict case (c), ``device_mismatch``,
   is decided there.
4. **Strict construction** (layer 4; ``_detect_swap``): the provider is *swapped* when the
   requested EP (or the target) is not among the session's providers — not in this build,
   failed to create, or rebuilt on the CPU by the Python layer — or when the fallback banner
   was seen (target other than the CPU EP).
5. **When the layers disagree** (docs/design.md §5's conflict table; ``_resolve_layers``).
   a. *Plan incomplete*: the plan is absent (or unusable, 2b), or lists none of the target's
      nodes, or only nodes onnxruntime inserted (layout transposes, copies: no node of the
      graph's own), while the execution shows the target (plugin EPs leave their own nodes out
      of it: measured with WebGPU on onnxruntime 1.30). The execution decides, only if every event
      passed the name check (1c): basis ``execution (plan incomplete)``, node fraction =
      1 − (original nodes the name-checked kernel events put on other providers) / the original
      nodes they ran, each once (``node_basis: execution``; a node onnxruntime removed has no
      kernel). Otherwise nothing usable was measured.
   b. Both layers name the target and disagree (one fraction reaches ``min_placement``, the
      other does not, or one is zero): the lower fraction decides; the record lists the conflict.
   c. The attested device is not the planned one: ``device_mismatch`` (rule 3, not here).
   d. ``evidence_conflict``: the plan names the target but the execution layer is unusable (an
      event failed the name check, the profile is not whole) or gives no time fraction.
   e. ``unmeasured``: neither layer gave evidence.
   f. A compiled partition (one kernel for nodes it does not name: ``<EP>-subgraph_<k>``, a
      plugin EP's ``<EP>_<hash>_<k>``) ran on the target and the execution decides (5a): its
      members are not known. The node fraction lies between ``on / (on + off)`` (each partition
      holds one node) and the same with every graph node no kernel names counted on the target;
      a threshold outside the bounds decides (the bound that decides is the fraction), one
      between them is ``unmeasured`` (cause ``unmeasured``).
6. **Verdict** (``_judge``). The verdict set is closed: ``placed``, ``declined``, ``unmeasured``.
   a. Swapped (rule 4): ``cause="provider_swapped"``, never ``placed``; ``declined`` only if the
      evidence was measured and shows zero on the target, otherwise ``unmeasured``.
   b. No evidence (5d, 5e, 5f): ``unmeasured``, cause ``evidence_conflict`` or ``unmeasured``.
      **Unmeasured never passes and is never reported as declined.**
   c. ``placed`` (``cause=None``) iff the node fraction and the time fraction are both ``> 0``
      and both reach ``min_placement``; :attr:`PlacementProof.fraction` is the lower of the two
      and :attr:`PlacementProof.decided_by` names it.
   d. Otherwise ``declined``, ``cause="declined"`` (measured, below the threshold).
7. **The EP's own report** (``_read_ep_report``, :mod:`xstage.evidence.ep_report`),
   where the route asks for one (VitisAI: onnxruntime's plan shows its partitions as fused nodes,
   so CPU work inside them is invisible there).
   a. Asked for and not written, or unusable (malformed, a node the graph does not have, counts
      that disagree), beside a ``placed`` verdict: ``unmeasured`` — cause ``unmeasured`` when
      there is no report, ``evidence_conflict`` when there is one that cannot be believed. It never
      passes. (A verdict other than ``placed`` stands: the report only ever lowers a fraction.)
   b. Usable: its fraction (nodes on the target device / nodes it lists) is a third fraction; the
      lowest of the three decides (the report decides where it is stricter than onnxruntime's
      layers), and a disagreement across the threshold is listed as a conflict (as 5b).

A target of ``CPUExecutionProvider`` (the ``ort-cpu`` route) is judged by the same rules: it
is placed when the evidence shows the nodes on the CPU.

.. versionadded:: 0.1
.. versionchanged:: 0.2
   Rules renumbered after docs/design.md §5's layers and conflict table; names checked; runs 2–4
   timed; node and time fractions both gate.
.. versionchanged:: 0.3
   Control flow's own time counts (1e); the node fraction's whole is the nodes that ran (2c,
   5a), compiled partitions without a plan give bounds (5f).
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from xstage.evidence.ep_report import EpReport, read_report
from xstage.evidence.names import INSERTED, NameCheck, SessionNames, check_names, session_names
from xstage.evidence.profile import ParsedProfile, parse_profile
from xstage.evidence.proof import Basis, Cause, PlacementProof, Verdict

__all__ = ["CONTROL_FLOW_OPS", "COPY_OPS", "CPU_EP", "prove"]

#: Control-flow ops: their kernel time contains their children's, which have events of their own.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
#: Copy ops onnxruntime inserts between EPs with different memory.
COPY_OPS = frozenset({"MemcpyFromHost", "MemcpyToHost"})
#: onnxruntime's CPU execution provider.
CPU_EP = "CPUExecutionProvider"

_KERNEL_SUFFIX = "_kernel_time"
_UNKNOWN_PROVIDER = "<unknown provider>"  # a kernel event without args.provider
_TIMED_RUNS = (2, 3, 4)  # rule 1b: the runs the time fraction sums (1-based)
_INCOMPLETE: Basis = "execution (plan incomplete)"


# --------------------------------------------------------------------------- execution and plan


@dataclass(frozen=True)
class _Execution:
    kernels: dict[str, int]  # compute kernels by provider, in one run (the last timed)
    time_us: dict[str, int]  # compute kernels' time and control flow's own time, by provider
    copies: int
    copy_time_us: int
    control_flow: int
    control_flow_time_us: int  # their events' whole time
    control_flow_own_us: int  # their own time (rule 1e), counted in time_us
    nodes: list[tuple[str, str, str]]  # (provider, op, original node) of compute and control-flow kernels
    runs: int
    timed_runs: tuple[int, ...]
    names: NameCheck | None  # rule 1c; None when no names were given to check against
    own_unknown: int = 0  # control-flow events without a timestamp: their time counted off the target
    #: every kernel event of the first run by provider, copies and control flow included: the
    #: seed's metric (``event_fraction``), recorded beside the verdict's, never deciding it
    events: dict[str, int] = field(default_factory=dict)
    #: each timed run's own time fraction (rule 1b), None for a run whose kernels took 0 us
    run_fractions: tuple[float | None, ...] = ()


def _kernel_node_name(event_name: str) -> str:
    return event_name[: -len(_KERNEL_SUFFIX)]


def _is_kernel(event: Mapping[str, Any]) -> bool:
    return bool(event["cat"] == "Node" and event["name"].endswith(_KERNEL_SUFFIX))


def _is_copy(op: str, name: str) -> bool:
    return op.startswith("Memcpy") or (not op and name.startswith("Memcpy"))


def _split_runs(events: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Rule 1b: the kernel events of each ``model_run``, by its time span, else by file order."""
    runs = [e for e in events if e["cat"] == "Session" and e["name"] == "model_run"]
    kernels = [e for e in events if _is_kernel(e)]
    if not runs:
        return [kernels] if kernels else []
    if all(isinstance(r.get("ts"), int) for r in runs) and all(isinstance(k.get("ts"), int) for k in kernels):
        out: list[list[Mapping[str, Any]]] = [[] for _ in runs]
        for k in kernels:
            for i, r in enumerate(runs):
                if r["ts"] <= k["ts"] <= r["ts"] + r["dur"]:
                    out[i].append(k)
                    break
            else:  # outside every run: kept with the first (untimed) run
                out[0].append(k)
        return out
    by_order: list[list[Mapping[str, Any]]] = [[]]
    for e in events:
        if e["cat"] == "Session" and e["name"] == "model_run":
            by_order.append([])
        elif _is_kernel(e):
            by_order[-1].append(e)
    tail = by_order.pop()
    by_order[-1].extend(tail)  # kernels after the last model_run belong to it
    return by_order


def _own_times(run: Sequence[Mapping[str, Any]]) -> dict[int, int | None]:
    """Rule 1e: each control-flow kernel's own time (by ``id`` of its event): its duration less
    its direct children's — the kernels that started inside its span, on its thread, and inside
    no control-flow kernel nested in it; None where it has no timestamp."""
    flows = [e for e in run if (e["op_name"] or "") in CONTROL_FLOW_OPS]
    if not flows:
        return {}
    children: dict[int, int] = {id(e): 0 for e in flows}
    timed = sorted((e for e in run if e["ts"] is not None), key=lambda e: (e["ts"], -e["dur"]))
    open_spans: dict[Any, list[Mapping[str, Any]]] = {}  # per thread: the control flow around
    for event in timed:
        stack = open_spans.setdefault(event.get("tid"), [])
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < event["ts"]:
            stack.pop()
        if stack:  # the innermost control-flow kernel it started in
            children[id(stack[-1])] += event["dur"]
        if (event["op_name"] or "") in CONTROL_FLOW_OPS:
            stack.append(event)
    return {id(f): None if f["ts"] is None else max(0, f["dur"] - children[id(f)]) for f in flows}


def _execution(events: Sequence[Mapping[str, Any]], names: SessionNames | None,
               target: str) -> _Execution:
    """Rule 1b–1e: split into runs, check every kernel's name, count the timed runs."""
    per_run = _split_runs(events)
    n_runs = sum(1 for e in events if e["cat"] == "Session" and e["name"] == "model_run")
    timed = tuple(i for i in _TIMED_RUNS if i <= len(per_run)) if len(per_run) > 1 else (1,) * bool(per_run)
    check = None
    if names is not None:
        check = check_names(((_kernel_node_name(e["name"]), e["op_name"] or "", e["provider"])
                             for run in per_run for e in run), names)
    kernels: dict[str, int] = {}
    time_us: dict[str, int] = {}
    copies = copy_time = control = control_time = control_own = own_unknown = 0
    nodes: list[tuple[str, str, str]] = []
    run_fractions: list[float | None] = []
    for index in timed:
        counted = index == timed[-1]  # counts are of one run (the last timed); times add up
        own = _own_times(per_run[index - 1])
        target_before = time_us.get(target, 0)
        whole_before = sum(time_us.values()) + copy_time
        for event in per_run[index - 1]:
            op = event["op_name"] or ""
            name = _kernel_node_name(event["name"])
            provider = event["provider"] or _UNKNOWN_PROVIDER
            if _is_copy(op, name):
                copies += counted
                copy_time += event["dur"]
                continue
            original = check.originals.get(name, name) if check is not None else name
            nodes.append((provider, op or "<unknown op>", original))
            dur = event["dur"]
            if op in CONTROL_FLOW_OPS:  # rule 1e: its own time, for the provider that ran it
                control += counted
                control_time += dur
                mine = own[id(event)]
                if mine is None:  # no timestamp: its children cannot be told apart; never the target's
                    own_unknown += 1
                    mine = 0 if provider == target else dur
                control_own += mine
                time_us[provider] = time_us.get(provider, 0) + mine
                continue
            if counted:
                kernels[provider] = kernels.get(provider, 0) + 1
            time_us[provider] = time_us.get(provider, 0) + dur
        run_fractions.append(_fraction(time_us.get(target, 0) - target_before,
                                       sum(time_us.values()) + copy_time - whole_before))
    first_run: dict[str, int] = {}
    for event in per_run[0] if per_run else ():
        provider = event["provider"] or _UNKNOWN_PROVIDER
        first_run[provider] = first_run.get(provider, 0) + 1
    return _Execution(kernels, time_us, copies, copy_time, control, control_time, control_own, nodes, n_runs,
                      timed, check, own_unknown, first_run, tuple(run_fractions))


@dataclass(frozen=True)
class _Plan:
    nodes: list[tuple[str, str, str]]  # (ep, op_type, label) without copies
    copies: int
    raw: list[tuple[str, str]]  # (name, op_type) as onnxruntime wrote them, copies included


def _plan(assignment: Any) -> _Plan:
    """Rule 0: the worker's shape or an exception naming the bad element."""
    if isinstance(assignment, (str, bytes)) or not isinstance(assignment, Sequence):
        raise TypeError(f"assignment must be a list of subgraphs, not {type(assignment).__name__}")
    rows: list[tuple[str, str, str]] = []
    for i, subgraph in enumerate(assignment):
        if not isinstance(subgraph, Mapping) or not isinstance(subgraph.get("ep"), str):
            raise ValueError(f"assignment[{i}] must be a mapping with a string 'ep'")
        nodes = subgraph.get("nodes")
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
            raise ValueError(f"assignment[{i}].nodes must be a list of nodes")
        for j, node in enumerate(nodes):
            if not isinstance(node, Mapping) or not isinstance(node.get("op_type"), str):
                raise ValueError(f"assignment[{i}].nodes[{j}] must be a mapping with a string 'op_type'")
            name = node.get("name")
            if name is not None and not isinstance(name, str):
                raise ValueError(f"assignment[{i}].nodes[{j}].name must be a string")
            rows.append((subgraph["ep"], node["op_type"], name or ""))
    unnamed: dict[str, int] = {}
    nodes_out, copies = [], 0
    for ep, op_type, name in rows:
        if not name:  # `<op_type>#<i>`, numbered over the whole plan in its order
            index = unnamed.get(op_type, 0)
            unnamed[op_type] = index + 1
            name = f"{op_type}#{index}"
        if op_type in COPY_OPS or op_type.startswith("Memcpy"):
            copies += 1
            continue
        nodes_out.append((ep, op_type, name))
    return _Plan(nodes_out, copies, [(name, op_type) for _, op_type, name in rows])


def _group(rows: Sequence[tuple[str, str, str]], target: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """Off-target nodes as ``{ep: {op_type: (names, ...)}}``, first-seen order, no repeats."""
    grouped: dict[str, dict[str, list[str]]] = {}
    for ep, op_type, name in rows:
        if ep == target:
            continue
        names = grouped.setdefault(ep, {}).setdefault(op_type, [])
        if name not in names:
            names.append(name)
    return {ep: {op: tuple(names) for op, names in ops.items()} for ep, ops in grouped.items()}


def _fraction(part: int, whole: int) -> float | None:
    return part / whole if whole > 0 else None


def _fmt(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction:.4g}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _counts(by_ep: Mapping[str, int]) -> str:
    return ", ".join(f"{n} on {ep}" for ep, n in by_ep.items())


def _strings(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
        isinstance(v, str) for v in value
    ):
        raise TypeError(f"{what} must be a list of strings or None")
    return tuple(value)


_Groups = Mapping[str, Mapping[str, tuple[str, ...]]]


def _frozen_groups(groups: _Groups) -> _Groups:
    return MappingProxyType({ep: MappingProxyType(dict(ops)) for ep, ops in groups.items()})


# --------------------------------------------------------------------------- the rules, one helper each


@dataclass(frozen=True)
class _Arguments:
    """Rule 0's output: the arguments, checked and normalized."""

    target: str
    requested: str
    session: tuple[str, ...] | None
    available: tuple[str, ...] | None
    fallback_banner: str | None
    graph_count: int | None
    graph_total: int | None  # the graph's nodes, copies excluded: a bound on the node fraction's whole
    names: SessionNames | None
    plan: _Plan | None
    min_placement: float


def _check_arguments(target_ep: str, requested_ep: str | None, min_placement: float,
                     session_providers: Sequence[str] | None, available_providers: Sequence[str] | None,
                     fallback_banner: str | None, graph_nodes: Sequence[Mapping[str, Any]] | None,
                     assignment: Sequence[Mapping[str, Any]] | None,
                     node_names: Mapping[str, Any] | None) -> _Arguments:
    """Rule 0 (arguments): a malformed argument raises; bad evidence never does."""
    if isinstance(min_placement, bool) or not isinstance(min_placement, numbers.Real) or not (
        math.isfinite(min_placement) and 0.0 <= min_placement <= 1.0
    ):
        raise ValueError(f"min_placement must be a number in [0, 1], not {min_placement!r}")
    if not isinstance(target_ep, str) or not target_ep:
        raise ValueError(f"target_ep must be a non-empty string, not {target_ep!r}")
    requested = target_ep if requested_ep is None else requested_ep
    if not isinstance(requested, str) or not requested:
        raise ValueError(f"requested_ep must be a non-empty string or None, not {requested_ep!r}")
    session = _strings(session_providers, "session_providers")
    available = _strings(available_providers, "available_providers")
    if fallback_banner is not None and not isinstance(fallback_banner, str):
        raise TypeError("fallback_banner must be a string or None")
    graph_count = graph_total = None
    if graph_nodes is not None:
        if isinstance(graph_nodes, (str, bytes)) or not isinstance(graph_nodes, Sequence) or not all(
            isinstance(n, Mapping) for n in graph_nodes
        ):
            raise TypeError("graph_nodes must be a list of mappings or None")
        graph_count = len(graph_nodes)
        graph_total = sum(1 for n in graph_nodes if not str(n.get("op_type") or "").startswith("Memcpy"))
    plan = _plan(assignment) if assignment is not None else None
    names = session_names(graph_nodes, node_names)
    return _Arguments(target_ep, requested, session, available, fallback_banner, graph_count,
                      graph_total, names, plan, float(min_placement))


def _read_execution(parsed: ParsedProfile, names: SessionNames | None, target: str,
                    notes: list[str]) -> _Execution | None:
    """Rule 1 (execution): a whole profile with at least one compute kernel, split into runs
    (1b) and name-checked (1c). Returns None when there is no such profile; a profile whose
    names failed is returned, and rule 5 decides what it may still say (nothing)."""
    notes.extend(f"profile: {note}" for note in parsed.notes)
    if names is not None and names.problems:
        notes.append("names: the session ran with names that fail the check (the worker did not rename): "
                     + "; ".join(names.problems[:5]))
    if names is not None and names.renamed:
        notes.append("names: the worker ran a renamed copy of the graph; nodes are named by their originals")
    if parsed.complete:
        execution = _execution(parsed.events, names, target)
        if execution.kernels or execution.control_flow_own_us:
            return execution
        notes.append("profile: no compute kernel events (category Node, *_kernel_time): "
                     "no execution evidence")
    elif parsed.method != "none":
        notes.append("profile: not used as evidence (incomplete)")
    return None


@dataclass(frozen=True)
class _Layers:
    """Rule 5's output: which layer decides, both fractions, and the conflicts seen."""

    basis: Basis | None
    node_fraction: float | None
    node_basis: str | None
    time_fraction: float | None
    kernel_fraction: float | None
    plan_on: int | None
    plan_total: int | None
    plan_off_originals: tuple[str, ...]
    conflict_cause: Cause | None  # evidence_conflict (rule 5d) or unmeasured (rule 5f), or None
    conflicts: tuple[str, ...]
    off: dict[str, dict[str, tuple[str, ...]]]
    whole: int | None = None  # the node fraction's whole: original nodes that ran (rules 2c, 5a)


def _read_plan(args: _Arguments, ort_version: str | None,
               notes: list[str]) -> tuple[dict[str, int], int | None, int | None, NameCheck | None]:
    """Rule 2 (plan): nodes per EP, all nodes, nodes on the target, and the name check (2b)."""
    by_ep: dict[str, int] = {}
    plan = args.plan
    if plan is None:
        version = f"onnxruntime {ort_version}" if ort_version else "this onnxruntime"
        notes.append(f"plan: none ({version} has no assignment API, or it was not recorded)"
                     if ort_version is not None else "plan: none")
        return by_ep, None, None, None
    for ep, _, _ in plan.nodes:
        by_ep[ep] = by_ep.get(ep, 0) + 1
    total = len(plan.nodes)
    if total:
        notes.append(f"plan: {_n(total, 'node')} ({_counts(by_ep)})"
                     + (f", {plan.copies} Memcpy nodes left out" if plan.copies else ""))
    else:
        notes.append("plan: empty (no node recorded)")
    check = check_names(((name, op, None) for name, op in plan.raw), args.names) if args.names else None
    if check is not None and not check.passed:
        notes.append(f"plan: not used: {_n(check.failed, 'name')} failed the name check (rule 2b): "
                     + "; ".join(check.failures[:3]))
    return by_ep, total, by_ep.get(args.target, 0), check


def _originals(rows: Sequence[tuple[str, str]], target: str) -> tuple[set[str], set[str]]:
    """Rules 2c and 5a: the original nodes on the target and off it, from ``(provider, original)``
    rows; a node onnxruntime inserted is no original node, and one it removed has no row."""
    on = {orig for ep, orig in rows if ep == target and not orig.startswith(INSERTED)}
    off = {orig for ep, orig in rows if ep != target and not orig.startswith(INSERTED)}
    return on - off, off


def _node_fraction(on: set[str], off: set[str]) -> tuple[float, int]:
    """Rules 2c and 5a: 1 − off-target original nodes / all original nodes that ran."""
    whole = len(on | off)
    return (1.0 - len(off) / whole if whole else 0.0), whole


def _partition_bounds(on: set[str], off: set[str], graph_total: int | None) -> tuple[float, float]:
    """Rule 5f: the node fraction's bounds when compiled partitions ran on the target and no plan
    lists their members: each holds at least one node, and at most the graph's nodes not seen."""
    low = len(on) / (len(on) + len(off)) if on or off else 0.0
    if graph_total is None or graph_total < len(on | off):
        return low, 1.0
    most = len(on) + (graph_total - len(on | off))
    return low, most / (most + len(off)) if most + len(off) else 0.0


def _execution_basis(args: _Arguments, execution: _Execution, time_fraction: float,
                     kernel_fraction: float | None, plan_on: int | None, plan_total: int | None,
                     notes: list[str]) -> _Layers:
    """Rules 5a and 5f: the execution decides; its node fraction counts the name-checked kernels'
    original nodes, each once (one onnxruntime removed has no kernel); where a compiled partition
    ran on the target and no plan lists its members, only bounds are known."""
    target = args.target
    on_set, off_set = _originals([(ep, orig) for ep, _, orig in execution.nodes], target)
    off = _group(execution.nodes, target)
    partitions = on_set & set(execution.names.partitions if execution.names is not None else ())
    if not partitions:
        node_fraction, whole = _node_fraction(on_set, off_set)
        notes.append(f"basis: execution (plan incomplete): node fraction 1 - {len(off_set)}/{whole} original "
                     f"nodes off {target} = {_fmt(node_fraction)}, by the name-checked kernels (rule 5a)")
        return _Layers(_INCOMPLETE, node_fraction, "execution", time_fraction, kernel_fraction, plan_on,
                       plan_total, tuple(sorted(off_set)), None, (), off, whole)
    low, high = _partition_bounds(on_set, off_set, args.graph_total)
    what = (f"basis: execution (plan incomplete): {_n(len(partitions), 'compiled partition')} ran on "
            f"{target} and no plan lists their nodes: the node fraction is between {_fmt(low)} and "
            f"{_fmt(high)} ({len(off_set)} original nodes off {target}; rule 5f)")
    if low >= args.min_placement or high < args.min_placement:
        fraction = low if low >= args.min_placement else high
        notes.append(f"{what}: {_fmt(fraction)} decides either way")
        return _Layers(_INCOMPLETE, fraction, "execution", time_fraction, kernel_fraction, plan_on,
                       plan_total, tuple(sorted(off_set)), None, (), off, None)
    notes.append(f"{what}: min_placement {args.min_placement:g} lies between: the node fraction cannot be "
                 "known")
    return _Layers(None, None, None, time_fraction, kernel_fraction, plan_on, plan_total,
                   tuple(sorted(off_set)), "unmeasured", (), off, None)


def _time_fraction(execution: _Execution, target: str, notes: list[str]) -> float | None:
    """Rule 1b: the lower of the timed runs' summed fraction and the median of their own.

    Load only adds time: a preemption inside one run's target kernel would lift the sum (one
    run of three carrying a delay longer than all the others' work), not the median of the
    runs; time a run spends off the target still counts through the sum, so a run that does
    more work off the target than the others is not voted away. The lower of the two is never
    above the sum: a time fraction is never raised by this rule, only a run's delay kept out."""
    whole = sum(execution.time_us.values()) + execution.copy_time_us  # 1d: copies are off it
    summed = _fraction(execution.time_us.get(target, 0), whole)
    runs = execution.run_fractions
    if summed is None or len(runs) < 2 or any(f is None for f in runs):
        return summed
    median = statistics.median_low([f for f in runs if f is not None])
    if median >= summed:
        return summed
    notes.append(f"execution: the time fraction is the median of the timed runs' own fractions, "
                 f"{_fmt(median)} ({', '.join(_fmt(f) for f in runs)}), below their sum's "
                 f"{_fmt(summed)}: one run's time on the target was longer than the others' "
                 "(load adds time; rule 1b)")
    return median


def _resolve_layers(args: _Arguments, execution: _Execution | None, ort_version: str | None,
                    notes: list[str]) -> _Layers:
    """Rule 5 (docs/design.md §5's conflict table): which layer decides, each fraction, and the conflicts."""
    target = args.target
    plan_by_ep, plan_total, plan_on, plan_check = _read_plan(args, ort_version, notes)
    exec_names_ok = execution is not None and (execution.names is None or execution.names.passed)
    kernel_fraction = time_fraction = None
    if execution is not None:
        total_k, total_t = sum(execution.kernels.values()), sum(execution.time_us.values())
        kernel_fraction = _fraction(execution.kernels.get(target, 0), total_k)
        time_fraction = _time_fraction(execution, target, notes)
        notes.append(f"execution: {_n(total_k, 'compute kernel')} a run, {total_t} us "
                     f"({_counts(execution.kernels)}) over run{'s' if len(execution.timed_runs) > 1 else ''} "
                     f"{', '.join(map(str, execution.timed_runs))} of {execution.runs}"
                     + (f"; {_n(execution.copies, 'Memcpy kernel')} ({execution.copy_time_us} us) counted "
                        "as copies, not on the target" if execution.copies else "")
                     + (f"; {_n(execution.control_flow, 'control-flow kernel')} "
                        f"({execution.control_flow_time_us} us, {execution.control_flow_own_us} us its own) "
                        "counted by its own time (rule 1e)"
                        if execution.control_flow else ""))
        if execution.own_unknown:
            notes.append(f"execution: {_n(execution.own_unknown, 'control-flow kernel')} without a "
                         "timestamp: its children cannot be told apart, its whole time counted off the "
                         "target (rule 1e)")
        if execution.timed_runs == (1,):
            notes.append("execution: one profiled run: its time includes the EP's start-up costs (rule 1b "
                         "times runs 2-4)")
        if execution.names is not None and not execution.names.passed:
            notes.append(f"execution: unusable: {_n(execution.names.failed, 'kernel name')} failed the name "
                         "check (rule 1c): " + "; ".join(execution.names.failures[:3]))
        if time_fraction is None:
            notes.append("execution: every kernel took 0 us: no time fraction")
    plan_ok = bool(plan_total) and (plan_check is None or plan_check.passed)
    exec_shows_target = execution is not None and execution.kernels.get(target, 0) > 0
    plan_names_target = plan_ok and bool(plan_on)
    conflicts: list[str] = []
    plan = args.plan
    rows: list[tuple[str, str, str]] = []
    if plan_ok and plan is not None:
        originals = plan_check.originals if plan_check is not None else {}
        rows = [(ep, op, originals.get(label, label) or label) for ep, op, label in plan.nodes]
    on_set, off_set = _originals([(ep, label) for ep, _, label in rows], target)
    node_fraction, whole = _node_fraction(on_set, off_set)
    if plan_ok and not plan_names_target and exec_shows_target:
        missing = [ep for ep in (execution.kernels if execution else {}) if ep not in plan_by_ep]
        notes.append(f"plan: incomplete: it lists none of {target}'s nodes while the execution shows "
                     f"{target} (rule 5a; plugin EPs leave their nodes out: measured with WebGPU on "
                     f"onnxruntime 1.30)" + (f"; no node on {', '.join(missing)}" if missing else ""))
        plan_ok = False
    elif plan_ok and plan is not None and whole == 0 and exec_shows_target:
        notes.append(f"plan: incomplete: it lists {_n(plan_total or 0, 'node')} onnxruntime inserted "
                     f"(layout transposes, copies) and none of the graph's own while the execution "
                     f"shows {target} (rule 5a; measured with WebGPU on onnxruntime 1.30)")
        plan_ok = False
    if plan_ok and plan is not None:  # the plan is complete
        notes.append(f"node fraction (plan): 1 - {len(off_set)}/{whole} original nodes off {target} = "
                     f"{_fmt(node_fraction)} (the nodes the plan lists: one onnxruntime removed counts "
                     "nowhere)")
        if args.graph_count is not None and args.graph_count != plan_total:
            notes.append(f"plan: {_n(plan_total or 0, 'node')} as partitioned, {args.graph_count} in the "
                         "ONNX graph (onnxruntime fuses some before it partitions, e.g. MatMul+Add into "
                         "Gemm, and a control-flow node an EP compiles is listed without its branches)")
        off = _group(rows, target)
        if not plan_names_target:  # measured: nothing on the target, by the plan
            return _Layers("plan", 0.0, "plan", time_fraction if exec_names_ok else None, kernel_fraction,
                           plan_on, plan_total, tuple(sorted(off_set)), None, (), off, whole)
        if not exec_names_ok or time_fraction is None:  # rule 5d
            why = ("no whole profile with compute kernels was read" if execution is None
                   else "a kernel name failed the check" if not exec_names_ok
                   else "the execution gives no time fraction")
            notes.append(f"evidence_conflict: the plan names {target} but {why} (rule 5d)")
            return _Layers("plan", node_fraction, "plan", None, kernel_fraction, plan_on, plan_total,
                           tuple(sorted(off_set)), "evidence_conflict", (f"plan names {target}; {why}",), off,
                           whole)
        lower, higher = sorted((node_fraction, time_fraction))
        if (lower < args.min_placement <= higher) or ((lower == 0) != (higher == 0)):
            conflicts.append(f"node fraction (plan) {_fmt(node_fraction)}, time fraction (execution) "
                             f"{_fmt(time_fraction)}: the lower decides (rule 5b)")
            notes.append(f"layers disagree: {conflicts[-1]}")
        return _Layers("plan", node_fraction, "plan", time_fraction, kernel_fraction, plan_on, plan_total,
                       tuple(sorted(off_set)), None, tuple(conflicts), off, whole)
    # rule 5a: the plan is absent, unusable or incomplete: the execution decides, if its names passed
    if execution is not None and exec_names_ok and time_fraction is not None:
        return _execution_basis(args, execution, time_fraction, kernel_fraction,
                                plan_on if plan_total else None, plan_total or None, notes)
    notes.append("basis: none: no usable plan and no usable execution (rule 5e)")
    off = _group(execution.nodes, target) if execution is not None and exec_names_ok else {}
    return _Layers(None, None, None, None, kernel_fraction, plan_on if plan_total else None,
                   plan_total or None, (), None, (), off)


def _detect_swap(args: _Arguments, notes: list[str]) -> tuple[bool, bool]:
    """Rule 4 (docs/design.md §5's strict construction): the requested EP or the target missing from
    the session's providers, or the Python layer's fallback banner. Returns (swapped, banner seen).
    """
    requested, target = args.requested, args.target
    swap_reasons = []
    if args.session is not None:
        for name in dict.fromkeys((requested, target)):
            if name not in args.session:
                swap_reasons.append(f"{name} is not among the session's providers {list(args.session)}")
    else:
        notes.append("session providers not collected: a swap cannot be ruled out from them")
    if args.available is not None and requested not in args.available:
        notes.append(f"{requested} is not in this onnxruntime build (available: {list(args.available)})")
    fallback_banner = args.fallback_banner
    banner = bool(fallback_banner and fallback_banner.strip())
    if fallback_banner is not None and banner:
        line = next((ln.strip() for ln in fallback_banner.splitlines() if "Falling back" in ln),
                    fallback_banner.strip().splitlines()[0])
        if target != CPU_EP:
            swap_reasons.append(f"onnxruntime's Python layer fell back and rebuilt the session: {line!r}")
        else:
            notes.append(f"a fallback banner was seen, but the target is the CPU EP: {line!r}")
    notes.extend(f"swap: {reason}" for reason in swap_reasons)
    return bool(swap_reasons), banner


def _read_ep_report(args: _Arguments, ep_report: Mapping[str, Any] | None,
                    notes: list[str]) -> EpReport | None:
    """Rule 7: the EP's own report, where the route asked for one (None: it did not)."""
    if ep_report is None:
        return None
    if not isinstance(ep_report, Mapping) or not isinstance(ep_report.get("kind"), str):
        raise TypeError("ep_report must be a mapping with a string 'kind'")
    text = ep_report.get("text")
    if text is not None and not isinstance(text, str):
        raise TypeError("ep_report.text must be a string or None")
    report = read_report(ep_report["kind"], text, args.names)
    if report.usable:
        notes.append(f"EP report ({report.kind}): {report.nodes_on_target}/{report.nodes_total} nodes on the "
                     f"target device ({_counts(report.by_device)})")
    else:
        why = "; ".join(report.problems[:3]) or "unusable"
        if text is None and ep_report.get("error"):
            why += f" ({ep_report['error']})"
        notes.append(f"EP report ({report.kind}): not usable: {why}")
    return report


def _judge_report(report: EpReport, judged: tuple[Verdict, Cause | None, float | None, str | None],
                  layers: _Layers, target: str, min_placement: float, notes: list[str],
                  conflicts: list[str]) -> tuple[Verdict, Cause | None, float | None, str | None]:
    """Rule 7a-b on top of rule 6's verdict: only ``placed`` is reconsidered (the report can only
    lower a fraction, and an unusable one cannot turn measured bad news into no news)."""
    verdict, cause, fraction, decided_by = judged
    if verdict != "placed":
        return judged
    if not report.usable or report.fraction is None:
        absent = report.problems == ("the EP wrote no report",)
        cause_now: Cause = "unmeasured" if absent else "evidence_conflict"
        notes.append(f"verdict: unmeasured (the route's EP report is {'absent' if absent else 'unusable'}; "
                     "rule 7a: it never passes)")
        return "unmeasured", cause_now, None, None
    lowest = min(f for f in (layers.node_fraction, layers.time_fraction) if f is not None)
    if (min(lowest, report.fraction) < min_placement <= max(lowest, report.fraction)
            or (lowest == 0) != (report.fraction == 0)):
        conflicts.append(f"onnxruntime's layers {_fmt(lowest)}, the EP's report {_fmt(report.fraction)}: "
                         "the lower decides (rule 7b)")
        notes.append(f"layers disagree: {conflicts[-1]}")
    if report.fraction >= (fraction if fraction is not None else 1.0):
        return judged
    if report.fraction > 0 and report.fraction >= min_placement:
        return verdict, cause, report.fraction, "EP report fraction"
    notes.append(f"verdict: declined (EP report fraction {_fmt(report.fraction)} < min_placement "
                 f"{min_placement:g}: the EP left {report.nodes_total - report.nodes_on_target} of "
                 f"{report.nodes_total} nodes off {target})")
    return "declined", "declined", report.fraction, "EP report fraction"


def _judge(swapped: bool, layers: _Layers, target: str, min_placement: float,
           notes: list[str]) -> tuple[Verdict, Cause | None, float | None, str | None]:
    """Rule 6 (verdict), cases a–d. Returns (verdict, cause, deciding fraction, which decided)."""
    node, time = layers.node_fraction, layers.time_fraction
    measured = [(f, which) for f, which in ((node, "node fraction"), (time, "time fraction"))
                if f is not None]
    lowest = min(measured) if measured else None
    fraction, decided_by = (lowest[0], lowest[1]) if lowest else (None, None)
    if swapped:  # 6a
        if layers.basis is not None and fraction == 0:
            notes.append(f"verdict: declined (provider swapped; the {layers.basis} shows nothing "
                         f"on {target})")
            return "declined", "provider_swapped", fraction, decided_by
        notes.append("verdict: unmeasured (provider swapped; "
                     + ("no evidence)" if layers.basis is None or fraction is None else
                        f"yet the {layers.basis} shows {_fmt(fraction)} on {target}: contradictory)"))
        return "unmeasured", "provider_swapped", fraction, decided_by
    if layers.conflict_cause is not None:  # 6b, rules 5d and 5f
        notes.append(f"verdict: unmeasured ({layers.conflict_cause}; never passes)")
        return "unmeasured", layers.conflict_cause, None, None
    if layers.basis is None or fraction is None:  # 6b, rule 5e
        notes.append("verdict: unmeasured (no evidence; never passes)")
        return "unmeasured", "unmeasured", None, None
    both = min(node, time) if node is not None and time is not None else None
    if both is not None and both > 0 and both >= min_placement:  # 6c
        notes.append(f"verdict: placed (node fraction {_fmt(node)} and time fraction {_fmt(time)} "
                     f">= min_placement {min_placement:g})")
        return "placed", None, fraction, decided_by
    why = (f"nothing on {target}" if fraction == 0  # 6d
           else f"{decided_by} {_fmt(fraction)} < min_placement {min_placement:g}")
    notes.append(f"verdict: declined ({why})")
    return "declined", "declined", fraction, decided_by


def _assemble(args: _Arguments, ort_version: str | None, parsed: ParsedProfile,
              execution: _Execution | None, layers: _Layers, swapped: bool, banner: bool,
              judged: tuple[Verdict, Cause | None, float | None, str | None],
              notes: list[str], report: EpReport | None = None,
              conflicts: tuple[str, ...] = ()) -> PlacementProof:
    """The proof's fields from the rules' outputs; the nodes off the target come from the basis."""
    target, plan = args.target, args.plan
    verdict, cause, fraction, decided_by = judged
    off = layers.off
    cpu = off.get(CPU_EP, {}) if target != CPU_EP else {}
    names = execution.names if execution is not None else None
    return PlacementProof(
        target_ep=target,
        requested_ep=args.requested,
        session_providers=args.session,
        available_providers=args.available,
        ort_version=ort_version,
        verdict=verdict,
        cause=cause,
        basis=layers.basis,
        fraction=fraction,
        min_placement=args.min_placement,
        swapped=swapped,
        fallback_banner=banner,
        node_fraction=layers.node_fraction,
        nodes_on_target=layers.plan_on,
        nodes_total=layers.plan_total,
        plan_copies=plan.copies if plan is not None else None,
        graph_node_count=args.graph_count,
        time_fraction=layers.time_fraction,
        kernel_fraction=layers.kernel_fraction,
        event_fraction=_fraction(execution.events.get(target, 0), sum(execution.events.values()))
        if execution else None,
        kernels_on_target=execution.kernels.get(target, 0) if execution else None,
        kernels_total=sum(execution.kernels.values()) if execution else None,
        kernel_time_on_target_us=execution.time_us.get(target, 0) if execution else None,
        kernel_time_total_us=sum(execution.time_us.values()) if execution else None,
        kernels_by_provider=MappingProxyType(dict(execution.kernels) if execution else {}),
        kernel_time_by_provider_us=MappingProxyType(dict(execution.time_us) if execution else {}),
        control_flow_kernels=execution.control_flow if execution else None,
        control_flow_time_us=execution.control_flow_time_us if execution else None,
        control_flow_own_time_us=execution.control_flow_own_us if execution else None,
        copies=execution.copies if execution else None,
        copy_time_us=execution.copy_time_us if execution else None,
        runs=execution.runs if execution else None,
        profile_format=parsed.method if parsed.method != "none" else None,
        cpu_nodes=MappingProxyType(dict(cpu)),
        off_target_nodes=_frozen_groups(off),
        notes=tuple(notes),
        decided_by=decided_by,
        node_basis=layers.node_basis,
        original_nodes_total=layers.whole,
        original_nodes_off_target=len(layers.plan_off_originals) if layers.node_basis else None,
        timed_runs=execution.timed_runs if execution else None,
        run_time_fractions=execution.run_fractions if execution else None,
        conflicts=layers.conflicts + conflicts,
        names_checked=None if names is None else names.passed,
        name_failures=names.failures if names is not None else (),
        renamed=args.names.renamed if args.names is not None else None,
        ep_report=report.to_dict() if report is not None else None,
    )


def prove(
    *,
    target_ep: str,
    profile_text: str | bytes | None = None,
    assignment: Sequence[Mapping[str, Any]] | None = None,
    session_providers: Sequence[str] | None = None,
    available_providers: Sequence[str] | None = None,
    requested_ep: str | None = None,
    fallback_banner: str | None = None,
    graph_nodes: Sequence[Mapping[str, Any]] | None = None,
    min_placement: float = 0.5,
    ort_version: str | None = None,
    node_names: Mapping[str, Any] | None = None,
    ep_report: Mapping[str, Any] | None = None,
) -> PlacementProof:
    """Judge where the profiled runs placed a stage (the rules are in the module docstring).

    Args:
        target_ep: the EP the stage must run on, as the evidence names it
            (``OpenVINOExecutionProvider``; ``CPUExecutionProvider`` for ``ort-cpu``).
        profile_text: the text of the file ``session.end_profiling()`` wrote, or None.
        assignment: the plan, ``[{"ep": str, "nodes": [{"name", "op_type", "domain"}]}]``
            from ``session.get_provider_graph_assignment_info()``, or None (onnxruntime < 1.24).
        session_providers: ``session.get_providers()``, or None when not collected.
        available_providers: ``onnxruntime.get_available_providers()``, or None.
        requested_ep: the EP the session was asked for; defaults to ``target_ep``.
        fallback_banner: the "Falling back to [...] and retrying" text if the worker saw it.
        graph_nodes: the ONNX graph's nodes (subgraphs included) as ``[{"name", "op_type"}]``:
            the node fraction's whole, and the names checked when ``node_names`` is None.
        min_placement: the threshold in [0, 1].
        ort_version: the worker's onnxruntime version, recorded and used in notes.
        node_names: the worker's report of the names the session ran with,
            ``{"renamed": bool, "nodes": [{"name", "op_type", "original"}]}``; None: the graph's
            own names (``graph_nodes``) are what it ran with.
        ep_report: the EP's own report as the worker sent it, ``{"kind", "text", "error"}``,
            where the route asks for one (rule 7); None: it does not.

    Returns:
        The proof. It never raises for what the evidence says.

    Raises:
        ValueError: ``min_placement`` is not a number in [0, 1], ``target_ep`` or
            ``requested_ep`` is empty, or an assignment element lacks ``ep``/``nodes``/``op_type``.
        TypeError: a provider list is not a list of strings, ``graph_nodes`` not a list of
            mappings, ``assignment`` not a list, ``node_names`` not the worker's shape,
            ``profile_text`` neither text nor bytes, or ``ep_report`` not the worker's shape.
    """
    args = _check_arguments(target_ep, requested_ep, min_placement, session_providers,  # rule 0
                            available_providers, fallback_banner, graph_nodes, assignment, node_names)
    notes: list[str] = []
    parsed = parse_profile(profile_text)
    execution = _read_execution(parsed, args.names, args.target, notes)  # rule 1
    layers = _resolve_layers(args, execution, ort_version, notes)  # rules 2 and 5 (rule 3: not here)
    swapped, banner = _detect_swap(args, notes)  # rule 4
    judged = _judge(swapped, layers, args.target, args.min_placement, notes)  # rule 6
    report = _read_ep_report(args, ep_report, notes)  # rule 7
    conflicts: list[str] = []
    if report is not None:
        judged = _judge_report(report, judged, layers, args.target, args.min_placement, notes, conflicts)
    return _assemble(args, ort_version, parsed, execution, layers, swapped, banner, judged, notes, report,
                     tuple(conflicts))
