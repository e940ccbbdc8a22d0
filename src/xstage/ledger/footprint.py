"""What a stage will hold in its pool, before it is loaded: the ledger's reservations.

Each number says how it is known. The artifact's bytes are read from the files (``D``). The
rest are estimates (``E``) whose constants were measured on this project's machines and are
written down beside them with the measurement, so a reader can redo it: a route's runtime
(what its worker holds with the runtime loaded and a trivial graph), the copies a runtime
makes of the weights (a multiple of the artifact), the parsed model held while a session is
built, the activations (from shape inference at the inputs' real shapes), and the call's own
tensors. ``ledger.make_budget`` turns them into a budget.

Calibration (2026-11-29, the 2-vCPU dev VM; CPython 3.11, numpy 2.x, peaks are the worker's
own ``VmHWM``): each route's ``RouteCost`` sits on its spec (``xstage.routes.specs``), and
``ACTIVATION_FACTOR`` here; the full table is in docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xstage.artifact import Artifact
from xstage.ledger import Reservation, format_bytes

__all__ = ["ACTIVATION_FACTOR", "PT_ACTIVATION_BYTES", "Activations", "RouteCost",
           "estimate_activations", "reservations"]

MiB = 1 << 20


@dataclass(frozen=True)
class RouteCost:
    """A route's own memory: its worker with the runtime loaded, and its copies of weights.

    Each route's spec carries its own (``RouteSpec.cost``; ``memory_cost()`` picks one).
    """

    base_bytes: int
    weights_factor: float  # resident weight bytes per artifact byte, steady state
    basis: str
    measured: bool  # False: no device here to measure it on; an estimate from documentation


#: Activations held per byte of the liveness peak. Measured: PP-OCRv4 det at 1x3x640x640 has
#: a liveness peak of 42 MiB and its ort-cpu worker settles 127 MiB above weights and runtime
#: (the first run allocates from an arena that grows by powers of two; from the second run
#: onnxruntime's memory pattern adds one planned block for all intermediates); on
#: ort-openvino the same graph settles ~77 MiB above.
ACTIVATION_FACTOR = 3.0
#: A ``.pt2`` program's activations before anything about it is measured: a constant
#: on top of its manifest's I/O. Not calibrated yet (no torch route runs
#: here); the measured check after the warm-up is what holds it to account.
PT_ACTIVATION_BYTES = 64 * MiB
#: The call's inputs and outputs are held twice: in the shared region's slots (or the frame
#: on the inline path) and in the runtime's own buffers.
IO_FACTOR = 2


@dataclass(frozen=True)
class Activations:
    """Shape inference's view of a graph's intermediates at the inputs' real shapes."""

    live_peak_bytes: int  # the most bytes alive at once, walking nodes in order
    sized: int  # intermediates whose size shape inference could tell
    unsized: int  # ... and those it could not (data-dependent shapes, subgraphs' values)
    io_bytes: int  # inputs + outputs
    note: str | None = None  # why there is no estimate, when there is none


def estimate_activations(path: Path, shapes: Mapping[str, tuple[int, ...]]) -> Activations:
    """Liveness over the graph's nodes in order: each output is allocated when produced and
    freed after its last consumer; graph inputs, outputs and initializers are not counted as
    intermediates. Sizes come from ``onnx.shape_inference`` with the inputs fixed to
    ``shapes``; a value it cannot size counts zero and is reported as unsized.
    """
    import onnx
    from onnx import helper, shape_inference

    try:
        model = onnx.load(str(path), load_external_data=False)
        for value in model.graph.input:
            shape = shapes.get(value.name)
            if shape is None or not value.type.tensor_type.HasField("shape"):
                continue
            dims = value.type.tensor_type.shape.dim
            if len(dims) == len(shape):
                for d, n in zip(dims, shape, strict=True):
                    d.ClearField("dim_param")
                    d.dim_value = int(n)
        model = shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "no estimate", said so
        return Activations(0, 0, 0, 0, note=f"shape inference failed: {str(exc)[:160]}")

    size: dict[str, int] = {}
    graph = model.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        t = value.type.tensor_type
        if not t.HasField("shape") or not t.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if any(d is None for d in dims):
            continue
        try:
            item = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        size[value.name] = int(np.prod(dims, dtype=np.int64)) * item

    outside = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    last_use: dict[str, int] = {}
    for k, node in enumerate(graph.node):
        for name in node.input:
            last_use[name] = k
    live = peak = 0
    sized = unsized = 0
    for k, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in size:
                live += size[name]
                sized += 1
            else:
                unsized += 1
        peak = max(peak, live)
        for name in set(node.input):
            if (name and last_use.get(name) == k and name in size and name not in outside
                    and name not in outputs):
                live -= size[name]
    io = sum(size.get(i.name, 0) for i in graph.input if i.name not in
             {init.name for init in graph.initializer})
    io += sum(size.get(o.name, 0) for o in graph.output)
    return Activations(peak, sized, unsized, io)


def reservations(artifact: Artifact, cost: RouteCost, pool: str,
                 shapes: Mapping[str, tuple[int, ...]], *, route: str) -> list[Reservation]:
    """The stage's reservations in ``pool`` when ``route`` runs it at input ``shapes``; ``cost``
    is the route's own (``RouteSpec.memory_cost``), ``route`` names it in the bases."""
    files = ", ".join(f"{Path(f['path']).name} {format_bytes(f['bytes'])}" for f in artifact.files)
    out = [
        Reservation("runtime", cost.base_bytes, pool, "session", "E",
                    f"{route}: {cost.basis}"),
        Reservation("weights", artifact.bytes, pool, "session", "D",
                    f"the artifact on disk: {files or artifact.path.name}"),
    ]
    copies = int(artifact.bytes * max(cost.weights_factor - 1.0, 0.0))
    if copies:
        out.append(Reservation("weight copies", copies, pool, "session", "E",
                               f"{route} keeps {cost.weights_factor:.1f}x the artifact resident "
                               "(see runtime)"))
    graph_bytes = int(artifact.files[0]["bytes"]) if artifact.files else artifact.bytes
    sidecars = artifact.bytes - graph_bytes
    out.append(Reservation(
        "parsed model", graph_bytes, pool, "load", "E",
        "the runtime holds the parsed graph file while it builds the session"
        + (f" (its {format_bytes(sidecars)} of external data is read straight into the "
           "weights, not into the parsed graph)" if sidecars else "")))
    if artifact.format.startswith("onnx"):
        act = estimate_activations(artifact.path, shapes)
        if act.note:
            basis = f"no estimate: {act.note}"
        else:
            basis = (f"liveness peak {format_bytes(act.live_peak_bytes)} over {act.sized} "
                     f"intermediates sized by shape inference at the inputs' shapes"
                     f"{f' ({act.unsized} unsized, counted 0)' if act.unsized else ''}, "
                     f"x{ACTIVATION_FACTOR:g}: measured on PP-OCRv4 det (42 MiB live, 127 MiB held)")
        out.append(Reservation("activations", int(act.live_peak_bytes * ACTIVATION_FACTOR),
                               pool, "request", "E", basis))
        io_bytes = act.io_bytes
    else:  # a torch program: no graph to walk before it is loaded
        out.append(Reservation("activations", PT_ACTIVATION_BYTES, pool, "request", "E",
                               f"{artifact.format}: a constant ({format_bytes(PT_ACTIVATION_BYTES)}) "
                               "until the torch routes calibrate one; the I/O comes from the "
                               "manifest's spec"))
        io_bytes = 0
    if not io_bytes:
        io_bytes = _declared_io(artifact, shapes)
    out.append(Reservation("call tensors", io_bytes * IO_FACTOR, pool, "request", "E",
                           f"inputs + outputs {format_bytes(io_bytes)}, x{IO_FACTOR}: the shared "
                           "region's slots and the runtime's buffers"))
    return out


def _declared_io(artifact: Artifact, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Inputs and outputs at their given or declared shapes; a symbolic one counts 0."""
    total = 0
    for spec in (*artifact.inputs, *artifact.outputs):
        dims: Any = shapes.get(spec.name) or spec.shape
        if all(isinstance(d, int) and d >= 0 for d in dims):
            total += int(np.prod(dims, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    return total
