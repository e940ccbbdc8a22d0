"""Placement evidence, pure: profiles and plans in, a ``PlacementProof`` out.

``onnx`` proves an ONNX stage from onnxruntime's profile and per-node plan; ``torch`` proves a
``.pt2`` stage from the torch profiler's op log. No processes, no sessions: recorded fixtures
test them.
"""

from __future__ import annotations

from xstage.evidence.onnx import (
    BASES,
    CAUSES,
    CONTROL_FLOW_OPS,
    COPY_OPS,
    CPU_EP,
    VERDICTS,
    Basis,
    Cause,
    ParsedProfile,
    PlacementProof,
    Verdict,
    parse_profile,
    prove,
)
from xstage.evidence.torch import (
    NEUTRAL_OPS,
    prove_torch,
)

__all__ = [
    "BASES",
    "Basis",
    "CAUSES",
    "CONTROL_FLOW_OPS",
    "COPY_OPS",
    "CPU_EP",
    "Cause",
    "NEUTRAL_OPS",
    "ParsedProfile",
    "PlacementProof",
    "VERDICTS",
    "Verdict",
    "parse_profile",
    "prove",
    "prove_torch",
]
