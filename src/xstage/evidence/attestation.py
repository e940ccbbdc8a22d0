"""Device attestation (docs/design.md §5, layer 3; conflict case (c)): which device did the work. Pure.

The proof's other layers say which *EP* ran a stage; this one says which *device* that EP ran
it on. The worker reports what it can, and :func:`attest` takes the strongest report, in order:

1. ``runtime``: the runtime's own report of where the work ran — the torch tensors' and
   kernels' device, the CPU EP (it has no other device), or OpenVINO's own warning that it
   recompiled the model on its CPU plugin ("Model compilation failed at OV NPU. Falling back
   to OV CPU for execution": the EP's internal CPU fallback, which onnxruntime-openvino has no
   EP-scoped switch for — ``session.disable_cpu_ep_fallback`` also forbids onnxruntime's CPU
   EP for the nodes the EP leaves — so it is detected here, not disabled).
   Also the GPU memory the worker's own process holds, as the driver lists it (NVML, by PCI
   address): the one GPU it is on is the GPU that ran it; a process on several GPUs attests
   none of them (``unmeasured``).
2. ``ep_device_api``: the EP device the session was bound to through onnxruntime's EP-device
   API (``add_provider_for_devices``, ORT >= 1.23): its hardware type and vendor, and its PCI
   address where it lists one (a different address than the planned device's is a mismatch).
   An EP that picks its physical adapter itself (WebGPU: "accepts one EP device and selects
   the physical GPU independently") is attested by it only in class and vendor: the record says
   ``adapter: unattested``, and with several GPUs of that model the stage is ``unmeasured``.
3. ``options_as_applied``: the EP options the worker handed the EP — OpenVINO's
   ``device_type``, a GPU EP's ``device_id`` — where the EP binds by them (a route whose
   spec says ``device_id_picks_gpu``, with the GPU vendor of its spec).
4. ``unattested``: none of these.

:func:`judge` turns the attestation into the proof's answer: ``device_mismatch`` when the
observed device class (and vendor, where both are known) is not the planned one;
``unmeasured`` when nothing attests a device other than the CPU (on the CPU it is allowed and
recorded); None when the planned device is attested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FALLBACK_MARK", "SOURCES", "Attestation", "Source", "attest", "device_class",
           "judge", "openvino_devices"]

Source = Literal["runtime", "ep_device_api", "options_as_applied", "unattested"]
#: The attestation sources, strongest first.
SOURCES: tuple[Source, ...] = ("runtime", "ep_device_api", "options_as_applied", "unattested")
#: OpenVINO EP's warning when it recompiles an NPU model on its CPU plugin (backend_manager.cc).
FALLBACK_MARK = "Falling back to OV CPU"

_CPU_EP = "CPUExecutionProvider"
#: EPs that bind an EP device but choose the physical adapter themselves.
_OWN_ADAPTER = frozenset({"WebGpuExecutionProvider"})
_TORCH_CLASS = {"cpu": "cpu", "cuda": "gpu", "privateuseone": "gpu", "xpu": "gpu", "mps": "gpu"}


@dataclass(frozen=True)
class Attestation:
    """Which device the stage was planned on, which one was observed, and what says so.

    Attributes:
        planned: the xstage device id the plan chose (``gpu_integrated:intel``, ``cpu``).
        observed: the device observed, as ``<class>``, ``<class>:<vendor>`` or
            ``<class>:<vendor>:<index>`` (``cpu``, ``gpu:intel``, ``gpu:nvidia:1``;
            ``gpu_integrated:amd`` where the bound EP device says which GPU class it is), several
            joined by commas; None when unattested.
        source: ``runtime``, ``ep_device_api``, ``options_as_applied`` or ``unattested``.
        detail: what the observation rests on, for people (the raw value reported).
        ep_device: the EP device the session was bound to, as the worker reported it (which
            library, type, vendor, vendor and device id, EP and device metadata, onnxruntime),
            where it bound one; None otherwise.
        adapter: ``attested`` when the physical GPU is known (the worker's own memory on it,
            or an EP that binds the adapter it lists), ``unattested`` when the EP picks its
            adapter itself and nothing else says which; None where no GPU adapter is involved.
        ambiguous: the planned device has identical twins (same vendor and PCI id), so class
            and vendor alone cannot say which of them ran it.
    """

    planned: str
    observed: str | None
    source: Source
    detail: str
    ep_device: Mapping[str, Any] | None = None
    adapter: Literal["attested", "unattested"] | None = None
    ambiguous: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The record's ``device_attestation`` block (``ep_device`` only where one was bound)."""
        out: dict[str, Any] = {"planned": self.planned, "observed": self.observed, "source": self.source,
                               "detail": self.detail}
        if self.ep_device is not None:
            out["ep_device"] = dict(self.ep_device)
        if self.adapter is not None:
            out["adapter"] = self.adapter
        return out


def device_class(device: str) -> tuple[str, str | None]:
    """An xstage device id's class and vendor: ``gpu_discrete:nvidia:0`` → (``gpu``, ``nvidia``)."""
    kind, _, rest = device.partition(":")
    vendor = rest.split(":")[0] or None if rest else None
    if kind.startswith("gpu"):
        kind = "gpu"
    return kind.lower(), vendor.lower() if vendor else None


def openvino_devices(device_type: str) -> tuple[str, ...]:
    """The device classes an OpenVINO ``device_type`` names: ``GPU.1`` → (``gpu``,);
    ``HETERO:GPU,CPU`` and ``AUTO:NPU,CPU`` → every device listed, in order."""
    text = device_type.strip()
    if ":" in text:
        text = text.split(":", 1)[1]
    out = []
    for part in text.split(","):
        name = part.strip().split(".")[0].split("(")[0].upper()
        if name:
            out.append(name.lower())
    return tuple(out)


def _observed(kind: str, vendor: str | None) -> str:
    return f"{kind}:{vendor}" if vendor else kind


def attest(*, planned: str, ep: str | None = None, ep_device: Mapping[str, Any] | None = None,
           ep_options: Mapping[str, Any] | None = None, runtime_log: str | None = None,
           torch_devices: Sequence[str] | None = None, gpu_memory: Mapping[str, Any] | None = None,
           planned_pci: str | None = None, twins: int = 1, device_id_picks_gpu: bool = False,
           gpu_vendor: str | None = None) -> Attestation:
    """The strongest report of the device that ran the stage (module docstring, 1–4).

    Args:
        planned: the xstage device id the plan chose.
        ep: the ONNX EP the session was asked for (None for torch).
        ep_device: the EP device bound through the EP-device API (``type``, ``vendor``).
        ep_options: the EP options as the worker applied them.
        runtime_log: what the runtime wrote while it compiled and ran the stage.
        torch_devices: the devices of a torch stage's outputs and device kernels.
        gpu_memory: the worker's device-memory report (``xstage_remote.nvml.report``): the GPUs
            its own process holds memory on, each with its PCI address.
        planned_pci: the planned device's PCI address (``dddd:bb:dd.f``), where the table has it.
        twins: how many GPUs of the table share the planned device's vendor and PCI id.
        device_id_picks_gpu: the route's EP picks its GPU by its ``device_id`` option
            (``RouteSpec.device_id_picks_gpu``): that option as applied attests the device.
        gpu_vendor: the vendor of that GPU (``RouteSpec.gpu_vendor``; None: any vendor).
    """
    if torch_devices:
        torch_kinds = sorted({_TORCH_CLASS.get(d.split(":")[0], d.split(":")[0])
                              for d in torch_devices})
        observed = ",".join(torch_kinds)
        return Attestation(planned, observed, "runtime",
                           f"torch tensors on {', '.join(sorted(set(torch_devices)))}")
    if ep == _CPU_EP:
        return Attestation(planned, "cpu", "runtime", "the CPU EP runs only on the host CPU")
    if runtime_log and FALLBACK_MARK in runtime_log:
        return Attestation(planned, "cpu", "runtime",
                           "OpenVINO recompiled the model on its CPU plugin "
                           f"(its log: {FALLBACK_MARK!r})")
    on_gpus = _gpus_of_process(gpu_memory)
    if on_gpus:
        return _by_process_memory(planned, on_gpus, planned_pci, ep_device)
    if ep_device:
        kind = str(ep_device.get("type") or "").rsplit(".", 1)[-1].lower()
        vendor = _ep_vendor(ep_device)
        if kind:
            metadata = ep_device.get("device_metadata")
            described = metadata.get("Description") if isinstance(metadata, Mapping) else None
            discrete = str(metadata.get("Discrete", "")) if isinstance(metadata, Mapping) else ""
            if kind == "gpu" and discrete in ("0", "1"):  # DXCore's flag: which GPU class it is
                kind = "gpu_discrete" if discrete == "1" else "gpu_integrated"
            bus = metadata.get("pci_bus_id") if isinstance(metadata, Mapping) else None
            observed = _observed(kind, vendor)
            if isinstance(bus, str) and planned_pci and _pci(bus) != _pci(planned_pci):
                observed = f"{observed}:{_pci_tag(bus)}"  # another GPU than the planned one
            own = kind.startswith("gpu") and ep in _OWN_ADAPTER
            adapter: Literal["attested", "unattested"] | None = (
                ("unattested" if own else "attested") if kind.startswith("gpu") else None)
            return Attestation(planned, observed, "ep_device_api",
                               f"bound EP device: type {ep_device.get('type')}, vendor "
                               f"{ep_device.get('vendor') or vendor}"
                               + (f", PCI {bus}" if isinstance(bus, str) else "")
                               + (f", adapter {described!r}" if described else "")
                               + ("; the EP picks its physical adapter itself and nothing "
                                  "else said which (adapter: unattested)" if own else ""),
                               _ep_device_record(ep_device), adapter,
                               ambiguous=own and twins > 1)
    options = {str(k): str(v) for k, v in (ep_options or {}).items()}
    if "device_type" in options and ep and "OpenVINO" in ep:
        kinds = openvino_devices(options["device_type"])
        if kinds:
            return Attestation(planned, ",".join(kinds), "options_as_applied",
                               f"OpenVINO device_type={options['device_type']}")
    if device_id_picks_gpu:
        vendor = gpu_vendor
        index = options.get("device_id", "0")
        # The index is comparable with the xstage id's only where the vendor's own numbering is
        # used on both sides (CUDA, ROCm); DirectML's adapter index is its own.
        seen = f"gpu:{vendor}:{index}" if vendor and index.isdigit() else _observed("gpu", vendor)
        return Attestation(planned, seen, "options_as_applied", f"{ep} device_id={index}")
    return Attestation(planned, None, "unattested",
                       f"{ep or 'the runtime'} reports no device it runs on")


#: PCI vendor ids an EP device reports, and the vendor word of an xstage device id.
_PCI_VENDORS: Mapping[int, str] = {0x1002: "amd", 0x1022: "amd", 0x10DE: "nvidia", 0x8086: "intel",
                                   0x5143: "qualcomm", 0x106B: "apple"}
_VENDOR_WORDS = (("advanced micro devices", "amd"), ("authenticamd", "amd"), ("amd", "amd"),
                 ("nvidia", "nvidia"), ("genuineintel", "intel"), ("intel", "intel"),
                 ("qualcomm", "qualcomm"), ("apple", "apple"))


def _ep_vendor(ep_device: Mapping[str, Any]) -> str | None:
    """The xstage vendor of a bound EP device: by PCI vendor id, else by the vendor's name."""
    vendor_id = ep_device.get("vendor_id")
    if isinstance(vendor_id, int) and vendor_id in _PCI_VENDORS:
        return _PCI_VENDORS[vendor_id]
    name = str(ep_device.get("vendor") or "").lower()
    for word, vendor in _VENDOR_WORDS:
        if word in name:
            return vendor
    words = name.split()
    return words[0] if words else None


_EP_DEVICE_KEYS = ("ep_name", "library", "onnxruntime", "type", "vendor", "vendor_id", "device_id",
                   "ep_metadata", "device_metadata")


def _ep_device_record(ep_device: Mapping[str, Any]) -> dict[str, Any]:
    """The bound EP device's identity for the record: plain values, the known keys only."""
    out: dict[str, Any] = {}
    for key in _EP_DEVICE_KEYS:
        value = ep_device.get(key)
        if isinstance(value, Mapping):
            out[key] = {str(k): str(v) for k, v in value.items()}
        elif isinstance(value, str | int) and not isinstance(value, bool):
            out[key] = value
    return out


def _pci(text: str) -> str:
    """A PCI address in one spelling: ``00000000:00:06.0`` and ``0000:00:06.0`` are one address."""
    parts = text.strip().lower().split(":")
    if len(parts) == 3 and all(parts):
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return text.strip().lower()
    return text.strip().lower()


def _pci_tag(text: str) -> str:
    """A PCI address as an observed device's index part (no colons: they separate the id's parts)."""
    return "pci-" + _pci(text).replace(":", "-")


def _gpus_of_process(report: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The GPUs a device-memory report lists the worker's own process on."""
    if not isinstance(report, Mapping) or report.get("source") != "nvml":
        return []
    devices = report.get("devices")
    return [d for d in devices if isinstance(d, Mapping)] if isinstance(devices, list) else []


def _by_process_memory(planned: str, on_gpus: Sequence[Mapping[str, Any]], planned_pci: str | None,
                       ep_device: Mapping[str, Any] | None) -> Attestation:
    """Layer 1 for a GPU: the driver lists the worker's process on these GPUs (NVML)."""
    record = _ep_device_record(ep_device) if ep_device else None
    where = "; ".join(f"GPU {d.get('index')} {d.get('name')} at {d.get('pci_address')} "
                      f"({'/'.join(str(x) for x in d.get('lists') or ['compute'])}, "
                      f"{d.get('process_used')} bytes)" for d in on_gpus)
    if len(on_gpus) > 1:
        return Attestation(planned, None, "runtime", f"NVML lists the worker's process on several "
                           f"GPUs, so none is attested: {where}", record, "unattested")
    gpu = on_gpus[0]
    bus = gpu.get("pci_address")
    if not isinstance(bus, str) or not planned_pci:
        return Attestation(planned, "gpu:nvidia", "runtime", f"NVML lists the worker's process on "
                           f"{where} (no PCI address to match against the planned device)",
                           record, "unattested")
    if _pci(bus) == _pci(planned_pci):
        return Attestation(planned, planned, "runtime", f"NVML lists the worker's process on {where}, "
                           "the planned device's PCI address", record, "attested")
    return Attestation(planned, f"gpu:nvidia:{_pci_tag(bus)}", "runtime",
                       f"NVML lists the worker's process on {where}, not on the planned device at "
                       f"{planned_pci}", record, "attested")


def judge(att: Attestation) -> Literal["device_mismatch", "unmeasured"] | None:
    """Conflict case (c): None when the planned device is attested (or the CPU, unattested);
    ``unmeasured`` when only class and vendor are attested and the planned GPU has twins."""
    kind, vendor = device_class(att.planned)
    if att.observed is None:
        return None if kind == "cpu" else "unmeasured"
    planned_index = att.planned.split(":")[2] if att.planned.count(":") == 2 else None
    planned_class = att.planned.split(":")[0]
    for one in att.observed.split(","):
        got, got_vendor, got_index = (one.split(":") + ["", ""])[:3]
        if got.startswith("gpu_"):  # an observed GPU class (DXCore's Discrete flag) must be the planned one
            if planned_class.startswith("gpu_") and got != planned_class:
                return "device_mismatch"
            got = "gpu"
        if got != kind or (vendor and got_vendor and got_vendor != vendor):
            return "device_mismatch"
        if planned_index and got_index and got_index != planned_index:
            return "device_mismatch"
    if att.ambiguous:
        return "unmeasured"
    return None
