"""``ort-plugin:webgpu`` live on a real GPU: the same proof, gate, ledger and bisect as everywhere.

The WebGPU plugin EP (``onnxruntime-ep-webgpu``, over Vulkan on Linux) needs a GPU with a Vulkan
driver; this VM has none, so every test here skips, saying why, unless the route resolves
(``scripts/webgpu_check.sh`` runs them on the lent GPU host in one call). Each test runs
``xstage external`` (or ``bisect``) through the CLI's own ``main`` and reads the record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs, device_table
from xstage.cli.main import main as cli_main

ROUTE = "ort-plugin:webgpu"


@pytest.fixture(scope="module")
def gpu() -> str:
    """The GPU the webgpu route drives here, or a skip naming why there is none."""
    report = device_table.devices()
    status = report.route(ROUTE)
    if not status.resolved or not status.devices:
        pytest.skip(f"{ROUTE} does not resolve here ({status.reason}): these tests need a GPU with a "
                    "Vulkan driver and onnxruntime-ep-webgpu (scripts/webgpu_check.sh runs them)")
    return status.devices[0]


def _mlp(extra: str | None = None) -> onnx.ModelProto:
    """Three 256-wide MatMul+Relu layers, optionally one ``extra`` unary op before the last Neg."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(3):
        weight = rng.standard_normal((256, 256)).astype(np.float32) * 0.05
        inits.append(numpy_helper.from_array(weight, f"W{i}"))
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    if extra:
        nodes.append(helper.make_node(extra, [x], ["e"], name=f"extra_{extra}"))
        x = "e"
    nodes.append(helper.make_node("Neg", [x], ["y"], name="neg"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 256]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "mlp", io[:1], io[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _chain() -> onnx.ModelProto:
    """Nine unary ops with Hardmax (no WebGPU kernel) fifth: regions [0, 4) and [5, 9) around it."""
    nodes, prev = [], "x"
    ops = ["Sin", "Tanh", "Neg", "Sigmoid", "Hardmax", "Abs", "Cos", "Neg", "Tanh"]
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"v{i}"
        nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}_{op}"))
        prev = out
    return helper.make_model(
        helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (64, 256))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (64, 256))]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _external(argv: list[str], tmp_path: Path,
              capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    record = tmp_path / "record.json"
    code = cli_main(["external", *argv, "--route", ROUTE, "--runs", "3", "--json", str(record)])
    capsys.readouterr()
    return code, json.loads(record.read_text())


def _proof(record: dict[str, Any]) -> dict[str, Any]:
    refusals = (record.get("outcome") or {}).get("refusals") or []
    if refusals and refusals[-1].get("code") == "execution_provider_declined_graph":
        return refusals[-1]["evidence"]
    return record["proof"]


def test_the_route_resolves_on_the_gpu(gpu: str) -> None:
    assert gpu.startswith("gpu_")


@pytest.mark.parametrize("stage", ["tower", "mlp"])
def test_a_stage_is_placed_attested_gated_and_measured(stage: str, gpu: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    graph = (["--builtin", "vision-tower-tiny"] if stage == "tower"
             else ["--graph", str(builtin_graphs.write(_mlp(), tmp_path / "mlp.onnx"))])
    code, record = _external(graph, tmp_path, capsys)
    proof = record["proof"]
    assert code == 0, record["outcome"]
    assert proof["verdict"] == "placed" and proof["target_ep"] == "WebGpuExecutionProvider"
    attestation = record.get("device_attestation") or proof["device_attestation"]
    assert attestation["planned"] == gpu and attestation["source"] == "runtime", attestation
    assert attestation["adapter"] == "attested" and attestation["observed"] == gpu
    assert record["parity"]["verdict"] == "passed"
    ledger = record["ledger"]
    assert ledger["pool"]["name"].startswith("vram:") and ledger["measured_peak_bytes"], ledger
    assert ledger["verdict"] == "within_budget", ledger


def test_an_op_the_ep_lacks_is_declined_and_named(gpu: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Hardmax has no WebGPU kernel: with ``--min-placement 1`` the stage is declined, Hardmax named."""
    graph = builtin_graphs.write(_mlp("Hardmax"), tmp_path / "mlp_hardmax.onnx")
    code, record = _external(["--graph", str(graph), "--min-placement", "1"], tmp_path, capsys)
    proof = _proof(record)
    assert code == 2 and proof["verdict"] == "declined", proof.get("notes")
    assert "Hardmax" in json.dumps(proof["cpu_nodes"])


def test_bisect_finds_the_regions_around_a_declined_op(gpu: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = _chain()
    graph = builtin_graphs.write(model, tmp_path / "chain.onnx")
    record = tmp_path / "bisect.json"
    code = cli_main(["bisect", "--graph", str(graph), "--route", ROUTE, "--json", str(record)])
    capsys.readouterr()
    doc = json.loads(record.read_text())
    assert code == 0, doc
    assert [[r["start"], r["stop"]] for r in doc["regions"]] == [[0, 4], [5, 9]]
    assert [d["op_type"] for d in doc["declined_ops"]] == ["Hardmax"]
