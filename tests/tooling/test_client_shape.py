"""The client's shape (docs/architecture.md): files of a readable size, an interface the
pipeline keeps to, and no import cycle among ``client/`` and ``cluster/``, type-only imports
included (``test_imports.py`` leaves those out: they cost nothing at run time, but a type-only
cycle still ties two modules that should be separable).

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
    """Module → the modules of ``packages`` it imports, ``if TYPE_CHECKING`` ones included."""
    files = {}
    for package in packages:
        for path in (SRC / package.replace(".", "/")).glob("*.py"):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            files[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in files else node.module)
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


@pytest.mark.parametrize("path", sorted((SRC / "xstage/client").glob("*.py")), ids=lambda p: p.name)
def test_no_client_module_is_over_the_limit(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} is {lines} lines (at most {MAX_LINES}): split it"


def test_client_and_cluster_have_no_import_cycle_type_only_ones_included() -> None:
    assert cycles(module_graph(("xstage.client", "xstage.cluster"))) == []


def test_the_walker_sees_a_type_only_cycle() -> None:
    """The walker itself: a cycle is found, and an ``if TYPE_CHECKING`` import is an edge."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = module_graph(("xstage.client",))
    assert "xstage.client.host" in graph["xstage.client.device_slots"]  # type-only there
