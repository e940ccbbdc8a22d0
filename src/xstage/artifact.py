"""An artifact as the planner sees it: its files and their hash, its format, its signature.

Format and component are inferred from the files themselves — the extension, Q/DQ nodes,
initializer dtypes, and a manifest beside the graph — and flags override; a flag that
contradicts what the files say is a usage error rather than a silent choice. A declared format
(flag or manifest) is checked against the graph: Q/DQ nodes and their activation types for
``onnx:a16w8``, initializer and input/output dtypes for ``onnx:fp16``/``onnx:fp32``, the
program's parameter dtypes for ``.pt2`` — because the format picks the gate's tolerance.

The bytes that run are the bytes hashed: the artifact's real path is resolved first (a symlinked
graph is its target, and its sidecars and manifest are the ones beside the target), then its
files are copied into one private snapshot (``xstage.snapshot``), each hashed while copied, and
the graph is parsed from that copy. :attr:`Artifact.path` is the snapshot's graph: every reader
(the reference arm, the worker, the float64 tie-break, bisect, the exporters) opens it, never the
user's files again; :attr:`Artifact.origin` is the user's graph, which the record names.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from xstage import errors, graph_precision
from xstage.manifest import check_files, find_manifest, manifest_path, read_manifest
from xstage.snapshot import Snapshot, Staging, release
from xstage_remote.formats import is_torchscript

__all__ = ["RUNTIMES", "Artifact", "GraphFacts", "GraphNode", "GraphValue", "IOSpec", "Runtime",
           "graph_facts", "graph_nodes", "inspect_artifact", "runtime_of", "snapshot_graph"]

#: The runtime family that runs an artifact, as a route spec names its runtime
#: (``RouteSpec.runtime``): an ONNX graph runs on onnxruntime, a ``.pt2`` program on torch.
Runtime = Literal["onnxruntime", "torch"]
#: A format is ``<family>:<precision>``: the runtime of each family.
RUNTIMES: Mapping[str, Runtime] = {"onnx": "onnxruntime", "pt": "torch"}


def runtime_of(fmt: str) -> Runtime | None:
    """The runtime that runs format ``fmt`` (``onnx:fp16`` → ``onnxruntime``, ``pt:fp32`` →
    ``torch``); None for a string of no known family."""
    family, sep, _ = fmt.partition(":")
    return RUNTIMES.get(family) if sep else None

_ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}
_QDQ = {"QuantizeLinear", "DequantizeLinear"}


@dataclass(frozen=True)
class IOSpec:
    """One declared input or output: symbolic dimensions are strings, unknown ones ``?``."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Artifact:
    """The files of one stage at one precision, identified by a hash over all of them.

    ``path`` is the graph every reader opens: the snapshot's copy (``snapshot``), whose bytes
    ``sha256`` is the hash of; ``files`` name the user's files it was copied from.
    ``runtime`` is the family of its format (:func:`runtime_of`): what a route's
    ``RouteSpec.runtime`` must be to run it, and what every onnx-or-torch branch asks.
    """

    path: Path
    format: str
    format_source: str
    component: str | None
    sha256: str
    bytes: int
    files: tuple[dict[str, Any], ...]
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    node_count: int
    op_types: tuple[str, ...]
    manifest: dict[str, Any] = field(default_factory=dict)
    #: outputs judged by another format than :attr:`format` (``xstage.graph_precision``)
    output_formats: Mapping[str, str] = field(default_factory=dict)
    #: the random ops the graph holds (named when the gate finds the stage nondeterministic)
    random_ops: tuple[str, ...] = ()
    snapshot: Snapshot | None = None
    #: The user's graph (its real path, symlinks resolved): the record's path, the folder of its
    #: manifest and its fp32 source. Filled on construction: the snapshot's source, else ``path``.
    origin: Path = None  # type: ignore[assignment]
    #: The runtime family of :attr:`format`: ``onnxruntime`` or ``torch``, derived on
    #: construction (never given: ``dataclasses.replace`` with another format derives it again).
    runtime: Runtime = field(init=False)

    def __post_init__(self) -> None:
        runtime = runtime_of(self.format)
        if runtime is None:
            raise ValueError(f"format {self.format!r} is of no known family "
                             f"({', '.join(f'{k}:*' for k in RUNTIMES)})")
        object.__setattr__(self, "runtime", runtime)
        if self.origin is None:
            object.__setattr__(self, "origin",
                               self.snapshot.files[0].source if self.snapshot else self.path)

    def release(self) -> None:
        """This use of the snapshot ended (``xstage.snapshot.release``); idempotence is the
        caller's: each ``inspect_artifact`` pins once."""
        if self.snapshot is not None:
            release(self.snapshot.folder)

    @property
    def file_name(self) -> str:
        """The artifact's own file name, without its folder."""
        return self.path.name

    @property
    def file_names(self) -> tuple[str, ...]:
        """The files' names without their folders, in :attr:`files` order."""
        return tuple(Path(f["path"]).name for f in self.files)

    def graph_facts(self, shapes: Mapping[str, tuple[int, ...]]) -> GraphFacts:
        """:func:`graph_facts` of this artifact's graph file (it reads the file again); a
        ``.pt2`` program's through :func:`pt2_graph_facts` (its exported shapes)."""
        if self.runtime == "torch":
            return pt2_graph_facts(self.path)
        return graph_facts(self.path, shapes)

    def to_dict(self) -> dict[str, Any]:
        """The record's ``artifact`` object."""
        return {
            "path": str(self.origin),
            "sha256": self.sha256,
            "bytes": self.bytes,
            "files": [dict(f) for f in self.files],
            "format": self.format,
            "component": self.component,
            "format_source": self.format_source,
        }


def _manifest(graph: Path) -> tuple[dict[str, Any], Path | None]:
    """The graph's manifest beside it (``xstage.manifest.find_manifest``), validated, if any."""
    where = find_manifest(graph)
    if where is None:
        return {}, None
    return read_manifest(where), where


def _torch_program(path: Path, manifest: dict[str, Any], manifest_file: Path | None,
                   fmt: str | None, component: str | None) -> Artifact:
    """A ``.pt2``: its identity from the files, its format and I/O from its manifest (the
    client has no torch to read the program with; the worker reports the signature again).

    ``path`` is the real path; the snapshot is taken here and released on any error."""
    if manifest_file is None:
        raise errors.ArtifactError(
            f"{path} has no manifest beside it ({manifest_path(path).name}): a torch program's "
            "format and inputs are read from it", remedy="export it with xstage export, which "
            "writes the manifest")
    snap = snapshot_graph(path)
    try:
        return _torch_artifact(path, snap, manifest, manifest_file, fmt, component)
    except BaseException:
        release(snap.folder)
        raise


def _torch_artifact(path: Path, snap: Snapshot, manifest: dict[str, Any], manifest_file: Path,
                    fmt: str | None, component: str | None) -> Artifact:
    """The ``.pt2`` artifact of a taken snapshot, checked against its manifest."""
    only = snap.files[0]
    entry = {"path": str(path), "sha256": only.sha256, "bytes": only.bytes}
    _check_listed(path, manifest, manifest_file, [entry])
    if runtime_of(str(manifest["format"])) != "torch":
        raise errors.ArtifactError(f"manifest {manifest_file} says {manifest['format']} for a .pt2",
                                   remedy="re-export the artifact")
    if fmt and fmt != manifest["format"]:
        raise errors.UsageError(f"--format {fmt} conflicts with the manifest's {manifest['format']}",
                                remedy="drop --format, or fix the manifest")
    if component and component != manifest["component"]:
        raise errors.UsageError(f"--component {component} conflicts with the manifest's "
                                f"{manifest['component']}", remedy="drop --component")
    _check_declared_pt(snap.graph, str(manifest["format"]))

    def spec(d: dict[str, Any]) -> IOSpec:
        return IOSpec(d["name"], d["dtype"], tuple(d["shape"]))

    return Artifact(path=snap.graph, format=manifest["format"], format_source="manifest",
                    component=manifest["component"], sha256=entry["sha256"], bytes=entry["bytes"],
                    files=(entry,), inputs=tuple(spec(d) for d in manifest["inputs"]),
                    outputs=tuple(spec(d) for d in manifest["outputs"]), node_count=0,
                    op_types=(), manifest=manifest, snapshot=snap,
                    random_ops=graph_precision.pt2_random_ops(snap.graph))


def _dims(type_proto: Any) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for d in type_proto.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))  # exporters write -1 for "dynamic" (Paddle): unknown
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append("?")
    return tuple(dims)


def _float_format(model: Any) -> str:
    """fp16 when most float initializers are float16, else fp32."""
    float_inits = [i.data_type for i in model.graph.initializer if i.data_type in (1, 10, 11, 16)]
    if float_inits and sum(t == 10 for t in float_inits) > len(float_inits) / 2:
        return "onnx:fp16"
    return "onnx:fp32"


def _onnx_format(model: Any) -> str:
    """What the graph computes (``xstage.graph_precision``): a16w8 (or a8w8) only where every
    output's compute ops take 8-bit weights and 16-bit (or 8-bit) activations through Q/DQ;
    else its float format."""
    if any(n.op_type in _QDQ for n in model.graph.node):
        return graph_precision.artifact_format(model, _float_format(model))
    return _float_format(model)


def _onnx_facts(model: Any) -> tuple[str, str]:
    """What the graph is by its own dtypes, and those facts in words (for a mismatch message)."""
    graph = model.graph
    qdq = [n for n in graph.node if n.op_type in _QDQ]
    floats: dict[str, int] = {}
    for init in graph.initializer:
        if init.data_type in (1, 10, 11, 16):
            name = _ONNX_DTYPES[init.data_type]
            floats[name] = floats.get(name, 0) + 1
    io = sorted({_ONNX_DTYPES[v.type.tensor_type.elem_type] for v in (*graph.input, *graph.output)
                 if v.type.tensor_type.elem_type in (1, 10, 11, 16)})
    inits = ", ".join(f"{n} {t}" for t, n in sorted(floats.items())) or "none"
    words = (f"{len(qdq)} QuantizeLinear/DequantizeLinear nodes, float initializers: {inits}, "
             f"float inputs/outputs: {', '.join(io) or 'none'}")
    if qdq:
        is_fmt = _onnx_format(model)  # a16w8, a8w8, or the float format
    elif floats:
        is_fmt = "onnx:fp16" if floats.get("float16", 0) > sum(floats.values()) / 2 else "onnx:fp32"
    else:
        is_fmt = "onnx:fp16" if io == ["float16"] else "onnx:fp32"
    return is_fmt, words


def _check_declared_onnx(path: Path, model: Any, fmt: str, source: str) -> None:
    """A declared format (flag or manifest) must be what the graph's nodes and dtypes say.

    A format chooses the gate's tolerance (A16W8's is ~300x fp32's) and a route's hooks (the
    OpenVINO f32 pin is skipped for a16w8), so an unchecked declaration would loosen the gate.

    Raises:
        UsageError: the declaration and the graph disagree (the message says what it is).
    """
    if source not in ("flag", "manifest"):
        return
    is_fmt, words = _onnx_facts(model)
    if is_fmt != fmt:
        said = "--format" if source == "flag" else "the manifest's format"
        raise errors.UsageError(
            f"{said} {fmt} does not match {path.name}: the graph is {is_fmt} ({words})",
            remedy=f"drop the declaration (the graph says {is_fmt}), or pass the graph that "
                   f"really is {fmt} (xstage quantize / xstage export make one)")


#: torch.export's serialized ScalarType codes for the float dtypes a program's weights carry.
_PT_FLOATS = {6: "float16", 7: "float32", 8: "float64", 13: "bfloat16"}


def _check_declared_pt(path: Path, fmt: str) -> None:
    """A ``.pt2``'s declared format against its program's parameter dtypes.

    The weights' config inside the archive (``*/data/weights/model_weights_config.json``)
    lists every parameter with its dtype; a program without one is not checked.

    Raises:
        UsageError: ``pt:fp16`` on float32 weights, or ``pt:fp32`` on float16 ones.
    """
    counts: dict[str, int] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if name.endswith("/data/weights/model_weights_config.json"):
                    config = json.loads(archive.read(name)).get("config") or {}
                    for entry in config.values():
                        code = ((entry or {}).get("tensor_meta") or {}).get("dtype")
                        if code in _PT_FLOATS:
                            counts[_PT_FLOATS[code]] = counts.get(_PT_FLOATS[code], 0) + 1
    except (OSError, zipfile.BadZipFile, ValueError, AttributeError):
        return  # loading it is the worker's business; it says what is wrong
    if not counts:
        return
    want = "float16" if fmt == "pt:fp16" else "float32"
    major = max(counts, key=lambda k: counts[k])
    if major != want and not (fmt == "pt:fp16" and major == "bfloat16"):
        words = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
        raise errors.UsageError(
            f"the manifest's format {fmt} does not match {path.name}: its parameters are "
            f"{words}", remedy="re-export it with xstage export --format matching its weights, "
            "or fix the manifest")


def inspect_artifact(
    path: str | Path, *, fmt: str | None = None, component: str | None = None
) -> Artifact:
    """Read, hash and describe an artifact; flags override inference, conflicts are errors.

    Side effects: the artifact's files are copied into a snapshot under
    ``XSTAGE_HOME/cache/artifacts/<sha256>/``, pinned for this process until
    :meth:`Artifact.release` (``open_stage``'s stage releases it when it closes).

    Raises:
        ArtifactError: the file is missing, unreadable, not a valid graph, changed while it was
            copied, or a manifest beside it is broken.
        UsageError: ``fmt`` or ``component`` contradict what the files or manifest say.
    """
    given = Path(path)
    if not given.is_file():
        raise errors.ArtifactError(f"no graph at {given}", remedy="check the --graph path")
    path = given.resolve()  # a symlink is its target: the sidecars and manifest beside it
    suffix = path.suffix.lower()
    manifest, manifest_file = _manifest(path)
    if suffix in (".pt", ".pth", ".pt2", ".ts") and is_torchscript(path):
        raise errors.ArtifactError(
            f"{path} is a TorchScript file, not a torch.export program",
            remedy="export the stage with torch.export (xstage export ... --format pt:fp32)")
    if suffix == ".pt2":
        return _torch_program(path, manifest, manifest_file, fmt, component)
    if suffix not in (".onnx",):
        raise errors.ArtifactError(
            f"{path}: unknown artifact type {suffix or '(no extension)'}",
            remedy="pass an .onnx graph (or a torch.export .pt2 program)")
    return _onnx_graph(path, manifest, manifest_file, fmt, component)


def _onnx_graph(path: Path, manifest: dict[str, Any], manifest_file: Path | None,
                fmt: str | None, component: str | None) -> Artifact:
    """An ``.onnx`` graph: its files (sidecars included) hashed, its format, component and I/O.

    ``path`` is the real path; the snapshot is taken here and released on any error."""
    snap, model = _snapshot_onnx(path)
    try:
        return _onnx_artifact(path, snap, model, manifest, manifest_file, fmt, component)
    except BaseException:
        release(snap.folder)
        raise


def _onnx_artifact(path: Path, snap: Snapshot, model: Any, manifest: dict[str, Any],
                   manifest_file: Path | None, fmt: str | None, component: str | None) -> Artifact:
    """The ONNX artifact of a taken snapshot: checked against its manifest, described."""
    entries = [{"path": str(f.source), "sha256": f.sha256, "bytes": f.bytes} for f in snap.files]
    if manifest_file is not None:
        _check_listed(path, manifest, manifest_file, entries)
    inferred, source = _onnx_format_and_source(path, model, manifest, fmt)
    _check_declared_onnx(path, model, inferred, source)
    comp = manifest.get("component")
    if component and comp and component != comp:
        raise errors.UsageError(
            f"--component {component} conflicts with the manifest's {comp}",
            remedy="drop --component, or fix the manifest")
    graph = model.graph
    inputs, outputs = _onnx_signature(graph)
    return Artifact(
        path=snap.graph,
        format=inferred,
        format_source=source,
        component=component or comp or path.stem,
        sha256=_files_hash(entries),
        bytes=sum(e["bytes"] for e in entries),
        files=tuple(entries),
        inputs=inputs,
        outputs=outputs,
        node_count=len(graph.node),
        op_types=tuple(sorted({n.op_type for n in graph.node})),
        manifest=manifest,
        output_formats=graph_precision.onnx_output_formats(model, inferred, _float_format(model)),
        random_ops=graph_precision.onnx_random_ops(model),
        snapshot=snap,
    )


def _onnx_signature(graph: Any) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """The graph's inputs (initializers listed as inputs left out) and outputs."""
    init_names = {i.name for i in graph.initializer}
    inputs = tuple(
        IOSpec(i.name, _ONNX_DTYPES.get(i.type.tensor_type.elem_type, "unknown"), _dims(i.type))
        for i in graph.input if i.name not in init_names)
    outputs = tuple(
        IOSpec(o.name, _ONNX_DTYPES.get(o.type.tensor_type.elem_type, "unknown"), _dims(o.type))
        for o in graph.output)
    return inputs, outputs


def _load_onnx(path: Path, shown: Path | None = None) -> Any:
    """The graph without its external data; a file that is not a graph is an ``ArtifactError``
    (naming ``shown``, the user's file, where ``path`` is its snapshot)."""
    import onnx

    shown = shown or path
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends: the file is not a graph
        raise errors.ArtifactError(
            f"{shown} is not a readable ONNX graph ({type(exc).__name__}: {exc})",
            remedy="re-export the graph; check that the file is complete",
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise errors.ArtifactError(f"{shown} holds no graph", remedy="re-export the graph")
    return model


def _sidecars(path: Path, model: Any) -> list[tuple[str, Path]]:
    """Each external-data file the graph names, once: (its name as the graph writes it, the
    real file beside ``path``, the graph's real path); each must sit inside the graph's folder.

    The real file is the one copied; the snapshot keeps the name the graph uses, so onnxruntime
    finds it beside the snapshot's graph (a sidecar that is a link inside the folder included).
    """
    found: list[tuple[str, Path]] = []
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key != "location":
                continue
            sidecar = (path.parent / entry.value).resolve()
            name = posixpath.normpath(entry.value)
            if path.parent not in sidecar.parents or name.startswith(("../", "/")):
                raise errors.ArtifactError(
                    f"{path}: external data {entry.value!r} escapes the graph's folder",
                    remedy="keep external data beside the graph")
            if not sidecar.is_file():
                raise errors.ArtifactError(
                    f"{path}: external data file {entry.value} is missing",
                    remedy="copy the sidecar file next to the graph")
            if name != path.name and name not in (n for n, _ in found):
                found.append((name, sidecar))
    return found


def _snapshot_onnx(path: Path) -> tuple[Snapshot, Any]:
    """The graph at its real ``path`` and its sidecars in one snapshot, and the graph as parsed
    from the snapshot's copy (the sidecars it names are the ones it names there)."""
    with Staging() as staging:
        staging.add(path, path.name)
        model = _load_onnx(staging.path(path.name), shown=path)
        for name, source in _sidecars(path, model):
            staging.add(source, name)
        entries = [{"path": str(f.source), "sha256": f.sha256} for f in staging.files]
        return staging.commit(_files_hash(entries)), model


def snapshot_graph(path: str | Path) -> Snapshot:
    """A graph (ONNX with its sidecars, or one file such as a ``.pt2``) in a pinned snapshot.

    For a graph read without :func:`inspect_artifact` (a reference arm's): its real path
    resolved, its files copied and hashed once; release it with ``xstage.snapshot.release``.

    Raises:
        ArtifactError: the file is missing, is not a readable graph, or changed while copied.
    """
    given = Path(path)
    if not given.is_file():
        raise errors.ArtifactError(f"no graph at {given}", remedy="check the path")
    real = given.resolve()
    if real.suffix.lower() == ".onnx":
        return _snapshot_onnx(real)[0]
    with Staging() as staging:
        only = staging.add(real, real.name)
        return staging.commit(only.sha256)


def _check_listed(path: Path, manifest: dict[str, Any], manifest_file: Path,
                  entries: list[dict[str, Any]]) -> None:
    """The manifest beside the graph must list it, and its hashes must match the files'."""
    listed = {(manifest_file.parent / e["path"]).resolve() for e in manifest["files"]}
    if path not in listed:
        raise errors.ArtifactError(f"manifest {manifest_file} does not list {path.name}",
                                   remedy="re-export the artifact, or remove the stale manifest")
    check_files(manifest, manifest_file,
                hashed={str(Path(e["path"]).resolve()): e["sha256"] for e in entries})


def _files_hash(entries: list[dict[str, str]] | list[dict[str, Any]]) -> str:
    """One file: its own hash. Several: a hash over their names and hashes, in order."""
    if len(entries) == 1:
        return str(entries[0]["sha256"])
    total = hashlib.sha256()
    for e in entries:
        total.update(Path(e["path"]).name.encode() + b"\0" + e["sha256"].encode() + b"\0")
    return total.hexdigest()


def _onnx_format_and_source(path: Path, model: Any, manifest: dict[str, Any],
                            fmt: str | None) -> tuple[str, str]:
    """The format and where it came from: the flag over the manifest over the graph's dtypes."""
    inferred = _onnx_format(model)
    source = "inferred"
    if manifest.get("format"):
        if manifest["format"] != inferred and not fmt:
            inferred, source = str(manifest["format"]), "manifest"
        elif not fmt:
            source = "manifest"
    if fmt:
        if fmt != inferred and source == "manifest" and manifest.get("format") != fmt:
            raise errors.UsageError(
                f"--format {fmt} conflicts with the manifest's {manifest['format']}",
                remedy="drop --format, or fix the manifest")
        if runtime_of(fmt) != "onnxruntime":
            raise errors.UsageError(f"--format {fmt} is not an ONNX format but {path} is ONNX")
        inferred, source = fmt, "flag"
    return inferred, source


# --------------------------------------------------------------------------- graph facts for the ledger


@dataclass(frozen=True)
class GraphValue:
    """One value of the graph after shape inference, as plain facts.

    ``shape`` is None when shape inference gave none, with None for a dimension it could not
    tell; ``dtype``/``itemsize`` are None when the element type is unset or has no numpy dtype.
    """

    name: str
    dtype: str | None
    itemsize: int | None
    shape: tuple[int | None, ...] | None


@dataclass(frozen=True)
class GraphNode:
    """One node, by the names of the values it reads and writes (empty names kept)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class GraphFacts:
    """What ``xstage.ledger.footprint`` walks to size a graph's activations, read from its file.

    Attributes:
        values: the graph's inputs, then ``value_info``, then outputs, each as shape inference
            left it (a name can appear more than once; the later one is the more specific).
        nodes: the top-level nodes in graph order (liveness walks them in this order).
        inputs: the graph inputs' names (initializers listed as inputs included).
        initializers: the initializers' names.
        outputs: the graph outputs' names.
        error: why there are no facts (the file did not load, or shape inference failed), or None.
    """

    values: tuple[GraphValue, ...] = ()
    nodes: tuple[GraphNode, ...] = ()
    inputs: tuple[str, ...] = ()
    initializers: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    error: str | None = None


#: The most elements a rank-1 value may have for shape inference to propagate data through
#: the graph: onnx's data propagation (``data_prop``) of a ``Slice`` holds about 150 bytes per
#: element of its rank-1 input (8.7 GiB for a 256 MiB float32 input), and a shape is never
#: that long.
_DATA_PROP_MAX = 1 << 16


def _needs_data_prop(model: Any) -> bool:
    """Whether shapes inferred without data propagation left a dim unknown, and no rank-1 value
    is too long for it (:data:`_DATA_PROP_MAX`)."""
    graph = model.graph
    unknown = False
    for value in (*graph.input, *graph.value_info, *graph.output):
        t = value.type.tensor_type
        if not t.HasField("shape"):
            unknown = True
            continue
        dims = t.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value") and dims[0].dim_value > _DATA_PROP_MAX:
            return False
        unknown = unknown or any(not d.HasField("dim_value") for d in dims)
    return unknown


def _inferred_model(path: str | Path, shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """The graph loaded without external data, its inputs fixed to ``shapes``, shapes inferred
    (with data propagation only where it can resolve more and costs little, see
    :func:`_needs_data_prop`)."""
    import onnx
    from onnx import shape_inference

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
    inferred = shape_inference.infer_shapes(model)
    return shape_inference.infer_shapes(model, data_prop=True) if _needs_data_prop(inferred) \
        else inferred


def _graph_value(value: Any) -> GraphValue:
    import numpy as np
    from onnx import helper

    t = value.type.tensor_type
    shape = (tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
             if t.HasField("shape") else None)
    dtype = itemsize = None
    if t.elem_type:
        try:
            np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        except (KeyError, TypeError, ValueError):
            pass
        else:
            dtype, itemsize = np_dtype.name, int(np_dtype.itemsize)
    return GraphValue(value.name, dtype, itemsize, shape)


def graph_facts(path: str | Path, shapes: Mapping[str, tuple[int, ...]]) -> GraphFacts:
    """Read an ONNX graph and infer its values' shapes with the inputs fixed to ``shapes``.

    Never raises for a bad file: a graph that does not load or that shape inference rejects
    gives facts with only :attr:`GraphFacts.error` set (the ledger then says it has no estimate).
    """
    try:
        model = _inferred_model(path, shapes)
    except Exception as exc:  # noqa: BLE001 - any failure means "no facts", said so
        return GraphFacts(error=str(exc))
    graph = model.graph
    return GraphFacts(
        values=tuple(_graph_value(v) for v in (*graph.input, *graph.value_info, *graph.output)),
        nodes=tuple(GraphNode(tuple(n.input), tuple(n.output)) for n in graph.node),
        inputs=tuple(i.name for i in graph.input),
        initializers=tuple(i.name for i in graph.initializer),
        outputs=tuple(o.name for o in graph.output),
    )


#: torch.export's serialized ``ScalarType`` codes and their element sizes
#: (``torch/_export/serde/schema.py``); a code not listed leaves its value unsized.
_PT2_ITEMSIZE = {1: ("uint8", 1), 2: ("int8", 1), 3: ("int16", 2), 4: ("int32", 4),
                 5: ("int64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
                 12: ("bool", 1), 13: ("bfloat16", 2)}
#: Ops whose output shares its input's storage: no allocation of their own.
_PT2_ALIASES = ("view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
                "slice", "select", "squeeze", "unsqueeze", "alias", "as_strided", "split",
                "split_with_sizes", "chunk", "unbind", "detach", "flatten", "unflatten",
                "_assert_tensor_metadata", "view_as", "narrow", "movedim", "diagonal")


def _pt2_names(args: Any) -> tuple[str, ...]:
    """The tensor names an argument list of the serialized graph refers to."""
    out: list[str] = []
    for a in args:
        arg = a.get("arg", a) if isinstance(a, dict) else {}
        if "as_tensor" in arg:
            out.append(arg["as_tensor"]["name"])
        for t in arg.get("as_tensors") or ():
            out.append(t["name"])
        for t in arg.get("as_optional_tensors") or ():
            if isinstance(t, dict) and "as_tensor" in t:
                out.append(t["as_tensor"]["name"])
    return tuple(out)


def pt2_graph_facts(path: str | Path) -> GraphFacts:
    """A ``torch.export`` archive's top-level graph as facts: every tensor's exported shape
    and dtype (its serialized ``tensor_values``) and the nodes in order.

    Ops that return a view of their input (:data:`_PT2_ALIASES`) produce values the liveness
    walk counts as unsized (no storage of their own), and a use of a view counts as a use of
    the tensor it views (its storage lives as long). A symbolic dimension leaves its value
    unsized. Never raises: an archive it cannot read gives facts with only ``error`` set.
    """
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/models/model.json")), None)
            if name is None:
                return GraphFacts(error="no models/model.json in the archive (an older layout)")
            doc = json.loads(z.read(name).decode("utf-8"))
        graph = doc["graph_module"]["graph"]
        base: dict[str, str] = {}  # a view's name -> the tensor whose storage it shares
        nodes = []
        for node in graph["nodes"]:
            outs = _pt2_names(node.get("outputs") or ())
            ins = tuple(base.get(n, n) for n in _pt2_names(node.get("inputs") or ()))
            op = str(node.get("target", "")).split(".")
            if len(op) >= 4 and op[-2] in _PT2_ALIASES and ins:
                base.update((o, ins[0]) for o in outs)
            nodes.append(GraphNode(ins, outs))
        aliases = set(base)
        values = []
        for vname, meta in graph["tensor_values"].items():
            dims = [d.get("as_int") for d in meta.get("sizes") or ()]
            known = _PT2_ITEMSIZE.get(meta.get("dtype"))
            shape = None if vname in aliases else tuple(d if isinstance(d, int) else None
                                                        for d in dims)
            values.append(GraphValue(vname, known[0] if known else None,
                                     known[1] if known else None, shape))
        lifted = []  # parameters, buffers, constants: the program's inputs that are not the caller's
        for spec in doc["graph_module"].get("signature", {}).get("input_specs") or ():
            for kind, body in spec.items():
                arg = body.get("arg") if isinstance(body, dict) else None
                if kind != "user_input" and isinstance(arg, dict) and "name" in arg:
                    lifted.append(arg["name"])
        return GraphFacts(values=tuple(values), nodes=tuple(nodes),
                          inputs=_pt2_names(graph.get("inputs") or ()),
                          initializers=tuple(lifted),
                          outputs=_pt2_names(graph.get("outputs") or ()))
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, TypeError, AttributeError) as exc:
        return GraphFacts(error=f"{type(exc).__name__}: {exc}")


def graph_nodes(art: Artifact) -> tuple[dict[str, str], ...]:
    """Every node of an ONNX artifact, subgraphs included (name, op type).

    The proof checks the profile's event names against them; a torch program has none (its
    proof reads the profiler's op log).
    """
    if art.runtime != "onnxruntime":
        return ()
    import onnx

    model = onnx.load(str(art.path), load_external_data=False)
    out: list[dict[str, str]] = []

    def walk(graph: Any) -> None:
        for node in graph.node:
            out.append({"name": node.name, "op_type": node.op_type})
            for attr in node.attribute:
                if attr.g and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return tuple(out)
