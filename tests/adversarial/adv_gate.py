"""The gate's adversarial classes: the float64 tie-break steered by the artifact under test.

Each case is built from one seed (``adv_corpus.seed_from_env``) and says how it was *built*: the
reference graph (an fp32 MLP, shapes and weights from the seed), the stage graph beside it and
what that stage computes relative to the reference. Its truth follows from the construction
alone (:func:`expected`, which imports nothing of xstage): a stage that computes the reference's
function (in another summation order, or by another opset's ops) must pass; a stage that
computes something else (negated, scaled by 1.01, zeroed, weights rounded to bf16, a softmax
over the wrong axes) must be refused by the numeric gate. Every stage runs on ``ort-cpu`` with
the reference graph as ``--reference``.

Classes (:data:`CLASSES`), each case with its attacks and its controls:

* ``gate_reference``: the reference is an MLP. The stage's graph is the reference followed by
  ``Neg``, ``Mul 1.01`` or ``Mul 0`` (attacks: its own float64 answer agrees with it, the
  reference's does not). Controls: every product summed as two half-sums (another order: fp32
  noise); and ``shifted``, where the reference centers its input first (``x − mean(x)`` on
  inputs near 1e4: the mean's fp32 rounding lands on values of scale 1e-2, an ill-conditioned
  reference arm) and the stage centers ``x − x[:, :1]`` first (exact in fp32: far from the naive
  reference arm, nearer float64 than it, so only the tie-break can pass it).
* ``gate_nonfinite``: the reference adds ``Sqrt(a·a − c)`` with ``c`` the fp32 rounding of
  ``a·a`` just above it: 0 in fp32, NaN in float64, so the float64 answer has no finite element.
  The attack's weights are rounded to bf16 (a stage ~1e-3 off); the control is the half-sum
  reordering of the same graph.
* ``gate_opset``: the reference (opset 9 or 11) runs an MLP and ends in a Softmax on
  ``(N, C, H, W)`` with the default axis: the input coerced to 2-D, normalized over ``C·H·W``.
  The attack normalizes over ``C`` alone (Softmax-13, axis 1). The control computes the
  coercion at opset 13 (Flatten, Softmax over the last axis, Reshape), beside a reference that
  centers its input naively as in ``shifted`` while the stage centers exactly, so the
  tie-break decides it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

CLASSES = ("gate_reference", "gate_nonfinite", "gate_opset")
PER_CLASS_SLOW = 5

#: Per variant: the stage must pass (exit 0) or be refused by the numeric gate (exit 2).
PASS, REFUSE = "pass", "refuse"

#: The variants of each class: (name, truth).
VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "gate_reference": (("neg", REFUSE), ("scale", REFUSE), ("zero", REFUSE), ("halves", PASS),
                       ("shifted", PASS)),
    "gate_nonfinite": (("bf16", REFUSE), ("halves", PASS)),
    "gate_opset": (("softmax_axis_c", REFUSE), ("softmax_coerced_13", PASS)),
}


@dataclass
class Case:
    """One case: the reference's shape and weights (from the seed), and its variants."""

    klass: str
    ident: str
    batch: int
    widths: tuple[int, ...]
    seed: int
    opset: int = 17
    #: gate_nonfinite: the fp32 value ``a`` whose square rounds up in fp32
    a: float = 0.0
    #: gate_opset: the (C, H, W) the logits are reshaped to
    chw: tuple[int, int, int] = (1, 1, 1)
    describe: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """The pytest id of the case (a variant's id adds its name)."""
        return f"{self.klass}-{self.ident}"


def expected(klass: str, variant: str) -> tuple[int, str | None]:
    """The exit code and refusal code the construction says: (0, None) or (2, numeric_gate_failed)."""
    truth = dict(VARIANTS[klass])[variant]
    return (0, None) if truth == PASS else (2, "numeric_gate_failed")


# --------------------------------------------------------------------------- construction


def _weights(case: Case) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(case.seed)
    out = []
    for fan_in, fan_out in zip(case.widths[:-1], case.widths[1:], strict=True):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)
        out.append((w, b))
    return out


def _bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (to nearest even) and back to float32."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def _centering(case: Case, shifted: bool) -> tuple[list[Any], list[Any], str]:
    """``x − mean(x)`` over the features, on inputs near 1e4: ill-conditioned in fp32.

    Naive (the reference's): the mean's rounding, up to half an ulp of 1e4, lands on values of
    scale 1e-2. ``shifted``: on ``x − x[:, :1]`` first (exact in fp32), right to fp32 precision:
    far from the naive arm, and closer to float64 than it.
    """
    nodes: list[Any] = []
    inits: list[Any] = []
    prev = "x"
    if shifted:
        for name, value in (("c0", 0), ("c1", 1), ("cax", 1)):
            inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
        nodes += [helper.make_node("Slice", ["x", "c0", "c1", "cax"], ["x0"]),
                  helper.make_node("Sub", ["x", "x0"], ["xd"])]
        prev = "xd"
    nodes += [helper.make_node("ReduceMean", [prev], ["mean"], axes=[1], keepdims=1),
              helper.make_node("Sub", [prev, "mean"], ["centered"])]
    return nodes, inits, "centered"


def _mlp_nodes(case: Case, halves: bool, bf16: bool, centered: bool,
               shifted: bool = False) -> tuple[list[Any], list[Any], str]:
    """MatMul + Add (+ Relu between layers) nodes on input ``x`` (``centered`` first,
    :func:`_centering`); (nodes, initializers, last)."""
    nodes, inits, prev = _centering(case, shifted) if centered else ([], [], "x")
    layers = _weights(case)
    for i, (w, b) in enumerate(layers):
        if bf16:
            w, b = _bf16(w), _bf16(b)
        if halves:  # x @ W as x[:, :k] @ W[:k] + x[:, k:] @ W[k:]: another summation order
            k, n = w.shape[0] // 2, w.shape[0]
            inits += [numpy_helper.from_array(w[:k], f"w{i}a"), numpy_helper.from_array(w[k:], f"w{i}b")]
            for name, value in ((f"z{i}", 0), (f"k{i}", k), (f"n{i}", n), (f"ax{i}", 1)):
                inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
            nodes += [helper.make_node("Slice", [prev, f"z{i}", f"k{i}", f"ax{i}"], [f"xa{i}"]),
                      helper.make_node("Slice", [prev, f"k{i}", f"n{i}", f"ax{i}"], [f"xb{i}"]),
                      helper.make_node("MatMul", [f"xa{i}", f"w{i}a"], [f"ma{i}"]),
                      helper.make_node("MatMul", [f"xb{i}", f"w{i}b"], [f"mb{i}"]),
                      helper.make_node("Add", [f"ma{i}", f"mb{i}"], [f"m{i}"])]
        else:
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        inits.append(numpy_helper.from_array(b, f"b{i}"))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
        prev = f"a{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    return nodes, inits, prev


def _model(nodes: list[Any], inits: list[Any], out_shape: list[int], case: Case, opset: int) -> ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [case.batch, case.widths[0]])
    graph = helper.make_graph(nodes, case.klass, [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    ir = 7 if opset <= 12 else 8
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def _tail(nodes: list[Any], inits: list[Any], last: str, kind: str) -> None:
    """The stage's last step on the reference's output (``neg``, ``scale``, ``zero``)."""
    if kind == "neg":
        nodes.append(helper.make_node("Neg", [last], ["y"]))
        return
    factor = np.array(1.01 if kind == "scale" else 0.0, np.float32)
    inits.append(numpy_helper.from_array(factor, "k"))
    nodes.append(helper.make_node("Mul", [last, "k"], ["y"]))


def _nan_term(nodes: list[Any], inits: list[Any], last: str, a: float) -> None:
    """``y = last + Sqrt(a·a − c)``: ``c`` = fp32(a·a) rounds up, so 0 in fp32, NaN in float64."""
    a32 = np.float32(a)
    inits += [numpy_helper.from_array(np.array([a32], np.float32), "nan_a"),
              numpy_helper.from_array(np.array([a32 * a32], np.float32), "nan_c")]
    nodes += [helper.make_node("Mul", ["nan_a", "nan_a"], ["nan_sq"]),
              helper.make_node("Sub", ["nan_sq", "nan_c"], ["nan_t"]),
              helper.make_node("Sqrt", ["nan_t"], ["nan_r"]),
              helper.make_node("Add", [last, "nan_r"], ["y"])]


def _softmax_head(nodes: list[Any], inits: list[Any], last: str, case: Case, how: str) -> list[int]:
    """Logits reshaped to (N, C, H, W), then the softmax ``how`` says; returns the output shape."""
    c, h, w = case.chw
    shape = [case.batch, c, h, w]
    inits.append(numpy_helper.from_array(np.array(shape, np.int64), "chw"))
    nodes.append(helper.make_node("Reshape", [last, "chw"], ["logits"]))
    if how == "default":  # the reference at its own opset: axis 1 by default, coerced to 2-D
        nodes.append(helper.make_node("Softmax", ["logits"], ["y"]))
    elif how == "axis_c":  # opset 13, axis 1: over C alone
        nodes.append(helper.make_node("Softmax", ["logits"], ["y"], axis=1))
    else:  # opset 13, the coercion written out: Flatten(1), Softmax(-1), Reshape back
        nodes += [helper.make_node("Flatten", ["logits"], ["flat"], axis=1),
                  helper.make_node("Softmax", ["flat"], ["soft"], axis=-1),
                  helper.make_node("Reshape", ["soft", "chw"], ["y"])]
    return shape


#: The controls whose reference centers inputs near 1e4 (an ill-conditioned reference arm,
#: only the tie-break can pass them). The attacks keep a well-conditioned reference: beside an
#: ill-conditioned one, a stage within the slack of the reference arm's distance passes by
#: design (docs/external.md), and ×1.01 would be within it.
CENTERED = ("shifted", "softmax_coerced_13")


def build(case: Case, variant: str, reference: bool = False) -> ModelProto:
    """The stage graph of ``variant``, or (``reference``) the reference graph it runs beside."""
    centered = variant in CENTERED
    stage = None if reference else variant
    nodes, inits, last = _mlp_nodes(case, halves=stage == "halves", bf16=stage == "bf16",
                                    centered=centered, shifted=centered and stage is not None)
    out = [case.batch, case.widths[-1]]
    opset = case.opset
    if case.klass == "gate_reference":
        if stage in ("neg", "scale", "zero"):
            _tail(nodes, inits, last, stage)
        else:
            nodes.append(helper.make_node("Identity", [last], ["y"]))
    elif case.klass == "gate_nonfinite":
        _nan_term(nodes, inits, last, case.a)
    else:
        how = "default" if stage is None else "axis_c" if stage == "softmax_axis_c" else "coerced"
        opset = case.opset if stage is None else 13
        out = _softmax_head(nodes, inits, last, case, how)
    return _model(nodes, inits, out, case, opset)


def inputs(case: Case, variant: str) -> dict[str, np.ndarray]:
    """The gate's input, from the case's seed (near 1e4 for the :data:`CENTERED` variants)."""
    rng = np.random.default_rng(case.seed + 1)
    x = rng.standard_normal((case.batch, case.widths[0]))
    if variant in CENTERED:
        x = 1e4 + 1e-2 * x
    return {"x": x.astype(np.float32)}


# --------------------------------------------------------------------------- the classes


def _widths(rng: random.Random, depth: tuple[int, int], last: int | None = None) -> tuple[int, ...]:
    n = rng.randrange(*depth)
    widths = [rng.choice((32, 48, 64, 96, 128)) for _ in range(n + 1)]
    if last is not None:
        widths[-1] = last
    return tuple(widths)


def _rounds_up(rng: random.Random) -> float:
    """An fp32 ``a`` in [0.1, 10) whose square, rounded to fp32, is above the exact square."""
    while True:
        a = np.float32(rng.uniform(0.1, 10.0))
        exact = float(a) * float(a)  # exact: 24-bit by 24-bit fits float64's 53 bits
        if float(np.float32(a * a)) > exact:
            return float(a)


def _reference(rng: random.Random, i: int) -> Case:
    widths = _widths(rng, (2, 4))
    return Case("gate_reference", str(i), rng.randrange(4, 17), widths, rng.randrange(2**31),
                describe=f"MLP {'x'.join(map(str, widths))}")


def _nonfinite(rng: random.Random, i: int) -> Case:
    widths = _widths(rng, (2, 4))
    a = _rounds_up(rng)
    return Case("gate_nonfinite", str(i), rng.randrange(4, 17), widths, rng.randrange(2**31), a=a,
                describe=f"MLP {'x'.join(map(str, widths))} + Sqrt({a!r}² − fp32({a!r}²))")


def _opset(rng: random.Random, i: int) -> Case:
    c, h, w = rng.choice((2, 3, 4, 8)), rng.choice((2, 3, 4)), rng.choice((2, 3, 5))
    widths = _widths(rng, (1, 3), last=c * h * w)
    opset = rng.choice((9, 11))
    return Case("gate_opset", str(i), rng.randrange(2, 9), widths, rng.randrange(2**31), opset=opset,
                chw=(c, h, w), describe=f"MLP {'x'.join(map(str, widths))} → ({c},{h},{w}) Softmax-{opset}")


_MAKERS = {"gate_reference": _reference, "gate_nonfinite": _nonfinite, "gate_opset": _opset}


def generate(seed: int, per_class: int) -> list[Case]:
    """``per_class`` cases of every class, each class from its own stream of ``seed``."""
    cases = []
    for index, klass in enumerate(CLASSES):
        rng = random.Random(seed * 7919 + 100 + index)
        cases.extend(_MAKERS[klass](rng, i) for i in range(per_class))
    return cases


# --------------------------------------------------------------------------- the table


#: klass -> counts; filled as the cases run.
RESULTS: dict[str, dict[str, int]] = {}


def tally(klass: str, truth: str, *, as_expected: bool, false_pass: bool, false_refusal: bool) -> None:
    """Count one finished variant."""
    row = RESULTS.setdefault(klass, {"runs": 0, "must_pass": 0, "must_refuse": 0, "as_expected": 0,
                                     "false_pass": 0, "false_refusal": 0})
    row["runs"] += 1
    row["must_pass" if truth == PASS else "must_refuse"] += 1
    row["as_expected"] += int(as_expected)
    row["false_pass"] += int(false_pass)
    row["false_refusal"] += int(false_refusal)


def table(seed: int) -> str:
    """The classes and their counts, as text."""
    lines = [f"adversarial gate classes, seed {seed}",
             f"{'class':<16}{'runs':>6}{'pass':>6}{'refuse':>8}{'as spec':>9}{'false pass':>12}"
             f"{'false refusal':>15}"]
    for klass in CLASSES:
        row = RESULTS.get(klass)
        if row is None:
            lines.append(f"{klass:<16}{'not run':>12}")
            continue
        lines.append(f"{klass:<16}{row['runs']:>6}{row['must_pass']:>6}{row['must_refuse']:>8}"
                     f"{row['as_expected']:>9}{row['false_pass']:>12}{row['false_refusal']:>15}")
    return "\n".join(lines)
