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


#: Measured 2026-12-06: the 6-layer 512-wide MLP quantized A8W8 against fp32 on the CPU EP
#: (8 synthetic samples) is near A16W8's (int8 weights dominate on this MLP); 2x margin.
A8W8_REL_L2_BOUND = 0.06


@pytest.fixture(scope="module")
def a8w8(tmp_path_factory):
    """``xstage quantize --scheme a8w8`` of the MLP, through the CLI."""
    root = tmp_path_factory.mktemp("a8w8")
    src = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64, seed=7), root / "mlp.onnx")
    r = subprocess.run([sys.executable, "-m", "xstage", "quantize", str(src), str(root / "q8.onnx"),
                        "--scheme", "a8w8", "--calibration-synthetic", "8", "--json", str(root / "q.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root / "q8.onnx", json.loads((root / "q.json").read_text())


def test_a8w8_is_its_own_format_with_8_bit_activations(a8w8):
    path, report = a8w8
    art = inspect_artifact(path)
    assert art.format == "onnx:a8w8" and report["scheme"] == "a8w8"
    doc = read_manifest(manifest_path(path))
    assert doc["format"] == "onnx:a8w8" and doc["fp32_source"] == "mlp.onnx"
    assert "QUInt8" in doc["exporter"]["scheme"]
    (out,) = report["parity"]["outputs"]
    assert report["parity"]["verdict"] == "passed" and out["rel_l2"] <= A8W8_REL_L2_BOUND
    print(f"A8W8 vs fp32 on the CPU EP: rel_l2 {out['rel_l2']:.2e}")


@pytest.mark.parametrize("route", ["ort-cpu", "ort-openvino"])
def test_a8w8_is_placed_and_gated_on_the_routes_that_take_it(a8w8, openvino_python, tmp_path, route):
    path, _ = a8w8
    rec = tmp_path / "rec.json"
    r = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(path),
                        "--route", route, "--runs", "2", "--json", str(rec)],
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(rec.read_text())
    assert doc["artifact"]["format"] == "onnx:a8w8" and doc["proof"]["verdict"] == "placed"
    assert doc["parity"]["format"] == "onnx:a8w8" and doc["parity"]["reference_kind"] == "fp32_source"
    assert doc["parity"]["verdict"] == "passed"
    print(route, doc["parity"]["summary"])


def test_a8w8_on_a_simulated_vitisai_npu_is_refused_by_name(a8w8, tmp_path, monkeypatch, capsys):
    """The XDNA2 NPU declines A8W8 by its documented limit: on a machine whose NPU's route
    resolved (simulated here), the plan refuses it by name before any worker starts, with the
    scheme that makes a graph it takes."""
    from test_plan import _report

    from xstage.cli.main import main as cli_main

    path, _ = a8w8
    report = _report(["cpu", "npu:amd"], {"ort-cpu": ("cpu",), "ort-vitisai": ("npu:amd",)})
    monkeypatch.setattr("xstage.stage.open.device_report", lambda: report)
    rec = tmp_path / "rec.json"
    code = cli_main(["external", "--graph", str(path), "--device", "npu:amd", "--json", str(rec)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (refusal,) = json.loads(rec.read_text())["outcome"]["refusals"]
    assert (refusal["code"], refusal["cause"], refusal["route"]) == (
        "no_exported_graph", "format_not_accepted", "ort-vitisai")
    assert "A8W8" in refusal["message"] and "xstage quantize --scheme a16w8" in refusal["remedy"]
    assert "format_not_accepted" in err and "xstage quantize --scheme a16w8" in err
    print(err)
