"""``ort-vitisai`` as the plugin-EP preset: every step of the recipe in docs/routes.md, on recorded inputs.

No machine here has an AMD NPU or Windows, so each step is tested as the pure function it is,
on inputs transcribed from the reported run on a Ryzen AI laptop that the recipe comes from and, for the
probe document, a real probe of this machine's interpreter with the facts named in each test
changed (a Windows python, onnxruntime 1.25, the EP's registration and devices). The route stays
``verified: false``.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest

from xstage.host.wsl import WslInfo
from xstage.routes import (
    HostInfo,
    InterpreterChoice,
    InterpreterSource,
    ReasonCode,
    evaluate,
    get_spec,
    plugins,
)
from xstage.routes.launch import load_options
from xstage.routes.probe import ProbeOutcome, ProbeRequest, run_probe
from xstage_remote import plugin_ep

WSL = HostInfo(platform="wsl", wsl=WslInfo(is_wsl=True, version=2, interop=True, distro="U"),
               cpu_vendor="amd")
SPEC = get_spec("ort-vitisai")
PY = "/mnt/c/Users/me/AppData/Local/xstage/envs/ort-vitisai/Scripts/python.exe"
APP = (r"C:\Program Files\WindowsApps\WindowsWorkload.EP.AMD.VitisAI.Framework_1.4.0.0_x64__"
       r"8wekyb3d8bbwe")
GENERAL = APP + r"\ExecutionProvider\onnxruntime_vitisai_ep.dll"
LIGHT = APP + r"\ExecutionProvider\onnxruntime_providers_ryzenai.dll"
#: What `Get-AppxPackage ... | Select-Object Name, Version, InstallLocation | ConvertTo-Json -Compress`
#: prints for one package (the shape PowerShell gives; the values are the issue's).
APPX = json.dumps({"Name": "WindowsWorkload.EP.AMD.VitisAI.Framework", "Version": "1.4.0.0",
                   "InstallLocation": APP})
NPU_ROW = {"ep_name": "VitisAIExecutionProvider", "ep_vendor": "AMD",
           "ep_metadata": {"version": "1.4"},
           "ep_options": {}, "device_type": "NPU", "device_vendor": "AMD", "device_vendor_id": 0x1022,
           "device_id": 0x17F0, "device_metadata": {"Description": "NPU Compute Accelerator Device"}}
CPU_ROW = {"ep_name": "CPUExecutionProvider", "ep_vendor": "Microsoft", "ep_metadata": {}, "ep_options": {},
           "device_type": "CPU", "device_vendor": "AuthenticAMD", "device_vendor_id": 0x1022, "device_id": 0,
           "device_metadata": {}}


def listing_denied(path: str) -> bool:
    """``WindowsApps`` as a normal process sees it: the general library by its full path only."""
    return path == GENERAL


@pytest.fixture(scope="module")
def real_probe():
    return run_probe(ProbeRequest(sys.executable)).data


def probe(real_probe, *, version="1.25.0", plugin=None, rows=(CPU_ROW, NPU_ROW)):
    data = copy.deepcopy(real_probe)
    data["python"].update(platform="win32", system="Windows")
    ort = data["onnxruntime"]
    ort["version"] = version
    ort["plugin_eps"] = {"ort-vitisai": plugin or {
        "ep_name": "VitisAIExecutionProvider", "requested_library": GENERAL, "library_path": GENERAL,
        "dll_directory": APP + r"\ExecutionProvider", "registered": True}}
    ort["ep_devices_after_plugins"] = [dict(r) for r in rows]
    return data


def judge(data, location=None):
    location = location or plugins.Location(GENERAL, (f"1. located: {GENERAL}",))
    choice = InterpreterChoice(PY, InterpreterSource.ENV_VAR, "XSTAGE_PYTHON_ORT_VITISAI")
    return evaluate(SPEC, choice, ProbeOutcome(ok=True, data=data), host=WSL, hardware=(), location=location)


# --------------------------------------------------------------------------- step 1: the library


def test_the_app_package_is_found_by_its_full_path_though_listing_is_denied():
    loc = plugins.locate_vitisai(SPEC.plugin_ep, environ={}, appx_json=APPX, ryzen_ai_files=[],
                                 is_file=listing_denied)
    assert loc.failure is None and loc.path == GENERAL
    assert loc.steps[:3] == ("1. XSTAGE_VITISAI_EP_LIBRARY: not set",
                             "2. [plugins.vitisai] library: not set",
                             f"3. Get-AppxPackage {plugins.APPX_PACKAGE}: {APP}")


def test_each_step_is_named_when_nothing_is_found():
    loc = plugins.locate_vitisai(SPEC.plugin_ep, environ={}, appx_json="", ryzen_ai_files=[],
                                 is_file=lambda p: False)
    code, reason, remedy = loc.failure
    assert code is ReasonCode.EP_LIBRARY_NOT_FOUND
    assert reason == ("the VitisAI EP library onnxruntime_vitisai_ep.dll was not found: "
                      "1. XSTAGE_VITISAI_EP_LIBRARY: not set; 2. [plugins.vitisai] library: not set; "
                      f"3. Get-AppxPackage {plugins.APPX_PACKAGE}: no such package; "
                      r"4. Ryzen AI (C:\Program Files\RyzenAI): no onnxruntime_vitisai_ep.dll")
    assert "XSTAGE_VITISAI_EP_LIBRARY" in remedy and "Ryzen AI Software" in remedy


def test_the_env_var_comes_first_and_ryzen_ai_last():
    environ = {plugins.VITISAI_ENV: r"D:\ep\onnxruntime_vitisai_ep.dll"}
    named = plugins.locate_vitisai(SPEC.plugin_ep, environ=environ, appx_json=APPX, ryzen_ai_files=[],
                                   is_file=lambda p: True)
    assert named.path == r"D:\ep\onnxruntime_vitisai_ep.dll"
    ryzen = r"C:\Program Files\RyzenAI\1.4.0\onnxruntime\bin\onnxruntime_vitisai_ep.dll"
    last = plugins.locate_vitisai(SPEC.plugin_ep, environ={}, appx_json="", ryzen_ai_files=[ryzen],
                                  is_file=lambda p: False)
    assert last.path == ryzen and last.steps[-1] == rf"4. Ryzen AI (C:\Program Files\RyzenAI): {ryzen}"


def test_a_table_names_the_library(tmp_path, trusted_toml):
    trusted_toml(tmp_path,
        '[plugins.vitisai]\nlibrary = "D:\\\\ep\\\\onnxruntime_vitisai_ep.dll"\n')
    (spec,) = [s for s in plugins.all_specs(cwd=tmp_path, environ={}) if s.name == "ort-vitisai"]
    assert spec.plugin_ep.library == r"D:\ep\onnxruntime_vitisai_ep.dll"
    loc = plugins.locate_vitisai(spec.plugin_ep, environ={}, appx_json=None, ryzen_ai_files=[],
                                 is_file=lambda p: True)
    assert loc.path == r"D:\ep\onnxruntime_vitisai_ep.dll" and "[plugins.vitisai] library" in loc.steps[-1]


def test_a_table_may_not_change_what_the_preset_fixes(tmp_path, trusted_toml):
    trusted_toml(tmp_path, '[plugins.vitisai]\nep_name = "Other"\n')
    (spec,) = [s for s in plugins.all_specs(cwd=tmp_path, environ={}) if s.name == "ort-vitisai"]
    assert "the built-in table vitisai takes only library, options, not ep_name" in spec.plugin_ep.error


# --------------------------------------------------------------------------- step 2: the general EP


def test_the_light_library_in_the_package_is_not_taken():
    def only_light(path: str) -> bool:
        return path == LIGHT

    loc = plugins.locate_vitisai(SPEC.plugin_ep, environ={}, appx_json=APPX, ryzen_ai_files=[],
                                 is_file=only_light)
    assert loc.failure[0] is ReasonCode.EP_LIBRARY_NOT_FOUND
    assert ("no onnxruntime_vitisai_ep.dll in its ExecutionProvider folder (only "
            "onnxruntime_providers_ryzenai.dll, the light EP)") in loc.steps[2]


def test_the_light_library_named_by_the_user_is_wrong(real_probe):
    loc = plugins.locate_vitisai(SPEC.plugin_ep, environ={plugins.VITISAI_ENV: LIGHT}, appx_json=None,
                                 ryzen_ai_files=[], is_file=lambda p: True)
    status = judge(probe(real_probe), loc)
    assert status.reason_code is ReasonCode.EP_LIBRARY_WRONG
    assert status.reason.endswith("then claims zero nodes from every graph")


# --------------------------------------------------------------------------- step 3: the search path


class _FakeOrt:
    __version__ = "1.25.0"

    def __init__(self, calls):
        self.calls = calls

    def register_execution_provider_library(self, name, path):
        self.calls.append(("register", name, path))


def test_the_folder_goes_on_the_search_path_before_registration(tmp_path, monkeypatch):
    """The worker's and the probe's code, with Windows' os.add_dll_directory recorded."""
    library = tmp_path / "ExecutionProvider" / "onnxruntime_vitisai_ep.dll"
    library.parent.mkdir()
    library.write_bytes(b"MZ")
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(plugin_ep.os, "add_dll_directory", lambda d: calls.append(("dll_dir", d)) or d,
                        raising=False)
    monkeypatch.setattr(plugin_ep, "_REGISTERED", {})
    monkeypatch.setattr(plugin_ep, "_DLL_HANDLES", [])
    info: dict = {}
    plugin_ep.register(_FakeOrt(calls), "VitisAIExecutionProvider", library=str(library), info=info)
    assert calls == [("dll_dir", str(library.parent)),
                     ("register", "VitisAIExecutionProvider", str(library))]
    assert info["dll_directory"] == str(library.parent)


def test_a_dependency_missing_from_beside_it_is_named(real_probe):
    """What onnxruntime says when the library's folder is not on the search path (the issue's
    "Error loading … But no dependency")."""
    error = (f'Fail: [ONNXRuntimeError] : 1 : FAIL : Error loading "{GENERAL}" which depends on '
             '"dyn_dispatch_core.dll" which is missing. '
             '(Error 126: "The specified module could not be found.")')
    status = judge(probe(real_probe, plugin={"ep_name": "VitisAIExecutionProvider", "library_path": GENERAL,
                                             "registered": False, "step": "register", "error": error}))
    assert status.reason_code is ReasonCode.EP_DEPENDENCY_NOT_LOADABLE
    assert "dyn_dispatch_core.dll" in status.reason
    assert status.steps[-1].startswith("register: ")


# --------------------------------------------------------------------------- step 4: onnxruntime >= 1.25


def test_onnxruntime_1_24_cannot_carry_it(real_probe):
    status = judge(probe(real_probe, version="1.24.4"))
    assert status.reason_code is ReasonCode.RUNTIME_VERSION_UNSUPPORTED
    assert ("is too old for VitisAIExecutionProvider: needs >= 1.25 (the VitisAI EP library requests "
            "ORT API 25") in status.reason
    assert status.remedy == "use a separate interpreter with onnxruntime>=1.25: xstage env create ort-vitisai"


# --------------------------------------------------------------------------- step 5: NPU EP devices


def test_no_npu_ep_device_is_ep_no_device(real_probe):
    gpu = dict(NPU_ROW, device_type="GPU", device_id=0x150E)
    status = judge(probe(real_probe, rows=(CPU_ROW, gpu)))
    assert status.reason_code is ReasonCode.EP_NO_DEVICE
    assert "lists no NPU device of vendor amd" in status.reason
    assert "VitisAIExecutionProvider GPU (vendor AMD)" in status.reason


def test_the_npu_ep_device_is_bound(real_probe):
    status = judge(probe(real_probe))
    assert status.resolved and status.devices == ("npu:amd",)
    options = load_options(status, fmt="onnx:a16w8", profile=True)
    plugin = options["ep"]["plugin"]
    assert plugin["library"] == GENERAL and plugin["dll_dir"] is True and plugin["report"] == "vitisai"
    assert plugin["select"]["device_type"] == "NPU" and plugin["select"]["vendor_id"] == 0x1022
    assert options["ep"]["name"] == "VitisAIExecutionProvider"


# --------------------------------------------------------------------------- step 6: A16W8 only


def test_only_a16w8_is_run_and_fp32_is_noted():
    assert SPEC.formats == ("onnx:a16w8",)
    notes = SPEC.ep_hook({}, "onnx:fp32", "npu:amd", {})
    assert notes[0] == "VitisAI on XDNA2 declines onnx:fp32 graphs (only A16W8 is taken): expect a refusal"


# --------------------------------------------------------------------------- env create


def test_env_create_says_what_must_be_installed_besides():
    from xstage.routes import envs

    plan = envs.plan("ort-vitisai", host_platform="wsl", cpu_vendor="amd")
    assert plan.action == "powershell" and plan.packages == ("onnxruntime>=1.25", "numpy")
    assert "onnxruntime_vitisai_ep.dll" in plan.message and plugins.APPX_PACKAGE in plan.message
    assert plugins.VITISAI_ENV in plan.message
