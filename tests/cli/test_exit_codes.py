"""Exit codes have one definition (``xstage.exit_codes``): the CLI returns it, records carry it."""

from __future__ import annotations

import ast
from pathlib import Path

from xstage import exit_codes
from xstage.cli import main as cli_main
from xstage.record.io import load_schema

SRC = Path(exit_codes.__file__).parent


def test_the_record_schema_allows_exactly_the_record_exit_codes():
    enum = load_schema()["$defs"]["outcome"]["properties"]["exit_code"]["enum"]
    assert sorted(enum) == sorted(exit_codes.RECORD_EXIT_CODES)


def test_statuses_map_to_their_codes():
    assert [exit_codes.exit_code_for(s) for s in ("placed", "error", "refused")] == [0, 1, 2]


def test_the_cli_reexports_the_same_values():
    for name in ("EXIT_OK", "EXIT_ERROR", "EXIT_REFUSED", "EXIT_USAGE"):
        assert getattr(cli_main, name) == getattr(exit_codes, name)


def _literal_exit(node: ast.AST) -> bool:
    """``return 2`` or ``sys.exit(64)``: an exit code spelled as a number."""
    if isinstance(node, ast.Return):
        value = node.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "exit" and node.args):
        value = node.args[0]
    else:
        return False
    return isinstance(value, ast.Constant) and type(value.value) is int


def test_no_cli_module_spells_an_exit_code_as_a_number():
    found = []
    for path in sorted((SRC / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _literal_exit(node):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_no_module_defines_its_own_exit_constants():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == Path(exit_codes.__file__):
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            found += [f"{path.relative_to(SRC)}:{node.lineno} {n}" for n in names if n.startswith("EXIT_")]
    assert found == []
