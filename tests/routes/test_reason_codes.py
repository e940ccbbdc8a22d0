"""One test (at least) per reason code, with a real interpreter wherever this machine allows.

Real interpreters: the current one (onnxruntime 1.32, no torch), CPython 3.8 from pyenv,
the cached venvs (3.9 + onnxruntime 1.19.2, the ort-openvino envs, torch 2.13.0 CPU), and
fresh venvs without onnxruntime. Fault injection (a fake "python" that exits 1, hangs or
prints garbage) only for ``interpreter_failed``. Host facts that cannot exist here (WSL) are
passed in as a ``HostInfo``; everything after that check still runs for real.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import trust_project
from xstage.host.wsl import WslInfo
from xstage.routes import ROUTES, HostInfo, ReasonCode, get_spec, resolve, resolve_all, resolve_specs

LINUX = HostInfo(platform="linux", cpu_vendor="amd")
WSL_NO_INTEROP = HostInfo(
    platform="wsl",
    wsl=WslInfo(
        is_wsl=True, version=2, interop=False, distro="Ubuntu", evidence=("binfmt_misc/WSLInterop: disabled",)
    ),
    cpu_vendor="amd",
)
WSL = HostInfo(
    platform="wsl", wsl=WslInfo(is_wsl=True, version=2, interop=True, distro="Ubuntu"), cpu_vendor="amd"
)
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python")


def _resolve(name, tmp_path, environ=None, host=LINUX, **kw):
    return resolve(name, host=host, environ=environ or {}, cwd=tmp_path, hardware=[], **kw)


@pytest.fixture
def bare_venv(tmp_path):
    """A real venv with nothing installed (no onnxruntime, no torch)."""
    target = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    return target / "bin" / "python"


# ---------------------------------------------------------------------------- resolved


def test_ort_cpu_resolves_with_the_current_interpreter(tmp_path):
    status = _resolve("ort-cpu", tmp_path)
    assert (status.status, status.reason_code, status.interpreter_source) == ("resolved", None, "current")
    assert status.interpreter == sys.executable
    assert status.devices == ("cpu",)
    assert status.verified and status.versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert status.ep_plugin == {
        "kind": "builtin",
        "ep_name": "CPUExecutionProvider",
        "options": {},
        "device_options": {},
    }


def test_ort_cpu_resolves_with_python39_and_onnxruntime_119(tmp_path, py39_ort119_python):
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(py39_ort119_python)})
    assert status.resolved and status.interpreter_source == "env_var"
    assert status.versions["python"].startswith("3.9.")
    assert status.versions["onnxruntime"] == "1.19.2"
    assert status.probe["onnxruntime"]["ep_device_api"] is False  # the legacy path


def test_ort_openvino_resolves_with_the_builtin_ep(tmp_path, openvino_python):
    status = _resolve("ort-openvino", tmp_path, {"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert status.resolved, status.reason
    assert status.devices == ("cpu",)
    assert status.versions["onnxruntime_distribution"] == "onnxruntime-openvino"
    assert status.ep_plugin["kind"] == "builtin"
    assert status.ep_plugin["device_options"] == {"cpu": {"device_type": "CPU"}}


def test_torch_cpu_resolves_with_a_torch_interpreter(tmp_path, torch_python):
    status = _resolve("torch-cpu", tmp_path, {"XSTAGE_PYTHON_TORCH_CPU": str(torch_python)})
    assert status.resolved and status.devices == ("cpu",)
    assert status.versions["torch"].startswith("2.13.0")


def test_resolve_all_never_raises_and_lists_every_route(tmp_path, fake_python):
    broken = fake_python("exit 3")
    environ = {spec.env_var: str(broken) for spec in ROUTES}
    statuses = resolve_all(host=LINUX, environ=environ, cwd=tmp_path, hardware=[])
    assert [s.name for s in statuses] == [s.name for s in ROUTES]
    assert all(s.status == "missing" and s.reason and s.remedy for s in statuses)


def test_unknown_route_is_a_usage_error(tmp_path):
    from xstage.errors import UsageError

    with pytest.raises(UsageError, match="unknown route 'nope'"):
        _resolve("nope", tmp_path)


# ---------------------------------------------------------------------------- missing


def test_wrong_os_for_windows_side_routes_on_linux(tmp_path):
    status = _resolve("ort-vitisai", tmp_path)
    assert status.reason_code is ReasonCode.WRONG_OS
    assert (
        status.reason
        == "ort-vitisai needs Windows (natively, or reached from WSL); this host is Linux (not WSL)"
    )
    assert status.interpreter is None and status.devices == ()


def test_wrong_os_for_coreml_off_macos(tmp_path):
    status = _resolve("ort-coreml", tmp_path)
    assert status.reason_code is ReasonCode.WRONG_OS
    assert status.reason == "ort-coreml needs macOS; this host is Linux (not WSL)"
    assert status.remedy == "run xstage on a Mac to use ort-coreml"


def test_wrong_os_when_a_windows_route_is_given_a_linux_interpreter(tmp_path, py39_ort119_python):
    """From WSL, a Windows-side route's interpreter must be a python.exe."""
    status = _resolve("ort-dml", tmp_path, {"XSTAGE_PYTHON_ORT_DML": str(py39_ort119_python)}, host=WSL)
    assert status.reason_code is ReasonCode.WRONG_OS
    assert status.reason == (
        f"{py39_ort119_python} (set by XSTAGE_PYTHON_ORT_DML) is not a Windows executable (.exe); "
        "ort-dml runs a Windows interpreter"
    )


def test_wrong_os_when_a_this_os_route_is_given_a_windows_python(tmp_path, py39_ort119_python):
    """A real probe whose interpreter reports another OS than the host's (pure re-judgement)."""
    from xstage.routes import choose_interpreter, evaluate
    from xstage.routes.probe import ProbeRequest, probe

    outcome = probe(ProbeRequest(str(py39_ort119_python)))
    outcome.data["python"]["platform"] = "win32"  # as a python.exe reached through interop says
    spec = get_spec("ort-cpu")
    choice = choose_interpreter(spec, host=WSL, environ={spec.env_var: str(py39_ort119_python)}, cwd=tmp_path)
    status = evaluate(spec, choice, outcome, host=WSL)
    assert status.reason_code is ReasonCode.WRONG_OS
    assert "is a Windows Python; ort-cpu needs an interpreter of this OS (WSL)" in status.reason


def test_wsl_interop_unavailable(tmp_path):
    status = _resolve("ort-vitisai", tmp_path, host=WSL_NO_INTEROP)
    assert status.reason_code is ReasonCode.WSL_INTEROP_UNAVAILABLE
    assert "binfmt_misc/WSLInterop: disabled" in status.reason
    assert "/etc/wsl.conf" in status.remedy


def test_interpreter_not_configured_for_windows_side_route_from_wsl(tmp_path):
    status = _resolve("ort-vitisai", tmp_path, host=WSL)
    assert status.reason_code is ReasonCode.INTERPRETER_NOT_CONFIGURED
    assert "xstage env create ort-vitisai" in status.remedy and "XSTAGE_PYTHON_ORT_VITISAI" in status.remedy


def test_config_invalid(tmp_path, trusted_toml):
    trusted_toml(tmp_path, "[routes.ort-cpu\npython = \n")
    status = _resolve("ort-cpu", tmp_path)
    assert status.reason_code is ReasonCode.CONFIG_INVALID
    assert status.reason.startswith(f"{tmp_path / 'xstage.toml'} is not valid TOML")


def test_config_invalid_value(tmp_path, trusted_toml):
    trusted_toml(tmp_path, "[routes.ort-cpu]\npython = 3\n")
    status = _resolve("ort-cpu", tmp_path)
    assert status.reason_code is ReasonCode.CONFIG_INVALID
    assert "python must be a non-empty string, got 3" in status.reason


def test_interpreter_not_found_from_env_var_has_no_fallback(tmp_path):
    missing = tmp_path / "nowhere" / "python"
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(missing)})
    assert status.reason_code is ReasonCode.INTERPRETER_NOT_FOUND
    assert status.reason == f"interpreter not found at {missing} (set by XSTAGE_PYTHON_ORT_CPU)"
    assert status.remedy == "point XSTAGE_PYTHON_ORT_CPU at an existing interpreter, or unset it"
    assert (status.interpreter, status.interpreter_source) == (str(missing), "env_var")


def test_interpreter_not_found_from_project_config(tmp_path, trusted_toml):
    trusted_toml(tmp_path, '[routes.ort-openvino]\npython = "venvs/ov/bin/python"\n')
    status = _resolve("ort-openvino", tmp_path)
    assert status.reason_code is ReasonCode.INTERPRETER_NOT_FOUND
    assert str(tmp_path / "venvs/ov/bin/python") in status.reason
    assert status.interpreter_source == "project_config"


def test_interpreter_failed_exit_status_with_stderr_tail(tmp_path, fake_python):
    bad = fake_python('echo "Fatal Python error: init_fs_encoding" >&2; exit 1')
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(bad)})
    assert status.reason_code is ReasonCode.INTERPRETER_FAILED
    assert status.reason.startswith(f"probing {bad} failed: the probe exited with status 1")
    assert "Fatal Python error: init_fs_encoding" in status.reason


def test_interpreter_failed_timeout(tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("XSTAGE_PROBE_TIMEOUT", "1")
    slow = fake_python("sleep 30")
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(slow)})
    assert status.reason_code is ReasonCode.INTERPRETER_FAILED
    assert "the probe did not finish within 1 s" in status.reason


def test_interpreter_failed_garbage_output(tmp_path, fake_python):
    chatty = fake_python("echo 'Python 2.7 says hello'")
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(chatty)})
    assert status.reason_code is ReasonCode.INTERPRETER_FAILED
    assert "printed no valid JSON document" in status.reason


@pytest.mark.skipif(not PY38.is_file(), reason="pyenv's CPython 3.8 is not on this machine")
def test_interpreter_failed_python_too_old(tmp_path):
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(PY38)})
    assert status.reason_code is ReasonCode.INTERPRETER_FAILED
    assert status.reason.startswith(f"{PY38} is Python 3.8.")
    assert status.reason.endswith("the worker needs Python >= 3.9")


def test_runtime_not_importable_onnxruntime(tmp_path, bare_venv):
    status = _resolve("ort-cpu", tmp_path, {"XSTAGE_PYTHON_ORT_CPU": str(bare_venv)})
    assert status.reason_code is ReasonCode.RUNTIME_NOT_IMPORTABLE
    assert status.reason == (
        f"onnxruntime is not importable by {bare_venv}: ModuleNotFoundError: No module named 'onnxruntime'"
    )
    assert "XSTAGE_PYTHON_ORT_CPU" in status.remedy


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="this interpreter has torch")
def test_runtime_not_importable_torch_in_the_current_interpreter(tmp_path):
    status = _resolve("torch-cpu", tmp_path)
    assert status.reason_code is ReasonCode.RUNTIME_NOT_IMPORTABLE
    assert status.interpreter_source == "current"
    assert "No module named 'torch'" in status.reason
    assert "xstage env create torch-cpu --pin torch==<version>" in status.remedy


def test_runtime_version_unsupported_too_old(tmp_path, py39_ort119_python):
    """A spec with a minimum (as ort-vitisai has) against a real onnxruntime 1.19.2."""
    spec = dataclasses.replace(get_spec("ort-cpu"), min_runtime="1.25", version_note="test minimum")
    (status,) = resolve_specs(
        [spec], host=LINUX, environ={spec.env_var: str(py39_ort119_python)}, cwd=tmp_path, hardware=[]
    )
    assert status.reason_code is ReasonCode.RUNTIME_VERSION_UNSUPPORTED
    assert status.reason == (
        f"onnxruntime 1.19.2 at {py39_ort119_python} is too old for CPUExecutionProvider: "
        "needs >= 1.25 (test minimum)"
    )


def test_runtime_version_unsupported_too_new(tmp_path):
    """A spec with a ceiling (as ort-dml has) against the current onnxruntime 1.32."""
    spec = dataclasses.replace(get_spec("ort-cpu"), max_runtime="1.25", version_note="test ceiling")
    (status,) = resolve_specs([spec], host=LINUX, environ={}, cwd=tmp_path, hardware=[])
    assert status.reason_code is ReasonCode.RUNTIME_VERSION_UNSUPPORTED
    assert "is too new for CPUExecutionProvider: it ships only below 1.25 (test ceiling)" in status.reason


def test_ep_not_in_build(tmp_path):
    import onnxruntime

    if "OpenVINOExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this interpreter's onnxruntime has the OpenVINO EP")
    status = _resolve("ort-openvino", tmp_path)
    assert status.reason_code is ReasonCode.EP_NOT_IN_BUILD
    providers = ", ".join(onnxruntime.get_available_providers())
    assert f"(it has: {providers})" in status.reason
    assert "the plugin package onnxruntime_ep_openvino is not importable there" in status.reason
    assert status.remedy == "xstage env create ort-openvino"


def test_ep_not_in_build_legacy_onnxruntime(tmp_path, py39_ort119_python):
    status = _resolve("ort-cuda", tmp_path, {"XSTAGE_PYTHON_ORT_CUDA": str(py39_ort119_python)})
    assert status.reason_code is ReasonCode.EP_NOT_IN_BUILD
    assert "CUDAExecutionProvider is not in onnxruntime 1.19.2" in status.reason
    assert "onnxruntime-gpu" in status.remedy


def test_ep_no_device_openvino_plugin_on_a_non_intel_cpu(tmp_path, openvino_plugin_python):
    """The plugin registers here but lists no OpenVINO device for this AMD CPU."""
    status = _resolve("ort-openvino", tmp_path, {"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_plugin_python)})
    cpu_vendor = next(
        r["device_vendor"] for r in status.probe["onnxruntime"]["ep_devices"] if r["device_type"] == "CPU"
    )
    if status.resolved:
        pytest.skip(f"the plugin lists an OpenVINO device on this CPU (vendor {cpu_vendor})")
    assert status.reason_code is ReasonCode.EP_NO_DEVICE
    assert f"listed no OpenVINOExecutionProvider device for this CPU (vendor {cpu_vendor})" in status.reason
    assert status.remedy == "use the built-in EP: xstage env create ort-openvino --variant builtin"


def test_backend_not_importable_torch_directml(tmp_path, torch_python):
    status = _resolve("torch-dml", tmp_path, {"XSTAGE_PYTHON_TORCH_DML": str(torch_python)}, host=WSL)
    assert status.reason_code is ReasonCode.BACKEND_NOT_IMPORTABLE
    assert "but torch_directml does not: ModuleNotFoundError" in status.reason
    assert "torch-directml pins torch 2.4.1" in status.remedy


def test_device_not_available_cuda_with_a_cpu_torch(tmp_path, torch_python):
    status = _resolve("torch-cuda", tmp_path, {"XSTAGE_PYTHON_TORCH_CUDA": str(torch_python)})
    assert status.reason_code is ReasonCode.DEVICE_NOT_AVAILABLE
    assert (
        "torch.cuda.is_available() is False (a CPU-only build: torch.version.cuda is None)" in status.reason
    )
    assert status.reason.endswith("no NVIDIA GPU was found here")


def test_every_reason_code_is_tested_here():
    """Guards the closed set: a new code needs a test in this file."""
    text = Path(__file__).read_text()
    for code in ReasonCode:
        assert f"ReasonCode.{code.name}" in text, code


# ---------------------------------------------------------------------- plugin EPs (docs/routes.md)


def _table(tmp_path, name, body):
    trust_project(tmp_path, f"[plugins.{name}]\n{body}")
    return f"ort-plugin:{name}"


def test_config_invalid_plugin_table(tmp_path):
    route = _table(tmp_path, "broken", 'ep_name = "x"\n')  # neither module nor library
    status = _resolve(route, tmp_path)
    assert status.reason_code is ReasonCode.CONFIG_INVALID
    assert "give exactly one of module" in status.reason and "[plugins.broken]" in status.reason


def test_ep_library_not_found_package_not_importable(tmp_path):
    """The current interpreter (onnxruntime 1.32) has no such package: step 1 fails in the probe."""
    route = _table(tmp_path, "absent", 'module = "no_such_ep_package"\nep_name = "absent"\n')
    status = _resolve(route, tmp_path)
    assert status.reason_code is ReasonCode.EP_LIBRARY_NOT_FOUND
    assert "the package no_such_ep_package is not importable: ModuleNotFoundError" in status.reason
    assert status.remedy == "xstage env create ort-plugin:absent"


def test_ep_library_not_found_path_not_a_file(tmp_path):
    route = _table(tmp_path, "gone", 'library = "gone/libep.so"\nep_name = "gone"\n')
    status = _resolve(route, tmp_path)
    assert status.reason_code is ReasonCode.EP_LIBRARY_NOT_FOUND
    where = tmp_path / "gone" / "libep.so"
    assert status.reason == f"[plugins.gone] library names {where}, which is not a file"


def test_ep_library_wrong_vitisai_light_dll():
    """Step 2 on a recorded location: the app package's light DLL, named by the env var."""
    from xstage.routes import plugins

    spec = get_spec("ort-vitisai")
    light = (r"C:\Program Files\WindowsApps\WindowsWorkload.EP.AMD.VitisAI.Framework_1.0.0.0_x64__"
             r"8wekyb3d8bbwe\ExecutionProvider\onnxruntime_providers_ryzenai.dll")
    location = plugins.locate_vitisai(spec.plugin_ep, environ={plugins.VITISAI_ENV: light}, appx_json=None,
                                      ryzen_ai_files=[], is_file=lambda p: True)
    assert location.failure[0] is ReasonCode.EP_LIBRARY_WRONG
    assert "claims zero nodes from every graph" in location.failure[1]
    assert location.failure[2] == "point the route at onnxruntime_vitisai_ep.dll (in the same folder) instead"


def test_ep_registration_failed_not_a_plugin_library(tmp_path):
    """A real shared library without CreateEpFactories, registered by the current onnxruntime."""
    import numpy

    library = next(Path(numpy.__file__).parent.glob("_core/_multiarray_umath*.so"))
    route = _table(tmp_path, "numpy", f'library = "{library}"\nep_name = "numpy"\n')
    status = _resolve(route, tmp_path)
    assert status.reason_code is ReasonCode.EP_REGISTRATION_FAILED
    assert "undefined symbol: CreateEpFactories" in status.reason


def test_ep_dependency_not_loadable_is_tested_live():
    """ReasonCode.EP_DEPENDENCY_NOT_LOADABLE: tests/routes/test_plugin_ggml.py copies the ggml
    library away from the libgomp its RPATH names and registers it for real; the VitisAI form
    (Windows' "Error loading ... which depends on ...") is in tests/routes/test_plugin_vitisai.py."""
    assert "EP_DEPENDENCY_NOT_LOADABLE" in (Path(__file__).parent / "test_plugin_ggml.py").read_text()
