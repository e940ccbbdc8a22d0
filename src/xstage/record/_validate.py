"""A small JSON Schema (draft 2020-12) validator for exactly the keywords the record schema uses.

Why hand-written: records are validated wherever xstage runs (every ``external`` run checks the
record before writing it), and the machines that run stages — a GPU host, a Windows venv with
only onnxruntime — do not have ``jsonschema``; xstage will not take a runtime dependency for
one schema file. The record schema is deliberately plain, so the subset is small:

* assertions: ``type`` (one name or a list), ``enum``, ``const``, ``required``, ``minimum``,
  ``maximum``, ``pattern`` (``re.search``, as ``jsonschema`` does), ``minItems``;
* applicators: ``properties``, ``additionalProperties`` (``false`` or a schema), ``items`` (one
  schema for every item), ``allOf``, ``if``/``then``/``else``, ``$ref`` to ``#/$defs/...``;
* annotations, ignored: ``$schema``, ``$id``, ``$defs``, ``$comment``, ``title``, ``description``.

Any other keyword in a schema is a ``SchemaUnsupported`` error when the validator is built, so
the schema can never lean on a keyword that nothing here checks. Semantics follow
``jsonschema``'s ``Draft202012Validator`` (booleans are not numbers, ``1.0`` is an integer,
``enum``/``const`` compare without ``True == 1``), keywords are applied in the schema's own
order, and each error carries the instance path, so the first error here is the first error
there — with one exception: ``jsonschema`` checks the extra keys of a schema-valued
``additionalProperties`` in ``set`` order (it varies with string hashing), this validator in
document order. ``tests/record/test_record_validator.py`` cross-checks both on valid and
broken records.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Issue", "SchemaUnsupported", "Validator", "json_path"]

_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description"})
_KEYWORDS = frozenset({
    "type", "enum", "const", "required", "minimum", "maximum", "pattern", "minItems",
    "properties", "additionalProperties", "items", "allOf", "if", "then", "else", "$ref",
})
_PLAIN_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


class SchemaUnsupported(ValueError):
    """Raised when a schema uses a keyword (or a ``$ref`` form) this validator does not implement."""


@dataclass(frozen=True)
class Issue:
    """One violation: where in the instance, which keyword, and a message naming the bad value."""

    path: tuple[str | int, ...]
    keyword: str
    message: str

    @property
    def json_path(self) -> str:
        """The instance path as ``$.a.b[0]['odd key']`` (the form ``jsonschema`` prints)."""
        return json_path(self.path)


def json_path(path: Sequence[str | int]) -> str:
    """Format an instance path the way ``jsonschema.ValidationError.json_path`` does."""
    out = "$"
    for elem in path:
        if isinstance(elem, int):
            out += f"[{elem}]"
        elif _PLAIN_NAME.match(elem):
            out += "." + elem
        else:
            out += "['" + elem.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "object":
        return isinstance(value, Mapping)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    if name == "number":
        return isinstance(value, (int, float))
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    raise SchemaUnsupported(f"unknown type name {name!r}")


def _equal(one: Any, two: Any) -> bool:
    """JSON equality: ``True`` is not ``1``, ``1.0`` is ``1``, containers compare item by item."""
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return len(one) == len(two) and all(k in two and _equal(v, two[k]) for k, v in one.items())
    if isinstance(one, bool) or isinstance(two, bool):
        return isinstance(one, bool) and isinstance(two, bool) and one is two
    if isinstance(one, (list, Mapping)) or isinstance(two, (list, Mapping)):
        return False
    return bool(one == two)


class Validator:
    """Validates instances against one root schema; built once, reused.

    Raises:
        SchemaUnsupported: at construction, if any (sub)schema uses a keyword outside the subset
            or a ``$ref`` that is not ``#/$defs/<name>`` naming an existing definition.
    """

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._defs: Mapping[str, Any] = schema.get("$defs", {})
        self._check(schema, "#")
        self._patterns: dict[str, re.Pattern[str]] = {}

    # -- construction -----------------------------------------------------------------------

    def _check(self, schema: Any, where: str) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, Mapping):
            raise SchemaUnsupported(f"{where}: a schema must be an object or a boolean")
        unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
        if unknown:
            raise SchemaUnsupported(f"{where}: keyword(s) {sorted(unknown)} are not implemented")
        ref = schema.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#/$defs/")
                                or ref[len("#/$defs/"):] not in self._defs):
            raise SchemaUnsupported(f"{where}: $ref {ref!r} is not '#/$defs/<existing name>'")
        for name, sub in schema.get("$defs", {}).items():
            self._check(sub, f"{where}/$defs/{name}")
        for name, sub in schema.get("properties", {}).items():
            self._check(sub, f"{where}/properties/{name}")
        for key in ("additionalProperties", "items", "if", "then", "else"):
            if key in schema:
                self._check(schema[key], f"{where}/{key}")
        for i, sub in enumerate(schema.get("allOf", ())):
            self._check(sub, f"{where}/allOf/{i}")

    # -- validation -------------------------------------------------------------------------

    def iter_errors(self, instance: Any) -> Iterator[Issue]:
        """Every violation, in the order ``jsonschema`` finds them (schema keyword order)."""
        yield from self._descend(instance, self.schema, ())

    def first_error(self, instance: Any) -> Issue | None:
        """The first violation, or None when the instance is valid."""
        return next(self.iter_errors(instance), None)

    def is_valid(self, instance: Any) -> bool:
        """Whether the instance has no violation at all."""
        return self.first_error(instance) is None

    def _pattern(self, source: str) -> re.Pattern[str]:
        compiled = self._patterns.get(source)
        if compiled is None:
            compiled = self._patterns[source] = re.compile(source)
        return compiled

    def _descend(self, value: Any, schema: Any, path: tuple[str | int, ...]) -> Iterator[Issue]:
        if schema is True:
            return
        if schema is False:
            yield Issue(path, "false", f"{value!r} is not allowed here")
            return
        for keyword, arg in schema.items():
            if keyword in _ANNOTATIONS or keyword in ("then", "else"):
                continue
            yield from getattr(self, "_kw_" + keyword.lstrip("$"))(value, arg, schema, path)

    def _kw_type(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        names = [arg] if isinstance(arg, str) else list(arg)
        if not any(_is_type(value, name) for name in names):
            yield Issue(path, "type", f"{_short(value)} is not of type {', '.join(map(repr, names))}")

    def _kw_enum(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if not any(_equal(value, each) for each in arg):
            yield Issue(path, "enum", f"{_short(value)} is not one of {arg!r}")

    def _kw_const(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if not _equal(value, arg):
            yield Issue(path, "const", f"{arg!r} was expected, got {_short(value)}")

    def _kw_required(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if isinstance(value, Mapping):
            for name in arg:
                if name not in value:
                    yield Issue(path, "required", f"{name!r} is a required property")

    def _kw_minimum(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if _is_type(value, "number") and value < arg:
            yield Issue(path, "minimum", f"{value!r} is less than the minimum of {arg!r}")

    def _kw_maximum(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if _is_type(value, "number") and value > arg:
            yield Issue(path, "maximum", f"{value!r} is greater than the maximum of {arg!r}")

    def _kw_pattern(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if isinstance(value, str) and not self._pattern(arg).search(value):
            yield Issue(path, "pattern", f"{_short(value)} does not match {arg!r}")

    def _kw_minItems(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if isinstance(value, list) and len(value) < arg:
            yield Issue(path, "minItems", f"has {len(value)} item(s), fewer than {arg}")

    def _kw_properties(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if isinstance(value, Mapping):
            for name, sub in arg.items():
                if name in value:
                    yield from self._descend(value[name], sub, (*path, name))

    def _kw_additionalProperties(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if not isinstance(value, Mapping):
            return
        known = schema.get("properties", {})
        extras = [name for name in value if name not in known]
        if arg is False and extras:
            yield Issue(path, "additionalProperties",
                        f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)))})")
        elif isinstance(arg, Mapping):
            for name in extras:
                yield from self._descend(value[name], arg, (*path, name))

    def _kw_items(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from self._descend(item, arg, (*path, index))

    def _kw_allOf(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        for sub in arg:
            yield from self._descend(value, sub, path)

    def _kw_if(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        if next(self._descend(value, arg, path), None) is None:
            if "then" in schema:
                yield from self._descend(value, schema["then"], path)
        elif "else" in schema:
            yield from self._descend(value, schema["else"], path)

    def _kw_ref(self, value: Any, arg: Any, schema: Any, path: tuple) -> Iterator[Issue]:
        yield from self._descend(value, self._defs[arg[len("#/$defs/"):]], path)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
