"""The graph a bisect works on: one stable node order, its cuts, its regions as graphs.

* **Order.** The top-level nodes in one stable topological order: Kahn's algorithm that always
  takes the ready node first in the file, except that a node reading only initializers (a
  weight's ``DequantizeLinear``, a ``Constant``) goes just before its first consumer (so a graph
  already in order keeps it, but for its constants). A node that reads an outer value from
  inside its subgraphs (an ``If`` branch) depends on its producer.
* **Names.** Probes report the nodes the target left off by name; a node whose name is empty,
  repeated or outside the worker's safe set gets ``bisect_<index>`` (index in the file), so
  every name maps back to one position.
* **Cuts.** A region ``[start, stop)`` may begin or end at a cut: a position where every value
  that crosses it is a tensor of a dtype the wire carries. In a QDQ graph (``onnx:a16w8``) a
  cut is allowed only where every crossing value is the output of a ``QuantizeLinear`` (the
  region boundary falls between a Q and its DQ), so each region is a QDQ graph of the same
  format.
* **Capture.** The probe inputs are the values of one run of the whole graph on onnxruntime's
  CPU EP in this process, every top-level value kept (never random values fed into the middle
  of a graph).
* **Regions.** ``[start, stop)`` becomes a graph through onnx-ir's extractor
  (``onnx_ir.convenience.extract``), its inputs the values it reads from outside, its outputs
  the values read after it or that the graph returns; the graph's own inputs and outputs keep
  their declarations, the other boundary values are typed and shaped from the capture.

.. versionadded:: 0.3
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.bisect.cost import NodeCost, node_flops
from xstage_remote.wire import DTYPES

__all__ = ["BisectGraph", "Node", "capture", "load_graph"]

#: The worker's safe node-name set (``xstage_remote.onnx_names.SAFE_NAME``), checked here too.
_SAFE = re.compile(r"[A-Za-z0-9_.:/\-]{1,512}\Z")
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class Node:
    """One top-level node at its position in the order.

    ``reads`` are every value it reads, its subgraphs' outer values included; ``index`` is its
    place in the file.
    """

    position: int
    index: int
    name: str
    op_type: str
    reads: tuple[str, ...]
    outputs: tuple[str, ...]


def _subgraph_reads(graph: Any) -> set[str]:
    """The outer values a subgraph reads (names it uses and does not define), recursively."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                used |= _subgraph_reads(g)
        defined.update(n for n in node.output if n)
    return used - defined


def _reads(node: Any) -> tuple[str, ...]:
    outer: set[str] = set()
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            outer |= _subgraph_reads(g)
    direct = [n for n in node.input if n]
    return tuple(dict.fromkeys([*direct, *sorted(outer - set(direct))]))


def stable_order(nodes: Sequence[Any], outside: Iterable[str],
                 constants: Iterable[str] = ()) -> list[int]:
    """Indices of ``nodes`` in a stable topological order.

    Kahn's algorithm, the ready node first in the file first, except that a node reading only
    ``constants`` (initializers, or other such nodes' outputs: a weight's ``DequantizeLinear``,
    a ``Constant``) is placed just before its first consumer, so the values that cross a cut
    are activations, not weights.

    Raises:
        ArtifactError: the graph has a cycle, or reads a value nothing defines.
    """
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer[name] = i
    known = set(outside)
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        mine = set()
        for name in _reads(node):
            if name in producer and producer[name] != i:
                mine.add(producer[name])
            elif name not in known and name not in producer:
                raise errors.ArtifactError(
                    f"node {node.name or node.op_type} reads {name!r}, which no node, input or "
                    "initializer defines", remedy="check the graph with onnx.checker")
        deps.append(mine)
        for d in mine:
            users[d].append(i)
    const_values = set(constants)
    constant = [False] * len(nodes)
    for i, node in enumerate(nodes):  # the file is in order for all but broken graphs
        reads = _reads(node)
        constant[i] = not any(a.g.node or a.graphs for a in node.attribute) and all(
            n in const_values or (n in producer and constant[producer[n]] and producer[n] < i)
            for n in reads)
    key = list(range(len(nodes)))
    for i in reversed(range(len(nodes))):
        if constant[i] and users[i]:
            key[i] = min(key[u] for u in users[i])
    waiting = [len(d) for d in deps]
    ready = [(key[i], i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (key[u], u))
    if len(order) != len(nodes):
        raise errors.ArtifactError("the graph has a cycle: no topological order",
                                   remedy="check the graph with onnx.checker")
    return order


class BisectGraph:
    """A loaded ONNX graph in its stable order; see the module docstring.

    Attributes:
        path: the graph file.
        fmt: the artifact's format (``onnx:fp32``, ``onnx:a16w8``, …).
        model: the model with its node names made unique (``renamed`` counts the changes) and
            its nodes in the order.
        nodes: the top-level nodes in order.
        inputs: the graph's real inputs (initializers excluded).
        initializers: initializer name → element count.
        outputs: the graph's outputs.
    """

    def __init__(self, path: Path, fmt: str, model: Any) -> None:
        import onnx  # noqa: F401 - the model is an onnx.ModelProto

        self.path, self.fmt, self.model = path, fmt, model
        graph = model.graph
        self.initializers: dict[str, int] = {
            i.name: int(np.prod(i.dims, dtype=np.int64)) for i in graph.initializer}
        for sparse in graph.sparse_initializer:
            self.initializers[sparse.values.name] = int(np.prod(sparse.dims, dtype=np.int64))
        self.inputs = tuple(i.name for i in graph.input if i.name not in self.initializers)
        self.outputs = tuple(o.name for o in graph.output)
        self._declared = {v.name for v in (*graph.input, *graph.output)
                          if v.type.tensor_type.elem_type}
        self.renamed = _unique_names(graph)
        order = stable_order(list(graph.node), [*self.inputs, *self.initializers],
                             constants=self.initializers)
        self.nodes = tuple(
            Node(position=p, index=i, name=graph.node[i].name, op_type=graph.node[i].op_type,
                 reads=_reads(graph.node[i]), outputs=tuple(graph.node[i].output))
            for p, i in enumerate(order))
        ordered = [type(graph.node[i])() for i in order]
        for proto, i in zip(ordered, order, strict=True):
            proto.CopyFrom(graph.node[i])
        del graph.node[:]  # the model keeps the order too: onnx-ir's extractor follows it
        graph.node.extend(ordered)
        self.position = {node.name: node.position for node in self.nodes}
        #: A QDQ graph: regions cut only between a Q and its DQ.
        self.qdq = fmt == "onnx:a16w8" or any(n.op_type in _QDQ for n in self.nodes)
        self._producer = {name: node.position for node in self.nodes for name in node.outputs if name}
        last: dict[str, int] = {}
        for node in self.nodes:
            for name in node.reads:
                last[name] = node.position
        self._last_read = dict(last)  # by nodes only: what crosses a cut
        for name in self.outputs:
            last[name] = len(self.nodes)  # a graph output is read "after the end"
        self._last_use = last
        self._ir: Any = None

    def __len__(self) -> int:
        return len(self.nodes)

    def boundary(self, start: int, stop: int) -> tuple[list[str], list[str]]:
        """The values ``[start, stop)`` reads from outside it, and those read after it.

        Inputs are the graph's inputs and earlier nodes' outputs (initializers travel inside
        the region), in order of first use; outputs are the region's values read at or after
        ``stop``, or returned by the graph, in order of production.
        """
        inside: set[str] = set()
        reads: list[str] = []
        for node in self.nodes[start:stop]:
            for name in node.reads:
                if name not in inside and name not in self.initializers:
                    reads.append(name)
            inside.update(n for n in node.outputs if n)
        outputs = [n for node in self.nodes[start:stop] for n in node.outputs
                   if n and self._last_use.get(n, -1) >= stop]
        return list(dict.fromkeys(reads)), outputs

    def cuts(self, values: Mapping[str, Any]) -> tuple[int, ...]:
        """The positions a region may start or end at (module docstring, "Cuts")."""
        n = len(self.nodes)
        blocked = [False] * (n + 1)
        for name, made in self._producer.items():
            last = self._last_read.get(name, made)
            if last <= made:
                continue
            value = values.get(name)
            ok = (isinstance(value, np.ndarray) and value.dtype.name in DTYPES)
            if self.qdq:
                ok = ok and self.nodes[made].op_type == "QuantizeLinear"
            if not ok:
                for cut in range(made + 1, last + 1):
                    blocked[cut] = True
        return tuple(c for c in range(n + 1) if c in (0, n) or not blocked[c])

    def costs(self, values: Mapping[str, Any]) -> tuple[NodeCost, ...]:
        """Each node's FLOPs (from the captured shapes) and the initializers it reads."""
        init_shapes = {i.name: tuple(int(d) for d in i.dims) for i in self.model.graph.initializer}

        def shape(name: str) -> tuple[int, ...] | None:
            value = values.get(name)
            if isinstance(value, np.ndarray):
                return tuple(int(d) for d in value.shape)
            return init_shapes.get(name)

        out = []
        for node in self.nodes:
            proto = self.model.graph.node[node.position]
            flops = node_flops(node.op_type, [shape(n) if n else None for n in proto.input],
                               [shape(n) if n else None for n in node.outputs])
            params = {n: self.initializers[n] for n in node.reads if n in self.initializers}
            out.append(NodeCost(flops=int(flops), params=params))
        return tuple(out)

    def write_region(self, start: int, stop: int, path: Path,
                     values: Mapping[str, np.ndarray]) -> tuple[list[str], list[str]]:
        """Write ``[start, stop)`` as a graph at ``path``; returns its inputs and outputs.

        Raises:
            ArtifactError: onnx-ir could not bound the region by those values (a bug: the
                boundary is computed from the same order), or a boundary value was not captured.
        """
        import onnx_ir as ir

        inputs, outputs = self.boundary(start, stop)
        missing = [n for n in (*inputs, *outputs) if not isinstance(values.get(n), np.ndarray)]
        if missing:
            raise errors.ArtifactError(
                f"the region [{start}, {stop}) reads or writes values the capture run did not "
                f"keep as tensors: {missing[:5]}", remedy="report this graph: bisect cannot cut here")
        if self._ir is None:
            self._ir = ir.serde.deserialize_model(self.model)
        model = self._ir
        try:
            graph = ir.convenience.extract(model.graph, inputs, outputs)
        except ValueError as exc:
            raise errors.ArtifactError(f"cannot extract the region [{start}, {stop}): {exc}",
                                       remedy="report this graph to xstage") from exc
        for value in (*graph.inputs, *graph.outputs):
            if value.name in self._declared:  # the graph's own: its declaration stays (a fixed
                continue  # shape could break the shape inference of an If's untaken branch)
            array = values[value.name]
            value.dtype = ir.DataType.from_numpy(array.dtype)
            value.shape = ir.Shape(array.shape)
        region = ir.Model(graph, ir_version=model.ir_version, producer_name="xstage bisect",
                          functions=list(model.functions.values()))
        path.parent.mkdir(parents=True, exist_ok=True)
        ir.save(region, os.fspath(path))
        return inputs, outputs


def _unique_names(graph: Any) -> int:
    """Give every top-level node a unique, safe name (module docstring, "Names"); the count."""
    seen: set[str] = set()
    bad = []
    for i, node in enumerate(graph.node):
        if not node.name or node.name in seen or not _SAFE.match(node.name):
            bad.append(i)
        seen.add(node.name)
    for i in bad:
        name = f"bisect_{i}"
        while name in seen:
            name += "_"
        graph.node[i].name = name
        seen.add(name)
    return len(bad)


def load_graph(path: str | os.PathLike[str], fmt: str) -> BisectGraph:
    """Load an ONNX graph (external data too) for a bisect.

    Raises:
        ArtifactError: the file does not load as ONNX, has no nodes, or has no order.
    """
    import onnx

    try:
        model = onnx.load(os.fspath(path))
    except Exception as exc:  # noqa: BLE001 - any failure to parse is the file's
        raise errors.ArtifactError(f"{path} does not load as ONNX: {exc}",
                                   remedy="check the --graph path") from exc
    if not model.graph.node:
        raise errors.ArtifactError(f"{path} has no nodes: nothing to bisect")
    return BisectGraph(Path(path), fmt, model)


def capture(graph: BisectGraph, feeds: Mapping[str, np.ndarray],
            session: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every top-level value of one run of the whole graph on onnxruntime's CPU EP.

    Side effects: builds one in-process session of a copy of the graph that returns every
    node output (the graph's file is unchanged).

    Raises:
        InputError: the inputs do not run on the graph.
    """
    import onnx
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    have = {o.name for o in model.graph.output}
    for node in graph.nodes:
        for name in node.outputs:
            if name and name not in have:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if session and session.get("intra_op_num_threads"):
        so.intra_op_num_threads = int(session["intra_op_num_threads"])
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        got = sess.run(names, dict(feeds))
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are the inputs' or graph's
        raise errors.InputError(f"the whole graph does not run on onnxruntime's CPU EP: {exc}",
                                remedy="check the inputs (--inputs, --shape, --dim)") from exc
    values: dict[str, Any] = dict(feeds)
    values.update(zip(names, got, strict=True))
    return values
