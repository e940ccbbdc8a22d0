"""Placement evidence, pure: profiles and plans in, a ``PlacementProof`` out.

``profile`` reads onnxruntime's profile files; ``onnx`` proves an ONNX stage from that profile and
onnxruntime's per-node plan, one helper per numbered rule; ``torch`` proves a ``.pt2`` stage from
the torch profiler's op log; ``proof`` holds the ``PlacementProof`` both end in. No processes, no
sessions: recorded fixtures test them.
"""

from __future__ import annotations

from xstage.evidence.onnx import CONTROL_FLOW_OPS, COPY_OPS, CPU_EP, prove
from xstage.evidence.profile import ParsedProfile, parse_profile
from xstage.evidence.proof import BASES, CAUSES, VERDICTS, Basis, Cause, PlacementProof, Verdict
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
