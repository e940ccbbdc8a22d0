"""The name check (``xstage.evidence.names``) on every captured profile, and on crafted ones.

Every fixture under ``tests/fixtures/profiles`` (onnxruntime 1.19, 1.24 OpenVINO, 1.30 WebGPU,
1.32) is a real run; its graph's names are the names its session ran with. Each kernel event
and plan entry must pass the rule, except where the graph's own names fail the worker's check
(the ``*_quoted`` captures, whose names hold a quote and backslashes): a worker would have run a
renamed copy, so those profiles are what an unchecked session gives, and nothing in them counts.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from xstage.evidence import parse_profile, prove
from xstage.evidence.names import check_names, session_names
from xstage_remote.onnx_names import read_nodes

PROFILES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"
ALL = sorted(p.name.removesuffix(".meta.json") for p in PROFILES.glob("*.meta.json"))
UNCHECKED = {name for name in ALL if name.endswith("_quoted")}
OV, CPU = "OpenVINOExecutionProvider", "CPUExecutionProvider"


def _meta(name: str) -> dict:
    return json.loads((PROFILES / f"{name}.meta.json").read_text())


def _capture_module():
    spec = importlib.util.spec_from_file_location("_capture", PROFILES / "capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


CAPTURE = _capture_module()


def _report(name: str) -> dict:
    """What the worker reports for the fixture's graph: ``onnx_names.read_nodes`` on the same
    graph (capture.py builds it deterministically); the names are the ones the session ran with."""
    cap = next(c for c in CAPTURE.CAPTURES if c.name == name)
    nodes = read_nodes(CAPTURE.GRAPHS[cap.graph]().SerializeToString(), inputs=True)
    assert [n for n, _, _, _ in nodes] == [n["name"] for n in _meta(name)["graph"]["nodes"]]
    written = {v for _, _, outs, _ in nodes for v in outs}
    return {"renamed": False, "nodes": [{"name": n, "op_type": op, "original": n, "outputs": outs}
                                        for n, op, outs, _ in nodes],
            "read": sorted({v for _, _, _, ins in nodes for v in ins if v and v not in written})}


def _kernels(name: str) -> list[tuple[str, str, str | None]]:
    events = parse_profile((PROFILES / f"{name}.profile.json").read_bytes()).events
    return [(e["name"].removesuffix("_kernel_time"), e["op_name"] or "", e["provider"])
            for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]


@pytest.mark.parametrize("name", ALL)
def test_every_captured_profile_against_the_rule(name):
    names = session_names(None, _report(name))
    kernels = check_names(_kernels(name), names)
    plan_file = PROFILES / f"{name}.assignment.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else []
    planned = check_names([(n["name"], n["op_type"], None) for sg in plan for n in sg["nodes"]], names)
    if name in UNCHECKED:
        assert not kernels.passed and kernels.failed == 2 and names.problems
    else:
        assert kernels.passed, kernels.failures
        assert planned.passed, planned.failures


@pytest.mark.parametrize(("event", "op", "provider", "fixture"), [
    ("fused /MatMulAddFusion/_token_0", "FusedGemm", CPU, "ort119_cpu_mlp"),  # 1.19: trailing /
    ("fused /MatMulAddFusion_token_0", "FusedGemm", CPU, "ort132_cpu_mlp"),
    ("Tanh_6", "Tanh", CPU, "ort132_cpu_mlp"),  # <op>_<i> of an unnamed node
    ("matmul/MatMulAddFusion", "Gemm", "WebGpuExecutionProvider", "webgpu130_det"),
    ("Memcpy_token_0", "MemcpyFromHost", "WebGpuExecutionProvider", "webgpu130_det"),
    ("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0", "OpenVINO-EP-subgraph_1", OV, "ov124_det"),
    ("r1_nchwc", "Conv", CPU, "ort132_cpu_conv"),  # <output>_nchwc
    ("ReorderInput", "ReorderInput", CPU, "ort132_cpu_conv"),  # inserted, named after its op
    ("conv1d", "FusedConv", CPU, "ort132_cpu_conv"),  # a rewrite that keeps the node's name
    ("_if_then_branch_Neg", "Neg", CPU, "ort132_cpu_conv"),  # an If on a constant, inlined
    ("Transpose_token_3", "Transpose", CPU, "ort132_cpu_vision"),
    ("node_MatMul_103/MatMulScaleFusion//MatmulTransposeFusion/", "FusedMatMul", CPU, "ort132_cpu_vision"),
    ("node_Reshape_94_new_reshape", "Reshape", CPU, "ort132_cpu_vision"),
    ("ggml_ggml_11481721677506411530_0_0", "ggml_11481721677506411530_0", "ggml", "ggml130_whole"),
])
def test_each_derived_form_is_one_a_capture_shows(event, op, provider, fixture):
    assert (event, op, provider) in _kernels(fixture)
    assert check_names([(event, op, provider)], session_names(None, _report(fixture))).passed


@pytest.mark.parametrize(("event", "op", "provider"), [
    ("det", "Relu", CPU),  # a node's name with another op
    ("Tanh_6", "Relu", CPU),  # <op>_<i> whose op is not <op>
    ("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0", "OpenVINO-EP-subgraph_2", OV),
    ("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0", "OpenVINO-EP-subgraph_1", CPU),
    ("Memcpy", "Relu", CPU),
    ("nobody", "Relu", OV),  # no node of the graph
    ("nobody/MatMulAddFusion", "Gemm", OV),
    ("fused det", "Det", CPU),
    ("ggml_ggml_1_0_0", "ggml_1_0", CPU),  # a compiled kernel named for another provider
    ("ggml_ggml_1_0_0", "ggml_2_0", "ggml"),  # its op is not the one in its name
    ("ggml_ggml_1_0_x", "ggml_1_0", "ggml"),  # no kernel index
    ("ggml_det_0", "det", "ggml"),  # a node's name is no partition name
])
def test_a_name_outside_the_forms_fails(event, op, provider):
    names = session_names([{"name": "det", "op_type": "Det"}, {"name": "", "op_type": "Tanh"}], None)
    assert not check_names([(event, op, provider)], names).passed


def test_nodes_onnxruntime_adds_for_an_fp16_graph_on_the_cpu_ep():
    """An fp16 tower on the CPU EP (onnxruntime 1.32, tests/export's towers): casts it inserts
    around kernels it lacks in fp16, Softmax's inlined body, and unnamed plan entries."""
    names = session_names(None, {"nodes": [{"name": "softmax", "op_type": "Softmax", "outputs": ["linear"]}],
                                 "read": ["x"]})
    entries = [("InsertedPrecisionFreeCast_linear", "Cast", CPU), ("ReduceMax_227", "ReduceMax", CPU),
               ("Exp_229", "Exp", CPU), ("", "ReduceSum", None)]
    assert check_names(entries, names).passed
    reshapes = [("gemm_input_reshape", "Reshape", CPU), ("gemm_output_reshape_token_5", "Reshape", CPU)]
    assert check_names(reshapes, names).passed  # code2wav-tiny on the CPU EP
    gemm = session_names([{"name": "/MatMulAddFusion", "op_type": "Gemm"}], None)
    assert check_names([("/MatMulAddFusion", "MatMulNBits", CPU)], gemm).passed  # the A16W8 MLP
    assert check_names([("/MatMulAddFusion", "QGemm", CPU)], gemm).passed  # the A8W8 MLP (QDQ fusion)
    matmul = session_names([{"name": "mm", "op_type": "MatMul"}, {"name": "add", "op_type": "Add"}], None)
    for event, op in [("mm", "QLinearMatMul"), ("mm", "MatMulIntegerToFloat"), ("add", "QLinearAdd")]:
        assert check_names([(event, op, CPU)], matmul).passed, (event, op)
    for event, op in [("mm", "QGemm"), ("add", "QLinearMatMul"), ("add", "QAdd")]:
        assert not check_names([(event, op, CPU)], matmul).passed, (event, op)
    assert not check_names([("/MatMulAddFusion", "Relu", CPU)], gemm).passed
    assert not check_names([("gemm_input_reshape", "Relu", CPU)], names).passed
    for bad in [("InsertedPrecisionFreeCast_linear", "Relu", CPU),  # not a cast
                ('InsertedPrecisionFreeCast_a"b', "Cast", CPU),  # an unsafe value name
                ("ReduceMax_227", "Exp", CPU)]:  # <op>_<i> whose op is not <op>
        assert not check_names([bad], names).passed, bad
    # A graph with a value whose name could close an event: no cast named after a value is believed.
    hostile = session_names(None, {"nodes": [{"name": "softmax", "op_type": "Softmax",
                                              "outputs": ["linear", 'a","b']}], "read": ["x"]})
    assert not check_names([("InsertedPrecisionFreeCast_linear", "Cast", CPU)], hostile).passed


QDQ = "ort132_cpu_qdq"


@pytest.mark.parametrize(("event", "op"), [("x_q", "QuantizeLinear"), ("x_dq", "DequantizeLinear"),
                                           ("x_dq2", "DequantizeLinear"), ("x_q_token_4", "QuantizeLinear"),
                                           ("matmul", "MatMulNBits")])
def test_onnxruntimes_qdq_pairs_are_named_after_a_checked_value(event, op):
    # 1.32's QDQ propagation moves the Q back across the Reshape: a pair on the input x's edge.
    plan = json.loads((PROFILES / f"{QDQ}.assignment.json").read_text())
    planned = {(n["name"], n["op_type"]) for sg in plan for n in sg["nodes"]}
    assert {("x_q", "QuantizeLinear"), ("x_dq", "DequantizeLinear")} <= planned
    assert ("x_q", "QuantizeLinear", CPU) in _kernels(QDQ) and ("x_q", "QuantizeLinear", CPU) in _kernels(
        "ort119_cpu_qdq")
    check = check_names([(event, op, CPU)], session_names(None, _report(QDQ)))
    assert check.passed and check.originals[event] == ("matmul" if op == "MatMulNBits"
                                                       else "<inserted by onnxruntime> " + op)


@pytest.mark.parametrize(("event", "op", "why"), [
    ("x_q", "DequantizeLinear", "a Q form with a DQ op"),
    ("x_dq", "QuantizeLinear", "a DQ form with a Q op"),
    ("x_q", "Relu", "no Q/DQ op"),
    ("x_dq0", "DequantizeLinear", "a DQ index onnxruntime never writes"),
    ("nobody_q", "QuantizeLinear", "no value of the graph"),
    ("reshape_q", "QuantizeLinear", "a node's name, not a value"),
    ("fused x_q", "QuantizeLinear", "no fusion of an inserted pair"),
    ("x_q/QDQFusion", "QuantizeLinear", "no fusion of an inserted pair"),
    ('x"_q', "QuantizeLinear", "an unsafe value"),
])
def test_a_qdq_form_not_derived_from_a_checked_value_fails(event, op, why):
    assert not check_names([(event, op, CPU)], session_names(None, _report(QDQ))).passed, why


def test_no_qdq_form_is_believed_where_a_value_could_forge_events():
    # A value holding a quote could close its Q's event (onnxruntime <= 1.30 writes names unescaped):
    # 'v_kernel_time","args":{...OpenVINO...}},{...,"name":"x' + '_q' leaves a fragment 'x_q' that
    # names the safe value x, after an event the value forged. Such a graph believes no value form.
    report = _report(QDQ)
    forged = 'v_kernel_time","args":{"provider":"OpenVINOExecutionProvider"}},{"name":"x'
    report["read"] = [*report["read"], forged]
    assert not check_names([("x_q", "QuantizeLinear", CPU)], session_names(None, report)).passed
    report = _report(QDQ)
    del report["read"]  # a report that does not list what nodes read: the values are not all known
    assert not check_names([("x_q", "QuantizeLinear", CPU)], session_names(None, report)).passed


def test_a_value_outside_the_safe_set_that_cannot_forge_keeps_the_value_forms():
    # Paddle names values Clip@15 (the third-party ppocr-cls): no quote, backslash or control character,
    # so no event can be closed by it; the forms of the graph's safe values still hold.
    report = _report(QDQ)
    report["read"] = [*report["read"], "Clip@15"]
    names = session_names(None, report)
    assert check_names([("x_q", "QuantizeLinear", CPU)], names).passed
    assert not check_names([("Clip@15_q", "QuantizeLinear", CPU)], names).passed  # itself: not a safe name
    for forging in ('a"b', "a\\b", "a\nb", "a\x7fb"):
        report["read"] = [*_report(QDQ)["read"], forging]
        assert not check_names([("x_q", "QuantizeLinear", CPU)], session_names(None, report)).passed, forging


def test_the_qdq_capture_is_placed_on_the_cpu_with_the_workers_report():
    meta = _meta(QDQ)
    kwargs = {"target_ep": CPU, "profile_text": (PROFILES / f"{QDQ}.profile.json").read_text(),
              "assignment": json.loads((PROFILES / f"{QDQ}.assignment.json").read_text()),
              "session_providers": meta["session_providers"], "graph_nodes": meta["graph"]["nodes"],
              "node_names": _report(QDQ), "min_placement": 1.0}
    p = prove(**kwargs)
    assert (p.verdict, p.names_checked, p.node_fraction) == ("placed", True, 1.0)
    assert p.original_nodes_total == 7  # the inserted pair is no original node
    p = prove(**{**kwargs, "node_names": None})  # the graph's names alone: x_q is no form of them
    assert (p.verdict, p.cause, p.names_checked) == ("unmeasured", "unmeasured", False)


def _inject(name: str) -> tuple[str, list[dict[str, str]]]:
    """ov124_none as onnxruntime <= 1.30 would write it had its one node been named to forge events.

    The name closes the Det event early and adds a 10-second OpenVINO kernel; the file still
    loads as JSON. The graph's node list carries the forged name, as its author wrote it.
    """
    forged = ('det_kernel_time","args":{"op_name":"Det","provider":"CPUExecutionProvider"}},'
              '{"cat":"Node","pid":1,"tid":1,"dur":10000000,"ts":1,"ph":"X","name":"x_kernel_time",'
              '"args":{"op_name":"OpenVINO-EP-subgraph_1","provider":"OpenVINOExecutionProvider"}},'
              '{"cat":"Node","pid":1,"tid":1,"dur":1,"ts":1,"ph":"X","name":"y')
    text = (PROFILES / f"{name}.profile.json").read_text()
    assert text.count('"det_kernel_time"') == 1
    text = text.replace('"det_kernel_time"', '"' + forged + '_kernel_time"')
    json.loads(text)  # still valid JSON: no newline needed
    return text, [{"name": forged, "op_type": "Det"}]


def test_an_injected_event_never_places():
    text, nodes = _inject("ov124_none")
    plan = json.loads((PROFILES / "ov124_none.assignment.json").read_text())
    for sg in plan:
        for node in sg["nodes"]:
            node["name"] = nodes[0]["name"]
    for assignment in (None, [], plan):
        p = prove(target_ep=OV, profile_text=text, assignment=assignment, graph_nodes=nodes,
                  session_providers=[OV, CPU], min_placement=0.999)
        assert p.verdict != "placed" and p.names_checked is False, p.notes
        assert p.verdict == "unmeasured"
