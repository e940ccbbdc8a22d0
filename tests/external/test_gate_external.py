"""The gate of docs/external.md §4 end to end: declared formats checked against the graph,
``--tolerance`` criteria, the float64 tie-break and 0-d outputs, through ``xstage external`` and
``open_stage``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import runcache
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs, errors
from xstage.artifact import inspect_artifact
from xstage.manifest import write_manifest
from xstage.stage import open_stage

FORMATS = ("onnx:fp32", "onnx:fp16", "onnx:a16w8")


def _fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    half = onnx.ModelProto()
    half.CopyFrom(model)
    for init in half.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in (*half.graph.input, *half.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return half


@pytest.fixture(scope="module")
def by_format(tmp_path_factory) -> dict[str, Path]:
    """One real graph per format: the MLP, its fp16 copy, its A16W8 quantization."""
    from xstage.export.quantize import quantize_a16w8

    root = tmp_path_factory.mktemp("formats")
    fp32 = builtin_graphs.write(builtin_graphs.mlp(width=64, depth=2), root / "mlp.onnx")
    fp16 = builtin_graphs.write(_fp16(builtin_graphs.mlp(width=64, depth=2)), root / "mlp16.onnx")
    quantize_a16w8(fp32, root / "mlp.a16w8.onnx", synthetic=8)
    return {"onnx:fp32": fp32, "onnx:fp16": fp16, "onnx:a16w8": root / "mlp.a16w8.onnx"}


@pytest.mark.parametrize("declared", FORMATS)
@pytest.mark.parametrize("actual", FORMATS)
def test_every_declared_format_is_checked_against_the_graph(by_format, declared, actual, tmp_path):
    """Every (declared, actual) pair, by flag: equal is accepted, anything else is a usage
    error that says what the graph is."""
    path = by_format[actual]
    if actual == "onnx:a16w8":  # its manifest says a16w8; a copy without it is judged by flag
        path = Path(tmp_path / "bare.onnx")
        path.write_bytes(by_format[actual].read_bytes())
    assert inspect_artifact(path).format == actual
    if declared == actual:
        assert inspect_artifact(path, fmt=declared).format == actual
        return
    with pytest.raises(errors.UsageError) as caught:
        inspect_artifact(path, fmt=declared)
    assert f"--format {declared} does not match" in caught.value.message
    assert f"the graph is {actual}" in caught.value.message
    assert "QuantizeLinear/DequantizeLinear" in caught.value.message


def test_a_manifest_declaring_a16w8_for_an_fp32_graph_is_a_usage_error(by_format, tmp_path):
    graph = tmp_path / "plain.onnx"
    graph.write_bytes(by_format["onnx:fp32"].read_bytes())
    write_manifest(graph, component="mlp", fmt="onnx:a16w8", files=[graph], source={"kind": "test"},
                   exporter={}, inputs=[], outputs=[])
    with pytest.raises(errors.UsageError, match="the manifest's format onnx:a16w8 does not match "
                       "plain.onnx: the graph is onnx:fp32 \\(0 QuantizeLinear"):
        inspect_artifact(graph)


def test_format_a16w8_on_fp32_exits_64_before_any_worker(external, by_format):
    r = external("--graph", str(by_format["onnx:fp32"]), "--format", "onnx:a16w8")
    assert r.code == 64 and r.record is None, r.stderr
    assert "the graph is onnx:fp32" in r.stderr and "Traceback" not in r.stderr


def test_tolerance_criteria_parse_and_a_bad_one_exits_64(external):
    from xstage.cli.external import parse_tolerance

    assert parse_tolerance("1e-3") == 1e-3
    assert parse_tolerance("rel_l2=1e-3, cosine=0.99,elem=0") == {"rel_l2": 1e-3, "cosine": 0.99, "elem": 0.0}
    for bad in ("x", "rel_l2=", "rel_l2=1,rel_l2=2", "nope=1", "elem=2", "-1"):
        with pytest.raises(errors.UsageError):
            parse_tolerance(bad)
    r = external("--tolerance", "rel_l2=1e-3,bogus=1")
    assert r.code == 64 and r.record is None and "unknown criterion 'bogus'" in r.stderr


def test_a_tighter_tolerance_applies_and_the_summary_marks_it(external, openvino_python):
    """OpenVINO f32 on the built-in MLP 512x6 passes the defaults (rel_l2 7.4e-07, max_abs
    7.5e-07, above the 4.8e-07 floor); rel_l2=1e-9,abs_rms=1e-9
    refuses it (no float64 tie-break for a tightened tolerance), and the record and summary
    mark both criteria as not the default."""
    env = {"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)}
    r = external("--route", "ort-openvino", "--tolerance", "rel_l2=1e-9,abs_rms=1e-9", env=env)
    assert r.code == 2, r.stderr
    gate = r.record["outcome"]["refusals"][-1]["evidence"]["parity"]
    assert gate["non_default"] == ["rel_l2", "abs_rms"] and gate["cause"] == "tolerance"
    assert "tightened" in gate["tiebreak"] if gate["tiebreak"] else True
    assert r.record["request"]["tolerance"] == 1e-9
    assert r.record["request"]["tolerance_criteria"] == {"rel_l2": 1e-9, "abs_rms": 1e-9}
    assert "gate criteria" in r.stdout and "not the default: rel_l2=" in r.stdout


def _mean_graph(path: Path, kind: str, rows: int = 8, n: int = 1000) -> Path:
    """x − mean(x): ReduceMean (the stage) or a MatMul by 1/n (the user's reference)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])
    inits = []
    if kind == "reducemean":
        nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1)]
    else:
        inits = [numpy_helper.from_array(np.full((n, 1), 1.0 / n, np.float32), "w")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    nodes.append(helper.make_node("Sub", ["x", "m"], ["y"]))
    model = helper.make_model(helper.make_graph(nodes, kind, [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_an_ill_conditioned_output_passes_by_the_tiebreak(tmp_path):
    """x − mean(x) over 1000 ± 1e-3 (docs/external.md §4, "Ill-conditioned outputs"): the stage
    (ReduceMean on the ort-cpu worker) and the reference (a MatMul by 1/n) differ by rel_l2
    ~2e-2, and each is ~3e-2 from float64. Measured here: stage 3.85e-02, reference 3.11e-02 (1.24x)."""
    stage_graph = _mean_graph(tmp_path / "stage.onnx", "reducemean")
    reference = _mean_graph(tmp_path / "reference.onnx", "matmul")
    x = (1000 + np.random.default_rng(0).standard_normal((8, 1000)) * 1e-3).astype(np.float32)
    with open_stage(stage_graph, route="ort-cpu", reference=reference, inputs={"x": x}) as stage:
        gate = stage.parity
        tb = gate.tiebreak
        print(f"\n{gate.summary}")
        assert gate.passed and tb is not None and tb["status"] == "passed"
        (row,) = tb["outputs"]
        assert row["stage_rel_l2"] > 1e-3 and row["reference_rel_l2"] > 1e-3
        assert gate.outputs[0].passed is False  # the fp32 comparison failed; float64 decided
        assert gate.to_dict()["tiebreak"]["evaluator"].startswith("onnx.reference")


def test_a_graph_the_tiebreak_cannot_evaluate_stays_refused_with_unavailable(tmp_path, external):
    """The reference graph (the one the tie-break evaluates) is a com.microsoft Gelu, which
    onnxruntime runs and the evaluator's checked table lacks; the stage rounds through float16:
    the fp32 verdict stands, and the record says why, naming the node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])
    stage = helper.make_model(
        helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8)
    onnx.save(stage, str(tmp_path / "ref.onnx"))
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["h"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Gelu", ["xf"], ["y"])]
    rounded = helper.make_model(helper.make_graph(nodes, "r", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    onnx.save(rounded, str(tmp_path / "gelu.onnx"))
    r = external("--graph", str(tmp_path / "gelu.onnx"), "--route", "ort-cpu",
                 "--reference", str(tmp_path / "ref.onnx"))
    assert r.code == 2, r.stderr
    refusal = r.record["outcome"]["refusals"][-1]
    assert refusal["code"] == "numeric_gate_failed"
    tb = refusal["evidence"]["parity"]["tiebreak"]
    assert tb["status"] == "unavailable" and tb["reason_code"] == "unchecked_op"
    assert "Gelu (com.microsoft)" in tb["reason"] and tb["graph"]["name"] == "ref.onnx"
    assert "float64 tie-break" in r.stdout and "unavailable" in r.stdout


def _qdq_region(root: Path) -> tuple[Path, Path, str]:
    """A real ``DQ → MatMul → Q`` region, as ``xstage bisect`` cuts one: a Tanh·MatMul chain
    (8 wide) quantized by ``xstage quantize`` (A16W8: uint16 activations, int8 weights), cut
    from the second MatMul's input Q to its output Q; its input captured on the CPU EP."""
    import onnx.utils
    import onnxruntime as ort

    from xstage.export.quantize import quantize_a16w8

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((8, 8)) / np.sqrt(8)).astype("f4")
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], ["y" if i == 2 else f"t{i}"])]
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(root / "chain.onnx"))
    quantize_a16w8(root / "chain.onnx", root / "chain.a16w8.onnx", synthetic=4)
    cut_in, cut_out = "t0_QuantizeLinear_Output", "m1_QuantizeLinear_Output"
    onnx.utils.extract_model(str(root / "chain.a16w8.onnx"), str(root / "region.onnx"), [cut_in], [cut_out])
    full = onnx.load(str(root / "chain.a16w8.onnx"))
    full.graph.output.append(helper.make_tensor_value_info(cut_in, TensorProto.UINT16, None))
    session = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    (captured,) = session.run([cut_in], {"x": x})
    np.savez(root / "region.npz", **{cut_in: captured})
    return root / "region.onnx", root / "region.npz", cut_out


@pytest.mark.parametrize("route", ["ort-cpu", "ort-openvino"])
def test_a_qdq_region_is_compared_dequantized(route, openvino_python, tmp_path, external):
    """docs/bisect.md's case: OpenVINO requantizes the region's uint16 output differently from
    the CPU EP (measured here: 31 of 32 positions, up to 126 steps; rel_l2 3.2e-03
    dequantized), so the exact rule refused a region the EP takes whole. Dequantized with the
    Q's scale and zero point, under A16W8's tolerance, it passes, and the record names the
    output. On ort-cpu the two arms agree bit for bit, dequantized too."""
    import onnxruntime as ort

    from xstage.parity import compare

    graph, inputs, name = _qdq_region(tmp_path)
    out = tmp_path / "out.npz"
    r = external("--graph", str(graph), "--inputs", str(inputs), "--route", route,
                 "--save-outputs", str(out), env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 0, r.stdout + r.stderr
    gate = r.record["parity"]
    (row,) = gate["outputs"]
    assert gate["dequantized"] == [name] and row["dtype"] == "uint16"
    assert row["dequantized"]["node"] == "m1_QuantizeLinear" and row["criterion"].startswith("dequantized")
    assert "dequantized" in r.stdout
    stage = np.load(out)[name]
    feeds = dict(np.load(inputs))
    (reference,) = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, feeds)
    steps = np.abs(stage.astype(np.int64) - reference.astype(np.int64))
    print(f"\n{route}: {np.count_nonzero(steps)} of {steps.size} positions differ, max {steps.max()} "
          f"steps; dequantized rel_l2 {row['rel_l2']:.2e}")
    exact = compare({name: stage}, {name: reference}, fmt="onnx:a16w8", reference_kind="same_graph_cpu")
    if route == "ort-openvino":
        assert np.count_nonzero(steps) > 0 and exact.verdict == "failed"  # what the exact rule did
        assert 0 < row["rel_l2"] < 3e-2
    else:
        assert not steps.any() and row["rel_l2"] == 0.0


_ZERO_D = textwrap.dedent('''
    import sys, torch
    from pathlib import Path
    from xstage.manifest import write_manifest

    class M(torch.nn.Module):
        def forward(self, x):
            return x.sum(), x * 2

    path = Path(sys.argv[1])
    torch.export.save(torch.export.export(M(), (torch.randn(3, 4),), strict=False), str(path))
    write_manifest(path, component="zerod", fmt="pt:fp32", files=[path], source={"kind": "test"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [3, 4]}],
                   outputs=[{"name": "total", "dtype": "float32", "shape": []},
                            {"name": "double", "dtype": "float32", "shape": [3, 4]}])
''')


@pytest.mark.slow(reason="a 0-d torch output through both arms is tests/adversarial/test_adv_proof.py's "
                        "zero_d case on torch-cpu, by default")
def test_a_0d_torch_output_keeps_its_shape_on_both_arms(export_python, torch_python, tmp_path,
                                                        monkeypatch):
    """A program returning a 0-d sum: the stage and the reference worker both return shape (),
    as the manifest declares (the declared-shape rule fails the gate otherwise)."""
    path = tmp_path / "zerod.pt2"
    # kept in the test cache while the code it runs is unchanged (tests/runcache.py)
    done = runcache.run(export_python, ["-c", _ZERO_D, "{out}/zerod.pt2"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("XSTAGE_PYTHON_TORCH_CPU", str(torch_python))
    with open_stage(path, route="torch-cpu") as stage:
        shapes = {m.name: (m.shape, m.reference_shape) for m in stage.parity.outputs}
        assert shapes == {"total": ((), ()), "double": ((3, 4), (3, 4))}
        assert stage(stage.inputs)["total"].shape == ()
