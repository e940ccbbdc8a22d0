"""The corpus's oracle: the expected result of a case, from its construction metadata only.

It shares no code with ``xstage.evidence`` (it imports nothing of xstage) and never looks at a
profile, a plan or a record: it knows which nodes the EP takes and how much work each does
because the corpus built them so. The rules are those of docs/external.md §3 ("The proof"),
restated:

* A user ``--ep-option device_type`` that selects another device than the planned one is a usage
  error: exit 64, no record, naming ``--ep-option device_type`` and the ``--device`` that selects
  that device.
* The device the options as applied open is the attested device; when it is not the planned one
  the stage is refused with ``device_mismatch`` (exit 2).
* ONNX: node fraction = original nodes the EP takes / all original nodes; time fraction ≈ the
  work (FLOPs) of the nodes the EP takes / all work, used only when one node dominates (so
  that per-kernel overheads cannot move it across the threshold). Placed iff both reach
  ``--min-placement`` (exit 0); else ``declined`` (exit 2).
* torch: no op that launches a kernel is ``unmeasured`` (exit 2); else, on ``torch-cpu``, every
  op ran on the CPU: placed (exit 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from adv_corpus import IGPU, Case

#: How far a fraction must be from --min-placement for the oracle to call it.
MARGIN = 0.02
#: The heavy node must do at least this share of the work for the time fraction to be known.
DOMINANT = 0.95


@dataclass(frozen=True)
class Expected:
    """What the spec says a case must end in."""

    exit_code: int
    verdict: str | None  # placed, declined, unmeasured; None: not asserted (never placed)
    cause: str | None  # the refusal's cause; None when placed or a usage error
    record: bool
    names: tuple[str, ...] = ()  # texts a usage error must name
    node_fraction: float | None = None
    time_fraction: float | None = None


def _device_for(device_type: str) -> str:
    """The xstage device an OpenVINO device_type selects (on a machine with an Intel iGPU)."""
    kind = device_type.split(".")[0].split(":")[-1].upper()
    return {"CPU": "cpu", "GPU": IGPU, "NPU": "npu:intel"}[kind]


def _fractions(case: Case) -> tuple[float, float | None]:
    nodes = case.nodes
    node_fraction = sum(n.taken for n in nodes) / len(nodes)
    total = sum(n.work for n in nodes)
    heaviest = max(n.work for n in nodes)
    time_fraction = (sum(n.work for n in nodes if n.taken) / total
                     if heaviest >= DOMINANT * total else None)
    return node_fraction, time_fraction


def expected(case: Case) -> Expected:
    """The case's expected result (see the module docstring); ValueError when too close to call."""
    user = case.ep_options.get("device_type")
    if user is not None and _device_for(user) != case.planned_device:
        device = _device_for(user)
        return Expected(64, None, None, False, ("--ep-option device_type", f"--device {device}"))
    if case.simulated_igpu_device_type is not None and case.planned_device == IGPU:
        observed = _device_for(case.simulated_igpu_device_type)
        if observed != IGPU:
            return Expected(2, None, "device_mismatch", True)  # any verdict but placed
    if case.torch_kind is not None:
        if case.torch_counted_ops == 0:
            return Expected(2, "unmeasured", "unmeasured", True)
        return Expected(0, "placed", None, True)
    node_fraction, time_fraction = _fractions(case)
    mp = case.min_placement
    if node_fraction == 1.0:  # every node, hence all the work, on the target
        return Expected(0, "placed", None, True, node_fraction=1.0, time_fraction=1.0)
    if node_fraction < mp - MARGIN or (time_fraction is not None and time_fraction < mp - MARGIN):
        return Expected(2, "declined", "declined", True, node_fraction=node_fraction,
                        time_fraction=time_fraction)
    if node_fraction >= mp + MARGIN and time_fraction is not None and time_fraction >= mp + MARGIN:
        return Expected(0, "placed", None, True, node_fraction=node_fraction, time_fraction=time_fraction)
    raise ValueError(f"{case.id}: too close to call (nodes {node_fraction:.3f}, time {time_fraction}, "
                     f"min_placement {mp})")
