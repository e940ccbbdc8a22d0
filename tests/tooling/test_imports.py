"""The import graph of ``src/`` keeps the architecture's shape: layers, purity, no cycles.

Static: the files are parsed with ``ast``, never imported. Rules of the graph:

* Case 1: every ``import``/``from … import`` counts, inside functions too, except under
  ``if TYPE_CHECKING:`` (type-only imports cost nothing at run time).
* Case 2: ``from a.b import c`` where ``a/b/c.py`` (or ``a/b/c/``) exists is an edge to ``a.b.c``;
  otherwise to ``a.b``.
* Case 3: importing a submodule is an edge to that submodule only, not to its parent package's
  ``__init__`` (Python runs the parent too, but that is the package's business, not a dependency).
* Case 4: a name outside ``src/`` is kept by its top-level name (``urllib.request`` → ``urllib``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: Layers, top to bottom, by module prefix; a module may import its own layer or below only.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("api", ("xstage", "xstage.__main__")),  # the package's public surface re-exports the layers
    ("cli", ("xstage.cli",)),
    # bisect opens stages (probes, the split's regions): above stage; its search and cost
    # arithmetic are pure (below).
    ("bisect", ("xstage.bisect",)),
    # Reports draw records the cli has read: renderers over a pure view model (docs/reports.md).
    ("report", ("xstage.report",)),
    # A stage inside another library's pipeline (transformers): a user of the stage API.
    ("integrations", ("xstage.integrations",)),
    # A stage on a cluster node (docs/cluster.md): beside stage, not above it, because open_stage
    # dispatches to it; it never imports the admission path (open_stage hands itself over).
    ("stage", ("xstage.stage", "xstage.cluster")),
    ("planning", ("xstage.planner", "xstage.device_table", "xstage.builtin_graphs", "xstage.export")),
    ("routes", ("xstage.routes",)),
    # A record describes the host it ran on, so it reads host facts (not beside the pure modules:
    # it writes files and reads /proc, so it sits above host).
    ("record", ("xstage.record",)),
    # Host facts come partly from machine tools (nvidia-smi, powershell.exe), which only the
    # client's one tool runner starts: host sits above client.
    ("host", ("xstage.host",)),
    ("client", ("xstage.client",)),
    ("pure", ("xstage.evidence", "xstage.parity", "xstage.ledger", "xstage.timings",
              "xstage.bisect.search", "xstage.bisect.cost")),
    ("foundation", ("xstage.artifact", "xstage.manifest", "xstage.inputs", "xstage.signature",
                    "xstage.errors", "xstage.refusal", "xstage.home", "xstage._version",
                    "xstage.exit_codes", "xstage.graph_precision", "xstage.snapshot",
                    "xstage.compile_cache")),
    ("wire", ("xstage_remote",)),
)
PURE = LAYERS[[name for name, _ in LAYERS].index("pure")][1]
#: What pure modules may import from xstage besides each other.
PURE_MAY_USE = ("xstage.errors", "xstage.artifact")
#: The outside world: files, processes, sockets, threads, the runtime.
IMPURE = frozenset({
    "os", "pathlib", "io", "shutil", "tempfile", "glob", "mmap", "subprocess", "multiprocessing",
    "signal", "socket", "ssl", "select", "selectors", "asyncio", "urllib", "http", "threading",
    "onnxruntime",
})
PROCESSES = frozenset({"subprocess", "multiprocessing"})
#: The xstage packages that start processes: workers (client) and route probes and envs (routes).
# xstage.export runs exporters in this interpreter, so it is not here; xstage_remote (the worker
# side, its own package) may ask nvidia-smi and is outside this rule.
MAY_SPAWN = ("xstage.client", "xstage.routes")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _files() -> dict[str, Path]:
    return {_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):  # Case 1
            for other in child.orelse:
                yield from _import_nodes_of(other)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _import_nodes(node)


def _deepest(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module in ``src/`` (Case 3), else None."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in _files():
            return ".".join(parts)
        parts.pop()
    return None


@cache
def imports(module: str) -> frozenset[str]:
    """What ``module`` imports: module names in ``src/``, top-level names outside it (Case 4)."""
    path = _files()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package, str(path))


def imports_in(source: str, package: str, where: str = "<source>") -> frozenset[str]:
    """What ``source``, a module of ``package``, imports (Cases 1-4)."""
    wanted: list[str] = []
    for node in _import_nodes(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            wanted += [alias.name for alias in node.names]
            continue
        base = node.module or ""
        if node.level:  # relative (xstage_remote only)
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            wanted.append(full if full in _files() else base)  # Case 2
    return frozenset(_deepest(name) or name.split(".")[0] for name in wanted)


def internal(module: str) -> set[str]:
    """The ``src/`` modules ``module`` imports."""
    return {name for name in imports(module) if name in _files()}


def _layer(module: str) -> int | None:
    """The index in LAYERS of the longest prefix that holds ``module`` ("xstage" only itself)."""
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            holds = module == prefix or (prefix != "xstage" and module.startswith(prefix + "."))
            if holds and (best is None or len(prefix) > best[0]):
                best = (len(prefix), i)
    return None if best is None else best[1]


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(internal(node)):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in internal(node):
                found.append(sorted(component))

    for module in _files():
        if module not in index:
            visit(module)
    return found


XSTAGE = [m for m in _files() if _under(m, ("xstage",))]
PURE_MODULES = [m for m in _files() if _under(m, PURE)]

#: Violations being removed now; strict, so each fails once it is gone.
PENDING = {
}


def _cases(rule: str, modules: list[str]) -> list:
    return [
        pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=PENDING[rule, m]))
        if (rule, m) in PENDING else m
        for m in modules
    ]


def test_the_walker_follows_its_cases() -> None:
    """Each numbered case of the module docstring, on a made-up module of xstage.routes."""
    source = (
        "import os.path\n"
        "from typing import TYPE_CHECKING\n"
        "from xstage.host import hardware\n"  # Case 2: a module
        "from xstage.routes import ReasonCode\n"  # Case 2: a name, so the package
        "import xstage.client.staging\n"  # Case 3: not xstage.client
        "from . import specs\n"
        "if TYPE_CHECKING:\n"
        "    from xstage.planner import Plan\n"  # Case 1: type-only
        "else:\n"
        "    import urllib.request\n"  # Case 4
        "def later():\n"
        "    from xstage.stage import open_stage\n"  # Case 1: inside a function
    )
    assert imports_in(source, "xstage.routes") == {
        "os", "typing", "xstage.host.hardware", "xstage.routes", "xstage.client.staging",
        "xstage.routes.specs", "urllib", "xstage.stage",
    }


def test_the_graph_sees_the_package() -> None:
    """A guard on the walker itself: known edges are found, type-only imports are not."""
    assert "xstage.routes.specs" in internal("xstage.routes.envs")
    assert "xstage.client.tools" in internal("xstage.host.hardware")
    assert "xstage_remote.wire" in internal("xstage_remote.shm")  # relative import
    assert "subprocess" in imports("xstage.client.worker")
    assert len(XSTAGE) > 50


def test_every_module_has_a_layer() -> None:
    missing = [m for m in _files() if _layer(m) is None]
    assert not missing, f"add these modules to LAYERS in {Path(__file__).name}: {missing}"


def test_the_worker_package_does_not_import_xstage() -> None:
    """xstage_remote is copied alone onto foreign interpreters: xstage is not there."""
    bad = {m: sorted(n for n in imports(m) if _under(n, ("xstage",)))
           for m in _files() if _under(m, ("xstage_remote",))}
    bad = {m: names for m, names in bad.items() if names}
    assert not bad, f"xstage_remote imports xstage: {bad}"


#: What the client side may use of the worker package: the package root (its version and hash),
#: the wire (frames, and the shared region's layout), the socket path's spin before blocking
#: and one stdlib-only module.
SHARED_WITH_WORKER = ("xstage_remote", "xstage_remote.wire", "xstage_remote.shm",
                      "xstage_remote.sockspin", "xstage_remote.formats",
                      "xstage_remote.device_slots", "xstage_remote.tuning")


def test_xstage_shares_only_the_wire_with_the_worker_package() -> None:
    """The worker's own modules (its runtimes, its main loop) are not the client's to import."""
    bad = {m: sorted(n for n in internal(m) if _under(n, ("xstage_remote",))
                     and n not in SHARED_WITH_WORKER) for m in XSTAGE}
    bad = {m: names for m, names in bad.items() if names}
    assert not bad, f"xstage imports worker-only modules: {bad}"


def test_the_shared_module_is_standard_library_only() -> None:
    assert imports("xstage_remote.formats") <= {"zipfile"}


@pytest.mark.parametrize("module", _cases("pure", PURE_MODULES))
def test_pure_modules_touch_no_outside_world(module: str) -> None:
    """Evidence, parity, the ledger and timings are functions of their arguments."""
    names = imports(module)
    impure = sorted(n for n in names if n in IMPURE)
    reach = sorted(n for n in names if _under(n, ("xstage",)) and not _under(n, PURE + PURE_MAY_USE))
    assert not impure, f"{module} imports {impure}; pass data in instead (type-only: TYPE_CHECKING)"
    assert not reach, f"{module} imports {reach}; pure modules use only each other, errors, artifact"


def test_the_report_view_model_is_pure() -> None:
    """xstage.report.view turns a record into what every renderer draws: data in, data out."""
    names = imports("xstage.report.view")
    assert not sorted(n for n in names if n in IMPURE or _under(n, ("xstage",)))


@pytest.mark.parametrize("module", _cases("spawn", XSTAGE))
def test_only_client_and_routes_start_processes(module: str) -> None:
    if _under(module, MAY_SPAWN):
        return
    spawn = sorted(imports(module) & PROCESSES)
    assert not spawn, f"{module} imports {spawn}; processes start in {MAY_SPAWN} only"


@pytest.mark.parametrize("module", _cases("layer", list(_files())))
def test_layers_import_downward_only(module: str) -> None:
    mine = _layer(module)
    above = []
    for other in sorted(internal(module)):
        theirs = _layer(other)
        if mine is not None and theirs is not None and theirs < mine:
            above.append(f"{other} ({LAYERS[theirs][0]})")
    assert not above, f"{module} ({LAYERS[mine][0]}) imports a layer above it: {', '.join(above)}"


def test_no_import_cycle() -> None:
    cycles = _cycles()
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)
