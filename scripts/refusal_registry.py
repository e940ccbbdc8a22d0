"""Write the record schema's refusal enums and docs/external.md's table of refusals from the
registry of causes (``xstage.refusal.REGISTRY``), or check that they agree with it.

::

    python3 scripts/refusal_registry.py          # rewrite what is stale
    python3 scripts/refusal_registry.py --check  # list what is stale, exit 1 if anything is

What it owns, and nothing else of either file:

1. the schema's ``$defs.refusal.properties.code.enum``, each ``$defs.refusal.allOf`` block's
   ``cause`` enum (one block per code), and ``$defs.ledger.properties.cause.enum`` (null and the
   causes of ``budget_exceeds_device``), rewritten in place so the rest of the file keeps its
   layout;
2. the table under docs/external.md's heading "## 5. Refusals and exit codes".

A new *code* (the five are a closed set) is not written: its ``allOf`` block is added by
hand, and the check names it. ``tests/record/test_refusal_registry.py`` runs the check, and
runs it on a registry with a cause added to show that the schema and the table go stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xstage.refusal import REGISTRY, CauseEntry, RefusalCode

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "src" / "xstage" / "record" / "schema" / "record-v1.json"
DOCS = REPO / "docs" / "external.md"
HEADING = "## 5. Refusals and exit codes"
_BUDGET = RefusalCode.BUDGET_EXCEEDS_DEVICE.value


def enums(registry: Sequence[CauseEntry]) -> dict[str, Any]:
    """What the schema's enums hold for ``registry``: codes, causes by code, the ledger's causes."""
    codes = list(dict.fromkeys(e.code.value for e in registry))
    causes = {code: [e.cause for e in registry if e.code.value == code] for code in codes}
    return {"codes": codes, "causes": causes, "ledger": [None, *causes.get(_BUDGET, [])]}


def stale_schema(registry: Sequence[CauseEntry], schema: dict[str, Any]) -> list[str]:
    """Each enum of ``schema`` that differs from ``registry``, as a line naming its path."""
    want = enums(registry)
    refusal = schema["$defs"]["refusal"]
    have = {"codes": refusal["properties"]["code"]["enum"],
            "causes": {b["if"]["properties"]["code"]["const"]: b["then"]["properties"]["cause"]["enum"]
                       for b in refusal["allOf"]},
            "ledger": schema["$defs"]["ledger"]["properties"]["cause"]["enum"]}
    found = []
    if have["codes"] != want["codes"]:
        found.append(f"$defs.refusal.properties.code.enum is {have['codes']}, the registry's codes "
                     f"are {want['codes']}")
    for code, causes in want["causes"].items():
        if code not in have["causes"]:
            found.append(f"$defs.refusal.allOf has no block for code {code} (add it by hand)")
        elif have["causes"][code] != causes:
            found.append(f"$defs.refusal.allOf[{code}].then.properties.cause.enum is "
                         f"{have['causes'][code]}, the registry says {causes}")
    if have["ledger"] != want["ledger"]:
        found.append(f"$defs.ledger.properties.cause.enum is {have['ledger']}, the registry says "
                     f"{want['ledger']}")
    return found


def _sub_once(pattern: str, replacement: str, text: str) -> str:
    new, count = re.subn(pattern, lambda m: m.group(1) + replacement, text, flags=re.S)
    if count != 1:
        raise SystemExit(f"the schema's layout changed: {pattern!r} matched {count} times")
    return new


def write_schema(registry: Sequence[CauseEntry], text: str) -> str:
    """``text`` (the schema file) with its refusal enums written from ``registry``."""
    want = enums(registry)
    doc = json.loads(text)
    if stale_schema(registry, doc) == []:
        return text
    if doc["$defs"]["refusal"]["properties"]["code"]["enum"] != want["codes"]:
        raise SystemExit("a new refusal code: add its value to $defs.refusal.properties.code.enum "
                         "and its allOf block by hand (the codes are a closed set)")
    for code, causes in want["causes"].items():
        text = _sub_once(r'(\{"const": "' + re.escape(code) + r'"\}\}, "required": \["code"\]\},'
                         r'\s*"then": \{.*?"cause": \{"enum": )\[[^\]]*\]', json.dumps(causes), text)
    text = _sub_once(r'("cause": \{"enum": )\[null[^\]]*\]', json.dumps(want["ledger"]), text)
    if stale_schema(registry, json.loads(text)):
        raise SystemExit("the schema is still stale after writing: " + "; ".join(
            stale_schema(registry, json.loads(text))))
    return text


def table(registry: Sequence[CauseEntry]) -> list[str]:
    """docs/external.md's table of refusals: one row per cause, the code on its first row."""
    rows = ["| code | cause | when | decided by |", "|---|---|---|---|"]
    last = None
    for e in registry:
        code = f"`{e.code.value}`" if e.code is not last else ""
        last = e.code
        where = ", ".join(f"`{m}`" for m in e.decided_by)
        rows.append(f"| {code} | `{e.cause}` | {e.when} | {where} |")
    return rows


def _span(lines: list[str]) -> tuple[int, int]:
    """The table's first line and one past its last, under :data:`HEADING`."""
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise SystemExit(f"{DOCS.name} has no heading {HEADING!r}") from None
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    if first is None:
        raise SystemExit(f"{DOCS.name} has no table under {HEADING!r}")
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return first, end


def stale_docs(registry: Sequence[CauseEntry], text: str) -> list[str]:
    """The rows of the docs table that differ from ``registry``, one line each."""
    lines = text.split("\n")
    first, end = _span(lines)
    have, want = lines[first:end], table(registry)
    if have == want:
        return []
    missing = [row for row in want if row not in have]
    extra = [row for row in have if row not in want]
    return [f"docs/external.md's table of refusals lacks: {row}" for row in missing] + \
           [f"docs/external.md's table of refusals has, and the registry not: {row}" for row in extra] \
        or ["docs/external.md's table of refusals lists the registry's rows in another order"]


def write_docs(registry: Sequence[CauseEntry], text: str) -> str:
    """``text`` (docs/external.md) with its table of refusals written from ``registry``."""
    lines = text.split("\n")
    first, end = _span(lines)
    return "\n".join([*lines[:first], *table(registry), *lines[end:]])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list what is stale; exit 1 if any")
    args = parser.parse_args(argv)
    schema_text, docs_text = SCHEMA.read_text(encoding="utf-8"), DOCS.read_text(encoding="utf-8")
    stale = stale_schema(REGISTRY, json.loads(schema_text)) + stale_docs(REGISTRY, docs_text)
    if args.check:
        print("\n".join(stale) if stale else "the schema and docs/external.md agree with the registry")
        return 1 if stale else 0
    for path, old, new in ((SCHEMA, schema_text, write_schema(REGISTRY, schema_text)),
                           (DOCS, docs_text, write_docs(REGISTRY, docs_text))):
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
