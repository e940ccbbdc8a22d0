"""A torch 2.4.1 worker (the torch torch-directml pins) running today's exporter's tiny tower.

Slow, and only where ``XSTAGE_TORCH241_WHEELHOUSE`` names a folder holding the torch 2.4.1
wheels for CPython 3.9 (``scripts/torch241_wheelhouse.sh`` fills one, ~2.7 GB): the worker's
venv is built from it, offline, into the test cache. Otherwise every test here skips, saying so.

What it shows:

* the tower exported by torch 2.13 with ``--for-torch 2.4`` goes through ``xstage external`` on
  the 2.4.1 worker: placed, gated;
* the DirectML code path of the worker (``torch_directml`` picks the adapter by name, the
  program is moved by ``move_program`` because 2.4.1 has no ``move_to_device_pass``) with a
  stand-in ``torch_directml`` whose device is torch's: on ``meta`` every op of the op log runs
  there (a device argument left behind would put ops on the CPU), on ``cpu`` the outputs equal
  torch 2.13's bitwise;
* the current archive layout is refused naming ``--for-torch 2.4``, and an argument 2.4.1's op
  schema lacks (its loader would drop it silently) refuses the load naming op and argument.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import runcache

REPO = Path(__file__).resolve().parents[2]
SLOW = pytest.mark.slow(reason="a torch 2.4.1 venv built from a 2.7 GB wheelhouse (skips without one)")


@pytest.fixture(scope="module")
def torch241_python() -> Path:
    wheels = os.environ.get("XSTAGE_TORCH241_WHEELHOUSE")
    if not wheels:
        pytest.skip("XSTAGE_TORCH241_WHEELHOUSE is not set (scripts/torch241_wheelhouse.sh fills "
                    "a folder with the torch 2.4.1 wheels; this test never downloads them)")
    if not list(Path(wheels).glob("torch-2.4.1-cp39-*.whl")):
        pytest.skip(f"{wheels} holds no torch-2.4.1-cp39 wheel (scripts/torch241_wheelhouse.sh)")
    from xstage.routes.envs import find_python

    root = Path(os.environ.get("XSTAGE_TEST_CACHE", REPO / ".test-cache")) / "torch241"
    root.mkdir(parents=True, exist_ok=True)
    python = root / "venv" / "bin" / "python"
    check = ("import sys, torch; assert sys.version_info[:2] == (3, 9); "
             "assert torch.__version__.startswith('2.4.1')")
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.is_file() and subprocess.run([str(python), "-c", check], capture_output=True,
                                                timeout=300).returncode == 0:
            return python
        base = find_python("3.9")[0]
        subprocess.run([base, "-m", "venv", "--clear", str(root / "venv")], check=True, timeout=300)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                               wheels, "torch==2.4.1", "numpy"], capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, done.stderr[-2000:]
    return python


def _export(export_python, out, *extra):
    done = subprocess.run([str(export_python), "-m", "xstage", "export", "vision-tower", "--config",
                           "tiny", "--image-size", "64", "--format", "pt:fp32", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out.with_suffix(".pt2")


@pytest.fixture(scope="module")
def towers(export_python, tmp_path_factory):
    root = tmp_path_factory.mktemp("t241")
    return {"legacy": _export(export_python, root / "legacy" / "tower", "--for-torch", "2.4"),
            "current": _export(export_python, root / "current" / "tower")}


def _external(python, graph, *args):
    env = dict(os.environ, XSTAGE_PYTHON_TORCH_CPU=str(python), COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(graph),
                           "--route", "torch-cpu", "--runs", "3", *args], capture_output=True,
                          text=True, timeout=600, env=env)


@SLOW
def test_the_tiny_tower_for_torch_2_4_is_placed_and_gated_on_a_torch241_worker(torch241_python, towers,
                                                                                 tmp_path):
    rec = tmp_path / "r.json"
    done = _external(torch241_python, towers["legacy"], "--json", str(rec))
    print(done.stdout)  # the summary, for the note (pytest -s)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(rec.read_text())
    assert doc["proof"]["verdict"] == "placed" and doc["proof"]["target_ep"] == "torch:cpu"
    assert doc["proof"]["nodes_on_target"] == doc["proof"]["nodes_total"] > 10
    assert doc["parity"]["verdict"] == "passed" and doc["parity"]["reference_kind"] == "torch_cpu"
    text = json.dumps(doc)
    assert '"torch": "2.4.1' in text and "flat (torch 2.4 layout)" in text


_DML_PATH = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import torch
    from xstage_remote import torch_runtime as tr
    device, path, feeds = sys.argv[2], sys.argv[3], sys.argv[4]
    rt = tr.load(path, {"device": "privateuseone:0", "directml": True, "profile": True,
                        "adapter_name": "stand-in adapter", "output_names": ["embeds"]})
    x = torch.from_numpy(np.load(feeds)).to(rt.device)
    with torch.no_grad():
        out = rt._profiled([x])
    seen = sorted({d for o in rt.evidence["ops"] for d in o["in"] + o["out"]})
    report = {"moved": rt.info["moved"], "device": rt.info["device"], "op_devices": seen,
              "output_devices": rt.evidence["output_devices"], "torch": torch.__version__,
              "ignored": rt.info.get("ignored_arguments")}
    if device == "cpu":
        np.save(sys.argv[5], out[0].numpy() if isinstance(out, (list, tuple)) else out.numpy())
    print(json.dumps(report))
""")

_STAND_IN = textwrap.dedent("""
    '''A stand-in torch_directml for tests: two adapters, each device torch's own.'''
    import os
    import torch

    _NAMES = ["Other adapter", "Stand-in Adapter"]

    def device_count():
        return len(_NAMES)

    def device_name(index):
        return _NAMES[index]

    def device(index):
        assert _NAMES[index] == "Stand-in Adapter", "picked %r" % _NAMES[index]
        return torch.device(os.environ["STAND_IN_DEVICE"])
""")


def _dml_path(python, tmp_path, device, graph, feeds, out=None):
    (tmp_path / "stand_in").mkdir(exist_ok=True)
    (tmp_path / "stand_in" / "torch_directml.py").write_text(_STAND_IN)
    script = tmp_path / "dml_path.py"
    script.write_text(_DML_PATH)
    env = dict(os.environ, STAND_IN_DEVICE=device, PYTHONPATH=str(tmp_path / "stand_in"))
    return subprocess.run([str(python), "-W", "ignore", str(script), str(REPO / "src"), device,
                           str(graph), str(feeds), str(out or tmp_path / "unused.npy")],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def todays_outputs(export_python, towers, tmp_path_factory):
    """The current-layout tower on torch 2.13, on one seeded input."""
    root = tmp_path_factory.mktemp("t213")
    code = ("import sys, numpy as np, torch; torch.manual_seed(0); x = torch.randn(16, 1536); "
            "np.save(sys.argv[2], x.numpy()); y = torch.export.load(sys.argv[1]).module()(x); "
            "np.save(sys.argv[3], (y[0] if isinstance(y, (list, tuple)) else y).detach().numpy())")
    subprocess.run([str(export_python), "-c", code, str(towers["current"]), str(root / "x.npy"),
                    str(root / "y.npy")], check=True, capture_output=True, timeout=600)
    return root / "x.npy", root / "y.npy"


def test_the_directml_path_on_todays_torch_moves_every_op_to_the_device(export_python, tmp_path):
    """The same DirectML path without the 2.4.1 venv (the default run's test of this module): the
    stand-in adapter picked by name, on torch 2.13 (which has ``move_to_device_pass``) every op of
    the op log and every output on the adapter's device."""
    import numpy as np

    # kept in the test cache while the exporter's code is unchanged (tests/runcache.py)
    done = runcache.run(export_python, ["-m", "xstage", "export", "vision-tower", "--config", "tiny",
                                        "--image-size", "64", "--format", "pt:fp32", "--out",
                                        "{out}/tower"], tmp_path / "current")
    assert done.returncode == 0, done.stderr[-3000:]
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((16, 1536)).astype(np.float32))
    done = _dml_path(export_python, tmp_path, "meta", tmp_path / "current" / "tower.pt2", x)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"].startswith("2.13") and report["device"] == "meta"
    assert report["op_devices"] == ["meta"] and report["output_devices"] == ["meta"]


@SLOW
def test_the_directml_path_moves_every_op_to_the_device(torch241_python, towers, todays_outputs,
                                                        tmp_path):
    done = _dml_path(torch241_python, tmp_path, "meta", towers["legacy"], todays_outputs[0])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"].startswith("2.4.1") and report["device"] == "meta"
    assert report["moved"].startswith("move_program")
    assert report["op_devices"] == ["meta"] and report["output_devices"] == ["meta"]


@SLOW
def test_the_directml_path_on_the_cpu_equals_torch_2_13_bitwise(torch241_python, towers, todays_outputs,
                                                                tmp_path):
    import numpy as np

    got = tmp_path / "got.npy"
    done = _dml_path(torch241_python, tmp_path, "cpu", towers["legacy"], todays_outputs[0], got)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["op_devices"] == ["cpu"] and report["ignored"] == [
        "aten._assert_tensor_metadata.default(device) x22",
        "aten._assert_tensor_metadata.default(layout) x22"]
    assert np.array_equal(np.load(got), np.load(todays_outputs[1]))


@SLOW
def test_the_current_layout_is_refused_naming_the_export_flag(torch241_python, towers):
    done = _external(torch241_python, towers["current"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "layout of torch >= 2.5" in done.stderr and "--for-torch 2.4" in done.stderr


@SLOW
def test_an_argument_the_old_op_schema_lacks_refuses_the_load(torch241_python, towers, todays_outputs,
                                                              tmp_path):
    bent = tmp_path / "bent.pt2"
    with zipfile.ZipFile(towers["legacy"]) as src, zipfile.ZipFile(bent, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "serialized_exported_program.json":
                doc = json.loads(data)
                node = next(n for n in doc["graph_module"]["graph"]["nodes"]
                            if n["target"] == "torch.ops.aten.gelu.default")
                node["inputs"].append({"name": "newer_knob", "arg": {"as_int": 1}})
                data = json.dumps(doc).encode()
            dst.writestr(name, data)
    done = _dml_path(torch241_python, tmp_path, "cpu", bent, todays_outputs[0])
    assert done.returncode != 0
    assert "aten.gelu.default(newer_knob) x1" in done.stderr and "would drop" in done.stderr
