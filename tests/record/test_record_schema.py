"""What the record schema enforces: code↔cause (docs/external.md, "Refusals and exit codes"),
outcome consistency, candidate rules."""

from __future__ import annotations

import itertools

import jsonschema
import pytest
import record_docs

from xstage.errors import RecordError
from xstage.record import load_schema, validate_record
from xstage.refusal import CAUSES as REFUSAL_CAUSES

#: Each code and the causes it allows, from the registry (``xstage.refusal.REGISTRY``); that the
#: schema's enums agree with it is ``test_refusal_registry.py``'s, that each pair reads here.
CAUSES = {code.value: list(causes) for code, causes in REFUSAL_CAUSES.items()}
ALL_CAUSES = sorted({c for causes in CAUSES.values() for c in causes})


def _with_refusal(code: str, cause: str) -> dict:
    doc = record_docs.refused()
    refusal = doc["outcome"]["refusals"][0]
    refusal["code"], refusal["cause"] = code, cause
    return doc


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(load_schema())


def test_schema_lists_the_five_codes_of_design_5():
    assert load_schema()["$defs"]["refusal"]["properties"]["code"]["enum"] == list(CAUSES)


@pytest.mark.parametrize(("code", "cause"), [(c, k) for c, ks in CAUSES.items() for k in ks])
def test_every_allowed_pair_is_accepted(code: str, cause: str):
    validate_record(_with_refusal(code, cause))


@pytest.mark.parametrize(
    ("code", "cause"),
    [(c, k) for c, k in itertools.product(CAUSES, ALL_CAUSES) if k not in CAUSES[c]]
    + [(c, "because") for c in CAUSES],
)
def test_every_other_pair_is_rejected_at_the_cause(code: str, cause: str):
    with pytest.raises(RecordError, match=r"at \$\.outcome\.refusals\[0\]\.cause: '\w+' is not one of"):
        validate_record(_with_refusal(code, cause))


def test_code_outside_the_closed_set_is_rejected():
    with pytest.raises(RecordError, match=r"at \$\.outcome\.refusals\[0\]\.code"):
        validate_record(_with_refusal("out_of_memory", "over_budget"))


def test_code_cause_is_enforced_inside_plan_candidates_too():
    doc = record_docs.refused()
    doc["plan"]["candidates"][0]["refusal"]["cause"] = "declined"  # a route_missing code
    doc["outcome"]["refusals"] = [record_docs.refused()["outcome"]["refusals"][0]]
    with pytest.raises(RecordError, match=r"at \$\.plan\.candidates\[0\]\.refusal\.cause"):
        validate_record(doc)


def test_refusal_is_closed():
    doc = record_docs.refused()
    doc["outcome"]["refusals"][0]["severity"] = "high"
    with pytest.raises(RecordError, match=r"at \$\.outcome\.refusals\[0\]: additional .*'severity'"):
        validate_record(doc)


def test_top_level_is_closed():
    doc = record_docs.placed()
    doc["extra"] = 1
    with pytest.raises(RecordError, match=r"at \$: additional properties are not allowed \('extra'\)"):
        validate_record(doc)


@pytest.mark.parametrize("key", ["proof", "parity", "timings", "host", "request", "worker"])
def test_open_objects_take_more_keys(key: str):
    doc = record_docs.placed()
    doc[key]["added_by_its_owner"] = {"anything": [1, 2]}
    validate_record(doc)


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda d: d["outcome"].update(exit_code=2), r"\$\.outcome\.exit_code: 0 was expected"),
    (lambda d: d["outcome"].update(error={"type": "X", "message": "m", "remedy": None}),
     r"\$\.outcome\.error"),
])
def test_placed_means_exit_0_and_no_error(mutate, path):
    doc = record_docs.placed()
    mutate(doc)
    with pytest.raises(RecordError, match=path):
        validate_record(doc)


def test_refused_needs_a_refusal_and_exit_2():
    doc = record_docs.refused()
    doc["outcome"]["refusals"] = []
    with pytest.raises(RecordError, match=r"\$\.outcome\.refusals: has 0 item\(s\), fewer than 1"):
        validate_record(doc)
    doc = record_docs.refused()
    doc["outcome"]["exit_code"] = 1
    with pytest.raises(RecordError, match=r"\$\.outcome\.exit_code: 2 was expected"):
        validate_record(doc)


def test_error_needs_the_error_and_exit_1_or_64():
    doc = record_docs.error()
    doc["outcome"]["error"] = None
    with pytest.raises(RecordError, match=r"\$\.outcome\.error: None is not of type 'object'"):
        validate_record(doc)
    doc = record_docs.error()
    doc["outcome"]["exit_code"] = 64
    validate_record(doc)
    doc["outcome"]["exit_code"] = 2
    with pytest.raises(RecordError, match=r"\$\.outcome\.exit_code: 2 is not one of \[1, 64\]"):
        validate_record(doc)


def test_refused_candidate_carries_its_refusal_and_chosen_one_does_not():
    doc = record_docs.placed()
    doc["plan"]["candidates"][0]["refusal"] = None
    with pytest.raises(RecordError, match=r"candidates\[0\]\.refusal: None is not of type 'object'"):
        validate_record(doc)
    doc = record_docs.placed()
    doc["plan"]["candidates"][1]["refusal"] = doc["plan"]["candidates"][0]["refusal"]
    with pytest.raises(RecordError, match=r"\$\.plan\.candidates\[1\]\.refusal: .* is not of type 'null'"):
        validate_record(doc)


def test_failed_candidate_may_or_may_not_carry_a_refusal():
    doc = record_docs.placed()
    doc["plan"]["candidates"][2]["status"] = "failed"
    validate_record(doc)
    doc["plan"]["candidates"][2]["refusal"] = doc["plan"]["candidates"][0]["refusal"]
    validate_record(doc)


@pytest.mark.parametrize(("owner", "verdict"), [("proof", "passed"), ("parity", "placed"), ("proof", None)])
def test_verdicts_are_pinned(owner: str, verdict):
    doc = record_docs.placed()
    doc[owner]["verdict"] = verdict
    with pytest.raises(RecordError, match=rf"\$\.{owner}\.verdict"):
        validate_record(doc)


@pytest.mark.parametrize("stamp", [
    "2026-11-29T19:42:30Z", "2026-11-29T19:42:30.5+01:00", "2026-11-29T19:42:30.123456789-05:30",
])
def test_timestamps_accepted(stamp: str):
    doc = record_docs.placed()
    doc["started"] = stamp
    validate_record(doc)


@pytest.mark.parametrize("stamp", ["2026-11-29 19:42:30Z", "2026-11-29T19:42:30", "yesterday", ""])
def test_timestamps_rejected(stamp: str):
    doc = record_docs.placed()
    doc["started"] = stamp
    with pytest.raises(RecordError, match=r"\$\.started: .* does not match"):
        validate_record(doc)


@pytest.mark.parametrize(("path", "value"), [
    (("request", "min_placement"), 1.5),
    (("request", "min_placement"), True),
    (("request", "runs"), -1),
    (("request", "runs"), 2.5),
    (("request", "ep_options"), {"threads": 4}),
    (("request", "inputs"), {"source": "camera"}),
    (("artifact", "sha256"), "D2A7"),
    (("artifact", "format"), "onnx"),
    (("artifact", "files"), []),
    (("memory", "peak_bytes"), -5),
    (("host", "memory_bytes"), "24 GiB"),
])
def test_field_rules(path: tuple[str, str], value):
    doc = record_docs.placed()
    doc[path[0]][path[1]] = value
    with pytest.raises(RecordError, match=rf"at \$\.{path[0]}\.{path[1]}"):
        validate_record(doc)


def test_integral_float_counts_as_integer_like_jsonschema():
    doc = record_docs.placed()
    doc["request"]["runs"] = 20.0
    validate_record(doc)
    assert jsonschema.Draft202012Validator(load_schema()).is_valid(doc)


def test_a_torch_cuda_workers_accelerator_block_is_checked():
    """The worker's stream, pinned region and CUDA graph, an optional key (docs/torch.md,
    "Serving: the pinned region, one stream, CUDA graphs")."""
    doc = record_docs.placed()
    doc["worker"]["accelerator"] = {
        "stream": "dedicated", "sync_per_call": 1,
        "cuda_graph": {"state": "captured", "capture_ms": 41.2, "pool_bytes": 2097152,
                       "shapes": [[8, 3, 224, 224]], "eager_vs_replay_max_abs": 0.0,
                       "gated": "the warm-up call answers with the replay's outputs"},
        "pinned_region": {"state": "registered", "bytes": 9699328, "register_ms": 1.3,
                          "via": "torch.cuda.cudart().cudaHostRegister", "is_pinned": True}}
    validate_record(doc)
    doc["worker"]["accelerator"]["cuda_graph"] = {"state": "failed", "why": "RuntimeError: x",
                                                  "note": "CUDA graph capture failed; eager"}
    validate_record(doc)
    doc["worker"]["accelerator"]["cuda_graph"]["state"] = "maybe"
    with pytest.raises(RecordError, match=r"cuda_graph\.state"):
        validate_record(doc)


def test_the_ledgers_host_pinned_block_is_checked():
    doc = record_docs.placed()
    if doc.get("ledger") is None:
        pytest.skip("the placed example has no ledger block")
    res = {"purpose": "pinned region", "bytes": 9764864, "pool": "host_ram", "lifetime": "session",
           "evidence": "E", "basis": "b"}
    doc["ledger"]["host_pinned"] = {"pool": "host_ram", "reservations": [res],
                                    "budget_bytes": 12206080, "measured_bytes": 9699328,
                                    "state": "registered", "budget_over_measured": 1.258}
    validate_record(doc)
    doc["ledger"]["host_pinned"]["extra"] = 1
    with pytest.raises(RecordError, match="host_pinned"):
        validate_record(doc)
