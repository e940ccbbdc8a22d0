"""The hand-written validator against the real ``jsonschema`` (a test dependency only).

Both must agree on every document: valid ones pass both; every broken one is rejected by both,
with the same errors — same JSON paths, same keywords, in the same order — so the "first error"
a ``RecordError`` names is the one ``jsonschema`` would name.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import record_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xstage.record import load_schema
from xstage.record._validate import SchemaUnsupported, Validator, json_path

SCHEMA = load_schema()
THEIRS = jsonschema.Draft202012Validator(SCHEMA)
OURS = Validator(SCHEMA)


def _errors(doc: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    theirs = [(e.json_path, str(e.validator)) for e in THEIRS.iter_errors(doc)]
    ours = [(i.json_path, i.keyword) for i in OURS.iter_errors(doc)]
    return theirs, ours


@pytest.mark.parametrize("name", sorted(record_docs.ALL))
def test_valid_records_pass_both(name: str):
    doc = record_docs.ALL[name]()
    assert _errors(doc) == ([], [])
    assert OURS.is_valid(doc) and OURS.first_error(doc) is None


def _set(path: tuple, value: Any):
    def mutate(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _delete(path: tuple):
    def mutate(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return mutate


#: (record, mutation, the JSON path both must name first); at least one per keyword the schema uses.
MUTATIONS = [
    ("placed", _delete(("kind",)), "$", "required"),
    ("placed", _set(("kind",), "xstage.sanitize"), "$.kind", "const"),
    ("placed", _set(("schema_version",), "1.x"), "$.schema_version", "pattern"),
    ("placed", _set(("schema_version",), 1), "$.schema_version", "type"),
    ("placed", _set(("extra",), None), "$", "additionalProperties"),
    ("placed", _set(("argv",), "xstage external"), "$.argv", "type"),
    ("placed", _set(("argv", 1), 7), "$.argv[1]", "type"),
    ("placed", _set(("started",), "2026-11-29"), "$.started", "pattern"),
    ("placed", _delete(("host", "cpu")), "$.host", "required"),
    ("placed", _set(("host", "memory_bytes"), -1), "$.host.memory_bytes", "minimum"),
    ("placed", _set(("host", "memory_bytes"), True), "$.host.memory_bytes", "type"),
    ("placed", _set(("outcome", "status"), "ok"), "$.outcome.status", "enum"),
    ("placed", _set(("outcome", "exit_code"), 2), "$.outcome.exit_code", "const"),
    ("placed", _set(("outcome", "exit_code"), False), "$.outcome.exit_code", "enum"),
    ("refused", _set(("outcome", "refusals"), []), "$.outcome.refusals", "minItems"),
    ("refused", _set(("outcome", "refusals", 0, "cause"), "tolerance"), "$.outcome.refusals[0].cause",
     "enum"),
    ("refused", _set(("outcome", "refusals", 0, "code"), "nope"), "$.outcome.refusals[0].code", "enum"),
    ("refused", _set(("outcome", "refusals", 0), "declined"), "$.outcome.refusals[0]", "type"),
    ("refused", _delete(("outcome", "refusals", 0, "remedy")), "$.outcome.refusals[0]", "required"),
    ("refused", _set(("outcome", "refusals", 0, "x"), 1), "$.outcome.refusals[0]", "additionalProperties"),
    ("refused", _set(("outcome", "refusals", 0, "evidence"), []), "$.outcome.refusals[0].evidence", "type"),
    ("error", _set(("outcome", "exit_code"), 0), "$.outcome.exit_code", "enum"),
    ("error", _set(("outcome", "error", "remedy"), 3), "$.outcome.error.remedy", "type"),
    ("placed", _set(("artifact", "sha256"), "0" * 63), "$.artifact.sha256", "pattern"),
    ("placed", _set(("artifact", "files"), []), "$.artifact.files", "minItems"),
    ("placed", _set(("artifact", "files", 0, "bytes"), -2), "$.artifact.files[0].bytes", "minimum"),
    ("placed", _set(("artifact", "format"), "tflite:fp32"), "$.artifact.format", "pattern"),
    ("placed", _set(("artifact",), []), "$.artifact", "type"),
    ("placed", _set(("request", "min_placement"), 1.01), "$.request.min_placement", "maximum"),
    ("placed", _set(("request", "min_placement"), -0.1), "$.request.min_placement", "minimum"),
    ("placed", _set(("request", "prefer"), "cpu"), "$.request.prefer", "type"),
    ("placed", _set(("request", "ep_options", "n"), 4), "$.request.ep_options.n", "type"),
    ("placed", _set(("request", "ep_options", "odd key"), 4), "$.request.ep_options['odd key']", "type"),
    ("placed", _set(("request", "inputs"), {}), "$.request.inputs", "required"),
    ("placed", _set(("plan", "candidates", 0, "status"), "skipped"), "$.plan.candidates[0].status", "enum"),
    ("placed", _set(("plan", "candidates", 1, "refusal"), {}), "$.plan.candidates[1].refusal", "required"),
    ("placed", lambda d: d["plan"]["candidates"][1].update(refusal=d["plan"]["candidates"][0]["refusal"]),
     "$.plan.candidates[1].refusal", "type"),
    ("placed", _set(("plan", "chosen", "why"), "x"), "$.plan.chosen", "additionalProperties"),
    ("placed", _set(("worker", "hello"), None), "$.worker.hello", "type"),
    ("placed", _set(("proof", "verdict"), "passed"), "$.proof.verdict", "enum"),
    ("placed", _delete(("parity", "verdict")), "$.parity", "required"),
    ("placed", _set(("timings",), []), "$.timings", "type"),
    ("placed", _set(("memory", "rss_bytes"), 1.5), "$.memory.rss_bytes", "type"),
]


@pytest.mark.parametrize(("name", "mutate", "first", "keyword"), MUTATIONS,
                         ids=[f"{m[0]}:{m[2]}:{m[3]}" for m in MUTATIONS])
def test_mutation_rejected_by_both_with_the_same_path(name, mutate, first, keyword):
    doc = record_docs.ALL[name]()
    mutate(doc)
    theirs, ours = _errors(doc)
    assert ours == theirs
    assert ours[0] == (first, keyword)
    assert OURS.first_error(doc).json_path == first


def test_mutations_cover_every_assertion_keyword_the_schema_uses():
    used: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            used.update(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(SCHEMA)
    assertions = {"type", "enum", "const", "required", "minimum", "maximum", "pattern", "minItems",
                  "additionalProperties"}
    assert assertions <= used
    assert {m[3] for m in MUTATIONS} == assertions


def test_several_errors_come_in_the_same_order():
    doc = record_docs.refused()
    doc["kind"] = "x"
    doc["outcome"]["refusals"][0]["cause"] = "nonfinite"
    doc["plan"]["candidates"][0]["refusal"]["cause"] = "declined"
    doc["memory"]["peak_bytes"] = -1
    doc["request"]["runs"] = "20"
    theirs, ours = _errors(doc)
    assert len(ours) == 5 and ours == theirs


# -- random damage: hypothesis picks a place and breaks it ---------------------------------------

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0, 2.5, -1.5]),
    st.sampled_from(["", "x", "1.0", "placed", "refused", "error", "declined", "tolerance", "cpu",
                     "2026-11-29T19:42:30Z", "execution_provider_declined_graph", "numeric_gate_failed"]),
    st.just([]), st.just({}), st.just(["a"]), st.just({"verdict": "placed"}),
)


def _places(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _places(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _places(value, (*path, index))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_damage_is_judged_the_same(data):
    doc = record_docs.ALL[data.draw(st.sampled_from(sorted(record_docs.ALL)))]()
    for _ in range(data.draw(st.integers(1, 3))):
        places = [p for p in _places(doc) if p]
        path = data.draw(st.sampled_from(places))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["set", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            # A copy: st.just() hands out one object, and a later mutation of it would leak
            # into the next example (hypothesis then sees the data generation change).
            parent[data.draw(st.sampled_from(["zz", "verdict", "code", "Odd key"]))] = copy.deepcopy(
                data.draw(_VALUES))
        else:
            parent[path[-1]] = copy.deepcopy(data.draw(_VALUES))
    theirs, ours = _errors(doc)
    # The same errors; their order is compared on the targeted mutations above, not here:
    # across random damage jsonschema's order also depends on set iteration (hash seeds).
    assert sorted(ours) == sorted(theirs)


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "null"}]},
    {"properties": {"a": {"format": "date-time"}}},
    {"$ref": "other.json#/x"},
    {"$ref": "#/$defs/missing"},
    {"allOf": [{"uniqueItems": True}]},
    {"items": [{"type": "string"}]},
])
def test_unsupported_keywords_are_refused_when_built(schema):
    with pytest.raises(SchemaUnsupported):
        Validator(schema)


def test_boolean_subschemas():
    validator = Validator({"properties": {"a": False, "b": True}})
    assert validator.is_valid({"b": [1]})
    assert [i.json_path for i in validator.iter_errors({"a": 1})] == ["$.a"]


@pytest.mark.parametrize(("path", "text"), [
    ((), "$"), (("a", 0, "b_1"), "$.a[0].b_1"), (("odd key",), "$['odd key']"),
    (("it's",), "$['it\\'s']"), (("1a",), "$['1a']"),
])
def test_json_path_matches_jsonschema(path, text):
    assert json_path(path) == text
    error = jsonschema.ValidationError("m", path=list(path))
    assert error.json_path == text
