"""The sanitizer: each rewrite only where provably a no-op, every site reported, outputs equal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import runcache
from onnx import TensorProto, helper, numpy_helper

from xstage import errors
from xstage.export import sanitize_onnx


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _save(model, path: Path, external=False) -> Path:
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".weights", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))
    return path


def _vi(name, dims, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, dims)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def reshape_graph():
    """Three Reshapes with allowzero=1: two safe (constant shape, no 0), one unsafe (a literal 0,
    on an empty tensor, where allowzero=1 is what makes it an empty dimension)."""
    nodes = [
        helper.make_node("Reshape", ["x", "safe_shape"], ["r1"], name="safe_reshape", allowzero=1),
        helper.make_node("Reshape", ["r1", "back"], ["y"], name="back", allowzero=1),
        helper.make_node("Reshape", ["z", "zero_shape"], ["w"], name="zero_reshape", allowzero=1),
    ]
    return _model(nodes, [_vi("x", [2, 3, 4]), _vi("z", [0, 4])], [_vi("y", [6, 4]), _vi("w", [0, 2, 2])],
                  [_i64("safe_shape", [6, 4]), _i64("zero_shape", [0, 2, 2]), _i64("back", [6, 4])])


def test_safe_allowzero_is_cleared_and_a_literal_zero_is_left_alone(tmp_path):
    src = _save(reshape_graph(), tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx")
    by = {s["node"]: s for s in report["sites"]}
    assert by["safe_reshape"]["verdict"] == "applied"
    assert by["back"]["verdict"] == "applied"
    zero = by["zero_reshape"]
    assert zero["verdict"] == "skipped" and "literal 0" in zero["reason"] and "[0, 2, 2]" in zero["reason"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    allowzero = {n.name: helper.get_attribute_value(n.attribute[0]) for n in out.graph.node}
    assert allowzero == {"safe_reshape": 0, "zero_reshape": 1, "back": 0}
    assert report["parity"]["status"] == "identical" and report["checker"] == "passed"
    assert report["counts"]["ClearReshapeAllowzeroPass"] == {"applied": 2, "skipped": 1}


def test_a_runtime_shape_is_skipped_with_the_reason(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Reshape", ["x", "s"], ["y"], name="dyn", allowzero=1)]
    src = _save(_model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])]), tmp_path / "in.onnx")
    (site,) = sanitize_onnx(src, tmp_path / "out.onnx")["sites"]
    assert site["verdict"] == "skipped" and "run time" in site["reason"]


def nan_guard_graph():
    nodes = [
        # same value on both branches: a no-op guard
        helper.make_node("IsNaN", ["x"], ["nan1"], name="isnan_same"),
        helper.make_node("Where", ["nan1", "x", "x"], ["g1"], name="where_same"),
        # a real guard on a run-time value: must stay
        helper.make_node("IsNaN", ["g1"], ["nan2"], name="isnan_real"),
        helper.make_node("Where", ["nan2", "zero", "g1"], ["g2"], name="where_real"),
        # a guard on a constant with no NaN: the condition is all false
        helper.make_node("IsNaN", ["c"], ["nan3"], name="isnan_const"),
        helper.make_node("Where", ["nan3", "zero4", "c"], ["g3"], name="where_const"),
        helper.make_node("Add", ["g2", "g3"], ["y"], name="add"),
    ]
    inits = [numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(np.zeros((4,), np.float32), "zero4"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")]
    return _model(nodes, [_vi("x", [4])], [_vi("y", [4])], inits)


def test_nan_guards_go_only_where_they_cannot_change_the_result(tmp_path):
    src = _save(nan_guard_graph(), tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx")
    by = {s["node"]: s for s in report["sites"] if s["rewrite"] == "RemoveNanGuardPass"}
    assert by["where_same"]["verdict"] == "applied" and "same value" in by["where_same"]["reason"]
    assert by["where_const"]["verdict"] == "applied" and "no NaN" in by["where_const"]["reason"]
    assert by["where_real"]["verdict"] == "skipped" and "may be NaN" in by["where_real"]["reason"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node]
    assert ops.count("Where") == 1 and ops.count("IsNaN") == 1
    x = np.array([1.0, np.nan, -2.0, 3.0], np.float32)
    report2 = sanitize_onnx(src, tmp_path / "out2.onnx", inputs={"x": x})
    assert report2["parity"]["status"] == "identical"


def scalar_axes_graph():
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax0"], ["u"], name="unsq"),
        helper.make_node("Squeeze", ["u", "ax0"], ["s"], name="sq"),
        helper.make_node("Unsqueeze", ["s", "ax_shared"], ["u2"], name="unsq_shared"),
        helper.make_node("Cast", ["ax_shared"], ["axf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["u2", "axf"], ["y"], name="mul"),
    ]
    inits = [_i64("ax0", 0), _i64("ax_shared", 1)]
    return _model(nodes, [_vi("x", [3])], [_vi("y", [3, 1])], inits)


def test_rank0_axes_are_promoted_unless_another_consumer_depends_on_the_rank(tmp_path):
    src = _save(scalar_axes_graph(), tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx")
    by = {s["node"]: s for s in report["sites"]}
    applied = [s for s in report["sites"] if s["verdict"] == "applied"]
    assert len(applied) == 1 and "'ax0'" in applied[0]["reason"]  # one constant, promoted once
    assert by["unsq_shared"]["verdict"] == "skipped" and "Cast" in by["unsq_shared"]["reason"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    assert inits["ax0"].shape == (1,) and inits["ax_shared"].shape == ()
    # onnxruntime itself refuses rank-0 axes, so the input cannot be compared; the output runs.
    assert report["parity"]["status"] == "unchecked"
    assert "input graph does not run" in report["parity"]["detail"]


def test_external_data_stays_one_consistently_named_sidecar(tmp_path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Reshape", ["m", "shape"], ["y"], name="rs", allowzero=1)]
    model = _model(nodes, [_vi("x", [1, 64])], [_vi("y", [8, 8])], [w, _i64("shape", [8, 8])])
    src = _save(model, tmp_path / "in.onnx", external=True)
    assert (tmp_path / "in.onnx.weights").exists()
    out_dir = tmp_path / "out"
    report = sanitize_onnx(src, out_dir / "clean.onnx")
    assert sorted(p.name for p in out_dir.iterdir()) == ["clean.onnx", "clean.onnx.data"]
    assert [f["path"] for f in report["files"]] == ["clean.onnx", "clean.onnx.data"]
    graph = onnx.load(str(out_dir / "clean.onnx"), load_external_data=False).graph
    locations = {e.value for i in graph.initializer for e in i.external_data if e.key == "location"}
    assert locations == {"clean.onnx.data"}
    assert report["parity"]["status"] == "identical"


def test_symbolic_dimensions_leave_the_check_unchecked_not_guessed(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs", allowzero=1)]
    model = _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", ["batch", 2, 2])], [_i64("shape", [-1, 2, 2])])
    src = _save(model, tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx")
    assert report["parity"]["status"] == "unchecked"
    assert report["parity"]["detail"].startswith("unchecked: pass --inputs or --shape")
    fixed = sanitize_onnx(src, tmp_path / "out2.onnx", dims={"batch": 3})
    assert fixed["parity"]["status"] == "identical"


def test_output_names_never_change_and_the_input_is_refused_as_output(tmp_path):
    src = _save(reshape_graph(), tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx")
    assert report["outputs"] == ["y", "w"]
    assert [o.name for o in onnx.load(str(tmp_path / "out.onnx")).graph.output] == ["y", "w"]
    with pytest.raises(errors.UsageError):
        sanitize_onnx(src, src)


def test_a_corrupt_graph_is_an_artifact_error_and_nothing_is_written(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    with pytest.raises(errors.ArtifactError):
        sanitize_onnx(bad, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "xstage", "sanitize", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_the_report_and_lists_every_site(tmp_path):
    src = _save(reshape_graph(), tmp_path / "in.onnx")
    r = _cli(str(src), str(tmp_path / "out.onnx"), "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "zero_reshape" in r.stdout and "skipped" in r.stdout and "bitwise identical" in r.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["kind"] == "xstage.sanitize" and len(doc["sites"]) == 3


def test_cli_errors_are_one_line_with_exit_codes(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"nope")
    r = _cli(str(bad), str(tmp_path / "out.onnx"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    r = _cli(str(bad))
    assert r.returncode == 64


def guarded_graph(op: str):
    """``Where(IsNaN(v), 0, v)`` on ``v = op(x)``: Relu never makes a NaN of a finite input;
    Log makes one of every negative input, which the guard turns into 0."""
    nodes = [helper.make_node(op, ["x"], ["v"], name="f"),
             helper.make_node("IsNaN", ["v"], ["nan"], name="isnan"),
             helper.make_node("Where", ["nan", "zero", "v"], ["g"], name="guard"),
             helper.make_node("Identity", ["g"], ["y"], name="out")]
    return _model(nodes, [_vi("x", [4, 8])], [_vi("y", [4, 8])],
                  [numpy_helper.from_array(np.zeros((), np.float32), "zero")])


def test_assume_finite_removes_a_guard_the_samples_bear_out(tmp_path):
    src = _save(guarded_graph("Relu"), tmp_path / "in.onnx")
    default = sanitize_onnx(src, tmp_path / "keep.onnx")
    (site,) = [s for s in default["sites"] if s["rewrite"] == "RemoveNanGuardPass"]
    assert site["verdict"] == "skipped" and "may be NaN" in site["reason"]
    report = sanitize_onnx(src, tmp_path / "out.onnx", assume_finite="all")
    (site,) = [s for s in report["sites"] if s["rewrite"] == "RemoveNanGuardPass"]
    assert site["verdict"] == "applied" and site["assumed"] == "v" and "assumed finite" in site["reason"]
    assert report["assumption"]["status"] == "identical" and report["assumption"]["samples"] == 8
    assert report["parity"] == report["assumption"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node]
    assert "IsNaN" not in ops and "Where" not in ops
    named = sanitize_onnx(src, tmp_path / "named.onnx", assume_finite=["v"])
    assert named["assume_finite"] == ["v"] and named["assumption"]["status"] == "identical"


def test_an_assumption_the_samples_refute_is_reverted_and_reported(tmp_path):
    """Log of the synthesized (standard normal) inputs is NaN at every negative: without the
    guard the outputs move (NaN where 0 was), so the removal is reverted."""
    src = _save(guarded_graph("Log"), tmp_path / "in.onnx")
    report = sanitize_onnx(src, tmp_path / "out.onnx", assume_finite=["v"])
    (site,) = [s for s in report["sites"] if s["rewrite"] == "RemoveNanGuardPass"]
    assert site["verdict"] == "reverted" and site["assumed"] == "v"
    assert "the guard is kept" in site["reason"] and "sample 0" in site["reason"]
    assert report["assumption"]["status"] == "reverted"
    assert report["parity"]["status"] == "identical"  # what was written is the provable rewrite
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node]
    assert "IsNaN" in ops and "Where" in ops
    x = np.abs(np.random.default_rng(0).standard_normal((4, 8))).astype(np.float32) + 0.1
    given = sanitize_onnx(src, tmp_path / "given.onnx", assume_finite=["v"], inputs={"x": x})
    assert given["assumption"]["status"] == "identical" and given["assumption"]["samples"] == 1


def test_assume_finite_names_only_guarded_values(tmp_path):
    src = _save(guarded_graph("Relu"), tmp_path / "in.onnx")
    with pytest.raises(errors.UsageError, match="no NaN guard of in.onnx reads") as info:
        sanitize_onnx(src, tmp_path / "out.onnx", assume_finite=["x"])
    assert "v" in info.value.remedy
    with pytest.raises(errors.UsageError, match="unknown preset"):
        sanitize_onnx(src, tmp_path / "out.onnx", preset="coreml")


def test_presets_qnn_and_dml(tmp_path):
    model = guarded_graph("Relu")
    model.graph.node.extend([helper.make_node("Reshape", ["x", "shape"], ["r"], name="rs", allowzero=1)])
    model.graph.initializer.extend([_i64("shape", [32])])
    model.graph.output.extend([_vi("r", [32])])
    src = _save(model, tmp_path / "in.onnx")
    dml = sanitize_onnx(src, tmp_path / "dml.onnx", preset="dml")
    assert {s["rewrite"] for s in dml["sites"]} == {"ClearReshapeAllowzeroPass"}
    assert dml["assume_finite"] == [] and dml["assumption"] is None
    qnn = sanitize_onnx(src, tmp_path / "qnn.onnx", preset="qnn")
    assert qnn["assume_finite"] == "all" and qnn["preset"] == "qnn"
    by = {s["rewrite"]: s["verdict"] for s in qnn["sites"]}
    assert by == {"ClearReshapeAllowzeroPass": "applied", "RemoveNanGuardPass": "applied"}
    r = _cli(str(src), str(tmp_path / "cli.onnx"), "--for", "qnn")
    assert r.returncode == 0 and "assumption check (identical)" in r.stdout, r.stderr


_ATTENTION = r'''
import sys, torch
class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = (f(x).view(b, s, 2, 8).transpose(1, 2) for f in (self.q, self.k, self.v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return o.transpose(1, 2).reshape(b, s, d)
torch.manual_seed(0)
mask = torch.ones(2, 8, dtype=torch.bool)
mask[0, 6:] = False
torch.onnx.export(Attn().eval(), (torch.randn(2, 8, 16), mask), sys.argv[1], dynamo=True,
                  input_names=["x", "mask"], output_names=["y"])
'''


def test_a_dynamo_export_of_boolean_mask_attention(export_python, tmp_path):
    """torch.onnx's dynamo export of scaled_dot_product_attention with a boolean mask guards
    its Softmax with Where(IsNaN(p), 0, p): kept by default (and said why), removed with
    --assume-finite all, the outputs bitwise equal on the 8 synthesized samples (random masks
    included) and on a mask with a row masked out."""
    src = tmp_path / "attn.onnx"  # kept in the test cache while its code is unchanged (tests/runcache.py)
    done = runcache.run(export_python, ["-c", _ATTENTION, "{out}/attn.onnx"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    r = _cli(str(src), str(tmp_path / "keep.onnx"), "--json", str(tmp_path / "keep.json"))
    assert r.returncode == 0, r.stderr
    (kept,) = [s for s in json.loads((tmp_path / "keep.json").read_text())["sites"]
               if s["rewrite"] == "RemoveNanGuardPass"]
    assert kept["verdict"] == "skipped" and "may be NaN" in kept["reason"]
    r = _cli(str(src), str(tmp_path / "out.onnx"), "--assume-finite", "all", "--json",
             str(tmp_path / "out.json"))
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    report = json.loads((tmp_path / "out.json").read_text())
    (site,) = [s for s in report["sites"] if s["rewrite"] == "RemoveNanGuardPass"]
    assert site["verdict"] == "applied" and site["assumed"] and site["node"] == kept["node"]
    assert report["assumption"]["status"] == "identical" and report["assumption"]["samples"] == 8
    assert "IsNaN" not in {n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node}
    mask = np.ones((2, 8), bool)
    mask[1] = False  # a whole row masked out
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 16)).astype(np.float32), "mask": mask}
    from xstage.export.sanitize import run_on_cpu
    a, b = run_on_cpu(src, feeds)["y"], run_on_cpu(tmp_path / "out.onnx", feeds)["y"]
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
