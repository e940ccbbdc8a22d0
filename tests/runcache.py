"""Export-venv commands whose outputs are kept in the test cache, keyed by everything that made them.

An export in the export venv (torch.export, the dynamo ONNX exporter: 20-60 s each on the 2-core VM)
writes the same files whenever the same code runs on the same inputs. ``run`` runs such a command
once and keeps what it wrote (its ``{out}`` folder, stdout, stderr) under ``XSTAGE_TEST_CACHE``;
every later run of the same command, in this test process, the other xdist process or a later
session, gets a copy, until something the command depends on changes.

Why a hit is sound (what the key covers):

* **The command**: this file's own hash (how the code is recorded and results are copied), the
  interpreter (its path, its target, its ``pyvenv.cfg``), the installed
  distributions of its venv (every ``*.dist-info`` name: torch, transformers, onnx, onnxscript
  and their versions), the arguments as written (``{out}`` unexpanded), the working folder, the
  content of every argument that names an existing file or folder (a spec, a checkpoint), the
  text of ``-c`` code or of the script run, and the environment variables that can steer Python
  or xstage (``PYTHON*``, ``XSTAGE_*`` but ``XSTAGE_HOME``/``XSTAGE_CONFIG``, a per-test
  folder that ``xstage export`` does not read, and ``XSTAGE_ADV_SEED``, which reaches a
  command only through a spec file, hashed above); ``TORCH*``, ``OMP_*``, ``MKL_*``.
* **The code it ran**, recorded by the command itself as it exits (a bootstrap around the
  real entry point, ``runpy`` as ``-m`` does): the module ``-m`` ran and every module it
  imported from outside its venv and the base interpreter (this tree's ``src/``, ``tests/``,
  ``scripts/``, or whichever tree ``PYTHONPATH`` or an editable install named), each with its
  sha256, and every
  non-Python file in those packages (record schemas, the shipped graphs). A kept result is
  used only while every recorded file still hashes the same, so a change to the exporter's
  code, the model code or a helper it imports runs the command again: a test whose subject is
  the export still runs the export on every change that could change its result.

Not covered, by design: a file the command reads that is neither an argument nor inside an
imported package (none of the suite's exports reads one: ``--config tiny`` and fixed seeds), and
an exporter that is not deterministic is seen once per key, not once per run.

Only a run that exits 0 is kept (a failing command runs, and fails, every time). Several
results may be kept for one command (two branches sharing one cache), each with its own
recorded files. A per-command lock makes the second process wait for the first run and use it.
Nothing here reads a clock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from xstage.manifest import sha256_file

#: Environment variables that can change a command's output (prefixes), and those left out.
ENV_PREFIXES = ("PYTHON", "XSTAGE_", "TORCH", "OMP_", "MKL_")
ENV_IGNORED = ("XSTAGE_HOME", "XSTAGE_CONFIG", "XSTAGE_ADV_SEED")
#: Results kept per command (the newest first); older ones are removed.
KEEP = 4

#: Runs the command as ``python -m``, ``-c`` or a script would, then writes the files of every
#: module loaded from outside the interpreter's own prefixes to the path in argv[1] (with the
#: module ``-m`` ran: runpy runs it as ``__main__`` and takes it out of ``sys.modules`` again).
BOOTSTRAP = r"""
import atexit, importlib.util, json, os, runpy, sys
deps_path, mode, target = sys.argv[1], sys.argv[2], sys.argv[3]
ran = []  # what runs as __main__ (runpy takes it out of sys.modules again)
if mode == "-m":
    spec = importlib.util.find_spec(target)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(target + ".__main__")
    if spec is not None and spec.origin:
        ran.append(spec.origin)
def _dump():
    roots = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    files = {os.path.realpath(f) for f in ran if os.path.isfile(f)}
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if f and os.path.isfile(f):
            real = os.path.realpath(f)
            if not real.startswith(roots):
                files.add(real)
    with open(deps_path, "w") as out:
        json.dump(sorted(files), out)
atexit.register(_dump)
if mode == "-m":
    sys.argv = [target, *sys.argv[4:]]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
elif mode == "-c":
    sys.argv = ["-c", *sys.argv[4:]]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [target, *sys.argv[4:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")
"""


def _tree_digest(path: Path) -> str:
    """sha256 of a file, or of a folder's relative names and contents."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def _venv_packages(python: Path) -> list[str]:
    prefix = Path(python).parent.parent
    return sorted(p.name for p in prefix.glob("lib/python*/site-packages/*.dist-info"))


def command_key(python: Path, args: Sequence[str], env: Mapping[str, str], cwd: Path) -> str:
    """The key of everything about the command but the code it imports (the module docstring)."""
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    inputs: dict[str, str] = {}
    for arg in args:
        if "{out}" not in arg and len(arg) < 4096 and os.path.isabs(arg) and os.path.exists(arg):
            inputs[arg] = _tree_digest(Path(arg))
    script = args[0] if args and args[0] not in ("-m", "-c") else None
    doc = {
        "runcache": sha256_file(Path(__file__)),  # how deps are recorded and results copied is part of it
        "python": [str(python), os.path.realpath(python), cfg.read_text() if cfg.is_file() else ""],
        "packages": _venv_packages(Path(python)),
        "args": list(args),
        "cwd": str(cwd),
        "inputs": inputs,
        "script": _tree_digest(Path(script)) if script and Path(script).is_file() else None,
        "env": {k: v for k, v in sorted(env.items())
                if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def _packages_of(files: Sequence[str]) -> set[Path]:
    """The top-level package folders of the recorded modules (their non-Python files count too)."""
    tops = set()
    for f in files:
        folder = Path(f).parent
        if not (folder / "__init__.py").is_file():
            continue
        while (folder.parent / "__init__.py").is_file():
            folder = folder.parent
        tops.add(folder)
    return tops


def record_deps(files: Sequence[str]) -> dict[str, str]:
    """``{path: sha256}`` of the recorded modules and of their packages' non-Python files."""
    deps = {f: sha256_file(Path(f)) for f in files}
    for top in _packages_of(files):
        for p in top.rglob("*"):
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts:
                deps[str(p)] = sha256_file(p)
    return deps


def _still_valid(deps: Mapping[str, str]) -> bool:
    return all(Path(f).is_file() and sha256_file(Path(f)) == digest for f, digest in deps.items())


def _expand(args: Sequence[str], out: Path) -> list[str]:
    return [a.replace("{out}", str(out)) for a in args]


def _rewrite(folder: Path, old: str, new: str) -> None:
    """Text files that name the folder the command wrote into name the copy instead."""
    for p in folder.rglob("*"):
        if p.is_file() and p.suffix in (".json", ".txt"):
            text = p.read_text(errors="surrogateescape")
            if old in text:
                p.write_text(text.replace(old, new), errors="surrogateescape")


def _bootstrap_argv(python: Path, args: Sequence[str], deps_path: Path) -> list[str]:
    if args[0] in ("-m", "-c"):
        return [str(python), "-c", BOOTSTRAP, str(deps_path), args[0], args[1], *args[2:]]
    return [str(python), "-c", BOOTSTRAP, str(deps_path), "script", args[0], *args[1:]]


def _hit(entry_root: Path) -> Path | None:
    for entry in sorted(entry_root.glob("r-*"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            meta = json.loads((entry / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if _still_valid(meta["deps"]):
            return entry
    return None


def _prune(entry_root: Path) -> None:
    entries = sorted(entry_root.glob("r-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def _store(entry_root: Path, python: Path, args: Sequence[str], env: Mapping[str, str], cwd: Path,
           timeout: float) -> tuple[Path | None, subprocess.CompletedProcess[str]]:
    """Run the command into a fresh result folder; keep it only if it exits 0."""
    for stale in entry_root.glob("run-*"):  # a run killed mid-way (we hold the lock: none is live)
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=entry_root)).resolve()
    out = work / "out"
    out.mkdir()
    deps_path = work / "deps.json"
    done = subprocess.run(_bootstrap_argv(python, _expand(args, out), deps_path), capture_output=True,
                          text=True, timeout=timeout, env=dict(env), cwd=cwd)
    if done.returncode != 0 or not deps_path.is_file():
        shutil.rmtree(work, ignore_errors=True)
        return None, done
    meta = {"args": list(args), "out": str(out), "stdout": done.stdout, "stderr": done.stderr,
            "deps": record_deps(json.loads(deps_path.read_text()))}
    (work / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    entry = entry_root / f"r-{work.name}"
    os.replace(work, entry)  # whole, or not there
    return entry, done


def _cache_root() -> Path:
    return Path(os.environ.get("XSTAGE_TEST_CACHE", Path(__file__).resolve().parents[1] / ".test-cache"))


def input_file(text: str, suffix: str = ".json") -> Path:
    """``text`` in a file named by its own hash, for a command's argument.

    The key holds an argument as written, so an input written into a per-test temporary folder
    would make every run a miss; a file named by its content is the same argument whenever the
    content is the same (and the key hashes the content too).
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    path = _cache_root() / "inputs" / f"{digest}{suffix}"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{digest}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)  # another process writing the same bytes is harmless
    return path


def run(python: Path, args: Sequence[str], dest: Path, *, env: Mapping[str, str] | None = None,
        cwd: Path | None = None, timeout: float = 900, cache: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with ``{out}`` in ARGS standing for ``dest``: run, or copied from the cache.

    ``args[0]`` is ``-m`` (then a module), ``-c`` (then code) or a script's path. ``dest`` is made if
    missing and receives what the command wrote under ``{out}``; the result's stdout and stderr
    name ``dest`` where the command's named its own folder. ``result.args`` says ``cached`` on a hit.
    """
    env = dict(os.environ if env is None else env)
    cwd = Path.cwd() if cwd is None else cwd
    entry_root = (cache or _cache_root() / "runs") / command_key(python, args, env, cwd)
    entry_root.mkdir(parents=True, exist_ok=True)
    with open(entry_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the second process waits for the first run, then uses it
        entry = _hit(entry_root)
        how = "cached"
        if entry is None:
            entry, done = _store(entry_root, python, args, env, cwd, timeout)
            if entry is None:
                return done
            how = "ran"
            _prune(entry_root)
        meta = json.loads((entry / "meta.json").read_text())
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(entry / "out", dest, dirs_exist_ok=True)
    old, new = meta["out"], str(dest)
    _rewrite(dest, old, new)
    return subprocess.CompletedProcess([how, *_expand(args, dest)], 0,
                                       meta["stdout"].replace(old, new), meta["stderr"].replace(old, new))
