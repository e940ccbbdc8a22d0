"""Make the report examples of docs/reports.md: real records, their HTML, and screenshots.

Every record here is written by ``xstage external`` run as a user runs it (never by hand):

* ``placed``: the built-in vision tower on ``ort-openvino`` (OpenVINO takes every node);
* ``split``: a MatMul + Relu + Det + Add graph on ``ort-openvino`` (Det stays on the CPU EP;
  placed at the default ``--min-placement 0.5``);
* ``refused``: a graph of one Det on ``ort-openvino`` (OpenVINO takes none: declined);
* ``error``: a graph file cut short (not a readable ONNX graph);
* ``ppocr-cls.ort-cpu`` and ``ppocr-cls.ort-openvino``: the wave-1 third-party graph (PP-OCR's
  text-direction classifier, from the test cache's pinned wheel) on both routes, for
  ``xstage compare``.

Then ``xstage report --html/--node-data/--trace`` on each, ``xstage compare`` on the pair, and
a screenshot of each HTML page in headless Chromium (Debian's ``chromium``), cut to its top.

Run (the ort-openvino interpreter is the test cache's, or any venv with onnxruntime-openvino)::

    python scripts/report_examples.py \\
        --openvino-python .test-cache/ort-openvino/envs/ort-openvino/bin/python

Records go to ``docs/reports/records/``, screenshots to ``docs/img/``, the HTML, node data and
traces to ``--out`` (default: a temporary folder, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "docs" / "reports" / "records"
IMAGES = REPO / "docs" / "img"


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def det_graph() -> onnx.ModelProto:
    """MatMul + Relu, then a Det that OpenVINO declines (tests/external's split graph)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype("f4"), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Det", ["r"], ["d"], name="det"),
        helper.make_node("Add", ["d", "d"], ["y"], name="add_det"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [w],
    )


def det_only_graph() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )


def xstage(*args: str, env: dict[str, str]) -> int:
    cmd = [sys.executable, "-m", "xstage", *args]
    print("$ xstage " + " ".join(args), flush=True)
    return subprocess.run(cmd, env=env, cwd=REPO, check=False).returncode


def screenshot(chromium: str, page: Path, png: Path, height: int) -> None:
    """One headless Chromium screenshot of ``page``'s top ``height`` CSS pixels, palette-packed."""
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                "--force-device-scale-factor=1",
                f"--window-size=1100,{height}",
                f"--screenshot={png}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(png, optimize=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--openvino-python", default="", help="an interpreter with onnxruntime-openvino")
    ap.add_argument(
        "--thirdparty",
        default=str(REPO / ".test-cache" / "thirdparty"),
        help="the test cache's third-party graphs (tests/thirdparty.py fetches them)",
    )
    ap.add_argument("--out", help="where the HTML, node data and traces go (default: a temp folder)")
    ap.add_argument("--render-only", action="store_true",
                    help="draw the committed records again (no xstage external runs)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="xstage-report-examples-"))
    out.mkdir(parents=True, exist_ok=True)
    graphs = out / "graphs"
    graphs.mkdir(exist_ok=True)
    onnx.save(det_graph(), graphs / "det.onnx")
    onnx.save(det_only_graph(), graphs / "det_only.onnx")
    (graphs / "corrupt.onnx").write_bytes((graphs / "det.onnx").read_bytes()[:120])
    env = dict(
        os.environ,
        XSTAGE_PYTHON_ORT_OPENVINO=args.openvino_python,
        COLUMNS="110",
        XSTAGE_HOME=str(out / "home"),
        PYTHONPATH=str(REPO / "src"),
    )
    RECORDS.mkdir(parents=True, exist_ok=True)
    runs = {
        "placed": ["--builtin", "vision-tower-tiny", "--route", "ort-openvino"],
        "split": ["--graph", str(graphs / "det.onnx"), "--route", "ort-openvino"],
        "refused": ["--graph", str(graphs / "det_only.onnx"), "--route", "ort-openvino"],
        "error": ["--graph", str(graphs / "corrupt.onnx"), "--route", "ort-openvino"],
    }
    cls = next(Path(args.thirdparty).glob("ppocr-cls-v2/*.onnx"), None)
    if cls is not None:
        for route in ("ort-cpu", "ort-openvino"):
            runs[f"ppocr-cls.{route}"] = ["--graph", str(cls), "--route", route, "--shape", "x=1x3x48x192"]
    else:
        print(f"no PP-OCR cls graph under {args.thirdparty}: the compare example is skipped")
    for name, flags in runs.items():
        if args.render_only:
            continue
        code = xstage("external", *flags, "--json", str(RECORDS / f"{name}.json"), "-q", env=env)
        print(f"  exit {code}")
    for name in runs:
        record = RECORDS / f"{name}.json"
        xstage(
            "report",
            str(record),
            "-q",
            "--html",
            str(out / f"{name}.html"),
            "--node-data",
            str(out / f"{name}.node-data.json"),
            "--trace",
            str(out / f"{name}.trace.json"),
            env=env,
        )
    if cls is not None:
        xstage(
            "compare",
            str(RECORDS / "ppocr-cls.ort-cpu.json"),
            str(RECORDS / "ppocr-cls.ort-openvino.json"),
            "--html",
            str(out / "compare.html"),
            env=env,
        )
    if Path(args.chromium).exists():
        for name, height in (("placed", 1500), ("split", 1500), ("refused", 1100), ("error", 700)):
            screenshot(args.chromium, out / f"{name}.html", IMAGES / f"report-{name}.png", height)
        if cls is not None:
            screenshot(args.chromium, out / "compare.html", IMAGES / "compare-ppocr-cls.png", 1100)
    else:
        print(f"no chromium at {args.chromium}: no screenshots")
    print(json.dumps({"records": str(RECORDS), "images": str(IMAGES), "out": str(out)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
