"""The exporters, run in an export environment (torch 2.13 CPU + transformers), as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import runcache

from xstage.artifact import inspect_artifact
from xstage.builtin_graphs import SHIPPED, builtin_artifact
from xstage.manifest import manifest_path, read_manifest

FORMATS = ["onnx:fp32", "onnx:fp16", "pt:fp32", "pt:fp16"]

#: Each test's body may run an export (torch.export + onnx in the export venv: ~25 s quiet); on a
#: machine whose load is many times its CPUs that passes 300 s. Every export and every external run
#: has its own subprocess timeout (900 s, 300 s), so a hang still ends.
pytestmark = pytest.mark.timeout(1800)


def _export(python, *args, check=True):
    done = subprocess.run([str(python), "-m", "xstage", "export", *args], capture_output=True,
                          text=True, timeout=900)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _kept(python, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` ({out} standing for ``dest``), run once and kept in the test cache while the
    code it imports, its inputs and the export venv are unchanged (``tests/runcache.py`` says why
    that is sound: a change to the exporter runs the export again)."""
    done = runcache.run(python, args, dest)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _kept_export(python, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``xstage export ARGS`` through ``_kept``."""
    return _kept(python, dest, "-m", "xstage", "export", *args)


def _external(*args, env=None):
    import os

    rec = Path(args[args.index("--json") + 1]) if "--json" in args else None
    done = subprocess.run([sys.executable, "-m", "xstage", "external", *args, "--runs", "2"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))
    return done, (json.loads(rec.read_text()) if rec and rec.exists() else None)


def _run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


class Exports:
    """``xstage export COMPONENT ARGS --format F``, run on first use of each format and kept (in
    the test cache too: ``_kept``).

    ``onnx:fp32`` is the fp32 source the ``onnx:fp16`` export writes first, by the very call
    ``--format onnx:fp32`` makes (``cli/export.py``): one export gives both reports.
    """

    def __init__(self, python, root, component, *args):
        self.python, self.root, self.component, self.args = python, root, component, args
        self.reports: dict[str, list] = {}

    def __getitem__(self, fmt: str) -> list:
        if fmt == "onnx:fp32":
            return self["onnx:fp16"][:1]
        if fmt not in self.reports:
            folder, name = self.root / fmt.replace(":", "-"), self.component
            _kept_export(self.python, folder, self.component, *self.args, "--format", fmt,
                         "--out", f"{{out}}/{name}", "--json", f"{{out}}/{name}.report.json")
            self.reports[fmt] = json.loads((folder / f"{name}.report.json").read_text())
        return self.reports[fmt]


@pytest.fixture(scope="module")
def towers(export_python, tmp_path_factory):
    """The tiny Qwen3.5 tower in every format."""
    return Exports(export_python, tmp_path_factory.mktemp("towers"), "vision-tower",
                   "--config", "tiny", "--images", "2")  # each format exported on first use


#: pt:fp16 takes no path that pt:fp32 and onnx:fp16 do not (as for code2wav below).
TOWER_FORMATS = [*FORMATS[:3], pytest.param("pt:fp16", marks=pytest.mark.slow(
    reason="pt:fp32 and onnx:fp16 take every path pt:fp16 takes"))]


@pytest.mark.parametrize("fmt", TOWER_FORMATS)
def test_tiny_tower_exports_bitwise_to_the_model_in_every_format(towers, fmt):
    report = towers[fmt][-1]
    assert report["format"] == fmt and report["wrapper"]["bitwise_equal"]
    assert report["grid_thw"] == [[1, 4, 4], [1, 4, 4]] and report["images"] == 2
    doc = read_manifest(Path(report["manifest"]))
    assert doc["format"] == fmt and doc["component"] == "vision_tower"
    assert doc["parity"]["wrapper_vs_model"]["bitwise_equal"]
    assert doc["exporter"]["transformers"] >= "5.24" and doc["source"]["kind"] == "config"
    assert [o["name"] for o in doc["outputs"]] == ["embeds"]
    if fmt.startswith("pt:"):
        assert report["reload_bitwise"] and report["path"].endswith(".pt2")
    else:
        graph = onnx.load(report["path"])
        ops = {n.op_type for n in graph.graph.node}
        assert "Gather" not in ops  # the position lookup is a one-hot MatMul
        assert not any(a.name == "allowzero" and a.i == 1 for n in graph.graph.node
                       if n.op_type == "Reshape" for a in n.attribute)  # all cleared, safely
        assert doc["sanitize"]["counts"]["ClearReshapeAllowzeroPass"]["skipped"] == 0
        # fp16 kernels round differently in onnxruntime and torch (measured 5.8e-4 here)
        bound = 1e-4 if fmt == "onnx:fp32" else 5e-3
        assert doc["parity"]["onnxruntime_cpu_vs_torch_max_abs"] < bound


def test_fp16_export_writes_its_fp32_source_and_names_it(towers):
    fp32, fp16 = towers["onnx:fp16"]
    assert fp32["format"] == "onnx:fp32" and fp16["format"] == "onnx:fp16"
    doc = read_manifest(Path(fp16["manifest"]))
    assert doc["fp32_source"] == Path(fp32["path"]).name
    assert inspect_artifact(fp16["path"]).format == "onnx:fp16"


#: ``xstage export`` of the tiny tower as ``tower.onnx``, then as ``tower.pt2`` into the same folder
#: (the CLI's own entry, twice in one interpreter: one torch import instead of two).
_ONE_STEM_TWICE = r"""
import sys
from xstage.cli.main import main
for fmt, name in (("onnx:fp32", "tower.onnx"), ("pt:fp32", "tower.pt2")):
    code = main(["export", "vision-tower", "--config", "tiny", "--format", fmt,
                 "--out", sys.argv[1] + "/" + name])
    if code:
        sys.exit(code)
"""


def test_onnx_and_pt2_of_one_stem_in_one_folder_both_open(export_python, tmp_path):
    """Each artifact file has its own manifest (``<file>.manifest.json``): a ``.pt2`` exported
    beside an ``.onnx`` of the same stem leaves the ONNX artifact's manifest alone."""
    folder = tmp_path / "vt"
    _kept(export_python, folder, "-c", _ONE_STEM_TWICE, "{out}")  # one export after the other
    assert {p.name for p in folder.glob("*.manifest.json")} == {"tower.onnx.manifest.json",
                                                                "tower.pt2.manifest.json"}
    # Both open (their manifests are read where the ONNX one failed before: inspect_artifact);
    # the ONNX one runs end to end (the .pt2's own run is test_tiny_tower_pt2_through_torch_cpu's).
    assert inspect_artifact(folder / "tower.pt2").format == "pt:fp32"
    assert inspect_artifact(folder / "tower.onnx").format == "onnx:fp32"
    done, rec = _external("--graph", str(folder / "tower.onnx"), "--route", "ort-cpu",
                          "--json", str(tmp_path / "tower.onnx.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert rec["artifact"]["format_source"] == "manifest"


@pytest.mark.parametrize("route", ["ort-cpu", "ort-openvino"])
@pytest.mark.parametrize("fmt", ["onnx:fp32", "onnx:fp16"])
def test_onnx_towers_pass_external_on_both_routes(towers, openvino_python, tmp_path, fmt, route):
    done, rec = _external("--graph", towers[fmt][-1]["path"], "--route", route,
                          "--json", str(tmp_path / "r.json"),
                          env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert rec["proof"]["verdict"] == "placed" and rec["parity"]["verdict"] == "passed"
    kind = "fp32_source" if fmt == "onnx:fp16" else "same_graph_cpu"
    assert rec["parity"]["reference_kind"] == kind


@pytest.mark.slow(reason="tests/integrations/test_transformers exports this tower and generates through it")
def test_qwen3_vl_tower_gives_deepstack_outputs(export_python, tmp_path):
    out = tmp_path / "tower"
    _export(export_python, "vision-tower", "--family", "qwen3_vl", "--config", "tiny",
            "--out", str(out), "--json", str(out) + ".report.json")
    (report,) = json.loads(Path(str(out) + ".report.json").read_text())
    doc = read_manifest(Path(report["manifest"]))
    assert [o["name"] for o in doc["outputs"]] == ["embeds", "deepstack_0", "deepstack_1"]
    assert report["wrapper"]["outputs"] == 3 and report["wrapper"]["bitwise_equal"]


@pytest.fixture(scope="module")
def code2wavs(export_python, tmp_path_factory):
    """The tiny code2wav of 50 frames in every format (its fp32 ONNX is also the shipped
    ``code2wav-tiny``'s fresh export)."""
    return Exports(export_python, tmp_path_factory.mktemp("code2wav"), "code2wav",
                   "--config", "tiny", "--frames", "50")


@pytest.fixture(scope="module")
def tiny_tower(export_python, tmp_path_factory) -> Path:
    """``xstage export vision-tower --config tiny`` (image size 64, one image: the defaults, and the
    shipped ``vision-tower-tiny``'s settings), exported once for the tests that compare with it."""
    folder = tmp_path_factory.mktemp("tiny-tower")
    _kept_export(export_python, folder, "vision-tower", "--config", "tiny", "--out", "{out}/tiny")
    return folder / "tiny"


#: pt:fp16 takes no path that pt:fp32 (the .pt2) and onnx:fp16 (code2wav's fp16 cast) do not, and
#: the tower is exported in it by default: the code2wav one runs with --run-slow.
CODE2WAV_FORMATS = [*FORMATS[:3], pytest.param("pt:fp16", marks=pytest.mark.slow(
    reason="pt:fp32 and onnx:fp16 take every path pt:fp16 takes"))]


@pytest.mark.parametrize("fmt", CODE2WAV_FORMATS)
def test_tiny_code2wav_exports_bitwise_in_every_format(code2wavs, tmp_path, openvino_python, fmt):
    report = code2wavs[fmt][-1]
    assert report["wrapper"]["bitwise_equal"] and report["frames"] == 50
    if fmt.startswith("onnx"):
        ops = {n.op_type for n in onnx.load(report["path"]).graph.node}
        assert "IsNaN" not in ops and "Where" not in ops  # the float mask leaves no guards
        for route in ("ort-cpu", "ort-openvino"):
            done, rec = _external("--graph", report["path"], "--route", route,
                                  "--json", str(tmp_path / f"{route}.json"),
                                  env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
            assert done.returncode == 0, done.stderr[-2000:]
            assert rec["parity"]["verdict"] == "passed"


_WRITE_CHECKPOINT = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from xstage.export.vision_tower import TINY, build_model
out, prefix, drop = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "drop"
model, _ = build_model("qwen3_5", config="tiny", seed=0)
state = {prefix + k: v.contiguous() for k, v in model.state_dict().items()}
if drop:
    state.pop(sorted(state)[0])
state["model.language_model.embed_tokens.weight"] = torch.zeros(4, 4)  # not the tower: ignored
out.mkdir(parents=True)
names = sorted(state)
save_file({k: state[k] for k in names[: len(names) // 2]}, str(out / "model-00001-of-00002.safetensors"))
save_file({k: state[k] for k in names[len(names) // 2:]}, str(out / "model-00002-of-00002.safetensors"))
(out / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "vision_config": TINY}))
print(len(model.state_dict()))
"""


#: ``_WRITE_CHECKPOINT``, then ``xstage export vision-tower --checkpoint`` of it to ``argv[4]``.
_CHECKPOINT_EXPORT = _WRITE_CHECKPOINT + r"""
from xstage.cli.main import main
sys.stdout.flush()
sys.exit(main(["export", "vision-tower", "--checkpoint", str(out), "--out", sys.argv[4]]))
"""


#: Both prefixes take one line (``vision_tower.PREFIXES``): the second runs with --run-slow.
@pytest.mark.parametrize("prefix", ["model.visual.", pytest.param("visual.", marks=pytest.mark.slow(
    reason="both prefixes take one line"))])
def test_checkpoint_under_either_prefix_loads_strictly_and_matches(export_python, tiny_tower, tmp_path,
                                                                  prefix):
    # the checkpoint written, then exported by the CLI, in one command (kept as one: its paths
    # are all under {out}, so a later run's key is the same)
    done = _kept(export_python, tmp_path, "-c", _CHECKPOINT_EXPORT, "{out}/ckpt", prefix, "keep", "{out}/a")
    n = done.stdout.splitlines()[0].strip()
    doc = read_manifest(tmp_path / "a.onnx.manifest.json")
    assert doc["source"]["kind"] == "checkpoint" and doc["source"]["tensors"] == int(n)
    x = np.random.default_rng(0).standard_normal((16, 1536)).astype(np.float32)
    b_onnx = tiny_tower.with_suffix(".onnx")  # the same model from --config tiny
    (a,), (b,) = _run(tmp_path / "a.onnx", {"patches": x}), _run(b_onnx, {"patches": x})
    assert np.array_equal(a, b)  # the same weights, through the checkpoint


def test_checkpoint_with_a_missing_tensor_is_refused_by_name(export_python, tmp_path):
    ckpt = tmp_path / "ckpt"
    _kept(export_python, tmp_path, "-c", _WRITE_CHECKPOINT, "{out}/ckpt", "visual.", "drop")
    done = _export(export_python, "vision-tower", "--checkpoint", str(ckpt), "--out",
                   str(tmp_path / "a"), check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "1 tower tensors missing" in done.stderr and "every name must match" in done.stderr
    assert not (tmp_path / "a.onnx").exists()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_builtins_match_a_fresh_export(export_python, tiny_tower, code2wavs, tmp_path, name):
    shipped = builtin_artifact(name)
    doc = read_manifest(manifest_path(shipped))
    if name == "vision-tower-tiny":  # --config tiny at the default --image-size 64
        fresh, manifest = tiny_tower.with_suffix(".onnx"), manifest_path(tiny_tower.with_suffix(".onnx"))
    elif name == "code2wav-stream-tiny":
        _kept_export(export_python, tmp_path, "code2wav", "--config", "tiny", "--chunk", "8",
                     "--left-context", "50", "--out", f"{{out}}/{name}")
        fresh, manifest = tmp_path / f"{name}.onnx", tmp_path / f"{name}.onnx.manifest.json"
    else:  # code2wav --config tiny --frames 50, in fp32
        (report,) = code2wavs["onnx:fp32"]
        fresh, manifest = Path(report["path"]), Path(report["manifest"])
    # The bytes may differ with the exporter's versions (the manifest records them); the
    # numbers may not.
    assert doc["source"] == read_manifest(manifest)["source"]
    art = inspect_artifact(fresh)
    rng = np.random.default_rng(1)
    feeds = {s.name: (rng.integers(0, 8, s.shape) if s.dtype == "int64"
                      else rng.standard_normal(s.shape)).astype(s.dtype) for s in art.inputs}
    for a, b in zip(_run(shipped, feeds), _run(fresh, feeds), strict=True):
        assert np.array_equal(a, b)


def test_export_without_torch_is_a_usage_error_naming_the_extra():
    done = subprocess.run([sys.executable, "-m", "xstage", "export", "vision-tower", "--config",
                           "tiny", "--out", "/tmp/never"], capture_output=True, text=True, timeout=120)
    if done.returncode == 0:  # pragma: no cover - this interpreter has torch after all
        pytest.skip("torch is importable here")
    assert done.returncode == 64 and "[export]" in done.stderr


#: Each option check is one line of the same usage-error path; the first runs by default.
_SAME_USAGE_PATH = pytest.mark.slow(reason="the usage-error path the first case takes, another option")


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "tiny", "--image-size", "48"], "not a multiple of 32"),
    pytest.param(["--config", "/nonexistent/cfg.json"], "--config /nonexistent/cfg.json",
                 marks=_SAME_USAGE_PATH),
    pytest.param(["--config", "tiny", "--images", "0"], "--images must be >= 1", marks=_SAME_USAGE_PATH),
])
def test_bad_export_options_are_usage_errors(export_python, tmp_path, args, message):
    done = _export(export_python, "vision-tower", *args, "--out", str(tmp_path / "t"), check=False)
    assert done.returncode == 64, done.stderr[-1000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())  # nothing written
