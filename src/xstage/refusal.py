"""A refusal is a value: a named, structured result, and the one registry of what it can say.

A refusal carries code, cause, device, route, message, remedy and evidence. The five codes are
a closed set (docs/external.md, "Refusals and exit codes"); ``cause`` says which case.

:data:`REGISTRY` is the one table of every (code, cause): when it happens, which module decides
it, and its remedy where the remedy does not depend on the run. Everything else that lists
causes is derived from it or checked against it:

1. :data:`CAUSES` (what :class:`Refusal` accepts) and ``xstage.stage.refusals.REMEDIES`` are
   built from it here and there.
2. The record schema's enums (``$defs.refusal``'s code and causes, ``$defs.ledger.cause``) and
   docs/external.md's table of refusals are written from it by ``scripts/refusal_registry.py``;
   ``tests/record/test_refusal_registry.py`` fails when either is stale, and when a decider's
   own typed list of causes (``parity.Cause``, ``evidence.proof.CAUSES``) names one it lacks.

Adding a cause is one :class:`CauseEntry` here, the code that decides it, and
``python3 scripts/refusal_registry.py`` (docs/architecture.md, "Adding a refusal cause").
A new cause is a new enum value of the record: a minor version of the schema.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAUSES", "REGISTRY", "CauseEntry", "Refusal", "RefusalCode"]


class RefusalCode(str, enum.Enum):
    """The five refusal codes (docs/design.md §7); every refusal carries exactly one."""

    NO_EXPORTED_GRAPH = "no_exported_graph"
    DEVICE_UNREACHABLE = "device_unreachable_from_this_process"
    EP_DECLINED = "execution_provider_declined_graph"
    NUMERIC_GATE_FAILED = "numeric_gate_failed"
    BUDGET_EXCEEDS_DEVICE = "budget_exceeds_device"


@dataclass(frozen=True)
class CauseEntry:
    """One row of the registry: a cause of one code.

    Attributes:
        code: the refusal code the cause belongs to.
        cause: the cause, as the record writes it.
        when: the case, in the words of docs/external.md's table (Markdown).
        decided_by: the modules (under ``src/xstage/``) whose verdict it is.
        remedy: the remedy when it does not depend on the run; None where the decider writes
            it from what it found (the pool and sizes, the route's missing piece, ...).
        remedies: other remedies of the same cause, keyed by what the run found (the key
            ``xstage.stage.refusals`` picks, e.g. ``names`` for an unmeasured proof whose
            names failed the check).
    """

    code: RefusalCode
    cause: str
    when: str
    decided_by: tuple[str, ...]
    remedy: str | None = None
    remedies: Mapping[str, str] = field(default_factory=dict)


_NO_GRAPH, _UNREACHABLE, _DECLINED, _GATE, _BUDGET = RefusalCode

#: Every (code, cause), in the order the schema and the docs list them.
REGISTRY: tuple[CauseEntry, ...] = (
    CauseEntry(_NO_GRAPH, "format_not_run_here",
               "no route of the device runs the artifact's format",
               ("planner.py",)),
    CauseEntry(_NO_GRAPH, "format_not_accepted",
               "the route's device declines that format by its documented limit "
               "(`RouteSpec.declines`: A8W8 on XDNA2); the remedy names the format it takes",
               ("planner.py", "routes/specs.py")),
    CauseEntry(_UNREACHABLE, "no_route",
               "no resolved route drives the device from here, or this machine shows no such device",
               ("planner.py",)),
    CauseEntry(_UNREACHABLE, "route_missing",
               "a route could drive the device but is missing here (its interpreter, runtime or "
               "EP: the refusal's `reason_code` says which)",
               ("planner.py", "routes/resolve.py")),
    CauseEntry(_UNREACHABLE, "no_node",
               "no node of the cluster has the resources asked for, or none was free within "
               "`placement_timeout` ([cluster.md](cluster.md))",
               ("cluster/place.py",)),
    CauseEntry(_DECLINED, "declined",
               "the proof measured less of the stage on the device than `--min-placement` asks",
               ("evidence/onnx.py", "evidence/torch.py"),
               "lower --min-placement to accept the split, or change the graph so the EP takes the "
               "ops it left on the CPU"),
    CauseEntry(_DECLINED, "unmeasured",
               "no usable placement evidence (no profile, a name that failed the name check, "
               "bounds that cannot decide), or nothing attests the device off the CPU; never passes",
               ("evidence/onnx.py", "evidence/torch.py", "evidence/attestation.py"),
               "the profile could not be read; see the worker log (profiling must be allowed)",
               {"names":
                "onnxruntime named a kernel or plan node in a form the name check does not know (the "
                "record's proof.name_failures lists them; docs/external.md, \"Untrusted text\"): report it "
                "with the record; --graph-opt-level ORT_DISABLE_ALL runs the graph without onnxruntime's "
                "rewrites, which make most of those names",
                "bounds":
                "no plan lists the nodes of the partition the EP compiled, so the node fraction is only "
                "known between the bounds in the record's proof notes: use onnxruntime >= 1.24 on this "
                "route (its plan lists them), or a --min-placement outside the bounds",
                "unattested":
                "this route's runtime reports no device; run it where the EP-device API "
                "(onnxruntime >= 1.23) binds the device, or use a route that reports one"}),
    CauseEntry(_DECLINED, "provider_swapped",
               "the session does not hold the EP asked for (not in that build, or it failed to "
               "initialise)",
               ("evidence/onnx.py",),
               "the EP is not in that build or failed to initialise: see the worker log and xstage devices"),
    CauseEntry(_DECLINED, "evidence_conflict",
               "onnxruntime's plan puts nodes on the EP and its profile cannot confirm it; never passes",
               ("evidence/onnx.py",),
               "onnxruntime's plan put nodes on the EP but its profile could not confirm it (a kernel "
               "name that is not the graph's, or no kernel time); see the record's proof notes and "
               "report it with the record"),
    CauseEntry(_DECLINED, "device_mismatch",
               "another device than the planned one is attested",
               ("evidence/attestation.py",),
               "the EP ran on another device than the planned one: drop the --ep-option that moves it, "
               "or ask for that device with --device; the worker log shows the EP's own messages"),
    CauseEntry(_DECLINED, "ep_compile_failed",
               "the EP claimed nodes and then failed to compile them, or the candidate's worker died "
               "loading or warming up while the reference arm runs the artifact",
               ("stage/admit.py", "stage/crash.py"),
               "the EP claimed nodes it then failed to compile: run the stage on another route "
               "(--route ort-cpu) or device, or change the graph so the EP does not take the op the "
               "message names (Loop and If bodies are the usual ones)"),
    CauseEntry(_DECLINED, "outputs_off_device",
               "a torch stage's outputs came back from another device than the stage's",
               ("evidence/torch.py",),
               "the program returns tensors from another device than the stage's: move the outputs "
               "to the device in the module (or drop the .cpu()/.to() before returning) and export again"),
    CauseEntry(_GATE, "tolerance",
               "it ran there and disagreed with the reference beyond its format's tolerance (and the "
               "float64 tie-break, where it ran, did not side with it; where it was unavailable, "
               "fp32 failed the noise tier too)",
               ("parity.py", "stage/tiebreak.py"),
               "look at the decided criterion; for OpenVINO check the precision hint; --tolerance F "
               "relaxes the relative criterion when the difference is expected (rel_l2=X,abs_rms=Y,"
               "cosine=Z,elem=B name each criterion)"),
    CauseEntry(_GATE, "nonfinite",
               "NaN or Inf where the reference has none, or the other way round",
               ("parity.py",),
               "NaN or Inf where the reference has none (or the other way round): an overflow in a "
               "lower precision is the usual cause; no tolerance admits it"),
    CauseEntry(_GATE, "elementwise",
               "some elements are off while the norms pass",
               ("parity.py",),
               "some elements are wrong while the norm looks fine (a block in lower precision, a wrong "
               "row): look at the worst element in the criterion; --tolerance elem=B admits a fraction B "
               "of the elements, elem_a=A and elem_rtol=R widen the bound (where the float64 tie-break "
               "was unavailable, elem_a=1e-5 admits a deep fp32 graph's reordered sums)"),
    CauseEntry(_GATE, "nondeterministic",
               "an arm disagreed with itself between two computations of the same inputs",
               ("parity.py", "stage/gate.py"),
               "the stage (or its reference) gave different numbers for the same inputs: remove or "
               "seed the random ops the message names (Dropout in training mode, RandomUniformLike, "
               "torch.rand_like, ...), or, where the randomness is meant, name a --tolerance that its "
               "numbers should meet and the record will say the stage is nondeterministic"),
    CauseEntry(_BUDGET, "over_budget",
               "the budget does not fit its pool, checked before the worker starts "
               "([memory.md](memory.md))",
               ("ledger/budget.py",)),
    CauseEntry(_BUDGET, "peak_over_budget",
               "the worker's measured peak passed the budget (after the warm-up)",
               ("ledger/measured.py",),
               "the stage holds more than its estimate: report the record (the reservations show what "
               "was expected), or run it with a smaller input"),
    CauseEntry(_BUDGET, "capacity_unknown",
               "the pool's capacity is unknown, so no budget can be checked before the worker starts",
               ("ledger/budget.py",)),
    CauseEntry(_BUDGET, "peak_unreported",
               "the route's worker does not report its pool's memory, so nothing confirms the budget",
               ("ledger/measured.py",),
               "this route's worker does not report the memory of its pool; nothing can confirm the "
               "budget (see docs/memory.md for what each route reports)"),
)

#: The causes each code admits, in the registry's order.
CAUSES: dict[RefusalCode, tuple[str, ...]] = {
    code: tuple(e.cause for e in REGISTRY if e.code is code) for code in RefusalCode}


@dataclass(frozen=True)
class Refusal:
    """Why a (device, route) was not used: a result, not a crash."""

    code: RefusalCode
    cause: str
    device: str | None
    route: str | None
    message: str
    remedy: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cause not in CAUSES[self.code]:
            raise ValueError(f"cause {self.cause!r} is not one of {CAUSES[self.code]} for {self.code.value}")

    def to_dict(self) -> dict[str, Any]:
        """The record's refusal object."""
        return {"code": self.code.value, "cause": self.cause, "device": self.device,
                "route": self.route, "message": self.message, "remedy": self.remedy,
                "evidence": self.evidence}
