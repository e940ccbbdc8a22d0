"""The numeric gate's adversarial classes: cases built per class from one seed, truth by construction.

Each case is an attack and its controls, and says how it was *built*, nothing about what xstage's
gate makes of it; :func:`expected` turns the construction into the verdict the docs promise
(docs/external.md, "The numeric gate"). Nothing here imports ``xstage.parity`` or
``xstage.evidence``; graphs are written with onnx's helper.

Classes (:data:`CLASSES`):

* ``nondet_onnx``: ``y = x + R`` on ``ort-cpu``, ``R`` a random op of the graph (RandomUniformLike,
  RandomNormalLike, Dropout with ``training_mode`` true, Bernoulli, Multinomial as a second
  output), at a magnitude of 0.1-1 of ``x``: two runs of one session differ far beyond fp32's
  rounding. Refused ``nondeterministic``; with a ``--tolerance`` named that its numbers meet,
  admitted and the record says so; the control (the same graph with the random op made
  deterministic: an Identity, ``training_mode`` false, a constant) is admitted.
* ``nondet_torch``: the same as a ``.pt2`` on ``torch-cpu`` (``rand_like``, ``randn_like``,
  ``bernoulli``, ``dropout(training=True)``), exported by the export env
  (``torch_random.py``).
* ``format``: an fp32 MLP computed with its activations rounded to bf16 before every MatMul
  (``Cast`` to BFLOAT16 and back: a relative error of ~2^-9 a rounding, 1e-3..1e-2 at the output)
  with one 16-bit Q/DQ pair on its output, gated against the exact fp32 MLP (``--reference``):
  refused (the pair does not make it A16W8: its MatMuls take no quantized operands); the same
  with one 8-bit pair (A8W8's looser tolerance would admit bf16's error): refused too. Controls:
  the same without the pair (refused), and the fp32 MLP through ``xstage quantize --scheme
  a16w8`` (every MatMul quantized: admitted, judged ``onnx:a16w8`` against its fp32 source).
* ``state``: a stage with two state pairs, a shift register: ``p_out = r(x·w)``, ``q_out = p_in``,
  ``y = x + q_in``, so the visible output shows ``p`` only from the third call. ``r`` rounds to
  bf16 (the attack) or is the identity (the control), gated against the exact graph
  (``--reference``): the attack is refused, the control admitted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

CLASSES = ("nondet_onnx", "nondet_torch", "format", "state")
#: Cases per class with the ``slow`` marker (the default run takes the first of each).
PER_CLASS = 5

ONNX_RANDOM = ("RandomUniformLike", "RandomNormalLike", "Dropout", "Bernoulli", "Multinomial")
TORCH_RANDOM = ("rand_like", "randn_like", "bernoulli", "dropout")

OPSET = 17


@dataclass
class Run:
    """One ``xstage external`` run of a case: the stage, what it is gated against, its flags."""

    role: str  # attack, admitted (the attack with a tolerance named), control
    graph: str  # the builder's key for the stage (see test_adv_gatefmt.build)
    route: str
    reference: str | None = None  # the builder's key for the --reference graph
    tolerance: str | None = None
    #: construction facts the oracle reads
    random: bool = False
    integer_random: bool = False  # the random op's output is an integer output (exact rule)
    bf16: bool = False
    quantized: bool = False


@dataclass
class Case:
    """One seeded case of a class: its parameters and its runs (an attack and its controls)."""

    klass: str
    ident: int
    params: dict[str, Any]
    runs: list[Run] = field(default_factory=list)
    describe: str = ""

    @property
    def id(self) -> str:
        return f"{self.klass}-{self.ident}"


@dataclass(frozen=True)
class Expected:
    """What the docs say a run ends in."""

    exit_code: int
    causes: tuple[str, ...] = ()  # the refusal's cause, one of these (exit 2)
    nondeterministic: bool = False  # the record's parity says the stage is nondeterministic
    parity_format: str | None = None


def expected(case: Case, run: Run) -> Expected:
    """The oracle: the verdict from the construction alone."""
    if run.random and run.tolerance is None:
        return Expected(2, ("nondeterministic",))
    if run.random and run.integer_random:  # integers compare exactly: no tolerance admits them
        return Expected(2, ("tolerance",), nondeterministic=True)
    if run.random:
        return Expected(0, nondeterministic=True)
    if run.bf16:  # bf16 rounding against an exact fp32 reference: far beyond fp32's tolerance
        return Expected(2, ("tolerance", "elementwise"))
    return Expected(0, parity_format="onnx:a16w8" if run.quantized else None)


# --------------------------------------------------------------------------- the cases


def _nondet_onnx(rng: random.Random, i: int, offset: int) -> Case:
    op = ONNX_RANDOM[(i + offset) % len(ONNX_RANDOM)]  # five cases: every op once
    params = {"op": op, "rows": rng.randrange(2, 9), "cols": rng.randrange(8, 65),
              "scale": round(rng.uniform(0.1, 1.0), 3), "ratio": round(rng.uniform(0.2, 0.7), 3)}
    case = Case("nondet_onnx", i, params, describe=f"x + {op} on {params['rows']}x{params['cols']}")
    ints = op == "Multinomial"
    case.runs = [Run("attack", "random", "ort-cpu", random=True, integer_random=ints),
                 Run("admitted", "random", "ort-cpu", random=True, integer_random=ints,
                     tolerance="rel_l2=100,abs_rms=100,cosine=-1,elem=1"),
                 Run("control", "random_control", "ort-cpu")]
    return case


def _nondet_torch(rng: random.Random, i: int, offset: int) -> Case:
    op = TORCH_RANDOM[(i + offset) % len(TORCH_RANDOM)]  # five cases: every op at least once
    params = {"op": op, "shape": [rng.randrange(2, 7), rng.randrange(4, 33)],
              "scale": round(rng.uniform(0.2, 1.0), 3), "w": round(rng.uniform(0.5, 2.0), 3)}
    case = Case("nondet_torch", i, params, describe=f"x*w + {op} on {params['shape']}")
    case.runs = [Run("attack", "torch_random", "torch-cpu", random=True),
                 Run("admitted", "torch_random", "torch-cpu", random=True,
                     tolerance="rel_l2=100,abs_rms=100,cosine=-1,elem=1"),
                 Run("control", "torch_control", "torch-cpu")]
    return case


def _format(rng: random.Random, i: int, offset: int) -> Case:
    params = {"width": rng.choice((64, 96, 128, 192)), "depth": rng.randrange(2, 6),
              "batch": rng.randrange(2, 9), "seed": rng.randrange(1000)}
    case = Case("format", i, params, describe=f"MLP {params['depth']}x{params['width']}, batch "
                f"{params['batch']}, seed {params['seed']}: bf16 activations + one uint16 Q/DQ pair")
    case.runs = [Run("attack", "mlp_bf16_pair", "ort-cpu", reference="mlp", bf16=True),
                 Run("attack", "mlp_bf16_pair8", "ort-cpu", reference="mlp", bf16=True),
                 Run("control", "mlp_bf16", "ort-cpu", reference="mlp", bf16=True),
                 Run("control", "mlp_a16w8", "ort-cpu", quantized=True)]
    return case


def _state(rng: random.Random, i: int, offset: int) -> Case:
    params = {"n": rng.randrange(16, 129), "seed": rng.randrange(1000)}
    case = Case("state", i, params, describe=f"shift register of {params['n']}, p_out in bf16")
    case.runs = [Run("attack", "state_bf16", "ort-cpu", reference="state_exact", bf16=True),
                 Run("control", "state_exact", "ort-cpu", reference="state_exact")]
    return case


_MAKERS = {"nondet_onnx": _nondet_onnx, "nondet_torch": _nondet_torch, "format": _format,
           "state": _state}


def generate(seed: int, per_class: int = PER_CLASS) -> list[Case]:
    """``per_class`` cases of every class, each class from its own stream of ``seed``."""
    out = []
    for index, klass in enumerate(CLASSES):
        rng = random.Random(seed * 1000 + 100 + index)
        offset = rng.randrange(1000)  # which op the seeded first case takes
        out.extend(_MAKERS[klass](rng, i, offset) for i in range(per_class))
    return out


# --------------------------------------------------------------------------- graphs

V = helper.make_tensor_value_info


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any],
           opset: int = OPSET) -> ModelProto:
    graph = helper.make_graph(nodes, "adversarial_gate", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def random_graph(params: dict[str, Any], deterministic: bool) -> ModelProto:
    """``y = x + R`` (R random, or its deterministic twin); Multinomial adds an int output ``k``."""
    rows, cols, scale, op = params["rows"], params["cols"], params["scale"], params["op"]
    shape = [rows, cols]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale"),
             numpy_helper.from_array(np.array(params["ratio"], np.float32), "ratio"),
             numpy_helper.from_array(np.array(not deterministic), "training")]
    outputs = [V("y", TensorProto.FLOAT, shape)]
    if op == "RandomUniformLike":
        nodes = [helper.make_node("Identity", ["x"], ["r"]) if deterministic else
                 helper.make_node("RandomUniformLike", ["x"], ["r"], low=-1.0, high=1.0)]
    elif op == "RandomNormalLike":
        nodes = [helper.make_node("Identity", ["x"], ["r"]) if deterministic else
                 helper.make_node("RandomNormalLike", ["x"], ["r"], mean=0.0, scale=1.0)]
    elif op == "Dropout":
        nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["r"])]
    elif op == "Bernoulli":
        nodes = [helper.make_node("Sigmoid", ["x"], ["p"]),
                 helper.make_node("Identity", ["p"], ["r"]) if deterministic else
                 helper.make_node("Bernoulli", ["p"], ["r"])]
    else:  # Multinomial: a second, integer output of samples from softmax(x)'s rows
        nodes = [helper.make_node("Identity", ["x"], ["r"])]
        if deterministic:
            nodes.append(helper.make_node("ArgMax", ["x"], ["k64"], axis=1, keepdims=1))
            nodes.append(helper.make_node("Cast", ["k64"], ["k"], to=TensorProto.INT32))
            outputs.append(V("k", TensorProto.INT32, [rows, 1]))
        else:
            nodes.append(helper.make_node("Multinomial", ["x"], ["k"], sample_size=16,
                                          dtype=TensorProto.INT32))
            outputs.append(V("k", TensorProto.INT32, [rows, 16]))
    nodes += [helper.make_node("Mul", ["r", "scale"], ["rs"]), helper.make_node("Add", ["x", "rs"], ["y"])]
    return _model(nodes, [V("x", TensorProto.FLOAT, shape)], outputs, inits)


def _mlp_weights(params: dict[str, Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(params["seed"])
    width = params["width"]
    return [((rng.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32),
             (rng.standard_normal(width) * 0.1).astype(np.float32)) for _ in range(params["depth"])]


def mlp_graph(params: dict[str, Any], *, bf16: bool, pair: bool, bits: int = 16) -> ModelProto:
    """The MLP (MatMul + Add + Relu blocks, Tanh); ``bf16``: each MatMul's activation rounded to
    bf16 first; ``pair``: one uint16 Q/DQ pair on the output (scale 2^-15 over Tanh's (-1, 1):
    a rounding of 1.5e-5 at most, 100x under bf16's at the output); ``bits=8``: a uint8 pair
    (scale 2^-7: a rounding of 4e-3, an 8-bit activation's)."""
    width, batch = params["width"], params["batch"]
    nodes, inits, prev = [], [], "x"
    for i, (w, b) in enumerate(_mlp_weights(params)):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        operand = prev
        if bf16:
            nodes += [helper.make_node("Cast", [prev], [f"h{i}"], to=TensorProto.BFLOAT16),
                      helper.make_node("Cast", [f"h{i}"], [f"f{i}"], to=TensorProto.FLOAT)]
            operand = f"f{i}"
        nodes += [helper.make_node("MatMul", [operand, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Tanh", [prev], ["t" if pair else "y"]))
    if pair:
        zero = np.array(32768, np.uint16) if bits == 16 else np.array(128, np.uint8)
        inits += [numpy_helper.from_array(np.array(2.0 ** (1 - bits), np.float32), "q_scale"),
                  numpy_helper.from_array(zero, "q_zero")]
        nodes += [helper.make_node("QuantizeLinear", ["t", "q_scale", "q_zero"], ["tq"]),
                  helper.make_node("DequantizeLinear", ["tq", "q_scale", "q_zero"], ["y"])]
    return _model(nodes, [V("x", TensorProto.FLOAT, [batch, width])],
                  [V("y", TensorProto.FLOAT, [batch, width])], inits, opset=21)


def state_graph(params: dict[str, Any], *, bf16: bool) -> ModelProto:
    """The shift register: ``p_out = r(x·w)``, ``q_out = p_in``, ``y = x + q_in``."""
    n = params["n"]
    w = (np.random.default_rng(params["seed"]).standard_normal(n) * 2 + 3).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"])]
    if bf16:
        nodes += [helper.make_node("Cast", ["xw"], ["xb"], to=TensorProto.BFLOAT16),
                  helper.make_node("Cast", ["xb"], ["p_out"], to=TensorProto.FLOAT)]
    else:
        nodes.append(helper.make_node("Identity", ["xw"], ["p_out"]))
    nodes += [helper.make_node("Identity", ["p_in"], ["q_out"]),
              helper.make_node("Add", ["x", "q_in"], ["y"])]
    vec = [n]
    return _model(nodes, [V("x", TensorProto.FLOAT, vec), V("p_in", TensorProto.FLOAT, vec),
                          V("q_in", TensorProto.FLOAT, vec)],
                  [V("y", TensorProto.FLOAT, vec), V("p_out", TensorProto.FLOAT, vec),
                   V("q_out", TensorProto.FLOAT, vec)], [numpy_helper.from_array(w, "w")])


STATE_PAIRS = [{"input": "p_in", "output": "p_out", "init": "zeros"},
               {"input": "q_in", "output": "q_out", "init": "zeros"}]


# --------------------------------------------------------------------------- the table

#: klass -> counts; filled as the runs finish.
RESULTS: dict[str, dict[str, int]] = {}


def tally(klass: str, *, as_expected: bool, false_pass: bool, false_refusal: bool) -> None:
    row = RESULTS.setdefault(klass, {"runs": 0, "as_expected": 0, "false_pass": 0, "false_refusal": 0})
    row["runs"] += 1
    row["as_expected"] += int(as_expected)
    row["false_pass"] += int(false_pass)
    row["false_refusal"] += int(false_refusal)


def table(seed: int) -> str:
    lines = [f"gate adversarial classes, seed {seed} (XSTAGE_ADV_SEED repeats it)",
             f"{'class':<14}{'runs':>6}{'as spec':>9}{'false pass':>12}{'false refusal':>15}"]
    for klass in CLASSES:
        row = RESULTS.get(klass)
        if row is None:
            lines.append(f"{klass:<14}{'not run':>42}")
            continue
        lines.append(f"{klass:<14}{row['runs']:>6}{row['as_expected']:>9}{row['false_pass']:>12}"
                     f"{row['false_refusal']:>15}")
    return "\n".join(lines)
