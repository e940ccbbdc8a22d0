"""Generic text for the parts of a record other layers own (proof, parity, timings).

When an object has not the shape the summary's human rows expect (an older record, a layer
that added or renamed fields), it is shown generically — its scalar facts, then one level of
nested scalar maps — so the summary never breaks on a valid record. ``visible`` writes a
record's control characters as escapes, for the terminal (``cli``) and the page (``report``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xstage.ledger import format_bytes

__all__ = ["fmt", "fmt_bytes", "scalars", "verdict_text", "visible"]

_MAX_ITEMS = 12

#: Characters a terminal acts on instead of showing: C0 but tab and newline, DEL, C1, and the
#: bidirectional embeddings, overrides and isolates (they reorder what the line shows).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f,
                                        *range(0x80, 0xa0))}
_CONTROLS.update({c: f"\\u{c:04x}" for c in (0x061c, 0x200e, 0x200f, *range(0x202a, 0x202f),
                                             *range(0x2066, 0x206a))})


def visible(text: Any) -> str:
    """``text`` with every terminal control character written as its escape (see above)."""
    return str(text).translate(_CONTROLS)


def fmt(value: Any) -> str:
    """One value as text: ``-`` for None, yes/no, 6 significant digits, comma lists."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(fmt(v) for v in value) or "[]"
    return str(value)


def fmt_bytes(n: Any) -> str:
    """A byte count as ``512.0 KiB``; ``-`` when it is not an integer."""
    if not isinstance(n, int) or isinstance(n, bool):
        return "-"
    return format_bytes(n)


def _is_scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (Mapping, list)) for v in value)


def _inner(obj: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={fmt(v[:_MAX_ITEMS] if isinstance(v, list) else v)}"
                    for k, v in sorted(obj.items())
                    if not isinstance(v, Mapping) and (not isinstance(v, list) or _is_scalar_list(v)))


def _listed(key: str, value: list[Any]) -> list[str]:
    nested = []
    for index, item in enumerate(value[:_MAX_ITEMS]):
        if isinstance(item, Mapping):
            label = item.get("name", index)
            nested.append(f"{key} {label}: {_inner({k: v for k, v in item.items() if k != 'name'})}")
    if len(value) > _MAX_ITEMS:
        nested.append(f"{key}: … {len(value) - _MAX_ITEMS} more")
    return nested


def scalars(obj: Mapping[str, Any], skip: tuple[str, ...] = ()) -> str:
    """``k=v`` for scalar entries, then ``k: a=1 b=2`` for flat sub-maps and lists of them."""
    flat: list[str] = []
    nested: list[str] = []
    for key in sorted(obj):
        if key in skip:
            continue
        value = obj[key]
        if isinstance(value, Mapping):
            inner = _inner(value)
            if inner:
                nested.append(f"{key}: {inner}")
        elif _is_scalar_list(value):
            flat.append(f"{key}={fmt(value[:_MAX_ITEMS])}")
        elif isinstance(value, list):
            nested.extend(_listed(key, value))
        else:
            flat.append(f"{key}={fmt(value)}")
    return "; ".join(([" ".join(flat)] if flat else []) + nested)


def verdict_text(obj: Mapping[str, Any]) -> str:
    """``verdict — k=v …``: an object's verdict first, then its other facts."""
    rest = scalars(obj, skip=("verdict",))
    return f"{obj.get('verdict')}" + (f" — {rest}" if rest else "")
