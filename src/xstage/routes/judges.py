"""The runtime judges: given a probe of a route's interpreter, is its runtime there and which
devices does it drive?

One judge per runtime (``JUDGES``), each split by the checks it makes in order: the runtime
imports, its version suits the EP, the EP (a plugin's EP devices, or a built-in provider)
lists devices. What differs between routes of one runtime is read from the spec
(``devices_from``, ``assumed_devices``, ``min_runtime``/``max_runtime``, ``plugin_module``,
``backend_module``), never from its name. Pure: no processes, no files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xstage.host import hardware as hw
from xstage.host.info import HostInfo
from xstage.routes.specs import RouteSpec
from xstage.routes.status import InterpreterChoice, InterpreterSource, ReasonCode

__all__ = ["JUDGES", "Judge", "Verdict", "fail", "judge_onnxruntime", "judge_plugin_ep", "judge_torch"]


def _vt(version: str | None) -> tuple[int, ...]:
    """``1.24.1`` → (1, 24, 1); ``1.25.0.dev20250101`` → (1, 25, 0); junk → ()."""
    parts = []
    for piece in (version or "").split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


@dataclass
class Verdict:
    """A judge's answer: a failure (code, reason, remedy), or the devices and how to open them."""

    code: ReasonCode | None = None
    reason: str = ""
    remedy: str = ""
    devices: list[str] = field(default_factory=list)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    ep_plugin: dict[str, Any] | None = None
    steps: list[str] = field(default_factory=list)


def fail(code: ReasonCode, reason: str, remedy: str) -> Verdict:
    """A failed check, as a verdict."""
    return Verdict(code=code, reason=reason, remedy=remedy)


def _install_remedy(
    spec: RouteSpec, choice: InterpreterChoice, what: str, host: HostInfo | None = None
) -> str:
    if spec.runtime == "onnxruntime" and what != "onnxruntime":
        variant, _ = spec.default_variant(host.cpu_vendor if host else "unknown")
        what = " ".join(spec.packages[variant])
    if choice.source in (InterpreterSource.CURRENT, InterpreterSource.ROUTE_ENV):
        if spec.runtime == "torch" and not spec.backend_module:  # a plain torch: pin one
            return (
                f"install {what} into {choice.path} (`{choice.path} -m pip install torch==<version>`), "
                f"or build a separate env: `xstage env create {spec.name} --pin torch==<version>`"
            )
        return f"xstage env create {spec.name}" + (
            " --force" if choice.source == InterpreterSource.ROUTE_ENV else ""
        )
    return (
        f"install {what} into {choice.path} (set by {choice.origin}), or point that at another "
        f"interpreter, or remove it and run `xstage env create {spec.name}`"
    )


def _ep_device_id(row: Mapping[str, Any], hardware: Sequence[hw.Device], taken: set[str]) -> str | None:
    """A concrete device id for one EP device, matched to a hardware row where possible."""
    kind = str(row.get("device_type", "")).upper()
    if kind == "CPU":
        return "cpu"
    vendor = (
        hw.vendor_from_id(row.get("device_vendor_id"))
        or hw.vendor_from_name(row.get("device_vendor"))
        or f"{int(row.get('device_vendor_id') or 0):04x}"
    )
    if kind == "GPU":
        for dev in hardware:
            if dev.kind.startswith("gpu") and dev.vendor == vendor and dev.id not in taken:
                return dev.id
        return f"gpu_integrated:{vendor}"
    if kind == "NPU":
        return f"npu:{vendor}"
    return None


def _intel_gpu_id(index: int, hardware: Sequence[hw.Device]) -> str:
    gpus = sorted(
        (d for d in hardware if d.kind.startswith("gpu") and d.vendor == "intel"),
        key=lambda d: (d.kind != "gpu_integrated", d.id),
    )
    if index < len(gpus):
        return gpus[index].id
    return "gpu_integrated:intel" if index == 0 else f"gpu_discrete:intel:{index - 1}"


def _openvino_builtin(
    ort: Mapping[str, Any], hardware: Sequence[hw.Device]
) -> tuple[list[str], dict[str, Any]]:
    """Devices of the built-in OpenVINO EP, from the device types it says it can open."""
    devices: list[str] = []
    options: dict[str, Any] = {}
    for name in ort.get("openvino_device_ids") or []:
        upper = str(name).upper()
        if upper == "CPU":
            dev = "cpu"
        elif upper.startswith("GPU"):
            index = int(upper.split(".", 1)[1]) if "." in upper and upper.split(".", 1)[1].isdigit() else 0
            dev = _intel_gpu_id(index, hardware)
        elif upper.startswith("NPU"):
            dev = "npu:intel"
        else:
            continue
        if dev not in options:
            devices.append(dev)
            options[dev] = {"device_type": str(name)}
    return devices, options


def _hardware_for(spec: RouteSpec, hardware: Sequence[hw.Device]) -> list[hw.Device]:
    return [d for d in hardware if d.kind != "cpu" and spec.can_drive(d.kind, d.vendor)]


def _torch_device_id(row: Mapping[str, Any], torch: Mapping[str, Any], hardware: Sequence[hw.Device]) -> str:
    vendor = "amd" if torch.get("hip_version") else "nvidia"
    pci = row.get("pci")
    if isinstance(pci, Mapping):
        address = (
            f"{int(pci.get('domain', 0)):04x}:{int(pci.get('bus', 0)):02x}:{int(pci.get('device', 0)):02x}.0"
        )
        for dev in hardware:
            if dev.pci_address == address:
                return dev.id
    return f"gpu_discrete:{vendor}:{int(row.get('index', 0))}"


# ---------------------------------------------------------------------------- onnxruntime


def _build_label(ort: Mapping[str, Any]) -> str:
    """``onnxruntime 1.24.1``, with its distributions when it is not plain onnxruntime."""
    dist_map = ort.get("distributions") or {}
    dists = ", ".join(f"{k} {v}" for k, v in sorted(dist_map.items())) or "onnxruntime"
    return f"onnxruntime {ort.get('version')}" + ("" if set(dist_map) <= {"onnxruntime"} else f" ({dists})")


def _version_refusal(spec: RouteSpec, version: str, build: str, where: str | None) -> Verdict | None:
    """The runtime is too old or too new for the spec's EP (``min_runtime``/``max_runtime``)."""
    note = f" ({spec.version_note})" if spec.version_note else ""
    if spec.min_runtime and _vt(version) < _vt(spec.min_runtime):
        return fail(
            ReasonCode.RUNTIME_VERSION_UNSUPPORTED,
            f"{build} at {where} is too old for {spec.ep}: needs >= {spec.min_runtime}{note}",
            f"use a separate interpreter with onnxruntime>={spec.min_runtime}: xstage env create {spec.name}",
        )
    if spec.max_runtime and _vt(version) >= _vt(spec.max_runtime):
        return fail(
            ReasonCode.RUNTIME_VERSION_UNSUPPORTED,
            f"{build} at {where} is too new for {spec.ep}: it ships only below {spec.max_runtime}{note}",
            f"use a separate interpreter with {', '.join(spec.packages[spec.variants[0]])}: "
            f"xstage env create {spec.name}",
        )
    return None


def _plugin_verdict(
    spec: RouteSpec,
    plugin: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    hardware: Sequence[hw.Device],
) -> Verdict:
    """A registered plugin EP's devices, each with the EP-device selector a worker binds."""
    verdict = Verdict()
    taken: set[str] = set()
    selectors: dict[str, Any] = {}
    for row in rows:
        dev = _ep_device_id(row, hardware, taken)
        if dev is None or dev in taken:
            continue
        taken.add(dev)
        verdict.devices.append(dev)
        selectors[dev] = {
            "device_type": row.get("device_type"),
            "vendor_id": row.get("device_vendor_id"),
            "device_id": row.get("device_id"),
            "ep_metadata": row.get("ep_metadata"),
        }
        verdict.details[dev] = {"ep_device": dict(row)}
    verdict.ep_plugin = {
        "kind": "plugin",
        "ep_name": spec.ep,
        "module": spec.plugin_module,
        "registration_name": plugin.get("registration_name"),
        "library_path": plugin.get("library_path"),
        "version": plugin.get("version"),
        "devices": selectors,
        "options": dict(spec.ep_options),
    }
    return verdict


def _builtin_devices(
    spec: RouteSpec, ort: Mapping[str, Any], data: Mapping[str, Any], hardware: Sequence[hw.Device]
) -> tuple[list[str], dict[str, Any]]:
    """The devices a built-in provider drives, found the way the spec says (``devices_from``)."""
    if spec.devices_from == "cpu":
        return ["cpu"], {}
    if spec.devices_from == "openvino_device_ids":
        return _openvino_builtin(ort, hardware)
    devices: list[str] = []
    taken: set[str] = set()
    for row in ort.get("ep_devices") or []:
        if row.get("ep_name") != spec.ep:
            continue
        dev = _ep_device_id(row, hardware, taken)
        if dev and dev not in taken:
            taken.add(dev)
            devices.append(dev)
    if not devices and spec.assumed_devices:
        machine = (data.get("python") or {}).get("machine", "")
        devices = list(spec.assumed_devices.get(machine, ()))
    if not devices:
        devices = [d.id for d in _hardware_for(spec, hardware)]
    return devices, {}


def _builtin_verdict(
    spec: RouteSpec, ort: Mapping[str, Any], data: Mapping[str, Any], hardware: Sequence[hw.Device],
    build: str, where: str | None,
) -> Verdict:
    """A built-in provider: its devices and per-device options, or ``ep_no_device``."""
    devices, per_device = _builtin_devices(spec, ort, data, hardware)
    if not devices:
        found = ", ".join(f"{d.id}" for d in hardware) or "nothing"
        classes = " or ".join(f"{k}{':' + v if v else ''}" for k, v in spec.drives)
        extra = ""
        if spec.devices_from == "openvino_device_ids":
            extra = f"; get_available_openvino_device_ids() = {ort.get('openvino_device_ids')}"
        return fail(
            ReasonCode.EP_NO_DEVICE,
            f"{spec.ep} is in {build} at {where}, but no {classes} device it "
            f"drives was found (this machine shows: {found}){extra}",
            "run on a machine with such a device, or check its driver (`xstage devices --refresh`)",
        )
    return Verdict(
        devices=devices,
        details={d: {"ep_options": per_device.get(d, {})} for d in devices},
        ep_plugin={"kind": "builtin", "ep_name": spec.ep, "options": dict(spec.ep_options),
                   "device_options": per_device},
    )


def _identity_verdict(spec: RouteSpec, ort: Mapping[str, Any], hardware: Sequence[hw.Device],
                      build: str, where: str | None) -> Verdict:
    """A built-in EP that picks its adapter by index (DirectML): each EP device's adapter matched
    to an xstage device by identity (``xstage.host.adapters``) and bound through the EP-device API;
    never ``device_id=0`` by default."""
    from xstage.host.adapters import adapters_from_ep_devices, match_adapters

    rows = [r for r in ort.get("ep_devices") or [] if r.get("ep_name") == spec.ep]
    adapters, skipped = adapters_from_ep_devices(rows, spec.ep or "")
    gpus = [d for d in hardware if d.kind.startswith("gpu") and spec.can_drive(d.kind, d.vendor)]
    if not rows and len(gpus) == 1:  # no EP-device API here: one adapter cannot be mistaken
        only = gpus[0].id
        return Verdict(devices=[only], details={only: {"ep_options": {"device_id": "0"}, "adapter": {
            "description": gpus[0].name, "matched_by": "the only GPU adapter of this machine"}}},
            ep_plugin={"kind": "builtin", "ep_name": spec.ep, "options": dict(spec.ep_options),
                       "device_options": {only: {"device_id": "0"}}},
            steps=[f"{build} lists no {spec.ep} EP devices; {only} is this machine's only GPU: device_id=0"])
    if not adapters:
        why = "; ".join(skipped) or f"{build} lists no {spec.ep} EP device (it needs onnxruntime >= 1.23)"
        return fail(ReasonCode.EP_NO_DEVICE,
                    f"{spec.ep} is in {build} at {where}, but which DXGI adapter is which device cannot be "
                    f"told ({why}); this machine shows {len(gpus)} GPUs, so device_id=0 would be a guess",
                    "an onnxruntime-directml whose get_ep_devices() lists DmlExecutionProvider devices "
                    "(>= 1.23): xstage env create ort-dml --force")
    matches, unmatched = match_adapters(adapters, hardware)
    if not matches:
        return fail(ReasonCode.EP_NO_DEVICE,
                    f"{spec.ep} lists adapters at {where}, but none matches one device of this machine: "
                    + "; ".join(unmatched), "xstage devices --refresh; check the GPU drivers")
    verdict = Verdict(ep_plugin={"kind": "ep_device", "ep_name": spec.ep, "options": dict(spec.ep_options),
                                 "devices": {}, "adapters": {}})
    assert verdict.ep_plugin is not None
    for match in matches:
        adapter = match.adapter
        verdict.devices.append(match.device)
        verdict.ep_plugin["devices"][match.device] = {
            "device_type": "GPU", "vendor_id": adapter.vendor_id, "device_id": adapter.device_id,
            "device_metadata": {"DxgiAdapterNumber": str(adapter.dxgi_index)}}
        identity = {**adapter.identity(), "matched_by": match.how}
        verdict.ep_plugin["adapters"][match.device] = identity
        verdict.details[match.device] = {"adapter": identity, "ep_device": dict(adapter.row)}
        verdict.steps.append(f"{match.device}: {adapter.description} (DXGI adapter {adapter.dxgi_index}, "
                             f"PCI {adapter.pci_id}), matched by {match.how}")
    verdict.steps += [f"left out: {why}" for why in [*skipped, *unmatched]]
    return verdict


def _plugin_lists_nothing(
    spec: RouteSpec, plugin: Mapping[str, Any], after: Sequence[Mapping[str, Any]], version: str,
    where: str | None, host: HostInfo,
) -> Verdict:
    """A plugin registered but listed no device of its EP (the OpenVINO plugin on an AMD CPU)."""
    listed = ", ".join(
        f"{r.get('ep_name')} ({r.get('device_type')}, vendor {r.get('device_vendor')})" for r in after
    )
    cpu_vendor = (
        next((r.get("device_vendor") for r in after if str(r.get("device_type")).upper() == "CPU"), None)
        or host.cpu_vendor
    )
    remedy = (
        f"use the built-in EP: xstage env create {spec.name} --variant builtin"
        if "builtin" in spec.packages
        else "run on a machine with a device this EP supports"
    )
    return fail(
        ReasonCode.EP_NO_DEVICE,
        f"the plugin {spec.plugin_module} {plugin.get('version') or ''} registered with onnxruntime "
        f"{version} at {where}, but listed no {spec.ep} device for this CPU (vendor {cpu_vendor}); "
        f"get_ep_devices() lists only: {listed or 'nothing'}",
        remedy,
    )


def _not_in_build(
    spec: RouteSpec, choice: InterpreterChoice, plugin: Mapping[str, Any] | None, providers: Sequence[str],
    build: str, host: HostInfo, hardware: Sequence[hw.Device],
) -> Verdict:
    """Neither the build nor a plugin provides the EP: ``ep_not_in_build``, with what to install."""
    where = choice.path
    reason = f"{spec.ep} is not in {build} at {where} (it has: {', '.join(providers) or 'none'})"
    if plugin is not None:
        if plugin.get("importable"):
            reason += (
                f"; the plugin {spec.plugin_module} is there but did not register: {plugin.get('error')}"
            )
        else:
            reason += f"; the plugin package {spec.plugin_module} is not importable there"
    remedy = _install_remedy(spec, choice, spec.ep or "the EP", host)
    if "cpu" not in spec.device_classes and not _hardware_for(spec, hardware):
        # Say so now rather than after a download: the next answer would be ep_no_device.
        classes = " or ".join(f"{k}{':' + v if v else ''}" for k, v in spec.drives)
        remedy += f" (on a machine with a {classes} device: this one shows none)"
    return fail(ReasonCode.EP_NOT_IN_BUILD, reason, remedy)


def judge_onnxruntime(
    spec: RouteSpec,
    choice: InterpreterChoice,
    data: Mapping[str, Any],
    host: HostInfo,
    hardware: Sequence[hw.Device],
) -> Verdict:
    """onnxruntime imports, suits the EP's version bounds, and its EP (plugin first, then a
    built-in provider) drives at least one device here."""
    ort = data.get("onnxruntime") or {}
    where = choice.path
    if not ort.get("importable"):
        return fail(
            ReasonCode.RUNTIME_NOT_IMPORTABLE,
            f"onnxruntime is not importable by {where}: {ort.get('error', 'unknown error')}",
            _install_remedy(spec, choice, "onnxruntime"),
        )
    version = str(ort.get("version"))
    build = _build_label(ort)
    refusal = _version_refusal(spec, version, build, where)
    if refusal is not None:
        return refusal
    providers = list(ort.get("providers") or [])
    plugin = (ort.get("plugins") or {}).get(spec.plugin_module) if spec.plugin_module else None
    after = ort.get("ep_devices_after_plugins") or []
    registered = bool(plugin and plugin.get("registered"))
    plugin_rows = [r for r in after if r.get("ep_name") == spec.ep] if registered else []
    if plugin is not None and plugin_rows:
        return _plugin_verdict(spec, plugin, plugin_rows, hardware)
    if spec.ep in providers and spec.adapter_by_identity:
        return _identity_verdict(spec, ort, hardware, build, where)
    if spec.ep in providers:
        return _builtin_verdict(spec, ort, data, hardware, build, where)
    if plugin is not None and registered:
        return _plugin_lists_nothing(spec, plugin, after, version, where, host)
    return _not_in_build(spec, choice, plugin, providers, build, host, hardware)


# ---------------------------------------------------------------------------- plugin EPs


def _row_vendor(row: Mapping[str, Any]) -> str:
    return (hw.vendor_from_id(row.get("device_vendor_id")) or hw.vendor_from_name(row.get("device_vendor"))
            or f"{int(row.get('device_vendor_id') or 0):04x}")


def _row_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('ep_name')} {row.get('device_type')} (vendor {row.get('device_vendor')})"


def _registration_failed(spec: RouteSpec, report: Mapping[str, Any], library: Any, where: str,
                         version: str, build: str) -> Verdict:
    """Steps 3-4 failed: the registration error classified (a dependency not loadable, the
    library gone, or an onnxruntime the EP was not built for), with the remedy for that cause."""
    from xstage.routes.plugins import classify_registration_error

    error = str(report.get("error") or "no error reported")
    code = classify_registration_error(error, library)
    folder = str(report.get("dll_directory") or "its folder")
    remedy = {
        ReasonCode.EP_DEPENDENCY_NOT_LOADABLE:
            f"install what {library} depends on (the libraries it loads must be beside it, in "
            f"{folder}, or on the search path); the message above names the one missing",
        ReasonCode.EP_LIBRARY_NOT_FOUND: f"check that {library} exists and is readable",
    }.get(code, f"the onnxruntime in {where} ({version}) could not register it: use the version the "
                f"EP was built for ({', '.join(spec.packages[spec.variants[0]][:1])})")
    return fail(code, f"registering {library} with {build} at {where} failed: {error}", remedy)


def judge_plugin_ep(
    spec: RouteSpec,
    choice: InterpreterChoice,
    data: Mapping[str, Any],
    host: HostInfo,
    hardware: Sequence[hw.Device],
    location: Any = None,
) -> Verdict:
    """A plugin EP of the ``ort-plugin:`` family (``ort-vitisai`` too), step by step.

    onnxruntime imports and suits the version bounds (step 4); the library was located (step 1,
    ``location``: a ``plugins.Location`` from the client, or the probe's answer for a table
    that names a package) and is not a known wrong one (step 2); it registered (steps 3-4:
    ``ep_dependency_not_loadable``, ``ep_registration_failed``); it lists EP devices of the
    table's hardware type and vendor (step 5, ``ep_no_device``). The verdict's ``ep_plugin``
    says what the worker binds (step 6) and ``steps`` what each step found.
    """
    from xstage.routes.plugins import wrong_library

    plugin = spec.plugin_ep
    assert plugin is not None
    steps: list[str] = list(getattr(location, "steps", ()) or ())
    ort = data.get("onnxruntime") or {}
    where = choice.path
    if not ort.get("importable"):
        return fail(ReasonCode.RUNTIME_NOT_IMPORTABLE,
                    f"onnxruntime is not importable by {where}: {ort.get('error', 'unknown error')}",
                    _install_remedy(spec, choice, "onnxruntime"))
    version = str(ort.get("version"))
    build = _build_label(ort)
    refusal = _version_refusal(spec, version, build, where)
    if refusal is not None:
        refusal.steps = steps + [f"onnxruntime {version}: {refusal.reason}"]
        return refusal
    failure = getattr(location, "failure", None)
    if failure is not None:
        verdict = fail(*failure)
        verdict.steps = steps
        return verdict
    reports = ort.get("plugin_eps") or {}
    report = reports.get(spec.name) or reports.get(plugin.ep_name) or {}

    def failed(code: ReasonCode, reason: str, remedy: str) -> Verdict:
        verdict = fail(code, reason, remedy)
        verdict.steps = steps
        return verdict

    if not report:
        return failed(ReasonCode.EP_LIBRARY_NOT_FOUND, f"the probe of {where} did not try {plugin.ep_name}",
                      "xstage devices --refresh")
    library = report.get("library_path")
    origin = (f"the package {plugin.module} {report.get('version') or ''}".rstrip() if plugin.module
              else "the table's library" if plugin.locate == "table" else "the locator")
    if report.get("step") == "locate":
        steps.append(f"locate: {report.get('error')}")
        remedy = (_install_remedy(spec, choice, plugin.module or "the EP package", host) if plugin.module
                  else f"fix library under [plugins.{plugin.table}] in {plugin.source}")
        return failed(ReasonCode.EP_LIBRARY_NOT_FOUND,
                      f"{plugin.ep_name}'s library was not found at {where}: {report.get('error')}", remedy)
    steps.append(f"located: {library} ({origin})")
    wrong = wrong_library(plugin, str(library or ""))
    if wrong is not None:
        return failed(*wrong)
    if report.get("dll_directory"):
        steps.append(f"search path: {report['dll_directory']} added before registering")
    elif plugin.dll_dir:
        steps.append("search path: not needed here (no os.add_dll_directory: not Windows)")
    if report.get("step") == "register" or not report.get("registered"):
        verdict = _registration_failed(spec, report, library, where, version, build)
        steps.append(f"register: {report.get('error') or 'no error reported'}")
        verdict.steps = steps
        return verdict
    steps.append(f"registered: {plugin.ep_name} with onnxruntime {version}")
    after = ort.get("ep_devices_after_plugins") or []
    own = [r for r in after if r.get("ep_name") == plugin.ep_name]
    fits = [r for r in own if str(r.get("device_type", "")).upper() == plugin.device_type
            and (plugin.vendor is None or _row_vendor(r) == plugin.vendor)]
    steps.append(f"EP devices: {', '.join(_row_label(r) for r in own) or 'none'}; "
                 f"wanted {plugin.device_type}" + (f" of vendor {plugin.vendor}" if plugin.vendor else ""))
    if not fits:
        listed = ", ".join(_row_label(r) for r in after) or "nothing"
        of_vendor = f" of vendor {plugin.vendor}" if plugin.vendor else ""
        return failed(ReasonCode.EP_NO_DEVICE,
                      f"{plugin.ep_name} registered from {library} with onnxruntime {version} at {where}, "
                      f"but lists no {plugin.device_type} device{of_vendor}; get_ep_devices() lists: "
                      f"{listed}",
                      "run on a machine with such a device (and its driver), or change device_type/vendor "
                      f"under [plugins.{plugin.table}]")
    verdict = _plugin_verdict(spec, {"registration_name": plugin.ep_name, "library_path": library,
                                     "version": report.get("version")}, fits, hardware)
    assert verdict.ep_plugin is not None
    verdict.ep_plugin.update({"library": library, "module": None, "dll_dir": plugin.dll_dir,
                              "report": plugin.report, "table": plugin.table, "onnxruntime": version})
    for dev in verdict.devices:
        verdict.ep_plugin["devices"][dev]["vendor"] = plugin.vendor
    steps.append(f"bind: add_provider_for_devices with the EP device of {', '.join(verdict.devices)}")
    verdict.steps = steps
    return verdict


# ---------------------------------------------------------------------------- torch


def _torch_cpu(spec: RouteSpec, torch: Mapping[str, Any], where: str | None,
               hardware: Sequence[hw.Device]) -> Verdict:
    """The host CPU: torch imports, so it drives it."""
    return Verdict(devices=["cpu"])


def _torch_cuda(spec: RouteSpec, torch: Mapping[str, Any], where: str | None,
                hardware: Sequence[hw.Device]) -> Verdict:
    """``torch.cuda``: available, and its devices matched to hardware rows by PCI address."""
    version = torch.get("version")
    if not torch.get("cuda_available"):
        why = ""
        if not torch.get("cuda_version") and not torch.get("hip_version"):
            why = " (a CPU-only build: torch.version.cuda is None)"
        nvidia = [d.id for d in hardware if d.vendor == "nvidia"]
        seen = (
            f"; this machine shows NVIDIA GPUs {', '.join(nvidia)}"
            if nvidia
            else "; no NVIDIA GPU was found here"
        )
        if torch.get("cuda_error"):
            why += f" ({torch['cuda_error']})"
        return fail(
            ReasonCode.DEVICE_NOT_AVAILABLE,
            f"torch {version} imports at {where} but torch.cuda.is_available() is False{why}{seen}",
            f"point {spec.env_var} at an interpreter with a CUDA build of torch on a machine with "
            "an NVIDIA GPU and driver",
        )
    verdict = Verdict()
    for row in torch.get("cuda_devices") or []:
        dev = _torch_device_id(row, torch, hardware)
        verdict.devices.append(dev)
        verdict.details[dev] = {
            "name": row.get("name"),
            "memory_bytes": row.get("total_memory"),
            "available_bytes": row.get("free_memory"),
            "torch_index": row.get("index"),
        }
    return verdict


def _torch_directml(spec: RouteSpec, torch: Mapping[str, Any], where: str | None,
                    hardware: Sequence[hw.Device]) -> Verdict:
    """The backend module's adapters, each matched to a GPU row of its vendor."""
    backend = torch.get(spec.backend_module or "") or {}
    adapters = backend.get("adapters") or []
    if not adapters:
        return fail(
            ReasonCode.DEVICE_NOT_AVAILABLE,
            f"{spec.backend_module} imports at {where} but lists no adapter"
            + (f" ({backend['error']})" if backend.get("error") else ""),
            "check the GPU driver on Windows and that /dev/dxg exists in WSL",
        )
    verdict = Verdict()
    for adapter in adapters:
        vendor = hw.vendor_from_name(adapter.get("name")) or "unknown"
        match = next(
            (
                d.id
                for d in hardware
                if d.kind.startswith("gpu") and d.vendor == vendor and d.id not in verdict.devices
            ),
            f"gpu_integrated:{vendor}",
        )
        if match not in verdict.devices:
            verdict.devices.append(match)
            verdict.details[match] = {"name": adapter.get("name"), "torch_index": adapter.get("index")}
    return verdict


_TORCH_DEVICES: dict[str, Callable[..., Verdict]] = {
    "cpu": _torch_cpu,
    "cuda": _torch_cuda,
    "directml_adapters": _torch_directml,
}


def judge_torch(
    spec: RouteSpec,
    choice: InterpreterChoice,
    data: Mapping[str, Any],
    host: HostInfo,
    hardware: Sequence[hw.Device],
) -> Verdict:
    """torch imports, so does the spec's backend module, and the device the spec names
    (``devices_from``) is there."""
    torch = data.get("torch")
    where = choice.path
    if not torch or not torch.get("importable"):
        error = (torch or {}).get("error", "the probe did not try torch")
        return fail(
            ReasonCode.RUNTIME_NOT_IMPORTABLE,
            f"torch is not importable by {where}: {error}",
            _install_remedy(spec, choice, "torch"),
        )
    if spec.backend_module:
        backend = torch.get(spec.backend_module) or {}
        if not backend.get("importable"):
            return fail(
                ReasonCode.BACKEND_NOT_IMPORTABLE,
                f"torch {torch.get('version')} imports at {where} but {spec.backend_module} does not: "
                f"{backend.get('error', 'not probed')}",
                f"xstage env create {spec.name} ({spec.version_note}, so it needs an interpreter of its own)",
            )
    finder = _TORCH_DEVICES.get(spec.devices_from)
    if finder is None:
        return fail(
            ReasonCode.DEVICE_NOT_AVAILABLE, f"unknown torch device {spec.torch_device!r}", "fix the spec"
        )
    return finder(spec, torch, where, hardware)


Judge = Callable[[RouteSpec, InterpreterChoice, Mapping[str, Any], HostInfo, Sequence[hw.Device]], Verdict]

#: The judge of each runtime (``RouteSpec.runtime``).
JUDGES: dict[str, Judge] = {"onnxruntime": judge_onnxruntime, "torch": judge_torch}
