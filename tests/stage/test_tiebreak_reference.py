"""The tie-break's exact answer is the reference graph's, never the artifact under test's.

A stage whose graph computes the reference's outputs negated, scaled by 1.01 or zeroed is
exact against *its own* float64 answer; with a separate reference (``--reference``, an fp32
source) the tie-break must evaluate the reference graph, where such a stage is far off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from xstage import builtin_graphs
from xstage.artifact import inspect_artifact
from xstage.parity import compare
from xstage.stage import tiebreak
from xstage.stage.reference import OnnxReference


def _tail(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """``model`` with its output ``y`` passed through ``kind`` (neg, scale, zero)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for node in graph.node:
        node.output[:] = ["y_inner" if o == "y" else o for o in node.output]
    if kind == "neg":
        graph.node.append(helper.make_node("Neg", ["y_inner"], ["y"]))
    else:
        factor = 1.01 if kind == "scale" else 0.0
        graph.initializer.append(helper.make_tensor("k", TensorProto.FLOAT, [], [factor]))
        graph.node.append(helper.make_node("Mul", ["y_inner", "k"], ["y"]))
    return out


@pytest.fixture
def reference_mlp(tmp_path: Path) -> tuple[Path, onnx.ModelProto, np.ndarray]:
    model = builtin_graphs.mlp(width=64, depth=3, batch=8, seed=3)
    path = builtin_graphs.write(model, tmp_path / "reference.onnx")
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    return path, model, x


@pytest.mark.parametrize("kind", ["neg", "scale", "zero"])
def test_a_wrong_stage_is_refused_against_the_reference_graph(kind, reference_mlp, tmp_path):
    """The stage runs its own graph (exact: it is what its float64 answer says); the reference
    arm is the separate graph: the tie-break evaluates that one and refuses the stage."""
    ref_path, model, x = reference_mlp
    stage_path = builtin_graphs.write(_tail(model, kind), tmp_path / f"stage-{kind}.onnx")
    art = inspect_artifact(stage_path)
    arm = OnnxReference(ref_path, "user", {})
    reference = arm.outputs({"x": x})
    stage = OnnxReference(stage_path, "user", {}).outputs({"x": x})
    gate = compare(stage, reference, fmt="onnx:fp32", reference_kind="user")
    assert gate.verdict == "failed"
    settled = tiebreak.settle(gate, art, {"x": x}, stage, reference, arm)
    assert settled.verdict == "failed", settled.summary
    assert settled.tiebreak["graph"] == {"kind": "user", "name": "reference.onnx"}
    assert settled.tiebreak["status"] in ("failed", "unavailable")
    if kind != "zero":  # zeros where tanh is 0 nowhere: compared, and far
        assert settled.tiebreak["status"] == "failed"
    # Before: the artifact's own graph was the answer, and the stage was exact against it.
    own = tiebreak.settle(gate, art, {"x": x}, stage, reference)
    assert own.tiebreak["graph"]["name"] == stage_path.name


def _reordered_mlp(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The MLP computed in fp32 by numpy, each product summed one rank-1 update at a time
    (another order than onnxruntime's: fp32 noise, beyond rule 8's a = 1e-7 at small outputs)."""
    from onnx import numpy_helper

    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    prev = x
    for node in model.graph.node:
        if node.op_type == "MatMul":
            w = weights[node.input[1]]
            acc = np.zeros((prev.shape[0], w.shape[1]), np.float32)
            for k in range(w.shape[0]):
                acc += np.outer(prev[:, k], w[k]).astype(np.float32)
            prev = acc
        elif node.op_type == "Add":
            prev = prev + weights[node.input[1]]
        elif node.op_type == "Relu":
            prev = np.maximum(prev, np.float32(0))
        elif node.op_type == "Tanh":
            prev = np.tanh(prev)
    return prev.astype(np.float32)


def test_a_reordered_stage_passes_against_the_reference_graph(reference_mlp, tmp_path):
    """The control: a stage that sums in another order (fp32 noise beyond rule 8's a = 1e-7)
    passes by the reference graph's float64 answer."""
    ref_path, model, x = reference_mlp
    arm = OnnxReference(ref_path, "user", {})
    reference = arm.outputs({"x": x})
    stage = {"y": _reordered_mlp(model, x)}
    gate = compare(stage, reference, fmt="onnx:fp32", reference_kind="user")
    assert gate.verdict == "failed" and gate.cause == "elementwise"
    other = builtin_graphs.write(_tail(model, "scale"), tmp_path / "stage.onnx")
    settled = tiebreak.settle(gate, inspect_artifact(other), {"x": x}, stage, reference, arm)
    assert settled.passed, settled.summary
    assert settled.tiebreak["graph"]["name"] == "reference.onnx"


def test_reference_graph_is_the_artifact_only_when_it_is_its_own_reference(reference_mlp, tmp_path):
    ref_path, _, _ = reference_mlp
    art = inspect_artifact(ref_path)
    assert tiebreak.reference_graph(art, OnnxReference(ref_path, "same_graph_cpu", {}))[0] == ref_path
    # with no arm the artifact is its own reference: the snapshot of the bytes it hashed
    assert tiebreak.reference_graph(art, None) == (art.path, art.bytes, "same_graph_cpu")
    other = builtin_graphs.write(builtin_graphs.mlp(width=8, depth=1), tmp_path / "source.onnx")
    path, size, kind = tiebreak.reference_graph(art, OnnxReference(other, "fp32_source", {}))
    assert (path, size, kind) == (other, other.stat().st_size, "fp32_source")
