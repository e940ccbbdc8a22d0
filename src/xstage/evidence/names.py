"""Untrusted text: which names in a profile or a plan the proof may believe. Pure.

docs/design.md §5, "Untrusted text": node names are written by the model's author, and onnxruntime
writes them into its profile (unescaped up to 1.30), so a name can close its own event and add
events of its own. The worker therefore runs a graph only with node names it has checked —
unique, each of :data:`SAFE_NAME`'s characters — or, when a name fails, with a renamed copy whose
names it chose (``n0``, ``n1``, … in graph order), and it reports the names the session ran with
and the original each stands for. :func:`check_names` re-checks that report and judges every
kernel event and plan entry against it: a name must be one of the session's node names or an
onnxruntime-derived form of one, each form as seen in ``tests/fixtures/profiles/``:

==================================================  ==========================================
form                                                 seen in
==================================================  ==========================================
``<name>`` (its ``op_name`` is the node's op type)    every profile
``<name>/<Fusion>``; ``<name>`` empty when unnamed     ``matmul/MatMulAddFusion`` (1.24, 1.30),
                                                     ``/MatMulAddFusion`` (1.30, 1.32)
the same with a trailing ``/`` (onnxruntime 1.19)     ``fused /MatMulAddFusion/``
an optional ``fused `` prefix                         ``fused matmul/MatMulAddFusion`` (1.24, 1.32)
an optional ``_token_<n>`` suffix                     ``/MatMulAddFusion_token_0``, ``Memcpy_token_0``
``<op>_<i>`` for an unnamed node of op type ``<op>``  ``Tanh_6``, ``Relu_2`` (1.19, 1.30, 1.32)
``Memcpy`` (``op_name`` ``Memcpy*``)                   ``Memcpy`` (WebGPU, 1.30)
``<EPType>_<EP>-subgraph_<k>_<n>``, ``op_name``       ``OpenVINOExecutionProvider_OpenVINO-EP-
``<EP>-subgraph_<k>``, ``<EPType>`` its provider      subgraph_1_0`` (1.24)
``<EP>_<EP>_<hash>_<k>_<n>``, ``op_name``             ``ggml_ggml_11214592953031404323_0_0``
``<EP>_<hash>_<k>`` (a compiled partition's           (the ggml plugin EP, 1.30)
metadef name), ``<EP>`` its provider
a fusion of a fusion, ``<name>/<F1>//<F2>/``          ``node_MatMul_103/MatMulScaleFusion//
                                                     MatmulTransposeFusion/`` (1.32 vision)
``<op>`` (``op_name`` ``<op>``): a node onnxruntime    ``Transpose_token_3``, ``ReorderInput``
inserted and named after its op                      (1.32 vision, conv)
``<name>`` with op ``Fused<op>``/``Nhwc<op>``          ``conv1d`` as ``FusedConv`` (1.32 conv)
``<output>_nchwc`` for a node output the worker       ``r1_nchwc`` (1.32 conv)
reported with a safe name
``<output>_bn_nchwc`` (``_mul_``, ``_add_``), op       ``r8_bn_nchwc``, ``r10_mul_nchwc`` (the
``Conv``: the BatchNormalization (Mul, Add) making     onnx wheel's light densenet121, 1.32)
that output, run as a 1x1 Conv
``<name>_new_reshape``                                ``node_Reshape_94_new_reshape`` (1.32 vision)
``fused <name>`` with op ``Fused<op>``: a node fused   ``fused n16`` as ``FusedGemm`` (the onnx
with the activation after it                          wheel's light zfnet512, 1.32)
``<name>_token_<n>`` with the node's own op: the       ``node_conv3d_token_33`` (WebGPU, 1.30
node rewritten for the EP's layout (NHWC)             vision)
``_if_then_branch_<op>`` (an If on a constant)        ``_if_then_branch_Neg`` (1.32 conv)
``<if>_then_branch__Inline_<k>__<name>``              the third-party ``silero-vad`` (1.32)
``InsertedPrecisionFreeCast_<value>``, op ``Cast``:   an fp16 tower on the CPU EP (1.32): the
a cast onnxruntime inserts around an op the EP has    ``<value>`` must be a safe name (value
no kernel for in that type                            names are not renamed)
``<op>_<i>``, ``op_name`` ``<op>``: a node of a        ``ReduceMax_227``, ``Exp_229`` (Softmax's
function body onnxruntime inlined (no such node in    body, fp16 on the CPU EP, 1.32)
the graph)
an empty plan name: a node onnxruntime added          the same run's plan
``gemm_input_reshape``/``gemm_output_reshape``, op     code2wav-tiny, fp32 and fp16, on the CPU
``Reshape``: the reshapes around a MatMul onnxruntime  EP (1.32)
turned into a Gemm
``<name>`` of a ``Gemm`` or ``MatMul`` node with op    the A16W8 MLP and ``ort132_cpu_qdq``
``MatMulNBits`` (onnxruntime's rewrite keeps the      on the CPU EP (1.32)
node's name)
``<name>`` of a node with op ``QLinear<op>``, a        ``/MatMulAddFusion`` as ``QGemm``: the
``Gemm`` with ``QGemm``, a ``MatMul`` with             A8W8 MLP (``xstage quantize --scheme
``MatMulIntegerToFloat``: onnxruntime's QDQ fusion    a8w8``) on the CPU EP (1.32)
of an 8-bit DQ -> op -> Q group keeps the op's name
``<value>_q`` (op ``QuantizeLinear``) and             ``patches_q``, ``patches_dq``: the A16W8
``<value>_dq``/``<value>_dq<k>`` (op                  vision tower on the CPU EP (1.32,
``DequantizeLinear``): a Q/DQ pair onnxruntime's      ``ort132_cpu_qdq``); ``<value>`` must be
QDQ propagation inserts on the edge of ``<value>``    a safe value the graph's nodes read or
                                                     write, as the worker reported it
==================================================  ==========================================

Any other name — or a name whose ``op_name`` disagrees (a plain ``<name>`` whose op is not the
node's, an ``<op>_<i>`` whose op is not ``<op>``) — fails, and one failure makes that layer
unusable (``xstage.evidence.onnx``, rule 1c for the execution, rule 2b for the plan).

Each name that passes also resolves to the *original* node it stands for (the key
:func:`check_names` returns), so the record names the graph's nodes, not the renamed copy's.

.. versionadded:: 0.2
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INSERTED", "SAFE_NAME", "NameCheck", "SessionNames", "check_names", "is_control_flow",
           "session_names"]

#: The characters a node name may hold when the session runs with it: no quote, backslash,
#: brace, space or control character, so it cannot end its profile event or mimic a derived form.
SAFE_NAME = re.compile(r"[A-Za-z0-9_.:/\-]{1,512}")

_TOKEN = re.compile(r"^(?P<base>.*)_token_\d+$")
#: What can end or escape a name in a profile onnxruntime writes unescaped (<= 1.30).
_FORGES = re.compile(r'["\\\x00-\x1f\x7f]')
_UNNAMED = re.compile(r"^(?P<op>[A-Za-z][A-Za-z0-9]*)_(?P<i>\d+)$")
_FUSION = re.compile(r"^(?P<base>.*)/(?P<fusion>[A-Za-z][A-Za-z0-9]*)/?$")
_INLINED = re.compile(r"^(?P<node>.+?)_(?:then|else)_branch__Inline_\d+__(?P<inner>.+)$")
_FOLDED_IF = re.compile(r"^_if_(?:then|else)_branch_(?P<op>[A-Za-z][A-Za-z0-9]*)$")  # an If on a constant
_NCHWC = "_nchwc"  # onnxruntime's NCHWc transformer: <output value>_nchwc
#: The ops the NCHWc transformer runs as a Conv, by the suffix it gives their output.
_NCHWC_AS_CONV = {"bn": "BatchNormalization", "mul": "Mul", "add": "Add"}
_INSERTED_CAST = "InsertedPrecisionFreeCast_"  # onnxruntime's InsertCastTransformer: <value>
#: A rewrite that keeps the node's name: Conv -> FusedConv, Conv -> NhwcConv, and onnxruntime's
#: QDQ fusion of an 8-bit DQ -> op -> Q group into the op's quantized kernel (Add -> QLinearAdd).
_KEPT_NAME_PREFIXES = ("Fused", "Nhwc", "QLinear")
#: Rewrites to another op that keep the node's name, each as seen in a run (module docstring).
_KEPT_NAME_REWRITES = {"Gemm": ("MatMulNBits", "QGemm"),
                       "MatMul": ("MatMulNBits", "MatMulIntegerToFloat")}
#: Nodes onnxruntime adds with fixed names (and their op): the reshapes of its MatMul -> Gemm.
_FIXED_INSERTED = {"gemm_input_reshape": "Reshape", "gemm_output_reshape": "Reshape"}
_NEW_RESHAPE = "_new_reshape"  # onnxruntime's reshape rewrite: <node>_new_reshape
#: onnxruntime's QDQ propagation: a Q/DQ pair on the edge of ``<value>`` (the k-th DQ of one Q: ``_dq<k>``).
_INSERTED_QDQ = re.compile(r"^(?P<value>.+?)_(?:(?P<q>q)|dq(?:[1-9][0-9]*)?)$")
_QDQ_OPS = {True: "QuantizeLinear", False: "DequantizeLinear"}
_SUBGRAPH = re.compile(r"^(?P<ep_type>[A-Za-z][A-Za-z0-9]*ExecutionProvider)_"
                       r"(?P<op>[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*-subgraph_\d+)_\d+$")
#: onnxruntime's name for a partition a plugin EP compiles: ``<EP>_<model hash>_<k>``.
_METADEF = re.compile(r"^[A-Za-z][A-Za-z0-9]*_\d+_\d+$")
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
#: The label of a node onnxruntime inserted (``Transpose``, ``ReorderInput``, …): no original node.
INSERTED = "<inserted by onnxruntime> "


@dataclass(frozen=True)
class SessionNames:
    """The node names a session ran with, as the worker reported them and this module re-checked.

    Attributes:
        nodes: ``{name the session ran with: (op type, original name)}``; names that failed the
            re-check are left out (events naming them fail).
        unnamed_ops: op types of the unnamed nodes (onnxruntime calls them ``<op>_<i>``).
        values: node output names that passed the check, each with the original node that
            produces it (``<value>_nchwc`` derives from them).
        read: names of the values nodes read that no node writes (graph inputs, initializers)
            and that passed the check; with :attr:`values`, what ``<value>_q``/``<value>_dq``
            derive from.
        renamed: whether the worker ran a renamed copy.
        problems: why names were left out (not unique, characters outside :data:`SAFE_NAME`).
        values_checked: the worker reported every value nodes read and write, and none holds
            a character that can end or escape a JSON string (``"``, ``\\``, a control
            character). Only then are forms derived from a value believed: values are the
            author's text and are never renamed, so one holding a quote could close its kernel's
            event in a profile that writes names unescaped and leave a fragment that names a
            safe value (or passes as an inserted cast) — with the event before it forged. (A
            value such as Paddle's ``Clip@15`` is outside :data:`SAFE_NAME` but forges nothing.)

    .. versionchanged:: 0.3
       ``read`` and ``values_checked``.
    """

    nodes: Mapping[str, tuple[str, str]]
    unnamed_ops: frozenset[str]
    renamed: bool
    problems: tuple[str, ...]
    values: Mapping[str, str] = field(default_factory=dict)
    read: frozenset[str] = frozenset()
    values_checked: bool = False


@dataclass(frozen=True)
class NameCheck:
    """The verdict of :func:`check_names` on one layer's names.

    Attributes:
        passed: every name passed.
        originals: for each name that passed, the original node it stands for (``<op>#?`` for an
            unnamed node's ``<op>_<i>``, ``Memcpy`` for copies, the subgraph op for an EP's fused
            kernel).
        failures: the names that failed, with why (at most 10 kept).
        failed: how many names failed.
        partitions: the originals that stand for a partition an EP compiled (one kernel for
            nodes it does not name: ``<EP>-subgraph_<k>``, a plugin EP's ``<EP>_<hash>_<k>``).

    .. versionchanged:: 0.3
       ``partitions``.
    """

    passed: bool
    originals: Mapping[str, str]
    failures: tuple[str, ...]
    failed: int
    partitions: frozenset[str] = frozenset()


def session_names(graph_nodes: Sequence[Mapping[str, Any]] | None,
                  reported: Mapping[str, Any] | None) -> SessionNames | None:
    """The names the session ran with: the worker's report, else the graph's own names.

    Args:
        graph_nodes: the ONNX graph's nodes (subgraphs included), ``[{"name", "op_type"}]``.
        reported: the worker's ``node_names`` report, ``{"renamed": bool, "nodes": [{"name",
            "op_type", "original", "outputs"}], "read": [value, ...]}``, or None (an older
            worker: the graph's own names are what the session ran with).

    Returns:
        The checked names, or None when neither is given.

    Raises:
        TypeError: ``reported`` or a node in it is not of that shape.
    """
    renamed = False
    rows: list[tuple[str, str, str]] = []
    values: dict[str, str] = {}
    read: frozenset[str] = frozenset()
    values_checked = False
    if reported is not None:
        if not isinstance(reported, Mapping) or not isinstance(reported.get("nodes"), list):
            raise TypeError("node_names must be a mapping with a list 'nodes'")
        renamed = bool(reported.get("renamed"))
        listed = reported.get("read")
        if isinstance(listed, list):
            read = frozenset(v for v in listed if isinstance(v, str) and SAFE_NAME.fullmatch(v))
            values_checked = all(isinstance(v, str) and not _FORGES.search(v) for v in listed)
        for node in reported["nodes"]:
            if not isinstance(node, Mapping) or not all(
                isinstance(node.get(k), str) for k in ("name", "op_type")
            ):
                raise TypeError("node_names.nodes must hold mappings with string 'name' and 'op_type'")
            outputs = node.get("outputs")
            original = node.get("original")
            producer = original if isinstance(original, str) and original else f"<{node['op_type']}>"
            if isinstance(outputs, list):
                values.update((v, producer) for v in outputs if isinstance(v, str) and SAFE_NAME.fullmatch(v))
                values_checked = values_checked and all(isinstance(v, str) and not _FORGES.search(v)
                                                        for v in outputs)
            else:
                values_checked = False
            rows.append((node["name"], node["op_type"],
                         original if isinstance(original, str) else node["name"]))
    elif graph_nodes is not None:
        rows = [(str(n.get("name") or ""), str(n.get("op_type") or ""), str(n.get("name") or ""))
                for n in graph_nodes]
    else:
        return None
    counts: dict[str, int] = {}
    for name, _, _ in rows:
        counts[name] = counts.get(name, 0) + 1
    nodes: dict[str, tuple[str, str]] = {}
    unnamed: set[str] = set()
    problems: list[str] = []
    for name, op_type, original in rows:
        if not name:
            unnamed.add(op_type)
        elif counts[name] > 1:
            problems.append(f"{name!r} names {counts[name]} nodes")
        elif not SAFE_NAME.fullmatch(name):
            problems.append(f"{name!r} holds characters outside [A-Za-z0-9_.:/-]")
        else:
            nodes[name] = (op_type, original)
    return SessionNames(nodes, frozenset(unnamed), renamed, tuple(dict.fromkeys(problems)), values, read,
                        values_checked)


def _is_value(value: str, names: SessionNames) -> bool:
    """Whether ``value`` is a value the graph's nodes read or write, and every value passed the check."""
    return names.values_checked and (value in names.values or value in names.read)


def _is_metadef(name: str, op: str, provider: str | None) -> bool:
    """``<EP>_<EP>_<hash>_<k>_<n>`` with op ``<EP>_<hash>_<k>`` on provider ``<EP>``."""
    return bool(provider and op.startswith(provider + "_") and _METADEF.match(op)
                and name.startswith(f"{provider}_{op}_") and name[len(provider) + len(op) + 2:].isdigit())


def _is_partition(name: str, op: str, provider: str | None) -> bool:
    """Whether a kernel that passed the check is a compiled partition's (one kernel for many nodes)."""
    subgraph = _SUBGRAPH.match(name)
    return bool(subgraph and subgraph.group("op") == op) or _is_metadef(name, op, provider)


def _resolve(name: str, op: str, provider: str | None, names: SessionNames,
             depth: int = 0) -> tuple[str | None, str]:
    """The original node one event or plan name stands for, or None with why it failed."""
    if depth > 8:
        return None, f"{name!r} nests derived forms too deeply"
    plain = name[len("fused "):] if name.startswith("fused ") and depth == 0 else name
    fused = plain != name
    if not fused and plain in names.nodes:
        op_type, original = names.nodes[plain]
        kept = (op_type, *(p + op_type for p in _KEPT_NAME_PREFIXES), *_KEPT_NAME_REWRITES.get(op_type, ()))
        if op and depth == 0 and op not in kept:
            return None, f"{name!r} is node {plain!r} ({op_type}) but its op is {op!r}"
        return original, ""
    token = _TOKEN.match(plain)
    stem = token.group("base") if token else plain
    if fused and not token and depth == 0 and plain in names.nodes and op == "Fused" + names.nodes[plain][0]:
        return names.nodes[plain][1], ""  # a node fused with the activation after it (Gemm+Relu)
    if not fused and token and depth == 0 and stem in names.nodes and op and op == names.nodes[stem][0]:
        return names.nodes[stem][1], ""  # a node's layout-transformed copy (the WebGPU EP's NHWC Conv)
    if not fused and stem == "Memcpy":
        return ("Memcpy", "") if op.startswith("Memcpy") else (None, f"{name!r} with op {op!r} is no copy")
    if not fused and depth == 0 and op and _FIXED_INSERTED.get(stem) == op:
        return INSERTED + op, ""  # a node onnxruntime added under a fixed name
    if not fused and depth == 0 and op and stem == op and op not in _CONTROL_FLOW:
        return INSERTED + op, ""  # a node onnxruntime added, named after its op: no original
    subgraph = _SUBGRAPH.match(stem)
    if not fused and subgraph and not token and depth == 0:
        if op != subgraph.group("op") or (provider is not None and provider != subgraph.group("ep_type")):
            return None, f"{name!r} is an EP subgraph kernel but its op is {op!r} on {provider!r}"
        return subgraph.group("op"), ""
    if not fused and not token and depth == 0 and _is_metadef(stem, op, provider):
        return op, ""  # a plugin EP's compiled partition: its kernel, on that EP
    fusion = _FUSION.match(stem)
    if fusion:
        base = fusion.group("base")
        if base == "" and names.unnamed_ops:  # an unnamed fusion: its own name (token kept) is its label
            return plain, ""
        inner, _ = _resolve(base, "", provider, names, depth + 1)  # a node, or a fusion of one
        if inner is not None:
            return inner, ""
        return None, f"{name!r} derives from {base!r}, which is no checked node name"
    inlined = _INLINED.match(plain)
    if inlined and names.nodes.get(inlined.group("node"), ("",))[0] == "If":
        inner, why = _resolve(inlined.group("inner"), op if depth == 0 else "", provider, names, depth + 1)
        if inner is None:
            return None, f"{name!r} inlines a branch node that fails: {why}"
        return inner, ""
    folded = _FOLDED_IF.match(stem)
    if not fused and folded and folded.group("op") == op and "If" in {t for t, _ in names.nodes.values()}:
        return f"<{op} of an If on a constant>", ""
    if not fused and plain.endswith(_NCHWC) and _is_value(plain[: -len(_NCHWC)], names):
        return names.values[plain[: -len(_NCHWC)]], ""  # the node that produces that value
    if not fused and depth == 0 and op == "Conv" and plain.endswith(_NCHWC):
        # The NCHWc transformer runs a BatchNormalization, or a Mul/Add by a per-channel
        # constant, as a 1x1 Conv whose output is <value>_bn / _mul / _add, then _nchwc.
        value, _, kind = plain[: -len(_NCHWC)].rpartition("_")
        producer = names.values.get(value) if _is_value(value, names) else None
        if producer is not None and kind in _NCHWC_AS_CONV and _NCHWC_AS_CONV[kind] in {
                op_type for op_type, original in names.nodes.values() if original == producer}:
            return producer, ""
    if not fused and plain.endswith(_NEW_RESHAPE) and plain[: -len(_NEW_RESHAPE)] in names.nodes:
        return names.nodes[plain[: -len(_NEW_RESHAPE)]][1], ""
    if (not fused and depth == 0 and op == "Cast" and plain.startswith(_INSERTED_CAST)
            and names.values_checked
            and SAFE_NAME.fullmatch(plain[len(_INSERTED_CAST):])):
        return INSERTED + op, ""  # a cast onnxruntime put around a kernel it lacks in that type
    qdq = _INSERTED_QDQ.match(stem)
    if not fused and depth == 0 and qdq and op == _QDQ_OPS[qdq.group("q") is not None] and _is_value(
            qdq.group("value"), names):
        return INSERTED + op, ""  # a Q/DQ pair onnxruntime put on that value's edge
    unnamed = _UNNAMED.match(plain)
    if not fused and unnamed and unnamed.group("op") in names.unnamed_ops:
        if op and op != unnamed.group("op") and depth == 0:
            return None, f"{name!r} is an unnamed {unnamed.group('op')} but its op is {op!r}"
        return plain, ""
    if not fused and unnamed and depth == 0 and op == unnamed.group("op") and op not in _CONTROL_FLOW:
        return INSERTED + op, ""  # a node of a function body onnxruntime inlined (Softmax's)
    return None, f"{name!r} is neither a checked node name nor a form onnxruntime derives from one"


def check_names(entries: Iterable[tuple[str, str, str | None]], names: SessionNames) -> NameCheck:
    """Judge names against the session's checked names (the forms are in the module docstring).

    Args:
        entries: ``(name, op, provider)`` for each kernel event (name without ``_kernel_time``,
            ``op`` its ``args.op_name``) or plan node (``op`` its op type, ``provider`` None).
        names: the session's names, from :func:`session_names`.

    Returns:
        Whether every name passed, the original each passing name stands for, and the failures.
    """
    originals: dict[str, str] = {}
    partitions: set[str] = set()
    failures: list[str] = []
    failed = 0
    seen: set[tuple[str, str, str | None]] = set()
    for name, op, provider in entries:
        if (name, op, provider) in seen:  # the same kernel in another run
            continue
        seen.add((name, op, provider))
        if name == "" and provider is None:  # a plan entry with no name: an unnamed or added node
            originals[name] = ""
            continue
        original, why = _resolve(name, op or "", provider, names)
        if original is None:
            failed += 1
            if len(failures) < 10:
                failures.append(why)
        else:
            originals[name] = original
            if provider is not None and _is_partition(name, op or "", provider):
                partitions.add(original)
    return NameCheck(failed == 0, originals, tuple(failures), failed, frozenset(partitions))


def is_control_flow(op_type: str) -> bool:
    """Whether an op is ``If``/``Loop``/``Scan`` (its time holds its children's)."""
    return op_type in _CONTROL_FLOW
