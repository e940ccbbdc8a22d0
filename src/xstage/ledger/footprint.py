"""What a stage will hold in its pool, before it is loaded: the ledger's reservations.

Each number says how it is known. The artifact's bytes are read from the files (``D``). The
rest are estimates (``E``) whose constants were measured on this project's machines and are
written down beside them with the measurement, so a reader can redo it: a route's runtime
(what its worker holds with the runtime loaded and a trivial graph), the copies a runtime
makes of the weights (a multiple of the artifact), the parsed model held while a session is
built, the activations (from shape inference at the inputs' real shapes), and the call's own
tensors. ``ledger.make_budget`` turns them into a budget.

Pure arithmetic: the graph is read, and its shapes inferred, by ``xstage.artifact``
(``Artifact.graph_facts``); this module only walks the facts it returns.

Calibration (2026-11-29, the 2-vCPU dev VM; CPython 3.11, numpy 2.x, peaks are the worker's
own ``VmHWM``): see each route spec's ``cost`` (``xstage.routes.specs``) and
``ACTIVATION_FACTOR``; the full table is in
docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage.ledger import HOST_POOL, Reservation, format_bytes

if TYPE_CHECKING:  # the artifact module reads files; the ledger only reads its facts
    from xstage.artifact import Artifact, GraphFacts

__all__ = ["ACTIVATION_FACTOR", "PT_ACTIVATION_BYTES", "PT_ACTIVATION_FACTOR",
           "REGION_PAGES_BYTES", "REGION_SLOT_BYTES", "DEVICE_SLOT_ALIGN", "device_slots",
           "pinned_region", "Activations", "QdqCost", "RouteCost",
           "estimate_activations", "reservations"]

MiB = 1 << 20


@dataclass(frozen=True)
class QdqCost:
    """What an A16W8 (QDQ) graph costs a route beyond the same graph in fp32.

    A constant (the runtime's quantized kernels or low-precision passes, loaded with the first
    QDQ graph) and a multiple of the graph's liveness peak (each activation lives as fp32, its
    16-bit Q and its DQ's fp32 again). Measured per route by ``scripts/a16w8_footprint.py`` on
    the quantized built-ins and third-party graphs (the table is in docs/memory.md).
    """

    base_bytes: int
    activation_factor: float  # bytes held per byte of the graph's liveness peak
    basis: str


@dataclass(frozen=True)
class RouteCost:
    """A route's own memory: its worker with the runtime loaded, and its copies of weights.

    Each route's spec carries its own (``RouteSpec.cost``; ``memory_cost()`` picks one).
    ``a16w8``: what an A16W8 graph costs it more (None: nothing measured, nothing added).
    """

    base_bytes: int
    weights_factor: float  # resident weight bytes per artifact byte, steady state
    basis: str
    measured: bool  # False: no device here to measure it on; an estimate from documentation
    a16w8: QdqCost | None = None


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
#: A ``.pt2`` program's activations held per byte of its exported graph's liveness peak: the
#: caching allocator rounds blocks up and keeps what it freed; cuBLAS and cuDNN workspaces
#: sit beside them (see ``_pt_activations``).
PT_ACTIVATION_FACTOR = 1.5
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


def estimate_activations(graph: GraphFacts) -> Activations:
    """Liveness over the graph's nodes in order: each output is allocated when produced and
    freed after its last consumer; graph inputs, outputs and initializers are not counted as
    intermediates. Sizes are the values' shapes as shape inference left them at the inputs'
    real shapes (``xstage.artifact.graph_facts``); a value it cannot size counts zero and is
    reported as unsized.
    """
    if graph.error is not None:
        return Activations(0, 0, 0, 0, note=f"shape inference failed: {graph.error[:160]}")
    size = _sizes(graph)
    outside = set(graph.inputs) | set(graph.initializers)
    outputs = set(graph.outputs)
    last_use: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[name] = k
    live = peak = 0
    sized = unsized = 0
    for k, node in enumerate(graph.nodes):
        for name in node.outputs:
            if not name:
                continue
            if name in size:
                live += size[name]
                sized += 1
            else:
                unsized += 1
        peak = max(peak, live)
        for name in set(node.inputs):
            if (name and last_use.get(name) == k and name in size and name not in outside
                    and name not in outputs):
                live -= size[name]
    initializers = set(graph.initializers)
    io = sum(size.get(name, 0) for name in graph.inputs if name not in initializers)
    io += sum(size.get(name, 0) for name in graph.outputs)
    return Activations(peak, sized, unsized, io)


def _sizes(graph: GraphFacts) -> dict[str, int]:
    """Bytes per value whose shape and element type shape inference could tell."""
    size: dict[str, int] = {}
    for value in graph.values:
        if value.shape is None or value.itemsize is None:
            continue
        dims = [d for d in value.shape if d is not None]
        if len(dims) != len(value.shape):  # a dimension shape inference could not tell
            continue
        size[value.name] = int(np.prod(dims, dtype=np.int64)) * value.itemsize
    return size


def reservations(artifact: Artifact, cost: RouteCost, pool: str,
                 shapes: Mapping[str, tuple[int, ...]], *, route: str,
                 graph_pool: bool = False) -> list[Reservation]:
    """The stage's reservations in ``pool`` when ``route`` runs it at input ``shapes``; ``cost``
    is the route's own (``RouteSpec.memory_cost``), ``route`` names it in the bases.

    ``graph_pool``: the worker serves from a captured CUDA graph, whose private pool keeps one
    call's intermediates and outputs for the stage's life, beside the caching allocator's
    (the eager warm-up's) — reserved as the activations and outputs once more.
    """
    files = ", ".join(f"{name} {format_bytes(f['bytes'])}"
                      for name, f in zip(artifact.file_names, artifact.files, strict=True))
    out = [
        Reservation("runtime", cost.base_bytes, pool, "session", "E",
                    f"{route}: {cost.basis}"),
        Reservation("weights", artifact.bytes, pool, "session", "D",
                    f"the artifact on disk: {files or artifact.file_name}"),
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
    if artifact.runtime == "onnxruntime":
        act = estimate_activations(artifact.graph_facts(shapes))
        if act.note:
            basis = f"no estimate: {act.note}"
        else:
            basis = (f"liveness peak {format_bytes(act.live_peak_bytes)} over {act.sized} "
                     f"intermediates sized by shape inference at the inputs' shapes"
                     f"{f' ({act.unsized} unsized, counted 0)' if act.unsized else ''}, "
                     f"x{ACTIVATION_FACTOR:g}: measured on PP-OCRv4 det (42 MiB live, 127 MiB held)")
        out.append(Reservation("activations", int(act.live_peak_bytes * ACTIVATION_FACTOR),
                               pool, "request", "E", basis))
        if artifact.format in ("onnx:a16w8", "onnx:a8w8") and cost.a16w8 is not None:
            # A8W8's 8-bit activations hold at most what A16W8's 16-bit ones do: the same cost
            out.append(_qdq_reservation(cost.a16w8, act, pool, route))
        io_bytes = act.io_bytes
    else:  # a torch program: its exported graph's tensors, read from the archive
        out.append(_pt_activations(artifact, pool))
        io_bytes = 0
    if not io_bytes:
        io_bytes = _declared_io(artifact, shapes)
    out.append(Reservation("call tensors", io_bytes * IO_FACTOR, pool, "request", "E",
                           f"inputs + outputs {format_bytes(io_bytes)}, x{IO_FACTOR}: the shared "
                           "region's slots and the runtime's buffers"))
    if graph_pool:
        held = next(r for r in out if r.purpose == "activations")
        out.append(Reservation(
            "cuda graph pool", held.bytes + io_bytes, pool, "session", "E",
            f"{route} serves from a captured CUDA graph: its private pool holds one call's "
            f"intermediates (the activations' {format_bytes(held.bytes)}) and its inputs and "
            f"outputs ({format_bytes(io_bytes)}) for the stage's life"))
    return out


def _qdq_reservation(qdq: QdqCost, act: Activations, pool: str, route: str) -> Reservation:
    """An A16W8 graph's cost on ``route`` beyond fp32's: ``qdq``'s constant + its factor x the
    liveness peak (``QdqCost``)."""
    held = qdq.base_bytes + int(act.live_peak_bytes * qdq.activation_factor)
    return Reservation(
        "a16w8 runtime", held, pool, "session", "E",
        f"{route} runs a QDQ graph: {format_bytes(qdq.base_bytes)} + "
        f"{qdq.activation_factor:g}x the liveness peak {format_bytes(act.live_peak_bytes)}: "
        f"{qdq.basis}")


#: The region's own bytes above its slots: the control page and the page the descriptors
#: round up to, then per slot and set its descriptor (272 bytes) and alignment (64)
#: (``xstage_remote.shm``'s layout).
REGION_PAGES_BYTES = 8 << 10
REGION_SLOT_BYTES = 512


def pinned_region(artifact: Artifact, shapes: Mapping[str, tuple[int, ...]], depth: int, *,
                  route: str) -> list[Reservation]:
    """The host RAM a worker page-locks for DMA: its shared region, ``depth`` slot sets of the
    stage's inputs and outputs (at ``shapes``, else as declared), in ``host_ram``.

    Page-locked memory cannot be swapped or given back while the stage lives, so it is held
    in the host's pool even when the stage's own budget is on a device.
    """
    io_bytes = _declared_io(artifact, shapes)
    slots = len(artifact.inputs) + len(artifact.outputs)
    extra = REGION_PAGES_BYTES + REGION_SLOT_BYTES * slots * depth
    return [Reservation(
        "pinned region", depth * io_bytes + extra, HOST_POOL, "session", "E",
        f"{route} registers its shared region with CUDA (page-locked host RAM): {depth} slot "
        f"set(s) x inputs + outputs {format_bytes(io_bytes)}, + {format_bytes(extra)} for its "
        f"control page, descriptors and alignment ({slots} slots per set)")]


#: Each device slot starts on this many bytes (``xstage_remote.device_slots.ALIGN``).
DEVICE_SLOT_ALIGN = 512


def device_slots(artifact: Artifact, shapes: Mapping[str, tuple[int, ...]], depth: int,
                 pool: str, *, route: str) -> Reservation:
    """The device memory a worker serving device tensors holds for its slots: ``depth`` sets of
    the stage's inputs and outputs (at ``shapes``, else as declared), each slot aligned, in the
    stage's device pool (``--ep-option device_tensors=on``)."""
    io_bytes = _declared_io(artifact, shapes)
    slots = len(artifact.inputs) + len(artifact.outputs)
    held = depth * (io_bytes + DEVICE_SLOT_ALIGN * slots)
    return Reservation(
        "device slots", held, pool, "session", "E",
        f"{route} keeps {depth} set(s) of device input and output slots for CUDA tensors in and "
        f"out (device_tensors=on): inputs + outputs {format_bytes(io_bytes)} a set, + "
        f"alignment ({slots} slots a set)")


def _pt_activations(artifact: Artifact, pool: str) -> Reservation:
    """A ``.pt2`` program's activations: the liveness peak over its exported graph's tensors
    (``Artifact.graph_facts``) x ``PT_ACTIVATION_FACTOR``, never under the constant
    ``PT_ACTIVATION_BYTES``; the constant alone when the archive gives no sizes."""
    act = estimate_activations(artifact.graph_facts({}))
    if act.note or not act.sized:
        why = act.note or "no tensor of its graph could be sized"
        return Reservation("activations", PT_ACTIVATION_BYTES, pool, "request", "E",
                           f"{artifact.format}: a constant ({format_bytes(PT_ACTIVATION_BYTES)}): "
                           f"{why}; the I/O comes from the manifest's spec")
    held = max(PT_ACTIVATION_BYTES, int(act.live_peak_bytes * PT_ACTIVATION_FACTOR))
    return Reservation(
        "activations", held, pool, "request", "E",
        f"liveness peak {format_bytes(act.live_peak_bytes)} over {act.sized} tensors of the "
        f"exported graph ({act.unsized} views or unsized, counted 0), x{PT_ACTIVATION_FACTOR:g}, "
        f"at least {format_bytes(PT_ACTIVATION_BYTES)}: measured on an H200 (conv 3-64-64 at "
        "8x224², 196 MiB live by this walk, held ~250 MiB eager and as much again in its CUDA "
        "graph's pool)")


def _declared_io(artifact: Artifact, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Inputs and outputs at their given or declared shapes; a symbolic one counts 0."""
    total = 0
    for spec in (*artifact.inputs, *artifact.outputs):
        dims: Any = shapes.get(spec.name) or spec.shape
        if all(isinstance(d, int) and d >= 0 for d in dims):
            total += int(np.prod(dims, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    return total
