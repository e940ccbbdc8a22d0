"""Reservations a stage gets before it loads: read, estimated, and said how."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs, ledger
from xstage.artifact import graph_facts, inspect_artifact
from xstage.ledger import footprint
from xstage.routes import get_spec

MiB = 1 << 20


def _cost(route):
    return get_spec(route).cost


def _reservations(art, route, pool, shapes):
    """The reservations with the route's cost taken from its spec, as the stage does."""
    return footprint.reservations(art, _cost(route), pool, shapes, route=route)


def _write(tmp_path, nodes, inputs, outputs, inits=(), name="g.onnx"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return builtin_graphs.write(model, tmp_path / name)


def test_liveness_frees_each_intermediate_after_its_last_use(tmp_path):
    # x -> a -> b -> c -> y, each [1000] float32 (4000 B): at most two alive at once.
    names = ["x", "a", "b", "c", "y"]
    nodes = [helper.make_node("Relu", [i], [o]) for i, o in zip(names, names[1:], strict=False)]
    path = _write(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])])
    act = footprint.estimate_activations(graph_facts(path, {"x": (1000,)}))
    assert act.live_peak_bytes == 8000 and act.sized == 4 and act.unsized == 0
    assert act.io_bytes == 8000


def test_symbolic_inputs_are_sized_at_the_real_shapes(tmp_path):
    nodes = [helper.make_node("Neg", ["x"], ["y"])]
    path = _write(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])])
    assert footprint.estimate_activations(graph_facts(path, {"x": (1000, 8)})).live_peak_bytes == 32000


def test_data_dependent_sizes_are_counted_as_unsized(tmp_path):
    nodes = [helper.make_node("ConstantOfShape", ["n"], ["big"]),
             helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    path = _write(tmp_path, nodes, [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    act = footprint.estimate_activations(graph_facts(path, {"n": (1,)}))
    assert act.unsized >= 1 and act.live_peak_bytes < 100


def test_a_graph_shape_inference_cannot_read_gives_no_estimate_and_says_why(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    act = footprint.estimate_activations(graph_facts(bad, {}))
    assert act.live_peak_bytes == 0 and act.note and "shape inference failed" in act.note


def test_reservations_carry_their_evidence(tmp_path):
    path = builtin_graphs.write(builtin_graphs.mlp(width=256, depth=4, batch=8), tmp_path / "m.onnx")
    art = inspect_artifact(path)
    res = _reservations(art, "ort-cpu", "host_ram", {"x": (8, 256)})
    by = {r.purpose: r for r in res}
    assert list(by) == ["runtime", "weights", "weight copies", "parsed model", "activations",
                        "call tensors"]
    assert by["weights"].evidence == "D" and by["weights"].bytes == art.bytes
    assert by["runtime"].bytes == _cost("ort-cpu").base_bytes
    assert "measured" in by["runtime"].basis
    assert by["parsed model"].lifetime == "load"
    assert {by[p].lifetime for p in ("activations", "call tensors")} == {"request"}
    assert all(r.evidence == "E" for p, r in by.items() if p != "weights")
    assert all(r.pool == "host_ram" for r in res)
    budget = ledger.make_budget(res, pool="host_ram")
    assert budget.budget_bytes > _cost("ort-cpu").base_bytes


@pytest.mark.parametrize("weights", [np.zeros((64, 64), np.float32)])
def test_weight_copies_follow_the_route_factor(tmp_path, weights):
    path = _write(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                  [numpy_helper.from_array(weights, "w")])
    art = inspect_artifact(path)
    cpu = {r.purpose: r.bytes for r in _reservations(art, "ort-cpu", "host_ram", {})}
    ov = {r.purpose: r.bytes for r in _reservations(art, "ort-openvino", "host_ram", {})}
    for got, route in ((cpu, "ort-cpu"), (ov, "ort-openvino")):
        factor = _cost(route).weights_factor
        assert got["weight copies"] == int(art.bytes * (factor - 1.0))
    assert ov["weight copies"] > 2 * cpu["weight copies"]


def test_a_torch_program_gets_its_manifest_io_and_a_constant(tmp_path):
    from xstage.artifact import Artifact, IOSpec

    art = Artifact(path=tmp_path / "tower.pt2", format="pt:fp32", format_source="manifest",
                   component="vision_tower", sha256="0" * 64, bytes=10 * MiB,
                   files=({"path": str(tmp_path / "tower.pt2"), "sha256": "0" * 64,
                           "bytes": 10 * MiB},),
                   inputs=(IOSpec("patches", "float32", (1024, 1536)),),
                   outputs=(IOSpec("embeds", "float32", (256, 2048)),),
                   node_count=0, op_types=(), manifest={})
    by = {r.purpose: r for r in _reservations(art, "torch-cpu", "host_ram", {})}
    assert by["activations"].bytes == footprint.PT_ACTIVATION_BYTES
    assert "constant" in by["activations"].basis
    assert by["call tensors"].bytes == 2 * (1024 * 1536 + 256 * 2048) * 4
    assert by["runtime"].bytes == _cost("torch-cpu").base_bytes


def test_external_data_is_not_counted_in_the_parsed_model(tmp_path):
    import onnx

    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    model = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], [w]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(model, str(tmp_path / "g.onnx"), save_as_external_data=True,
                    location="g.onnx.data", size_threshold=0)
    art = inspect_artifact(tmp_path / "g.onnx")
    by = {r.purpose: r for r in _reservations(art, "ort-cpu", "host_ram", {})}
    graph_file = (tmp_path / "g.onnx").stat().st_size
    assert by["weights"].bytes == art.bytes > 256 * 256 * 4  # graph + sidecar, read from disk
    assert by["parsed model"].bytes == graph_file < 4096
    assert "external data" in by["parsed model"].basis


def test_a_captured_cuda_graph_reserves_its_pool_beside_the_activations(tmp_path):
    """torch-cuda serves from a CUDA graph: its private pool (one call's intermediates, inputs
    and outputs) is reserved in the device pool; ``cuda_graphs=off`` reserves none."""
    from xstage.artifact import Artifact, IOSpec

    art = Artifact(path=tmp_path / "s.pt2", format="pt:fp32", format_source="manifest",
                   component="s", sha256="0" * 64, bytes=MiB,
                   files=({"path": str(tmp_path / "s.pt2"), "sha256": "0" * 64, "bytes": MiB},),
                   inputs=(IOSpec("x", "float32", (8, 3, 224, 224)),),
                   outputs=(IOSpec("y", "float32", (8, 256)),), node_count=0, op_types=(),
                   manifest={})
    spec = get_spec("torch-cuda")
    pool = "vram:gpu_discrete:nvidia:0"
    io = (8 * 3 * 224 * 224 + 8 * 256) * 4
    on = footprint.reservations(art, spec.memory_cost({}), pool, {}, route="torch-cuda",
                                graph_pool=spec.captures_graph({}))
    by = {r.purpose: r for r in on}
    assert by["cuda graph pool"].bytes == footprint.PT_ACTIVATION_BYTES + io
    assert by["cuda graph pool"].pool == pool and by["cuda graph pool"].lifetime == "session"
    assert "captured CUDA graph" in by["cuda graph pool"].basis
    assert not spec.captures_graph({"cuda_graphs": "off"})
    assert not get_spec("torch-cpu").captures_graph({})
    off = footprint.reservations(art, spec.memory_cost({}), pool, {}, route="torch-cuda",
                                 graph_pool=spec.captures_graph({"cuda_graphs": "OFF"}))
    assert "cuda graph pool" not in {r.purpose for r in off}


def _pt2(tmp_path, nodes, values, user="x", params=("w",), outputs=("y",)):
    """A ``.pt2`` archive holding only its graph's JSON, in torch.export's layout (the keys the
    ledger reads; the values' ``dtype`` 7 is float32, as torch serializes it)."""
    import json
    import zipfile

    graph = {"inputs": [{"as_tensor": {"name": n}} for n in (*params, user)],
             "outputs": [{"as_tensor": {"name": n}} for n in outputs],
             "nodes": [{"target": f"torch.ops.aten.{op}.default",
                        "inputs": [{"name": "self", "arg": {"as_tensor": {"name": i}}} for i in ins],
                        "outputs": [{"as_tensor": {"name": o}}]} for op, ins, o in nodes],
             "tensor_values": {n: {"dtype": 7, "sizes": [{"as_int": d} if isinstance(d, int)
                                                         else {"as_expr": {"expr_str": d}}
                                                         for d in dims]}
                               for n, dims in values.items()}}
    specs = [{"parameter": {"arg": {"name": p}, "parameter_name": p}} for p in params]
    specs.append({"user_input": {"arg": {"as_tensor": {"name": user}}}})
    doc = {"graph_module": {"graph": graph, "signature": {"input_specs": specs}}}
    path = tmp_path / "p.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("p/models/model.json", json.dumps(doc))
        z.writestr("p/archive_format", "pt2")
    return path


def test_a_pt2_programs_activations_come_from_its_exported_graph(tmp_path):
    """Liveness over the archive's tensors; views cost nothing; the constant is the floor."""
    from xstage.artifact import Artifact, IOSpec, pt2_graph_facts

    big = 64 * MiB // 4  # float32 elements of 64 MiB
    values = {"w": [4, 4], "x": [big], "a": [big], "v": [big], "b": [big], "y": [4]}
    nodes = [("relu", ("x",), "a"), ("view", ("a",), "v"), ("gelu", ("v",), "b"),
             ("sum", ("b",), "y")]
    path = _pt2(tmp_path, nodes, values)
    facts = pt2_graph_facts(path)
    assert facts.error is None and facts.initializers == ("w",) and facts.outputs == ("y",)
    act = footprint.estimate_activations(facts)
    assert act.live_peak_bytes == 2 * 64 * MiB  # a and b (v is a's view), never x or y
    assert act.unsized == 1 and act.io_bytes == 64 * MiB + 16
    art = Artifact(path=path, format="pt:fp32", format_source="manifest", component="p",
                   sha256="0" * 64, bytes=path.stat().st_size,
                   files=({"path": str(path), "sha256": "0" * 64, "bytes": path.stat().st_size},),
                   inputs=(IOSpec("x", "float32", (big,)),), outputs=(IOSpec("y", "float32", (4,)),),
                   node_count=0, op_types=(), manifest={})
    by = {r.purpose: r for r in _reservations(art, "torch-cuda", "vram:gpu_discrete:nvidia:0", {})}
    assert by["activations"].bytes == int(2 * 64 * MiB * footprint.PT_ACTIVATION_FACTOR)
    assert "liveness peak 128.0 MiB" in by["activations"].basis
    small = _pt2(tmp_path, [("relu", ("x",), "y")], {"w": [4], "x": [8], "y": [8]})
    art_small = dataclasses.replace(art, path=small)
    by = {r.purpose: r for r in _reservations(art_small, "torch-cpu", "host_ram", {})}
    assert by["activations"].bytes == footprint.PT_ACTIVATION_BYTES  # the floor


def test_a_pt2_archive_without_a_graph_json_keeps_the_constant_and_says_why(tmp_path):
    import zipfile

    from xstage.artifact import pt2_graph_facts

    path = tmp_path / "old.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("serialized_exported_program.json", "{}")
    assert "no models/model.json" in (pt2_graph_facts(path).error or "")
    symbolic = _pt2(tmp_path, [("relu", ("x",), "y")], {"w": [4], "x": ["s0"], "y": ["s0"]})
    act = footprint.estimate_activations(pt2_graph_facts(symbolic))
    assert act.sized == 0 and act.live_peak_bytes == 0


def test_the_pinned_region_is_held_in_host_ram_per_slot_set(tmp_path):
    from xstage.artifact import Artifact, IOSpec

    art = Artifact(path=tmp_path / "s.pt2", format="pt:fp32", format_source="manifest",
                   component="s", sha256="0" * 64, bytes=MiB,
                   files=({"path": str(tmp_path / "s.pt2"), "sha256": "0" * 64, "bytes": MiB},),
                   inputs=(IOSpec("x", "float32", (8, 3, 224, 224)),),
                   outputs=(IOSpec("y", "float32", (8, 256)),), node_count=0, op_types=(),
                   manifest={})
    (res,) = footprint.pinned_region(art, {}, 2, route="torch-cuda")
    io = (8 * 3 * 224 * 224 + 8 * 256) * 4
    assert res.pool == "host_ram" and res.purpose == "pinned region" and res.lifetime == "session"
    assert res.bytes == 2 * io + footprint.REGION_PAGES_BYTES + 2 * 2 * footprint.REGION_SLOT_BYTES
    assert "2 slot set(s)" in res.basis and "page-locked" in res.basis
    spec = get_spec("torch-cuda")
    assert spec.pins_region({}) and not spec.pins_region({"pinned_region": "off"})
    assert not get_spec("torch-cpu").pins_region({})


def test_device_slots_are_held_in_the_device_pool_per_slot_set(tmp_path):
    """``device_tensors=on``: K sets of device input and output slots, in the stage's pool."""
    from xstage.artifact import Artifact, IOSpec

    art = Artifact(path=tmp_path / "s.pt2", format="pt:fp32", format_source="manifest",
                   component="s", sha256="0" * 64, bytes=MiB,
                   files=({"path": str(tmp_path / "s.pt2"), "sha256": "0" * 64, "bytes": MiB},),
                   inputs=(IOSpec("x", "float32", (8, 3, 224, 224)),),
                   outputs=(IOSpec("y", "float32", (8, 256)),), node_count=0, op_types=(),
                   manifest={})
    res = footprint.device_slots(art, {}, 3, "gpu:0", route="torch-cuda")
    io = (8 * 3 * 224 * 224 + 8 * 256) * 4
    assert res.pool == "gpu:0" and res.purpose == "device slots" and res.lifetime == "session"
    assert res.bytes == 3 * (io + 2 * footprint.DEVICE_SLOT_ALIGN)
    assert "3 set(s)" in res.basis and "device_tensors=on" in res.basis
    spec = get_spec("torch-cuda")
    assert spec.serves_device_tensors({"device_tensors": "on"})
    assert not spec.serves_device_tensors({}) and not spec.serves_device_tensors(
        {"device_tensors": "off"})  # opt-in: off unless asked for
    assert not get_spec("torch-cpu").serves_device_tensors({"device_tensors": "on"})


@pytest.fixture(scope="module")
def a16w8_mlp(tmp_path_factory):
    """The small MLP and its A16W8 copy (``xstage quantize``'s own code)."""
    from xstage.export.quantize import quantize_a16w8

    root = tmp_path_factory.mktemp("a16w8")
    src = builtin_graphs.write(builtin_graphs.mlp(), root / "mlp.onnx")
    quantize_a16w8(src, root / "mlp-a16w8.onnx", synthetic=2)
    return inspect_artifact(src), inspect_artifact(root / "mlp-a16w8.onnx")


@pytest.mark.parametrize("route", ["ort-cpu", "ort-openvino"])
def test_an_a16w8_graph_holds_its_routes_qdq_cost_and_fp32_does_not(a16w8_mlp, route):
    """The A16W8 footprint (docs/memory.md): the route's constant + its factor x the liveness
    peak, beside the activations; an fp32 graph gets no such reservation."""
    fp32, a16w8 = a16w8_mlp
    shapes = {"x": (8, 256)}
    assert "a16w8 runtime" not in {r.purpose for r in _reservations(fp32, route, "host_ram", shapes)}
    held = {r.purpose: r for r in _reservations(a16w8, route, "host_ram", shapes)}
    qdq = _cost(route).a16w8
    live = footprint.estimate_activations(a16w8.graph_facts(shapes)).live_peak_bytes
    assert held["a16w8 runtime"].bytes == qdq.base_bytes + int(live * qdq.activation_factor)
    assert held["a16w8 runtime"].evidence == "E" and "measured" in held["a16w8 runtime"].basis


def test_every_route_that_runs_a16w8_costs_it():
    """No route that takes A16W8 graphs reserves them as if they were fp32."""
    from xstage.routes import ROUTES

    for spec in ROUTES:
        if "onnx:a16w8" in spec.formats:
            assert spec.cost.a16w8 is not None, spec.name
