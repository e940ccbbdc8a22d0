"""The gate's verdicts for an arm that disagrees with itself and for outputs judged by their own format."""

from __future__ import annotations

import numpy as np

from xstage import parity


def _y(values, dtype=np.float32):
    return {"y": np.asarray(values, dtype)}


def test_an_arm_that_repeats_itself_agrees_and_one_that_draws_random_numbers_does_not():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(256).astype(np.float32)
    assert parity.self_agreement(_y(x), _y(x.copy())).passed
    noisy = x + rng.uniform(0, 1, 256).astype(np.float32)
    again = x + rng.uniform(0, 1, 256).astype(np.float32)
    assert not parity.self_agreement(_y(noisy), _y(again)).passed
    # integers (Multinomial's samples) compare exactly
    k1, k2 = {"k": np.array([1, 2], np.int32)}, {"k": np.array([1, 3], np.int32)}
    assert not parity.self_agreement(k1, k2).passed


def test_nondeterministic_refuses_naming_the_output_and_the_random_ops():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    gate = parity.compare(_y(x), _y(x), fmt="onnx:fp32", reference_kind="same_graph_cpu")
    check = parity.self_agreement(_y(x), _y(x + 0.5))
    got = parity.nondeterministic(gate, {"stage": check, "reference": gate}, ("RandomUniformLike (r)",),
                                  named=False)
    assert (got.verdict, got.cause) == ("failed", "nondeterministic")
    assert got.summary.startswith("failed (nondeterministic): the stage disagreed with itself on y")
    assert got.summary.endswith("random ops: RandomUniformLike (r)")
    doc = got.to_dict()["determinism"]
    assert doc["nondeterministic"] and doc["arms"]["stage"]["outputs"] == ["y"] and not doc["tolerance_named"]
    assert parity.tiebreak_applies(got) is not None  # no float64 answer decides a random stage


def test_a_named_tolerance_admits_a_nondeterministic_stage_and_the_record_says_so():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    gate = parity.compare(_y(x + 0.1), _y(x), fmt="onnx:fp32", reference_kind="same_graph_cpu",
                          tolerance={"rel_l2": 10.0, "abs_rms": 10.0, "cosine": -1.0, "elem": 1.0})
    check = parity.self_agreement(_y(x), _y(x + 0.5))
    got = parity.nondeterministic(gate, {"stage": check}, (), named=True)
    assert got.passed and got.determinism is not None and got.determinism["tolerance_named"]
    assert "nondeterministic (admitted by the named tolerance)" in got.summary
    assert "random ops: none found in the graph" in got.summary


def test_agreeing_arms_leave_the_gate_as_it_was():
    x = np.ones(8, np.float32)
    gate = parity.compare(_y(x), _y(x), fmt="onnx:fp32", reference_kind="same_graph_cpu")
    same = parity.self_agreement(_y(x), _y(x))
    assert parity.nondeterministic(gate, {"stage": same, "reference": same}, (), named=False) is gate
    assert "determinism" not in gate.to_dict() and "formats" not in gate.to_dict()


def test_an_output_judged_a16w8_in_an_fp32_artifact_gets_a16w8s_tolerance_and_no_tiebreak():
    ref = {"y": np.linspace(1, 2, 64, dtype=np.float32), "z": np.linspace(1, 2, 64, dtype=np.float32)}
    off = {k: (v * 1.01).astype(np.float32) for k, v in ref.items()}  # 1e-2: A16W8's, not fp32's
    mixed = parity.compare(off, ref, fmt="onnx:fp32", reference_kind="same_graph_cpu",
                           formats={"y": "onnx:a16w8"})
    assert [m.passed for m in mixed.outputs] == [True, False]
    assert mixed.to_dict()["formats"] == {"y": "onnx:a16w8"}
    assert "judged by their own format: y onnx:a16w8" in mixed.summary
    assert parity.tiebreak_applies(mixed) is None  # z is fp32: the tie-break may decide it
    worse = parity.compare({"y": off["y"] * 1.2, "z": ref["z"]}, ref, fmt="onnx:fp32",
                           reference_kind="same_graph_cpu", formats={"y": "onnx:a16w8"})
    assert parity.tiebreak_applies(worse) == "A16W8 is not a float format: float64 is not its exact answer"


def test_a_later_calls_output_takes_its_base_names_format():
    ref = {"y": np.ones(8, np.float32), "y (call 2)": np.ones(8, np.float32)}
    off = {k: v * np.float32(1.01) for k, v in ref.items()}
    got = parity.compare(off, ref, fmt="onnx:fp32", reference_kind="same_graph_cpu",
                         formats={"y": "onnx:a16w8"})
    assert got.passed and set(got.formats) == {"y", "y (call 2)"}
