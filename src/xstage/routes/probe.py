"""Probe interpreters by running them, in parallel, and cache what they said.

Resolution asks each candidate interpreter what it can run by starting
``xstage_remote.probe`` under it (``xstage.client.staging.worker_argv``). A probe costs from a
tenth of a second (onnxruntime) to seconds (torch, OpenVINO), so results are cached under
``cache/probes/`` with a key that changes whenever the answer could: the interpreter's real
path and the path it was named by, the mtimes of its ``pyvenv.cfg`` and site-packages
folders (pip changes them), the xstage version and the worker package's hash.

Only successful probes are cached: a crash or a timeout is retried on the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xstage_remote
from xstage import errors
from xstage._version import __version__
from xstage.client import staging as remote_pkg
from xstage.home import atomic_write, cache_dir

__all__ = [
    "PROBE_TIMEOUT_S",
    "ProbeOutcome",
    "ProbeRequest",
    "cache_key",
    "probe",
    "probe_many",
    "run_probe",
]

#: Seconds a probe may take before the interpreter counts as failed (``XSTAGE_PROBE_TIMEOUT``).
PROBE_TIMEOUT_S = 60.0

#: Lines of the probe's stderr kept in a failure.
_TAIL_LINES = 15


@dataclass(frozen=True)
class ProbeRequest:
    """Which interpreter to probe and what to ask it.

    Attributes:
        interpreter: the interpreter path as configured (not resolved: a venv's ``python``
            is a link to its base interpreter, and only the link knows the venv).
        torch: import torch too (seconds).
        plugins: plugin EP modules to import and register.
        plugin_eps: plugin EPs of the ``ort-plugin:`` family to bring up step by step, each a
            JSON object (``{"key", "ep_name", "module" | "library", "dll_dir"}``, sorted keys).
        windows_root: for a Windows interpreter reached from WSL, the Windows path of the
            staged worker package (``xstage.host.wsl.to_windows_path``); None otherwise.
    """

    interpreter: str
    torch: bool = False
    plugins: tuple[str, ...] = ()
    windows_root: str | None = None
    plugin_eps: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The command line: the same launch path as a worker, in probe mode."""
        args = ["probe"] + (["--torch"] if self.torch else [])
        for module in self.plugins:
            args += ["--plugin", module]
        for request in self.plugin_eps:
            args += ["--plugin-ep", request]
        argv = remote_pkg.worker_argv(self.interpreter, *args)
        if self.windows_root is not None:
            argv[argv.index(str(remote_pkg.staged_root()))] = self.windows_root
        return argv


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe produced.

    Attributes:
        ok: the probe printed one valid JSON document and exited 0.
        data: that document (None when not ok).
        error: one line saying why not ok (exit status, timeout, bad output).
        stderr_tail: the last lines of its stderr (always kept, useful either way).
        seconds: how long it ran (0 when it came from the cache).
        cached: read from the cache instead of run.
    """

    ok: bool
    data: dict[str, Any] | None = None
    error: str | None = None
    stderr_tail: str = ""
    seconds: float = 0.0
    cached: bool = False
    returncode: int | None = field(default=None, compare=False)


def _timeout() -> float:
    try:
        return float(os.environ.get("XSTAGE_PROBE_TIMEOUT", PROBE_TIMEOUT_S))
    except ValueError:
        return PROBE_TIMEOUT_S


def _site_dirs(interpreter: Path) -> list[Path]:
    """site-packages folders of the venv or installation ``interpreter`` belongs to."""
    roots = {interpreter.parent.parent, interpreter.resolve().parent.parent}
    dirs: list[Path] = []
    for root in sorted(roots):
        dirs += sorted(root.glob("lib/python*/site-packages"))
        dirs += sorted(root.glob("lib64/python*/site-packages"))
        dirs += sorted(root.glob("Lib/site-packages"))
    return dirs


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _library_mtimes(request: ProbeRequest) -> list[float | None]:
    """A configured plugin library's mtime: replacing the file changes what a probe says."""
    out = []
    for text in request.plugin_eps:
        try:
            library = json.loads(text).get("library")
        except (ValueError, AttributeError):
            library = None
        out.append(_mtime(Path(library)) if isinstance(library, str) and library else None)
    return out


def cache_key(request: ProbeRequest) -> dict[str, Any] | None:
    """The facts that decide whether a cached probe still holds; None if not cacheable."""
    path = Path(request.interpreter)
    if not path.is_absolute() or not path.exists():
        return None
    pyvenv = path.parent.parent / "pyvenv.cfg"
    return {
        "interpreter": str(path),
        "realpath": str(path.resolve()),
        "interpreter_mtime": _mtime(path.resolve()),
        "pyvenv_cfg": [str(pyvenv), _mtime(pyvenv)],
        "site_packages": [[str(d), _mtime(d)] for d in _site_dirs(path)],
        "xstage_version": __version__,
        "package_hash": xstage_remote.package_hash(),
        "torch": request.torch,
        "plugins": list(request.plugins),
        **({"plugin_eps": list(request.plugin_eps), "plugin_libraries": _library_mtimes(request)}
           if request.plugin_eps else {}),
        "windows_root": request.windows_root,
    }


def _cache_file(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / "probes" / f"{digest}.json"


def _read_cache(key: dict[str, Any]) -> dict[str, Any] | None:
    try:
        doc = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("probe"), dict):
        return None
    return doc["probe"]


def _write_cache(key: dict[str, Any], data: dict[str, Any]) -> None:
    doc = json.dumps({"key": key, "probe": data, "written": time.time()}, sort_keys=True)
    atomic_write(_cache_file(key), doc.encode())


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_TAIL_LINES:])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        if sys.platform != "win32":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError, OSError):
        pass


def run_probe(request: ProbeRequest, *, timeout: float | None = None) -> ProbeOutcome:
    """Run one probe now (no cache). Never raises for anything the interpreter does.

    Raises:
        NoSpace: the worker package could not be staged for want of space (the home's
            doing, not the interpreter's: never a missing route).
    """
    limit = _timeout() if timeout is None else timeout
    start = time.monotonic()
    try:
        argv = request.argv()
    except errors.NoSpace:
        raise
    except OSError as exc:
        return ProbeOutcome(ok=False, error=f"cannot stage the worker package: {exc}")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=(sys.platform != "win32"),
        )
    except OSError as exc:
        return ProbeOutcome(ok=False, error=f"cannot start {request.interpreter}: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        return ProbeOutcome(
            ok=False,
            error=f"the probe did not finish within {limit:g} s (XSTAGE_PROBE_TIMEOUT)",
            stderr_tail=_tail(err.decode("utf-8", "replace")),
            seconds=time.monotonic() - start,
            returncode=proc.returncode,
        )
    seconds = time.monotonic() - start
    stderr_tail = _tail(err.decode("utf-8", "replace"))
    if proc.returncode != 0:
        return ProbeOutcome(
            ok=False,
            error=f"the probe exited with status {proc.returncode}",
            stderr_tail=stderr_tail,
            seconds=seconds,
            returncode=proc.returncode,
        )
    try:
        data = json.loads(out.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        head = out[:200].decode("utf-8", "replace")
        return ProbeOutcome(
            ok=False,
            error=f"the probe printed no valid JSON document ({exc}); stdout began {head!r}",
            stderr_tail=stderr_tail,
            seconds=seconds,
            returncode=proc.returncode,
        )
    return ProbeOutcome(ok=True, data=data, stderr_tail=stderr_tail, seconds=seconds, returncode=0)


def probe(request: ProbeRequest, *, refresh: bool = False, timeout: float | None = None) -> ProbeOutcome:
    """The probe's answer, from the cache unless ``refresh`` or the key changed."""
    key = cache_key(request)
    if key is not None and not refresh:
        data = _read_cache(key)
        if data is not None:
            return ProbeOutcome(ok=True, data=data, cached=True)
    outcome = run_probe(request, timeout=timeout)
    if outcome.ok and key is not None and outcome.data is not None:
        try:
            _write_cache(key, outcome.data)
        except OSError:
            pass  # an unwritable cache costs speed, not correctness
    return outcome


def probe_many(
    requests: Iterable[ProbeRequest], *, refresh: bool = False, timeout: float | None = None
) -> dict[ProbeRequest, ProbeOutcome]:
    """Probe several interpreters at once (a thread pool over subprocesses)."""
    unique: Sequence[ProbeRequest] = list(dict.fromkeys(requests))
    if not unique:
        return {}
    if len(unique) == 1:
        return {unique[0]: probe(unique[0], refresh=refresh, timeout=timeout)}
    remote_pkg.staged_root()  # stage once before the threads race to
    with ThreadPoolExecutor(max_workers=min(8, len(unique)), thread_name_prefix="xstage-probe") as pool:
        futures = {req: pool.submit(probe, req, refresh=refresh, timeout=timeout) for req in unique}
        return {req: fut.result() for req, fut in futures.items()}
