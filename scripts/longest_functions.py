"""Print the longest functions and methods under ``src/`` (none over 100 lines of code).

    python3 scripts/longest_functions.py [N] [--root DIR] [--max LINES]

One line each, longest first: ``lines  path:line  name`` (``Class.method``, ``outer.inner``).
A function's lines run from its ``def`` to its last line, decorators included, its docstring
not: a docstring documents (the public API's must name every argument), it adds no logic.
With ``--max``, exits 1 when any function is longer than LINES (a check for CI).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["functions", "main"]

ROOT = Path(__file__).resolve().parents[1]
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _walk(node: ast.AST, prefix: str) -> Iterator[tuple[ast.AST, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (*_DEFS, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if isinstance(child, _DEFS):
                yield child, name
            yield from _walk(child, f"{name}.")
        else:
            yield from _walk(child, prefix)


def functions(root: Path) -> list[tuple[int, str, int, str]]:
    """``(lines, path, line, qualified name)`` for every function under ``root``, longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, name in _walk(tree, ""):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            doc = node.body[0] if ast.get_docstring(node) is not None else None
            skipped = doc.end_lineno - doc.lineno + 1 if doc is not None else 0
            found.append((node.end_lineno - first + 1 - skipped, str(path), first, name))
    return sorted(found, key=lambda f: (-f[0], f[1], f[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=10, help="how many to print (default 10)")
    parser.add_argument("--root", type=Path, default=ROOT / "src", help="where to look (default src/)")
    parser.add_argument("--max", type=int, metavar="LINES", help="exit 1 when one is longer than this")
    args = parser.parse_args(argv)
    found = functions(args.root)
    for lines, path, line, name in found[:args.n]:
        shown = Path(path).resolve()
        shown_text = str(shown.relative_to(ROOT)) if shown.is_relative_to(ROOT) else path
        print(f"{lines:5d}  {shown_text}:{line}  {name}")
    over = [f for f in found if args.max is not None and f[0] > args.max]
    if over:
        print(f"{len(over)} function(s) over {args.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
