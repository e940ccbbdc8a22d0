"""Compile caches: a route's own runtime cache, kept under ``XSTAGE_HOME/cache/compiled/<key>/``.

A route that names its runtime's cache options (``RouteSpec.compile_cache``: OpenVINO's
``cache_dir``, TensorRT's engine cache) gets a folder of its own per compilation, and the runtime
reads and writes its cache there. Never a different graph file (onnxruntime's EP-context models):
the bytes that run stay the bytes the record hashes, and the proof and the numeric gate run on
every open, hit or miss — a cache changes how long compiling takes, never the evidence.

Rules:

1. **Key.** The sha256 of a canonical JSON of: the artifact's sha256 (its snapshot), the route,
   the device, the format, the runtime's versions as the route's probe reported them (python and
   numpy left out), the EP, its options as merged (the cache's own options left out) and the
   session options. Anything else that changes compilation changes one of those.
2. **Manifest.** A sealed entry holds ``files/`` (the runtime's folder) and ``manifest.json``:
   the key's inputs and each file's relative path, size and sha256.
3. **Verify before handing over.** An entry is handed to the runtime only when every file the
   manifest lists is there with its size and hash and no other file is (``hit``). Anything else —
   a file changed, missing or added, a manifest that does not parse or names another key — and
   the entry is emptied and built again (``rebuilt``, with the reason); no entry is ``miss``.
4. **Seal after a successful warm-up.** The runtime's files are hashed into the manifest once
   the stage's worker has loaded and warmed up (its compilations done); a candidate that failed
   leaves no entry. Entries are 0700 folders of the user's home; processes meet under
   ``locks/compiled.lock`` to prepare and to seal.
5. **Off.** ``XSTAGE_COMPILE_CACHE=off`` (``off``), or the user's own cache option among the
   EP options (``user``: their folder, as given, unmanaged), or a route without one (no entry).
6. **A hit is what the runtime did, not what was handed over.** A runtime that reads its cache
   leaves the files it reads as they are; one that cannot read them compiles again and writes
   them anew (OpenVINO removes a blob it fails to import and writes a new one). So each file's
   identity (inode, modification time, size) is taken when a verified entry is handed over and
   compared when it is sealed: a file replaced or removed makes the open ``unread`` (it paid a
   full compile), and the manifest marks the entry so. A marked entry is not handed over again
   (``unreadable``: the runtime compiles without it and writes nothing); its key holds the
   runtime's versions, so another runtime build gets a new entry, and ``xstage cache clear
   --compiled`` tries again. Measured on onnxruntime-openvino 1.24.1 (docs/performance.md,
   compile_cache): its OpenVINO ships the ONNX reader only, and a CPU blob is an IR model it
   cannot read back, so every warm open compiled again while the record said ``hit``. An entry
   that holds no file (the runtime wrote none: a cache option it ignored) is no hit either: it
   is handed over again as a ``miss`` saying so.
7. **One builder, readers left alone.** An open that compiles into an entry (``miss``,
   ``rebuilt``) holds the entry's lock (``locks/compiled/<key>.lock``) exclusively until it
   seals or discards it; an open handed a verified entry (``hit``) holds it shared, as long. An
   open of the same key meanwhile that finds the entry not verified yet neither empties it nor
   writes into it, and compiles without the cache (``off``, saying so). A builder that died let
   go of the lock with its process, so the next open rebuilds what it left. ``clear`` leaves an
   entry that is being built or read (on Windows, where the lock has no shared mode, a read is
   not held).

.. versionadded:: 0.2
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xstage.home import atomic_write, cache_dir, locked, locks_dir, owned_dir, try_lock
from xstage.manifest import sha256_file

__all__ = ["ENV", "CompiledEntry", "Entry", "clear", "compiled_dir", "list_entries", "prepare"]

#: ``XSTAGE_COMPILE_CACHE=off`` turns the compile caches off.
ENV = "XSTAGE_COMPILE_CACHE"
_MANIFEST = "manifest.json"
_KIND = "xstage.compiled"
_DIR_TOKEN = "{dir}"


def compiled_dir() -> Path:
    """``XSTAGE_HOME/cache/compiled/`` (made 0700 when missing)."""
    return owned_dir(cache_dir() / "compiled", parents=True)


def _lock() -> Path:
    return locks_dir() / "compiled.lock"


def _build_lock(key: str) -> Path:
    """Rule 7: held by the open compiling into entry ``key`` (exclusive) or reading it (shared)."""
    return locks_dir() / "compiled" / f"{key}.lock"


#: Rule 7's reason, for the open that found another compiling into its entry.
BUILDING = ("another open holds this entry now (compiling into it, or reading it while this open "
            "would rebuild it): this open compiles without the cache and leaves the entry alone")


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    """Every regular file under ``folder``: relative path → size and sha256 (links refused)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            out[path.relative_to(folder).as_posix()] = {"bytes": -1, "sha256": "symlink"}
        elif path.is_file():
            out[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size,
                                                        "sha256": sha256_file(path)}
    return out


@dataclass
class Entry:
    """One compilation's cache folder, prepared for a worker and sealed after its warm-up.

    ``status``: ``hit``, ``miss``, ``rebuilt``, ``unread`` (rule 6: set by ``seal``),
    ``unreadable`` (rule 6), ``user`` or ``off`` (rule 5); ``options``: the EP options that point
    the runtime at the folder (empty unless hit, miss or rebuilt).
    """

    status: str
    key: str | None = None
    folder: Path | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    files: int = 0
    bytes: int = 0
    #: rule 6: each file's identity when a verified entry was handed over
    handed: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)
    #: rule 7: the entry's lock while this open compiles into it or reads it
    building: Any = field(default=None, repr=False, compare=False)

    def _let_go(self) -> None:
        if self.building is not None:
            self.building.close()
            self.building = None

    def seal(self) -> None:
        """Rule 4: hash what the runtime wrote into the manifest (a hit whose files are as
        listed is left as it is); rule 6: a hit whose files the runtime replaced is ``unread``,
        and its manifest says so."""
        if self.folder is None or self.key is None or self.status == "unreadable":
            return
        try:
            self._seal()
        finally:
            self._let_go()

    def _seal(self) -> None:
        assert self.folder is not None and self.key is not None
        with locked(_lock()):
            if not (self.folder / "files").is_dir():  # removed under it (by hand): nothing to seal
                return
            files = _files(self.folder / "files")
            self.files, self.bytes = len(files), sum(max(0, f["bytes"]) for f in files.values())
            manifest = self.folder / _MANIFEST
            unread = None
            if self.status == "hit":
                unread = _replaced(self.handed, _identities(self.folder / "files"))
                if unread is None and _read(manifest, self.key, files) is None:
                    return
            doc: dict[str, Any] = {"kind": _KIND, "key": self.key, "inputs": dict(self.inputs),
                                   "files": files, "sealed": _now()}
            if unread is not None:
                self.status = "unread"
                self.reason = (f"the runtime compiled again and wrote {unread} anew instead of "
                               "reading it; the entry is not handed over again under this key "
                               "(xstage cache clear --compiled tries again)")
                doc["unread"] = {"at": doc["sealed"], "file": unread}
            atomic_write(manifest, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8"))

    def discard(self) -> None:
        """A candidate that failed: an entry it started is removed (rule 4)."""
        try:
            if self.folder is not None and self.status in ("miss", "rebuilt"):
                with locked(_lock()):
                    shutil.rmtree(self.folder, ignore_errors=True)
        finally:
            self._let_go()

    def to_dict(self) -> dict[str, Any]:
        """The record's ``worker.compile_cache``."""
        return {"status": self.status, "key": self.key,
                "folder": str(self.folder) if self.folder else None, "reason": self.reason,
                "files": self.files, "bytes": self.bytes}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _identities(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Rule 6: each regular file's (inode, modification time in ns, size)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            out[path.relative_to(folder).as_posix()] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def _replaced(before: Mapping[str, tuple[int, int, int]],
              after: Mapping[str, tuple[int, int, int]]) -> str | None:
    """The first file handed over that is not the same file now (rule 6), or None."""
    for name in sorted(before):
        if after.get(name) != before[name]:
            return name
    return None


def _unread_mark(manifest: Path) -> Mapping[str, Any] | None:
    """The manifest's rule-6 mark: the runtime once compiled again instead of reading it."""
    try:
        doc = json.loads(manifest.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    mark = doc.get("unread") if isinstance(doc, dict) else None
    return mark if isinstance(mark, dict) else None


def _read(manifest: Path, key: str, files: Mapping[str, Any] | None = None) -> str | None:
    """Why a sealed entry cannot be handed over (rule 3), or None when it verifies."""
    try:
        doc = json.loads(manifest.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        return f"its manifest does not read ({type(exc).__name__})"
    if not isinstance(doc, dict) or doc.get("kind") != _KIND or doc.get("key") != key:
        return "its manifest names another key"
    listed = doc.get("files")
    if not isinstance(listed, dict):
        return "its manifest lists no files"
    found = files if files is not None else _files(manifest.parent / "files")
    for name in sorted(set(listed) | set(found)):
        if name not in found:
            return f"{name} is missing"
        if name not in listed:
            return f"{name} is not in the manifest"
        if found[name] != listed[name]:
            return f"{name} is not the file that was sealed"
    return None


def _cache_options(route: Any, options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The EP options that point this open's runtime at its cache: the plugin EP's own where
    the route names them (``RouteSpec.plugin_compile_cache``), else ``compile_cache``."""
    plugin = (options.get("ep") or {}).get("plugin") or {}
    if plugin and not plugin.get("builtin") and route.spec.plugin_compile_cache:
        return tuple(route.spec.plugin_compile_cache)
    return tuple(route.spec.compile_cache)


def _device_section(doc: Mapping[str, Any], device: Any) -> str:
    """The section of a per-device JSON option (OpenVINO's ``load_config``) this open's device
    reads: the one section already there, else the device's kind (``npu:intel:0`` → ``NPU``)."""
    if len(doc) == 1:
        return str(next(iter(doc)))
    kind = str(device or "cpu").split(":")[0]
    return {"gpu_integrated": "GPU", "gpu_discrete": "GPU"}.get(kind, kind.upper())


def _names_cache(ep_options: Mapping[str, Any], keys: tuple[tuple[str, str], ...]) -> bool:
    """Whether the user's EP options already point the runtime's cache somewhere (rule 5)."""
    for key, _ in keys:
        option, _, prop = key.partition(":")
        if not prop:
            if option in ep_options:
                return True
            continue
        try:
            doc = json.loads(str(ep_options.get(option) or "{}"))
        except ValueError:
            continue
        if isinstance(doc, dict) and any(isinstance(v, dict) and prop in v for v in doc.values()):
            return True
    return False


def _unmergeable(ep_options: Mapping[str, Any], keys: tuple[tuple[str, str], ...]) -> str | None:
    """The per-device JSON option the cache would be merged into, where it is not a JSON object
    of objects (the user's own ``--ep-option load_config=…``): the cache is left out, and the
    runtime judges the option itself."""
    for key, _ in keys:
        option, _, prop = key.partition(":")
        if not prop or option not in ep_options:
            continue
        try:
            doc = json.loads(str(ep_options[option]))
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            return option
    return None


def _point_at(ep_options: dict[str, Any], keys: tuple[tuple[str, str], ...], folder: Path,
              device: Any) -> dict[str, str]:
    """Write the cache's options into ``ep_options``; returns them as the record lists them."""
    opts = {}
    for key, template in keys:
        value = template.replace(_DIR_TOKEN, str(folder))
        option, _, prop = key.partition(":")
        if prop:
            doc = json.loads(str(ep_options.get(option) or "{}"))
            section = _device_section(doc, device)
            doc.setdefault(section, {})[prop] = value
            ep_options[option] = json.dumps(doc)
        else:
            ep_options[option] = value
        opts[key] = value
    return opts


def _key_inputs(route: Any, artifact: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    cache_keys = {k for k, _ in _cache_options(route, options) if ":" not in k}
    ep = options.get("ep") or {}
    return {"artifact_sha256": artifact.sha256, "route": route.name, "device": options.get("device"),
            "format": artifact.format,
            "runtime": {k: v for k, v in (route.versions or {}).items() if k not in ("python", "numpy")},
            "ep": ep.get("name"),
            "ep_options": {k: v for k, v in sorted((ep.get("options") or {}).items()) if k not in cache_keys},
            "session": dict(options.get("session") or {})}


def prepare(route: Any, artifact: Any, options: dict[str, Any]) -> Entry:
    """The entry for this compilation, verified or emptied (rule 3), its folder written into
    ``options``' EP options; ``off``/``user``/no entry as rule 5 says."""
    spec_keys = _cache_options(route, options)
    if not spec_keys or artifact.runtime == "torch" or artifact.sha256 is None:
        return Entry(status="off", reason="the route names no runtime cache")
    ep_options = (options.get("ep") or {}).get("options")
    if not isinstance(ep_options, dict):
        return Entry(status="off", reason="no EP options")
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return Entry(status="off", reason=f"{ENV}=off")
    if _names_cache(ep_options, spec_keys):
        return Entry(status="user", reason="the EP options name the runtime's cache themselves")
    bad = _unmergeable(ep_options, spec_keys)
    if bad is not None:
        return Entry(status="off", reason=f"the EP option {bad} is not a JSON object of per-device "
                     "settings, so the cache cannot go into it")
    inputs = _key_inputs(route, artifact, options)
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    root = compiled_dir()
    folder = root / key
    with locked(_lock()):
        status, reason, building = "miss", None, None
        if folder.is_dir():
            reason = _read(folder / _MANIFEST, key)
            status = "hit" if reason is None else "rebuilt"
            if status == "hit" and not _identities(folder / "files"):
                # Rule 6: nothing to read is no hit; the runtime wrote no file when it compiled.
                status, reason = "miss", "the entry holds no file: the runtime wrote none when it compiled"
        # rule 7: this open compiles into the entry (unless another does now) or reads it
        building = try_lock(_build_lock(key), shared=status == "hit")
        if building is None:
            return Entry(status="off", key=key, inputs=inputs, reason=BUILDING)
        if status == "rebuilt":
            shutil.rmtree(folder, ignore_errors=True)
        owned_dir(folder)
        owned_dir(folder / "files")
        os.utime(folder)  # last use
        mark = _unread_mark(folder / _MANIFEST) if status == "hit" else None
        handed = _identities(folder / "files") if status == "hit" else {}
    if mark is not None:  # rule 6: this runtime compiles again instead of reading it
        building.close()  # handed nothing: nothing to hold
        sizes = [ident[2] for ident in handed.values()]
        return Entry(status="unreadable", key=key, folder=folder, inputs=inputs,
                     reason=(f"the runtime compiled again instead of reading {mark.get('file')} "
                             f"({mark.get('at')}): not handed over (xstage cache clear --compiled "
                             "tries again)"),
                     files=len(sizes), bytes=sum(sizes))
    opts = _point_at(ep_options, spec_keys, folder / "files", options.get("device"))
    return Entry(status=status, key=key, folder=folder, inputs=inputs, options=opts, reason=reason,
                 handed=handed, building=building)


@dataclass(frozen=True)
class CompiledEntry:
    """One entry as ``xstage cache list`` shows it."""

    key: str
    route: str | None
    artifact_sha256: str | None
    files: int
    bytes: int
    last_used: float
    sealed: bool
    #: rule 6: when the runtime compiled again instead of reading it (then it is not handed over)
    unread: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "route": self.route, "artifact_sha256": self.artifact_sha256,
                "files": self.files, "bytes": self.bytes, "last_used": self.last_used,
                "sealed": self.sealed, "unread": self.unread}


def list_entries() -> list[CompiledEntry]:
    """Every entry, least recently used first."""
    root = cache_dir() / "compiled"
    out = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir():
            continue
        try:
            doc = json.loads((folder / _MANIFEST).read_text("utf-8"))
        except (OSError, ValueError):
            doc = None
        inputs = (doc or {}).get("inputs") or {}
        sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
        unread = (_unread_mark(folder / _MANIFEST) or {}).get("at")
        out.append(CompiledEntry(key=folder.name, route=inputs.get("route"),
                                 artifact_sha256=inputs.get("artifact_sha256"), files=len(sizes),
                                 bytes=sum(sizes), last_used=folder.stat().st_mtime,
                                 sealed=doc is not None,
                                 unread=str(unread) if unread else None))
    return sorted(out, key=lambda e: e.last_used)


def clear() -> list[str]:
    """Remove every entry but one an open is compiling into now (rule 7); the keys removed."""
    root = cache_dir() / "compiled"
    removed = []
    with locked(_lock()):
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            if not folder.is_dir():
                continue
            building = try_lock(_build_lock(folder.name))
            if building is None:
                continue
            try:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
                _build_lock(folder.name).unlink(missing_ok=True)  # under the lock: none opens it now
            finally:
                building.close()
    return removed
