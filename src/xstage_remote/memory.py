"""The worker's own memory, read by the worker (it may live in another OS than its client).

Why not ``getrusage``'s ``ru_maxrss`` on Linux: the kernel carries the high-water mark of the
image that called ``exec`` into the new one (``signal->maxrss``), so a worker started by a
700 MiB client reported a 714 MiB peak while it held 63 MiB. ``VmHWM`` in
``/proc/self/status`` belongs to the worker's own address space, but one read costs ~8 µs
here, four times a whole 64 B round trip's share. The resident set only grows through page
faults, so a call whose fault count (``getrusage``, ~0.7 µs) did not move cannot have moved the
high-water mark either: the file is read again only after faults (after warm-up a call makes
none here), and the current RSS comes from ``statm`` (~1 µs). (Pages a driver populates
without a fault and frees within one call would escape this; none of our runtimes was seen to.)
``smaps_rollup`` gives PSS and USS (~170 µs, so only on ``evidence`` and ``ping``), because
shared libraries mapped by several workers count in each one's RSS.

Windows: ``GetProcessMemoryInfo`` (working set, its peak, private bytes) with explicit ctypes
signatures. macOS: ``ru_maxrss`` (bytes there, KiB on Linux) is the peak; the current RSS is
not read. The parsers are pure and tested on recorded values everywhere; the Windows and
macOS readers themselves run only there. Python 3.9 syntax, standard library only.
"""

import os
import sys

try:
    from resource import RUSAGE_SELF as _RUSAGE_SELF
    from resource import getrusage as _getrusage
except ImportError:  # Windows
    _RUSAGE_SELF = _getrusage = None

__all__ = [
    "detail",
    "parse_smaps_rollup",
    "parse_status",
    "peak_from_maxrss",
    "read",
    "read_cached",
    "release_freed",
    "reset_peak",
    "windows_counters_from_bytes",
]

_FD = {}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Linux: the page-fault count when ``status`` was last read, and the peak it gave.
_SEEN = {"faults": -1, "peak": 0, "rss": 0}


def parse_status(text):
    """``(rss, peak)`` in bytes from ``/proc/<pid>/status`` text (``VmRSS``, ``VmHWM``).

    A field that is missing (kernel threads, odd kernels) reads as 0. The kernel updates the
    high-water mark lazily, so a peak below the current RSS is raised to it.
    """
    rss = peak = 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = _kib(line)
        elif line.startswith("VmHWM:"):
            peak = _kib(line)
    return rss, max(peak, rss)


def parse_smaps_rollup(text):
    """``{"rss", "pss", "uss"}`` in bytes from ``/proc/<pid>/smaps_rollup`` text.

    USS is what the process alone holds: ``Private_Clean + Private_Dirty``.
    """
    fields = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and rest.strip().endswith("kB"):
            fields[name.strip()] = _kib(line)
    if "Rss" not in fields:
        return {}
    return {
        "rss": fields["Rss"],
        "pss": fields.get("Pss", 0),
        "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def peak_from_maxrss(value, platform_name):
    """``ru_maxrss`` in bytes: macOS reports bytes, Linux and the BSDs KiB."""
    return int(value) * (1 if platform_name == "darwin" else 1024)


def _kib(line):
    parts = line.split()
    try:
        return int(parts[1]) * 1024
    except (IndexError, ValueError):
        return 0


def _proc_text(name, size):
    """A ``/proc/self`` file through a descriptor kept open (one ``pread`` per reading)."""
    fd = _FD.get(name)
    if fd is None:
        fd = os.open("/proc/self/" + name, os.O_RDONLY)
        _FD[name] = fd
    return os.pread(fd, size, 0).decode("ascii", "replace")


# --------------------------------------------------------------------------- Windows
def _windows_struct():
    import ctypes

    # DWORD is 32 bits by definition (ctypes.wintypes.DWORD is a C long: 64 bits on Linux).
    class PROCESS_MEMORY_COUNTERS_EX(ctypes.Structure):  # noqa: N801 (the Win32 name)
        _fields_ = [
            ("cb", ctypes.c_uint32),
            ("PageFaultCount", ctypes.c_uint32),
            ("PeakWorkingSetSize", ctypes.c_size_t),
            ("WorkingSetSize", ctypes.c_size_t),
            ("QuotaPeakPagedPoolUsage", ctypes.c_size_t),
            ("QuotaPagedPoolUsage", ctypes.c_size_t),
            ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t),
            ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
            ("PagefileUsage", ctypes.c_size_t),
            ("PeakPagefileUsage", ctypes.c_size_t),
            ("PrivateUsage", ctypes.c_size_t),
        ]

    return PROCESS_MEMORY_COUNTERS_EX


def windows_counters_from_bytes(raw):
    """``{"rss", "peak", "private"}`` from the raw bytes of a PROCESS_MEMORY_COUNTERS_EX."""
    struct_type = _windows_struct()
    counters = struct_type.from_buffer_copy(bytes(raw).ljust(_sizeof(struct_type), b"\0"))
    return {
        "rss": int(counters.WorkingSetSize),
        "peak": max(int(counters.PeakWorkingSetSize), int(counters.WorkingSetSize)),
        "private": int(counters.PrivateUsage),
    }


def _sizeof(t):
    import ctypes

    return ctypes.sizeof(t)


def _windows_read():  # pragma: no cover - runs on Windows only
    import ctypes
    from ctypes import wintypes

    struct_type = _windows_struct()
    fn = _FD.get("GetProcessMemoryInfo")
    if fn is None:
        psapi = ctypes.WinDLL("psapi", use_last_error=True)
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        kernel32.GetCurrentProcess.restype = wintypes.HANDLE
        kernel32.GetCurrentProcess.argtypes = []
        fn = psapi.GetProcessMemoryInfo
        fn.restype = wintypes.BOOL
        fn.argtypes = [wintypes.HANDLE, ctypes.POINTER(struct_type), ctypes.c_uint32]
        _FD["GetProcessMemoryInfo"] = fn
        _FD["GetCurrentProcess"] = kernel32.GetCurrentProcess
    counters = struct_type()
    counters.cb = ctypes.sizeof(struct_type)
    if not fn(_FD["GetCurrentProcess"](), ctypes.byref(counters), counters.cb):
        return {}
    return windows_counters_from_bytes(ctypes.string_at(ctypes.addressof(counters),
                                                        ctypes.sizeof(struct_type)))


# --------------------------------------------------------------------------- readers
def read():
    """``(rss, peak)`` in bytes for every reply that carries timing; zeros where unknown.

    The peak (the kernel's high-water mark, from ``/proc``'s status) is re-read only when a page
    fault happened since the last reading; the RSS is read each time. A reply's reading goes
    through ``read_cached``.
    """
    if sys.platform.startswith("linux"):
        try:
            return _linux_read()
        except OSError:
            pass
    elif sys.platform == "win32":  # pragma: no cover - Windows only
        got = _windows_read()
        return got.get("rss", 0), got.get("peak", 0)
    try:
        import resource
    except ImportError:
        return 0, 0
    return 0, peak_from_maxrss(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, sys.platform)


def _linux_read():
    usage = _getrusage(_RUSAGE_SELF)
    faults = usage.ru_minflt + usage.ru_majflt
    if faults != _SEEN["faults"]:
        _SEEN["peak"] = parse_status(_proc_text("status", 4096))[1]
        _SEEN["faults"] = faults
    rss = int(_proc_text("statm", 256).split()[1]) * _PAGE
    _SEEN["rss"] = rss
    return rss, max(_SEEN["peak"], rss)


#: ``read_cached``: the reading it last took, the fault count it was taken at, and how many
#: replies reused it since.
_CACHED = {"faults": None, "reading": (0, 0), "reused": 0}
_LINUX = sys.platform.startswith("linux")
#: A reading is taken afresh after at most this many reuses, faults or not (an RSS can fall
#: without a fault, when memory is unmapped; and pages the kernel maps in without a fault of
#: this process, such as ``MAP_POPULATE``, raise it without one).
REUSE_AT_MOST = 63


def read_cached():
    """``read()`` for the reply of every call, at one ``getrusage`` where nothing changed.

    The peak (``VmHWM``) and the RSS grow only through page faults, which ``getrusage``
    counts for every thread of the process: while the count stands still, the last reading
    still holds, and it is reused (at most ``REUSE_AT_MOST`` times in a row). Any fault since
    takes a full reading (``read``): the high-water mark the kernel keeps is read then, so a
    peak reached inside a call is in that call's reply.
    """
    if not _LINUX:
        return read()
    usage = _getrusage(_RUSAGE_SELF)
    cached = _CACHED
    if usage.ru_minflt + usage.ru_majflt == cached["faults"] and cached["reused"] < REUSE_AT_MOST:
        cached["reused"] += 1
        return cached["reading"]
    reading = read()
    _CACHED.update(faults=_SEEN["faults"], reading=reading, reused=0)
    return reading


def reset_peak():
    """Lower the kernel's high-water mark to the current resident set; whether it could.

    Linux (4.0 and later): ``5`` written to ``/proc/self/clear_refs`` resets ``VmHWM`` to
    ``VmRSS``, so a later reading is the peak since then (the worker's peak apart from memory it
    has freed, such as a profiled session's events). Elsewhere, or where the file refuses the
    write, False: the peak then still covers everything before.
    """
    if not _LINUX:
        return False
    try:
        fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
        try:
            os.write(fd, b"5")
        finally:
            os.close(fd)
    except OSError:
        return False
    _SEEN["faults"] = -1  # the next reading reads the status file again
    _CACHED["faults"] = None
    return True


def release_freed():
    """Hand back to the OS what the C allocator keeps after frees (glibc's ``malloc_trim``), so
    the resident set is what the process still holds; whether it ran (False off glibc)."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except Exception:  # not glibc (musl, macOS, Windows)
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def detail():
    """Everything this OS offers, with ``source`` saying where it came from (evidence, ping)."""
    rss, peak = read()
    out = {"rss": rss, "peak": peak}
    if sys.platform.startswith("linux"):
        out["source"] = "proc-status"
        try:
            out.update({k: v for k, v in parse_smaps_rollup(_proc_text("smaps_rollup", 8192)).items()
                        if k != "rss"})
        except OSError:
            pass
    elif sys.platform == "win32":  # pragma: no cover - Windows only
        out["source"] = "GetProcessMemoryInfo"
        got = _windows_read()
        if "private" in got:
            out["private"] = got["private"]
    else:
        out["source"] = "ru_maxrss"
    return out
