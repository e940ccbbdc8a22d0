"""Devices as the machine itself reports them, apart from any route that could drive them.

A device that exists and that no resolved route drives must still be listed: that is what
``device_unreachable_from_this_process`` will mean. So the rows come from the machine: the
host row from ``/proc/cpuinfo`` and psutil, GPUs and NPUs from sysfs PCI classes
(``0x03xxxx`` display, ``0x12xxxx`` processing accelerators), ``/dev/accel``, ``/dev/dri``,
``/dev/dxg``, ``nvidia-smi``, and under WSL a Windows-side PowerShell query.

Every parser here is a pure function tested on recorded inputs; the readers beside them are
thin, and the machine tools run through ``xstage.client.tools.run_tool``. Memory (docs/design.md §8):
the host row carries total and available RAM in pool ``host_ram``; integrated GPUs and NPUs
share it and so report ``memory_bytes = 0`` (nobody adds it twice); a discrete GPU reports its
own memory in pool ``vram:<device id>``.

Device ids: ``cpu``, ``gpu_integrated:<vendor>``, ``gpu_discrete:<vendor>:<index>`` (index
among that vendor's discrete GPUs, in PCI order, which is ``nvidia-smi``'s order too),
``npu:<vendor>``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xstage.client.tools import run_tool

__all__ = [
    "NVIDIA_SMI_FIELDS",
    "WINDOWS_QUERY",
    "CpuInfo",
    "Device",
    "NvidiaGpu",
    "PciFunction",
    "WindowsAdapter",
    "classify_pci",
    "cpu_vendor",
    "discover",
    "dev_nodes",
    "host_device",
    "merge_nvidia",
    "normalize_pci_address",
    "parse_cpuinfo",
    "parse_nvidia_smi",
    "parse_windows_query",
    "read_pci_functions",
    "run_nvidia_smi",
    "run_windows_query",
    "vendor_from_id",
    "vendor_from_name",
    "windows_devices",
]

#: PCI vendor ids of the silicon xstage routes know (0x1022 is AMD's non-GPU id: its NPUs).
PCI_VENDORS = {
    0x10DE: "nvidia",
    0x1002: "amd",
    0x1022: "amd",
    0x8086: "intel",
    0x5143: "qualcomm",
    0x4D4F4351: "qualcomm",  # 'QCOM', as onnxruntime's EP-device API reports Qualcomm NPUs
    0x106B: "apple",
}

_VENDOR_WORDS = (
    ("nvidia", "nvidia"),
    ("geforce", "nvidia"),
    ("advanced micro devices", "amd"),
    ("radeon", "amd"),
    ("amd", "amd"),
    ("intel", "intel"),
    ("qualcomm", "qualcomm"),
    ("apple", "apple"),
)


def vendor_from_id(vendor_id: int | None) -> str | None:
    """The vendor word for a PCI (or EP-device) vendor id, or None when unknown."""
    return PCI_VENDORS.get(vendor_id) if vendor_id is not None else None


def vendor_from_name(text: str | None) -> str | None:
    """The vendor word found in a marketing or manufacturer name, or None."""
    low = (text or "").lower()
    for word, vendor in _VENDOR_WORDS:
        if word in low:
            return vendor
    return None


@dataclass(frozen=True)
class Device:
    """One piece of silicon.

    Attributes:
        id: the stable id (module docstring).
        kind: ``cpu``, ``gpu_integrated``, ``gpu_discrete`` or ``npu``.
        vendor: ``intel``, ``amd``, ``nvidia``, ``qualcomm``, ``apple`` or a hex vendor id.
        name: what the machine calls it.
        pool: ``host_ram`` or ``vram:<id>``: the memory its stages are budgeted against.
        memory_bytes: capacity of its own pool; 0 for devices that share the host's RAM.
        available_bytes: free bytes of its own pool at discovery; 0 when it shares host RAM.
        sources: where each fact came from (``/proc/cpuinfo``, ``sysfs:0000:00:06.0``, …).
        pci_address: normalized ``dddd:bb:dd.f`` where known.
        details: anything else worth showing (driver, uuid, device nodes).
    """

    id: str
    kind: str
    vendor: str
    name: str
    pool: str
    memory_bytes: int
    available_bytes: int
    sources: tuple[str, ...] = ()
    pci_address: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (stable field names: id, kind, pool, memory_bytes, …)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "vendor": self.vendor,
            "name": self.name,
            "pool": self.pool,
            "memory_bytes": self.memory_bytes,
            "available_bytes": self.available_bytes,
            "sources": list(self.sources),
            "pci_address": self.pci_address,
            "details": dict(self.details),
        }


# ---------------------------------------------------------------------------- host row


@dataclass(frozen=True)
class CpuInfo:
    """What ``/proc/cpuinfo`` says about the host CPU."""

    vendor_id: str | None
    model_name: str | None
    logical_cpus: int


def parse_cpuinfo(text: str) -> CpuInfo:
    """Vendor, model and logical CPU count from ``/proc/cpuinfo`` text (x86 and Arm)."""
    vendor = model = None
    count = 0
    implementer = None
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "processor" and value.isdigit():
            count += 1
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key in ("model name", "hardware", "cpu model") and model is None and value:
            model = value
        elif key == "cpu implementer" and implementer is None:
            implementer = value
    if vendor is None and implementer is not None:
        vendor = {"0x41": "ARM", "0x51": "Qualcomm", "0x61": "Apple"}.get(implementer.lower())
    return CpuInfo(vendor_id=vendor, model_name=model, logical_cpus=count)


def cpu_vendor(cpu: CpuInfo) -> str:
    """``intel``, ``amd``, … for the host CPU; ``unknown`` when nothing says."""
    table = {"genuineintel": "intel", "authenticamd": "amd", "hygongenuine": "hygon"}
    if cpu.vendor_id and cpu.vendor_id.lower() in table:
        return table[cpu.vendor_id.lower()]
    return vendor_from_name(cpu.vendor_id) or vendor_from_name(cpu.model_name) or "unknown"


def host_device(cpu: CpuInfo, *, total_bytes: int, available_bytes: int) -> Device:
    """The host row: total and available RAM, pool ``host_ram``."""
    name = cpu.model_name or cpu.vendor_id or "CPU"
    return Device(
        id="cpu",
        kind="cpu",
        vendor=cpu_vendor(cpu),
        name=name,
        pool="host_ram",
        memory_bytes=int(total_bytes),
        available_bytes=int(available_bytes),
        sources=("/proc/cpuinfo", "psutil.virtual_memory"),
        details={"logical_cpus": cpu.logical_cpus, "vendor_id": cpu.vendor_id},
    )


# ---------------------------------------------------------------------------- sysfs PCI


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it (the few files xstage reads)."""

    address: str
    class_code: int
    vendor_id: int
    device_id: int
    driver: str | None = None
    vram_total: int | None = None
    vram_used: int | None = None


def normalize_pci_address(text: str) -> str:
    """``00000000:00:06.0`` (nvidia-smi) and ``0000:00:06.0`` (sysfs) → ``0000:00:06.0``.

    Raises:
        ValueError: the text is not a PCI address.
    """
    match = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*", text)
    if not match:
        raise ValueError(f"not a PCI address: {text!r}")
    domain = int(match.group(1) or "0", 16)
    bus, dev, fn = int(match.group(2), 16), int(match.group(3), 16), int(match.group(4))
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def _read_int(path: Path, base: int = 0) -> int | None:
    try:
        return int(path.read_text().strip(), base)
    except (OSError, ValueError):
        return None


def read_pci_functions(root: Path = Path("/sys/bus/pci/devices")) -> list[PciFunction]:
    """Display (``0x03``) and processing-accelerator (``0x12``) functions under ``root``."""
    functions = []
    try:
        children = sorted(root.iterdir())
    except OSError:
        return []
    for child in children:
        class_code = _read_int(child / "class", 16)
        if class_code is None or (class_code >> 16) not in (0x03, 0x12):
            continue
        vendor = _read_int(child / "vendor", 16)
        device = _read_int(child / "device", 16)
        if vendor is None or device is None:
            continue
        driver_link = child / "driver"
        driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
        functions.append(
            PciFunction(
                address=child.name,
                class_code=class_code,
                vendor_id=vendor,
                device_id=device,
                driver=driver,
                vram_total=_read_int(child / "mem_info_vram_total"),
                vram_used=_read_int(child / "mem_info_vram_used"),
            )
        )
    return functions


#: An AMD GPU with at most this much dedicated VRAM, on a host whose CPU names Radeon
#: graphics, is taken as the APU's integrated GPU (the carve-out is 512 MiB–4 GiB).
_APU_CARVEOUT_MAX = 4 << 30


def _gpu_kind(fn: PciFunction, vendor: str, cpu: CpuInfo) -> str:
    """Integrated or discrete, by the rules in ``classify_pci``."""
    if vendor == "intel":
        # Rule 1: Intel's integrated GPU sits on the root bus (00:02.0); Arc cards do not.
        return "gpu_integrated" if normalize_pci_address(fn.address).split(":")[1] == "00" else "gpu_discrete"
    if vendor == "amd":
        # Rule 2: an AMD GPU is the APU's iGPU when the CPU names Radeon graphics and the
        # GPU's dedicated VRAM (amdgpu's mem_info_vram_total) is a small carve-out.
        apu = "radeon" in (cpu.model_name or "").lower()
        small = fn.vram_total is None or fn.vram_total <= _APU_CARVEOUT_MAX
        return "gpu_integrated" if apu and small else "gpu_discrete"
    # Rule 3: NVIDIA (and anything else on PCI) is a discrete card.
    return "gpu_discrete"



def _host_ram_device(kind: str, vendor: str, name: str, sources: tuple[str, ...],
                     address: str | None, details: dict[str, Any]) -> Device:
    """An integrated GPU or NPU: it shares the host's RAM, so it reports 0 and pool host_ram
    (the host row counts that memory once)."""
    return Device(id=f"{kind}:{vendor}", kind=kind, vendor=vendor, name=name, pool="host_ram",
                  memory_bytes=0, available_bytes=0, sources=sources, pci_address=address,
                  details=details)

def classify_pci(functions: Iterable[PciFunction], *, cpu: CpuInfo) -> list[Device]:
    """GPU and NPU rows from PCI functions (pure).

    Rules:
        1. Intel display functions on bus 00 are integrated, others discrete.
        2. AMD display functions are integrated when the CPU model names Radeon graphics and
           dedicated VRAM is at most 4 GiB (or unknown); discrete otherwise.
        3. Other known vendors' display functions are discrete.
        4. Class 0x12 (processing accelerator) functions of a known vendor are NPUs.
        5. Unknown vendors (virtual display adapters, …) are skipped.
    """
    rows: list[Device] = []
    discrete_index: dict[str, int] = {}
    for fn in sorted(functions, key=lambda f: normalize_pci_address(f.address)):
        vendor = vendor_from_id(fn.vendor_id)
        if vendor is None:  # Rule 5
            continue
        address = normalize_pci_address(fn.address)
        base = (f"sysfs:{address}",)
        details: dict[str, Any] = {"pci_id": f"{fn.vendor_id:04x}:{fn.device_id:04x}"}
        if fn.driver:
            details["driver"] = fn.driver
        top = fn.class_code >> 16
        if top == 0x12:  # Rule 4
            name = (f"{vendor.upper() if vendor in ('amd',) else vendor.capitalize()} NPU "
                    f"(PCI {fn.vendor_id:04x}:{fn.device_id:04x})")
            rows.append(_host_ram_device("npu", vendor, name, base, address, details))
            continue
        kind = _gpu_kind(fn, vendor, cpu)
        label = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}.get(vendor, vendor)
        name = f"{label} GPU (PCI {fn.vendor_id:04x}:{fn.device_id:04x})"
        if kind == "gpu_integrated":
            rows.append(_host_ram_device(kind, vendor, name, base, address, details))
            continue
        index = discrete_index.get(vendor, 0)
        discrete_index[vendor] = index + 1
        device_id = f"gpu_discrete:{vendor}:{index}"
        total = fn.vram_total or 0
        used = fn.vram_used
        rows.append(
            Device(
                id=device_id,
                kind=kind,
                vendor=vendor,
                name=name,
                pool=f"vram:{device_id}",
                memory_bytes=total,
                available_bytes=(total - used) if (total and used is not None) else 0,
                sources=base,
                pci_address=address,
                details=details,
            )
        )
    return rows


# ---------------------------------------------------------------------------- nvidia-smi

#: The fields xstage asks nvidia-smi for, in this order.
NVIDIA_SMI_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.free", "driver_version")


@dataclass(frozen=True)
class NvidiaGpu:
    """One line of ``nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits``."""

    index: int
    uuid: str
    name: str
    pci_address: str
    memory_total_bytes: int
    memory_free_bytes: int
    driver_version: str


def parse_nvidia_smi(text: str) -> list[NvidiaGpu]:
    """Parse the query output (MiB values, as ``nounits`` prints them).

    Raises:
        ValueError: a line has the wrong number of fields or a non-numeric memory value.
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(NVIDIA_SMI_FIELDS):
            raise ValueError(
                f"nvidia-smi line has {len(parts)} fields, expected {len(NVIDIA_SMI_FIELDS)}: {line!r}"
            )
        index, uuid, name, bus, total, free, driver = parts

        def mib(value: str) -> int:
            return int(float(value) * (1 << 20)) if value not in ("[N/A]", "N/A", "") else 0

        gpus.append(
            NvidiaGpu(
                index=int(index),
                uuid=uuid,
                name=name,
                pci_address=normalize_pci_address(bus),
                memory_total_bytes=mib(total),
                memory_free_bytes=mib(free),
                driver_version=driver,
            )
        )
    return gpus


def merge_nvidia(rows: list[Device], gpus: Iterable[NvidiaGpu]) -> list[Device]:
    """Fill NVIDIA rows with nvidia-smi's names and memory, matched by PCI address.

    A GPU nvidia-smi lists that sysfs did not show (a container without ``/sys``) is added.
    nvidia-smi's index is the row's index: both follow PCI bus order.
    """
    out = list(rows)
    by_address = {row.pci_address: i for i, row in enumerate(out) if row.pci_address}
    for gpu in gpus:
        device_id = f"gpu_discrete:nvidia:{gpu.index}"
        details = {"uuid": gpu.uuid, "driver_version": gpu.driver_version, "nvidia_smi_index": gpu.index}
        fields = dict(
            id=device_id,
            kind="gpu_discrete",
            vendor="nvidia",
            name=gpu.name,
            pool=f"vram:{device_id}",
            memory_bytes=gpu.memory_total_bytes,
            available_bytes=gpu.memory_free_bytes,
            pci_address=gpu.pci_address,
        )
        if gpu.pci_address in by_address:
            i = by_address[gpu.pci_address]
            old = out[i]
            out[i] = replace(
                old, **fields, sources=old.sources + ("nvidia-smi",), details={**old.details, **details}
            )
        else:
            out.append(Device(**fields, sources=("nvidia-smi",), details=details))  # type: ignore[arg-type]
    return out


def run_nvidia_smi(timeout: float = 10.0) -> str | None:
    """nvidia-smi's answer to the ``NVIDIA_SMI_FIELDS`` query, or None (absent or failing)."""
    return run_tool(["nvidia-smi", "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS),
                     "--format=csv,noheader,nounits"], timeout)


# ---------------------------------------------------------------------------- /dev nodes


def dev_nodes(root: Path = Path("/dev")) -> dict[str, Any]:
    """Device nodes that tell which kernel drivers expose accelerators here."""

    def listing(sub: str, prefix: str) -> list[str]:
        try:
            return sorted(p.name for p in (root / sub).iterdir() if p.name.startswith(prefix))
        except OSError:
            return []

    return {
        "accel": listing("accel", "accel"),
        "dri_render": listing("dri", "renderD"),
        "dxg": (root / "dxg").exists(),
        "nvidia": sorted(p.name for p in root.glob("nvidia[0-9]*")) if root.is_dir() else [],
    }


# ---------------------------------------------------------------------------- Windows side

#: Run through ``powershell.exe -NoProfile -NonInteractive -Command`` from WSL: display
#: adapters (Win32_VideoController) and NPUs (PnP class ComputeAccelerator), as JSON.
WINDOWS_QUERY = (
    "Get-CimInstance -ClassName Win32_VideoController | "
    "Select-Object Name,AdapterCompatibility,PNPDeviceID,AdapterRAM,DriverVersion | "
    "ConvertTo-Json -Compress; '---'; "
    "Get-PnpDevice -PresentOnly -Class ComputeAccelerator -ErrorAction SilentlyContinue | "
    "Select-Object FriendlyName,Manufacturer,InstanceId,Status | ConvertTo-Json -Compress"
)


@dataclass(frozen=True)
class WindowsAdapter:
    """A display adapter or NPU as Windows lists it."""

    kind: str  # "gpu" or "npu"
    name: str
    vendor: str | None
    pci_vendor_id: int | None
    pci_device_id: int | None
    adapter_ram: int | None
    status: str | None = None


def _json_rows(text: str) -> list[dict[str, Any]]:
    text = text.strip()
    if not text:
        return []
    value = json.loads(text)
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _pnp_ids(pnp: str | None) -> tuple[int | None, int | None]:
    match = re.search(r"VEN_([0-9A-Fa-f]{4}).*?DEV_([0-9A-Fa-f]{4})", pnp or "")
    if not match:
        return None, None
    return int(match.group(1), 16), int(match.group(2), 16)


def parse_windows_query(text: str) -> list[WindowsAdapter]:
    """Parse what ``WINDOWS_QUERY`` printed: adapters JSON, a ``---`` line, NPUs JSON.

    ``ConvertTo-Json`` prints a single object without brackets and nothing for no rows;
    both are accepted.

    Raises:
        ValueError: a part is not JSON.
    """
    parts = re.split(r"^\s*---\s*$", text, maxsplit=1, flags=re.MULTILINE)
    adapters: list[WindowsAdapter] = []
    for row in _json_rows(parts[0]):
        ven, dev = _pnp_ids(row.get("PNPDeviceID"))
        ram = row.get("AdapterRAM")
        adapters.append(
            WindowsAdapter(
                kind="gpu",
                name=str(row.get("Name") or ""),
                vendor=vendor_from_id(ven) or vendor_from_name(row.get("AdapterCompatibility")),
                pci_vendor_id=ven,
                pci_device_id=dev,
                adapter_ram=int(ram) if isinstance(ram, int | float) else None,
            )
        )
    for row in _json_rows(parts[1] if len(parts) > 1 else ""):
        ven, dev = _pnp_ids(row.get("InstanceId"))
        adapters.append(
            WindowsAdapter(
                kind="npu",
                name=str(row.get("FriendlyName") or ""),
                vendor=vendor_from_id(ven) or vendor_from_name(row.get("Manufacturer")),
                pci_vendor_id=ven,
                pci_device_id=dev,
                adapter_ram=None,
                status=row.get("Status"),
            )
        )
    return adapters


def _windows_gpu_is_integrated(adapter: WindowsAdapter) -> bool:
    """Name rules (Windows gives no flag): Intel unless an Arc A/B card; AMD "… Graphics"."""
    name = adapter.name.lower()
    if adapter.vendor == "intel":
        return not re.search(r"arc\(tm\) [ab]\d{3}|arc [ab]\d{3}", name)
    if adapter.vendor == "amd":
        return "graphics" in name and " rx " not in f" {name} "
    return False


def windows_devices(adapters: Iterable[WindowsAdapter]) -> list[Device]:
    """Device rows for what the Windows side lists (known vendors only).

    ``AdapterRAM`` is a 32-bit field (capped near 4 GiB), so a discrete GPU's memory from
    it is marked ``memory_capped`` in its details.
    """
    rows: list[Device] = []
    discrete_index: dict[str, int] = {}
    for adapter in adapters:
        vendor = adapter.vendor
        if vendor is None:
            continue
        details: dict[str, Any] = {"seen_from": "windows"}
        if adapter.pci_vendor_id is not None and adapter.pci_device_id is not None:
            details["pci_id"] = f"{adapter.pci_vendor_id:04x}:{adapter.pci_device_id:04x}"
        if adapter.status:
            details["status"] = adapter.status
        if adapter.kind == "npu":
            device_id, kind, pool, memory = f"npu:{vendor}", "npu", "host_ram", 0
        elif _windows_gpu_is_integrated(adapter):
            device_id, kind, pool, memory = f"gpu_integrated:{vendor}", "gpu_integrated", "host_ram", 0
        else:
            index = discrete_index.get(vendor, 0)
            discrete_index[vendor] = index + 1
            device_id, kind = f"gpu_discrete:{vendor}:{index}", "gpu_discrete"
            pool, memory = f"vram:{device_id}", int(adapter.adapter_ram or 0)
            details["memory_capped"] = "AdapterRAM is 32-bit; capacity may be understated"
        if any(row.id == device_id for row in rows):
            continue
        rows.append(
            Device(
                id=device_id,
                kind=kind,
                vendor=vendor,
                name=adapter.name,
                pool=pool,
                memory_bytes=memory,
                available_bytes=0,
                sources=("windows:powershell",),
                details=details,
            )
        )
    return rows


def run_windows_query(timeout: float = 20.0) -> str | None:
    """What ``WINDOWS_QUERY`` prints through ``powershell.exe``, or None (no interop)."""
    return run_tool(["powershell.exe", "-NoProfile", "-NonInteractive", "-Command", WINDOWS_QUERY],
                    timeout)


def _windows_cached(proc: Path, refresh: bool) -> str | None:
    """``run_windows_query`` once per boot (``cache/hardware/``), unless ``refresh``."""
    import hashlib

    from xstage.home import atomic_write, cache_dir

    try:
        boot = (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    path = cache_dir() / "hardware" / f"windows-{hashlib.sha256(boot.encode()).hexdigest()[:16]}.txt"
    if not refresh and path.is_file():
        return path.read_text()
    text = run_windows_query()
    if text is not None:
        atomic_write(path, text.encode())
    return text


# ---------------------------------------------------------------------------- assembly


def _merge_rows(base: list[Device], extra: Iterable[Device]) -> list[Device]:
    out = list(base)
    ids = {row.id for row in out}
    for row in extra:
        if row.id not in ids:
            out.append(row)
            ids.add(row.id)
    return out


def discover(
    *,
    proc: Path = Path("/proc"),
    sys_pci: Path = Path("/sys/bus/pci/devices"),
    dev: Path = Path("/dev"),
    nvidia_smi_text: str | None = None,
    windows_text: str | None = None,
    wsl: bool | None = None,
    run_tools: bool = True,
    refresh: bool = False,
) -> list[Device]:
    """Every device this machine shows: the host row first, then GPUs and NPUs.

    Args:
        proc, sys_pci, dev: roots to read (tests point them at recorded trees).
        nvidia_smi_text: recorded ``nvidia-smi`` output; None runs the tool (if
            ``run_tools``) when it is on PATH.
        windows_text: recorded Windows-side query output; None runs it under WSL.
        wsl: whether this is WSL (None: detect from ``proc``).
        run_tools: whether to start nvidia-smi / powershell.exe when no text is given.
        refresh: ignore the cached Windows-side answer (it is cached per boot: PowerShell
            takes about a second to start).
    """
    import psutil

    try:
        cpu = parse_cpuinfo((proc / "cpuinfo").read_text(errors="replace"))
    except OSError:
        import platform

        cpu = CpuInfo(
            vendor_id=None, model_name=platform.processor() or None, logical_cpus=os.cpu_count() or 0
        )
    memory = psutil.virtual_memory()
    rows = [host_device(cpu, total_bytes=memory.total, available_bytes=memory.available)]
    rows += classify_pci(read_pci_functions(sys_pci), cpu=cpu)
    smi = nvidia_smi_text if nvidia_smi_text is not None else (run_nvidia_smi() if run_tools else None)
    if smi:
        try:
            rows = merge_nvidia(rows, parse_nvidia_smi(smi))
        except ValueError:
            pass  # an nvidia-smi we cannot read leaves the sysfs rows as they are
    nodes = dev_nodes(dev)
    if wsl is None:
        from xstage.host.wsl import current

        wsl = current(proc=proc).is_wsl
    if wsl:
        text = (
            windows_text
            if windows_text is not None
            else (_windows_cached(proc, refresh) if run_tools else None)
        )
        if text:
            try:
                rows = _merge_rows(rows, windows_devices(parse_windows_query(text)))
            except ValueError:
                pass
    final = []
    for row in rows:
        extra: dict[str, Any] = {}
        if row.kind == "npu" and nodes["accel"]:
            extra["dev_accel"] = nodes["accel"]
        if row.kind.startswith("gpu") and nodes["dri_render"]:
            extra["dev_dri"] = nodes["dri_render"]
        if row.kind.startswith("gpu") and nodes["dxg"]:
            extra["dev_dxg"] = True
        final.append(replace(row, details={**row.details, **extra}) if extra else row)
    return final
