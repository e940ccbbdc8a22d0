"""Route environments: ``xstage env create|list|remove``.

One venv per route under ``XSTAGE_HOME/envs/<route>/``, holding the route's packages (the
spec's ``packages`` for the chosen variant, with ``--pin`` replacing same-named entries), and
a manifest ``xstage-env.json``. The resolver finds it there (precedence step 4).

A venv is built in a temporary folder beside its final place and renamed into place only
when complete, so a half-built env never resolves. Windows-side routes are not built from
WSL or Linux: ``plan`` returns the exact PowerShell commands instead. ``torch-cpu`` reuses
the current interpreter when it already imports torch (a second torch costs ~1 GB), and an
unpinned torch is never installed (pip would pick a multi-GB CUDA build).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from xstage._version import __version__
from xstage.errors import EnvError, UsageError
from xstage.home import envs_dir, locked, locks_dir
from xstage.host.info import HostInfo, host_cpu_vendor
from xstage.routes.plugins import find_spec
from xstage.routes.specs import RouteSpec

__all__ = [
    "MANIFEST_NAME",
    "EnvInfo",
    "EnvPlan",
    "create",
    "default_variant",
    "env_dir",
    "find_python",
    "host_cpu_vendor",
    "list_envs",
    "merge_pins",
    "plan",
    "powershell_commands",
    "remove",
    "venv_python",
]

MANIFEST_NAME = "xstage-env.json"
_PIP_TAIL_LINES = 25


def env_dir(route: str) -> Path:
    """Where ``route``'s environment lives (whether or not it exists); a plugin route's ``:``
    becomes ``-`` (``envs/ort-plugin-ggml``), since Windows folder names cannot hold it."""
    return envs_dir() / route.replace(":", "-")


def venv_python(root: Path, *, windows: bool | None = None) -> Path:
    """The interpreter inside a venv folder."""
    is_windows = sys.platform == "win32" if windows is None else windows
    return root / "Scripts" / "python.exe" if is_windows else root / "bin" / "python"


def _dotted(parts: Sequence[int]) -> str:
    return ".".join(str(p) for p in parts)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise UsageError(f"not a package requirement: {requirement!r}", remedy="use --pin NAME==VERSION")
    return _norm(match.group(1))


def _pinned_version(requirement: str) -> tuple[int, ...] | None:
    match = re.search(r"==\s*([0-9][0-9.]*)", requirement)
    if not match:
        return None
    return tuple(int(p) for p in match.group(1).split(".") if p.isdigit())


def merge_pins(packages: Sequence[str], pins: Sequence[str]) -> tuple[str, ...]:
    """The spec's packages with each pin replacing the package of the same name.

    Rule: onnxruntime < 1.20 was built against numpy 1.x, so pinning it turns an unpinned
    ``numpy`` into ``numpy<2``.

    Raises:
        UsageError: a pin is not a requirement.
    """
    merged = list(packages)
    for pin in pins:
        name = _req_name(pin)
        for i, pkg in enumerate(merged):
            if _req_name(pkg) == name:
                merged[i] = pin
                break
        else:
            merged.append(pin)
    old_ort = any(
        _req_name(p).startswith("onnxruntime") and (_pinned_version(p) or (99,)) < (1, 20) for p in pins
    )
    if old_ort:
        merged = ["numpy<2" if p.strip() == "numpy" else p for p in merged]
    return tuple(merged)


def default_variant(spec: RouteSpec, cpu_vendor: str) -> tuple[str, str]:
    """The variant ``env create`` builds when none is asked for, and why (the spec's policy)."""
    return spec.default_variant(cpu_vendor)


def _ask_python(exe: str) -> tuple[str, tuple[int, int, int]] | None:
    try:
        done = subprocess.run(
            [exe, "-c", "import sys; print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) < 2:
        return None
    try:
        version = tuple(int(p) for p in lines[-1].split("."))
    except ValueError:
        return None
    return lines[-2], version  # type: ignore[return-value]


def find_python(request: str | None) -> tuple[str, str]:
    """A base interpreter for ``--python``: (path, version).

    ``request`` is ``X.Y`` (looked for in pyenv's versions, then ``pythonX.Y`` on PATH, then
    the ``py -X.Y`` launcher), a path to an interpreter, or None (the current interpreter).

    Raises:
        EnvError: no such interpreter was found, or it does not run.
    """
    if request is None:
        return sys.executable, _dotted(sys.version_info[:3])
    tried: list[str] = []
    candidates: list[list[str]] = []
    if os.sep in request or "/" in request:
        candidates.append([request])
    else:
        match = re.fullmatch(r"(\d+)\.(\d+)", request.strip())
        if not match:
            raise UsageError(f"--python takes X.Y or a path, not {request!r}", remedy="e.g. --python 3.9")
        major, minor = match.groups()
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        found = []
        for path in pyenv.glob(f"{major}.{minor}.*/bin/python"):
            patch = path.parent.parent.name.split(".")[2]
            if patch.isdigit():
                found.append((int(patch), path))
        candidates += [[str(p)] for _, p in sorted(found, reverse=True)]
        tried.append(f"{pyenv}/{major}.{minor}.*")
        which = shutil.which(f"python{major}.{minor}")
        if which:
            candidates.append([which])
        tried.append(f"python{major}.{minor} on PATH")
        launcher = shutil.which("py")
        if launcher:
            candidates.append([launcher, f"-{major}.{minor}"])
            tried.append(f"py -{major}.{minor}")
    for argv in candidates:
        if len(argv) == 1:
            answer = _ask_python(argv[0])
        else:  # the py launcher: ask it which interpreter it means
            try:
                done = subprocess.run(
                    [*argv, "-c", "import sys; print(sys.executable)"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                answer = _ask_python(done.stdout.strip()) if done.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                answer = None
        if answer is None:
            continue
        exe, version = answer
        if "." in request and os.sep not in request and "/" not in request:
            want = tuple(int(p) for p in request.split("."))
            if version[:2] != want:
                continue
        return exe, _dotted(version)
    raise EnvError(
        f"no Python {request} found (looked in: {', '.join(tried) or request})",
        remedy="install it (e.g. `pyenv install " + request + "`) or pass --python /path/to/python",
    )


@dataclass(frozen=True)
class EnvPlan:
    """What ``env create`` will do, decided before anything is touched.

    Attributes:
        route: the route.
        action: ``build`` (a venv here), ``reuse`` (the current interpreter already serves
            it), or ``powershell`` (a Windows-side route: print commands, build nothing).
        variant: the package set, and ``variant_reason`` why it was chosen.
        packages: the requirements pip will get (pins applied).
        pins: the ``--pin`` values as given.
        python_request: ``--python`` as given; ``base_python``/``python_version`` what it
            resolved to (None for ``powershell``).
        target: the env folder.
        message: for ``reuse`` and ``powershell``, what to tell the user.
        powershell: the commands, for ``powershell``.
    """

    route: str
    action: Literal["build", "reuse", "powershell"]
    variant: str
    variant_reason: str
    packages: tuple[str, ...]
    pins: tuple[str, ...]
    python_request: str | None
    base_python: str | None
    python_version: str | None
    target: Path
    message: str = ""
    powershell: tuple[str, ...] = ()


def powershell_commands(
    spec: RouteSpec, packages: Sequence[str], python_request: str | None
) -> tuple[str, ...]:
    """The PowerShell lines that build ``spec``'s venv on Windows (run them in Windows)."""
    version = python_request or "3.12"
    folder = f"$env:LOCALAPPDATA\\xstage\\envs\\{spec.name}"
    py = f'& "{folder}\\Scripts\\python.exe"'
    quoted = " ".join(f'"{p}"' for p in packages)
    check = "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
    if spec.runtime == "torch":
        check = "import torch; print(torch.__version__)"
    return (
        f'py -{version} -m venv "{folder}"',
        f"{py} -m pip install --upgrade pip",
        f"{py} -m pip install {quoted}",
        f'{py} -c "{check}"',
    )


def _windows_note(spec: Any, route: str, host_platform: str) -> str:
    """What a user does after the PowerShell commands of a Windows-side route: point xstage at
    the venv from WSL, install what PyPI cannot carry (VitisAI's EP library), and, off
    Windows and WSL, that the route cannot be reached from this host at all."""
    note = (
        "Then, from WSL, set "
        f"{spec.env_var}=/mnt/c/Users/<you>/AppData/Local/xstage/envs/{route}/Scripts/python.exe "
        f'(or [routes.{route}] python = "..." in xstage.toml) and run `xstage devices`.'
    )
    if spec.plugin_ep is not None and spec.plugin_ep.locate == "vitisai":
        from xstage.routes.plugins import APPX_PACKAGE, VITISAI_ENV

        note = (
            "The venv carries onnxruntime (>= 1.25); the VitisAI EP library itself "
            f"({', '.join(spec.plugin_ep.library_names)}) is not on PyPI: it comes with the AMD NPU "
            f"driver's app package ({APPX_PACKAGE}; `Get-AppxPackage {APPX_PACKAGE}` shows whether it is "
            f"there) or with AMD Ryzen AI Software; elsewhere, set {VITISAI_ENV} to its full path. "
            "Never the light onnxruntime_providers_ryzenai.dll beside it: it runs nothing. " + note
        )
    if host_platform != "wsl":
        note = (
            f"Note: this host is neither Windows nor WSL, so {route} cannot be reached from it; "
            "the commands are for a Windows machine. " + note
        )
    return note


def plan(
    route: str,
    *,
    python: str | None = None,
    pins: Sequence[str] = (),
    variant: str | None = None,
    host_platform: str | None = None,
    cpu_vendor: str | None = None,
) -> EnvPlan:
    """Decide what ``xstage env create`` does for ``route`` (touches nothing).

    Raises:
        UsageError: unknown route or variant, a malformed ``--python`` or ``--pin``.
        EnvError: a route this host cannot have, an unpinned torch (a multi-GB download),
            or no interpreter for ``python``.
    """
    try:
        spec = find_spec(route)
    except KeyError as exc:
        raise UsageError(str(exc.args[0]), remedy="xstage devices lists every route") from None
    if spec.plugin_ep is not None and spec.plugin_ep.error:
        raise UsageError(spec.plugin_ep.error, remedy="docs/routes.md, \"Plugin EPs\", lists a table's keys")
    if host_platform is None:
        host_platform = HostInfo.current().platform
    vendor = cpu_vendor if cpu_vendor is not None else host_cpu_vendor()
    if variant is not None:
        if variant not in spec.packages:
            raise UsageError(
                f"{route} has no variant {variant!r}",
                remedy=f"variants of {route}: {', '.join(spec.variants)}",
            )
        why = "asked for with --variant"
    else:
        variant, why = default_variant(spec, vendor)
    packages = merge_pins(spec.packages[variant], pins)
    target = env_dir(route)
    common = dict(
        route=route,
        variant=variant,
        variant_reason=why,
        packages=packages,
        pins=tuple(pins),
        python_request=python,
        target=target,
    )
    if spec.os_side == "windows" and host_platform != "windows":
        note = _windows_note(spec, route, host_platform)
        return EnvPlan(
            action="powershell",
            base_python=None,
            python_version=None,
            message=note,
            powershell=powershell_commands(spec, packages, python),
            **common,  # type: ignore[arg-type]
        )
    if host_platform not in spec.platforms:
        raise EnvError(
            f"{route} cannot run on this host ({host_platform}); it needs {' or '.join(spec.platforms)}",
            remedy="xstage devices shows which routes this host can have",
        )
    torch_pinned = any(_req_name(p) == "torch" for p in pins)
    unpinned_torch = any(p.strip() == "torch" for p in packages)
    if unpinned_torch and not torch_pinned:
        if spec.reuses_current and python is None and importlib.util.find_spec("torch") is not None:
            return EnvPlan(
                action="reuse",
                base_python=sys.executable,
                python_version=_dotted(sys.version_info[:3]),
                message=f"{route} reuses the current interpreter ({sys.executable}), which imports torch: "
                "nothing to build",
                **common,  # type: ignore[arg-type]
            )
        raise EnvError(
            f"refusing to install an unpinned torch for {route}: pip would pick the newest build, "
            "which on Linux is a CUDA build of several GB",
            remedy=f"pin it: xstage env create {route} --pin torch==<version>",
        )
    base, version = find_python(python)
    if tuple(int(p) for p in version.split(".")[:2]) < (3, 9):
        raise EnvError(
            f"{base} is Python {version}; route environments need Python >= 3.9", remedy="--python 3.11"
        )
    return EnvPlan(action="build", base_python=base, python_version=version, **common)  # type: ignore[arg-type]


@dataclass(frozen=True)
class EnvInfo:
    """One route environment as found on disk."""

    route: str
    path: Path
    python: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether its interpreter is still there."""
        return self.python.is_file()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data for ``xstage env list --json``."""
        return {
            "route": self.route,
            "path": str(self.path),
            "python": str(self.python),
            "ok": self.ok,
            "variant": self.manifest.get("variant"),
            "python_version": self.manifest.get("python_version"),
            "packages": self.manifest.get("packages", []),
            "installed": self.manifest.get("installed", {}),
            "pins": self.manifest.get("pins", []),
            "created": self.manifest.get("created"),
        }


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise EnvError(f"{what}: cannot start {argv[0]}: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        text = (done.stdout + "\n" + done.stderr).strip().splitlines()
        # pip's harmless "Location ... is ignored" lines would crowd out the real error.
        useful = [line for line in text if "is ignored: it is neither a file nor a directory" not in line]
        tail = "\n".join(useful[-_PIP_TAIL_LINES:])
        raise EnvError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _retarget(tmp: Path, final: Path) -> None:
    """Rewrite the build folder's path to the final one in scripts and pyvenv.cfg."""
    old, new = str(tmp), str(final)
    files = [tmp / "pyvenv.cfg"]
    for sub in ("bin", "Scripts"):
        if (tmp / sub).is_dir():
            files += [p for p in (tmp / sub).iterdir() if p.is_file() and not p.is_symlink()]
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if old.encode() in data and b"\0" not in data[:4096]:
            path.write_bytes(data.replace(old.encode(), new.encode()))


def create(
    the_plan: EnvPlan, *, force: bool = False, progress: Callable[[str], None] | None = None
) -> EnvInfo:
    """Build the env ``the_plan`` describes (``action == "build"``), atomically.

    Side effects: creates ``the_plan.target`` (replacing it when ``force``); pip downloads.

    Raises:
        EnvError: the plan is not a build, the env exists and ``force`` is False, or
            venv/pip failed (the message carries pip's last lines).
    """
    say = progress or (lambda _msg: None)
    if the_plan.action != "build" or the_plan.base_python is None:
        raise EnvError(f"nothing to build for {the_plan.route} ({the_plan.action})")
    target = the_plan.target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Two `env create` of one route at once: the second waits for the first, then finds its env.
    with locked(locks_dir() / f"env-{target.name}.lock"):  # not in envs/: it lists envs
        if target.exists() and not force:
            raise EnvError(
                f"an environment for {the_plan.route} already exists at {target}",
                remedy=f"xstage env create {the_plan.route} --force, or xstage env remove {the_plan.route}",
            )
        return _build(the_plan, target, say)


def _build(the_plan: EnvPlan, target: Path, say: Callable[[str], None]) -> EnvInfo:
    """``create``'s work, under the route's lock: a venv in a temp folder, renamed into place."""
    assert the_plan.base_python is not None
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-build-", dir=target.parent))
    try:
        say(f"creating a venv with Python {the_plan.python_version} ({the_plan.base_python})")
        _run([the_plan.base_python, "-m", "venv", str(tmp)], "python -m venv")
        py = venv_python(tmp)
        say(f"installing {' '.join(the_plan.packages)}")
        _run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                *the_plan.packages,
            ],
            f"pip install {' '.join(the_plan.packages)}",
        )
        listing = _run(
            [str(py), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], "pip list"
        )
        try:
            installed = {_norm(row["name"]): row["version"] for row in json.loads(listing)}
        except (ValueError, KeyError, TypeError):
            installed = {}
        wanted = {_req_name(p) for p in the_plan.packages}
        manifest = {
            "schema": 1,
            "route": the_plan.route,
            "variant": the_plan.variant,
            "python": str(venv_python(target)),
            "base_python": the_plan.base_python,
            "python_version": the_plan.python_version,
            "packages": list(the_plan.packages),
            "pins": list(the_plan.pins),
            "installed": {k: v for k, v in sorted(installed.items()) if k in wanted},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "xstage_version": __version__,
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _retarget(tmp, target)
        trash = None
        if target.exists():
            trash = target.with_name(f".{target.name}-old-{os.getpid()}")
            os.replace(target, trash)
        os.replace(tmp, target)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return EnvInfo(route=the_plan.route, path=target, python=venv_python(target), manifest=manifest)


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def list_envs() -> list[EnvInfo]:
    """Every route environment under ``XSTAGE_HOME/envs`` (half-built folders excluded)."""
    out = []
    for child in sorted(envs_dir().iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        manifest = _read_manifest(child)
        route = manifest.get("route") if isinstance(manifest.get("route"), str) else child.name
        out.append(EnvInfo(route=route, path=child, python=venv_python(child), manifest=manifest))
    return out


def remove(route: str) -> Path:
    """Delete ``route``'s environment; returns the folder it was in.

    Raises:
        EnvError: there is no environment for ``route``.
    """
    if "/" in route or "\\" in route or route.startswith("."):
        raise EnvError(f"not a route name: {route!r}")
    target = env_dir(route)
    with locked(locks_dir() / f"env-{target.name}.lock"):  # not while `env create` renames it
        if not target.is_dir():
            raise EnvError(f"no environment for {route} under {envs_dir()}", remedy="xstage env list")
        trash = target.with_name(f".{target.name}-removing-{os.getpid()}")
        os.replace(target, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return target
