"""A16W8 with onnxruntime's quantizer: recorded calibration, bounded error, gated by external."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from xstage import builtin_graphs, errors
from xstage.artifact import inspect_artifact
from xstage.export.quantize import quantize_a16w8
from xstage.manifest import manifest_path, read_manifest

#: Measured 2026-11-29: the 6-layer 512-wide MLP quantizes to rel_l2 2.7e-2 against fp32 (8
#: synthetic calibration samples); the bound leaves a 2x margin.
REL_L2_BOUND = 0.055


@pytest.fixture
def mlp(tmp_path):
    return builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64, seed=7),
                                tmp_path / "mlp.onnx")


def test_a16w8_is_qdq_16_bit_activations_and_within_the_bound(mlp, tmp_path):
    report = quantize_a16w8(mlp, tmp_path / "mlp-a16w8.onnx", synthetic=8)
    art = inspect_artifact(tmp_path / "mlp-a16w8.onnx")
    assert art.format == "onnx:a16w8" and {"QuantizeLinear", "DequantizeLinear"} <= set(art.op_types)
    assert report["converted_from_opset"] == 17  # the builtin MLP is opset 17: brought to 21
    (out,) = report["parity"]["outputs"]
    assert report["parity"]["verdict"] == "passed" and out["rel_l2"] <= REL_L2_BOUND
    doc = read_manifest(tmp_path / "mlp-a16w8.onnx.manifest.json")
    assert doc["format"] == "onnx:a16w8" and doc["fp32_source"] == "mlp.onnx" and doc["opset"] == 21
    assert doc["calibration"]["count"] == 8 and len(doc["calibration"]["sha256"]) == 64
    assert doc["parity"]["outputs"][0]["rel_l2"] == out["rel_l2"]


def test_calibration_from_a_directory_is_recorded(mlp, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(calib / f"s{i}.npz", x=rng.standard_normal((64, 512)).astype(np.float32))
    report = quantize_a16w8(mlp, tmp_path / "q.onnx", calibration=calib)
    assert report["calibration"]["count"] == 3
    assert report["calibration"]["source"] == {"kind": "directory", "path": str(calib.resolve()),
                                               "files": 3}
    again = quantize_a16w8(mlp, tmp_path / "q2.onnx", calibration=calib)
    assert again["calibration"]["sha256"] == report["calibration"]["sha256"]  # a digest, stable


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({}, errors.UsageError, "exactly one"),
    ({"synthetic": 0}, errors.UsageError, "N >= 1"),
    ({"synthetic": 2, "calibration": "x"}, errors.UsageError, "exactly one"),
])
def test_bad_calibration_options(mlp, tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize_a16w8(mlp, tmp_path / "q.onnx", **kwargs)


def test_refuses_a_destination_away_from_its_fp32_source(mlp, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(errors.UsageError, match="beside its fp32 source"):
        quantize_a16w8(mlp, tmp_path / "elsewhere" / "q.onnx", synthetic=2)


def test_refuses_an_already_quantized_graph(mlp, tmp_path):
    quantize_a16w8(mlp, tmp_path / "q.onnx", synthetic=2)
    with pytest.raises(errors.ArtifactError, match="A16W8 starts from an fp32 graph"):
        quantize_a16w8(tmp_path / "q.onnx", tmp_path / "qq.onnx", synthetic=2)


def test_external_gates_the_a16w8_graph_against_its_fp32_source(mlp, tmp_path):
    r = subprocess.run([sys.executable, "-m", "xstage", "quantize", str(mlp), str(tmp_path / "q.onnx"),
                        "--scheme", "a16w8", "--calibration-synthetic", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "converted opset 17" in r.stdout and "passed" in r.stdout
    rec = tmp_path / "rec.json"
    r = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(tmp_path / "q.onnx"),
                        "--route", "ort-cpu", "--runs", "2", "--json", str(rec)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(rec.read_text())
    assert doc["artifact"]["format"] == "onnx:a16w8"
    assert doc["parity"]["reference_kind"] == "fp32_source" and doc["parity"]["verdict"] == "passed"


#: Measured 2026-11-29: the shipped tiny tower quantizes to rel_l2 1.6e-2 against fp32 (16
#: synthetic samples); the bound leaves a 2.5x margin.
TOWER_REL_L2_BOUND = 0.04


def test_a16w8_of_the_tiny_tower_runs_within_its_bound(tmp_path):
    import shutil

    from xstage.builtin_graphs import builtin_artifact

    shipped = builtin_artifact("vision-tower-tiny")
    for f in (shipped, manifest_path(shipped)):
        shutil.copy(f, tmp_path / f.name)
    report = quantize_a16w8(tmp_path / shipped.name, tmp_path / "tower-a16w8.onnx", synthetic=16)
    (out,) = report["parity"]["outputs"]
    assert report["parity"]["verdict"] == "passed" and out["rel_l2"] <= TOWER_REL_L2_BOUND
    assert read_manifest(tmp_path / "tower-a16w8.onnx.manifest.json")["component"] == "vision_tower"
    # A format is what the graph computes: every Conv, Gemm and MatMul of the quantized tower
    # takes int8 weights and uint16 activations through Q/DQ, so the graph itself says A16W8
    art = inspect_artifact(tmp_path / "tower-a16w8.onnx", fmt="onnx:a16w8")
    assert (art.format, dict(art.output_formats)) == ("onnx:a16w8", {})
