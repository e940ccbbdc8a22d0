"""A ``.pt2`` that torch 2.4 loads, written by today's torch (the torch-dml route: torch-directml
pins torch 2.4.1, and ``torch.export`` programs saved by torch >= 2.5 do not load there).

Two things changed between torch 2.4 and the exporter's torch, and both are undone here:

* **The archive layout.** torch >= 2.5 writes a "pt2 archive" (``<name>/models/model.json``,
  one file per weight, ``archive_format``…); torch 2.4 reads a flat zip
  (``serialized_exported_program.json``, ``serialized_state_dict.pt``,
  ``serialized_constants.pt``, ``serialized_example_inputs.pt``, ``version``) and fails on the
  new one with ``KeyError: "There is no item named 'version' in the archive"``.
* **The export schema.** torch 2.13 serializes schema 8.20, torch 2.4 reads 5.x only. The
  program is serialized by today's torch and its JSON projected onto the older schema
  (``_torch_schema_5_3``, generated from torch 2.4.1's own ``schema.yaml``): a field the old
  schema lacks is dropped only when it holds its default or is listed in ``_INFORMATIONAL``
  (names, the exporter's version, argument kinds the op schema decides anyway); a union variant
  or an enum value the old schema lacks (a symbolic float, a complex constant, a float8 dtype)
  refuses the conversion, naming it. The ops are not changed: one that torch 2.4 lacks fails the
  worker's load, naming the op.

The program's dialect (``TRAINING`` for a non-strict export) is written as ``ATEN``, the only
dialect torch 2.4 registers a verifier for; the ops are the same. The conversion checks itself
in today's torch: the projected JSON, read back by today's deserializer, must reproduce the
program's outputs bitwise on its example inputs (what 2.4 reads is a subset of what was kept).

Needs torch (the export extra); only ``xstage.export`` imports this module.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from xstage import errors
from xstage.export import _torch_schema_5_3

__all__ = ["TARGETS", "LegacySchemaError", "project", "write_legacy_pt2"]

#: ``--for-torch`` values → the schema module of that torch.
TARGETS: dict[str, Any] = {"2.4": _torch_schema_5_3}

#: Fields torch 2.4's schema lacks whose values are informational: dropped whatever they hold.
_INFORMATIONAL = frozenset({
    ("ExportedProgram", "torch_version"),  # the exporter's version: kept in the manifest
    ("ExportedProgram", "verifiers"),  # becomes ``dialect``
    ("ExportedProgram", "guards_code"),  # the exporter's shape guards, as Python text
    ("Node", "name"),  # the node's name: torch 2.4 names nodes after their outputs
    ("NamedArgument", "kind"),  # positional or keyword: decided again from the op's schema
    ("ModuleCallSignature", "forward_arg_names"),  # the forward's parameter names
})

_PRIMITIVES = ("int", "float", "str", "bool")


class LegacySchemaError(errors.UsageError):
    """The program uses something the older schema cannot express."""


def _is_default(value: Any) -> bool:
    return value is None or value in ([], {}, "", False)


def project(doc: Any, type_name: str, types: dict[str, tuple[str, dict[str, Any]]],
            dropped: dict[str, int], where: str = "") -> Any:
    """``doc`` (today's serialized JSON of ``type_name``) in the shape ``types`` describes.

    Args:
        doc: the JSON value.
        type_name: its type in the schema (``ExportedProgram``, ``List[Node]``, …).
        types: the target schema's types (``_torch_schema_5_3.TYPES``).
        dropped: filled with ``Type.field`` → how many non-default values were dropped.
        where: the path so far, for messages.

    Raises:
        LegacySchemaError: a variant, an enum value or a field the target cannot hold.
    """
    t = type_name.strip()
    inner = re.fullmatch(r"Optional\[(.*)\]", t)
    if inner:
        return None if doc is None else project(doc, inner.group(1), types, dropped, where)
    inner = re.fullmatch(r"List\[(.*)\]", t)
    if inner:
        return [project(x, inner.group(1), types, dropped, where) for x in doc]
    inner = re.fullmatch(r"Dict\[str, (.*)\]", t)
    if inner:
        return {k: project(x, inner.group(1), types, dropped, f"{where}[{k}]") for k, x in doc.items()}
    if t == "Tuple[()]":  # torch 2.4's as_none is an empty tuple; today's is True
        return []
    if t in _PRIMITIVES:
        return doc
    kind, fields = types[t]
    if kind == "enum":
        if doc not in fields.values():
            raise LegacySchemaError(f"{where or t}: {t} value {doc} does not exist in the target "
                                    "schema (a dtype, layout or memory format newer than it)")
        return doc
    if kind == "union":
        if not isinstance(doc, dict) or len(doc) != 1:
            raise LegacySchemaError(f"{where or t}: a {t} must hold one variant, not {doc!r:.80}")
        (variant, value), = doc.items()
        if variant not in fields:
            raise LegacySchemaError(f"{where or t}: {t}.{variant} does not exist in the target schema")
        return {variant: project(value, fields[variant][0], types, dropped, f"{where}.{variant}")}
    out = {}
    for name, (field_type, has_default) in fields.items():
        if name in doc:
            out[name] = project(doc[name], field_type, types, dropped, f"{where}.{name}")
        elif not has_default:
            raise LegacySchemaError(f"{where or t}: {t}.{name} is required by the target schema "
                                    "and today's program has no such field")
    for name in sorted(set(doc) - set(fields)):
        if (t, name) in _INFORMATIONAL:
            continue
        if not _is_default(doc[name]):
            raise LegacySchemaError(f"{where or t}: {t}.{name} = {doc[name]!r:.80} has no place in "
                                    "the target schema")
        dropped[f"{t}.{name}"] = dropped.get(f"{t}.{name}", 0) + 1
    return out


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _roundtrip_equal(torch: Any, program: Any, legacy_json: bytes, artifact: Any) -> bool:
    """Today's deserializer on the projected JSON: the same outputs, bitwise, on the examples."""
    from torch._export.serde import schema as today
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    doc = json.loads(legacy_json)
    doc.pop("dialect", None)
    doc["schema_version"] = {"major": today.SCHEMA_VERSION[0], "minor": today.SCHEMA_VERSION[1]}
    back = deserialize(SerializedArtifact(json.dumps(doc).encode(), artifact.state_dict,
                                          artifact.constants, artifact.example_inputs))
    args, kwargs = program.example_inputs
    with torch.no_grad():
        want = _flat(program.module()(*args, **kwargs))
        got = _flat(back.module()(*args, **kwargs))
    return len(want) == len(got) and all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def write_legacy_pt2(program: Any, path: Path, target: str = "2.4") -> dict[str, Any]:
    """Write ``program`` (a ``torch.export.ExportedProgram``) at ``path`` for torch ``target``.

    Returns:
        The report: target, schema version written, fields dropped, the round trip's verdict.

    Raises:
        LegacySchemaError: the program holds something the target schema cannot express.
        XstageError: the projected program does not reproduce the outputs.
    """
    import torch
    from torch._export.serde.serialize import serialize

    schema = TARGETS[target]
    artifact = serialize(program)
    doc = json.loads(artifact.exported_program)
    verifiers = list(doc.get("verifiers") or [])
    dropped: dict[str, int] = {}
    major, minor = schema.SCHEMA_VERSION
    doc["schema_version"] = {"major": major, "minor": minor}
    doc["dialect"] = "ATEN"
    legacy = project(doc, "ExportedProgram", schema.TYPES, dropped)
    legacy_json = json.dumps(legacy).encode()
    if not _roundtrip_equal(torch, program, legacy_json, artifact):
        raise errors.XstageError(
            f"{path.name}: the program projected onto torch {target}'s schema does not reproduce "
            "its outputs", remedy="export for the exporter's own torch, or report it with both versions")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("serialized_exported_program.json", legacy_json)
        z.writestr("serialized_state_dict.pt", artifact.state_dict)
        z.writestr("serialized_constants.pt", artifact.constants)
        z.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        z.writestr("version", f"{major}.{minor}")
    path.write_bytes(buffer.getvalue())
    return {"for_torch": target, "schema": f"{major}.{minor}", "dialect_written": "ATEN",
            "dialect_exported": ",".join(verifiers) or "ATEN", "dropped_defaults": dropped,
            "roundtrip_bitwise": True}
