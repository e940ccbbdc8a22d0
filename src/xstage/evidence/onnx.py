"""Proof of placement: what one profiled run and onnxruntime's plan say about where a stage ran.

Pure: text and lists in, a frozen :class:`PlacementProof` out. No processes, no sessions. The
worker collects, for one profiled warm-up run, the profile file's text, onnxruntime's node
assignment (the *plan*), the session's providers and the fallback banner if one was printed;
:func:`prove` judges them. It raises only on malformed *arguments* (``min_placement`` outside
[0, 1], an assignment that is not the worker's shape); bad news — no profile, a profile that
does not parse, an EP that took nothing, a provider swapped behind our back — is a verdict
with a cause and notes, never an exception. The stage layer turns a verdict other than
``placed`` into the refusal ``execution_provider_declined_graph`` with :attr:`PlacementProof.cause`
(DESIGN §4–§5).

Evidence, as used here:

* **Plan** (onnxruntime >= 1.24, session config ``session.record_ep_graph_assignment_info``):
  which EP each node was assigned to, the members of fused partitions included. It describes
  the graph *as partitioned*, after onnxruntime's basic rewrites (``MatMul`` + ``Add`` is
  already one ``Gemm`` there), so its node count can be below the ONNX graph's. Control-flow
  nodes (``If``/``Loop``/``Scan``) count where they were assigned; ``Memcpy*`` nodes are
  copies, not nodes. Node fraction = nodes on the target / all nodes.
* **Execution** (every version): profile events of category ``Node`` whose name ends in
  ``_kernel_time``, grouped by ``args.provider``. A compiling EP (OpenVINO) shows one event
  per fused subgraph (``OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0_kernel_time``): it
  counts as one kernel on the target. ``Memcpy*`` kernels (``args.op_name`` MemcpyFromHost /
  MemcpyToHost, or, without an op name, a node name starting with ``Memcpy``) are copies;
  ``If``/``Loop``/``Scan`` kernels are left out of kernel counts and time, because their
  children have events of their own and their time includes them. Time fraction = kernel time
  on the target / all kernel time; kernel fraction = the same over counts.

Rules, in order, one helper each (``_check_arguments``, ``_read_execution``, ``_choose_basis``,
``_detect_swap``, ``_judge``; their docstrings and :func:`prove`'s comments cite the numbers):

1. **Arguments.** ``min_placement`` must be a number in [0, 1]; ``target_ep`` a non-empty
   string; the assignment the worker's shape (``[{"ep", "nodes": [{"name", "op_type",
   "domain"}]}]``). Otherwise ``ValueError``/``TypeError``.
2. **Profile.** Read by :func:`parse_profile`. A profile that is not whole — it ends early (no
   closing ``]``), or, read line by line, a line could not be read — is not used: a kernel we
   did not see could be the one that ran on the CPU.
3. **Plan or execution.** The plan is the basis when it exists, holds at least one node, and
   agrees with the execution: every provider that ran compute kernels must appear in it.
   (Measured: onnxruntime 1.30 with the WebGPU plugin EP lists only the CPU nodes in the plan
   and none of the plugin's — the MLP's plan is ``[]`` with every kernel on WebGPU.) Otherwise
   the execution is the basis when it has at least one compute kernel, with the time fraction,
   or the kernel fraction when every kernel took 0 µs. Otherwise nothing was measured.
4. **Swap.** The provider is *swapped* when the requested EP (or the target) is not among the
   session's providers — not in this build, failed to create (onnxruntime then builds the
   session without it, sometimes with no more than a log line), or rebuilt on the CPU by the
   Python layer — or when the fallback banner was seen (target other than the CPU EP).
5. **Verdict.** The verdict set is closed: ``placed``, ``declined``, ``unmeasured``.

   a. Swapped: ``cause="provider_swapped"``, never ``placed``. The verdict is ``declined``
      only if evidence was measured and shows zero on the target (nothing ran there, and we
      saw it); otherwise — no evidence, or evidence that contradicts the swap — it is
      ``unmeasured``.
   b. No evidence: ``unmeasured``, ``cause="unmeasured"``. **Unmeasured never passes and is
      never reported as declined.**
   c. ``placed`` (``cause=None``) iff the basis fraction is ``> 0`` and ``>= min_placement``.
   d. Otherwise ``declined``, ``cause="declined"`` (measured, below the threshold).

A target of ``CPUExecutionProvider`` (the ``ort-cpu`` route) is judged by the same rules: it
is placed when the evidence shows the nodes on the CPU.

.. versionadded:: 0.1
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

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


# --------------------------------------------------------------------------- execution and plan


@dataclass(frozen=True)
class _Execution:
    kernels: dict[str, int]  # compute kernels by provider
    time_us: dict[str, int]
    copies: int
    copy_time_us: int
    control_flow: int
    control_flow_time_us: int
    nodes: list[tuple[str, str, str]]  # (provider, op, node name) of compute and control-flow kernels
    runs: int


def _kernel_node_name(event_name: str) -> str:
    return event_name[: -len(_KERNEL_SUFFIX)]


def _execution(events: Sequence[Mapping[str, Any]]) -> _Execution:
    kernels: dict[str, int] = {}
    time_us: dict[str, int] = {}
    copies = copy_time = control = control_time = runs = 0
    nodes: list[tuple[str, str, str]] = []
    for event in events:
        if event["cat"] == "Session" and event["name"] == "model_run":
            runs += 1
        if event["cat"] != "Node" or not event["name"].endswith(_KERNEL_SUFFIX):
            continue
        op = event["op_name"] or ""
        name = _kernel_node_name(event["name"])
        provider = event["provider"] or _UNKNOWN_PROVIDER
        if op.startswith("Memcpy") or (not op and name.startswith("Memcpy")):
            copies += 1
            copy_time += event["dur"]
            continue
        nodes.append((provider, op or "<unknown op>", name))
        if op in CONTROL_FLOW_OPS:
            control += 1
            control_time += event["dur"]
            continue
        kernels[provider] = kernels.get(provider, 0) + 1
        time_us[provider] = time_us.get(provider, 0) + event["dur"]
    return _Execution(kernels, time_us, copies, copy_time, control, control_time, nodes, runs)


@dataclass(frozen=True)
class _Plan:
    nodes: list[tuple[str, str, str]]  # (ep, op_type, label) without copies
    copies: int


def _plan(assignment: Any) -> _Plan:
    """Rule 1: the worker's shape or an exception naming the bad element."""
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
    return _Plan(nodes_out, copies)


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
    """Rule 1's output: the arguments, checked and normalized."""

    target: str
    requested: str
    session: tuple[str, ...] | None
    available: tuple[str, ...] | None
    fallback_banner: str | None
    graph_count: int | None
    plan: _Plan | None
    min_placement: float


def _check_arguments(target_ep: str, requested_ep: str | None, min_placement: float,
                     session_providers: Sequence[str] | None, available_providers: Sequence[str] | None,
                     fallback_banner: str | None, graph_nodes: Sequence[Mapping[str, Any]] | None,
                     assignment: Sequence[Mapping[str, Any]] | None) -> _Arguments:
    """Rule 1 (arguments): a malformed argument raises; bad evidence never does."""
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
    graph_count = None
    if graph_nodes is not None:
        if isinstance(graph_nodes, (str, bytes)) or not isinstance(graph_nodes, Sequence) or not all(
            isinstance(n, Mapping) for n in graph_nodes
        ):
            raise TypeError("graph_nodes must be a list of mappings or None")
        graph_count = len(graph_nodes)
    plan = _plan(assignment) if assignment is not None else None
    return _Arguments(target_ep, requested, session, available, fallback_banner, graph_count, plan,
                      float(min_placement))


def _read_execution(parsed: ParsedProfile, notes: list[str]) -> _Execution | None:
    """Rule 2 (profile): only a whole profile with at least one compute kernel is execution evidence."""
    notes.extend(f"profile: {note}" for note in parsed.notes)
    if parsed.complete:
        execution = _execution(parsed.events)
        if execution.kernels:
            return execution
        notes.append("profile: no compute kernel events (category Node, *_kernel_time): "
                     "no execution evidence")
    elif parsed.method != "none":
        notes.append("profile: not used as evidence (incomplete)")
    return None


@dataclass(frozen=True)
class _Basis:
    """Rule 3's output: what the gate's fraction is computed from, and both layers' numbers."""

    basis: Basis | None
    fraction: float | None
    node_fraction: float | None  # None when the plan is empty or incomplete
    plan_on: int | None
    plan_total: int | None
    time_fraction: float | None
    kernel_fraction: float | None


def _plan_notes(plan: _Plan | None, target: str, ort_version: str | None,
                notes: list[str]) -> tuple[dict[str, int], int | None, int | None]:
    """Rule 3, the plan layer: nodes per EP, all nodes, nodes on the target."""
    by_ep: dict[str, int] = {}
    if plan is None:
        version = f"onnxruntime {ort_version}" if ort_version else "this onnxruntime"
        notes.append(f"plan: none ({version} has no assignment API, or it was not recorded)"
                     if ort_version is not None else "plan: none")
        return by_ep, None, None
    for ep, _, _ in plan.nodes:
        by_ep[ep] = by_ep.get(ep, 0) + 1
    total = len(plan.nodes)
    if total:
        notes.append(f"plan: {_n(total, 'node')} ({_counts(by_ep)})"
                     + (f", {plan.copies} Memcpy nodes left out" if plan.copies else ""))
    else:
        notes.append("plan: empty (no node recorded)")
    return by_ep, total, by_ep.get(target, 0)


def _execution_notes(execution: _Execution | None, target: str,
                     notes: list[str]) -> tuple[float | None, float | None]:
    """Rule 3, the execution layer: the kernel and time fractions on the target."""
    if execution is None:
        return None, None
    total_k, total_t = sum(execution.kernels.values()), sum(execution.time_us.values())
    kernel_fraction = _fraction(execution.kernels.get(target, 0), total_k)
    time_fraction = _fraction(execution.time_us.get(target, 0), total_t)
    notes.append(f"execution: {_n(total_k, 'compute kernel')}, {total_t} us "
                 f"({_counts(execution.kernels)})"
                 + (f"; {_n(execution.copies, 'Memcpy kernel')} ({execution.copy_time_us} us) counted "
                    "as copies" if execution.copies else "")
                 + (f"; {_n(execution.control_flow, 'control-flow kernel')} "
                    f"({execution.control_flow_time_us} us) left out" if execution.control_flow else ""))
    if execution.runs > 1:
        notes.append(f"execution: the profile holds {execution.runs} model runs; counts add up over them")
    elif execution.runs == 0:
        notes.append("execution: no model_run event in the profile")
    return kernel_fraction, time_fraction


def _choose_basis(args: _Arguments, execution: _Execution | None, ort_version: str | None,
                  notes: list[str]) -> _Basis:
    """Rule 3 (plan or execution): the plan decides when it holds nodes and names every provider
    that ran compute kernels; else the execution's time (or kernel) fraction; else nothing.

    A plan that lists no node on a provider where compute kernels ran is DESIGN §4's
    disagreement case (a), *incomplete*: the execution decides. When both layers are usable and
    only one shows zero on the target, the conflict is noted and the plan still decides (DESIGN
    §4's case (b), "the lower fraction decides", is not implemented here yet).
    """
    target = args.target
    plan_by_ep, plan_total, plan_on = _plan_notes(args.plan, target, ort_version, notes)
    node_fraction = _fraction(plan_on, plan_total) if plan_total is not None and plan_on is not None else None
    kernel_fraction, time_fraction = _execution_notes(execution, target, notes)
    plan_usable = bool(plan_total)
    if plan_usable and execution is not None:
        missing = [ep for ep in execution.kernels if ep not in plan_by_ep and ep != _UNKNOWN_PROVIDER]
        if missing:
            plan_usable = False
            notes.append(f"plan: not used: it lists no node on {', '.join(missing)}, where "
                         f"{sum(execution.kernels[ep] for ep in missing)} kernels ran (an incomplete plan: "
                         "measured with the WebGPU plugin EP on onnxruntime 1.30, which lists only the CPU's "
                         "nodes); the execution decides")
    basis: Basis | None = None
    fraction: float | None = None
    if not plan_usable:
        node_fraction = None  # an empty or incomplete plan has no node fraction to report
    if plan_usable:
        basis, fraction = "plan", node_fraction
        notes.append(f"basis: plan, node fraction {plan_on}/{plan_total} = {_fmt(node_fraction)}")
        if args.graph_count is not None and args.graph_count != plan_total:
            notes.append(f"plan: {_n(plan_total or 0, 'node')} as partitioned, {args.graph_count} in the "
                         "ONNX graph (onnxruntime fuses some before it partitions, e.g. MatMul+Add into "
                         "Gemm, and a control-flow node an EP compiles is listed without its branches)")
        if kernel_fraction is not None and (node_fraction == 0) != (kernel_fraction == 0):
            notes.append(f"plan and execution disagree: node fraction {_fmt(node_fraction)}, "
                         f"kernel fraction {_fmt(kernel_fraction)}")
    elif execution is not None:
        basis = "execution"
        if time_fraction is not None:
            fraction = time_fraction
            notes.append(f"basis: execution, time fraction {execution.time_us.get(target, 0)}/"
                         f"{sum(execution.time_us.values())} us = {_fmt(time_fraction)}")
        else:
            fraction = kernel_fraction
            notes.append(f"basis: execution, kernel fraction {_fmt(kernel_fraction)} "
                         "(every kernel took 0 us: no time fraction)")
    else:
        notes.append("basis: none: no usable plan and no usable profile")
    return _Basis(basis, fraction, node_fraction, plan_on, plan_total, time_fraction, kernel_fraction)


def _detect_swap(args: _Arguments, notes: list[str]) -> tuple[bool, bool]:
    """Rule 4 (swap; DESIGN §4's strict construction): the requested EP or the target missing from
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


def _judge(swapped: bool, chosen: _Basis, target: str, min_placement: float,
           notes: list[str]) -> tuple[Verdict, Cause | None]:
    """Rule 5 (verdict), cases a–d: swapped, no evidence, placed, declined."""
    basis, fraction = chosen.basis, chosen.fraction
    if swapped:  # 5a
        if fraction is not None and fraction == 0:
            notes.append(f"verdict: declined (provider swapped; the {basis} shows nothing on {target})")
            return "declined", "provider_swapped"
        notes.append("verdict: unmeasured (provider swapped; "
                     + ("no evidence)" if fraction is None else
                        f"yet the {basis} shows {_fmt(fraction)} on {target}: contradictory)"))
        return "unmeasured", "provider_swapped"
    if fraction is None:  # 5b
        notes.append("verdict: unmeasured (no evidence; never passes)")
        return "unmeasured", "unmeasured"
    if fraction > 0 and fraction >= min_placement:  # 5c
        notes.append(f"verdict: placed ({_fmt(fraction)} >= min_placement {min_placement:g})")
        return "placed", None
    why = (f"nothing on {target}" if fraction == 0  # 5d
           else f"{_fmt(fraction)} < min_placement {min_placement:g}")
    notes.append(f"verdict: declined ({why})")
    return "declined", "declined"


def _assemble(args: _Arguments, ort_version: str | None, parsed: ParsedProfile,
              execution: _Execution | None, chosen: _Basis, swapped: bool, banner: bool,
              verdict: Verdict, cause: Cause | None, notes: list[str]) -> PlacementProof:
    """The proof's fields from the rules' outputs; the nodes off the target come from the basis
    (the plan's when it decides, else the kernels')."""
    target, plan = args.target, args.plan
    if chosen.basis == "plan" and plan is not None:
        off = _group(plan.nodes, target)
    elif execution is not None:
        off = _group(execution.nodes, target)
    else:
        off = {}
    cpu = off.get(CPU_EP, {}) if target != CPU_EP else {}
    return PlacementProof(
        target_ep=target,
        requested_ep=args.requested,
        session_providers=args.session,
        available_providers=args.available,
        ort_version=ort_version,
        verdict=verdict,
        cause=cause,
        basis=chosen.basis,
        fraction=chosen.fraction,
        min_placement=args.min_placement,
        swapped=swapped,
        fallback_banner=banner,
        node_fraction=chosen.node_fraction,
        nodes_on_target=chosen.plan_on,
        nodes_total=chosen.plan_total,
        plan_copies=plan.copies if plan is not None else None,
        graph_node_count=args.graph_count,
        time_fraction=chosen.time_fraction,
        kernel_fraction=chosen.kernel_fraction,
        kernels_on_target=execution.kernels.get(target, 0) if execution else None,
        kernels_total=sum(execution.kernels.values()) if execution else None,
        kernel_time_on_target_us=execution.time_us.get(target, 0) if execution else None,
        kernel_time_total_us=sum(execution.time_us.values()) if execution else None,
        kernels_by_provider=MappingProxyType(dict(execution.kernels) if execution else {}),
        kernel_time_by_provider_us=MappingProxyType(dict(execution.time_us) if execution else {}),
        control_flow_kernels=execution.control_flow if execution else None,
        control_flow_time_us=execution.control_flow_time_us if execution else None,
        copies=execution.copies if execution else None,
        copy_time_us=execution.copy_time_us if execution else None,
        runs=execution.runs if execution else None,
        profile_format=parsed.method if parsed.method != "none" else None,
        cpu_nodes=MappingProxyType(dict(cpu)),
        off_target_nodes=_frozen_groups(off),
        notes=tuple(notes),
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
) -> PlacementProof:
    """Judge where one profiled run placed a stage (the rules are in the module docstring).

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
        graph_nodes: the ONNX graph's nodes (subgraphs included) as ``[{"name", "op_type"}]``,
            for the node count only.
        min_placement: the threshold in [0, 1].
        ort_version: the worker's onnxruntime version, recorded and used in notes.

    Returns:
        The proof. It never raises for what the evidence says.

    Raises:
        ValueError: ``min_placement`` is not a number in [0, 1], ``target_ep`` or
            ``requested_ep`` is empty, or an assignment element lacks ``ep``/``nodes``/``op_type``.
        TypeError: a provider list is not a list of strings, ``graph_nodes`` not a list of
            mappings, ``assignment`` not a list, or ``profile_text`` neither text nor bytes.
    """
    args = _check_arguments(target_ep, requested_ep, min_placement, session_providers,  # rule 1
                            available_providers, fallback_banner, graph_nodes, assignment)
    notes: list[str] = []
    parsed = parse_profile(profile_text)
    execution = _read_execution(parsed, notes)  # rule 2
    chosen = _choose_basis(args, execution, ort_version, notes)  # rule 3
    swapped, banner = _detect_swap(args, notes)  # rule 4
    verdict, cause = _judge(swapped, chosen, args.target, args.min_placement, notes)  # rule 5
    return _assemble(args, ort_version, parsed, execution, chosen, swapped, banner, verdict, cause, notes)
