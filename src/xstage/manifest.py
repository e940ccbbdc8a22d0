"""The artifact manifest: ``<file>.manifest.json`` beside every export. Validated first.

One manifest per artifact file (``tower.onnx.manifest.json``, ``tower.pt2.manifest.json``), so
two formats of one stem share a folder. A manifest of the earlier layout, ``<stem>.manifest.json``,
is still read, only when it lists this file (``find_manifest``).

A manifest says what an artifact is (component, format, opset), where it came from
(checkpoint and its hash, or a config), who made it (exporter versions), what it takes and
gives (I/O spec), what was done to it (the sanitize report) and how close it is to its
source (parity, and the fp32 source of an fp16 or A16W8 artifact). ``xstage external`` reads
it; explicit flags win.

Like safetensors' header, a manifest is checked before anything in it is used: the top level
is a closed set of keys with fixed types, every path is relative and stays inside the
manifest's folder (a path that escapes is refused, never followed), and every file it lists
must exist with the size and sha256 it says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from xstage import errors

__all__ = ["MANIFEST_KIND", "MANIFEST_VERSION", "check_files", "file_entry", "find_manifest",
           "legacy_manifest_path", "manifest_path",
           "read_manifest", "sha256_file", "state_pairs", "validate_manifest", "write_manifest"]

MANIFEST_KIND = "xstage.artifact"
MANIFEST_VERSION = 1

#: key → (allowed JSON types, required)
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "kind": ((str,), True),
    "manifest_version": ((int,), True),
    "component": ((str,), True),
    "format": ((str,), True),
    "opset": ((int, type(None)), False),
    "files": ((list,), True),
    "source": ((dict,), True),
    "exporter": ((dict,), True),
    "inputs": ((list,), True),
    "outputs": ((list,), True),
    "sanitize": ((dict, type(None)), False),
    "parity": ((dict, type(None)), False),
    "fp32_source": ((str, type(None)), False),
    "calibration": ((dict, type(None)), False),
    "created": ((str,), False),
    "state": ((list, type(None)), False),
    "stream": ((dict, type(None)), False),
}
_FORMAT = re.compile(r"^(onnx:(fp32|fp16|a16w8|a8w8)|pt:(fp32|fp16))$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def manifest_path(graph: str | os.PathLike[str]) -> Path:
    """Where the manifest of ``graph`` is written: ``tower.onnx`` → ``tower.onnx.manifest.json``."""
    path = Path(graph)
    return path.with_name(path.name + ".manifest.json")


def legacy_manifest_path(graph: str | os.PathLike[str]) -> Path:
    """The earlier layout's manifest, one per stem: ``tower.onnx`` → ``tower.manifest.json``."""
    return Path(graph).with_suffix(".manifest.json")


def find_manifest(graph: str | os.PathLike[str]) -> Path | None:
    """The manifest that describes ``graph``, or None.

    ``<file>.manifest.json`` when it exists (validated by its reader). Otherwise the earlier
    ``<stem>.manifest.json``, only when its ``files`` list ``graph`` by name: a stem's manifest
    written for another format of the same stem (a ``.pt2`` beside an ``.onnx``) is not this
    file's and is left alone.

    Raises:
        ArtifactError: the earlier layout's manifest is not readable JSON (it cannot say whether
            it lists this file).
    """
    own = manifest_path(graph)
    if own.is_file():
        return own
    legacy = legacy_manifest_path(graph)
    if legacy == own or not legacy.is_file():
        return None
    try:
        doc = json.loads(legacy.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise errors.ArtifactError(f"manifest {legacy} is not readable JSON: {exc}",
                                   remedy="fix or remove the manifest beside the graph") from exc
    files = doc.get("files") if isinstance(doc, dict) else None
    name = Path(graph).name
    if isinstance(files, list) and any(isinstance(e, dict) and e.get("path") == name for e in files):
        return legacy
    return None


def _inside(folder: Path, rel: str, what: str, where: Path) -> Path:
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or "\\" in rel or ".." in pure.parts or re.match(r"^[A-Za-z]:", rel):
        raise errors.ArtifactError(f"manifest {where}: {what} {rel!r} escapes its folder",
                                   remedy="paths in a manifest are plain names beside it")
    path = (folder / rel).resolve()
    if folder.resolve() not in path.parents:
        raise errors.ArtifactError(f"manifest {where}: {what} {rel!r} escapes its folder",
                                   remedy="paths in a manifest are plain names beside it")
    return path


def validate_manifest(doc: Any, where: Path) -> dict[str, Any]:
    """Check structure and paths (not hashes: see ``check_files``); return the document.

    Raises:
        ArtifactError: naming the first problem and the manifest's path.
    """
    def bad(msg: str) -> errors.ArtifactError:
        return errors.ArtifactError(f"manifest {where}: {msg}",
                                    remedy="re-export the artifact, or remove the broken manifest")

    if not isinstance(doc, dict):
        raise bad("is not a JSON object")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise bad(f"unknown keys {unknown}")
    for key, (types, required) in _FIELDS.items():
        if key not in doc:
            if required:
                raise bad(f"lacks {key!r}")
            continue
        value = doc[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise bad(f"{key!r} has the wrong type ({type(value).__name__})")
    if doc["kind"] != MANIFEST_KIND:
        raise bad(f"kind is {doc['kind']!r}, not {MANIFEST_KIND!r}")
    if doc["manifest_version"] != MANIFEST_VERSION:
        raise bad(f"manifest_version {doc['manifest_version']} (this xstage reads {MANIFEST_VERSION})")
    if not _FORMAT.match(doc["format"]):
        raise bad(f"format {doc['format']!r} is not one of onnx:fp32|fp16|a16w8|a8w8, pt:fp32|fp16")
    folder = where.parent
    if not doc["files"]:
        raise bad("lists no files")
    seen = set()
    for entry in doc["files"]:
        if not isinstance(entry, dict) or set(entry) != {"path", "sha256", "bytes"}:
            raise bad("each file must be {path, sha256, bytes}")
        if not isinstance(entry["path"], str) or not isinstance(entry["sha256"], str) \
                or not _SHA.match(entry["sha256"]):
            raise bad(f"file entry {entry!r} has a bad path or sha256")
        if isinstance(entry["bytes"], bool) or not isinstance(entry["bytes"], int) or entry["bytes"] < 0:
            raise bad(f"file {entry['path']!r} has a bad byte count")
        _inside(folder, entry["path"], "file", where)
        if entry["path"] in seen:
            raise bad(f"file {entry['path']!r} is listed twice")
        seen.add(entry["path"])
    if doc.get("fp32_source") is not None:
        _inside(folder, doc["fp32_source"], "fp32_source", where)
    for key in ("inputs", "outputs"):
        for spec in doc[key]:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                    or not isinstance(spec.get("dtype"), str) or not isinstance(spec.get("shape"), list):
                raise bad(f"each of {key} must be {{name, dtype, shape}}")
            _check_shape(key, spec, bad)
    _check_state(doc, where, bad)
    _check_stream(doc, bad)
    return doc


#: A declared shape's bounds, the wire's own (``xstage_remote.wire.MAX_RANK``, ``MAX_DIM``): no
#: tensor the worker could send or take is larger.
_MAX_RANK, _MAX_DIM = 32, 1 << 40
#: A symbolic dimension: a name (``--dim NAME=N`` sets it) or ``?`` (unknown), as the graph
#: spelled it (an exporter's ``dim_param`` may hold any character).
_MAX_SYMBOL = 256


def _check_shape(key: str, spec: Mapping[str, Any], bad: Any) -> None:
    """A declared shape: at most ``_MAX_RANK`` dims, each a whole number in ``[0, _MAX_DIM]``
    (0: an empty tensor, such as a windowed decoder's context of 0 frames) or a symbolic
    name, and at most ``_MAX_DIM`` elements."""
    shape = spec["shape"]
    if len(shape) > _MAX_RANK:
        raise bad(f"{key} {spec['name']!r} has rank {len(shape)}, more than {_MAX_RANK}")
    elements = 1
    for dim in shape:
        if isinstance(dim, str) and 0 < len(dim) <= _MAX_SYMBOL:
            continue
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim <= _MAX_DIM:
            raise bad(f"{key} {spec['name']!r} has shape {json.dumps(shape)[:120]}: each dim must "
                      f"be a whole number from 0 to 2^40 or a symbolic name, not "
                      f"{json.dumps(dim)[:40]}")
        elements *= dim
    if elements > _MAX_DIM:
        raise bad(f"{key} {spec['name']!r} has shape {json.dumps(shape)[:120]}: more than 2^40 "
                  "elements")


def _check_state(doc: Mapping[str, Any], where: Path, bad: Any) -> None:
    """``state``: pairs ``{input, output, init}``, an output fed back as an input on the next
    call; ``init`` is ``"zeros"`` or a ``.npy`` file beside the manifest. Each input and
    output is one of the manifest's own, used once."""
    pairs = doc.get("state")
    if pairs is None:
        return
    if not pairs:
        raise bad("state lists no pairs (leave it out, or null, for a stage without state)")
    ins = {spec["name"] for spec in doc["inputs"]}
    outs = {spec["name"] for spec in doc["outputs"]}
    used: set[tuple[str, str]] = set()
    for pair in pairs:
        if not isinstance(pair, dict) or set(pair) != {"input", "output", "init"} \
                or not all(isinstance(pair[k], str) for k in pair):
            raise bad("each state pair must be {input, output, init} of strings")
        if pair["input"] not in ins or pair["output"] not in outs:
            raise bad(f"state pair {pair['output']!r} -> {pair['input']!r} names no output and "
                      "input of this manifest")
        for role in ("input", "output"):
            if (role, pair[role]) in used:
                raise bad(f"state {role} {pair[role]!r} is in two pairs")
            used.add((role, pair[role]))
        if pair["init"] != "zeros":
            if not pair["init"].endswith(".npy"):
                raise bad(f"state init {pair['init']!r} is neither \"zeros\" nor a .npy file")
            _inside(where.parent, pair["init"], "state init", where)


#: ``stream``: a windowed decoder's facts, which a streaming caller needs (docs/pipelines.md).
_STREAM_INTS = ("chunk", "left_context", "samples_per_frame", "lookahead_samples")


def _check_stream(doc: Mapping[str, Any], bad: Any) -> None:
    """``stream``: ``input`` (the chunk's codes, ``[..., chunk]``) and ``output`` (its audio,
    ``chunk * samples_per_frame - lookahead_samples`` long) name the manifest's own; the
    windowed decoder's context is carried by its state pairs. Other keys are information."""
    stream = doc.get("stream")
    if stream is None:
        return
    if not all(isinstance(stream.get(k), int) and not isinstance(stream.get(k), bool)
               and stream[k] >= 0 for k in _STREAM_INTS) or stream["chunk"] < 1 \
            or stream["samples_per_frame"] < 1:
        raise bad(f"stream needs non-negative integers {', '.join(_STREAM_INTS)} (chunk and "
                  "samples_per_frame at least 1)")
    ins = {spec["name"]: spec for spec in doc["inputs"]}
    outs = {spec["name"]: spec for spec in doc["outputs"]}
    codes, wav = ins.get(stream.get("input")), outs.get(stream.get("output"))
    if codes is None or wav is None:
        raise bad(f"stream input {stream.get('input')!r} and output {stream.get('output')!r} "
                  "must name an input and an output of this manifest")
    samples = stream["chunk"] * stream["samples_per_frame"] - stream["lookahead_samples"]
    if codes["shape"][-1:] != [stream["chunk"]] or wav["shape"][-1:] != [samples]:
        raise bad(f"stream: {codes['name']} {codes['shape']} and {wav['name']} {wav['shape']} "
                  f"are not a chunk of {stream['chunk']} frames and its {samples} samples")


def state_pairs(doc: Mapping[str, Any], where: Path | None) -> list[dict[str, Any]]:
    """The manifest's state pairs, each with ``path`` (the init file, absolute) or None."""
    out = []
    for pair in doc.get("state") or []:
        path = None
        if pair["init"] != "zeros" and where is not None:
            path = str(_inside(where.parent, pair["init"], "state init", where))
        out.append({**pair, "path": path})
    return out


def read_manifest(path: Path) -> dict[str, Any]:
    """Read and validate one manifest file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise errors.ArtifactError(f"manifest {path} is not readable JSON: {exc}",
                                   remedy="fix or remove the manifest beside the graph") from exc
    return validate_manifest(doc, path)


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path, folder: Path) -> dict[str, Any]:
    return {"path": path.relative_to(folder).as_posix(), "sha256": sha256_file(path),
            "bytes": path.stat().st_size}


def check_files(doc: Mapping[str, Any], where: Path,
                hashed: Mapping[str, str] | None = None) -> None:
    """Every listed file exists with its size and sha256 (``hashed``: name → sha256 already
    computed by the caller, to hash each file once).

    Raises:
        ArtifactError: naming the file and what differs.
    """
    folder = where.parent
    for entry in doc["files"]:
        path = _inside(folder, entry["path"], "file", where)
        if not path.is_file():
            raise errors.ArtifactError(f"manifest {where}: lists {entry['path']}, which is missing",
                                       remedy="copy every file of the export together")
        digest = (hashed or {}).get(str(path)) or sha256_file(path)
        if digest != entry["sha256"] or path.stat().st_size != entry["bytes"]:
            raise errors.ArtifactError(
                f"manifest {where}: {entry['path']} does not match (sha256 {digest[:12]}…, "
                f"manifest says {entry['sha256'][:12]}…)",
                remedy="the file changed after export: re-export, or remove the stale manifest")


def _utc_now() -> str:
    """Now, as the records write it (UTC, microseconds, ``Z``); manifests sit below ``record``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_manifest(graph: Path, *, component: str, fmt: str, files: Sequence[Path],
                   source: Mapping[str, Any], exporter: Mapping[str, Any],
                   inputs: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, Any]],
                   opset: int | None = None, sanitize: Mapping[str, Any] | None = None,
                   parity: Mapping[str, Any] | None = None, fp32_source: str | None = None,
                   calibration: Mapping[str, Any] | None = None,
                   state: Sequence[Mapping[str, str]] | None = None,
                   stream: Mapping[str, Any] | None = None) -> Path:
    """Hash ``files`` (all beside ``graph``), validate, and write the manifest atomically.

    ``state``: the stage's state pairs, ``{input, output, init}`` (docs/serving.md).
    ``stream``: a windowed decoder's chunk, context and samples (docs/pipelines.md).
    """
    folder = graph.parent
    doc: dict[str, Any] = {
        "kind": MANIFEST_KIND, "manifest_version": MANIFEST_VERSION, "component": component,
        "format": fmt, "opset": opset, "files": [file_entry(Path(f), folder) for f in files],
        "source": dict(source), "exporter": dict(exporter), "inputs": [dict(i) for i in inputs],
        "outputs": [dict(o) for o in outputs], "sanitize": dict(sanitize) if sanitize else None,
        "parity": dict(parity) if parity else None, "fp32_source": fp32_source,
        "calibration": dict(calibration) if calibration else None, "created": _utc_now(),
    }
    if state:
        doc["state"] = [dict(pair) for pair in state]
    if stream:
        doc["stream"] = dict(stream)
    where = manifest_path(graph)
    validate_manifest(doc, where)
    fd, tmp = tempfile.mkstemp(prefix=f".{where.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a manifest is for everyone to read
        os.replace(tmp, where)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return where
