"""Model Explorer node data and the Perfetto trace, checked against the formats' documented shapes.

Model Explorer: ``GraphNodeData`` as its Python builder (``model_explorer.node_data_builder``)
documents it — ``results`` keyed by node (an output tensor name or a node id), each a numeric
``value`` with optional ``bgColor``/``textColor``; optional ``thresholds`` (``value``,
``bgColor``) and ``gradient`` (``stop`` in [0, 1], stops 0 and 1 present). Trace Event format
(the JSON object form): ``traceEvents``; ``X`` events with ``name``, ``ts``, ``dur`` (µs),
``pid``, ``tid``; ``M`` metadata with ``args``; ``C`` counters with numeric ``args``;
``displayTimeUnit`` ``ms`` or ``ns``.
"""

from __future__ import annotations

import json
import numbers
import re

from xstage.report import build_view
from xstage.report.node_data import PROVIDER_VALUES, adapter_node_ids, node_data
from xstage.report.trace import CLIENT_PID, WORKER_PID, trace_events

_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$|^[a-z]+$")


def _num(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_graph_node_data(doc: dict) -> None:
    """Raise AssertionError where ``doc`` leaves Model Explorer's documented GraphNodeData shape."""
    assert set(doc) <= {
        "results",
        "thresholds",
        "gradient",
        "hideInAggregatedStatsTable",
        "hideInChildrenStatsTable",
        "hideAggregatedStats",
        "showExpandedSummaryOnGroupNode",
        "showLabelCountColumnsInChildrenStatsTable",
    }
    assert isinstance(doc["results"], dict)
    for key, result in doc["results"].items():
        assert isinstance(key, str) and key, key
        assert set(result) <= {"value", "bgColor", "textColor"} and _num(result["value"]), result
        for c in ("bgColor", "textColor"):
            assert c not in result or _COLOR.match(result[c]), result
    for item in doc.get("thresholds", []):
        assert set(item) <= {"value", "bgColor", "textColor"} and _num(item["value"])
        assert _COLOR.match(item["bgColor"])
    stops = [g["stop"] for g in doc.get("gradient", [])]
    if stops:
        assert all(0 <= s <= 1 for s in stops) and 0 in stops and 1 in stops
        assert all(_COLOR.match(g["bgColor"]) for g in doc["gradient"])
    json.dumps(doc, allow_nan=False)


def check_trace(doc: dict) -> None:
    """Raise AssertionError where ``doc`` leaves the Trace Event format's JSON object form."""
    assert isinstance(doc["traceEvents"], list) and doc.get("displayTimeUnit") in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert _num(e["ts"]) and _num(e["dur"]) and e["dur"] >= 0, e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
            assert isinstance(e["args"], dict)
        else:
            assert _num(e["ts"]) and e["args"] and all(_num(v) for v in e["args"].values()), e
    json.dumps(doc, allow_nan=False)


def test_node_data_follows_the_documented_shape_for_every_record(records):
    for rec in records.values():
        for doc in node_data(build_view(rec)):
            check_graph_node_data(doc)  # the error record's are empty, and still well formed


def test_node_data_colours_each_original_node_by_its_provider(records):
    providers, times = node_data(build_view(records["split"]))
    # keyed by node name: Model Explorer's ONNX adapter uses it as the node id
    assert {k: v["value"] for k, v in providers["results"].items()} == {
        "matmul": PROVIDER_VALUES["target"],
        "relu": PROVIDER_VALUES["target"],
        "det": PROVIDER_VALUES["cpu"],
        "add_det": PROVIDER_VALUES["target"],
    }
    assert set(times["results"]) == {"det"}  # OpenVINO's nodes ran inside its fused kernels


def test_node_data_maps_a_renamed_copy_back_to_the_original_nodes(records):
    """PP-OCR's nodes are unnamed: the worker ran a renamed copy; the keys are the graph's values."""
    rec = records["ppocr-cls.ort-openvino"]
    assert rec["proof"]["renamed"] is True
    providers, _ = node_data(build_view(rec))
    assert len(providers["results"]) == rec["proof"]["nodes_on_target"]
    assert "conv2d_53.tmp_0" in providers["results"]


def test_unnamed_nodes_get_the_ids_model_explorers_onnx_adapter_gives(records, tmp_path):
    """The adapter names unnamed nodes with onnx-ir's NameFixPass; so does adapter_node_ids."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"], name="neg")],
        "g", [x], [y])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), path)
    ids = adapter_node_ids(str(path))
    assert list(ids) == ["r"] and ids["r"] not in ("", "neg")  # only the unnamed node gets an id
    assert adapter_node_ids(str(tmp_path / "missing.onnx")) == {}
    rec = records["ppocr-cls.ort-openvino"]
    providers, _ = node_data(build_view(rec), {"conv2d_53.tmp_0": "node_Conv_53"})
    assert "node_Conv_53" in providers["results"] and "conv2d_53.tmp_0" not in providers["results"]


def test_traces_follow_the_documented_shape_for_every_record(records):
    for rec in records.values():
        check_trace(trace_events(build_view(rec)))


def _spans(doc: dict, pid: int, prefix: str = "") -> list[dict]:
    return [
        e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["name"].startswith(prefix)
    ]


def test_kernels_nest_inside_their_profiled_runs(records):
    doc = trace_events(build_view(records["split"]))
    runs = _spans(doc, WORKER_PID, "profiled run")
    kernels = [e for e in _spans(doc, WORKER_PID) if e["cat"].startswith("kernel")]
    assert len(runs) == 4 and kernels
    for k in kernels:
        run = runs[k["args"]["run"] - 1]
        assert (
            run["tid"] == k["tid"]
            and run["ts"] <= k["ts"]
            and k["ts"] + k["dur"] <= run["ts"] + run["dur"] + 1
        )


def test_the_two_clocks_agree_where_both_saw_the_same_thing(records):
    """The worker's profile, placed by Cristian's method, puts onnxruntime's session
    initialization inside the client's load phase and the first profiled run inside its warm-up."""
    for name in ("placed", "split", "ppocr-cls.ort-openvino"):
        view = build_view(records[name])
        doc = trace_events(view)
        slack = view.clock["profile_offset_uncertainty_us"]
        load = _spans(doc, CLIENT_PID, "load")[0]
        warm = _spans(doc, CLIENT_PID, "warm-up")[0]
        init = _spans(doc, WORKER_PID, "session_initialization")[0]
        run1 = _spans(doc, WORKER_PID, "profiled run 1")[0]
        assert (
            load["ts"] - slack <= init["ts"] and init["ts"] + init["dur"] <= load["ts"] + load["dur"] + slack
        )
        assert warm["ts"] - slack <= run1["ts"] <= warm["ts"] + warm["dur"] + slack


def test_a_record_without_detail_is_a_trace_of_metadata_only(records):
    doc = trace_events(build_view(records["error"]))
    assert {e["ph"] for e in doc["traceEvents"]} == {"M"}
    assert doc["otherData"]["profile_offset_us"] is None
