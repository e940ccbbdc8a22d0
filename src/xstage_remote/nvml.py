"""Device memory of this process on NVIDIA GPUs, from NVML (``libnvidia-ml``) through ctypes.

Python 3.9 syntax, standard library only: the ORT worker (CUDA, TensorRT) and the torch-cuda
worker both read it, and neither may depend on ``pynvml``. ``read()`` asks the driver; ``report()``
turns what it read (a plain dict, which a test can replay from a recording) into the figure the
ledger charges: the memory NVML attributes to this process, summed over the GPUs it is on.

NVML reports a process's current use, not its peak. Read after the warm-up, it holds what the
runtime grew to: onnxruntime's CUDA arena and torch's caching allocator keep what they took.
A process NVML does not list (another PID namespace, a MIG slice that hides per-process use) is
not guessed at: the figure is None and ``why`` says so.
"""

import ctypes
import os
import sys

__all__ = ["read", "report", "process_memory"]

_SUCCESS = 0
_ERROR_INSUFFICIENT_SIZE = 7
_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):  # the _v2 and _v3 calls' nvmlProcessInfo_t
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _library():
    if sys.platform == "win32":
        names = ["nvml.dll", os.path.join(os.environ.get("SystemRoot", r"C:\Windows"), "System32",
                                           "nvml.dll"),
                 os.path.join(os.environ.get("ProgramFiles", r"C:\Program Files"),
                              "NVIDIA Corporation", "NVSMI", "nvml.dll")]
    else:
        names = ["libnvidia-ml.so.1", "libnvidia-ml.so", "/usr/lib/wsl/lib/libnvidia-ml.so.1"]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name), None
        except OSError as exc:
            errors.append("%s: %s" % (name, exc))
    return None, "; ".join(errors)


def _text(lib, call, *args):
    buf = ctypes.create_string_buffer(256)
    fn = getattr(lib, call, None)
    if fn is None or fn(*(args + (buf, ctypes.c_uint(256)))) != _SUCCESS:
        return None
    return buf.value.decode("utf-8", "replace")


#: The two per-process lists NVML keeps: CUDA contexts (compute) and graphics contexts (a
#: Vulkan device such as the WebGPU EP's lists there; on an H100 it showed in both).
_LISTS = (("compute", "nvmlDeviceGetComputeRunningProcesses"),
          ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"))


def _process_list(lib, handle, base):
    """``[{"pid", "used"}]`` of one of NVML's process lists on ``handle`` (used None: not available)."""
    for call, struct in ((base + "_v3", _ProcessInfoV2), (base + "_v2", _ProcessInfoV2),
                         (base, _ProcessInfoV1)):
        fn = getattr(lib, call, None)
        if fn is None:
            continue
        count = ctypes.c_uint(0)
        rc = fn(handle, ctypes.byref(count), None)
        if rc == _SUCCESS:
            return [], call
        if rc != _ERROR_INSUFFICIENT_SIZE:
            return None, "%s returned %d" % (call, rc)
        for _ in range(3):  # processes may start between the two calls
            size = count.value + 8
            infos = (struct * size)()
            count = ctypes.c_uint(size)
            rc = fn(handle, ctypes.byref(count), infos)
            if rc == _SUCCESS:
                return [{"pid": int(infos[i].pid),
                         "used": None if infos[i].usedGpuMemory == _VALUE_NOT_AVAILABLE
                         else int(infos[i].usedGpuMemory)} for i in range(count.value)], call
            if rc != _ERROR_INSUFFICIENT_SIZE:
                return None, "%s returned %d" % (call, rc)
        return None, "%s: the process list kept growing" % call
    return None, "no %s in this libnvidia-ml" % base


def _processes(lib, handle):
    """Every process on ``handle`` from both lists, one entry per pid (``lists`` names where
    NVML listed it; ``used`` the larger figure where both list it), and the calls made."""
    merged = {}
    calls = []
    errors = []
    for label, base in _LISTS:
        procs, call = _process_list(lib, handle, base)
        if procs is None:
            errors.append(call)
            continue
        calls.append(call)
        for proc in procs:
            seen = merged.setdefault(proc["pid"],
                                     {"pid": proc["pid"], "used": proc["used"], "lists": []})
            seen["lists"].append(label)
            if proc["used"] is not None and (seen["used"] is None or proc["used"] > seen["used"]):
                seen["used"] = proc["used"]
    if not calls:
        return None, "; ".join(errors)
    return list(merged.values()), ", ".join(calls + errors)


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint),
                ("pciSubSystemId", ctypes.c_uint), ("busId", ctypes.c_char * 32)]


def _pci(lib, handle):
    """The GPU's PCI address as ``dddd:bb:dd.f`` and its ``vendor:device`` id, or (None, None)."""
    fn = getattr(lib, "nvmlDeviceGetPciInfo_v3", None)
    info = _PciInfo()
    if fn is None or fn(handle, ctypes.byref(info)) != _SUCCESS:
        return None, None
    text = info.busId.decode("ascii", "replace").lower()
    parts = text.split(":")
    if len(parts) == 3:  # NVML writes an 8-digit domain: 00000000:00:06.0
        text = "%04x:%s:%s" % (int(parts[0], 16), parts[1], parts[2])
    ids = "%04x:%04x" % (info.pciDeviceId & 0xFFFF, info.pciDeviceId >> 16)
    return text, ids


def _device(lib, handle, index):
    out = {"index": index, "name": _text(lib, "nvmlDeviceGetName", handle),
           "uuid": _text(lib, "nvmlDeviceGetUUID", handle), "total": None, "used": None}
    mem = _Memory()
    if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == _SUCCESS:
        out["total"], out["used"] = int(mem.total), int(mem.used)
    out["processes"], out["call"] = _processes(lib, handle)
    out["pci_address"], out["pci_id"] = _pci(lib, handle)
    mig = ctypes.c_uint(0)
    pending = ctypes.c_uint(0)
    get_mig = getattr(lib, "nvmlDeviceGetMigMode", None)
    if get_mig is not None and get_mig(handle, ctypes.byref(mig), ctypes.byref(pending)) == _SUCCESS:
        out["mig"] = bool(mig.value)
    return out


def read():
    """What NVML says now: the driver, every GPU (its PCI address), and every compute and graphics
    process on each, as data.

    Never raises: a missing library or a failing call is the ``error`` field.
    """
    lib, why = _library()
    raw = {"source": "nvml", "pid": os.getpid(), "driver": None, "devices": [], "error": None}
    if lib is None:
        raw["error"] = "libnvidia-ml not loadable: " + why
        return raw
    init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
    rc = init() if init is not None else -1
    if rc != _SUCCESS:
        raw["error"] = "nvmlInit returned %d" % rc
        return raw
    try:
        raw["driver"] = _text(lib, "nvmlSystemGetDriverVersion")
        count = ctypes.c_uint(0)
        get_count = getattr(lib, "nvmlDeviceGetCount_v2", None) or lib.nvmlDeviceGetCount
        if get_count(ctypes.byref(count)) != _SUCCESS:
            raw["error"] = "nvmlDeviceGetCount failed"
            return raw
        by_index = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if by_index(ctypes.c_uint(index), ctypes.byref(handle)) != _SUCCESS:
                raw["devices"].append({"index": index, "error": "no handle"})
                continue
            raw["devices"].append(_device(lib, handle, index))
    except Exception as exc:  # a symbol this driver lacks: say so, never fail the worker
        raw["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        shutdown = getattr(lib, "nvmlShutdown", None)
        if shutdown is not None:
            shutdown()
    return raw


def report(raw, pid=None):
    """The ledger's figure from ``raw`` (what ``read`` returned, live or recorded).

    Returns a dict: ``process_used`` (bytes NVML attributes to ``pid`` over all GPUs, or
    None), ``devices`` (each GPU ``pid`` is on: index, name, uuid, its bytes, the device's
    total and used), ``source`` and ``why`` (why there is no figure, else None).
    """
    pid = raw.get("pid") if pid is None else pid
    out = {"source": "nvml", "driver": raw.get("driver"), "pid": pid, "process_used": None,
           "devices": [], "why": None}
    if raw.get("error") and not raw.get("devices"):
        out["why"] = raw["error"]
        return out
    hidden = []
    for dev in raw.get("devices") or []:
        for proc in dev.get("processes") or []:
            if proc.get("pid") != pid:
                continue
            if proc.get("used") is None:
                hidden.append(dev.get("index"))
                continue
            out["devices"].append({"index": dev.get("index"), "name": dev.get("name"),
                                   "uuid": dev.get("uuid"), "pci_address": dev.get("pci_address"),
                                   "pci_id": dev.get("pci_id"), "lists": proc.get("lists", ["compute"]),
                                   "process_used": proc["used"],
                                   "total": dev.get("total"), "used": dev.get("used")})
    if out["devices"]:
        out["process_used"] = sum(d["process_used"] for d in out["devices"])
    elif hidden:
        out["why"] = ("NVML lists pid %d on GPU %s without its memory (a MIG slice or a vGPU "
                      "does not report it per process)" % (pid, hidden))
    else:
        listed = sorted({p.get("pid") for d in raw.get("devices") or []
                         for p in d.get("processes") or []})
        out["why"] = ("NVML lists no compute or graphics process with pid %d (it lists %s): not yet "
                      "on a GPU, or another PID namespace (a container shows the host's pids)"
                      % (pid, listed))
    return out


def process_memory():
    """``report(read())``: this process's device memory now."""
    return report(read())
