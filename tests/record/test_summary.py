"""``xstage.record.summary``: one digest of any valid record, human where the shape is known."""

from __future__ import annotations

from pathlib import Path

import pytest
import record_docs

from xstage.record import read_record, summary, summary_rows

COMMITTED = sorted(p for p in (Path(__file__).resolve().parents[2] / "docs" / "records").rglob("*.json")
                   if p.name != "devices.json")


def _docs():
    yield from ((name, build()) for name, build in sorted(record_docs.ALL.items()))
    yield from ((p.name, read_record(p)) for p in COMMITTED)


@pytest.mark.parametrize(("name", "doc"), list(_docs()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_record_reads_outcome_first_and_provenance_last(name, doc):
    rows = summary_rows(doc)
    assert rows[0][0] == "outcome" and [f for f, _ in rows[-3:]] == ["when", "host", "xstage"]
    assert summary(doc) == [f"{f}: {t}" for f, t in rows]


def test_an_error_record_says_what_and_the_remedy():
    rows = summary_rows(record_docs.error())
    assert rows[:3] == [
        ("outcome", "error (exit 1): ArtifactError: det.onnx is not an ONNX model: truncated protobuf"),
        ("remedy", "export the graph again"),
        ("stage", "-"),
    ]


def test_shapes_it_does_not_know_are_shown_generically():
    """Case 4: the fixture's proof, parity and timings lack the fields the human rows read."""
    rows = dict(summary_rows(record_docs.placed()))
    assert rows["proof"].startswith("placed — ") and "node_fraction=1" in rows["proof"]
    assert rows["parity"].startswith("passed — ") and "outputs sigmoid_0.tmp_0:" in rows["parity"]
    assert "compute_ms: " in rows["timings"]


def _external_shaped():
    doc = record_docs.placed()
    doc["proof"] = {"verdict": "declined", "basis": "plan", "target_ep": "OpenVINOExecutionProvider",
                    "nodes_on_target": 3, "nodes_total": 4, "time_fraction": 0.5,
                    "cpu_nodes": {"Det": ["det_0"]}}
    doc["parity"] = {"verdict": "failed", "outputs": [
        {"name": "y", "passed": False, "criterion": "rel_l2 5.1e-03 > 1.0e-04"}]}
    block = {"p50_ms": 1.0}
    doc["timings"] = {"compute": block, "round_trip": {"p50_ms": 1.5}, "transport": {"p50_ms": 0.5},
                      "runs": 20, "warmup": 3, "reference": {"p50_ms": 2.0}, "speedup_vs_reference": 2.0}
    doc["worker"]["notes"] = ["INFERENCE_PRECISION_HINT=f32"]
    return doc


def test_known_shapes_read_as_sentences():
    """Cases 1-3, and the placement and refusal rows as ``xstage external`` always printed them."""
    rows = summary_rows(_external_shaped())
    table = dict(rows)
    assert table["proof"] == "declined: 3/4 nodes on OpenVINOExecutionProvider (plan), 50.0% of kernel time"
    assert table["left on CPU"] == "Det: det_0"
    assert table["parity y"] == "FAILED: rel_l2 5.1e-03 > 1.0e-04"
    assert table["timings"] == ("compute 1.000 ms · round trip 1.500 ms · transport 0.500 ms "
                                "(p50 of 20 runs after 3 warm-ups)")
    assert table["vs CPU"] == "reference 2.000 ms → 2.00× speedup"
    assert table["placed on"] == "cpu via ort-openvino (python 3.11.7, onnxruntime 1.24.1)"
    assert table["route hook"] == "INFERENCE_PRECISION_HINT=f32"
    assert ("refused", "device_unreachable_from_this_process (route_missing) ort-vitisai on npu:amd: "
            "ort-vitisai needs Windows (natively, or reached from WSL); this host is Linux (not WSL)") in rows


@pytest.mark.parametrize(("sets", "row"), [
    ({"sets": 2, "differs": None}, "2 checked: each answered the gate's inputs bit for bit as set 0"),
    ({"sets": 3, "differs": 2}, "3 checked: set 2 answered the gate's inputs otherwise than set 0"),
    ({"sets": 0, "differs": None, "skipped": "the inputs are over one frame's limit (8 GiB)"},
     "not checked: the inputs are over one frame's limit (8 GiB)"),
])
def test_the_slot_sets_check_reads_as_a_sentence(sets, row):
    doc = _external_shaped()
    doc["parity"]["slot_sets"] = sets
    assert dict(summary_rows(doc))["slot sets"] == row


def test_a_torch_proof_counts_ops_and_copies():
    doc = _external_shaped()
    doc["proof"] = {"verdict": "placed", "target_ep": "torch:cuda", "nodes_on_target": 40,
                    "nodes_total": 40, "copies": 2}
    assert dict(summary_rows(doc))["proof"] == (
        "placed: 40/40 ops on torch:cuda (op log of the warm-up), 2 host/device copies")


def test_the_noise_tier_and_dequantized_outputs_are_said_and_valid():
    """A gate the noise tier decided (its tie-break unavailable) and a dequantized output: the
    record validates (additive optional keys) and the summary says which tier, why, what the
    noise tier cannot catch, and which outputs were compared dequantized."""
    import numpy as np

    from xstage.parity import NOISE_TIER_BLIND, at_noise_tier, compare, tiebreak_unavailable
    from xstage.record import validate_record

    rng = np.random.default_rng(0)
    r = rng.standard_normal(512).astype(np.float32)
    y = (r + np.float32(2e-6) * rng.standard_normal(512).astype(np.float32)).astype(np.float32)
    gate = tiebreak_unavailable(compare({"y": y}, {"y": r}, fmt="onnx:fp32", reference_kind="same_graph_cpu"),
                                "over its 120 s limit")
    doc = record_docs.placed()
    doc["parity"] = at_noise_tier(gate, {"y": y}, {"y": r},
                                  "the float64 tie-break was unavailable: over its 120 s limit").to_dict()
    validate_record(doc)
    rows = dict(summary_rows(doc))
    assert rows["gate tier"] == ("noise (elem_a=1e-05, not 1e-07), passed: the float64 tie-break was "
                                 "unavailable: over its 120 s limit")
    assert rows["noise tier misses"] == NOISE_TIER_BLIND
    assert rows["float64 tie-break"] == "unavailable: over its 120 s limit"

    q = np.array([[1, 2], [3, 4]], np.uint16)
    doc["parity"] = compare({"q": q + 1}, {"q": q}, fmt="onnx:a16w8", reference_kind="same_graph_cpu",
                            quantized={"q": {"scale": np.array(1e-3, np.float32),
                                             "zero_point": np.array(0, np.uint16), "axis": 1,
                                             "node": "q_out"}}).to_dict()
    validate_record(doc)
    rows = dict(summary_rows(doc))
    assert rows["dequantized"].startswith("q: QuantizeLinear outputs compared as")
    assert rows["parity q"].startswith("FAILED: dequantized (uint16 of q_out, scale 0.001, zero point 0)")


def test_the_request_row_names_ep_options_and_session_config():
    doc = record_docs.placed()
    doc["request"]["ep_options"] = {"device_type": "CPU"}
    doc["request"]["session_config"] = {"session.intra_op.allow_spinning": "0"}
    (text,) = [t for f, t in summary_rows(doc) if f == "request"]
    assert "ep_options=device_type=CPU" in text
    assert "session_config=session.intra_op.allow_spinning=0" in text
