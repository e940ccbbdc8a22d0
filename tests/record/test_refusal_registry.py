"""The registry of refusal causes (``xstage.refusal.REGISTRY``) is the one closed list: the record
schema's enums and docs/external.md's table of refusals agree with it, and the deciders' own typed
lists of causes name none it lacks.

Adding a cause is a registry row, the code that decides it and ``scripts/refusal_registry.py``
(docs/architecture.md, "Adding a refusal cause"): the recipe is run here on copies, with a cause
added to a copy of the registry.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import record_docs

from xstage import parity
from xstage.evidence import proof
from xstage.record._validate import Validator
from xstage.refusal import CAUSES, REGISTRY, CauseEntry, Refusal, RefusalCode
from xstage.stage.refusals import REMEDIES

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "refusal_registry.py"


def _script():
    spec = importlib.util.spec_from_file_location("refusal_registry", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _script()
#: A cause no xstage writes: the recipe's dummy.
NEW = CauseEntry(RefusalCode.EP_DECLINED, "cause_for_the_recipe", "a case the recipe's test made up",
                 ("evidence/onnx.py",), "a remedy the recipe's test made up")


def _with_new() -> tuple[CauseEntry, ...]:
    return (*REGISTRY, NEW)


def test_the_schema_and_the_docs_agree_with_the_registry():
    assert GEN.stale_schema(REGISTRY, json.loads(GEN.SCHEMA.read_text(encoding="utf-8"))) == []
    assert GEN.stale_docs(REGISTRY, GEN.DOCS.read_text(encoding="utf-8")) == []


def test_the_script_checks_the_files_in_the_tree():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "agree with the registry" in done.stdout


def test_a_cause_added_to_the_registry_makes_the_schema_and_the_docs_stale():
    schema_text, docs_text = GEN.SCHEMA.read_text(encoding="utf-8"), GEN.DOCS.read_text(encoding="utf-8")
    stale = GEN.stale_schema(_with_new(), json.loads(schema_text))
    assert stale == ["$defs.refusal.allOf[execution_provider_declined_graph].then.properties.cause.enum is "
                     f"{list(CAUSES[RefusalCode.EP_DECLINED])}, the registry says "
                     f"{[*CAUSES[RefusalCode.EP_DECLINED], 'cause_for_the_recipe']}"]
    assert [line for line in GEN.stale_docs(_with_new(), docs_text) if "cause_for_the_recipe" in line]


def test_writing_from_the_registry_makes_them_fresh_and_the_record_reads_the_cause():
    """The recipe's regenerate step on copies: only the enum and the table change, and a record
    with the new cause validates against the written schema."""
    schema_text, docs_text = GEN.SCHEMA.read_text(encoding="utf-8"), GEN.DOCS.read_text(encoding="utf-8")
    new_schema = GEN.write_schema(_with_new(), schema_text)
    new_docs = GEN.write_docs(_with_new(), docs_text)
    assert GEN.stale_schema(_with_new(), json.loads(new_schema)) == []
    assert GEN.stale_docs(_with_new(), new_docs) == []
    lines = zip(schema_text.splitlines(), new_schema.splitlines(), strict=True)
    changed = [(a, b) for a, b in lines if a != b]
    assert len(changed) == 1 and "cause_for_the_recipe" in changed[0][1]
    assert len(new_docs.splitlines()) == len(docs_text.splitlines()) + 1
    doc = record_docs.refused()
    doc["outcome"]["refusals"][0].update(code=NEW.code.value, cause=NEW.cause)
    assert next(Validator(json.loads(new_schema)).iter_errors(doc), None) is None
    assert next(Validator(json.loads(schema_text)).iter_errors(doc), None) is not None
    assert GEN.write_schema(REGISTRY, schema_text) == schema_text  # fresh: untouched
    assert GEN.write_docs(REGISTRY, docs_text) == docs_text


def test_a_budget_cause_is_written_to_the_ledger_block_too():
    schema_text = GEN.SCHEMA.read_text(encoding="utf-8")
    budget = dataclasses.replace(NEW, code=RefusalCode.BUDGET_EXCEEDS_DEVICE)
    new = json.loads(GEN.write_schema((*REGISTRY, budget), schema_text))
    assert new["$defs"]["ledger"]["properties"]["cause"]["enum"][-1] == "cause_for_the_recipe"


def test_a_new_code_is_named_not_written():
    """The codes are a closed set: a new one's schema block is written by hand."""
    row = dataclasses.replace(NEW)
    object.__setattr__(row, "code", SimpleNamespace(value="a_sixth_code"))  # no enum member
    schema_text = GEN.SCHEMA.read_text(encoding="utf-8")
    stale = GEN.stale_schema((*REGISTRY, row), json.loads(schema_text))
    assert any("a_sixth_code" in line and "by hand" in line for line in stale)
    with pytest.raises(SystemExit, match="new refusal code"):
        GEN.write_schema((*REGISTRY, row), schema_text)


def test_every_registry_row_is_one_code_cause_pair_with_real_deciders():
    pairs = [(e.code, e.cause) for e in REGISTRY]
    assert len(pairs) == len(set(pairs))
    for entry in REGISTRY:
        for module in entry.decided_by:
            assert (REPO / "src" / "xstage" / module).exists(), (entry.cause, module)


def test_the_deciders_typed_causes_are_registry_causes():
    """A decider keeps its own typed list (for mypy): it must name only the registry's causes."""
    assert set(typing.get_args(parity.Cause)) == set(CAUSES[RefusalCode.NUMERIC_GATE_FAILED])
    assert set(proof.CAUSES) <= set(CAUSES[RefusalCode.EP_DECLINED])
    assert set(typing.get_args(proof.Cause)) == set(proof.CAUSES)


def test_the_remedies_come_from_the_registry():
    assert REMEDIES[(RefusalCode.EP_DECLINED, "declined")] == next(
        e.remedy for e in REGISTRY if e.cause == "declined")
    assert (RefusalCode.EP_DECLINED, "unmeasured:names") in REMEDIES
    with pytest.raises(ValueError, match="cause_for_the_recipe"):
        Refusal(code=NEW.code, cause=NEW.cause, device=None, route=None, message="m", remedy="r")
