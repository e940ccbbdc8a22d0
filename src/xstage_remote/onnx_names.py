"""Node names the worker controls: check an ONNX graph's names, or run a renamed copy.

Node names are the model author's text, and onnxruntime writes them into its profile
(unescaped up to 1.30), so a crafted name can close its own event and add events that claim
another provider. Before a profiled session is built, :func:`prepare` reads every node name
(subgraphs and local functions included) straight from the protobuf, with the standard library
only: when each is unique and made of ``[A-Za-z0-9_.:/-]``, the graph runs as it is; otherwise
the session runs a copy whose named nodes are renamed ``xs_n<i>`` (in the order read; unnamed
nodes stay unnamed), loaded from memory with its external data folder named (onnxruntime >=
1.24), or written beside the original as a hidden file that is removed with the session
(older onnxruntime; it resolves external data relative to the model's own path and refuses a
link that leaves that folder), so external data is referenced in place, never copied. Either
way the worker reports the names the session ran with and the original each stands for; the
proof (``xstage.evidence.names``) believes only those.

The reader knows the few fields it needs (ModelProto.graph 7, ModelProto.functions 25,
GraphProto.node 1, FunctionProto.node 7, NodeProto.input 1 / output 2 / name 3 / op_type 4 /
attribute 5, AttributeProto.g 6 / graphs 11) and copies every other byte as it was.
"""

import os
import re
import tempfile

__all__ = ["SAFE_NAME", "prepare", "problems", "read_nodes"]

SAFE_NAME = re.compile(r"[A-Za-z0-9_.:/\-]{1,512}\Z")

# (message kind, field number) -> the kind of the embedded message
_CHILDREN = {
    ("model", 7): "graph",
    ("model", 25): "function",
    ("graph", 1): "node",
    ("function", 7): "node",
    ("node", 5): "attr",
    ("attr", 6): "graph",
    ("attr", 11): "graph",
}


def _varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _encode_varint(value):
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start, end):
    """(field number, wire type, field start, payload start, payload end) of each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos2 = _varint(buf, pos)
            yield number, wire_type, field_start, pos, pos2
            pos = pos2
        elif wire_type == 1:
            yield number, wire_type, field_start, pos, pos + 8
            pos += 8
        elif wire_type == 2:
            length, pos = _varint(buf, pos)
            yield number, wire_type, field_start, pos, pos + length
            pos += length
        elif wire_type == 5:
            yield number, wire_type, field_start, pos, pos + 4
            pos += 4
        else:
            raise ValueError("unsupported protobuf wire type %d" % wire_type)
        if pos > end:
            raise ValueError("truncated field %d" % number)


def _walk(buf, start, end, kind, out):
    """Append ``[name, op_type, outputs, inputs]`` for each node, a node before its subgraphs' nodes."""
    if kind == "node":
        entry = ["", "", [], []]
        out.append(entry)
    for number, wire_type, _, p0, p1 in _fields(buf, start, end):
        if wire_type != 2:
            continue
        if kind == "node" and number == 3:
            entry[0] = bytes(buf[p0:p1]).decode("utf-8", "replace")
        elif kind == "node" and number == 4:
            entry[1] = bytes(buf[p0:p1]).decode("utf-8", "replace")
        elif kind == "node" and number == 2:
            entry[2].append(bytes(buf[p0:p1]).decode("utf-8", "replace"))
        elif kind == "node" and number == 1:
            entry[3].append(bytes(buf[p0:p1]).decode("utf-8", "replace"))
        child = _CHILDREN.get((kind, number))
        if child is not None:
            _walk(buf, p0, p1, child, out)


def read_nodes(model_bytes, inputs=False):
    """Every node of a serialized ModelProto as ``[(name, op_type, outputs)]`` in the order read;
    with ``inputs``, ``[(name, op_type, outputs, inputs)]``."""
    out = []
    _walk(model_bytes, 0, len(model_bytes), "model", out)
    if inputs:
        return [tuple(entry) for entry in out]
    return [(name, op, outputs) for name, op, outputs, _ in out]


def _rename(buf, start, end, kind, names):
    """The message re-encoded with named nodes renamed from ``names`` (an iterator), the rest as it was.

    A node takes its new name before its subgraphs' nodes take theirs (the order of
    :func:`read_nodes`), and every copy of its name field gets it.
    """
    fields = list(_fields(buf, start, end))
    new_name = None
    if kind == "node":
        old = [bytes(buf[p0:p1]) for n, w, _, p0, p1 in fields if n == 3 and w == 2]
        if old and old[-1]:
            new_name = next(names).encode("utf-8")
    parts = []
    for number, wire_type, field_start, p0, p1 in fields:
        child = _CHILDREN.get((kind, number)) if wire_type == 2 else None
        if new_name is not None and number == 3 and wire_type == 2:
            payload = new_name
        elif child is not None:
            payload = _rename(buf, p0, p1, child, names)
        else:
            parts.append(bytes(buf[field_start:p1]))
            continue
        parts.append(_encode_varint((number << 3) | 2) + _encode_varint(len(payload)) + payload)
    return b"".join(parts)


def problems(nodes):
    """Why these names cannot be run as they are: duplicates and unsafe characters (empty: fine)."""
    seen, out = {}, []
    for node in nodes:
        name = node[0]
        if name:
            seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            out.append("%r names %d nodes" % (name, count))
        elif not SAFE_NAME.match(name):
            out.append("%r holds characters outside [A-Za-z0-9_.:/-]" % name)
    return out


def prepare(path, in_memory):
    """What the session should load, the names report, and a file to remove when it is gone.

    Returns ``(model, report, leftover)``: ``model`` is ``path`` when every name passed, else the
    renamed copy — as bytes when ``in_memory`` (onnxruntime >= 1.24 then reads external data
    from the folder named by ``session.model_external_initializers_file_folder_path``), else
    written beside the original as a hidden file (``leftover``), so relative external data
    paths resolve to the original files in place. ``report`` is ``{"renamed": bool,
    "problems": [...], "nodes": [{"name", "op_type", "original", "outputs"}], "read": [...]}``:
    the names the session runs with, the values each node writes (``outputs``) and the values
    nodes read that no node writes (``read``: graph inputs and initializers). Values are never
    renamed: onnxruntime names some kernels after one — ``<output>_nchwc``, ``<value>_q`` and
    ``<value>_dq`` — and the proof accepts those only for safe names.
    """
    with open(path, "rb") as f:
        data = f.read()
    nodes = read_nodes(data, inputs=True)
    found = problems(nodes)
    written = set(v for node in nodes for v in node[2])
    read = sorted(set(v for node in nodes for v in node[3] if v and v not in written))
    if not found:
        return path, {"renamed": False, "problems": [], "read": read,
                      "nodes": [{"name": n, "op_type": op, "original": n, "outputs": outs}
                                for n, op, outs, _ in nodes]}, None
    new_names = ["xs_n%d" % i if node[0] else "" for i, node in enumerate(nodes)]
    renamed = _rename(data, 0, len(data), "model", iter([n for n in new_names if n]))
    report = {"renamed": True, "problems": found[:20], "read": read,
              "nodes": [{"name": new, "op_type": op, "original": old, "outputs": outs}
                        for new, (old, op, outs, _) in zip(new_names, nodes)]}
    if in_memory:
        return renamed, report, None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, copy = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".xstage-renamed-",
                                    suffix=".onnx", dir=folder)
    except OSError:  # a folder we cannot write: from memory (fine unless it has external data)
        return renamed, report, None
    with os.fdopen(fd, "wb") as f:
        f.write(renamed)
    return copy, report, copy
