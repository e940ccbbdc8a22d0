"""Adversarial classes for false refusals: the profiler's memory (12) and a crashing candidate (15).

Each class has cases of both true verdicts, so neither "refuse all" nor "admit all" survives it.
The truth comes from construction, and ``expected`` (the oracle) reads only a case's
construction metadata: it imports nothing of xstage (no ``xstage.evidence``, ``xstage.parity``
or ``xstage.ledger``) and never reads a profile, a plan or a record.

``profiled_memory``: a ``Scan`` of ``steps`` steps whose body adds the step's row ``adds`` times
to a state of ``width`` floats. Every step is ``adds`` + 1 kernel events in onnxruntime's
profile, which its profiler keeps until the session ends: tens of MiB for a stage whose own
tensors are a few hundred KiB.

* ``fits`` (the case): ``--pool host_ram=120MiB``. The stage's tensors are under 1 MiB, so it
  needs what an onnxruntime worker holding a trivial graph needs (63 MiB on onnxruntime 1.32,
  52 MiB on 1.19, measured in docs/memory.md) and fits 120 MiB; its profiled warm-up does not
  (the profiler's events alone are over 60 MiB). Must be admitted: exit 0.
* ``small_pool`` (control): the same stage, ``--pool host_ram=32MiB``: a Python process with
  numpy and onnxruntime imported holds more than 32 MiB before any graph. Must be refused
  (exit 2, ``over_budget`` or ``peak_over_budget``).
* ``allocates`` (control): the same Scan beside a ``ConstantOfShape(n)`` whose ``n`` comes from
  the inputs (``alloc_mib`` MiB of floats, 256 or more, that no shape inference can size),
  ``--pool host_ram=200MiB``: it truly needs more than the pool. Must be refused (exit 2),
  ``peak_over_budget``, with the proof ``placed`` and the gate ``passed`` kept in the record.

``crashing_candidate``: ``--offload`` over ``ort-openvino`` (first) and ``ort-cpu`` (the reference
arm, last) on a small MLP that OpenVINO takes whole, with ``ort-openvino``'s worker dying by
``fault`` (``tests/client/fault_worker.py``: an abort while loading, SIGKILL or SIGSEGV while
warming up, an exit status while loading).

* ``dies`` (the case): the reference arm runs the graph, so the death refuses that candidate
  (``ep_compile_failed``, the death's signal or status and the worker's last stderr lines in
  the evidence; a SIGKILL marked a possible out-of-memory kill) and the loop goes on: placed on
  ``ort-cpu``, exit 0.
* ``reference_dies`` (control): ``ort-cpu``'s worker dies the same way: nothing clears the
  graph, exit 1.
* ``reference_pinned`` (control): ``--route ort-cpu`` with its worker dying: the reference arm's
  own death is an error, exit 1.
* ``healthy`` (control): no fault: placed on ``ort-openvino``, exit 0.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

__all__ = ["CLASSES", "SEED_ENV", "Case", "Expected", "build", "expected", "generate", "inputs",
           "seed_from_env"]

SEED_ENV = "XSTAGE_ADV_SEED"
CLASSES = ("profiled_memory", "crashing_candidate")
#: The faults a crashing candidate dies by (``fault_worker.py``), and the signal each ends in.
FAULTS = {"abort-on-load": "SIGABRT", "sigkill-on-warmup": "SIGKILL", "segv-on-warmup": "SIGSEGV",
          "exit-on-load=3": None, "exit-on-load=70": None}
MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    """One run: its class, which variant (the case or a control), and how it was built."""

    klass: str
    variant: str
    index: int
    interpreter: str = "main"  # ort-cpu's onnxruntime: "main" (this one) or "py39" (1.19)
    steps: int = 0
    width: int = 0
    adds: int = 0
    alloc_mib: int = 0
    pool: str | None = None
    fault: str | None = None
    mlp_width: int = 0
    seed: int = 0

    @property
    def id(self) -> str:
        return f"{self.klass}-{self.index}-{self.variant}"


@dataclass(frozen=True)
class Expected:
    """What the spec says a case ends in."""

    exit_code: int
    causes: tuple[str, ...] = ()  # the last refusal's cause is one of these (exit 2)
    chosen: str | None = None  # the route that runs it (exit 0)
    refused_first: str | None = None  # a candidate refused before ``chosen``, by this cause
    signal: str | None = None  # the dead worker's signal, where it died by one
    possible_oom: bool = False
    kept: dict[str, str] = field(default_factory=dict)  # refused record: block -> its verdict


def seed_from_env() -> int:
    """The seed: ``XSTAGE_ADV_SEED`` where set, else a fresh one (printed by the test module)."""
    value = os.environ.get(SEED_ENV)
    return int(value) if value else random.SystemRandom().randrange(1 << 31)


def generate(seed: int, per_class: int) -> list[Case]:
    """``per_class`` seeded cases of each class, each with its controls."""
    rng = random.Random(seed)
    out: list[Case] = []
    faults = sorted(FAULTS)
    first = rng.randrange(len(faults))  # five cases take every fault once
    for k in range(per_class):
        shape = {"steps": rng.randrange(2000, 4001, 250), "width": rng.choice((2, 4, 8)),
                 "adds": rng.choice((2, 3)), "interpreter": rng.choice(("main", "py39")),
                 "seed": rng.randrange(1 << 16)}
        out.append(Case("profiled_memory", "fits", k, pool="120MiB", **shape))
        out.append(Case("profiled_memory", "small_pool", k, pool="32MiB", **shape))
        out.append(Case("profiled_memory", "allocates", k, pool="200MiB",
                        alloc_mib=rng.choice((256, 320, 384)), **shape))
        fault = faults[(first + k) % len(faults)]
        width = rng.choice((32, 64, 128))
        seed_k = rng.randrange(1 << 16)
        for variant in ("dies", "reference_dies", "reference_pinned", "healthy"):
            out.append(Case("crashing_candidate", variant, k, mlp_width=width, seed=seed_k,
                            fault=None if variant == "healthy" else fault))
    return out


def expected(case: Case) -> Expected:
    """The case's expected end, from its construction (module docstring)."""
    if case.klass == "profiled_memory":
        data = case.steps * case.width * 4 * 2 + case.width * 8  # xs and ys, s0 and s_final
        assert data < MiB, case  # the construction's premise: the stage's own tensors are tiny
        if case.variant == "fits":
            return Expected(0, chosen="ort-cpu")
        if case.variant == "small_pool":
            return Expected(2, causes=("over_budget", "peak_over_budget"))
        return Expected(2, causes=("peak_over_budget",),
                        kept={"proof": "placed", "parity": "passed"})
    signal = FAULTS.get(case.fault or "")
    if case.variant == "dies":
        return Expected(0, chosen="ort-cpu", refused_first="ep_compile_failed", signal=signal,
                        possible_oom=signal == "SIGKILL")
    if case.variant in ("reference_dies", "reference_pinned"):
        return Expected(1)
    return Expected(0, chosen="ort-openvino")


def build(case: Case) -> ModelProto:
    """The case's graph: the Scan (with its allocation) or the MLP."""
    if case.klass == "crashing_candidate":
        return _mlp(case.mlp_width, case.seed)
    return _scan(case.steps, case.width, case.adds, with_alloc=case.variant == "allocates")


def inputs(case: Case) -> dict[str, np.ndarray]:
    """The case's inputs (seeded): the Scan's rows, and the allocation's size where it has one."""
    rng = np.random.default_rng(case.seed)
    if case.klass == "crashing_candidate":
        return {"x": rng.standard_normal((4, case.mlp_width)).astype(np.float32)}
    feeds = {"s0": rng.standard_normal(case.width).astype(np.float32),
             "xs": rng.standard_normal((case.steps, case.width)).astype(np.float32)}
    if case.variant == "allocates":
        feeds["n"] = np.array([case.alloc_mib * MiB // 4], np.int64)
    return feeds


def _scan(steps: int, width: int, adds: int, *, with_alloc: bool) -> ModelProto:
    f = TensorProto.FLOAT
    nodes, prev = [], "s_in"
    for k in range(adds):
        out = "s_out" if k == adds - 1 else f"t{k}"
        nodes.append(helper.make_node("Add", [prev, "x_t"], [out], name=f"add{k}"))
        prev = out
    nodes.append(helper.make_node("Identity", ["s_out"], ["y_t"], name="copy"))
    body = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("s_in", f, [width]),
                                             helper.make_tensor_value_info("x_t", f, [width])],
                             [helper.make_tensor_value_info("s_out", f, [width]),
                              helper.make_tensor_value_info("y_t", f, [width])])
    top = [helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], name="scan",
                            num_scan_inputs=1, body=body)]
    ins = [helper.make_tensor_value_info("s0", f, [width]),
           helper.make_tensor_value_info("xs", f, [steps, width])]
    outs = [helper.make_tensor_value_info("s_final", f, [width]),
            helper.make_tensor_value_info("ys", f, [steps, width])]
    if with_alloc:
        top += [helper.make_node("ConstantOfShape", ["n"], ["big"], name="alloc",
                                 value=helper.make_tensor("v", f, [1], [1.0])),
                # the max of ones: exact on every onnxruntime (a float32 sum of 2^26 ones is not)
                helper.make_node("ReduceMax", ["big"], ["total"], name="total", keepdims=0)]
        ins.append(helper.make_tensor_value_info("n", TensorProto.INT64, [1]))
        outs.append(helper.make_tensor_value_info("total", f, []))
    graph = helper.make_graph(top, "scan", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _mlp(width: int, seed: int) -> ModelProto:
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width))
                                     .astype(np.float32), f"w{k}") for k in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm0"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="mm1")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", f, [4, width])],
                              [helper.make_tensor_value_info("y", f, [4, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
