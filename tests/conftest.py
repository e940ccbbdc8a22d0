"""Fixtures shared by the whole suite.

* Every test runs with its own ``XSTAGE_HOME`` and user config file (autouse), and with no
  ``XSTAGE_PYTHON_*`` variable inherited from the developer's shell; under them the run has a
  home of its own (``pytest_configure``), so nothing reaches the developer's real home.
* Real second interpreters are built once and kept in a persistent cache,
  ``XSTAGE_TEST_CACHE`` (default ``<repo>/.test-cache/``), through xstage's own
  ``env create`` code, so re-runs cost nothing: ``py39_ort119_python`` (CPython 3.9 with
  onnxruntime 1.19.2 and numpy<2), ``openvino_python`` (the ``ort-openvino`` env, built-in
  EP variant), ``openvino_plugin_python`` (the plugin EP variant) and ``torch_python``
  (torch 2.13.0, only where pip can take it from local disk: anything else is a download of
  several GB, so the fixture skips instead).
* Exports run in the export venv are kept in the same cache (``runs/``) by ``tests/runcache.py``,
  keyed by the command, its inputs, the venv's packages and the hash of every module the export
  imported: a later run (or the other test process) copies them until that code changes.
* Tests marked ``slow`` (long by nature: soaks, many start/kill cycles, full exports that a
  smaller test of the same code already covers) are skipped by default, saying how to run them:
  ``--run-slow`` or ``XSTAGE_SLOW=1`` runs them too (``python3 -m pytest -q --run-slow`` is the
  whole suite). The default run keeps at least one real test of every feature.
* Tests that reach the package index are marked ``network``: explicitly when every run does
  (the hook below skips them when the index cannot be reached), automatically when they use a
  fixture that fills the test cache from the index (``NETWORK_FIXTURES``; the fixture skips, and
  only on a cache miss). ``pkgindex`` says why: ``XSTAGE_OFFLINE=1``, ``PIP_NO_INDEX``, or pip's
  own quick check.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pkgindex
import pytest

REPO = Path(__file__).resolve().parent.parent

#: Fixtures that fill the test cache from the package index on a miss (what they fetch).
NETWORK_FIXTURES = {
    "py39_ort119_python": "the py39-ort119 test env",
    "openvino_python": "the ort-openvino test env",
    "openvino_plugin_python": "the ort-openvino plugin test env",
    "torch_python": "the torch-cpu test env",
    "ggml_python": "the ort-plugin:ggml test env",
    "export_python": "the export test env",
    "thirdparty": "the third-party graphs' wheels",
    "thirdparty_graphs": "the third-party graphs' wheels",
}


#: The run's own XSTAGE_HOME, made in ``pytest_configure`` (None before).
_SESSION_HOME: str | None = None

#: Why a ``slow`` test skipped, and how to run it.
SLOW_REASON = "slow: skipped by default; run it with --run-slow or XSTAGE_SLOW=1"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--run-slow``: also run the tests marked ``slow``."""
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (skipped by default); XSTAGE_SLOW=1 does the same")


def run_slow(config: pytest.Config) -> bool:
    """Whether this run includes the tests marked ``slow``."""
    return bool(config.getoption("--run-slow")) or os.environ.get("XSTAGE_SLOW", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module is imported (and before pytest-xdist starts its workers, which
    inherit the environment): ``--run-slow`` sets ``XSTAGE_SLOW=1``, so what modules generate at
    import (``fuzz_examples``, the adversarial corpus) can ask ``slow_run()``; and the adversarial
    corpus's seed is drawn once (``XSTAGE_ADV_SEED``, unless given), so every worker generates the
    same cases and the printed seed repeats the whole run."""
    if config.getoption("--run-slow", default=False):
        os.environ["XSTAGE_SLOW"] = "1"
    # A home of the run's own under everything: the autouse fixture gives each test a fresh one,
    # but an environment captured at a module's import (before any fixture) would otherwise be
    # the developer's real home, whose envs and records a test must neither read nor write (the
    # README's first command makes an env there).
    global _SESSION_HOME
    _SESSION_HOME = tempfile.mkdtemp(prefix="xstage-test-home-")
    os.environ["XSTAGE_HOME"] = _SESSION_HOME
    os.environ["XSTAGE_CONFIG"] = os.path.join(_SESSION_HOME, "no-user-config.toml")
    if not os.environ.get("XSTAGE_ADV_SEED", "").strip():
        import random

        os.environ["XSTAGE_ADV_SEED"] = str(random.SystemRandom().randrange(1, 2**31))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's own home (``pytest_configure``) goes with the run."""
    if _SESSION_HOME:
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each adversarial case that finished (its ``adv_tally`` property) for the table: the
    report reaches this hook in the process that prints the summary, with pytest-xdist too."""
    for name, value in getattr(report, "user_properties", ()):
        if name == "adv_tally" and report.when == "call":
            folder = str(REPO / "tests" / "adversarial")
            if folder not in sys.path:
                sys.path.insert(0, folder)
            import adv_corpus

            klass, as_expected, false_placed, xfail = value
            adv_corpus.tally(klass, as_expected=as_expected, false_placed=false_placed, xfail=xfail)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """The adversarial corpus's table of classes and counts, when any of its cases ran."""
    corpus = sys.modules.get("adv_corpus")
    if corpus is None or not corpus.RESULTS:
        return
    terminalreporter.write_sep("-", "adversarial corpus")
    terminalreporter.write_line(corpus.table(int(os.environ["XSTAGE_ADV_SEED"], 0)))


def slow_run() -> bool:
    """Whether this run includes the tests marked ``slow`` (for code that runs at import)."""
    return os.environ.get("XSTAGE_SLOW", "") not in ("", "0")


def fuzz_examples(n: int) -> int:
    """A fuzz test's hypothesis examples: ``n`` with ``--run-slow``, a fifth of it (at least 50)
    by default: the same strategies, fewer draws (each run draws new ones)."""
    return n if slow_run() else max(50, n // 5)


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``network`` every test that uses a fixture in NETWORK_FIXTURES; skip every test marked
    ``slow`` unless the run asked for them (SLOW_REASON says how)."""
    skip_slow = not run_slow(config)
    bare = slow_without_reason(items)
    if bare:  # the slow list carries its reasons (the README's test section)
        raise pytest.UsageError("tests marked slow without a reason (give "
                                "@pytest.mark.slow(reason=...) why the default run can skip it): "
                                + ", ".join(bare))
    whole = not (config.option.keyword or config.option.markexpr) and not any(
        "::" in str(arg) for arg in config.args)
    lacking = modules_without_default(items) if whole else []
    if lacking:  # every module keeps a test the default run takes
        raise pytest.UsageError("test modules whose every test is marked slow (keep one the "
                                "default run takes): " + ", ".join(lacking))
    for item in items:
        needs = sorted(set(getattr(item, "fixturenames", ())) & NETWORK_FIXTURES.keys())
        if needs:
            item.add_marker(pytest.mark.network(on_miss=tuple(needs)))
        mark = item.get_closest_marker("slow")
        if skip_slow and mark is not None:
            item.add_marker(pytest.mark.skip(reason=slow_reason(mark)))


def slow_without_reason(items: list[pytest.Item]) -> list[str]:
    """The tests (parameters folded) marked ``slow`` with no reason of their own."""
    return sorted({item.nodeid.split("[")[0] for item in items
                   if (m := item.get_closest_marker("slow")) is not None
                   and not (m.kwargs.get("reason") or m.args)})


def modules_without_default(items: list[pytest.Item]) -> list[str]:
    """The modules among ``items`` whose every test is marked ``slow``."""
    default: dict[str, bool] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        default[module] = default.get(module, False) or item.get_closest_marker("slow") is None
    return sorted(m for m, has in default.items() if not has)


def slow_reason(mark: pytest.Mark) -> str:
    """SLOW_REASON, with the marker's own reason (``@pytest.mark.slow(reason=...)``) first."""
    why = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
    if not why:
        return SLOW_REASON
    return f"slow ({why}): skipped by default; run it with --run-slow or XSTAGE_SLOW=1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked ``network`` (not only on a cache miss) when the index is out of reach."""
    if any(not mark.kwargs.get("on_miss") for mark in item.iter_markers("network")):
        pkgindex.require(item.name)


def cache_root() -> Path:
    """The persistent folder for venvs built by the tests."""
    root = Path(os.environ.get("XSTAGE_TEST_CACHE", REPO / ".test-cache"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(autouse=True)
def xstage_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh XSTAGE_HOME and an empty user config for each test."""
    home = tmp_path_factory.mktemp("xstage-home")
    monkeypatch.setenv("XSTAGE_HOME", str(home))
    monkeypatch.setenv("XSTAGE_CONFIG", str(home / "no-user-config.toml"))
    for name in list(os.environ):
        if name.startswith("XSTAGE_PYTHON_") or name == "XSTAGE_PROBE_TIMEOUT":
            monkeypatch.delenv(name)
    return home


@pytest.fixture(scope="session")
def thirdparty_graphs() -> dict[str, Path]:
    """Every third-party graph of ``tests/thirdparty.py``, fetched once into the test cache
    (under its lock, so two test processes never fetch at once); skips if a miss needs the
    package index and it is out of reach. Any module may use it: none waits for another to run
    first."""
    import thirdparty

    cache = Path(os.environ.get("XSTAGE_TEST_CACHE", REPO / ".test-cache")) / "thirdparty"
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in sorted(thirdparty.GRAPHS):
            hit = thirdparty.cached(name, cache)
            if hit is None:
                pkgindex.require(f"fetching the wheel of {name}")
            try:
                out[name] = hit or thirdparty.fetch(name, cache)
            except thirdparty.FetchError as exc:
                if exc.registry_unreachable:
                    pytest.skip(f"the package index is unreachable, cannot fetch {name}: {exc.message}")
                raise
    return out


@contextlib.contextmanager
def _home(path: Path) -> Iterator[None]:
    old = os.environ.get("XSTAGE_HOME")
    os.environ["XSTAGE_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("XSTAGE_HOME", None)
        else:
            os.environ["XSTAGE_HOME"] = old


def _works(python: Path, check: str) -> bool:
    """``check`` runs in ``python``: once per test run, not once per test process (the export
    env's check imports torch and transformers, ~3 s), when pytest-xdist names the run."""
    if not python.is_file():
        return False
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    stamp = None
    if run_id:
        key = hashlib.sha256(f"{python}\0{check}".encode()).hexdigest()[:16]
        stamp = cache_root() / ".checked" / f"{key}-{run_id}"
        if stamp.is_file():
            return True
    done = subprocess.run([str(python), "-c", check], capture_output=True, timeout=300)
    if done.returncode != 0:
        return False
    if stamp is not None:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        for old in stamp.parent.glob(f"{key}-*"):
            old.unlink(missing_ok=True)
        stamp.touch()
    return True


def build_cached_env(
    slot: str, route: str, *, check: str, python: str | None = None, pins: tuple[str, ...] = (), variant=None
) -> Path:
    """Build ``route``'s env once into the test cache (through ``xstage env create``'s code).

    ``slot`` names the cache folder; the env is reused while ``check`` runs in it.
    """
    from xstage.errors import EnvError
    from xstage.routes import envs

    home = cache_root() / slot
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock, _home(home):
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes build each env once
        target = envs.env_dir(route)
        interpreter = envs.venv_python(target)
        if _works(interpreter, check):
            return interpreter
        pkgindex.require(f"building the {route} test env ({slot})")
        try:
            plan = envs.plan(route, python=python, pins=pins, variant=variant)
            info = envs.create(plan, force=True)
        except EnvError as exc:
            pytest.skip(f"cannot build the {route} test env ({slot}): {exc.message}")
    if not _works(info.python, check):
        pytest.fail(f"the {route} env built in {info.path} does not pass {check!r}")
    return info.python


@pytest.fixture(scope="session")
def py39_ort119_python() -> Path:
    """CPython 3.9 with onnxruntime 1.19.2 and numpy<2 (no EP-device API, old profiles)."""
    return build_cached_env(
        "py39-ort119",
        "ort-cpu",
        python="3.9",
        pins=("onnxruntime==1.19.2",),
        check="import sys, onnxruntime, numpy; assert sys.version_info[:2] == (3, 9); "
        "assert onnxruntime.__version__ == '1.19.2'; assert numpy.__version__ < '2'",
    )


@pytest.fixture(scope="session")
def openvino_python() -> Path:
    """The ``ort-openvino`` env (built-in EP: onnxruntime-openvino), as env create makes it."""
    return build_cached_env(
        "ort-openvino",
        "ort-openvino",
        variant="builtin",
        check="import onnxruntime as o; assert 'OpenVINOExecutionProvider' in o.get_available_providers()",
    )


@pytest.fixture(scope="session")
def openvino_plugin_python() -> Path:
    """The ``ort-openvino`` env, plugin variant (onnxruntime + onnxruntime-ep-openvino)."""
    return build_cached_env(
        "ort-openvino-plugin",
        "ort-openvino",
        variant="plugin",
        check="import onnxruntime, onnxruntime_ep_openvino",
    )


def trust_project(folder: Path, text: str | None = None) -> Path:
    """``folder/xstage.toml`` (written with ``text`` when given) trusted in the user config.

    A project file is used only once trusted (docs/routes.md, "Project files"): tests that
    write one trust it here, in the user config ``XSTAGE_CONFIG`` names at the time.
    """
    from xstage.routes import config as cfg

    path = folder / "xstage.toml"
    if text is not None:
        path.write_text(text)
    cfg.trust(path)
    return path


@pytest.fixture
def trusted_toml():
    """``trusted_toml(folder, text)``: write ``folder/xstage.toml`` and trust it."""
    return trust_project


#: The ``[plugins.ggml]`` table of the ``ort-plugin:ggml`` route (also shown in docs/routes.md).
GGML_TABLE = REPO / "tests" / "fixtures" / "plugins" / "ggml.toml"


@pytest.fixture(scope="session")
def ggml_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder whose ``xstage.toml`` holds the ``[plugins.ggml]`` table."""
    folder = tmp_path_factory.mktemp("ggml-project")
    shutil.copyfile(GGML_TABLE, folder / "xstage.toml")
    return folder


@pytest.fixture
def ggml_project(ggml_folder: Path) -> Path:
    """``ggml_folder`` with its ``xstage.toml`` trusted in this test's user config."""
    trust_project(ggml_folder)
    return ggml_folder


@pytest.fixture(scope="session")
def ggml_python(ggml_folder: Path) -> Path:
    """The ``ort-plugin:ggml`` env (onnxruntime 1.30 + onnxruntime-ggml 0.2.0, Python >= 3.11),
    built by ``env create``'s code from the table, so the live plugin-EP tests run a real one."""
    if sys.version_info[:2] < (3, 11):
        pytest.skip("onnxruntime-ggml needs Python >= 3.11")
    trust_project(ggml_folder)  # in the user config of the test that builds it
    with contextlib.chdir(ggml_folder):
        return build_cached_env(
            "ort-plugin-ggml", "ort-plugin:ggml",
            check="import onnxruntime, onnxruntime_ggml; assert onnxruntime_ggml.__version__ == '0.2.0'",
        )


def _torch_wheel_is_local(pin: str) -> bool:
    """Whether pip can take ``pin`` from local find-links alone (no multi-GB download)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "--quiet", pin],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode == 0


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """A venv with torch 2.13.0 (CPU build), built only from a wheel on local disk."""
    pin = "torch==2.13.0"
    slot = cache_root() / "torch"
    marker = slot / "envs" / "torch-cpu" / "bin" / "python"
    if not marker.is_file() and (sys.version_info[:2] != (3, 11) or not _torch_wheel_is_local(pin)):
        pytest.skip(f"{pin} is not on local disk for this Python; installing it would download GBs")
    return build_cached_env("torch", "torch-cpu", pins=(pin,), check="import torch")


@pytest.fixture
def fake_python(tmp_path: Path):
    """Fault injection: an executable "python" that runs ``body`` (a shell script)."""

    def make(body: str, name: str = "python") -> Path:
        path = tmp_path / "fake-bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
        return path

    return make


def _dependency_stamp() -> str:
    """A hash of what pip installs into the export venv (``.[export,cpu]``), and nothing else: a change
    to a tool section or to another extra (test, ray) must not rebuild a venv of several hundred MB."""
    import hashlib
    import json

    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = data.get("project", {})
    wanted = {"build-system": data.get("build-system"), "requires-python": project.get("requires-python"),
              "dependencies": project.get("dependencies"),
              "export": project.get("optional-dependencies", {}).get("export"),
              "cpu": project.get("optional-dependencies", {}).get("cpu")}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]


@pytest.fixture(scope="session")
def export_python() -> Path:
    """A venv with torch 2.13.0 (CPU, from local disk), transformers and this xstage with its
    ``export`` extra: the exporters run there, as a user's export environment would.

    Rebuilt when ``pyproject.toml``'s dependencies change; skipped where torch 2.13.0 is not on local disk
    for this Python (installing it would download GBs).
    """

    pin = "torch==2.13.0"
    stamp = _dependency_stamp()
    # One folder per stamp: checkouts with different dependencies (branches sharing one
    # XSTAGE_TEST_CACHE) never rebuild each other's venv under a test that is using it.
    root = cache_root() / f"export-{stamp}"
    python = root / "venv" / "bin" / "python"
    marker = root / f"built-{stamp}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and _works(python, "import torch, transformers, xstage.export.torch_export"):
            return python
        if sys.version_info[:2] != (3, 11) or not _torch_wheel_is_local(pin):
            pytest.skip(f"{pin} is not on local disk for this Python; installing it would download GBs")
        pkgindex.require("building the export test env (pip install -e .[export,cpu])")
        shutil.rmtree(root / "venv", ignore_errors=True)
        for old in root.glob("built-*"):
            old.unlink()
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
        for args in ([pin], ["-e", f"{REPO}[export,cpu]"]):
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args],
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                pytest.skip(f"cannot build the export test env: pip install {' '.join(args)} "
                            f"failed: {done.stderr[-500:]}")
        marker.write_text("ok\n")
    return python
