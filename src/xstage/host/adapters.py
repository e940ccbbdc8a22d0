"""Which GPU adapter is which xstage device: DirectML's adapter chosen by identity.

DirectML picks its adapter by a DXGI adapter index (``device_id``), and index 0 is whatever DXGI
lists first — on a laptop with a Radeon iGPU and a discrete GPU, often the discrete one. So
``--device gpu_integrated:amd`` with ``device_id=0`` can run on the discrete GPU and be recorded as
placed on the iGPU. Here the adapter is matched to the xstage device by what identifies it.

The inventory is the EP devices onnxruntime lists for the EP (``get_ep_devices()``, ORT >= 1.23),
whose hardware device carries the PCI vendor and device id and, on Windows, the metadata
onnxruntime's device discovery writes: ``Description``, ``DxgiAdapterNumber`` (the index
DirectML's ``device_id`` means), ``DxgiHighPerformanceIndex``, ``DxgiVideoMemory``, ``Discrete``
(``0``/``1``, from DXCore), and ``LUID`` where the build writes it.

Matching rules (:func:`match_adapters`), for each GPU adapter, the first that decides:

1. its class: ``Discrete`` = ``1`` → ``gpu_discrete``, ``0`` → ``gpu_integrated``; unknown: the class
   of the hardware row it matches below;
2. a hardware row (``xstage.host.hardware``) of its vendor whose PCI id (``details.pci_id``) is the
   adapter's: ``pci_id``;
3. else the one row of its vendor and class: ``vendor and class``;
4. else the row whose name is the adapter's ``Description``: ``name``;
5. else, with no hardware rows of its vendor at all, an id made from its class (discrete ones
   numbered in DXGI order per vendor): ``adapter only``;
6. else it is ambiguous and left out (never a guess).

An adapter without ``DxgiAdapterNumber`` is left out: DirectML would fall back to adapter 0 for it.
Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xstage.host.hardware import Device, vendor_from_id, vendor_from_name

__all__ = ["Adapter", "AdapterMatch", "adapters_from_ep_devices", "match_adapters"]


@dataclass(frozen=True)
class Adapter:
    """One GPU adapter as an EP device row describes it.

    Attributes:
        dxgi_index: ``DxgiAdapterNumber``: the index DirectML's ``device_id`` selects.
        vendor: the xstage vendor (``amd``, ``nvidia``, ``intel``, or a hex id).
        vendor_id: PCI vendor id.
        device_id: PCI device id.
        description: the adapter's ``Description``.
        discrete: ``Discrete`` as a bool, or None when not given.
        luid: ``LUID`` where the build writes it, else None.
        high_performance_index: ``DxgiHighPerformanceIndex``, or None.
        row: the EP device row it came from.
    """

    dxgi_index: int
    vendor: str
    vendor_id: int
    device_id: int
    description: str
    discrete: bool | None
    luid: str | None
    high_performance_index: int | None
    row: Mapping[str, Any]

    @property
    def pci_id(self) -> str:
        """``vvvv:dddd`` in lower-case hex, as hardware rows write it."""
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    def identity(self) -> dict[str, Any]:
        """What the record and the worker's selector keep of it."""
        return {"description": self.description, "dxgi_adapter_number": self.dxgi_index,
                "pci_id": self.pci_id, "discrete": self.discrete, "luid": self.luid,
                "high_performance_index": self.high_performance_index}


@dataclass(frozen=True)
class AdapterMatch:
    """An adapter matched to an xstage device id, and which rule matched it."""

    device: str
    adapter: Adapter
    how: str


def _int(value: Any) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def adapters_from_ep_devices(rows: Sequence[Mapping[str, Any]],
                             ep_name: str) -> tuple[list[Adapter], list[str]]:
    """The GPU adapters among ``rows`` (the probe's EP device rows) for ``ep_name``, in DXGI order,
    and why any were left out."""
    out: list[Adapter] = []
    skipped: list[str] = []
    seen: set[int] = set()
    for row in rows:
        if row.get("ep_name") != ep_name or str(row.get("device_type", "")).upper() != "GPU":
            continue
        meta = row.get("device_metadata") or {}
        index = _int(meta.get("DxgiAdapterNumber"))
        description = str(meta.get("Description") or row.get("device_vendor") or "?")
        if index is None:
            skipped.append(f"{description}: no DxgiAdapterNumber (DirectML would use adapter 0 for it)")
            continue
        if index in seen:
            continue
        seen.add(index)
        vendor_id = int(row.get("device_vendor_id") or 0)
        discrete = {"1": True, "0": False}.get(str(meta.get("Discrete", "")).strip())
        out.append(Adapter(
            dxgi_index=index,
            vendor=vendor_from_id(vendor_id) or vendor_from_name(description) or f"{vendor_id:04x}",
            vendor_id=vendor_id, device_id=int(row.get("device_id") or 0), description=description,
            discrete=discrete, luid=str(meta["LUID"]) if meta.get("LUID") else None,
            high_performance_index=_int(meta.get("DxgiHighPerformanceIndex")), row=dict(row)))
    out.sort(key=lambda a: a.dxgi_index)
    return out, skipped


def _kind(adapter: Adapter) -> str | None:
    if adapter.discrete is None:
        return None
    return "gpu_discrete" if adapter.discrete else "gpu_integrated"


def match_adapters(adapters: Sequence[Adapter],
                   hardware: Sequence[Device]) -> tuple[list[AdapterMatch], list[str]]:
    """Each adapter's xstage device (rules 1-6 of the module docstring), and why any were not matched."""
    matches: list[AdapterMatch] = []
    unmatched: list[str] = []
    taken: set[str] = set()
    discrete_n: dict[str, int] = {}
    for adapter in adapters:
        kind = _kind(adapter)
        rows = [d for d in hardware if d.kind.startswith("gpu") and d.vendor == adapter.vendor
                and d.id not in taken]
        same_kind = [d for d in rows if kind is None or d.kind == kind]
        by_pci = [d for d in same_kind if str(d.details.get("pci_id", "")).lower() == adapter.pci_id]
        chosen: Device | None = None
        how = ""
        if len(by_pci) == 1:
            chosen, how = by_pci[0], "pci_id"
        elif len(same_kind) == 1 and kind is not None:
            chosen, how = same_kind[0], "vendor and class"
        else:
            named = [d for d in same_kind if d.name == adapter.description]
            if len(named) == 1:
                chosen, how = named[0], "name"
        if chosen is not None:
            taken.add(chosen.id)
            matches.append(AdapterMatch(chosen.id, adapter, how))
            continue
        if not any(d.kind.startswith("gpu") and d.vendor == adapter.vendor for d in hardware) and kind:
            if kind == "gpu_integrated":
                device = f"gpu_integrated:{adapter.vendor}"
            else:
                index = discrete_n.get(adapter.vendor, 0)
                discrete_n[adapter.vendor] = index + 1
                device = f"gpu_discrete:{adapter.vendor}:{index}"
            if device not in taken:
                taken.add(device)
                matches.append(AdapterMatch(device, adapter, "adapter only"))
                continue
        unmatched.append(f"{adapter.description} (DXGI adapter {adapter.dxgi_index}, PCI {adapter.pci_id}): "
                         "no single device of this machine matches it")
    return matches, unmatched
