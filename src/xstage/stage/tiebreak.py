"""The numeric gate's float64 tie-break: the graph evaluated exactly enough to say who is right.

When the fp32 comparison fails on float criteria alone, the stage and the fp32 reference may
both be right to fp32's precision and still disagree (a deep graph's reordered sums, an
ill-conditioned output, a sigmoid map near zero). This module evaluates the *reference* graph
(the fp32 source, a ``--reference`` file, or the artifact only where it is its own reference:
:func:`reference_graph`; never the artifact under test when they differ, or a stage that
negates the reference's outputs is "as right as" its own float64 answer) in float64 with onnx's
``ReferenceEvaluator`` (every float initializer, input, constant and cast
widened to double; Conv, ConvTranspose and Softmax computed by BLAS-backed kernels, Erf and
Gelu exactly, :mod:`xstage.stage.f64_kernels`) and hands the answer to
:func:`xstage.parity.settle_tiebreak`, which passes the stage only when it is no further from
float64 than the reference is.

Why not onnxruntime on a double-widened graph: its CPU EP has no double kernel for Conv,
ConvTranspose, Erf, Gelu, Resize, AveragePool, GlobalAveragePool, InstanceNormalization,
LeakyRelu, PRelu and 61 more ops (71 of 198, read from its kernel registry by
``python benchmarks/tiebreak.py --kernels``), so no convolutional graph and no exact-Gelu
transformer here would load; on the MatMul graphs it can load, ReferenceEvaluator's products
are already BLAS.

:func:`evaluate_float64` is a function of a file path and input arrays that returns arrays,
with no state shared with its caller, so it runs in a child process of the client's own
interpreter (:func:`evaluate_in_child`, what ``open_stage`` does by default): the float64 copy
of the graph (three times its bytes) is never held by the caller's process, and the ONNX
reference arm charges the child to the ledger's host pool while it runs
(:func:`child_reservations`, ``xstage.stage.reference``). With ``reference_arm="in_process"``
(and for a caller of :func:`settle` without a worker arm) it runs in the caller's process.

The tie-break is ``unavailable`` (the fp32 verdict stands, the record says why, with a
``reason_code`` of :data:`xstage.parity.TIEBREAK_UNAVAILABLE`) when:

* a node (in a subgraph too) resolves, at the graph's opset, to a (domain, op, since_version)
  outside the evaluator's checked table (:mod:`xstage.stage.f64_table`): its answer there has
  not been checked against onnxruntime's fp32 kernel at that version;
* a failed output has no position where the float64 answer, the stage and the reference are
  all finite (:func:`xstage.parity.settle_tiebreak`);
* a torch program (evaluated in a ``torch-cpu`` worker: parameters, buffers, constants, the
  dtypes its graph names and its inputs widened to float64, see
  ``xstage_remote.torch_runtime``) cannot run there: torch-cpu is missing, the program computes
  a narrower float somewhere the widening cannot reach (the worker names the op), or the load
  or the call passes :data:`TIME_LIMIT_S`;
* its float64 copy would not fit: :data:`MEMORY_FACTOR` times the graph's bytes must be at
  most half of the memory available when it starts (:func:`memory_check`);
* the evaluation passes :data:`TIME_LIMIT_S` (checked between nodes);
* ``ReferenceEvaluator`` cannot run the graph (an op it does not implement, a custom domain),
  or an output does not come back as float64.

Where it is ``unavailable`` for an fp32 stage whose comparison failed at the tight tier
(rule 8's ``a`` = 1e-7, which the caller did not name), the verdict is the comparison at the
*noise tier* (:func:`xstage.parity.at_noise_tier`, ``a`` = 1e-5, the measured fp32 reorder
bound): a deep fp32 stage on another EP is not refused for ordinary reordering because its
arbiter could not run. The record's ``parity.tier`` says so, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xstage import parity

__all__ = [  # and EVALUATOR, computed on first use (``__getattr__``)
    "CHILD_BASE_BYTES", "CHILD_GRACE_S", "MEMORY_FACTOR", "MEMORY_SHARE", "TIME_LIMIT_S",
    "Unavailable", "child_main", "child_reservations", "evaluate_float64", "evaluate_in_child",
    "memory_check", "reference_graph", "settle",
]

#: The memory the float64 evaluation holds, in multiples of the graph's bytes: the loaded fp32
#: protobuf (1x) and its initializers widened to float64 (2x); activations come on top.
MEMORY_FACTOR = 3

#: The share of the memory available at the tie-break's start that its estimate may take.
MEMORY_SHARE = 0.5

#: The longest the evaluation may run. Measured here, with the BLAS kernels, on the 2-core VM
#: at load 9-10: PP-OCR det v4 (a 640x640 image) 11 s (18 s before them), PP-OCR rec 3 s, the
#: built-ins under 1 s, a 12-block Qwen3.5 vision tower (512 wide, 183 MiB) 17 s at 196
#: patches and 62 s at 1024. 120 s is the bound, and a graph that passes it is ``unavailable``.
TIME_LIMIT_S = 120.0

#: What the tie-break's child holds besides the graph: the interpreter with xstage, numpy, onnx
#: and onnx.reference imported. Measured 2026-12-06 on the 2-vCPU dev VM (CPython 3.11.7, numpy
#: 2.4.6, onnx 1.23.2): 110 MiB VmHWM evaluating the built-in MLP (a 6 MiB graph, whose
#: MEMORY_FACTOR share is 18 MiB of it), so 92 MiB; rounded up.
CHILD_BASE_BYTES = 96 << 20

#: Seconds the child may take beyond :data:`TIME_LIMIT_S` (start-up, loading and widening the
#: graph, writing its outputs) before it is killed; its evaluation checks the limit itself.
CHILD_GRACE_S = 60.0

_FLOATS = {1, 10, 16}  # FLOAT, FLOAT16, BFLOAT16
_DOUBLE = 11


class Unavailable(Exception):  # noqa: N818 - a state, not an error: the record says "unavailable"
    """The float64 evaluation cannot run or did not finish; ``str()`` is the reason.

    ``code`` is one of :data:`xstage.parity.TIEBREAK_UNAVAILABLE` (the record's ``reason_code``).
    """

    def __init__(self, reason: str, code: str = "evaluator_failed") -> None:
        """Keep ``reason`` as the message and ``code`` beside it."""
        super().__init__(reason)
        self.code = code


_TORCH_EVALUATOR = "torch-cpu, the program widened to float64"


def _evaluator() -> str:
    """How the record names the ONNX path (a torch program's is ``_TORCH_EVALUATOR``).

    Built when asked: ``f64_kernels`` imports ``onnx.reference``, ~0.5 s that every
    ``import xstage`` (``xstage --version`` too) paid at start-up.
    """
    from xstage.stage import f64_kernels

    return ("onnx.reference.ReferenceEvaluator (float64), xstage.stage.f64_kernels for "
            + ", ".join(k.__name__ for k in f64_kernels.KERNELS))


def __getattr__(name: str) -> Any:
    """``EVALUATOR``: :func:`_evaluator`'s text (module attribute, computed on first use)."""
    if name == "EVALUATOR":
        return _evaluator()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def memory_check(graph_bytes: int, available: int | None = None) -> None:
    """The float64 evaluation's memory estimate against what is available now.

    Args:
        graph_bytes: the artifact's bytes (graph and sidecars).
        available: the available memory in bytes (default: psutil's reading now).

    Raises:
        Unavailable: the estimate is over :data:`MEMORY_SHARE` of the available memory.
    """
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    needed = MEMORY_FACTOR * int(graph_bytes)
    if needed > MEMORY_SHARE * available:
        raise Unavailable(
            f"its float64 copy needs ~{needed / 2**20:.0f} MiB ({MEMORY_FACTOR}x the graph's "
            f"{graph_bytes / 2**20:.0f} MiB), over {MEMORY_SHARE:.0%} of the "
            f"{available / 2**20:.0f} MiB available", "memory")


def _widen_tensor(tensor: Any) -> None:
    from onnx import numpy_helper

    if tensor.data_type in _FLOATS:
        wide = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
        tensor.CopyFrom(wide)


def _widen_graph(graph: Any) -> None:
    """Every float in ``graph`` (and its subgraphs) to double, in place.

    LayerNormalization's ``stash_type`` stays as it is: ReferenceEvaluator implements only
    stash_type 1, and computes it in the input's precision (float64 here); widening it made
    every graph with a LayerNormalization ``unavailable``.
    """
    from onnx import AttributeProto

    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type in _FLOATS:
            value.type.tensor_type.elem_type = _DOUBLE
    del graph.value_info[:]  # stale intermediate types; the evaluator does not need them
    for init in graph.initializer:
        _widen_tensor(init)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                _widen_tensor(attr.t)
            elif attr.type == AttributeProto.GRAPH:
                _widen_graph(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _widen_graph(sub)
            elif node.op_type == "Cast" and attr.name == "to" and attr.i in _FLOATS:
                attr.i = _DOUBLE
        if node.op_type == "Constant":
            for attr in list(node.attribute):
                if attr.name in ("value_float", "value_floats"):
                    values = [attr.f] if attr.name == "value_float" else list(attr.floats)
                    array = np.array(values if attr.name == "value_floats" else values[0], np.float64)
                    from onnx import helper, numpy_helper

                    node.attribute.remove(attr)
                    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array)))


def _inference_batch_norm() -> type:
    """BatchNormalization with one output, as inference computes it (running statistics).

    ReferenceEvaluator's opset 9-13 kernel uses the batch's own statistics whenever
    ``momentum`` is set, and fills it from the schema's default, so every inference BN of an
    opset-11 graph came out wrong (PP-OCR cls: 1.6 off at the first one). The spec's one-output
    form is the test mode; this kernel computes it, in the input's precision.
    """
    from onnx.reference.op_run import OpRun

    class BatchNormalization(OpRun):  # type: ignore[misc]
        op_domain = ""

        def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None,  # type: ignore[no-untyped-def]
                 training_mode=None, **_unused):
            shape = (-1,) + (1,) * (x.ndim - 2)
            eps = 1e-5 if epsilon is None else epsilon
            y = scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) \
                + bias.reshape(shape)
            return (y.astype(x.dtype),)

    return BatchNormalization


def evaluate_float64(path: Path, feeds: Mapping[str, np.ndarray], *, graph_bytes: int | None = None,
                     time_limit_s: float = TIME_LIMIT_S,
                     available: int | None = None) -> dict[str, np.ndarray]:
    """The ONNX graph at ``path`` evaluated in float64 on ``feeds`` (float feeds widened).

    ``graph_bytes`` is the graph's size with its sidecar files (default: read from the graph);
    ``available`` the memory available (default: read now, :func:`memory_check`). A function of
    its arguments alone (no state shared with the caller), so it can run in a child process.

    Raises:
        Unavailable: the float64 copy would not fit, a node is outside the checked table or
            cannot be evaluated, the time limit passed, or an output did not come back as
            float64 (the message says which; ``code`` says which kind).
    """
    import onnx
    from onnx.reference import ReferenceEvaluator

    from xstage.stage import f64_kernels

    memory_check(_graph_bytes(path) if graph_bytes is None else graph_bytes, available)
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise Unavailable(f"onnx cannot load the graph: {type(exc).__name__}: {str(exc)[:300]}") from exc
    _require_checked(model)
    try:
        _widen_graph(model.graph)
        evaluator = ReferenceEvaluator(model, new_ops=[_inference_batch_norm(), *f64_kernels.KERNELS])
    except Exception as exc:  # an op or a domain the evaluator does not know
        raise Unavailable(f"onnx's ReferenceEvaluator cannot load the graph in float64: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    deadline = time.monotonic() + time_limit_s
    for op in getattr(evaluator, "rt_nodes_", []):
        _deadline(op, deadline, time_limit_s)
    wide = {n: (a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a)
            for n, a in feeds.items()}
    try:
        values = evaluator.run(None, wide)
    except Unavailable:
        raise
    except Exception as exc:
        raise Unavailable(f"onnx's ReferenceEvaluator cannot run the graph in float64: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    names = [o.name for o in model.graph.output]
    out = {n: np.asarray(v) for n, v in zip(names, values, strict=True)}
    narrow = [n for n, v in out.items() if v.dtype.kind == "f" and v.dtype != np.float64]
    if narrow:
        raise Unavailable(f"the float64 evaluation returned {out[narrow[0]].dtype} for "
                          f"{narrow[0]} (an op computes in its own precision)")
    return out


def _deadline(op: Any, deadline: float, limit: float) -> None:
    """Make ``op.run`` raise :class:`Unavailable` once ``deadline`` has passed."""
    run = op.run

    def checked(*args: Any, **kwargs: Any) -> Any:
        if time.monotonic() > deadline:
            raise Unavailable(f"the float64 evaluation passed its {limit:g} s limit", "time_limit")
        return run(*args, **kwargs)

    op.run = checked


def child_reservations(graph_bytes: int) -> list[Any]:
    """What the tie-break's child holds in the host pool: its interpreter and the float64 copy.

    Both estimates (``E``): :data:`CHILD_BASE_BYTES`, and :data:`MEMORY_FACTOR` times the graph's
    bytes (the memory check's own figure); lifetime ``request``: held while the child runs.
    """
    from xstage.ledger import HOST_POOL, Reservation

    return [
        Reservation("runtime", CHILD_BASE_BYTES, HOST_POOL, "request", "E",
                    "the tie-break's child: this interpreter with numpy, onnx and onnx.reference"),
        Reservation("float64 copy", MEMORY_FACTOR * int(graph_bytes), HOST_POOL, "request", "E",
                    f"{MEMORY_FACTOR}x the reference graph's bytes: the parsed fp32 graph and its "
                    "initializers widened to float64"),
    ]


def evaluate_in_child(path: Path, feeds: Mapping[str, np.ndarray], *, graph_bytes: int,
                      time_limit_s: float = TIME_LIMIT_S) -> dict[str, np.ndarray]:
    """:func:`evaluate_float64` in a child process of this interpreter; the same answer.

    The inputs and outputs travel as ``.npz`` files in a private temporary folder (read back
    with ``allow_pickle=False``), the child's reason for ``unavailable`` as JSON. The child is
    killed :data:`CHILD_GRACE_S` after ``time_limit_s``.

    Raises:
        Unavailable: as :func:`evaluate_float64`, and where the child died or was killed at its
            deadline (the message gives its exit status and last log line).
    """
    import json
    import shutil
    import tempfile

    from xstage.client.child import run_function

    memory_check(graph_bytes)  # before a process starts for nothing
    folder = Path(tempfile.mkdtemp(prefix="xstage-f64-"))
    try:
        np.savez(folder / "feeds.npz", **{n: np.ascontiguousarray(a) for n, a in feeds.items()})
        (folder / "request.json").write_text(json.dumps({
            "path": str(path), "graph_bytes": int(graph_bytes), "time_limit_s": time_limit_s,
            "dtypes": {n: np.asarray(a).dtype.name for n, a in feeds.items()}}))
        done = run_function(__name__, "child_main", [str(folder)], folder=folder,
                          timeout_s=time_limit_s + CHILD_GRACE_S)
        why = folder / "unavailable.json"
        if why.is_file():
            doc = json.loads(why.read_text())
            raise Unavailable(str(doc["reason"]), str(doc["code"]))
        out = folder / "outputs.npz"
        if done.returncode == 0 and out.is_file():
            with np.load(out, allow_pickle=False) as data:
                names = json.loads((folder / "outputs.json").read_text())
                return {n: np.array(data[f"o{i}"]) for i, n in enumerate(names)}
        if done.timed_out:
            raise Unavailable(f"the float64 evaluation passed its {time_limit_s:g} s limit "
                              f"(its process was killed {CHILD_GRACE_S:g} s after it)", "time_limit")
        last = done.log_tail.splitlines()[-1:] or ["no output"]
        killed = " (SIGKILL: possibly the out-of-memory killer)" if done.returncode == -9 else ""
        raise Unavailable(f"the float64 evaluation's process ended with status {done.returncode}"
                          f"{killed}: {last[0][:300]}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def child_main(argv: list[str]) -> int:
    """The child's side of :func:`evaluate_in_child` (``argv``: its folder): read, evaluate, write."""
    import json

    folder = Path(argv[0])
    request = json.loads((folder / "request.json").read_text())
    with np.load(folder / "feeds.npz", allow_pickle=False) as data:
        feeds = {n: np.array(data[n]) for n in data.files}
    for name, dtype in request["dtypes"].items():
        if feeds[name].dtype.name != dtype:  # bfloat16 and friends: saved as raw void
            import ml_dtypes  # noqa: F401 - registers the dtype's name with numpy

            feeds[name] = feeds[name].view(np.dtype(dtype))
    try:
        out = evaluate_float64(Path(request["path"]), feeds, graph_bytes=request["graph_bytes"],
                               time_limit_s=request["time_limit_s"])
    except Unavailable as exc:
        (folder / "unavailable.json").write_text(json.dumps({"reason": str(exc), "code": exc.code}))
        return 0
    (folder / "outputs.json").write_text(json.dumps(list(out)))
    np.savez(folder / "outputs.npz", **{f"o{i}": v for i, v in enumerate(out.values())})
    return 0


def _torch_float64(arm: Any, path: Path, graph_bytes: int,
                   feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The torch program at ``path`` evaluated in float64 by the reference arm's torch-cpu worker.

    Raises:
        Unavailable: no torch arm, torch-cpu missing, or the worker could not run the program
            in float64 (the message says why).
    """
    from xstage import errors

    if arm is None or not hasattr(arm, "float64_outputs"):
        raise Unavailable("the float64 evaluation of a torch program needs the torch-cpu "
                          "reference arm, which this comparison does not have", "torch_unavailable")
    memory_check(graph_bytes)
    try:
        return dict(arm.float64_outputs(path, feeds, TIME_LIMIT_S))
    except (errors.CallTimeout, errors.WarmupTimeout) as exc:
        raise Unavailable(f"the float64 evaluation passed its {TIME_LIMIT_S:g} s limit",
                          "time_limit") from exc
    except errors.WorkerRaised as exc:
        raise Unavailable(f"torch-cpu cannot run the program in float64: {exc.message[:300]}") from exc
    except errors.XstageError as exc:
        raise Unavailable(f"torch-cpu cannot run the program in float64: {str(exc)[:300]}",
                          "torch_unavailable" if isinstance(exc, errors.RouteMissing)
                          else "evaluator_failed") from exc


def _graph_bytes(path: Path) -> int:
    """``path``'s bytes with the external-data files its initializers name (for the memory check)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    total = path.stat().st_size
    if path.suffix != ".onnx":
        return total
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # the evaluation itself says why it cannot load the graph
        return total
    files = {next((e.value for e in t.external_data if e.key == "location"), "")
             for t in graph.initializer if uses_external_data(t)}
    for name in files - {""}:
        sidecar = path.parent / name
        total += sidecar.stat().st_size if sidecar.is_file() else 0
    return total


def _require_checked(model: Any) -> None:
    """Every node of ``model`` in the evaluator's checked table (:mod:`xstage.stage.f64_table`).

    Raises:
        Unavailable: a node (in a subgraph too) resolves to a row outside the table; the
            message names the first few.
    """
    from xstage.stage import f64_table

    outside = f64_table.unchecked(model)
    if outside:
        more = f" and {len(outside) - 3} more" if len(outside) > 3 else ""
        raise Unavailable(f"the float64 evaluator has not been checked on {', '.join(outside[:3])}"
                          f"{more} (at the graph's opset; xstage.stage.f64_table lists what it has)",
                          "unchecked_op")


def reference_graph(artifact: Any, arm: Any) -> tuple[Path, int, str]:
    """The graph the tie-break evaluates: (path, bytes, what it is for the record).

    The reference arm's graph (the fp32 source, a ``--reference`` file, or the artifact itself
    where it is its own reference), never the artifact under test when they differ; with no arm
    (a caller of :func:`settle` without one), the artifact, which is then its own reference.
    """
    own = Path(artifact.path)
    path = Path(getattr(arm, "path", None) or own)
    kind = str(getattr(arm, "kind", "same_graph_cpu"))
    if path.resolve() == own.resolve():
        return own, int(artifact.bytes), kind
    return path, _graph_bytes(path), kind


def settle(gate: parity.Parity, artifact: Any, feeds: Mapping[str, np.ndarray],
           outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
           arm: Any = None) -> parity.Parity:
    """A failed gate, decided again by the reference graph's float64 answer where that can change it.

    Args:
        gate: the fp32 comparison's failed verdict.
        artifact: the stage's :class:`~xstage.artifact.Artifact`.
        feeds: the inputs the warm-up ran on.
        outputs: the stage's outputs.
        reference: the reference arm's outputs.
        arm: the reference arm (:mod:`xstage.stage.reference`): its graph (``path``) is the one
            evaluated (:func:`reference_graph`); a torch program is evaluated in float64 by its
            ``float64_outputs``, an ONNX graph by its ``exact_outputs`` (a child process, charged
            to the ledger) where it has one, else in this process.

    Returns:
        The gate, passed or still failed, with its ``tiebreak`` recorded (``unavailable``
        with the reason where it could not run, and then, for fp32 at the tight tier, decided
        at the noise tier); unchanged where the tie-break does not apply.
    """
    if parity.tiebreak_applies(gate) is not None:
        return gate
    torch = artifact.runtime == "torch"
    path, size, kind = reference_graph(artifact, arm)
    evaluator = _TORCH_EVALUATOR if torch else _evaluator()
    facts = {"evaluator": evaluator, "graph": {"kind": kind, "name": path.name}}
    started = time.monotonic()
    try:
        if torch:
            exact = _torch_float64(arm, path, size, feeds)
        elif hasattr(arm, "exact_outputs"):  # the worker arm: a child, charged to its ledger
            exact = arm.exact_outputs(path, feeds, size)
        else:  # in-process (``reference_arm="in_process"``, or no arm)
            exact = evaluate_float64(path, feeds, graph_bytes=size)
    except Unavailable as exc:
        settled = parity.tiebreak_unavailable(gate, str(exc), reason_code=exc.code,
                                              limit_s=TIME_LIMIT_S, **facts,
                                              seconds=round(time.monotonic() - started, 3))
    else:
        settled = parity.settle_tiebreak(gate, outputs, reference, exact, **facts,
                                         seconds=round(time.monotonic() - started, 3))
    return _noise_tier(settled, outputs, reference)


def settle_stateful(gate: parity.Parity, outputs: Mapping[str, np.ndarray],
                    reference: Mapping[str, np.ndarray]) -> parity.Parity:
    """A failed gate of a stateful stage, decided at fp32's noise tier where that applies.

    The tie-break is ``unavailable`` (the float64 evaluation runs one call; the gate compares
    two, the second on the state the first left), so fp32 at the tight tier is decided at the
    noise tier, as for any unavailable tie-break.

    ``outputs`` and ``reference``: both calls' outputs, named as the gate named them.
    """
    if parity.tiebreak_applies(gate) is not None:
        return gate
    settled = parity.tiebreak_unavailable(
        gate, "a stateful stage: the float64 evaluation does not carry state between the "
        "gate's two calls", reason_code="stateful")
    return _noise_tier(settled, outputs, reference)


def _noise_tier(gate: parity.Parity, outputs: Mapping[str, np.ndarray],
                reference: Mapping[str, np.ndarray]) -> parity.Parity:
    """The tier choice: the noise tier decides where the tie-break was unavailable."""
    tb = gate.tiebreak or {}
    if tb.get("status") != "unavailable" or parity.noise_tier_applies(gate) is not None:
        return gate
    return parity.at_noise_tier(gate, outputs, reference,
                                f"the float64 tie-break was unavailable: {tb.get('reason')}")

