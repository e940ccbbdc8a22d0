"""Nothing outside ``xstage/routes/`` branches on a route name (docs/design.md §2, "Routes are data").

Walks every module of ``src/xstage`` except ``routes/`` and fails, naming file:line, on:

1. a comparison (``==``, ``!=``, ``in``, ``not in``) with a route name: a string literal that
   is one (or a family prefix such as ``ort-plugin:``), a literal set/tuple/list/dict holding
   one, or a route's name: ``route.name``, ``x.route.name``, ``x.spec.name`` (a bare
   ``spec.name`` is left alone: inputs and outputs are specs too, ``IOSpec``);
2. a ``match`` on ``route.name`` or a ``case`` on a route-name literal;
3. a lookup by route name: ``x["ort-cpu"]``, ``x[route.name]``, ``x.get(...)``, and the
   by-name finders (``.route(...)``, ``get_spec(...)``, ``resolve(...)``) called with a literal;
4. ``.startswith``/``.endswith`` with a route name or family prefix.

Route names in messages (f-strings, plain strings passed anywhere else) are fine: a per-route
fact belongs on the route's spec (``xstage.routes.specs``), where every caller reaches it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from xstage.routes import ROUTE_NAMES

SRC = Path(__file__).resolve().parents[2] / "src" / "xstage"
PREFIXES = ("ort-plugin:", "ort-", "torch-")
FINDERS = {"route", "get_spec", "resolve", "get"}


def _is_route_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in ROUTE_NAMES or node.value.startswith("ort-plugin:")
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        return any(_is_route_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _is_route_literal(k) for k in node.keys)
    return False


def _is_route_name_attr(node: ast.AST) -> bool:
    """``route.name``, ``route_spec.name``, ``cand.route.name``, ``status.spec.name``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id in {"route", "route_spec"}) or (
        isinstance(owner, ast.Attribute) and owner.attr in {"route", "spec"}
    )


def _names_a_route(node: ast.AST) -> bool:
    return _is_route_literal(node) or _is_route_name_attr(node)


def _violations(path: Path, root: Path = SRC.parent.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(root)
    found = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{rel}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            continue
        if isinstance(node, ast.Compare):  # case 1
            ops_ok = all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops)
            if ops_ok and any(_names_a_route(o) for o in (node.left, *node.comparators)):
                hit(node, "comparison with a route name")
        elif isinstance(node, ast.Match):  # case 2
            if _is_route_name_attr(node.subject):
                hit(node, "match on a route's name")
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue) and _is_route_literal(sub.value):
                        hit(sub, "case on a route name")
        elif isinstance(node, ast.Subscript):  # case 3
            if _names_a_route(node.slice):
                hit(node, "lookup by route name")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            args = [*node.args, *(k.value for k in node.keywords)]
            if name in FINDERS and args and (
                _is_route_literal(args[0]) or (name == "get" and _is_route_name_attr(args[0]))
            ):
                hit(node, f"{name}() by route name")
            if name in {"startswith", "endswith"} and args:  # case 4
                arg = args[0]
                values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                if any(
                    isinstance(v, ast.Constant)
                    and isinstance(v.value, str)
                    and (v.value in ROUTE_NAMES or v.value in PREFIXES)
                    for v in values
                ):
                    hit(node, f"{name}() with a route name or prefix")
    return found


def test_the_walker_sees_what_it_should(tmp_path):
    """The rules catch each shape they name, and leave messages alone."""
    sample = tmp_path / "sample.py"
    text = (
        'a = route.name == "ort-cpu"\n'
        'b = cand.route.name in {"torch-cpu", "torch-cuda"}\n'
        'c = costs["ort-openvino"]\n'
        'd = report.route("torch-cpu")\n'
        'e = name.startswith("ort-plugin:")\n'
        'f = f"route {name} is not ort-cpu"\n'
        'g = print("ort-cpu is the reference")\n'
        "match status.spec.name:\n"
        '    case "ort-dml":\n'
        "        pass\n"
    )
    sample.write_text(text)
    lines = sorted(int(v.split(":")[1]) for v in _violations(sample, tmp_path))
    assert lines == [1, 2, 3, 4, 5, 8, 9]


def test_no_module_outside_routes_branches_on_a_route_name():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if (SRC / "routes") in path.parents:
            continue
        found += _violations(path)
    assert not found, "route names outside xstage/routes/ (put the fact on the spec):\n" + "\n".join(found)
