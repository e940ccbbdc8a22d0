"""The transport's shape (docs/architecture.md): files of a readable size in ``client/`` and
``xstage_remote/``, an interface the pipeline keeps to, and no import cycle anywhere in ``src/``,
type-only imports included (``test_imports.py`` leaves those out: they cost nothing at run
time, but a type-only cycle still ties two modules that should be separable).

Static: the files are parsed with ``ast``, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
#: The longest a module of ``client/`` may be.
MAX_LINES = 800


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def private_reaches(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self`` or ``cls`` (dunders aside), as ``line: text``."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module → the modules of ``packages`` (and their subpackages) it imports, relative and
    ``if TYPE_CHECKING`` imports included."""
    files = {}
    for package in packages:
        for path in (SRC / package.replace(".", "/")).rglob("*.py"):
            parts = path.relative_to(SRC).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # from .x import y, inside xstage_remote
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    deps.add(full if full in files else module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_pipeline_uses_public_members_only() -> None:
    """The pipeline drives the client and its transport through their public members."""
    assert private_reaches(SRC / "xstage/client/pipeline.py") == []


@pytest.mark.parametrize("path", sorted([*(SRC / "xstage/stage").glob("*.py"),
                                         *(SRC / "xstage/cluster").glob("*.py")]),
                         ids=lambda p: str(p.relative_to(SRC)))
def test_the_stage_and_the_cluster_use_the_clients_public_members_only(path: Path) -> None:
    """A stage drives its worker client (and the cluster's node its stage) through public
    members; a class's own ``super()`` calls are its own."""
    assert [r for r in private_reaches(path) if "super()" not in r] == []


@pytest.mark.parametrize("path", sorted([*(SRC / "xstage/client").glob("*.py"),
                                         *(SRC / "xstage_remote").rglob("*.py")]),
                         ids=lambda p: str(p.relative_to(SRC)))
def test_no_transport_module_is_over_the_limit(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} is {lines} lines (at most {MAX_LINES}): split it"


def test_src_has_no_import_cycle_type_only_ones_included() -> None:
    assert cycles(module_graph(("xstage", "xstage_remote"))) == []


def test_the_walker_sees_a_type_only_cycle() -> None:
    """The walker itself: a cycle is found, and an ``if TYPE_CHECKING`` import is an edge."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = module_graph(("xstage", "xstage_remote"))
    assert "xstage.client.host" in graph["xstage.client.device_slots"]  # type-only there
    assert "xstage_remote.doorbell" in graph["xstage_remote.shm"]  # a relative import
