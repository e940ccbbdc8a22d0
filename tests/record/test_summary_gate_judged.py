"""A nondeterministic stage and outputs judged by their own format: the record validates (additive
optional keys) and the summary says both."""

from __future__ import annotations

import numpy as np
import record_docs

from xstage.parity import compare, nondeterministic, self_agreement
from xstage.record import summary_rows, validate_record


def test_a_nondeterministic_gate_and_judged_formats_are_said_and_valid():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    ref = {"y": x, "z": x}
    gate = compare({"y": x * np.float32(1.01), "z": x}, ref, fmt="onnx:fp32", reference_kind="user",
                   formats={"y": "onnx:a16w8"})
    noisy = self_agreement({"y": x}, {"y": x + np.float32(0.5)})
    doc = record_docs.placed()
    doc["parity"] = nondeterministic(gate, {"stage": noisy}, ("RandomUniformLike (r)",), named=True).to_dict()
    validate_record(doc)
    rows = dict(summary_rows(doc))
    assert rows["judged formats"] == "y: onnx:a16w8 (the artifact: onnx:fp32)"
    assert rows["nondeterministic"] == (
        "admitted by the named --tolerance: the stage disagreed with itself on two computations of "
        "the same inputs; random ops: RandomUniformLike (r)")
    refused = nondeterministic(gate, {"stage": noisy}, (), named=False)
    doc["parity"] = refused.to_dict()
    validate_record(doc)
    assert dict(summary_rows(doc))["nondeterministic"].startswith("refused: the stage disagreed")
