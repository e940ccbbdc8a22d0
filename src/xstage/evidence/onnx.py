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

Rules, in order (comments in the code cite them):

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

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "BASES",
    "CAUSES",
    "CONTROL_FLOW_OPS",
    "COPY_OPS",
    "CPU_EP",
    "VERDICTS",
    "Basis",
    "Cause",
    "ParsedProfile",
    "PlacementProof",
    "Verdict",
    "parse_profile",
    "prove",
]

#: The closed verdict set (DESIGN §4).
VERDICTS = ("placed", "declined", "unmeasured")
#: The causes a proof can carry (DESIGN §5, ``execution_provider_declined_graph``).
CAUSES = ("declined", "unmeasured", "provider_swapped")
#: What the gate's fraction was computed from.
BASES = ("plan", "execution")
#: Control-flow ops: their kernel time contains their children's, which have events of their own.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
#: Copy ops onnxruntime inserts between EPs with different memory.
COPY_OPS = frozenset({"MemcpyFromHost", "MemcpyToHost"})
#: onnxruntime's CPU execution provider.
CPU_EP = "CPUExecutionProvider"

Verdict = Literal["placed", "declined", "unmeasured"]
Cause = Literal["declined", "unmeasured", "provider_swapped"]
Basis = Literal["plan", "execution"]

_KERNEL_SUFFIX = "_kernel_time"
_UNKNOWN_PROVIDER = "<unknown provider>"  # a kernel event without args.provider
_FENCE_SUFFIXES = ("_fence_before", "_fence_after")


# --------------------------------------------------------------------------- the profile


@dataclass(frozen=True)
class ParsedProfile:
    """What :func:`parse_profile` recovered from one onnxruntime profile file.

    Attributes:
        events: the events, fence events left out, each a read-only mapping
            ``{"cat": str, "name": str, "dur": int (µs), "provider": str | None,
            "op_name": str | None}`` (the last two from ``args``).
        method: ``"json"`` (the file loaded as JSON), ``"lines"`` (it did not; read line by
            line) or ``"none"`` (nothing to read).
        complete: whether the file is whole: it loaded as JSON, or, read line by line, it
            opens with ``[``, closes with ``]`` and every line in between was read as an event
            (a line that was not could have held a kernel). An incomplete profile is not
            evidence.
        fences: how many fence events (onnxruntime <= 1.20) were skipped.
        unreadable: how many lines (or JSON elements) could not be read as an event.
        notes: what happened, for people.
    """

    events: tuple[Mapping[str, Any], ...]
    method: Literal["json", "lines", "none"]
    complete: bool
    fences: int = 0
    unreadable: int = 0
    notes: tuple[str, ...] = ()


# In the files of onnxruntime <= 1.30 each event is one line:
#   {"cat" : "Node","pid" :1,"dur" :44,"ph" : "X","name" :"relu "q"_kernel_time","args" : {...}},
# and the name is written unescaped. The name runs from the first `"name":"` to the last
# `","args":{`; args never hold a node name, so they still parse as JSON (regexes otherwise).
_NAME_START = re.compile(r'"name"\s*:\s*"')
_NAME_END = re.compile(r'"\s*,\s*"args"\s*:\s*(?=\{)')
_CAT = re.compile(r'"cat"\s*:\s*"([^"\\]*)"')
_DUR = re.compile(r'"dur"\s*:\s*(-?\d+)')
_PROVIDER = re.compile(r'"provider"\s*:\s*"([^"\\]*)"')
_OP_NAME = re.compile(r'"op_name"\s*:\s*"([^"\\]*)"')


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _as_dur(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return int(float(value))
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _normalize(raw: Any) -> dict[str, Any] | None:
    """One JSON event to the normalized shape, or None when it is not an event."""
    if not isinstance(raw, Mapping):
        return None
    cat, name = _as_text(raw.get("cat")), _as_text(raw.get("name"))
    if cat is None or name is None:
        return None
    args = raw.get("args")
    args = args if isinstance(args, Mapping) else {}
    dur = _as_dur(raw.get("dur", 0))
    return {
        "cat": cat,
        "name": name,
        "dur": max(dur, 0) if dur is not None else 0,
        "provider": _as_text(args.get("provider")),
        "op_name": _as_text(args.get("op_name")),
    }


def _read_line(line: str) -> dict[str, Any] | None:
    """One event line: as JSON if it is, else by the regexes; None when neither reads it."""
    body = line.strip().rstrip(",").strip()
    try:
        return _normalize(json.loads(body))
    except ValueError:
        pass
    start = _NAME_START.search(body)
    ends = list(_NAME_END.finditer(body))
    if start is None or not ends or ends[-1].start() < start.end():
        return None
    end = ends[-1]
    head, name, tail = body[: start.start()], body[start.end() : end.start()], body[end.end() :]
    cat = _CAT.search(head)
    if cat is None:
        return None
    dur = _DUR.search(head)
    provider = op_name = None
    args_text = tail[: tail.rfind("}")] if tail.endswith("}") else tail  # drop the event's own "}"
    try:
        args = json.loads(args_text)
    except ValueError:
        args = None
    if isinstance(args, Mapping):
        provider, op_name = _as_text(args.get("provider")), _as_text(args.get("op_name"))
    else:
        found_provider, found_op = _PROVIDER.search(tail), _OP_NAME.search(tail)
        provider = found_provider.group(1) if found_provider else None
        op_name = found_op.group(1) if found_op else None
    return {"cat": cat.group(1), "name": name, "dur": int(dur.group(1)) if dur else 0,
            "provider": provider, "op_name": op_name}


def _is_fence(event: Mapping[str, Any]) -> bool:
    return bool(event["cat"] == "Node" and event["name"].endswith(_FENCE_SUFFIXES))


def parse_profile(text: str | bytes | None) -> ParsedProfile:
    r"""Read an onnxruntime profile file's text; never raises on a malformed profile.

    The normal case is ``json.loads`` (a list of events, or a ``{"traceEvents": [...]}``
    object). When that fails — onnxruntime <= 1.30 writes node names unescaped, so a name with
    ``"`` or ``\\`` breaks the file; a file cut short does too — each line is read on its own
    (as JSON, else with regexes for ``cat``, ``name``, ``dur``, ``args.provider`` and
    ``args.op_name``). Fence events (``*_fence_before``/``*_fence_after``, onnxruntime <= 1.20)
    are skipped.

    Args:
        text: the file's text (bytes are decoded as UTF-8, bad bytes replaced), or None when
            there was no profile.

    Returns:
        What could be recovered, whether the file was whole, and notes.

    Raises:
        TypeError: ``text`` is not a string, bytes or None.
    """
    if text is None:
        return ParsedProfile((), "none", False, notes=("no profile was collected",))
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"profile text must be str, bytes or None, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        return ParsedProfile((), "none", False, notes=("the profile is empty",))
    notes: list[str] = []
    error: ValueError | None
    try:
        loaded = json.loads(stripped)
    except ValueError as exc:
        loaded, error = None, exc
    else:
        error = None
    if error is None:
        raw_events = loaded.get("traceEvents") if isinstance(loaded, Mapping) else loaded
        if not isinstance(raw_events, list):
            return ParsedProfile((), "json", False, notes=(
                f"the profile is JSON but not a list of events ({type(loaded).__name__})",))
        method: Literal["json", "lines", "none"] = "json"
        complete = True
        candidates: list[dict[str, Any] | None] = [_normalize(raw) for raw in raw_events]
    else:
        method = "lines"
        lines = [line for line in stripped.splitlines() if line.strip()]
        complete = lines[0].strip() == "[" and lines[-1].strip() == "]"
        notes.append(f"the profile is not valid JSON ({error}); read line by line")
        if not complete:
            notes.append("the profile ends early (no closing bracket): it was cut short")
        candidates = [_read_line(line) for line in lines if line.strip() not in ("[", "]")]
    events, fences, unreadable = [], 0, 0
    for event in candidates:
        if event is None:
            unreadable += 1
        elif _is_fence(event):
            fences += 1
        else:
            events.append(MappingProxyType(event))
    if fences:
        notes.append(f"{fences} fence events skipped (onnxruntime <= 1.20 writes them)")
    if unreadable:
        what = "lines" if method == "lines" else "elements"
        notes.append(f"{unreadable} {what} could not be read as events")
        if method == "lines" and complete:
            complete = False  # a kernel could hide in a line we could not read
            notes.append("the profile is not whole: a line that could not be read may have held a kernel")
    return ParsedProfile(tuple(events), method, complete, fences, unreadable, tuple(notes))


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


# --------------------------------------------------------------------------- the proof


@dataclass(frozen=True)
class PlacementProof:
    """The verdict on where a stage ran, with the evidence it rests on.

    Times are microseconds, as onnxruntime's profiler writes them. Execution fields are None
    when no usable profile was read, plan fields when there was no plan.

    Attributes:
        target_ep: the EP the stage was meant to run on (the name in the evidence).
        requested_ep: the EP the session was asked for (usually ``target_ep``).
        session_providers: ``session.get_providers()``, or None when not collected.
        available_providers: ``onnxruntime.get_available_providers()``, or None.
        ort_version: the worker's onnxruntime version, when given.
        verdict: ``placed``, ``declined`` (measured, below ``min_placement``) or
            ``unmeasured`` (no usable evidence; never passes).
        cause: None when placed; else ``declined``, ``unmeasured`` or ``provider_swapped``.
        basis: ``plan`` or ``execution``: what :attr:`fraction` was computed from; None when
            nothing was measured.
        fraction: the fraction the gate used (node fraction on ``plan``; time fraction, or
            kernel fraction when all kernels took 0 µs, on ``execution``).
        min_placement: the threshold: placed iff ``fraction > 0`` and ``fraction >= min_placement``.
        swapped: the requested EP was replaced (rule 4).
        fallback_banner: the Python layer's "Falling back to [...]" banner was seen.
        node_fraction: plan: nodes on the target / all nodes (copies excluded).
        nodes_on_target: plan: nodes assigned to the target.
        nodes_total: plan: nodes assigned to any EP (copies excluded).
        plan_copies: plan: ``Memcpy*`` nodes.
        graph_node_count: nodes of the ONNX graph and its subgraphs, when given.
        time_fraction: execution: compute kernel time on the target / all compute kernel time.
        kernel_fraction: execution: compute kernels on the target / all compute kernels.
        kernels_on_target: execution: compute kernel events on the target (a fused subgraph is one).
        kernels_total: execution: compute kernel events (copies and control flow excluded).
        kernel_time_on_target_us: execution: their time on the target.
        kernel_time_total_us: execution: all compute kernel time.
        kernels_by_provider: execution: compute kernel events per provider.
        kernel_time_by_provider_us: execution: compute kernel time per provider.
        control_flow_kernels: execution: ``If``/``Loop``/``Scan`` events, not counted above.
        control_flow_time_us: execution: their time, excluded (it contains their children's).
        copies: execution: ``Memcpy*`` kernel events.
        copy_time_us: execution: their time.
        runs: execution: ``model_run`` events in the profile (one profiled warm-up: 1).
        profile_format: how the profile was read: ``json``, ``lines``, or None.
        cpu_nodes: nodes left on the CPU EP, by op type (names; ``<op_type>#<i>`` for unnamed
            nodes), from the basis; empty when the target is the CPU EP.
        off_target_nodes: every node not on the target, by EP, then op type.
        notes: what was used and why, for people.
    """

    target_ep: str
    requested_ep: str
    session_providers: tuple[str, ...] | None
    available_providers: tuple[str, ...] | None
    ort_version: str | None
    verdict: Verdict
    cause: Cause | None
    basis: Basis | None
    fraction: float | None
    min_placement: float
    swapped: bool
    fallback_banner: bool
    node_fraction: float | None = None
    nodes_on_target: int | None = None
    nodes_total: int | None = None
    plan_copies: int | None = None
    graph_node_count: int | None = None
    time_fraction: float | None = None
    kernel_fraction: float | None = None
    kernels_on_target: int | None = None
    kernels_total: int | None = None
    kernel_time_on_target_us: int | None = None
    kernel_time_total_us: int | None = None
    kernels_by_provider: Mapping[str, int] = field(default_factory=dict)
    kernel_time_by_provider_us: Mapping[str, int] = field(default_factory=dict)
    control_flow_kernels: int | None = None
    control_flow_time_us: int | None = None
    copies: int | None = None
    copy_time_us: int | None = None
    runs: int | None = None
    profile_format: Literal["json", "lines"] | None = None
    cpu_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    off_target_nodes: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Keep the closed sets closed: a proof outside them is a bug, not a verdict."""
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {self.verdict!r}")
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"cause must be None or one of {CAUSES}, not {self.cause!r}")
        if (self.verdict == "placed") != (self.cause is None):
            raise ValueError(f"a {self.verdict} proof cannot have cause {self.cause!r}")
        if self.basis is not None and self.basis not in BASES:
            raise ValueError(f"basis must be None or one of {BASES}, not {self.basis!r}")

    @property
    def passed(self) -> bool:
        """Whether the gate admits the stage: ``verdict == "placed"``."""
        return self.verdict == "placed"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (dicts, lists, str, int, float, bool, None), fields in order."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


_Groups = Mapping[str, Mapping[str, tuple[str, ...]]]


def _frozen_groups(groups: _Groups) -> _Groups:
    return MappingProxyType({ep: MappingProxyType(dict(ops)) for ep, ops in groups.items()})


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
    # Rule 1: arguments.
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
    min_placement = float(min_placement)
    notes: list[str] = []
    version = f"onnxruntime {ort_version}" if ort_version else "this onnxruntime"

    # Rule 2: the profile.
    parsed = parse_profile(profile_text)
    notes.extend(f"profile: {note}" for note in parsed.notes)
    execution = None
    if parsed.complete:
        execution = _execution(parsed.events)
        if not execution.kernels:
            notes.append("profile: no compute kernel events (category Node, *_kernel_time): "
                         "no execution evidence")
            execution = None
    elif parsed.method != "none":
        notes.append("profile: not used as evidence (incomplete)")

    # Rule 3: plan or execution.
    basis: Basis | None = None
    fraction = node_fraction = time_fraction = kernel_fraction = None
    plan_on = plan_total = None
    plan_by_ep: dict[str, int] = {}
    if plan is not None:
        for ep, _, _ in plan.nodes:
            plan_by_ep[ep] = plan_by_ep.get(ep, 0) + 1
        plan_total = len(plan.nodes)
        plan_on = plan_by_ep.get(target_ep, 0)
        node_fraction = _fraction(plan_on, plan_total)
        if plan_total:
            notes.append(f"plan: {_n(plan_total, 'node')} ({_counts(plan_by_ep)})"
                         + (f", {plan.copies} Memcpy nodes left out" if plan.copies else ""))
        else:
            notes.append("plan: empty (no node recorded)")
    elif ort_version is not None:
        notes.append(f"plan: none ({version} has no assignment API, or it was not recorded)")
    else:
        notes.append("plan: none")
    if execution is not None:
        total_k = sum(execution.kernels.values())
        total_t = sum(execution.time_us.values())
        on_k = execution.kernels.get(target_ep, 0)
        on_t = execution.time_us.get(target_ep, 0)
        kernel_fraction = _fraction(on_k, total_k)
        time_fraction = _fraction(on_t, total_t)
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
    plan_usable = bool(plan_total)
    if plan_usable and execution is not None:
        missing = [ep for ep in execution.kernels if ep not in plan_by_ep and ep != _UNKNOWN_PROVIDER]
        if missing:
            plan_usable = False
            notes.append(f"plan: not used: it lists no node on {', '.join(missing)}, where "
                         f"{sum(execution.kernels[ep] for ep in missing)} kernels ran (an incomplete plan: "
                         "measured with the WebGPU plugin EP on onnxruntime 1.30, which lists only the CPU's "
                         "nodes); the execution decides")
    if not plan_usable:
        node_fraction = None  # an empty or incomplete plan has no node fraction to report
    if plan_usable:
        basis, fraction = "plan", node_fraction
        notes.append(f"basis: plan, node fraction {plan_on}/{plan_total} = {_fmt(node_fraction)}")
        if graph_count is not None and graph_count != plan_total:
            notes.append(f"plan: {_n(plan_total, 'node')} as partitioned, {graph_count} in the ONNX graph "
                         "(onnxruntime fuses some before it partitions, e.g. MatMul+Add into Gemm, and a "
                         "control-flow node an EP compiles is listed without its branches)")
        if kernel_fraction is not None and (node_fraction == 0) != (kernel_fraction == 0):
            notes.append(f"plan and execution disagree: node fraction {_fmt(node_fraction)}, "
                         f"kernel fraction {_fmt(kernel_fraction)}")
    elif execution is not None:
        basis = "execution"
        if time_fraction is not None:
            fraction = time_fraction
            notes.append(f"basis: execution, time fraction {execution.time_us.get(target_ep, 0)}/"
                         f"{sum(execution.time_us.values())} us = {_fmt(time_fraction)}")
        else:
            fraction = kernel_fraction
            notes.append(f"basis: execution, kernel fraction {_fmt(kernel_fraction)} "
                         "(every kernel took 0 us: no time fraction)")
    else:
        notes.append("basis: none: no usable plan and no usable profile")

    # Rule 4: swap.
    swap_reasons = []
    if session is not None:
        for name in dict.fromkeys((requested, target_ep)):
            if name not in session:
                swap_reasons.append(f"{name} is not among the session's providers {list(session)}")
    else:
        notes.append("session providers not collected: a swap cannot be ruled out from them")
    if available is not None and requested not in available:
        notes.append(f"{requested} is not in this onnxruntime build (available: {list(available)})")
    banner = bool(fallback_banner and fallback_banner.strip())
    if fallback_banner is not None and banner:
        line = next((ln.strip() for ln in fallback_banner.splitlines() if "Falling back" in ln),
                    fallback_banner.strip().splitlines()[0])
        if target_ep != CPU_EP:
            swap_reasons.append(f"onnxruntime's Python layer fell back and rebuilt the session: {line!r}")
        else:
            notes.append(f"a fallback banner was seen, but the target is the CPU EP: {line!r}")
    swapped = bool(swap_reasons)
    notes.extend(f"swap: {reason}" for reason in swap_reasons)

    # Rule 5: verdict.
    verdict: Verdict
    cause: Cause | None
    if swapped:  # 5a
        cause = "provider_swapped"
        if fraction is not None and fraction == 0:
            verdict = "declined"
            notes.append(f"verdict: declined (provider swapped; the {basis} shows nothing on {target_ep})")
        else:
            verdict = "unmeasured"
            notes.append("verdict: unmeasured (provider swapped; "
                         + ("no evidence)" if fraction is None else
                            f"yet the {basis} shows {_fmt(fraction)} on {target_ep}: contradictory)"))
    elif fraction is None:  # 5b
        verdict, cause = "unmeasured", "unmeasured"
        notes.append("verdict: unmeasured (no evidence; never passes)")
    elif fraction > 0 and fraction >= min_placement:  # 5c
        verdict, cause = "placed", None
        notes.append(f"verdict: placed ({_fmt(fraction)} >= min_placement {min_placement:g})")
    else:  # 5d
        verdict, cause = "declined", "declined"
        why = (f"nothing on {target_ep}" if fraction == 0
               else f"{_fmt(fraction)} < min_placement {min_placement:g}")
        notes.append(f"verdict: declined ({why})")

    # Nodes off the target, from the basis (the plan's when it is usable, else the kernels').
    if basis == "plan" and plan is not None:
        off = _group(plan.nodes, target_ep)
    elif execution is not None:
        off = _group(execution.nodes, target_ep)
    else:
        off = {}
    cpu = off.get(CPU_EP, {}) if target_ep != CPU_EP else {}

    return PlacementProof(
        target_ep=target_ep,
        requested_ep=requested,
        session_providers=session,
        available_providers=available,
        ort_version=ort_version,
        verdict=verdict,
        cause=cause,
        basis=basis,
        fraction=fraction,
        min_placement=min_placement,
        swapped=swapped,
        fallback_banner=banner,
        node_fraction=node_fraction,
        nodes_on_target=plan_on,
        nodes_total=plan_total,
        plan_copies=plan.copies if plan is not None else None,
        graph_node_count=graph_count,
        time_fraction=time_fraction,
        kernel_fraction=kernel_fraction,
        kernels_on_target=execution.kernels.get(target_ep, 0) if execution else None,
        kernels_total=sum(execution.kernels.values()) if execution else None,
        kernel_time_on_target_us=execution.time_us.get(target_ep, 0) if execution else None,
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
