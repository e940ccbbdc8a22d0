"""The adversarial corpus: cases generated per class from one seed, with their construction metadata.

Every case says how it was *built* — which nodes the EP takes (measured here: OpenVINO declines
``Hardmax`` and ``Det``, and leaves a lone unary op between two declined ones on the CPU, so the
corpus only puts unary ops in runs of three or more), which node dominates the work, which device
the options select — and nothing about what xstage's proof makes of it: ``adv_oracle`` turns the
metadata into the expected result, ``test_adversarial`` runs the case for real and compares.

Classes (``CLASSES``; five cases each are generated, a default run takes the first of each and
its controls, ``--run-slow`` all five: ``per_class_params``):

* ``injection``: every node is one OpenVINO declines; the names of a random subset carry text
  crafted to close their profile event early and claim OpenVINO for the real kernel (at its real
  ``ts``, so it counts in whichever profiled run it ran), optionally with a duplicate ``dur`` key
  that JSON readers take over the real one, then add fake OpenVINO subgraph events
  (onnxruntime-openvino writes node names unescaped; the file stays valid JSON). Varies which
  nodes, the text around the payload, the number, size and ``ts`` of the fake events, the fake
  op names.
* ``injection_cpu``: the same on the ``ort-cpu`` route under onnxruntime 1.19 (no plan, unescaped
  names): the real kernels claim another provider, to talk a stage that ran wholly on the CPU
  out of being placed.
* ``provider_names``: a graph whose plan lists OpenVINO nodes, too few to pass; the payload fakes
  OpenVINO time *and* an event on a provider the plan does not list (so a proof that drops an
  "incomplete" plan decides on the faked time). Varies that provider's name.
* ``node_counts``: a heavy MatMul (then Relu, Neg) OpenVINO takes, light unary runs it takes,
  ``k`` light ``Hardmax`` it declines; ``--min-placement`` on either side of the node fraction.
* ``cpu_share``: one heavy ``Det`` (declined, >95% of the work) among many light ops OpenVINO
  takes: most nodes on the EP, most time on the CPU.
* ``device_override``: a simulated device table (an Intel iGPU row the ``ort-openvino`` route
  drives) and ``--ep-option device_type=...`` selecting another device than the planned one.
* ``device_mismatch``: the simulated iGPU row's options open OpenVINO's CPU plugin: the device
  that ran is not the planned one.
* ``torch``: torch programs on ``torch-cpu``: ``torch.cond``, ``while_loop`` and ``map`` over
  unary ops (placed: every op ran on the CPU), and programs of views only (no op that launches
  a kernel: unmeasured). torch-cuda's outputs-off-device case needs a CUDA machine: not here.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

SEED_ENV = "XSTAGE_ADV_SEED"
#: Cases of one class a default run takes (the first), and at least how many ``--run-slow`` takes.
DEFAULT_PER_CLASS = 1
SLOW_PER_CLASS = 5
PER_CLASS = SLOW_PER_CLASS  # what ``generate`` makes; per_class_params splits default from slow
#: Controls: cases beyond the first that a class's default run keeps, so that each outcome its
#: construction can have is run (node_counts: below and above the node fraction; torch: a
#: program that launches kernels and one of views only).
CONTROLS = {"node_counts": 1, "torch": 1}

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
#: Unary ops OpenVINO takes here (in runs of three or more), and the light op it declines.
TAKEN_UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh")
DECLINED_LIGHT = "Hardmax"

#: The seed of this run, set by the test module (the table prints it).
SEED: int | None = None

CLASSES = ("injection", "injection_cpu", "provider_names", "node_counts", "cpu_share",
           "device_override", "device_mismatch", "torch")

IGPU = "gpu_integrated:intel"


@dataclass(frozen=True)
class Node:
    """One node as built: its name, op, whether the target EP takes it, and its work (FLOPs)."""

    name: str
    op: str
    taken: bool
    work: float


@dataclass
class Case:
    """One corpus case: what to run, and the construction metadata the oracle reads."""

    klass: str
    ident: str
    route: str  # ort-openvino, ort-cpu (onnxruntime 1.19), torch-cpu
    min_placement: float
    nodes: tuple[Node, ...] = ()
    #: ONNX graph: ("chain" shape of the light input, heavy op spec or None)
    light_shape: tuple[int, ...] = (4, 8)
    heavy: tuple[str, tuple[int, ...]] | None = None
    planned_device: str = "cpu"
    ep_options: dict[str, str] = field(default_factory=dict)
    #: the simulated iGPU row's OpenVINO device_type, or None for the machine's own table
    simulated_igpu_device_type: str | None = None
    #: torch: program kind, ops, input shape; how many of its ops launch a kernel
    torch_kind: str | None = None
    torch_ops: tuple[str, ...] = ()
    torch_shape: tuple[int, ...] = ()
    torch_counted_ops: int = 0
    describe: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """The pytest id."""
        return f"{self.klass}-{self.ident}"


def seed_from_env() -> int:
    """The corpus seed: ``XSTAGE_ADV_SEED`` when set, else a fresh random one (printed)."""
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        return int(text, 0)
    return random.SystemRandom().randrange(1, 2**31)


# --------------------------------------------------------------------------- injection text


def _fake_event(name: str, provider: str, op: str, dur: int, ts: int) -> str:
    return (f'{{"cat":"Node","pid":1,"tid":1,"dur":{dur},"ts":{ts},"ph":"X","name":"{name}_kernel_time",'
            f'"args":{{"provider":"{provider}","op_name":"{op}"}}}},')


def injection_name(rng: random.Random, claim: str, fakes: list[tuple[str, str, str, int]], *,
                   big_dur: int | None) -> tuple[str, dict[str, Any]]:
    """A node name that closes its own kernel event early, claiming provider ``claim`` for the
    real kernel (its real ``ts``, so it lands in whichever profiled run it ran in; with
    ``big_dur``, a duplicate ``dur`` key that JSON readers take over the real one), then adds
    ``fakes`` = [(event node name, provider, op_name, dur µs)] and a last event that takes the
    real event's args with ``dur`` 0. onnxruntime appends ``_kernel_time","args" : {...}}``.
    """
    prefix = "".join(rng.choice("abcdefxyz_") for _ in range(rng.randrange(0, 6)))
    suffix = "".join(rng.choice("abcdefxyz_") for _ in range(rng.randrange(1, 6)))
    dur = f',"dur":{big_dur}' if big_dur is not None else ""
    text = (f'{prefix}_kernel_time"{dur},"args":{{"provider":"{claim}","op_name":'
            f'"{rng.choice(TAKEN_UNARY)}"}}}},')
    for i, (name, provider, op, fake_dur) in enumerate(fakes):
        text += _fake_event(name, provider, op, fake_dur, rng.randrange(10, 10**7) + i)
    text += '{"cat":"Node","pid":1,"tid":1,"dur":0,"ts":1,"ph":"X","name":"' + suffix
    return text, {"prefix": prefix, "suffix": suffix, "fake_events": len(fakes), "big_dur": big_dur}


def _big(rng: random.Random) -> int | None:
    return rng.randrange(10**6, 10**8) if rng.random() < 0.5 else None


def _payloads(rng: random.Random, nodes: list[Node], candidates: list[int], claim: str,
              fakes: Any) -> tuple[list[int], dict[str, Any]]:
    """Payloads in a random non-empty subset of ``candidates`` (in place); what was done."""
    chosen = sorted(rng.sample(candidates, rng.randrange(1, len(candidates) + 1)))
    metas = []
    for at in chosen:
        name, meta = injection_name(rng, claim, fakes(), big_dur=_big(rng))
        nodes[at] = Node(name, nodes[at].op, nodes[at].taken, nodes[at].work)
        metas.append(meta)
    return chosen, {"nodes": chosen, "payloads": metas}


def _ov_fakes(rng: random.Random) -> list[tuple[str, str, str, int]]:
    out = []
    for _ in range(rng.randrange(1, 4)):
        k = rng.randrange(1, 9)
        out.append((f"{OV}_OpenVINO-EP-subgraph_{k}_0", OV, f"OpenVINO-EP-subgraph_{k}",
                    rng.randrange(10**6, 10**8)))
    return out


# --------------------------------------------------------------------------- graph construction


def _light_nodes(rng: random.Random, taken_runs: list[int], declined: int) -> list[Node]:
    """Runs of taken unary ops (each >= 3 long) and ``declined`` Hardmax nodes, interleaved."""
    slots: list[list[str]] = [[rng.choice(TAKEN_UNARY) for _ in range(n)] for n in taken_runs]
    order: list[str | list[str]] = [*slots, *([DECLINED_LIGHT] * declined)]
    rng.shuffle(order)
    nodes = []
    for item in order:
        for op in (item if isinstance(item, list) else [item]):
            nodes.append(Node(f"n{len(nodes)}", op, op != DECLINED_LIGHT, 32.0))
    return nodes


def _runs(rng: random.Random, total: int) -> list[int]:
    """``total`` taken ops split in runs of at least 3 (total >= 3)."""
    runs = []
    while total >= 6 and rng.random() < 0.6:
        n = rng.randrange(3, total - 2)
        runs.append(n)
        total -= n
    runs.append(total)
    return runs


def build_onnx(case: Case) -> ModelProto:
    """The case's graph: the light chain on input ``z`` (output ``y``), and the heavy op on input
    ``x`` (output ``h``) when the case has one. Node names are the case's, payloads included."""
    value = helper.make_tensor_value_info
    inputs = [value("z", TensorProto.FLOAT, list(case.light_shape))]
    outputs = [value("y", TensorProto.FLOAT, list(case.light_shape))]
    nodes, inits = [], []
    light = [n for n in case.nodes if not n.name.startswith("heavy")]
    prev = "z"
    for i, node in enumerate(light):
        out = "y" if i == len(light) - 1 else f"t{i}"
        nodes.append(helper.make_node(node.op, [prev], [out], name=node.name))
        prev = out
    if case.heavy is not None:
        op, dims = case.heavy
        if op == "MatMul":
            size = dims[0]
            w = np.random.default_rng(size).standard_normal((size, size)).astype("f4") / size
            inits.append(numpy_helper.from_array(w, "w"))
            # A lone MatMul cluster is not always taken (measured: OpenVINO 1.24 left it on the
            # CPU when the light chain ended in a Hardmax); MatMul -> Relu -> Neg always was.
            nodes.append(helper.make_node("MatMul", ["x", "w"], ["h0"], name="heavy"))
            nodes.append(helper.make_node("Relu", ["h0"], ["h1"], name="heavy_relu"))
            nodes.append(helper.make_node("Neg", ["h1"], ["h"], name="heavy_neg"))
            inputs.append(value("x", TensorProto.FLOAT, [size, size]))
            outputs.append(value("h", TensorProto.FLOAT, [size, size]))
        else:  # Det over a batch of square matrices
            batch, n = dims
            nodes.append(helper.make_node("Det", ["x"], ["h"], name="heavy"))
            inputs.append(value("x", TensorProto.FLOAT, [batch, n, n]))
            outputs.append(value("h", TensorProto.FLOAT, [batch]))
    graph = helper.make_graph(nodes, "adversarial", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _heavy_node(op: str, dims: tuple[int, ...], taken: bool) -> Node:
    if op == "MatMul":
        work = 2.0 * dims[0] ** 3
    else:
        work = dims[0] * (2.0 / 3.0) * dims[1] ** 3
    return Node("heavy", op, taken, work)


# --------------------------------------------------------------------------- the classes


def _injection(rng: random.Random, i: int) -> Case:
    count = rng.randrange(1, 5)
    nodes = [Node(f"n{j}", DECLINED_LIGHT, False, 32.0) for j in range(count)]
    at, meta = _payloads(rng, nodes, list(range(count)), OV, lambda: _ov_fakes(rng))
    mp = round(rng.uniform(0.5, 0.999), 3)
    return Case("injection", str(i), "ort-openvino", mp, tuple(nodes),
                describe=f"{count} Hardmax, payloads in nodes {at}", payload=meta)


def _injection_cpu(rng: random.Random, i: int) -> Case:
    count = rng.randrange(3, 8)
    nodes = [Node(f"n{j}", rng.choice(TAKEN_UNARY), True, 32.0) for j in range(count)]
    other = rng.choice(["OpenVINOExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider"])

    def fakes() -> list[tuple[str, str, str, int]]:
        return [(f"fake{j}", other, rng.choice(TAKEN_UNARY), rng.randrange(10**6, 10**8))
                for j in range(rng.randrange(0, 3))]

    at, meta = _payloads(rng, nodes, list(range(count)), other, fakes)
    mp = round(rng.uniform(0.5, 0.99), 3)
    return Case("injection_cpu", str(i), "ort-cpu", mp, tuple(nodes),
                describe=f"{count} unary ops on the CPU EP, payloads in nodes {at} claiming {other}",
                payload={**meta, "provider": other})


def _provider_names(rng: random.Random, i: int) -> Case:
    names = ["CUDAExecutionProvider", "TensorrtExecutionProvider", "DmlExecutionProvider",
             "WebGpuExecutionProvider", "QNNExecutionProvider", "CoreMLExecutionProvider",
             f"Ep{rng.randrange(16**6):06x}ExecutionProvider", "OpenVINOExecutionProvider2"]
    provider = names[i % len(names)] if i < len(names) else rng.choice(names)
    while True:
        taken, declined = rng.randrange(3, 8), rng.randrange(3, 10)
        nf = taken / (taken + declined)
        if nf <= 0.6:
            break
    nodes = _light_nodes(rng, _runs(rng, taken), declined)

    def fakes() -> list[tuple[str, str, str, int]]:
        out = [*_ov_fakes(rng), ("other_0", provider, rng.choice(TAKEN_UNARY), rng.randrange(1, 1000))]
        rng.shuffle(out)
        return out

    at, meta = _payloads(rng, nodes, [j for j, n in enumerate(nodes) if not n.taken], OV, fakes)
    mp = round(rng.uniform(nf + 0.1, 0.999), 3)
    return Case("provider_names", str(i), "ort-openvino", mp, tuple(nodes),
                describe=f"{taken} taken / {declined} Hardmax, payloads in {at}, fake provider {provider}",
                payload={**meta, "provider": provider})


def _node_counts(rng: random.Random, i: int) -> Case:
    size = rng.choice((288, 320, 352))  # milliseconds of MatMul: a CPU kernel's hiccup cannot outweigh it
    taken, declined = rng.randrange(3, 30), rng.randrange(1, 9)
    nodes = [*_light_nodes(rng, _runs(rng, taken), declined), _heavy_node("MatMul", (size,), True),
             Node("heavy_relu", "Relu", True, size * size), Node("heavy_neg", "Neg", True, size * size)]
    nf = (taken + 3) / (taken + 3 + declined)
    if i % 2 == 0:  # below the node fraction, and below the time fraction the MatMul gives
        mp = round(rng.uniform(max(0.05, nf - 0.4), min(nf - 0.03, 0.5)), 3)
    else:
        mp = round(rng.uniform(nf + 0.03, min(1.0, nf + 0.3)), 3)
    return Case("node_counts", str(i), "ort-openvino", mp, tuple(nodes), heavy=("MatMul", (size,)),
                describe=f"MatMul {size}, {taken} taken, {declined} Hardmax, nodes {nf:.3f}")


def _cpu_share(rng: random.Random, i: int) -> Case:
    batch, n = rng.choice((1024, 1280, 1536)), 64
    taken = rng.randrange(8, 40)
    nodes = [*_light_nodes(rng, _runs(rng, taken), 0), _heavy_node("Det", (batch, n), False)]
    nf = taken / (taken + 1)
    mp = round(rng.uniform(0.5, nf - 0.01), 3)
    return Case("cpu_share", str(i), "ort-openvino", mp, tuple(nodes), heavy=("Det", (batch, n)),
                describe=f"Det {batch}x{n}x{n} on the CPU among {taken} taken, nodes {nf:.3f}")


#: (planned device, --ep-option device_type): each selects another device than the planned one.
_OVERRIDES = ((IGPU, "CPU"), ("cpu", "GPU"), ("cpu", "GPU.0"), ("cpu", "NPU"), (IGPU, "NPU"))


def _small_taken(rng: random.Random) -> tuple[Node, ...]:
    return tuple(_light_nodes(rng, _runs(rng, rng.randrange(3, 10)), 0))


def _device_override(rng: random.Random, i: int) -> Case:
    planned, device_type = _OVERRIDES[i % len(_OVERRIDES)]
    return Case("device_override", str(i), "ort-openvino", round(rng.uniform(0.3, 0.9), 3),
                _small_taken(rng), planned_device=planned, ep_options={"device_type": device_type},
                simulated_igpu_device_type="GPU",
                describe=f"planned {planned}, --ep-option device_type={device_type}")


def _device_mismatch(rng: random.Random, i: int) -> Case:
    return Case("device_mismatch", str(i), "ort-openvino", round(rng.uniform(0.3, 0.9), 3),
                _small_taken(rng), planned_device=IGPU, simulated_igpu_device_type="CPU",
                describe="planned gpu_integrated:intel; its options open OpenVINO's CPU plugin")


_UNARY_TORCH = ("sin", "cos", "relu", "tanh", "sigmoid", "neg", "abs")


def _torch(rng: random.Random, i: int) -> Case:
    kind = ("cond", "views", "while_loop", "map", "views")[i % 5]
    shape = (rng.randrange(2, 7), rng.randrange(3, 9))
    if kind == "views":
        # Views of a contiguous tensor stay views; a transpose only at the end (a reshape after
        # it would copy, and a copy is a kernel): no op that launches one.
        ops = [rng.choice(("unsqueeze", "flatten", "reshape")) for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.5:
            ops.append("transpose")
        counted = 0
    else:
        ops = [rng.choice(_UNARY_TORCH) for _ in range(rng.randrange(1, 5))]
        counted = len(ops)
    return Case("torch", str(i), "torch-cpu", round(rng.uniform(0.3, 1.0), 3), torch_kind=kind,
                torch_ops=tuple(ops), torch_shape=shape, torch_counted_ops=counted,
                describe=f"{kind}: {'/'.join(ops)} on {shape}")


_MAKERS = {"injection": _injection, "injection_cpu": _injection_cpu, "provider_names": _provider_names,
           "node_counts": _node_counts, "cpu_share": _cpu_share, "device_override": _device_override,
           "device_mismatch": _device_mismatch, "torch": _torch}


def per_class_count(slow: bool, controls: int = 0) -> int:
    """How many cases of one generated class a run takes: the first case plus ``controls`` by
    default, at least ``SLOW_PER_CLASS`` with ``--run-slow``. Stable name: the generated
    adversarial files share it (and ``per_class_params``)."""
    return max(SLOW_PER_CLASS, DEFAULT_PER_CLASS + controls) if slow else DEFAULT_PER_CLASS + controls


#: The reason a generated case past a class's default ones is ``slow`` (every generated corpus).
FURTHER = "a further generated case of its class: the default run takes each class's first and its controls"


def per_class_params(cases: Sequence[Any], *, klass: Callable[[Any], str] = lambda c: c.klass,
                     ident: Callable[[Any], str] = lambda c: c.id,
                     marks: Callable[[Any], list[Any]] = lambda c: [],
                     controls: Mapping[str, int] | None = None) -> list[Any]:
    """``cases`` (generated ``SLOW_PER_CLASS`` or more per class, in order) as pytest params:
    the first ``per_class_count(False, controls[class])`` of each class run by default, the rest
    are marked ``slow`` with the reason. The default run keeps every class; ``--run-slow`` runs
    them all. Stable name: the generated adversarial files share it."""
    import pytest

    controls = CONTROLS if controls is None else controls
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        name = klass(case)
        n = seen[name] = seen.get(name, 0) + 1
        extra = list(marks(case))
        if n > per_class_count(False, controls.get(name, 0)):
            extra.append(pytest.mark.slow(reason=FURTHER))
        out.append(pytest.param(case, id=ident(case), marks=extra))
    return out


def default_cases(cases: Sequence[Any], slow: bool, *, klass: Callable[[Any], str] = lambda c: c.klass,
                  controls: Mapping[str, int] | None = None) -> list[Any]:
    """The cases of ``cases`` a run takes (``per_class_params``'s split): what a module fixture
    should build, so a default run does not export programs only slow cases use."""
    controls = CONTROLS if controls is None else controls
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        name = klass(case)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] <= per_class_count(slow, controls.get(name, 0)):
            out.append(case)
    return out


def generate(seed: int, per_class: int = PER_CLASS) -> list[Case]:
    """``per_class`` cases of every class, each class from its own stream of ``seed``."""
    cases = []
    for index, klass in enumerate(CLASSES):
        rng = random.Random(seed * 1000 + index)
        cases.extend(_MAKERS[klass](rng, i) for i in range(per_class))
    return cases


# --------------------------------------------------------------------------- the table


#: klass -> {"cases", "as_expected", "false_placed", "xfail"}; filled as the cases run.
RESULTS: dict[str, dict[str, int]] = {}


def tally(klass: str, *, as_expected: bool, false_placed: bool, xfail: bool) -> None:
    """Count one finished case for the table."""
    row = RESULTS.setdefault(klass, {"cases": 0, "as_expected": 0, "false_placed": 0, "xfail": 0})
    row["cases"] += 1
    row["as_expected"] += int(as_expected)
    row["false_placed"] += int(false_placed)
    row["xfail"] += int(xfail)


def table(seed: int) -> str:
    """The classes and their counts, as text."""
    lines = [f"adversarial corpus, seed {seed} (set {SEED_ENV} to repeat)",
             f"{'class':<17}{'cases':>6}{'as spec':>9}{'false placed':>14}{'xfail (known gap)':>18}"]
    for klass in CLASSES:
        row = RESULTS.get(klass)
        if row is None:
            lines.append(f"{klass:<17}{'not run (skipped)':>47}")
            continue
        lines.append(f"{klass:<17}{row['cases']:>6}{row['as_expected']:>9}{row['false_placed']:>14}"
                     f"{row['xfail']:>18}")
    return "\n".join(lines)
