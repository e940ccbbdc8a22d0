"""Graphs and a runner for the ``xstage external`` tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xstage import builtin_graphs


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def det_graph() -> onnx.ModelProto:
    """MatMul + Relu, then a Det that OpenVINO declines: a split with one node on the CPU."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype("f4"), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Det", ["r"], ["d"], name="det"),
             helper.make_node("Add", ["d", "d"], ["y"], name="add_det")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [w])


def det_only_graph() -> onnx.ModelProto:
    """Only a Det: a graph OpenVINO takes none of."""
    return _model([helper.make_node("Det", ["x"], ["y"], name="det")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])


def symbolic_graph() -> onnx.ModelProto:
    return _model([helper.make_node("Neg", ["x"], ["y"], name="neg")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])


@pytest.fixture(scope="session")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("external-graphs")
    out = {
        "mlp": builtin_graphs.write(builtin_graphs.mlp(), root / "mlp.onnx"),
        "det": builtin_graphs.write(det_graph(), root / "det.onnx"),
        "det_only": builtin_graphs.write(det_only_graph(), root / "det_only.onnx"),
        "symbolic": builtin_graphs.write(symbolic_graph(), root / "symbolic.onnx"),
    }
    corrupt = root / "corrupt.onnx"
    corrupt.write_bytes(out["mlp"].read_bytes()[:300])
    out["corrupt"] = corrupt
    return out


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    record: dict[str, Any] | None


@pytest.fixture
def external(tmp_path: Path):
    """Run ``xstage external`` as a user does; returns the exit code, output and record."""

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        rec = tmp_path / f"record-{len(list(tmp_path.glob('record-*')))}.json"
        full_env = dict(os.environ, COLUMNS="120", **(env or {}))
        proc = subprocess.run([sys.executable, "-m", "xstage", "external", *args,
                               "--json", str(rec), "--runs", "3"],
                              capture_output=True, text=True, env=full_env, timeout=300)
        record = json.loads(rec.read_text()) if rec.exists() else None
        return Result(proc.returncode, proc.stdout, proc.stderr, record)

    return run
