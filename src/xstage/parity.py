"""The numeric gate: a stage's outputs against a reference, per output, to one verdict.

Pure: arrays in, a frozen :class:`Parity` out. No processes, no sessions. It raises only on
malformed *arguments* (an unknown format or reference kind, a value that is not an array);
bad news — a wrong dtype, a missing output, NaNs where the reference has none — is a failed
verdict with a criterion, never an exception. The stage layer turns a failed verdict into the
refusal ``numeric_gate_failed`` with :attr:`Parity.cause` (docs/design.md §7).

Every metric is computed in float64. Per output, the rules, first match decides:

1. **Names.** An output the reference lacks, or a reference output the stage did not return,
   fails.
2. **Dtype and shape** must be equal: nothing is cast or broadcast. A mismatch fails, and so
   does a stage output whose shape contradicts the artifact's declaration (``declared``:
   rank and every fixed dimension; rule ``declared_shape``). One
   exception, because it is the comparison itself: a reduced-precision artifact
   (:data:`WIDENING_FORMATS`) checked against an fp32 reference (any kind but
   ``same_graph_cpu``) may return another *floating* dtype than the reference (float16 or
   bfloat16 against float32); both are read as float64, and the floor is the coarser dtype's.
3. **Empty** outputs (zero elements) pass.
4. **Integers and bools** compare exactly. One exception: under a quantized format
   (:data:`QUANTIZED_FORMATS`), an integer output that a ``QuantizeLinear`` produced is
   dequantized with that Q's scale and zero point (``quantized``, read from the graph by the
   stage layer), on both arms where the reference is the same integers, and rules 5-8 compare
   it under the format's tolerance: two backends requantize a float that sits near a step
   boundary to neighbouring steps (OpenVINO vs the CPU EP on a ``DQ → MatMul → Q`` region:
   19 of 32 uint16 positions, up to 113 steps). :attr:`OutputMetrics.dequantized` says so.
5. **NaN/Inf** (floats) must match position for position and kind for kind (NaN, +Inf, -Inf).
   A difference fails with cause ``nonfinite``. Matched nonfinite values are left out of
   every float metric. An output that is nonfinite everywhere, at the same places, passes.
6. **All-zero reference** (every finite value 0): relative metrics are undefined, so the
   absolute criterion alone decides: ``max_abs <= floor``.
7. **Floats** pass iff ``(rel_l2 <= t_rel or max_abs <= max(t_abs·rms(ref), floor))`` and
   ``cosine >= c`` where the cosine is defined (neither vector zero).
8. **Element-wise** (floats that passed rule 7): ``n_bad``, the count of elements with
   ``|y − r| > max(a·rms(r), tiny) + rtol·|r|``, must be ``<= B·n`` (``tiny`` the coarser
   dtype's smallest normal, :func:`elem_floor`). It catches what a norm hides: a block of
   wrong elements beside large exact ones, and an output whose whole scale sits below the
   floor of rule 7. ``B = 0`` for fp32 and fp16.

``floor`` is :func:`abs_floor`: :data:`ABS_FLOOR_EPS` ulps of 1.0 in the output's dtype
(4·eps = 4.8e-7 for float32). It exists because rule 7's absolute branch is scaled by
``rms(ref)``, which is 0 for an all-zero reference and ~1e-6 for a sparse sigmoid map —
exactly where relative metrics are ill-conditioned. Bounded activations computed as
``1/2 ± p(x)`` (onnxruntime's MLAS logistic) resolve outputs near zero only in steps of
``ulp(1/2)/2 = eps/4``, and a last-bit change in their input (a fused bias add) moves an
output by a few such steps: measured here (tests/parity/test_parity_traps.py), two
onnxruntime optimization levels of a Conv→Sigmoid map with outputs of 1.2e-7..1.0e-5 differ at
68 of 1024 positions by at most 1.19e-7 (4 steps, = 1·eps), a relative L2 of 1.3e-2. The
floor admits that with 4x headroom. The price, stated: an output whose whole scale is below
the floor passes on magnitude and is checked only by its cosine (direction).

A failing verdict's ``cause`` is ``nonfinite`` when any output failed rule 5, ``elementwise``
when every failed output failed rule 8, otherwise ``tolerance`` (rules 1, 2, 4, 6, 7).

**The float64 tie-break.** Relative metrics cannot tell two right answers of an
ill-conditioned output apart, nor a sigmoid map near zero from a tiny output computed in
bf16. When the comparison fails on float rules only (:data:`FLOAT_RULES`) for a float format,
the stage layer (``xstage.stage.tiebreak``) evaluates the *reference* graph in float64 (never
the artifact under test, unless it is its own reference), and :func:`settle_tiebreak` passes
the stage if it is no further from that answer than the fp32 reference is (by rel_l2, and in
every magnitude band of the answer, within :data:`TIEBREAK_SLACK`), over the positions where
the answer is finite. Where that cannot run (or leaves nothing finite to compare),
:func:`tiebreak_unavailable` records why, with a code from :data:`TIEBREAK_UNAVAILABLE`, and
for fp32 the stage layer decides at the *noise
tier* (:func:`at_noise_tier`: rule 8 with ``a`` = :data:`NOISE_ELEM_A`, the measured fp32
reorder bound) unless the caller named ``elem_a``.

.. versionadded:: 0.1
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, TypedDict

import numpy as np

__all__ = [
    "ABS_FLOOR_EPS",
    "CRITERIA",
    "DEFAULT_TOLERANCES",
    "FORMATS",
    "NOISE_ELEM_A",
    "NOISE_TIER_BLIND",
    "QUANTIZED_FORMATS",
    "REFERENCE_KINDS",
    "TIEBREAK_BAND_MIN",
    "TIEBREAK_SLACK",
    "TIEBREAK_UNAVAILABLE",
    "Cause",
    "OutputMetrics",
    "Parity",
    "QuantParams",
    "Rule",
    "Tolerance",
    "Verdict",
    "WIDENING_FORMATS",
    "abs_floor",
    "at_noise_tier",
    "compare",
    "default_tolerance",
    "elem_floor",
    "magnitude_bands",
    "noise_tier_applies",
    "settle_tiebreak",
    "tiebreak_applies",
    "tiebreak_unavailable",
]

#: Artifact formats (docs/design.md §1), the first half of a default tolerance's key.
FORMATS = ("onnx:fp32", "onnx:fp16", "onnx:a16w8", "onnx:a8w8", "pt:fp32", "pt:fp16")

#: What the reference is, the second half of the key: ``same_graph_cpu`` the same graph on
#: onnxruntime's CPU EP; ``fp32_source`` the fp32 source of an fp16/A16W8 artifact;
#: ``torch_cpu`` the torch program on the CPU; ``user`` a ``--reference`` file.
REFERENCE_KINDS = ("same_graph_cpu", "fp32_source", "torch_cpu", "user")

#: Reduced-precision formats whose outputs may be a narrower float than an fp32 reference's
#: (rule 2's exception): an fp16 graph with fp16 outputs checked against its fp32 source.
WIDENING_FORMATS = ("onnx:fp16", "onnx:a16w8", "onnx:a8w8", "pt:fp16")

#: Quantized (QDQ) formats: an integer output that a ``QuantizeLinear`` produced is compared
#: dequantized with that Q's scale and zero point, under the format's tolerance (rule 4's
#: exception). Plain integer outputs (indices, argmax, counts) stay exact.
QUANTIZED_FORMATS = ("onnx:a16w8", "onnx:a8w8")

#: The absolute floor of rule 7, in ulps of 1.0 (machine epsilons) of the output's dtype.
#: Measured: two onnxruntime optimization levels of a sparse sigmoid map differ by 1·eps.
ABS_FLOOR_EPS = 4

#: A verdict of the gate.
Verdict = Literal["passed", "failed"]
#: Why a verdict failed (the ``cause`` of ``numeric_gate_failed``, docs/design.md §7).
Cause = Literal["tolerance", "nonfinite", "elementwise", "nondeterministic"]
#: Which rule decided one output (see the module docstring).
Rule = Literal[
    "rel_l2", "max_abs", "cosine", "exact", "empty", "all_zero_reference", "all_nonfinite",
    "nonfinite", "dtype", "shape", "missing", "unexpected", "elementwise", "declared_shape",
]

#: The rules a float64 evaluation can overturn (the others are facts of names, types, shapes).
FLOAT_RULES = ("rel_l2", "max_abs", "cosine", "elementwise", "all_zero_reference")

#: The float64 tie-break passes an output when the stage is within this factor of the fp32
#: reference's own distance to the float64 answer (rules T1 and T2, :func:`settle_tiebreak`).
#: "No further", with room for two fp32 algorithms to differ. Measured here (OpenVINO CPU f32
#: as the stage, the CPU EP as the reference, `python benchmarks/tiebreak.py`), the stage's
#: distance over the reference's: T1 (rel_l2) 1.01 (code2wav-tiny), 1.37 (MLP 512x6), 1.85 and
#: 1.86 (the 12-block tower at 196 and 1024 patches: OpenVINO is the less exact arm there),
#: 0.01 (PP-OCR det, where OpenVINO is the more exact); T2 (the worst magnitude band) 1.21,
#: 1.59, 2.41, 2.43, 0.13; the ill-conditioned ``x - mean(x)`` case 1.12. The same stages computed in
#: bf16 (INFERENCE_PRECISION_HINT=bf16; f16 gives the same on this CPU) are 1.1e4-2.6e4x
#: (T1) and 1.2e4-2.8e4x (T2) further. 16 is 6.6x over the worst fp32 ratio, because
#: a stage 16x less exact than the CPU EP at fp32 is still right to ~1e-5, and 660x under
#: the nearest bf16 one; fp16 and TF32 (unit roundoff 2^-11) are 2^13x fp32's.
TIEBREAK_SLACK = 16.0

#: Why a float64 tie-break was ``unavailable`` (the record's ``tiebreak.reason_code``; the
#: ``reason`` text says the rest): an op outside the evaluator's checked table
#: (``unchecked_op``), no finite element of the answer left to compare (``no_finite_answer``),
#: an output the answer lacks or shapes differently (``no_comparable_output``), its float64
#: copy too large (``memory``), past its time limit (``time_limit``), the evaluator failing on
#: the graph (``evaluator_failed``), no torch-cpu to run a torch program (``torch_unavailable``),
#: a stateful stage (``stateful``).
TIEBREAK_UNAVAILABLE = ("unchecked_op", "no_finite_answer", "no_comparable_output", "memory",
                        "time_limit", "evaluator_failed", "torch_unavailable", "stateful")

#: The fewest elements of one magnitude band of rule T2 (an output with fewer is one band):
#: a median or an rms over 64 fp32 errors is stable to a factor of ~1.5 between two arms of
#: the same precision, where a max over a handful is not.
TIEBREAK_BAND_MIN = 64


class QuantParams(TypedDict):
    """How a ``QuantizeLinear`` that produced an output quantized it (rule 4's exception).

    ``scale`` and ``zero_point`` are the Q's arrays (scalars, or 1-D along ``axis``); the
    dequantized value is ``(q − zero_point)·scale`` in the scale's dtype, as a
    ``DequantizeLinear`` computes it. ``node`` is the Q's name (for the record).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    node: str


@dataclass(frozen=True)
class Tolerance:
    """The thresholds of rules 7 and 8.

    Attributes:
        rel_l2: ``t_rel``: the largest ``‖y−r‖/‖r‖`` that passes.
        abs_rms: ``t_abs``: the absolute branch passes when every element is within
            ``t_abs·rms(ref)`` (or the dtype's floor, if larger) of the reference.
        min_cosine: ``c``: the smallest cosine similarity that passes, where it is defined.
        elem: ``B``: the largest fraction of an output's elements that may lie outside the
            element-wise bound of rule 8 (``--tolerance elem=B``).
        elem_a: ``a``: rule 8's bound is ``max(a·rms(ref), floor) + rtol·|r|``.
        elem_rtol: ``rtol`` of rule 8's bound.

    The rule-8 fields default to the fp32 tier's values, so a ``Tolerance`` built with three
    thresholds keeps the fp32 element-wise check.

    Raises:
        ValueError: a threshold is not finite, ``rel_l2``, ``abs_rms``, ``elem_a`` or
            ``elem_rtol`` is negative, ``min_cosine`` is outside [-1, 1], or ``elem`` is
            outside [0, 1].
    """

    rel_l2: float
    abs_rms: float
    min_cosine: float
    elem: float = 0.0
    elem_a: float = 1e-7
    elem_rtol: float = 1e-4

    def __post_init__(self) -> None:
        """Validate the thresholds (see Raises) and store them as floats."""
        for name in ("elem", "elem_a", "elem_rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"tolerance {name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"tolerance {name} must be >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.elem > 1:
            raise ValueError(f"tolerance elem (a fraction of the elements) must be <= 1, got {self.elem!r}")
        for name in ("rel_l2", "abs_rms", "min_cosine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"tolerance {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.rel_l2 < 0 or self.abs_rms < 0:
            raise ValueError(
                f"tolerance rel_l2 and abs_rms must be >= 0, got {self.rel_l2!r} and {self.abs_rms!r}")
        if not -1.0 <= self.min_cosine <= 1.0:
            raise ValueError(f"tolerance min_cosine must be in [-1, 1], got {self.min_cosine!r}")

    def to_dict(self) -> dict[str, float]:
        """The thresholds as a plain JSON object."""
        return {"rel_l2": self.rel_l2, "abs_rms": self.abs_rms, "min_cosine": self.min_cosine,
                "elem": self.elem, "elem_a": self.elem_a, "elem_rtol": self.elem_rtol}


#: The criteria ``--tolerance KEY=VALUE`` names, each to its :class:`Tolerance` field.
CRITERIA: Mapping[str, str] = MappingProxyType({
    "rel_l2": "rel_l2", "abs_rms": "abs_rms", "cosine": "min_cosine", "elem": "elem",
    "elem_a": "elem_a", "elem_rtol": "elem_rtol",
})


# --- Default tolerances -------------------------------------------------------------------
# "Measured here" = this repository's machine (AMD EPYC, avx512_bf16, no AMX), onnxruntime
# 1.32 CPU EP as the reference and onnxruntime-openvino 1.24.1 (OpenVINO CPU) as the device,
# on xstage.builtin_graphs.mlp (MatMul+Add+Relu blocks, Tanh); tests/parity reproduce the
# 4x256 numbers (test_parity_traps.py, test_parity_defaults_measured.py; `pytest -s` prints
# them); the 1-layer and 8x512 numbers came from the same code at those sizes. "Reported" =
# figures published for a Ryzen AI laptop (890M, XDNA2) and an RTX 5090, not measured here.
# For every tier, abs_rms is ~5-10x rel_l2: an evenly spread error (reordered reductions)
# passes it while an error concentrated on a few elements fails both branches.

# fp32 arithmetic on both sides, in a different order. Summation order and fused kernels give
# 1e-7..1e-5: measured here, OpenVINO CPU f32 vs the CPU EP 7.2e-08 (MLP 4x256) and 5.8e-07
# (8x512); reported, the 890M under DirectML vs torch CPU 9.10e-06 for a 27-block vision
# tower. rel_l2 1e-4 leaves 11x over the deepest of those, and stays below every
# reduced-precision mode an fp32 artifact can be silently computed in: TF32 matmuls on CUDA
# (5.65e-04 reported, RTX 5090; unit roundoff 2^-11), fp16 compute (4.9e-04 measured here,
# the MLP in fp16 vs its fp32 source; OpenVINO's GPU plugin infers in f16 by default, per
# its precision-control docs) and bf16 (2.5e-03..4.4e-03 measured here, 1 to 8 layers, with
# INFERENCE_PRECISION_HINT=bf16; 12% on a detector). A route that runs fp32 graphs
# in TF32 on purpose passes `--tolerance rel_l2=1e-3,elem_a=1e-2,elem_rtol=1e-3`.
# abs_rms 1e-3: the f32 reorderings above stay below 4e-6·rms(ref) on every element; fp16
# compute reaches 2.4e-3 and bf16 1.9e-2..2.6e-2, so this branch admits neither.
# min_cosine 0.999: a direction check, not a precision check (1 − cos ≈ rel_l2²/2, so rel_l2
# up to ~4% passes it): it catches what the floor admits near zero — a sign flip, a
# permutation at 1e-8 scale. The sparse sigmoid map measured here has cosine 0.99992 (two
# optimization levels) and 0.99956 (a numpy float32 reordering).
# Rule 8 (element-wise), fp32: a = 1e-7, rtol = 1e-4, B = 0; a failure goes to the float64
# tie-break, which is the arbiter (rules T1/T2, settle_tiebreak). Rule 8 is the filter: an
# element off by more than about one rounding of the output's scale (a = 1e-7 < eps(float32)
# = 1.19e-7) beyond rtol·|r| is not accepted on the fp32 comparison alone.
# Why a is this low: the headline case (docs/external.md §4), a bf16 block of 1% at scale 1 beside exact
# values of scale 1e4, errs by up to 2^-8·|r| ≈ 4e-3..1e-2, i.e. 4e-7..1e-6·rms(ref); a bf16
# block at scale s beside rms R fails rule 8 once s/R ≳ 85·a, so a = 1e-7 catches blocks down
# to s/R ≈ 1e-5 (the headline's 1e-4 with 12x to spare). It cannot be caught by a global a
# that also passes fp32 reorderings: measured here, OpenVINO CPU f32 vs the CPU EP, the
# smallest a that passes rule 8 (with rtol 1e-4) is 1.8e-06 (the built-in MLP 512x6),
# 2.6e-07 (code2wav-tiny), 4.3e-06 and 6.7e-06 (a 12-block Qwen3.5 vision tower, 512 wide,
# 183-213 MiB, at 196 and 1024 patches), 4.8e-02 (PP-OCR det's sparse sigmoid map); it grows
# with depth and tokens. Those stages fail rule 8 and pass the tie-break (docs/external.md
# has the table, `python benchmarks/tiebreak.py` re-measures it); vision-tower-tiny, PP-OCR
# cls and rec, silero-vad pass rule 8 (their worst elements sit under rtol·|r|).
# rtol 1e-4: PP-OCR rec's softmax peak is off by ~6e-6 of its value, silero-vad's scalar by
# 3.6e-05; bf16 (2^-9), fp16 and TF32 (2^-11) relative errors are 5-20x over it.
# B = 0: a reordering moves every element a little, not a few elements a lot.
# floor: the dtype's smallest normal (1.2e-38 for float32), so the rule has no scale below
# which everything passes; a sparse sigmoid map fails it and the tie-break decides.
# The cost, stated: a stage whose fp32 differs from the CPU EP's beyond a·rms (any deep
# OpenVINO, CUDA or DirectML fp32 stage) is admitted only by the tie-break, which evaluates
# the graph in float64 on the host (BLAS kernels, xstage.stage.f64_kernels): 0.04 s (code2wav-
# tiny), 0.2 s (MLP), 4-11 s (PP-OCR det), 17 s and 62 s (the tower at 196 and 1024 patches),
# measured on the 2-core VM under load 9-10. Where it is `unavailable` (an op onnx's
# evaluator lacks, a custom domain, over its time or memory limit), the noise tier decides
# (NOISE_ELEM_A below, chosen by xstage.stage.tiebreak), at the price of the headline block
# passing there; an elem_a the caller names is never replaced by a tier.
_FP32 = Tolerance(rel_l2=1e-4, abs_rms=1e-3, min_cosine=0.999, elem=0.0, elem_a=1e-7, elem_rtol=1e-4)

#: Rule 8's ``a`` at the fp32 *noise tier*: the verdict when the tight tier (``a`` = 1e-7) fails
#: and the float64 tie-break is ``unavailable`` (over its time or memory limit, an op onnx's
#: evaluator lacks), so that a deep fp32 stage on another EP is not refused for ordinary
#: reordering. The measured fp32 reorder bound: OpenVINO CPU f32 vs the CPU EP, the smallest
#: a that passes rule 8 is 1.8e-06 (MLP 512x6), 4.3e-06 and 6.7e-06 (the 12-block Qwen3.5
#: tower at 196 and 1024 patches); a reported 27-block tower under DirectML vs torch CPU,
#: 9.1e-06 rel L2 (the largest fp32 gap on record). 1e-5 is over all of them. The stage layer
#: (``xstage.stage.tiebreak``) chooses the tier; an explicit ``elem_a`` is never replaced.
NOISE_ELEM_A = 1e-5

#: What the noise tier cannot catch, as the record and the summary say it. Measured with
#: :func:`compare` (tests/parity/test_parity_tiers.py): a bf16 block of 1% of an output's
#: elements at rms s beside values of rms R fails rule 8 at a = 1e-5 once s/R >= 2e-3 and
#: passes at s/R <= 1e-3 (at a = 1e-7 it fails from s/R = 3e-5), so the headline block
#: (s/R = 1e-4) passes the noise tier.
NOISE_TIER_BLIND = ("a bf16 (or fp16) block at a scale below ~1e-3 of the output's rms "
                    "(the headline block at 1e-4 among them) passes the noise tier")

# fp16 artifacts: weights and activations rounded to fp16 (unit roundoff 2^-11 = 4.9e-4 per
# rounding). Measured here: the MLP with fp16 weights and I/O on the CPU EP vs its fp32
# source, rel_l2 4.8e-04..4.9e-04 and max_abs 2.4e-03..2.5e-03·rms(ref) at 4x256 and 8x512.
# Deep graphs (fp16 LayerNorm/Softmax, dozens of blocks) take many more rounding steps than
# this MLP, ~1e-3 being common: 5e-3 leaves 10x over the measurement, abs_rms 2.5e-2
# likewise. The same tier serves `same_graph_cpu`:
# the CPU EP runs most fp16 ops through inserted Casts in fp32 while a GPU/NPU accumulates in
# fp16, so the two differ by fp16 rounding of the activations — the same order as above.
# Rule 8, fp16: a = 1e-2 (the MLP's worst element above, 2.5e-03·rms, with 4x), rtol = 5e-3
# (10x fp16's unit roundoff 4.9e-4 for an element far above rms), B = 0 as for fp32: fp16
# rounding spreads over every element too.
_FP16 = Tolerance(rel_l2=5e-3, abs_rms=2.5e-2, min_cosine=0.999, elem=0.0, elem_a=1e-2, elem_rtol=5e-3)

# The same A16W8 (16-bit activations, 8-bit weights, QDQ) graph on two backends: same math,
# but one backend fuses DQ→op→Q into integer kernels with its own requantization rounding
# while the other simulates it in float, so single quantization steps differ. Measured here:
# the MLP quantized by onnxruntime.quantization (QUInt16/QInt8, per tensor) at ORT_ENABLE_ALL
# (fused) vs ORT_DISABLE_ALL (simulated) on the CPU EP, rel_l2 9.0e-03..9.2e-03, max_abs
# 4.6e-02..6.0e-02·rms (depending on the calibration data), cosine 0.99996; a reported NPU
# A16W8 probe graph vs the CPU: 3.03e-05. rel_l2 3e-2 and abs_rms 0.15 leave 2.5-3x over the
# fused-vs-simulated gap.
# Rule 8, A16W8 on two backends: a = 0.15 (the worst element measured, 6.0e-02·rms, 2.5x),
# rtol = 3e-2, B = 1e-3: a requantization may land one step apart at a few elements (none
# did in the measurement above; 1 in 1000 is the allowance for deeper graphs).
_A16W8_SAME = Tolerance(rel_l2=3e-2, abs_rms=0.15, min_cosine=0.999, elem=1e-3, elem_a=0.15,
                        elem_rtol=3e-2)

# An A16W8 artifact against fp32 (its source, the torch program, or a user file, which is
# what a --reference for a quantized artifact normally holds): the quantization error
# itself, ~1e-2. Per-tensor int8 weights round in steps of ~range/255, ~1% of a weight's rms
# per layer. Measured here: the MLP quantized as above vs its fp32 source, rel_l2 2.2e-02
# (4x256) and 2.1e-02 (8x512), max_abs 0.10..0.12·rms, cosine 0.99976. rel_l2 0.1 and abs_rms
# 0.5 leave 4.5x for deeper graphs; min_cosine 0.99 (rel_l2 ≳ 14% of orthogonal error) marks a
# broken quantization rather than rounding.
# Rule 8, A16W8 against fp32: a = 0.5 (the worst element measured, 0.12·rms, 4x), rtol 0.1,
# B = 1e-2: int8 weights move single elements by whole quantization steps.
_A16W8_VS_FP32 = Tolerance(rel_l2=0.1, abs_rms=0.5, min_cosine=0.99, elem=1e-2, elem_a=0.5,
                           elem_rtol=0.1)

# A8W8 (8-bit activations): each requantization rounds to 1/255 of its range, not 1/65535, so
# a step apart between two backends moves an element 256x further than A16W8's. Measured here
# (``xstage quantize --scheme a8w8``, synthetic calibration): against fp32, rel_l2 2.4e-02 (the
# built-in MLP, 8 samples), 2.0e-02 (MLP 8x512), 3.6e-02 (the tiny vision tower, 16 samples;
# its A16W8 1.6e-02); the MLP on OpenVINO against the same graph on the CPU EP, rel_l2 6.1e-08
# (no requantization landed apart). Same graph: A16W8's bounds doubled for the wider step (a
# few elements may land one 8-bit step apart). Against fp32: rel_l2 0.2 is 5.5x over the worst
# measured, min_cosine 0.98 marks a broken quantization rather than rounding.
_A8W8_SAME = Tolerance(rel_l2=6e-2, abs_rms=0.3, min_cosine=0.998, elem=2e-2, elem_a=0.3,
                       elem_rtol=6e-2)
_A8W8_VS_FP32 = Tolerance(rel_l2=0.2, abs_rms=1.0, min_cosine=0.98, elem=5e-2, elem_a=1.0,
                          elem_rtol=0.2)

_TIERS: dict[str, dict[str, Tolerance]] = {
    # fp32 vs fp32, whichever fp32 reference: only the order of operations differs.
    "onnx:fp32": {kind: _FP32 for kind in REFERENCE_KINDS},
    "pt:fp32": {kind: _FP32 for kind in REFERENCE_KINDS},
    # fp16 vs its fp32 source, or vs the same fp16 program on the CPU (see _FP16).
    "onnx:fp16": {kind: _FP16 for kind in REFERENCE_KINDS},
    "pt:fp16": {kind: _FP16 for kind in REFERENCE_KINDS},
    "onnx:a16w8": {
        "same_graph_cpu": _A16W8_SAME,
        "fp32_source": _A16W8_VS_FP32,
        "torch_cpu": _A16W8_VS_FP32,
        "user": _A16W8_VS_FP32,
    },
    "onnx:a8w8": {
        "same_graph_cpu": _A8W8_SAME,
        "fp32_source": _A8W8_VS_FP32,
        "torch_cpu": _A8W8_VS_FP32,
        "user": _A8W8_VS_FP32,
    },
}

#: Every default, keyed by ``(format, reference_kind)``; read-only.
DEFAULT_TOLERANCES: Mapping[tuple[str, str], Tolerance] = MappingProxyType(
    {(fmt, kind): tol for fmt, row in _TIERS.items() for kind, tol in row.items()}
)


def _check_key(fmt: str, reference_kind: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown artifact format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    if reference_kind not in REFERENCE_KINDS:
        raise ValueError(
            f"unknown reference kind {reference_kind!r}; valid kinds: {', '.join(REFERENCE_KINDS)}")


def default_tolerance(fmt: str, reference_kind: str) -> Tolerance:
    """The default tolerance for an artifact format checked against a kind of reference.

    Args:
        fmt: the artifact's format, one of :data:`FORMATS`.
        reference_kind: what the reference is, one of :data:`REFERENCE_KINDS`.

    Returns:
        The :class:`Tolerance`; each default is justified beside its definition.

    Raises:
        ValueError: ``fmt`` is not a known format (the message lists them).
        ValueError: ``reference_kind`` is not a known kind (the message lists them).
    """
    _check_key(fmt, reference_kind)
    return DEFAULT_TOLERANCES[(fmt, reference_kind)]


# --- formats per output, and each arm against itself ----------------------------------------

#: What one arm is held to against its own second computation of the gate's inputs: fp32's
#: tolerance at the noise tier's ``elem_a`` (:data:`NOISE_ELEM_A`), whatever the format. A
#: deterministic arm repeats itself bit for bit (measured here: ort-cpu, OpenVINO CPU f32 and
#: torch-cpu on the built-in MLP, the vision tower and its A16W8 quantization, max_abs 0 between
#: two runs); a GPU's atomics reorder sums by fp32 rounding, under this bound. A random op is
#: orders above it: ``x + rand_like(x)`` differs by ~0.4 of its rms between two runs.
SELF_TOLERANCE = replace(_FP32, elem_a=NOISE_ELEM_A)


def _judged_formats(names: list[str], fmt: str, formats: Mapping[str, str] | None) -> dict[str, str]:
    """The compared names judged by another format than ``fmt`` (by name or base name)."""
    if not formats:
        return {}
    out = {}
    for name in names:
        judged = formats.get(name) or formats.get(name.split(" (call ")[0])
        if judged is not None and judged != fmt:
            _check_key(judged, REFERENCE_KINDS[0])
            out[name] = judged
    return out


def _judged_rules(judged: str | None, tol: Tolerance,
                  tolerance: Tolerance | float | Mapping[str, float] | None,
                  reference_kind: str, widen: bool) -> tuple[Tolerance, bool]:
    """(tolerance, rule 2's widening) for one output judged by ``judged``; ``tol``/``widen``
    are the artifact format's, returned unchanged where ``judged`` is None (that format)."""
    if judged is None:
        return tol, widen
    own = _resolve_tolerance(tolerance, judged, reference_kind)[0]
    return own, judged in WIDENING_FORMATS and reference_kind != "same_graph_cpu"


def _formats_note(judged: Mapping[str, str]) -> str:
    """The summary's note of the outputs judged by another format."""
    if not judged:
        return ""
    return "; judged by their own format: " + ", ".join(f"{n} {f}" for n, f in judged.items())


def _quantized_failed(gate: Parity) -> str | None:
    """The quantized format (A16W8, A8W8) a failed output of ``gate`` is judged by
    (:attr:`Parity.formats`), or None."""
    return next((gate.formats[m.name] for m in gate.failed_outputs
                 if gate.formats.get(m.name) in QUANTIZED_FORMATS), None)


def self_agreement(first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray]) -> Parity:
    """One arm's second computation of the gate's inputs against its first.

    Args:
        first: the arm's outputs the first time.
        second: the same inputs computed again by the same arm.

    Returns:
        The verdict under :data:`SELF_TOLERANCE` (failed: the arm is nondeterministic).
    """
    return compare(second, first, fmt="onnx:fp32", reference_kind="same_graph_cpu",
                   tolerance=SELF_TOLERANCE)


def nondeterministic(gate: Parity, checks: Mapping[str, Parity], random_ops: tuple[str, ...] | list[str],
                     named: bool) -> Parity:
    """``gate`` decided again where an arm disagreed with itself (:func:`self_agreement`).

    An arm that disagrees with itself fails the gate with cause ``nondeterministic``, naming
    the output and the graph's random ops, unless the caller named a tolerance (``named``):
    then the comparison's verdict stands and :attr:`Parity.determinism` says the stage is
    nondeterministic.

    Args:
        gate: the comparison of the stage with the reference.
        checks: each arm (``stage``, ``reference``) to its :func:`self_agreement` verdict.
        random_ops: the random ops found in the graph (``xstage.graph_precision``).
        named: whether the caller named a ``--tolerance``.

    Returns:
        ``gate`` unchanged when both arms agree with themselves; otherwise with
        ``determinism`` set, and failed (``nondeterministic``) unless ``named``.
    """
    failed = {arm: check for arm, check in checks.items() if not check.passed}
    if not failed:
        return gate
    arm, check = next(iter(failed.items()))
    worst = check.failed_outputs[0]
    ops = ", ".join(random_ops) if random_ops else "none found in the graph"
    text = (f"the {arm} disagreed with itself on {worst.name} between two computations of the "
            f"same inputs ({worst.criterion}); random ops: {ops}")
    doc = {"nondeterministic": True, "random_ops": list(random_ops), "tolerance_named": named,
           "self_tolerance": SELF_TOLERANCE.to_dict(),
           "arms": {name: {"outputs": [m.name for m in c.failed_outputs], "summary": c.summary}
                    for name, c in failed.items()}}
    if named:
        said = "admitted by the named tolerance" if gate.passed else "the named tolerance decides"
        return replace(gate, determinism=doc, summary=f"{gate.summary}; nondeterministic ({said}): {text}")
    return replace(gate, verdict="failed", cause="nondeterministic", determinism=doc,
                   summary=f"failed (nondeterministic): {text}")


# --- dtypes ----------------------------------------------------------------------------------


def _ml_dtypes() -> Any | None:
    """The ml_dtypes module (bfloat16, float8, int4 for numpy), untyped; None if absent."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        return None
    module: Any = ml_dtypes
    return module


def _float_info(dtype: np.dtype[Any]) -> Any | None:
    """``finfo`` for numpy floats and ml_dtypes floats (bfloat16, float8_*), else None."""
    if dtype.kind == "f":
        return np.finfo(dtype)
    extra = _ml_dtypes() if dtype.kind == "V" else None
    if extra is None:
        return None
    try:
        return extra.finfo(dtype)
    except ValueError:
        return None


def _is_integer(dtype: np.dtype[Any]) -> bool:
    if dtype.kind in "biu":
        return True
    extra = _ml_dtypes() if dtype.kind == "V" else None  # ml_dtypes int4/uint4 and friends
    if extra is None:
        return False
    try:
        extra.iinfo(dtype)
    except ValueError:
        return False
    return True


def abs_floor(dtype: np.dtype | type | str) -> float:
    """The absolute floor of rules 6 and 7: :data:`ABS_FLOOR_EPS` · eps of a float dtype.

    4.8e-7 for float32, 3.9e-3 for float16, 3.1e-2 for bfloat16, 8.9e-16 for float64.

    Args:
        dtype: a floating dtype (numpy's, or ml_dtypes' bfloat16 / float8 types).

    Returns:
        The floor, in the dtype's own units.

    Raises:
        ValueError: ``dtype`` is not a floating dtype.
    """
    info = _float_info(np.dtype(dtype))
    if info is None:
        raise ValueError(f"abs_floor needs a floating dtype, got {np.dtype(dtype)}")
    return ABS_FLOOR_EPS * float(info.eps)


def elem_floor(dtype: np.dtype | type | str) -> float:
    """The floor of rule 8: the smallest normal number of a float dtype.

    1.2e-38 for float32 and bfloat16, 6.1e-5 for float16, 2.2e-308 for float64. Below it a
    float is subnormal and has lost relative precision; above it rule 8 has no absolute scale
    under which every value passes.

    Args:
        dtype: a floating dtype (numpy's, or ml_dtypes' bfloat16 / float8 types).

    Returns:
        The floor, in the dtype's own units.

    Raises:
        ValueError: ``dtype`` is not a floating dtype.
    """
    info = _float_info(np.dtype(dtype))
    if info is None:
        raise ValueError(f"elem_floor needs a floating dtype, got {np.dtype(dtype)}")
    return float(info.tiny)


# --- results ---------------------------------------------------------------------------------


def _json_float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return repr(value)  # 'inf' / 'nan': strict JSON has no literal for them


@dataclass(frozen=True)
class OutputMetrics:
    """One output's metrics (float64) and the rule that decided it.

    Attributes:
        name: the output's name.
        dtype: the stage's dtype for it (None when the stage did not return it).
        shape: the stage's shape for it (None when the stage did not return it).
        reference_dtype: the reference's dtype (None when the reference lacks it).
        reference_shape: the reference's shape (None when the reference lacks it).
        size: elements compared (0 when names, dtypes or shapes did not match).
        rel_l2: ``‖y−r‖/‖r‖`` over positions finite in both; None when ``‖r‖ = 0`` or not
            computed (integers, mismatches).
        cosine: ``y·r/(‖y‖‖r‖)``; None when either vector is zero or not computed.
        max_abs: ``max|y−r|`` over positions finite in both (for integers, exact below 2^53).
        rms_ref: ``rms(r)`` over the reference's finite values.
        abs_bound: the bound ``max_abs`` was held to (``max(t_abs·rms(ref), floor)``, or the
            floor alone for an all-zero reference); None where rule 7 did not apply.
        nan_count: NaNs in the output.
        inf_count: infinities in the output.
        ref_nan_count: NaNs in the reference.
        ref_inf_count: infinities in the reference.
        mismatched_nonfinite: positions where NaN/+Inf/-Inf differ between the two.
        n_bad: elements outside rule 8's bound (None where rule 8 did not run).
        n_allowed: how many rule 8 allows, ``floor(B·size)``.
        dequantized: for an integer output of a ``QuantizeLinear`` under a quantized format,
            the scale, zero point and axis it was dequantized with before rules 5-8 (the
            dtypes above stay the integers'); None for every other output.
        passed: whether this output passed.
        rule: the rule that decided (``rel_l2``, ``max_abs``, ``cosine``, ``exact``,
            ``empty``, ``all_zero_reference``, ``all_nonfinite``, ``nonfinite``, ``dtype``,
            ``shape``, ``missing``, ``unexpected``).
        criterion: exactly what decided, with the numbers, e.g.
            ``rel_l2 4.4e-03 > 1.0e-04 and max_abs 2.1e-02 > 1.0e-03·rms(ref)=4.3e-04``.
    """

    name: str
    dtype: str | None
    shape: tuple[int, ...] | None
    reference_dtype: str | None
    reference_shape: tuple[int, ...] | None
    size: int
    rel_l2: float | None
    cosine: float | None
    max_abs: float | None
    rms_ref: float | None
    abs_bound: float | None
    nan_count: int
    inf_count: int
    ref_nan_count: int
    ref_inf_count: int
    mismatched_nonfinite: int
    passed: bool
    rule: Rule
    criterion: str
    n_bad: int | None = None
    n_allowed: int | None = None
    dequantized: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The metrics as a plain JSON object (shapes as lists; ±inf/nan floats as strings)."""
        extra = {} if self.dequantized is None else {"dequantized": dict(self.dequantized)}
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "reference_dtype": self.reference_dtype,
            "reference_shape": None if self.reference_shape is None else list(self.reference_shape),
            "size": self.size,
            "rel_l2": _json_float(self.rel_l2),
            "cosine": _json_float(self.cosine),
            "max_abs": _json_float(self.max_abs),
            "rms_ref": _json_float(self.rms_ref),
            "abs_bound": _json_float(self.abs_bound),
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
            "ref_nan_count": self.ref_nan_count,
            "ref_inf_count": self.ref_inf_count,
            "mismatched_nonfinite": self.mismatched_nonfinite,
            "passed": self.passed,
            "rule": self.rule,
            "criterion": self.criterion,
            "n_bad": self.n_bad,
            "n_allowed": self.n_allowed,
            **extra,
        }


@dataclass(frozen=True)
class Parity:
    """The numeric gate's result for one stage.

    Attributes:
        verdict: ``passed`` or ``failed``.
        cause: None when passed; ``nonfinite`` when an output's NaN/Inf positions differ from
            the reference's, else ``tolerance`` (docs/design.md §7, ``numeric_gate_failed``).
        fmt: the artifact format the tolerance was chosen for.
        reference_kind: what the reference was.
        tolerance: the thresholds used.
        tolerance_key: ``"<format>/<reference_kind>"``, the default's key.
        tolerance_source: ``default``; ``override`` (a float replaced the default's
            ``rel_l2``, as ``--tolerance F`` does); or ``explicit`` (a whole
            :class:`Tolerance` was given).
        outputs: per-output metrics, the stage's outputs in graph order, then any reference
            output the stage did not return.
        summary: one line for humans.
        non_default: the ``--tolerance`` criteria (:data:`CRITERIA` keys) whose value is not the
            default's, tighter or looser.
        tiebreak: the float64 tie-break's result (``status`` passed, failed or unavailable,
            its reason and per-output distances); None where it did not run.
        asked: the :data:`CRITERIA` the caller named (a bare number names ``rel_l2``, a whole
            :class:`Tolerance` every one), equal to the default or not: a tier never
            replaces a criterion that was asked for.
        tier: set where the fp32 *noise tier* decided (:func:`at_noise_tier`): which tier,
            its ``elem_a``, why (the tie-break unavailable, and its reason), the tight
            tier's verdict, and what the noise tier cannot catch; None otherwise.
        formats: the outputs judged by another format than :attr:`fmt`, each with its format.
        determinism: set where an arm disagreed with itself (:func:`nondeterministic`): which
            arm, the outputs, the random ops, and whether a named tolerance admitted it.
        slot_sets: set where the serving region's slot sets were checked after the gate
            (``xstage.stage.admit``): ``sets`` (how many answered the gate's inputs), ``differs``
            (the first that answered otherwise, bit for bit, or None), ``skipped`` (why not).
    """

    verdict: Verdict
    cause: Cause | None
    fmt: str
    reference_kind: str
    tolerance: Tolerance
    tolerance_key: str
    tolerance_source: Literal["default", "override", "explicit"]
    outputs: tuple[OutputMetrics, ...]
    summary: str
    non_default: tuple[str, ...] = ()
    tiebreak: Mapping[str, Any] | None = None
    asked: tuple[str, ...] = ()
    tier: Mapping[str, Any] | None = None
    formats: Mapping[str, str] = field(default_factory=dict)
    determinism: Mapping[str, Any] | None = None
    slot_sets: Mapping[str, Any] | None = None

    @property
    def passed(self) -> bool:
        """Whether the verdict is ``passed``."""
        return self.verdict == "passed"

    @property
    def tolerance_is_default(self) -> bool:
        """Whether :attr:`tolerance` is the default for :attr:`tolerance_key`, unmodified."""
        return self.tolerance_source == "default"

    @property
    def failed_outputs(self) -> tuple[OutputMetrics, ...]:
        """The outputs that failed, in :attr:`outputs` order."""
        return tuple(m for m in self.outputs if not m.passed)

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON (what the record's ``parity`` field holds).

        ``tier`` and ``dequantized`` (the outputs compared dequantized) appear only where
        they apply, so the records of every other stage are unchanged.
        """
        extra: dict[str, Any] = {}
        if self.tier is not None:
            extra["tier"] = dict(self.tier)
        dequantized = [m.name for m in self.outputs if m.dequantized is not None]
        if dequantized:
            extra["dequantized"] = dequantized
        if self.formats:
            extra["formats"] = dict(self.formats)
        if self.determinism is not None:
            extra["determinism"] = dict(self.determinism)
        if self.slot_sets is not None:
            extra["slot_sets"] = dict(self.slot_sets)
        return {
            "verdict": self.verdict,
            "cause": self.cause,
            "format": self.fmt,
            "reference_kind": self.reference_kind,
            "tolerance": self.tolerance.to_dict(),
            "tolerance_key": self.tolerance_key,
            "tolerance_source": self.tolerance_source,
            "tolerance_default": self.tolerance_is_default,
            "tolerance_defaults": DEFAULT_TOLERANCES[(self.fmt, self.reference_kind)].to_dict(),
            "abs_floor_eps": ABS_FLOOR_EPS,
            "summary": self.summary,
            "outputs": [m.to_dict() for m in self.outputs],
            "non_default": list(self.non_default),
            "tiebreak": None if self.tiebreak is None else dict(self.tiebreak),
            **extra,
        }


# --- the comparison --------------------------------------------------------------------------


def _e(x: float) -> str:
    return f"{x:.1e}"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def _metrics(name: str, y: np.ndarray | None, r: np.ndarray | None, **fields: Any) -> OutputMetrics:
    base: dict[str, Any] = {
        "name": name,
        "dtype": None if y is None else str(y.dtype),
        "shape": None if y is None else tuple(int(d) for d in y.shape),
        "reference_dtype": None if r is None else str(r.dtype),
        "reference_shape": None if r is None else tuple(int(d) for d in r.shape),
        "size": 0,
        "rel_l2": None, "cosine": None, "max_abs": None, "rms_ref": None, "abs_bound": None,
        "nan_count": 0, "inf_count": 0, "ref_nan_count": 0, "ref_inf_count": 0,
        "mismatched_nonfinite": 0, "n_bad": None, "n_allowed": None,
    }
    base.update(fields)
    return OutputMetrics(**base)


def _nonfinite_code(a: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf (rule 5 matches kind for kind)."""
    code = np.zeros(a.shape, np.int8)
    code[np.isnan(a)] = 1
    code[np.isposinf(a)] = 2
    code[np.isneginf(a)] = 3
    return code


#: Elements judged at once. A larger output is compared block by block, so the comparison's
#: float64 temporaries stay a few blocks (2 MiB each) whatever the output's size; an output of
#: one block is compared exactly as a whole array (the sums over blocks are the per-block dot
#: products added up, which differ from one whole-array dot only in the last bits).
BLOCK = 1 << 18


def _blocks(n: int) -> range:
    return range(0, max(n, 1), BLOCK)


def _compare_integers(name: str, y: np.ndarray, r: np.ndarray) -> OutputMetrics:
    # Rule 4: exact. max_abs is informational, in float64 (exact below 2^53).
    yv, rv = y.reshape(-1), r.reshape(-1)
    differ, max_abs = 0, 0.0
    for at in _blocks(yv.size):
        yb, rb = yv[at:at + BLOCK], rv[at:at + BLOCK]
        differ += int(np.count_nonzero(yb != rb))
        if yb.size:
            max_abs = max(max_abs, float(np.max(np.abs(yb.astype(np.float64)
                                                       - rb.astype(np.float64)))))
    if differ == 0:
        return _metrics(name, y, r, size=int(y.size), max_abs=max_abs, passed=True, rule="exact",
                        criterion=f"exact ({y.dtype})")
    return _metrics(name, y, r, size=int(y.size), max_abs=max_abs, passed=False, rule="exact",
                    criterion=f"{y.dtype} differs at {differ} of {y.size} positions (max_abs {max_abs:g})")


class _Sums:
    """One output's float metrics, gathered block by block (see :data:`BLOCK`)."""

    def __init__(self, y: np.ndarray, r: np.ndarray) -> None:
        self.y, self.r = y.reshape(-1), r.reshape(-1)
        self.counts = {"size": int(self.y.size), "nan_count": 0, "inf_count": 0,
                       "ref_nan_count": 0, "ref_inf_count": 0, "mismatched_nonfinite": 0}
        self.n = 0
        self.scale = 0.0
        for _, _, yf, rf in self.finite_blocks(count=True):
            self.n += yf.size
            if yf.size:
                self.scale = max(self.scale, float(np.max(np.abs(yf))), float(np.max(np.abs(rf))))

    def finite_blocks(self, count: bool = False) -> Iterator[tuple[int, np.ndarray, np.ndarray,
                                                                 np.ndarray]]:
        """Each block: its start, its finite mask, and y and r in float64 where both are finite."""
        for at in _blocks(self.y.size):
            y64 = np.asarray(self.y[at:at + BLOCK], dtype=np.float64)
            r64 = np.asarray(self.r[at:at + BLOCK], dtype=np.float64)
            cy, cr = _nonfinite_code(y64), _nonfinite_code(r64)
            if count:
                c = self.counts
                c["nan_count"] += int(np.count_nonzero(cy == 1))
                c["inf_count"] += int(np.count_nonzero(cy >= 2))
                c["ref_nan_count"] += int(np.count_nonzero(cr == 1))
                c["ref_inf_count"] += int(np.count_nonzero(cr >= 2))
                c["mismatched_nonfinite"] += int(np.count_nonzero(cy != cr))
            finite = (cy == 0) & (cr == 0)
            yield at, finite, y64[finite], r64[finite]

    def metrics(self) -> dict[str, Any]:
        """rel_l2, cosine, max_abs and rms_ref over the positions finite in both, scaled by the
        largest magnitude so that squares of large float64 values cannot overflow."""
        out: dict[str, Any] = {"rel_l2": None, "cosine": None, "max_abs": None, "rms_ref": None}
        if not self.n:
            return out
        out["max_abs"] = out["rms_ref"] = 0.0
        if self.scale <= 0:
            return out
        rr = yy = dd = yr = 0.0
        top = 0.0
        for _, _, yf, rf in self.finite_blocks():
            ys, rs = yf / self.scale, rf / self.scale
            d = ys - rs
            rr, yy, dd, yr = (rr + float(rs.dot(rs)), yy + float(ys.dot(ys)), dd + float(d.dot(d)),
                              yr + float(np.dot(ys, rs)))
            if d.size:
                top = max(top, float(np.max(np.abs(d))))
        norm_r, norm_y = math.sqrt(rr), math.sqrt(yy)
        out["max_abs"] = self.scale * top
        out["rms_ref"] = self.scale * norm_r / math.sqrt(self.n)
        if norm_r > 0:
            out["rel_l2"] = math.sqrt(dd) / norm_r
            if norm_y > 0:
                out["cosine"] = max(-1.0, min(1.0, yr / (norm_y * norm_r)))
        return out

    def elementwise(self, base: float, rtol: float) -> tuple[int, tuple[int, float, float, float]]:
        """Rule 8's count of elements with ``|y − r| > base + rtol·|r|``, and the worst one (its
        flat position in the output, ``|y − r|``, its limit, ``r``), the first of equals."""
        n_bad, worst, worst_over = 0, (0, 0.0, 0.0, 0.0), -math.inf
        for at, finite, yf, rf in self.finite_blocks():
            if not yf.size:
                continue
            err = np.abs(yf - rf)
            limit = base + rtol * np.abs(rf)
            over = err - limit
            n_bad += int(np.count_nonzero(over > 0))
            k = int(np.argmax(over))
            if float(over[k]) > worst_over:
                worst_over = float(over[k])
                worst = (at + int(np.flatnonzero(finite)[k]), float(err[k]), float(limit[k]),
                         float(rf[k]))
        return n_bad, worst


def _compare_floats(name: str, y: np.ndarray, r: np.ndarray, tol: Tolerance) -> OutputMetrics:
    # Rule 2's exception lets y and r be different floats: the coarser one sets the floor.
    coarse = y.dtype if abs_floor(y.dtype) >= abs_floor(r.dtype) else r.dtype
    sums = _Sums(y, r)
    counts, n = sums.counts, sums.n
    floor = abs_floor(coarse)
    floor_text = f"floor {ABS_FLOOR_EPS}·eps({coarse})={_e(floor)}"
    metrics = dict(counts, **sums.metrics())
    rel_l2, cosine = metrics["rel_l2"], metrics["cosine"]

    # Rule 5: nonfinite values must sit at the same positions, kind for kind.
    if counts["mismatched_nonfinite"]:
        return _metrics(name, y, r, **metrics, passed=False, rule="nonfinite",
                        criterion=f"nonfinite positions differ at {counts['mismatched_nonfinite']} "
                        f"of {counts['size']}")
    if n == 0:
        return _metrics(name, y, r, **metrics, passed=True, rule="all_nonfinite",
                        criterion=f"all {counts['size']} values nonfinite, at the same positions")

    max_abs, rms_ref = metrics["max_abs"] or 0.0, metrics["rms_ref"] or 0.0  # n > 0: computed
    # Rule 6: an all-zero reference: the absolute criterion alone, against the floor.
    if rms_ref == 0.0:
        ok = max_abs <= floor
        return _metrics(name, y, r, **metrics, abs_bound=floor, passed=ok, rule="all_zero_reference",
                        criterion=f"all-zero reference: max_abs {_e(max_abs)} {'<=' if ok else '>'} "
                        f"{floor_text}")

    # Rule 7: (rel_l2 <= t_rel or max_abs <= max(t_abs·rms, floor)) and cosine >= c.
    scaled = tol.abs_rms * rms_ref
    bound = max(scaled, floor)
    bound_text = floor_text if floor > scaled else f"{tol.abs_rms:.1e}·rms(ref)={_e(scaled)}"
    rel = math.inf if rel_l2 is None else rel_l2  # rms_ref > 0 implies ‖r‖ > 0: never inf
    rel_ok, abs_ok = rel <= tol.rel_l2, max_abs <= bound
    rule: Rule = "max_abs" if abs_ok and not rel_ok else "rel_l2"
    if rel_ok:
        text = f"rel_l2 {_e(rel)} <= {_e(tol.rel_l2)}"
    elif abs_ok:
        text = f"rel_l2 {_e(rel)} > {_e(tol.rel_l2)} but max_abs {_e(max_abs)} <= {bound_text}"
    else:
        text = f"rel_l2 {_e(rel)} > {_e(tol.rel_l2)} and max_abs {_e(max_abs)} > {bound_text}"
    if cosine is None:  # the output is all zero where the reference is not
        cos_ok, cos_text = True, "cosine undefined (zero output)"
    else:
        cos_ok = cosine >= tol.min_cosine
        cos_text = f"cosine {cosine:.6f} {'>=' if cos_ok else '<'} {tol.min_cosine:g}"
    passed = (rel_ok or abs_ok) and cos_ok
    if (rel_ok or abs_ok) and not cos_ok:
        criterion, rule = f"{cos_text} ({text})", "cosine"
    else:
        criterion = f"{text}, {cos_text}"

    # Rule 8: element-wise, |y − r| <= max(a·rms(r), floor) + rtol·|r| for all but B·n elements.
    e_floor = elem_floor(coarse)
    n_bad, (at, err, limit, ref) = sums.elementwise(max(tol.elem_a * rms_ref, e_floor),
                                                     tol.elem_rtol)
    n_allowed = int(math.floor(tol.elem * n))
    if passed and n_bad > n_allowed:
        where = np.unravel_index(at, y.shape) if y.ndim else ()
        passed, rule = False, "elementwise"
        criterion = (
            f"elementwise: {n_bad} of {n} elements outside max({tol.elem_a:.1e}·rms(ref), "
            f"{_e(e_floor)}) + {tol.elem_rtol:.1e}·|r| (allowed {n_allowed}); worst at "
            f"{list(int(i) for i in where)}: |y−r| {_e(err)} > "
            f"{_e(limit)} (r {ref:.6g}); {criterion}")
    return _metrics(name, y, r, **metrics, abs_bound=bound, passed=passed, rule=rule, criterion=criterion,
                    n_bad=n_bad, n_allowed=n_allowed)


def _declared_mismatch(shape: tuple[int, ...], declared: tuple[int | str | None, ...]) -> bool:
    """Whether a returned shape contradicts a declared one (symbolic dims match any size)."""
    if len(shape) != len(declared):
        return True
    return any(isinstance(d, int) and not isinstance(d, bool) and d != s
               for s, d in zip(shape, declared, strict=True))


def _dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray | None:
    """``(q − zero_point)·scale`` in the scale's dtype, as DequantizeLinear computes it; None
    where the parameters do not fit ``q`` (a blocked or mis-shaped quantization)."""
    scale, zp = np.asarray(params["scale"]), np.asarray(params["zero_point"])
    if _float_info(scale.dtype) is None or scale.ndim > 1 or zp.ndim > 1 or zp.size not in (1, scale.size):
        return None
    shape: list[int] = []
    if scale.size > 1:
        if q.ndim == 0:
            return None
        axis = int(params["axis"]) % q.ndim
        if q.shape[axis] != scale.size:
            return None
        shape = [1] * q.ndim
        shape[axis] = -1
    s64 = scale.astype(np.float64).reshape(shape)
    z64 = zp.astype(np.float64).reshape(shape if zp.size > 1 else [])
    return np.asarray((q.astype(np.float64) - z64) * s64).astype(scale.dtype)


def _quant_record(q: np.ndarray, params: QuantParams) -> dict[str, Any]:
    """What the record says of a dequantized output: the Q, its scale and zero point."""

    def values(a: np.ndarray, kind: type) -> Any:
        flat = [kind(v) for v in np.asarray(a).ravel()]
        if len(flat) == 1:
            return flat[0]
        return flat if len(flat) <= 8 else {"n": len(flat), "min": min(flat), "max": max(flat)}

    return {"node": params["node"], "dtype": str(q.dtype), "axis": int(params["axis"]),
            "scale": values(params["scale"], float), "zero_point": values(params["zero_point"], int)}


def _values_text(v: Any) -> str:
    """A scale or zero point as the criterion says it: one value, a few, or their range."""
    if isinstance(v, dict):
        return f"{v['n']} values {v['min']:.6g}..{v['max']:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(f"{x:.6g}" for x in v) + "]"
    return f"{v:.6g}"


def _compare_one(
    name: str, y: np.ndarray | None, r: np.ndarray | None, tol: Tolerance, widen: bool,
    declared: tuple[int | str | None, ...] | None = None, quant: QuantParams | None = None,
) -> OutputMetrics:
    # Rule 1: names (compare() passes at least one of the two).
    if r is None:
        if y is None:
            raise ValueError(f"output {name!r} is in neither outputs nor reference")
        return _metrics(name, y, r, passed=False, rule="unexpected",
                        criterion=f"unexpected: the outputs have it ({y.dtype} {_shape(y.shape)}), "
                        "the reference does not")
    if y is None:
        return _metrics(name, y, r, passed=False, rule="missing",
                        criterion=f"missing: the reference has it ({r.dtype} {_shape(r.shape)}), "
                        "the outputs do not")
    # Rule 4's exception, before rule 2: a quantized output is compared as the numbers it
    # stands for. The reference is dequantized the same way when it is the same integers (the
    # same graph), and taken as it is when it is float (the fp32 source).
    if quant is not None and _is_integer(y.dtype):
        yq = _dequantize(y, quant)
        rq = r if _float_info(r.dtype) is not None else \
            (_dequantize(r, quant) if r.dtype == y.dtype and r.shape == y.shape else None)
        if yq is not None and rq is not None:
            done = _compare_one(name, yq, rq, tol, widen, declared)
            note = _quant_record(y, quant)
            return replace(done, dtype=str(y.dtype), reference_dtype=str(r.dtype), dequantized=note,
                           criterion=f"dequantized ({y.dtype} of {note['node']}, scale "
                           f"{_values_text(note['scale'])}, zero point "
                           f"{_values_text(note['zero_point'])}): {done.criterion}")
    # Rule 2: dtype and shape, never cast or broadcast; the declared shape first (both arms may
    # share a bug, as torch's 0-d outputs returned as (1,) did).
    problems: list[tuple[Rule, str]] = []
    if declared is not None and _declared_mismatch(tuple(int(d) for d in y.shape), declared):
        problems.append(("declared_shape", f"the stage returned shape {_shape(y.shape)}; the artifact "
                         f"declares {name} as ({', '.join(str(d) for d in declared)})"))
    floats = _float_info(y.dtype) is not None and _float_info(r.dtype) is not None
    if y.dtype != r.dtype and not (widen and floats):
        problems.append(("dtype", f"dtype {y.dtype} != reference {r.dtype}"))
    if y.shape != r.shape:
        problems.append(("shape", f"shape {_shape(y.shape)} != reference {_shape(r.shape)}"))
    if problems:
        return _metrics(name, y, r, passed=False, rule=problems[0][0],
                        criterion="; ".join(text for _, text in problems))
    # Rule 3: empty.
    if y.size == 0:
        return _metrics(name, y, r, passed=True, rule="empty", criterion="empty")
    if _is_integer(y.dtype):
        return _compare_integers(name, y, r)
    metrics = _compare_floats(name, y, r, tol)
    if y.dtype != r.dtype:  # rule 2's exception, said where the numbers are
        metrics = replace(metrics, criterion=f"{metrics.criterion} [{y.dtype} output, {r.dtype} reference]")
    return metrics


def _checked_arrays(arrays: Any, what: str) -> dict[str, np.ndarray]:
    if not isinstance(arrays, Mapping):
        raise TypeError(f"{what} must be a mapping of name to numpy array, got {type(arrays).__name__}")
    checked = {}
    for name, value in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: names must be strings, got {name!r}")
        if not isinstance(value, (np.ndarray, np.generic)):
            raise TypeError(f"{what}[{name!r}] is a {type(value).__name__}, not a numpy array")
        value = np.asarray(value)
        if not value.dtype.isnative:  # a big-endian .npz is the same numbers, not another dtype
            value = value.astype(value.dtype.newbyteorder("="))
        if _float_info(value.dtype) is None and not _is_integer(value.dtype):
            raise ValueError(
                f"{what}[{name!r}] has dtype {value.dtype}; the gate compares bool, integer and "
                "floating (float16/32/64, bfloat16) arrays")
        checked[name] = value
    return checked


def _resolve_tolerance(
    tolerance: Tolerance | float | Mapping[str, float] | None, fmt: str, reference_kind: str
) -> tuple[Tolerance, Literal["default", "override", "explicit"], tuple[str, ...], tuple[str, ...]]:
    """(the tolerance, its source, the criteria not the default's, the criteria asked for)."""
    default = DEFAULT_TOLERANCES[(fmt, reference_kind)]
    if tolerance is None:
        return default, "default", (), ()
    source: Literal["default", "override", "explicit"]
    asked: tuple[str, ...] = ("rel_l2",)
    if isinstance(tolerance, Tolerance):
        tol, source, asked = tolerance, "explicit", tuple(CRITERIA)
    elif isinstance(tolerance, Mapping):
        unknown = sorted(str(k) for k in tolerance if k not in CRITERIA)
        if unknown:
            raise ValueError(f"unknown tolerance criteria {', '.join(unknown)}; known: "
                             f"{', '.join(CRITERIA)}")
        tol = replace(default, **{CRITERIA[k]: v for k, v in tolerance.items()})
        source, asked = "override", tuple(k for k in CRITERIA if k in tolerance)
    elif isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise TypeError("tolerance must be a Tolerance, a mapping of criteria, a number or None, "
                        f"got {type(tolerance).__name__}")
    elif not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance (rel_l2 override) must be a finite number >= 0, got {tolerance!r}")
    else:
        tol, source = replace(default, rel_l2=float(tolerance)), "override"
    changed = tuple(k for k, f in CRITERIA.items() if getattr(tol, f) != getattr(default, f))
    return tol, source, changed, asked


def _summary(outputs: tuple[OutputMetrics, ...], key: str, source: str, cause: str | None) -> str:
    failed = [m for m in outputs if not m.passed]
    noun = "output" if len(outputs) == 1 else "outputs"
    if not failed:
        rels = [m for m in outputs if m.rel_l2 is not None]
        worst = max(rels, key=lambda m: m.rel_l2 or 0.0) if rels else None
        tail = f"; worst rel_l2 {_e(worst.rel_l2 or 0.0)} ({worst.name})" if worst else ""
        return f"passed: {len(outputs)} {noun} within the {key} tolerance ({source}){tail}"
    # The output that set the cause is the one named.
    first = next((m for m in failed if m.rule == "nonfinite"), failed[0])
    return (f"failed ({cause}): {len(failed)} of {len(outputs)} {noun} outside the {key} tolerance "
            f"({source}); {first.name}: {first.criterion}")


def compare(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    *,
    fmt: str,
    reference_kind: str,
    tolerance: Tolerance | float | Mapping[str, float] | None = None,
    declared: Mapping[str, tuple[int | str | None, ...]] | None = None,
    quantized: Mapping[str, QuantParams] | None = None,
    formats: Mapping[str, str] | None = None,
) -> Parity:
    """Compare a stage's outputs with a reference, output by output (rules 1–8, module doc).

    The arrays are not modified.

    Args:
        outputs: the stage's outputs by name, in graph order.
        reference: the reference's outputs by name.
        fmt: the artifact format, one of :data:`FORMATS`.
        reference_kind: what the reference is, one of :data:`REFERENCE_KINDS`.
        tolerance: None for the default of ``(fmt, reference_kind)``; a number to replace
            only the default's ``rel_l2`` (what ``--tolerance F`` gives); a mapping of
            :data:`CRITERIA` keys to values, replacing those criteria of the default, tighter
            or looser (what ``--tolerance rel_l2=X,elem=B`` gives); or a whole
            :class:`Tolerance`.
        declared: the artifact's declared output shapes (ints fixed, strings or None
            symbolic); a stage output whose shape contradicts its declaration fails.
        quantized: the outputs a ``QuantizeLinear`` produced, with its scale and zero point;
            under a :data:`QUANTIZED_FORMATS` format their integers are compared dequantized
            (rule 4's exception). Ignored for every other format.
        formats: outputs judged by another format than ``fmt`` (a graph whose outputs compute
            in different formats, ``xstage.graph_precision``), each compared under that
            format's tolerance (the same override applied to it); named by the output's name
            or its base name before `` (call n)``.

    Returns:
        The :class:`Parity`: ``passed``, or ``failed`` with a cause and, per output, the
        criterion that decided.

    Raises:
        ValueError: ``fmt`` is not a known format (the message lists them).
        ValueError: ``reference_kind`` is not a known kind (the message lists them).
        ValueError: a numeric ``tolerance`` is negative or not finite, or a mapping names an
            unknown criterion or an invalid value.
        ValueError: an array's dtype is not bool, integer or floating.
        ValueError: both ``outputs`` and ``reference`` are empty (nothing to compare).
        TypeError: ``outputs`` or ``reference`` is not a mapping, a name is not a string, or
            a value is not a numpy array.
        TypeError: ``tolerance`` is not a :class:`Tolerance`, a number or None.
    """
    _check_key(fmt, reference_kind)
    tol, source, changed, asked = _resolve_tolerance(tolerance, fmt, reference_kind)
    ys = _checked_arrays(outputs, "outputs")
    rs = _checked_arrays(reference, "reference")
    if not ys and not rs:
        raise ValueError("nothing to compare: outputs and reference are both empty")
    names = list(ys) + [name for name in rs if name not in ys]
    widen = fmt in WIDENING_FORMATS and reference_kind != "same_graph_cpu"  # rule 2's exception
    shapes = declared or {}
    quant = (quantized or {}) if fmt in QUANTIZED_FORMATS else {}
    judged = _judged_formats(names, fmt, formats)
    results = tuple(
        _compare_one(name, ys.get(name), rs.get(name),
                     *_judged_rules(judged.get(name), tol, tolerance, reference_kind, widen),
                     shapes.get(name), quant.get(name))
        for name in names)
    key = f"{fmt}/{reference_kind}"
    if all(m.passed for m in results):
        verdict: Verdict = "passed"
        cause: Cause | None = None
    else:
        verdict = "failed"
        failed = [m for m in results if not m.passed]
        if any(m.rule == "nonfinite" for m in failed):
            cause = "nonfinite"
        elif all(m.rule == "elementwise" for m in failed):
            cause = "elementwise"
        else:
            cause = "tolerance"
    return Parity(
        verdict=verdict, cause=cause, fmt=fmt, reference_kind=reference_kind, tolerance=tol,
        tolerance_key=key, tolerance_source=source, outputs=results,
        summary=_summary(results, key, source, cause) + _formats_note(judged),
        non_default=changed, asked=asked,
        formats=judged,
    )


# --- the float64 tie-break (evaluation lives in xstage.stage.tiebreak) -----------------------


def tiebreak_applies(gate: Parity) -> str | None:
    """Whether a float64 evaluation may overturn ``gate``: None if so, else the reason not.

    Args:
        gate: a verdict of :func:`compare`.

    Returns:
        None when the gate failed on float criteria only (:data:`FLOAT_RULES`) of a float
        format, with no criterion tightened below its default; otherwise why the tie-break
        does not run.
    """
    if gate.passed:
        return "the comparison passed"
    quantized = gate.fmt if gate.fmt in QUANTIZED_FORMATS else _quantized_failed(gate)
    if quantized is not None:
        return f"{quantized.split(':')[1].upper()} is not a float format: float64 is not its exact answer"
    if gate.determinism is not None:
        return "the stage is nondeterministic: no single float64 answer decides it"
    default = DEFAULT_TOLERANCES[(gate.fmt, gate.reference_kind)]
    tighter = [k for k in gate.non_default
               if (getattr(gate.tolerance, CRITERIA[k]) > getattr(default, CRITERIA[k])) == (k == "cosine")]
    if tighter:
        return (f"the tolerance was tightened ({', '.join(tighter)}): the stated criteria decide, "
                "not the float64 answer")
    fixed = [m for m in gate.failed_outputs if m.rule not in FLOAT_RULES]
    if fixed:
        return (f"{fixed[0].name} failed on {fixed[0].rule}, a fact float64 evaluation cannot "
                "change")
    return None


def tiebreak_unavailable(gate: Parity, reason: str, **facts: Any) -> Parity:
    """``gate`` unchanged in verdict, with the tie-break recorded as ``unavailable``.

    Args:
        gate: the failed verdict of :func:`compare`.
        reason: why the tie-break could not run (the record keeps it).
        **facts: JSON values the record keeps beside the reason (limits, sizes); its
            ``reason_code`` is one of :data:`TIEBREAK_UNAVAILABLE`.

    Returns:
        The same verdict, its ``tiebreak`` and summary saying why no tie-break decided.
    """
    return replace(gate, tiebreak={"status": "unavailable", "reason": reason, **facts},
                   summary=f"{gate.summary}; float64 tie-break unavailable: {reason}")


def noise_tier_applies(gate: Parity) -> str | None:
    """Whether the fp32 noise tier (:data:`NOISE_ELEM_A`) may decide ``gate``: None if so.

    The stage layer asks only after the float64 tie-break came back ``unavailable``.

    Args:
        gate: a verdict of :func:`compare` (or of :func:`tiebreak_unavailable`).

    Returns:
        None when the gate failed on float criteria only for an fp32 format at the tight
        tier's ``elem_a`` (the default), which the caller did not name; otherwise why not.
    """
    if gate.passed:
        return "the comparison passed"
    default = DEFAULT_TOLERANCES[(gate.fmt, gate.reference_kind)]
    if default.elem_a != _FP32.elem_a:
        return f"{gate.fmt} has one tier (elem_a {default.elem_a:g})"
    if "elem_a" in gate.asked:
        return f"elem_a was asked for ({gate.tolerance.elem_a:g}): a tier never replaces it"
    if gate.tolerance.elem_a != default.elem_a:  # a whole Tolerance, or any other caller
        return f"elem_a is {gate.tolerance.elem_a:g}, not the tight tier's {default.elem_a:g}"
    return tiebreak_applies(gate)


def at_noise_tier(gate: Parity, outputs: Mapping[str, np.ndarray],
                  reference: Mapping[str, np.ndarray], why: str) -> Parity:
    """``gate`` decided again at the fp32 noise tier: rule 8 with ``a`` = :data:`NOISE_ELEM_A`.

    Call it only where :func:`noise_tier_applies` is None. The failed outputs are compared
    again with that ``a`` (every other criterion as it was); the passed ones passed the tighter
    bound already. The tolerance recorded stays the tight tier's; :attr:`Parity.tier` says
    which tier decided, why, the tight tier's verdict, and what the noise tier cannot catch.

    Args:
        gate: the failed verdict at the tight tier (its tie-break recorded as unavailable).
        outputs: the stage's outputs.
        reference: the reference's outputs.
        why: why the tight tier's arbiter could not decide (recorded and summarized).

    Returns:
        The verdict at the noise tier, passed or failed, with ``tier`` filled in.
    """
    tol = replace(gate.tolerance, elem_a=NOISE_ELEM_A)
    widen = gate.fmt in WIDENING_FORMATS and gate.reference_kind != "same_graph_cpu"
    again = {m.name: _compare_one(m.name, outputs.get(m.name), reference.get(m.name), tol, widen)
             for m in gate.failed_outputs}
    results = tuple(again.get(m.name, m) for m in gate.outputs)
    failed = [m for m in results if not m.passed]
    cause: Cause | None = None
    if failed:
        cause = "nonfinite" if any(m.rule == "nonfinite" for m in failed) else \
            "elementwise" if all(m.rule == "elementwise" for m in failed) else "tolerance"
    verdict: Verdict = "failed" if failed else "passed"
    tier = {"decided": "noise", "elem_a": NOISE_ELEM_A, "tight_elem_a": gate.tolerance.elem_a,
            "why": why, "verdict": verdict, "tight_summary": gate.summary,
            "cannot_catch": NOISE_TIER_BLIND}
    head = (f"{verdict} at the noise tier (elem_a {NOISE_ELEM_A:g}, not {gate.tolerance.elem_a:g}: "
            f"{why})")
    if failed:
        first = next((m for m in failed if m.rule == "nonfinite"), failed[0])
        text = f"{head}: {len(failed)} of {len(results)} outputs failed; {first.name}: {first.criterion}"
    else:
        text = f"{head}; the tight tier failed: {gate.summary}"
    return replace(gate, verdict=verdict, cause=cause, outputs=results, summary=text, tier=tier)


def _distance(a: np.ndarray, x: np.ndarray) -> tuple[float | None, float]:
    """(rel_l2, max_abs) of ``a`` from the float64 answer ``x`` (both float64, same positions)."""
    d = a - x
    norm_x = float(np.linalg.norm(x))
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    return (float(np.linalg.norm(d)) / norm_x if norm_x > 0 else None), max_abs


def magnitude_bands(x: np.ndarray, min_size: int = TIEBREAK_BAND_MIN) -> list[np.ndarray]:
    """Positions of ``x`` grouped by magnitude: octaves of ``|x|``, largest first, merged so
    that every group but a lone one holds at least ``min_size`` elements.

    Zeros form the lowest octave. A short run of octaves merges into the next smaller one;
    a short last group merges into the one before it.

    Args:
        x: the float64 answer, flattened (finite values).
        min_size: the fewest elements a group may hold when ``x`` has that many.

    Returns:
        Index arrays that partition ``range(x.size)``.
    """
    ax = np.abs(x)
    octave = np.full(ax.shape, -1100, dtype=np.int64)  # below every float64 octave (>= -1075)
    nonzero = ax > 0
    octave[nonzero] = np.floor(np.log2(ax[nonzero])).astype(np.int64)
    order = np.argsort(-octave, kind="stable")
    sizes = np.unique(-octave, return_counts=True)[1]  # per octave, largest first
    groups: list[np.ndarray] = []
    start = count = 0
    for size in sizes:
        count += int(size)
        if count >= min_size:
            groups.append(order[start:start + count])
            start, count = start + count, 0
    if count:
        if groups:
            groups[-1] = np.concatenate([groups[-1], order[start:]])
        else:
            groups.append(order[start:])
    return groups


def _band_check(y: np.ndarray, r: np.ndarray, x: np.ndarray, eps: float,
                tiny: float) -> tuple[bool, dict[str, Any]]:
    """Rule T2 over every magnitude band: (passed, the worst band as the record keeps it)."""
    worst: dict[str, Any] = {}
    worst_ratio = -1.0
    ok = True
    for band in magnitude_bands(x):
        xb = x[band]
        ds, dr = np.abs(y[band] - xb), np.abs(r[band] - xb)
        floor = max(eps * float(np.sqrt(np.mean(xb * xb))), tiny)
        s_rms, r_rms = float(np.sqrt(np.mean(ds * ds))), float(np.sqrt(np.mean(dr * dr)))
        s_med, r_med = float(np.median(ds)), float(np.median(dr))
        ratio = max(s_rms / max(r_rms, floor), s_med / max(r_med, floor))
        if ratio > worst_ratio:
            ax = np.abs(xb)
            worst_ratio, worst = ratio, {
                "magnitude": [float(np.min(ax)), float(np.max(ax))], "n": int(band.size),
                "stage_rms": s_rms, "reference_rms": r_rms, "stage_median": s_med,
                "reference_median": r_med, "floor": floor, "ratio": ratio}
        ok = ok and ratio <= TIEBREAK_SLACK
    return ok, worst


def _finite_split(x64: np.ndarray, y64: np.ndarray, r64: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Which positions the tie-break compares: (the mask, positions left out, disagreements).

    Positions where the float64 answer is non-finite are left out; where it is finite, the
    stage and the reference must agree on finiteness (a disagreement is counted, and fails
    the output); where both are non-finite there (rule 5 matched them), they are left out.
    """
    answer = np.isfinite(x64)
    fy, fr = np.isfinite(y64), np.isfinite(r64)
    disagree = int(np.count_nonzero(answer & (fy != fr)))
    keep = answer & fy & fr
    return keep, int(x64.size - np.count_nonzero(keep)) - disagree, disagree


def _ill_conditioned(name: str, r: np.ndarray, x: np.ndarray, tol: Tolerance) -> bool:
    """Whether the reference arm is itself beyond the format's tolerance of the float64 answer
    (rule 7: rel_l2, max_abs and cosine; rule 8 off, since it is the tie-break's own filter)."""
    return not _compare_floats(name, r, x, replace(tol, elem=1.0)).passed


def _tiebreak_row(m: OutputMetrics, y: np.ndarray, r: np.ndarray, x: np.ndarray,
                  tol: Tolerance) -> dict[str, Any] | str:
    """One failed output against the float64 answer: its record row, or why none can be made."""
    x64 = np.asarray(x, np.float64).ravel()
    y64, r64 = np.asarray(y, np.float64).ravel(), np.asarray(r, np.float64).ravel()
    keep, left_out, disagree = _finite_split(x64, y64, r64)
    if not np.any(keep) and not disagree:
        return (f"the float64 answer has no finite element to compare in {m.name} "
                f"({x64.size} elements, {int(np.count_nonzero(~np.isfinite(x64)))} non-finite)")
    x64, y64, r64 = x64[keep], y64[keep], r64[keep]
    infos = [i for i in (_float_info(y.dtype), _float_info(r.dtype)) if i is not None]
    eps = max((float(i.eps) for i in infos), default=float(np.finfo(np.float32).eps))
    tiny = max((float(i.tiny) for i in infos), default=float(np.finfo(np.float32).tiny))
    s_rel, s_max = _distance(y64, x64) if x64.size else (None, 0.0)
    r_rel, r_max = _distance(r64, x64) if x64.size else (None, 0.0)
    rel_ok = s_rel is None or s_rel <= TIEBREAK_SLACK * max(r_rel or 0.0, eps)
    bands_ok, worst = _band_check(y64, r64, x64, eps, tiny) if x64.size else (True, {})
    ill = bool(x64.size) and _ill_conditioned(m.name, r64.astype(r.dtype), x64, tol)
    return {"name": m.name, "stage_rel_l2": _json_float(s_rel), "reference_rel_l2": _json_float(r_rel),
            "stage_max_abs": s_max, "reference_max_abs": r_max, "worst_band": worst,
            "compared": int(x64.size), "left_out": left_out, "finiteness_disagrees": disagree,
            "ill_conditioned": ill, "passed": rel_ok and bands_ok and not disagree}


def _tiebreak_text(row: dict[str, Any]) -> str:
    """One output's tie-break, as the summary says it."""
    text = (f"{row['name']}: stage rel_l2 {_e(row['stage_rel_l2'] or 0.0)} vs reference "
            f"{_e(row['reference_rel_l2'] or 0.0)} from float64")
    if row["ill_conditioned"]:
        text += (f" (ill-conditioned: the reference arm is itself beyond the format's tolerance "
                 f"of the float64 answer; max_abs stage {_e(row['stage_max_abs'])}, reference "
                 f"{_e(row['reference_max_abs'])})")
    if row["finiteness_disagrees"]:
        text += (f", stage and reference disagree on finiteness at {row['finiteness_disagrees']} "
                 "positions where float64 is finite")
    if row["left_out"]:
        text += f", {row['left_out']} positions left out (float64 non-finite there)"
    band = row["worst_band"]
    if band:
        text += (f", worst magnitude band |x| {_e(band['magnitude'][0])}..{_e(band['magnitude'][1])} "
                 f"({band['n']} elements): stage {_e(band['ratio'])}x the reference's error")
    return text


def settle_tiebreak(gate: Parity, outputs: Mapping[str, np.ndarray],
                    reference: Mapping[str, np.ndarray], exact: Mapping[str, np.ndarray],
                    **facts: Any) -> Parity:
    """Decide a failed float gate by the float64 answer of the reference graph.

    Each failed output passes when the stage is no further from ``exact`` than the fp32
    reference is, within :data:`TIEBREAK_SLACK`, by two rules; the verdict passes when every
    failed output does. Call it only where :func:`tiebreak_applies` is None.

    * **T1, the whole output:** ``rel_l2(y, x) <= S·max(rel_l2(r, x), eps)``.
    * **T2, every magnitude band** (:func:`magnitude_bands`: octaves of ``|x|``, at least
      :data:`TIEBREAK_BAND_MIN` elements each): the stage's rms error and its median error
      are each ``<= S·max(the reference's, eps·rms(x over the band))``. A norm, or a
      global max, is set by the largest values; a wrong block of small values (bf16 at
      scale 1 beside fp32 values of scale 1e4) hides under it, but not in its own band,
      where the fp32 reference is off by fp32 rounding and the block by 2^-9. The median
      keeps a band that the block fills from being excused by a few large-path elements
      that fall into it with their larger errors; the rms catches a block that is a
      minority of its band.
    * **Finiteness:** positions where the float64 answer is non-finite are left out; where it
      is finite, a stage and a reference that disagree on finiteness fail the output. An
      output with no finite position left makes the tie-break ``unavailable`` (never a pass).
    * **Ill-conditioned:** where the reference arm is itself beyond the format's tolerance of
      the float64 answer (rule 7), the row says ``ill_conditioned`` and the summary prints
      both arms' distances; T1 and T2 decide as for any output.

    ``eps`` is the coarser dtype's machine epsilon (one rounding of the output): where the
    reference is exact, the stage may be off by its own rounding.

    Args:
        gate: the failed verdict of :func:`compare` on ``outputs`` and ``reference``.
        outputs: the stage's outputs.
        reference: the reference's outputs.
        exact: the reference graph evaluated in float64, by output name.
        **facts: JSON values the record keeps (how the answer was computed).

    Returns:
        ``gate`` passed (cause None) or still failed, with ``tiebreak`` filled in.
    """
    rows: list[dict[str, Any]] = []
    for m in gate.failed_outputs:
        y, r, x = outputs.get(m.name), reference.get(m.name), exact.get(m.name)
        if y is None or r is None or x is None or x.shape != y.shape or r.shape != y.shape:
            return tiebreak_unavailable(gate, f"the float64 evaluation gave no comparable {m.name}",
                                        reason_code="no_comparable_output", **facts)
        row = _tiebreak_row(m, y, r, x, gate.tolerance)
        if isinstance(row, str):
            return tiebreak_unavailable(gate, row, reason_code="no_finite_answer", **facts)
        rows.append(row)
    text = "; ".join(_tiebreak_text(row) for row in rows)
    ill = [row["name"] for row in rows if row["ill_conditioned"]]
    record = {"status": "passed" if all(row["passed"] for row in rows) else "failed",
              "slack": TIEBREAK_SLACK, "outputs": rows, "ill_conditioned": ill, **facts}
    if record["status"] == "passed":
        return replace(gate, verdict="passed", cause=None, tiebreak=record,
                       summary=f"passed by the float64 tie-break (the fp32 comparison failed: "
                       f"{gate.summary}); {text}")
    return replace(gate, tiebreak=record,
                   summary=f"{gate.summary}; float64 tie-break failed (slack {TIEBREAK_SLACK:g}x): {text}")
