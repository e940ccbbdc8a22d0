"""Plugin execution providers inside a worker or a probe: locate, register, pick, bind.

One implementation of the steps that bring a plugin EP up, shared by probe mode
(which reports each step as data) and the onnxruntime runtime (which builds a session on it):

1. **locate** the library: the path the client located, or the table's Python package
   (``get_library_path()`` or ``library_path()``);
2. (the client refuses a known wrong library before this module runs);
3. put the library's folder on the **DLL search path** (``os.add_dll_directory``, Windows) before
   registering, because an EP DLL pulls libraries from beside it (VitisAI's ``dyn_dispatch_core.dll``
   and ``vaiml.dll``); the handle is kept for the life of the process;
4. **register** it with ``onnxruntime.register_execution_provider_library`` (once per process);
5. **pick** the EP devices whose ``ep_name`` is the EP's and whose hardware device type (and
   vendor id, device id, metadata where the client asks) match;
6. **bind** them with ``SessionOptions.add_provider_for_devices``.

Python 3.9, standard library only at import time; onnxruntime is passed in.
"""

import os

__all__ = ["StepFailed", "device_row", "library_of", "matches", "matching_devices", "register"]

#: Registrations made in this process: name -> library path.
_REGISTERED = {}
#: ``os.add_dll_directory`` handles: the directory stays on the search path while one lives.
_DLL_HANDLES = []
_MAX_ERROR = 2000


class StepFailed(Exception):
    """One step failed: ``step`` names it (``locate``, ``register``), the message says why."""

    def __init__(self, step, message):
        Exception.__init__(self, message)
        self.step = step


def _text(exc):
    return ("%s: %s" % (type(exc).__name__, str(exc).strip()))[:_MAX_ERROR]


def library_of(module):
    """The library a plugin package ships: ``get_library_path()``, else ``library_path()``."""
    for name in ("get_library_path", "library_path"):
        fn = getattr(module, name, None)
        if callable(fn):
            return str(fn())
    raise StepFailed("locate", "the package %s has neither get_library_path() nor library_path()"
                     % getattr(module, "__name__", "?"))


def register(ort, ep_name, library=None, module=None, dll_dir=True, info=None):
    """Steps 1, 3 and 4: the library located, its folder on the search path, registered.

    ``info`` (a dict) receives what each step found: ``module``, ``version``, ``library_path``,
    ``dll_directory``. Returns the library path. Raises ``StepFailed`` naming the step.
    """
    info = info if info is not None else {}
    if module:
        try:
            mod = __import__(module)
        except Exception as exc:
            info["importable"] = False
            raise StepFailed("locate", "the package %s is not importable: %s"
                             % (module, _text(exc))) from exc
        info["importable"] = True
        info["version"] = getattr(mod, "__version__", None)
        try:
            library = library_of(mod)
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed("locate", "%s could not name its library: %s"
                             % (module, _text(exc))) from exc
    info["library_path"] = library
    if not library:
        raise StepFailed("locate", "no library was located")
    if ep_name in _REGISTERED:
        if _REGISTERED[ep_name] != library:
            raise StepFailed("register", "%s is already registered from %s in this process"
                             % (ep_name, _REGISTERED[ep_name]))
        return library
    if not os.path.isfile(library):
        raise StepFailed("locate", "no file at %s" % library)
    if not hasattr(ort, "register_execution_provider_library"):
        raise StepFailed("register", "onnxruntime %s has no register_execution_provider_library "
                         "(plugin EPs need onnxruntime >= 1.22)" % getattr(ort, "__version__", "?"))
    folder = os.path.dirname(os.path.abspath(library))
    if dll_dir and hasattr(os, "add_dll_directory"):
        try:
            _DLL_HANDLES.append(os.add_dll_directory(folder))
            info["dll_directory"] = folder
        except OSError as exc:
            info["dll_directory_error"] = _text(exc)
    try:
        ort.register_execution_provider_library(ep_name, library)
    except Exception as exc:
        raise StepFailed("register", _text(exc)) from exc
    _REGISTERED[ep_name] = library
    return library


def _type_name(value):
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1].upper()


def device_row(ep_device):
    """One ``OrtEpDevice`` as plain data (the probe's rows, the worker's bound device)."""
    hw = ep_device.device
    return {
        "ep_name": ep_device.ep_name,
        "ep_vendor": getattr(ep_device, "ep_vendor", None),
        "ep_metadata": dict(getattr(ep_device, "ep_metadata", {}) or {}),
        "device_type": _type_name(hw.type),
        "device_vendor": hw.vendor,
        "device_vendor_id": int(hw.vendor_id),
        "device_id": int(hw.device_id),
        "device_metadata": dict(getattr(hw, "metadata", {}) or {}),
    }


def matches(row, select):
    """Whether one device row fits a selector (type, vendor id, device id, metadata)."""
    if select.get("device_type") and row["device_type"] != _type_name(select["device_type"]):
        return False
    if select.get("vendor_id") is not None and row["device_vendor_id"] != int(select["vendor_id"]):
        return False
    if select.get("device_id") is not None and row["device_id"] != int(select["device_id"]):
        return False
    for key, value in (select.get("device_metadata") or {}).items():
        if str(row["device_metadata"].get(key)) != str(value):
            return False
    for key, value in (select.get("ep_metadata") or {}).items():
        if key in ("version", "library_path"):
            continue
        if str(row["ep_metadata"].get(key)) != str(value):
            return False
    return True


def matching_devices(ort, ep_name, select):
    """Step 5: the EP devices of ``ep_name`` that fit ``select``, with their rows."""
    out = []
    for ep_device in ort.get_ep_devices():
        if ep_device.ep_name != ep_name:
            continue
        row = device_row(ep_device)
        if matches(row, select):
            out.append((ep_device, row))
    return out
