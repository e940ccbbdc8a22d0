"""docs/configuration.md lists every environment variable xstage reads and every config key its
loader accepts, and nothing else; ``xstage --help`` points to it.

What counts as read, in ``src/xstage`` and ``src/xstage_remote``:

1. any ``XSTAGE_*`` name written anywhere (code, message or docstring): ``XSTAGE_PYTHON_*``
   names are the one row ``XSTAGE_PYTHON_<ROUTE>``;
2. a string literal read from the environment: ``os.environ.get("X")``, ``environ["X"]``,
   ``env.get("X")``, ``os.getenv("X")``;
3. a module-level constant ``*_ENV = "X"`` (a variable named once, read through the constant).

Config keys, from the loader itself: the top-level tables a config file's ``data`` is read for,
the keys ``ConfigFile.route_python`` reads of a route's table, the keys a ``[[trusted]]`` record
is matched on, and ``plugins._KEYS`` (a plugin table's keys; a preset's are a subset).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from xstage.routes import plugins

REPO = Path(__file__).resolve().parents[2]
SRC = [REPO / "src" / "xstage", REPO / "src" / "xstage_remote"]
PAGE = REPO / "docs" / "configuration.md"
XSTAGE_NAME = re.compile(r"\bXSTAGE_[A-Z0-9_]*[A-Z0-9]")
ENV_RECEIVERS = {"environ", "env", "os.environ"}


def _sources(roots: list[Path]) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _normal(name: str) -> str:
    return "XSTAGE_PYTHON_<ROUTE>" if name.startswith("XSTAGE_PYTHON") else name


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _env_reads(tree: ast.Module) -> set[str]:
    """Case 2 and 3: names read from the environment as literals, or through ``*_ENV``."""
    found = set()
    for node in tree.body:  # Case 3: module constants only (an enum member is not a variable)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.endswith("_ENV"):
                found.add(_literal(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            receiver = ast.unparse(node.func.value)
            if (node.func.attr == "get" and receiver in ENV_RECEIVERS) or node.func.attr == "getenv":
                found.add(_literal(node.args[0]))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ENV_RECEIVERS:
            if not isinstance(getattr(node, "ctx", None), ast.Store):
                found.add(_literal(node.slice))
    return {n for n in found if n and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)}


def variables_read() -> set[str]:
    names = set()
    for path in _sources(SRC):
        text = path.read_text(encoding="utf-8")
        names |= {_normal(n) for n in XSTAGE_NAME.findall(text)}
        names |= {_normal(n) for n in _env_reads(ast.parse(text))}
    return names


def _function(tree: ast.AST, name: str) -> ast.AST:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _gets(tree: ast.AST, receiver: str) -> set[str]:
    """String keys read as ``<receiver>.get("k")`` or ``<receiver>["k"]`` under ``tree``."""
    keys = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and ast.unparse(node.func.value).endswith(receiver) and node.args):
            keys.add(_literal(node.args[0]))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith(receiver):
            keys.add(_literal(node.slice))
    return {k for k in keys if k}


def config_keys_accepted() -> set[str]:
    config = ast.parse((REPO / "src/xstage/routes/config.py").read_text(encoding="utf-8"))
    loader = ast.parse((REPO / "src/xstage/routes/plugins.py").read_text(encoding="utf-8"))
    top = _gets(config, ".data") | _gets(loader, ".data")
    assert top == {"routes", "plugins", "trusted"}, f"new top-level config tables: {top}"
    keys = {"trusted"}
    keys |= {f"routes.<route>.{k}" for k in _gets(_function(config, "route_python"), "table")} - {
        "routes.<route>.routes"}
    keys |= {f"trusted.{k}" for k in _gets(_function(config, "_trusted_in"), "r")}
    keys |= {f"plugins.<name>.{k}" for k in plugins._KEYS}
    assert plugins._PRESET_KEYS <= plugins._KEYS
    return keys


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _first_cells(section: str) -> set[str]:
    """The backticked names in the first cell of each table row (header rows skipped)."""
    names = set()
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= {"-"}:
            names |= set(re.findall(r"`([^`]+)`", cells[1]))
    return names


def documented(heading: str) -> set[str]:
    return _first_cells(_section(PAGE.read_text(encoding="utf-8"), heading))


def test_every_variable_read_in_src_is_documented_and_every_documented_one_is_read():
    read = variables_read()
    page = documented("Environment variables") | documented("Other environment variables xstage reads")
    assert sorted(read - page) == [], "read in src/ but not in docs/configuration.md"
    assert sorted(page - read) == [], "documented in docs/configuration.md but read nowhere in src/"


def test_the_scan_sees_each_kind_of_read():
    """The three cases of the module docstring, each on a name it must find."""
    read = variables_read()
    assert {"XSTAGE_WAIT_TRACE", "XSTAGE_PYTHON_<ROUTE>"} <= read  # Case 1
    assert {"RAY_ADDRESS", "PYENV_ROOT", "COLUMNS", "WSL_DISTRO_NAME"} <= read  # Case 2
    assert "RYZEN_AI_INSTALLATION_PATH" in read  # Case 3
    assert "XSTAGE_PYTHON_ORT_OPENVINO" not in read


def test_every_config_key_the_loader_accepts_is_documented_and_no_other():
    accepted = config_keys_accepted()
    page = documented("Config files")
    assert sorted(accepted - page) == [], "accepted by the loader but not in docs/configuration.md"
    assert sorted(page - accepted) == [], "documented in docs/configuration.md but not accepted"


def test_the_test_suites_variables_are_still_read_there():
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace")
                     for root in ("tests", "scripts") for p in sorted((REPO / root).rglob("*"))
                     if p.is_file() and p.suffix in (".py", ".sh"))
    stale = sorted(n for n in documented("Variables of the test suite and scripts") if n not in text)
    assert stale == []


def test_help_points_to_the_configuration_page():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "xstage", "--help"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "docs/configuration.md" in proc.stdout
