"""This process's video memory on each DXGI adapter (DirectML), through ctypes and COM.

Python 3.9 syntax, standard library only. ``IDXGIAdapter3::QueryVideoMemoryInfo`` reports, per
adapter and for the calling process, its ``CurrentUsage`` of the local segment (the adapter's
own memory) and of the non-local one (system memory the adapter maps), with the ``Budget`` the
OS grants the process. ``read()`` asks DXGI; ``report()`` turns what it read (a plain dict,
replayable from a recording) into the ledger's figure: the local usage summed over hardware
adapters (a process is on one; the others report 0).

Not run on a DirectML machine yet (there is none here): written from the DXGI headers
(``dxgi1_4.h``); anything that fails is the ``error`` field, never an exception.
"""

import ctypes
import os
import sys

__all__ = ["read", "report", "process_memory"]

_IID_IDXGIFactory1 = "{770aae78-f26f-4dba-a829-253c83d1b387}"
_IID_IDXGIAdapter3 = "{645967a4-1392-4310-a798-8053ce3e93fd}"
_DXGI_ERROR_NOT_FOUND = 0x887A0002
_ADAPTER_FLAG_SOFTWARE = 2
# vtable slots: IUnknown 0-2, IDXGIObject 3-6, IDXGIFactory 7-11 (EnumAdapters1 is 12 in
# IDXGIFactory1); IDXGIAdapter 7-9, IDXGIAdapter1 GetDesc1 10, IDXGIAdapter2 11,
# IDXGIAdapter3: QueryVideoMemoryInfo 14.
_QUERY_INTERFACE, _RELEASE = 0, 2
_ENUM_ADAPTERS1 = 12
_GET_DESC1 = 10
_QUERY_VIDEO_MEMORY_INFO = 14
_LOCAL, _NON_LOCAL = 0, 1


class _GUID(ctypes.Structure):
    _fields_ = [("Data1", ctypes.c_uint32), ("Data2", ctypes.c_uint16), ("Data3", ctypes.c_uint16),
                ("Data4", ctypes.c_ubyte * 8)]


class _LUID(ctypes.Structure):
    _fields_ = [("LowPart", ctypes.c_uint32), ("HighPart", ctypes.c_int32)]


class _AdapterDesc1(ctypes.Structure):
    _fields_ = [("Description", ctypes.c_wchar * 128), ("VendorId", ctypes.c_uint),
                ("DeviceId", ctypes.c_uint), ("SubSysId", ctypes.c_uint), ("Revision", ctypes.c_uint),
                ("DedicatedVideoMemory", ctypes.c_size_t), ("DedicatedSystemMemory", ctypes.c_size_t),
                ("SharedSystemMemory", ctypes.c_size_t), ("AdapterLuid", _LUID), ("Flags", ctypes.c_uint)]


class _VideoMemoryInfo(ctypes.Structure):
    _fields_ = [("Budget", ctypes.c_uint64), ("CurrentUsage", ctypes.c_uint64),
                ("AvailableForReservation", ctypes.c_uint64), ("CurrentReservation", ctypes.c_uint64)]


def _guid(text):
    import uuid

    u = uuid.UUID(text)
    g = _GUID()
    g.Data1, g.Data2, g.Data3 = u.fields[0], u.fields[1], u.fields[2]
    for i, b in enumerate(u.bytes[8:]):
        g.Data4[i] = b
    return g


def _method(obj, slot, *argtypes):
    """The COM method at vtable ``slot`` of ``obj`` (a c_void_p), as a callable."""
    vtable = ctypes.cast(obj, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p))).contents
    proto = ctypes.WINFUNCTYPE(ctypes.c_long, ctypes.c_void_p, *argtypes)
    fn = proto(vtable[slot])
    return lambda *args: fn(obj, *args) & 0xFFFFFFFF


def _release(obj):
    if obj:
        _method(obj, _RELEASE)()


def _segment(adapter3, group):
    info = _VideoMemoryInfo()
    hr = _method(adapter3, _QUERY_VIDEO_MEMORY_INFO, ctypes.c_uint, ctypes.c_int,
                 ctypes.POINTER(_VideoMemoryInfo))(0, group, ctypes.byref(info))
    if hr:
        return {"error": "QueryVideoMemoryInfo 0x%08x" % hr}
    return {"budget": int(info.Budget), "current_usage": int(info.CurrentUsage),
            "current_reservation": int(info.CurrentReservation)}


def read():
    """Every adapter DXGI lists, with this process's usage of its segments, as data."""
    raw = {"source": "dxgi", "pid": os.getpid(), "adapters": [], "error": None}
    if sys.platform != "win32":
        raw["error"] = "DXGI is Windows-only (this is %s)" % sys.platform
        return raw
    factory = ctypes.c_void_p()
    try:
        dxgi = ctypes.WinDLL("dxgi.dll")
        hr = dxgi.CreateDXGIFactory1(ctypes.byref(_guid(_IID_IDXGIFactory1)), ctypes.byref(factory))
        if hr & 0xFFFFFFFF:
            raw["error"] = "CreateDXGIFactory1 0x%08x" % (hr & 0xFFFFFFFF)
            return raw
        enum = _method(factory, _ENUM_ADAPTERS1, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
        index = 0
        while index < 64:
            adapter = ctypes.c_void_p()
            hr = enum(index, ctypes.byref(adapter))
            if hr == _DXGI_ERROR_NOT_FOUND:
                break
            if hr:
                raw["adapters"].append({"index": index, "error": "EnumAdapters1 0x%08x" % hr})
                break
            entry = {"index": index}
            adapter3 = ctypes.c_void_p()
            try:
                desc = _AdapterDesc1()
                if not _method(adapter, _GET_DESC1, ctypes.POINTER(_AdapterDesc1))(ctypes.byref(desc)):
                    entry.update(name=desc.Description, vendor_id=int(desc.VendorId),
                                 device_id=int(desc.DeviceId),
                                 dedicated=int(desc.DedicatedVideoMemory),
                                 software=bool(desc.Flags & _ADAPTER_FLAG_SOFTWARE),
                                 luid="%08x:%08x" % (desc.AdapterLuid.HighPart & 0xFFFFFFFF,
                                                     desc.AdapterLuid.LowPart))
                hr = _method(adapter, _QUERY_INTERFACE, ctypes.POINTER(_GUID),
                             ctypes.POINTER(ctypes.c_void_p))(ctypes.byref(_guid(_IID_IDXGIAdapter3)),
                                                              ctypes.byref(adapter3))
                if hr:
                    entry["error"] = "no IDXGIAdapter3 (0x%08x): Windows 10 or later has it" % hr
                else:
                    entry["local"] = _segment(adapter3, _LOCAL)
                    entry["non_local"] = _segment(adapter3, _NON_LOCAL)
            finally:
                _release(adapter3)
                _release(adapter)
            raw["adapters"].append(entry)
            index += 1
    except Exception as exc:  # no dxgi.dll, a vtable this Windows does not have
        raw["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        _release(factory)
    return raw


def report(raw):
    """The ledger's figure from ``raw`` (what ``read`` returned, live or recorded).

    ``process_used``: this process's usage of the adapters' local segments, summed over the
    hardware adapters, or None; ``adapters``: each one it uses (name, local and non-local
    usage, the OS's budget for it); ``why``: why there is no figure, else None.
    """
    out = {"source": "dxgi", "pid": raw.get("pid"), "process_used": None, "adapters": [],
           "why": None}
    if raw.get("error") and not raw.get("adapters"):
        out["why"] = raw["error"]
        return out
    for entry in raw.get("adapters") or []:
        local = entry.get("local") or {}
        if entry.get("software") or "current_usage" not in local:
            continue
        non_local = entry.get("non_local") or {}
        if local["current_usage"] or non_local.get("current_usage"):
            out["adapters"].append({"index": entry.get("index"), "name": entry.get("name"),
                                    "luid": entry.get("luid"), "local_used": local["current_usage"],
                                    "local_budget": local.get("budget"),
                                    "non_local_used": non_local.get("current_usage"),
                                    "non_local_budget": non_local.get("budget")})
    if out["adapters"]:
        out["process_used"] = sum(a["local_used"] for a in out["adapters"])
    else:
        out["why"] = "DXGI reports no video memory used by this process on any hardware adapter"
    return out


def process_memory():
    """``report(read())``: this process's video memory now."""
    return report(read())
