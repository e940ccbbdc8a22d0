"""A refusal is a value: a named, structured result.

It carries code, cause, device, route, message, remedy and evidence. The five codes are the
seed's closed set; ``cause`` says which case.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAUSES", "Refusal", "RefusalCode"]


class RefusalCode(str, enum.Enum):
    """The seed's five refusal codes (DESIGN §5); every refusal carries exactly one."""

    NO_EXPORTED_GRAPH = "no_exported_graph"
    DEVICE_UNREACHABLE = "device_unreachable_from_this_process"
    EP_DECLINED = "execution_provider_declined_graph"
    NUMERIC_GATE_FAILED = "numeric_gate_failed"
    BUDGET_EXCEEDS_DEVICE = "budget_exceeds_device"


#: The causes each code admits.
CAUSES: dict[RefusalCode, tuple[str, ...]] = {
    RefusalCode.NO_EXPORTED_GRAPH: ("format_not_run_here", "format_not_accepted"),
    RefusalCode.DEVICE_UNREACHABLE: ("no_route", "route_missing", "no_node"),
    RefusalCode.EP_DECLINED: ("declined", "unmeasured", "provider_swapped", "evidence_conflict",
                              "device_mismatch", "ep_compile_failed", "outputs_off_device"),
    RefusalCode.NUMERIC_GATE_FAILED: ("tolerance", "nonfinite", "elementwise", "nondeterministic"),
    RefusalCode.BUDGET_EXCEEDS_DEVICE: (
        "over_budget", "peak_over_budget", "capacity_unknown", "peak_unreported"),
}


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
