"""Probe mode under real interpreters, its stdout discipline, and the probe cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import xstage_remote
from xstage.routes.probe import ProbeRequest, cache_key, probe, probe_many, run_probe

SRC = Path(xstage_remote.__file__).resolve().parent.parent


def test_probe_current_interpreter():
    outcome = run_probe(ProbeRequest(sys.executable, plugins=("onnxruntime_ep_openvino",)))
    assert outcome.ok, outcome.error
    doc = outcome.data
    assert doc["probe_schema"] == 1
    assert doc["python"]["executable"] == sys.executable
    assert doc["python"]["version_info"] == list(sys.version_info[:3])
    import numpy
    import onnxruntime

    assert doc["numpy"] == {"importable": True, "version": numpy.__version__}
    ort = doc["onnxruntime"]
    assert ort["version"] == onnxruntime.__version__
    assert ort["providers"] == onnxruntime.get_available_providers()
    assert ort["ep_device_api"] is True
    cpu = [r for r in ort["ep_devices"] if r["ep_name"] == "CPUExecutionProvider"]
    assert cpu and cpu[0]["device_type"] == "CPU"
    assert doc["torch"] is None  # not asked for


def test_probe_python39_legacy_onnxruntime(py39_ort119_python):
    outcome = run_probe(ProbeRequest(str(py39_ort119_python), torch=True))
    assert outcome.ok, outcome.error
    doc = outcome.data
    assert doc["python"]["version"].startswith("3.9.")
    assert doc["onnxruntime"]["version"] == "1.19.2"
    assert doc["onnxruntime"]["ep_device_api"] is False and doc["onnxruntime"]["ep_devices"] is None
    assert doc["numpy"]["version"].startswith("1.")
    assert doc["torch"] == {"importable": False, "error": "ModuleNotFoundError: No module named 'torch'"}


def test_probe_openvino_builtin_lists_its_device_types(openvino_python):
    doc = run_probe(ProbeRequest(str(openvino_python))).data
    assert doc["onnxruntime"]["providers"][0] == "OpenVINOExecutionProvider"
    assert doc["onnxruntime"]["distributions"] == {"onnxruntime-openvino": doc["onnxruntime"]["version"]}
    assert "CPU" in doc["onnxruntime"]["openvino_device_ids"]


def test_probe_registers_the_openvino_plugin(openvino_plugin_python):
    doc = run_probe(ProbeRequest(str(openvino_plugin_python), plugins=("onnxruntime_ep_openvino",))).data
    plugin = doc["onnxruntime"]["plugins"]["onnxruntime_ep_openvino"]
    assert plugin["registered"] is True
    assert plugin["ep_name"] == "OpenVINOExecutionProvider"
    assert plugin["library_path"].endswith("libonnxruntime_providers_openvino_plugin.so")
    assert isinstance(doc["onnxruntime"]["ep_devices_after_plugins"], list)


def test_probe_torch(torch_python):
    doc = run_probe(ProbeRequest(str(torch_python), torch=True)).data
    torch = doc["torch"]
    assert torch["importable"] and torch["version"].startswith("2.13.0")
    assert torch["cuda_available"] is False and torch["cuda_devices"] == []
    assert torch["torch_directml"]["importable"] is False


def _run_probe_main(tmp_path: Path, module_source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "noisy_ep.py").write_text(module_source)
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
        "from xstage_remote.probe import main; main(sys.argv[3:])"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(SRC), str(tmp_path), *args], capture_output=True, timeout=120
    )


def test_native_prints_cannot_corrupt_the_document(tmp_path):
    """A module that prints through Python and straight to fd 1 while it loads."""
    done = _run_probe_main(
        tmp_path,
        "import os, sys\nprint('python-level print')\nsys.stdout.flush()\nos.write(1, b'native print\\n')\n",
        "--plugin",
        "noisy_ep",
    )
    assert done.returncode == 0
    doc = json.loads(done.stdout)  # exactly one JSON document, nothing else
    assert b"native print" in done.stderr and b"python-level print" in done.stderr
    plugin = doc["onnxruntime"]["plugins"]["noisy_ep"]
    assert plugin["importable"] is True and plugin["registered"] is False
    assert plugin["error"].startswith("AttributeError:")  # no get_library_path: reported as data


def test_import_errors_are_data(tmp_path):
    done = _run_probe_main(
        tmp_path, "raise RuntimeError('driver missing\\nsecond line')\n", "--plugin", "noisy_ep"
    )
    doc = json.loads(done.stdout)
    assert doc["onnxruntime"]["plugins"]["noisy_ep"]["error"] == "RuntimeError: driver missing"


def test_probe_rejects_unknown_arguments(tmp_path):
    done = _run_probe_main(tmp_path, "", "--bogus")
    assert done.returncode == 64 and done.stdout == b""


def test_cache_hit_then_refresh():
    request = ProbeRequest(sys.executable)
    first = probe(request)
    second = probe(request)
    assert first.ok and not first.cached
    assert second.cached and second.data == first.data
    assert not probe(request, refresh=True).cached


def test_cache_key_follows_site_packages(tmp_path):
    """Installing into a venv changes its site-packages mtime, which invalidates the entry."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    request = ProbeRequest(str(venv / "bin" / "python"))
    key = cache_key(request)
    assert key["pyvenv_cfg"][0] == str(venv / "pyvenv.cfg")
    assert any(p.endswith("site-packages") for p, _ in key["site_packages"])
    assert key["realpath"] != key["interpreter"]  # a venv python is a link to its base
    assert key["package_hash"] == xstage_remote.package_hash()
    assert probe(request).ok and probe(request).cached
    site = Path(next(p for p, _ in key["site_packages"] if p.startswith(str(venv))))
    later = time.time() + 5
    os.utime(site, (later, later))
    assert cache_key(request) != key
    assert not probe(request).cached


def test_two_venvs_of_one_base_do_not_share_an_entry(tmp_path):
    keys = []
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / name)], check=True)
        keys.append(cache_key(ProbeRequest(str(tmp_path / name / "bin" / "python"))))
    assert keys[0]["realpath"] == keys[1]["realpath"] and keys[0] != keys[1]


def test_missing_interpreter_is_not_cacheable(tmp_path):
    assert cache_key(ProbeRequest(str(tmp_path / "nope"))) is None
    outcome = probe(ProbeRequest(str(tmp_path / "nope")))
    assert not outcome.ok and "cannot start" in outcome.error


def test_timeout_kills_the_probe(fake_python, tmp_path):
    """The whole process group: a child the probe started is gone too (how fast: benchmarks/)."""
    pids = tmp_path / "pids"
    slow = fake_python(f"sleep 600 >/dev/null 2>&1 & echo $! > {pids}; exec sleep 600")
    outcome = run_probe(ProbeRequest(str(slow)), timeout=0.5)
    assert not outcome.ok and outcome.error == "the probe did not finish within 0.5 s (XSTAGE_PROBE_TIMEOUT)"
    child = psutil.Process(int(pids.read_text()))
    gone, alive = psutil.wait_procs([child], timeout=30)
    assert not alive, f"the probe's child {child.pid} outlived the timeout"


def test_probe_many_runs_in_parallel(fake_python, tmp_path):
    """Three probes overlap: each waits (up to 20 s) to see all three started.

    How long three 1 s probes take together: ``benchmarks/liveness.py``.
    """
    started, saw_all = tmp_path / "started", tmp_path / "saw-all"
    started.mkdir()
    saw_all.mkdir()
    count = f"$(ls {started} | wc -l)"
    wait = (f"n=0; while [ {count} -lt 3 ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n+1)); done; "
            f"[ {count} -ge 3 ] && touch {saw_all}/$$; exit 2")
    sleepers = [fake_python(f"touch {started}/$$; {wait}", name=f"python{i}") for i in range(3)]
    outcomes = probe_many([ProbeRequest(str(p)) for p in sleepers])
    assert len(outcomes) == 3 and all(not o.ok for o in outcomes.values())
    assert len(list(saw_all.iterdir())) == 3, "the probes ran one after another"


@pytest.mark.parametrize("flag", [True, False])
def test_argv_is_the_worker_launch_path(flag):
    from xstage.client import staging as remote_pkg

    argv = ProbeRequest("/x/python", torch=flag, plugins=("m",)).argv()
    assert argv[: len(remote_pkg.worker_argv("/x/python"))] == remote_pkg.worker_argv("/x/python")
    assert (
        argv[-4:] == ["probe", "--torch", "--plugin", "m"]
        if flag
        else argv[-3:] == ["probe", "--plugin", "m"]
    )


def test_windows_root_replaces_the_staged_path():
    from xstage.client import staging as remote_pkg

    argv = ProbeRequest("/mnt/c/py/python.exe", windows_root="\\\\wsl.localhost\\U\\stage").argv()
    assert str(remote_pkg.staged_root()) not in argv
    assert "\\\\wsl.localhost\\U\\stage" in argv
