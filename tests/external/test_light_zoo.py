"""The onnx wheel's own light model zoo on the reference route: a false refusal found there.

onnxruntime 1.32 fuses a Gemm with the Relu after it and profiles the kernel as ``fused <the
Gemm's name>`` with op ``FusedGemm``, and its NCHWc transformer runs a BatchNormalization (or a
per-channel Mul) as a Conv named ``<its output>_bn_nchwc`` (``_mul_nchwc``); before those forms
were known, zfnet512, vgg19, alexnet, densenet121 and inception_v2 were refused
``evidence_conflict`` on ``ort-cpu``, the reference arm itself (``scripts/light_zoo.py`` runs
the whole zoo on every route).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from xstage.cli.main import main as cli_main

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize(("model", "op"), [("zfnet512", "FusedGemm"), ("densenet121", "Conv")])
def test_onnxruntime_s_rewrites_are_forms_of_the_graph_s_nodes(model: str, op: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "record.json"
    code = cli_main(["external", "--graph", str(LIGHT / f"light_{model}.onnx"), "--route", "ort-cpu",
                     "--runs", "1", "--json", str(record)])
    err = capsys.readouterr().err
    doc = json.loads(record.read_text())
    assert code == 0, err
    assert doc["proof"]["verdict"] == "placed" and doc["proof"]["name_failures"] == []
    kernels = json.dumps(doc.get("detail") or {})
    assert f'"op": "{op}"' in kernels  # the forms this test is about ran, and were believed
