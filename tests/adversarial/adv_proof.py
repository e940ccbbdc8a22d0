"""Adversarial classes of the proof's third part: what ran is counted, and only what ran.

Cases are generated per class from the corpus's seed (``adv_corpus.SEED``, printed by
``test_adversarial``; ``XSTAGE_ADV_SEED`` repeats a run), each with its construction metadata:
which nodes the EP takes, what work each does, which value names the graph carries. The oracle
(:func:`expected`, in this file) reads that metadata only: it imports nothing of xstage and never
looks at a profile, a plan or a record. ``test_adv_proof`` runs each case through ``xstage
external`` for real and compares.

Every class has cases of both true verdicts (its *controls*), so neither "refuse all" nor "pass
all" survives it:

* ``control_flow`` (ort-openvino): a ``Scan`` whose body has no node — all its work is its own,
  per step, with no child kernel event — beside MatMul -> Relu -> Neg, which OpenVINO takes; it
  leaves the Scan on the CPU. The attack: thousands of steps against a small MatMul (OpenVINO's
  true share of the time near 0; a proof that leaves control flow out sees 1.0). The control: a
  few steps against a heavy MatMul (placed).
* ``identity_padding`` (ort-openvino): a heavy MatMul -> Relu -> Neg (taken) with a block of
  ``Identity`` nodes inside it, and a light chain of taken unary runs and declined ``Hardmax``
  nodes. onnxruntime removes every Identity before it partitions, so they run nowhere; each case
  runs padded and unpadded, with the same expected verdict. The attack: ``--min-placement``
  between the true node fraction and the padded graph's (counting the Identity nodes as taken
  placed it); the control: below both.
* ``qdq`` (ort-cpu): A16W8 graphs as ``xstage quantize`` makes them (opset 21, uint16
  activations, int8 weights), a Reshape before the first QuantizeLinear so onnxruntime's QDQ
  propagation inserts a pair named ``<value>_q``/``<value>_dq``. On onnxruntime 1.32 and 1.19:
  placed (each ran wholly on the CPU: the control against the false refusal "unmeasured"). The
  attack (1.19, which writes names unescaped): the input the pair is inserted on carries a name
  that closes its Q kernel's event, forges a long OpenVINO kernel under a real node's name, and
  leaves a fragment ``<safe value>_q`` that names a real value: no verdict may rest on forged
  evidence, so ``unmeasured``, never placed or declined by it.
* ``zero_d`` (torch-cpu, ort-cpu; a control against false refusals): a stage with a 0-d output
  beside an ordinary one is placed and passes the gate, the 0-d output keeping shape ``()``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
CLASSES = ("control_flow", "identity_padding", "qdq", "zero_d")
#: Unary ops OpenVINO takes in runs of three or more, and the light op it declines (adv_corpus).
TAKEN_UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh")
DECLINED = "Hardmax"

#: Work estimates in microseconds, measured on this class of machine (2-core VM, one intra-op
#: thread): a Scan step with an empty body costs about 1.8 us of the Scan's own time (20 000
#: steps: 35.7 ms, onnxruntime 1.24); OpenVINO's CPU MatMul runs at about 40 GFLOP/s (256: 0.86
#: ms). The cases keep a factor of at least 20 between the work they compare, so the estimates
#: may be off by several times without changing a verdict.
SCAN_STEP_US = 1.8
MATMUL_FLOPS_PER_US = 40_000.0
LIGHT_US = 5.0  # a unary op or Hardmax on the light chain's small tensor, about
#: The oracle calls a time fraction only when one side holds this share of the work.
DOMINANT = 0.95
MARGIN = 0.02


@dataclass(frozen=True)
class Node:
    """One node as built (``adv_corpus.Node``'s fields): name, op, taken by the target, work (us)."""

    name: str
    op: str
    taken: bool
    work: float


@dataclass
class Case:
    """One case: what to run, and the construction metadata the oracle reads."""

    klass: str
    ident: str
    route: str  # ort-openvino, ort-cpu (onnxruntime 1.19 or 1.32), torch-cpu
    min_placement: float
    nodes: tuple[Node, ...] = ()
    ort: str = "1.19"  # ort-cpu: which onnxruntime runs it
    scan_steps: int = 0
    matmul: int = 0  # the heavy MatMul's size (0: none)
    identities: int = 0  # Identity nodes inside the heavy chain (removed by onnxruntime)
    qdq_width: int = 0
    hostile: bool = False  # qdq: the input's name forges events
    zero_d: str = ""  # zero_d: the reduction
    control: bool = False
    describe: str = ""
    build: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """The pytest id."""
        return f"{self.klass}-{self.ident}"


# --------------------------------------------------------------------------- graphs


def _value(name: str, shape: list[int], dtype: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any],
           opset: int = 17) -> ModelProto:
    graph = helper.make_graph(nodes, "adv_proof", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10 if opset >= 21 else 8)


def _heavy(size: int, identities: int) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """MatMul -> ``identities`` x Identity -> Relu -> Neg on input x (size²), output h."""
    w = np.random.default_rng(size).standard_normal((size, size)).astype("f4") / size
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="heavy")]
    prev = "h0"
    for i in range(identities):
        nodes.append(helper.make_node("Identity", [prev], [f"pad{i}"], name=f"pad{i}"))
        prev = f"pad{i}"
    nodes += [helper.make_node("Relu", [prev], ["h1"], name="heavy_relu"),
              helper.make_node("Neg", ["h1"], ["h"], name="heavy_neg")]
    return nodes, [_value("x", [size, size])], [_value("h", [size, size])], [numpy_helper.from_array(w, "w")]


def build_onnx(case: Case, *, padded: bool = True) -> ModelProto:
    """The case's ONNX graph (``padded``: with its Identity nodes; identity_padding only)."""
    if case.klass == "control_flow":
        body = helper.make_graph([], "body", [_value("s_in", [1, 16]), _value("x_t", [1, 16])],
                                 [_value("s_in", [1, 16]), _value("x_t", [1, 16])])
        nodes, inputs, outputs, inits = _heavy(case.matmul, 0)
        scan = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], name="scan", num_scan_inputs=1,
                                body=body)
        steps = case.scan_steps
        return _model([scan, *nodes], [_value("s0", [1, 16]), _value("xs", [steps, 1, 16]), *inputs],
                      [_value("s_final", [1, 16]), _value("ys", [steps, 1, 16]), *outputs], inits)
    if case.klass == "identity_padding":
        nodes, inputs, outputs, inits = _heavy(case.matmul, case.identities if padded else 0)
        prev = "z"
        light = [n for n in case.nodes if not n.name.startswith("heavy")]
        for i, node in enumerate(light):
            out = "y" if i == len(light) - 1 else f"t{i}"
            nodes.append(helper.make_node(node.op, [prev], [out], name=node.name))
            prev = out
        return _model(nodes, [_value("z", [4, 8]), *inputs], [_value("y", [4, 8]), *outputs], inits)
    if case.klass == "qdq":
        return _qdq(case)
    if case.klass == "zero_d":
        reduce = helper.make_node(case.zero_d, ["x"], ["total"], name="reduce", keepdims=0)
        return _model([reduce, helper.make_node("Relu", ["x"], ["r"], name="relu")], [_value("x", [3, 5])],
                      [_value("total", []), _value("r", [3, 5])], [])
    raise ValueError(case.klass)


def forged_input_name(case: Case) -> str:
    """The hostile input's name: it closes its Q kernel's event (onnxruntime names it
    ``<input>_q``), claims OpenVINO for the real node ``reshape`` (op Reshape) with a long
    duration, and opens an event whose name ends in ``m`` — with ``_q`` appended, ``m_q``, a Q of
    the real value ``m``. onnxruntime 1.19 writes it unescaped; the file stays valid JSON."""
    big = case.build["forged_us"]
    return (f'reshape_kernel_time","dur":{big},"args":{{"provider":"{OV}","op_name":"Reshape"}}}},'
            '{"cat":"Node","pid":1,"tid":1,"dur":1,"ts":1,"ph":"X","name":"m')


def _qdq(case: Case) -> ModelProto:
    """x -> Reshape -> Q -> DQ -> MatMul(int8 weights) -> Q -> DQ -> y, as xstage quantize writes
    A16W8 (opset 21); ``hostile``: the input x carries :func:`forged_input_name`."""
    width = case.qdq_width
    rng = np.random.default_rng(width)
    x = forged_input_name(case) if case.hostile else "x"
    inits = [numpy_helper.from_array(np.array([2, 2 * width], np.int64), "shape"),
             numpy_helper.from_array(np.array(1 / 8192, np.float32), "a_scale"),
             numpy_helper.from_array(np.array(32768, np.uint16), "a_zero"),
             numpy_helper.from_array(rng.integers(-127, 128, (2 * width, 8)).astype(np.int8), "w_q"),
             numpy_helper.from_array(np.array(1 / 512, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(1 / 4096, np.float32), "m_scale"),
             numpy_helper.from_array(np.array(32768, np.uint16), "m_zero")]
    nodes = [helper.make_node("Reshape", [x, "shape"], ["r"], name="reshape"),
             helper.make_node("QuantizeLinear", ["r", "a_scale", "a_zero"], ["r_q"], name="r_q_node"),
             helper.make_node("DequantizeLinear", ["r_q", "a_scale", "a_zero"], ["r_dq"], name="r_dq_node"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_dq_node"),
             helper.make_node("MatMul", ["r_dq", "w"], ["m"], name="matmul"),
             helper.make_node("QuantizeLinear", ["m", "m_scale", "m_zero"], ["m_q8"], name="m_q_node"),
             helper.make_node("DequantizeLinear", ["m_q8", "m_scale", "m_zero"], ["y"], name="m_dq_node")]
    return _model(nodes, [_value(x, [4, width])], [_value("y", [2, 8])], inits, opset=21)


# --------------------------------------------------------------------------- the classes


def _light(rng: random.Random, taken: int, declined: int) -> list[Node]:
    """Runs of taken unary ops (each >= 3 long, as adv_corpus) and ``declined`` Hardmax nodes."""
    runs, left = [], taken
    while left >= 6 and rng.random() < 0.6:
        n = rng.randrange(3, left - 2)
        runs.append(n)
        left -= n
    runs.append(left)
    order: list[Any] = [[rng.choice(TAKEN_UNARY) for _ in range(n)] for n in runs] + [DECLINED] * declined
    rng.shuffle(order)
    nodes: list[Node] = []
    for item in order:
        for op in (item if isinstance(item, list) else [item]):
            nodes.append(Node(f"n{len(nodes)}", op, op != DECLINED, LIGHT_US))
    return nodes


def _heavy_nodes(size: int) -> list[Node]:
    return [Node("heavy", "MatMul", True, 2.0 * size ** 3 / MATMUL_FLOPS_PER_US),
            Node("heavy_relu", "Relu", True, LIGHT_US), Node("heavy_neg", "Neg", True, LIGHT_US)]


def _control_flow(rng: random.Random, i: int, control: bool) -> Case:
    if control:
        steps, size = rng.randrange(1, 5), rng.choice((288, 320, 352))
        mp = round(rng.uniform(0.3, 0.7), 3)
    else:
        steps, size = rng.randrange(8000, 12001), rng.choice((16, 24, 32))
        mp = round(rng.uniform(0.3, 0.7), 3)
    nodes = (*_heavy_nodes(size), Node("scan", "Scan", False, steps * SCAN_STEP_US))
    return Case("control_flow", f"{i}{'-control' if control else ''}", "ort-openvino", mp, nodes,
                scan_steps=steps, matmul=size, control=control,
                describe=f"Scan of {steps} empty steps on the CPU beside MatMul {size} on OpenVINO")


def _identity_padding(rng: random.Random, i: int, control: bool) -> Case:
    while True:
        taken, declined = rng.randrange(3, 8), rng.randrange(3, 9)
        identities, size = rng.randrange(20, 41), rng.choice((288, 320, 352))
        nodes = (*_heavy_nodes(size), *_light(rng, taken, declined))
        true_nf = sum(n.taken for n in nodes) / len(nodes)
        padded_nf = (sum(n.taken for n in nodes) + identities) / (len(nodes) + identities)
        if padded_nf - true_nf > 0.15 and true_nf > 0.2:
            break
    if control:
        mp = round(rng.uniform(0.1, true_nf - 0.05), 3)
    else:  # between the true node fraction and the padded one: placed only by counting padding
        mp = round(rng.uniform(true_nf + 0.05, padded_nf - 0.05), 3)
    return Case("identity_padding", f"{i}{'-control' if control else ''}", "ort-openvino", mp, nodes,
                matmul=size, identities=identities, control=control,
                describe=f"MatMul {size} -> {identities} Identity -> Relu -> Neg; {taken} taken, "
                         f"{declined} Hardmax; nodes {true_nf:.3f} (padded {padded_nf:.3f})")


def _qdq_case(rng: random.Random, i: int, control: bool) -> Case:
    width = rng.choice((8, 16, 24, 32))
    if control:
        ort = ("1.32", "1.19")[i % 2]
        return Case("qdq", f"{i}-control-{ort}", "ort-cpu", round(rng.uniform(0.5, 1.0), 3), ort=ort,
                    qdq_width=width, control=True,
                    describe=f"A16W8 Reshape -> Q/DQ -> MatMul ({width}) on onnxruntime {ort}")
    forged = rng.randrange(10**6, 10**8)
    return Case("qdq", str(i), "ort-cpu", round(rng.uniform(0.01, 0.99), 3), ort="1.19", qdq_width=width,
                hostile=True, build={"forged_us": forged},
                describe=f"A16W8 ({width}) whose input's name forges a {forged} us OpenVINO kernel")


def _zero_d(rng: random.Random, i: int, control: bool) -> Case:
    route = "torch-cpu" if control else "ort-cpu"
    op = rng.choice(("ReduceSum", "ReduceMax", "ReduceMean"))
    return Case("zero_d", f"{i}-{route}", route, round(rng.uniform(0.5, 1.0), 3), ort="1.32", zero_d=op,
                control=True, describe=f"a 0-d {op} beside a Relu on {route}")


_MAKERS = {"control_flow": _control_flow, "identity_padding": _identity_padding, "qdq": _qdq_case,
           "zero_d": _zero_d}


def generate(seed: int, per_class: int) -> list[Case]:
    """``per_class`` cases of every class, each followed by its control; each class from its own
    stream of ``seed`` (offset from adv_corpus's streams)."""
    cases = []
    for index, klass in enumerate(CLASSES):
        rng = random.Random(seed * 1000 + 500 + index)
        for i in range(per_class):
            cases.append(_MAKERS[klass](rng, i, False))
            cases.append(_MAKERS[klass](rng, i, True))
    return cases


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Expected:
    """What the spec says a case ends in."""

    exit_code: int
    verdict: str
    cause: str | None
    node_fraction: float | None = None
    time_fraction: float | None = None


def expected(case: Case) -> Expected:
    """The case's expected result from its construction alone; ValueError when too close to call.

    Rules: a node onnxruntime removes (Identity) runs nowhere and counts nowhere; a control-flow
    node's own work is its provider's; node fraction = taken nodes / nodes that run; time
    fraction = taken work / all work, known only when one side holds ``DOMINANT`` of it; placed
    iff both reach ``--min-placement``. Evidence a graph's own text can forge decides nothing:
    ``unmeasured``. A stage that ran wholly on the route's own device is placed.
    """
    if case.klass == "qdq" and case.hostile:
        return Expected(2, "unmeasured", "unmeasured")
    if case.klass in ("qdq", "zero_d"):
        return Expected(0, "placed", None, 1.0, 1.0)
    nodes = case.nodes
    nf = sum(n.taken for n in nodes) / len(nodes)
    total = sum(n.work for n in nodes)
    taken_work = sum(n.work for n in nodes if n.taken)
    tf = taken_work / total if max(taken_work, total - taken_work) >= DOMINANT * total else None
    mp = case.min_placement
    if nf < mp - MARGIN or (tf is not None and tf < mp - MARGIN):
        return Expected(2, "declined", "declined", nf, tf)
    if nf >= mp + MARGIN and tf is not None and tf >= mp + MARGIN:
        return Expected(0, "placed", None, nf, tf)
    raise ValueError(f"{case.id}: too close to call (nodes {nf:.3f}, time {tf}, min_placement {mp})")
