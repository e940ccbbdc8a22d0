"""Installing xstage: the user's onnxruntime distribution kept, and Python 3.10.

Every onnxruntime distribution ships the same ``onnxruntime`` module, so a hard dependency on one
of them replaces the others; xstage depends on none (the extras ``cpu``, ``openvino``, ``gpu``,
``directml`` pick one). Both tests build venvs: the venv with a distribution (or pyenv's 3.10) is
built once into the test cache (``XSTAGE_TEST_CACHE``), and each run installs this checkout into
it again and runs the main job's command there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pkgindex
import pytest

pytestmark = pytest.mark.network

_OPENVINO = "import onnxruntime as o; assert 'OpenVINOExecutionProvider' in o.get_available_providers()"

#: The repository (``tests/conftest.py``'s ``REPO``; a module named ``conftest`` is not importable
#: by name here: pytest loads several).
REPO = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """The persistent test cache, as ``tests/conftest.py`` resolves it."""
    return Path(os.environ.get("XSTAGE_TEST_CACHE", REPO / ".test-cache"))


def _clean_env(home: Path) -> dict[str, str]:
    """This test's environment without PYTHONPATH: the venv runs the xstage installed in it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("XSTAGE_PYTHON_")}
    env["XSTAGE_HOME"] = str(home)
    return env


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 900,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def _cached_venv(slot: str, base_python: str, packages: list[str], check: str) -> Path:
    """A venv of ``base_python`` holding ``packages``, built once under the test cache."""
    root = cache_root() / slot
    root.mkdir(parents=True, exist_ok=True)
    python = root / "venv" / "bin" / "python"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.is_file() and _run([str(python), "-c", check], timeout=300).returncode == 0:
            return python
        pkgindex.require(f"building the {slot} test venv")
        shutil.rmtree(root / "venv", ignore_errors=True)
        done = _run([base_python, "-m", "venv", str(root / "venv")], timeout=300)
        assert done.returncode == 0, done.stderr
        if packages:
            done = _run([str(python), "-m", "pip", "install", "-q", *packages])
            if done.returncode != 0:
                pytest.skip(f"cannot build the {slot} test venv: pip install {' '.join(packages)}: "
                            f"{done.stderr[-400:]}")
        done = _run([str(python), "-c", check], timeout=300)
        assert done.returncode == 0, done.stderr
    return python


def _install(python: Path, spec: str) -> None:
    done = _run([str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", spec])
    assert done.returncode == 0, done.stderr[-2000:]
    # Then with dependencies, as a user's `pip install xstage` does: it must add no onnxruntime.
    done = _run([str(python), "-m", "pip", "install", "-q", spec])
    assert done.returncode == 0, done.stderr[-2000:]


def test_install_keeps_the_users_openvino_distribution(tmp_path):
    """``pip install xstage`` into a venv holding onnxruntime-openvino: the OpenVINO EP is still
    listed after, no second distribution came in, and the main job's stage runs on ort-openvino."""
    python = _cached_venv("install-openvino", sys.executable, ["onnxruntime-openvino"], _OPENVINO)
    _install(python, str(REPO))
    env = _clean_env(tmp_path / "home")
    after = _run([str(python), "-c", _OPENVINO + "; import xstage; print(xstage.__file__)"], env=env)
    assert after.returncode == 0, after.stderr
    assert str(python.parent.parent) in after.stdout  # the installed copy, not this checkout
    listed = _run([str(python), "-m", "pip", "list", "--format=freeze"], env=env)
    dists = sorted(line.split("==")[0].lower() for line in listed.stdout.splitlines()
                   if line.lower().startswith("onnxruntime"))
    assert dists == ["onnxruntime-openvino"], listed.stdout
    xstage = python.parent / "xstage"
    ran = _run([str(xstage), "external", "--builtin", "vision-tower-tiny", "--route", "ort-openvino",
                "--runs", "3"], env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "ort-openvino" in ran.stdout


def _python310() -> str:
    found = sorted(Path("/root/.pyenv/versions").glob("3.10*/bin/python3"))
    if not found:
        pytest.skip("no pyenv CPython 3.10 under /root/.pyenv/versions")
    return str(found[-1])


def py310_venv() -> Path:
    """The cached CPython 3.10 venv with xstage's dependencies (no xstage): built on first use,
    whichever test asks first (a cold cache must not skip the others)."""
    return _cached_venv("py310-cpu", _python310(), ["onnxruntime", "tomli", "numpy", "onnx", "onnx-ir",
                                                    "psutil", "platformdirs", "rich", "ml_dtypes"],
                        "import sys, onnxruntime, tomli; assert sys.version_info[:2] == (3, 10)")


def test_python310_runs_the_main_job(tmp_path):
    """A venv of CPython 3.10 with ``xstage[cpu]``: ``xstage devices`` and the main job's
    ``xstage external --builtin vision-tower-tiny`` run (tomli stands in for tomllib)."""
    python = py310_venv()
    _install(python, f"{REPO}[cpu]")
    env = _clean_env(tmp_path / "home")
    # A project config naming the route's interpreter: read through tomli on 3.10.
    (tmp_path / "xstage.toml").write_text(f'[routes.ort-cpu]\npython = "{python}"\n')
    xstage = str(python.parent / "xstage")
    # (Trusted for this run by naming it: an untrusted project file is ignored, docs/security.md.)
    devices = _run([xstage, "devices", "--json", "--project-config", "xstage.toml"], env=env, cwd=tmp_path)
    assert devices.returncode == 0, devices.stderr
    ort_cpu = next(r for r in json.loads(devices.stdout)["routes"] if r["name"] == "ort-cpu")
    assert ort_cpu["status"] == "resolved" and ort_cpu["interpreter_source"] == "project_config", ort_cpu
    ran = _run([xstage, "external", "--builtin", "vision-tower-tiny", "--runs", "3"], env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
