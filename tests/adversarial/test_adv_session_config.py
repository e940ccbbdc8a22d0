"""Zero false passes from a session config entry that changes the stage's numbers.

``--session-config`` tunes the stage's session only; the gate's reference is built as always
(docs/throughput.md, "Session config"), so an entry that changes what the stage computes must
show as a disagreement, never as a pass. The case: ``session.set_denormal_as_zero=1`` (onnxruntime
flushes denormal floats to zero on its threads) on a graph that scales its denormal input up to
a normal number, ``y = (x + x) * 1e38``: with the entry the stage answers 0 where the reference
answers 0.2. The oracle is onnxruntime's own session in this process, without the entry.
A control with the entry on normal inputs (nothing to flush) is admitted: the entry alone is no
refusal. The bound, from the gate's rules (docs/external.md, rules 7 and 8): a flush whose
outputs differ by less than float32's smallest normal (every answer itself denormal) is no
disagreement.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import xstage
from xstage import builtin_graphs, errors

N = 1 << 16
DAZ = {"session.set_denormal_as_zero": "1"}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory):
    """``y = (x + x) * 1e38``: a denormal input, read as zero, leaves y zero."""
    c = numpy_helper.from_array(np.array(1e38, np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])], "daz",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return builtin_graphs.write(model, tmp_path_factory.mktemp("daz") / "daz.onnx")


def _raw(path, x, config):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # every element on the calling thread, as the stage is opened
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_truth_and_the_control(scaled):
    """Truth from onnxruntime alone, without the entry: 0.2 for the denormal input. With the
    entry a normal input's answer is unchanged, bit for bit. (Which of onnxruntime's threads the
    entry flushes is its own business: in this process the calling thread kept its denormals;
    the worker's runs are flushed, which the refusal below shows as a zero output.)"""
    tiny = np.full([N], 1e-39, np.float32)
    assert np.all(np.abs(_raw(scaled, tiny, {}) - 0.2) < 1e-6)
    normal = np.full([N], 1e-30, np.float32)
    np.testing.assert_array_equal(_raw(scaled, normal, DAZ), _raw(scaled, normal, {}))


def test_an_entry_that_changes_the_numbers_is_refused_with_the_output_named(scaled):
    tiny = np.full([N], 1e-39, np.float32)
    with pytest.raises(errors.Refused) as caught:
        xstage.open_stage(scaled, route="ort-cpu", threads=1, inputs={"x": tiny}, session_config=DAZ,
                          record_on_close=False)
    text = str(caught.value)
    assert "numeric_gate_failed" in text and "y: rel_l2 1.0e+00" in text and "(zero output)" in text
    record = caught.value.record or {}
    assert record.get("request", {}).get("session_config") == DAZ  # the record says what ran


def test_the_control_with_nothing_to_flush_is_admitted(scaled):
    normal = np.full([N], 1e-30, np.float32)
    with xstage.open_stage(scaled, route="ort-cpu", threads=1, inputs={"x": normal}, session_config=DAZ,
                           record_on_close=False) as stage:
        np.testing.assert_array_equal(stage({"x": normal})["y"], _raw(scaled, normal, {}))
        assert stage.record()["worker"]["runtime"]["session_config"] == DAZ
