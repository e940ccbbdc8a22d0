"""Probe mode: report what this interpreter can run, as exactly one JSON document.

The client (``xstage.routes.probe``) starts this under a route's interpreter to learn, by
running it, which Python, numpy, onnxruntime build, execution providers, EP devices and torch
devices live there. Resolution is built on this report, never on guesses from file names.

Rules this module keeps:

* Python 3.9 syntax, standard library only at import time; numpy, onnxruntime, plugin EP
  packages and torch are imported inside ``try`` blocks, and an import that fails is reported
  as data (``"error": "<type>: <message>"``), never as a crash.
* fd 1 is duplicated first and then pointed at fd 2, so a native library that prints while
  loading (OpenVINO, CUDA, DirectML all do) cannot corrupt the document; the document is
  written to the duplicate, once, at the end.
* torch is imported only with ``--torch``: importing it costs seconds.

Usage (through ``xstage.client.staging.worker_argv(python, "probe", ...)``)::

    probe [--torch] [--plugin MODULE]... [--plugin-ep JSON]...

``--plugin-ep`` brings up one plugin EP of the ``ort-plugin:`` family step by step
(``plugin_ep``): ``{"key", "ep_name", "module" | "library", "dll_dir"}``; the report under
``onnxruntime.plugin_eps[key]`` (the route's name) says which step failed (``step``) and why
(``error``).
"""

import json
import os
import platform
import sys

__all__ = ["PROBE_SCHEMA", "main", "collect"]

#: Bumped when the document's shape changes incompatibly; the client checks it.
PROBE_SCHEMA = 1


def _error(exc):
    """An exception as data: its type and message, on one line."""
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


def _dist_version(name):
    """The installed version of distribution ``name``, or None."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8 cannot run the probe anyway
        return None
    try:
        return metadata.version(name)
    except Exception:
        return None


def _python():
    return {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "version_info": list(sys.version_info[:3]),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "platform": sys.platform,
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "bits": 64 if sys.maxsize > 2**32 else 32,
    }


def _numpy():
    try:
        import numpy
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    return {"importable": True, "version": numpy.__version__}


def _ep_devices(ort):
    """``get_ep_devices()`` as plain data, or None where the API does not exist (< 1.22)."""
    if not hasattr(ort, "get_ep_devices"):
        return None
    rows = []
    for ep_device in ort.get_ep_devices():
        hw = ep_device.device
        dtype = getattr(hw.type, "name", str(hw.type))
        rows.append(
            {
                "ep_name": ep_device.ep_name,
                "ep_vendor": ep_device.ep_vendor,
                "ep_metadata": dict(ep_device.ep_metadata),
                "ep_options": dict(getattr(ep_device, "ep_options", {}) or {}),
                "device_type": str(dtype).split(".")[-1].upper(),
                "device_vendor": hw.vendor,
                "device_vendor_id": int(hw.vendor_id),
                "device_id": int(hw.device_id),
                "device_metadata": dict(hw.metadata),
            }
        )
    return rows


# Distributions that provide the ``onnxruntime`` module; which one is installed matters
# (onnxruntime-directml stops at 1.24.x, onnxruntime-openvino carries the built-in EP).
_ORT_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-openvino",
    "onnxruntime-directml",
    "onnxruntime-gpu",
    "onnxruntime-qnn",
    "onnxruntime-vitisai",
)


def _plugin(ort, module_name):
    """Import a plugin EP package, register its library, and list what it added."""
    info = {"module": module_name, "importable": False, "registered": False}
    try:
        module = __import__(module_name)
    except Exception as exc:
        info["error"] = _error(exc)
        return info
    info["importable"] = True
    info["version"] = _dist_version(module_name.replace("_", "-")) or getattr(module, "__version__", None)
    try:
        ep_name = module.get_ep_name() if hasattr(module, "get_ep_name") else None
        if ep_name is None and hasattr(module, "get_ep_names"):
            names = list(module.get_ep_names())
            ep_name = names[0] if names else None
        info["ep_name"] = ep_name
        info["library_path"] = module.get_library_path()
    except Exception as exc:
        info["error"] = _error(exc)
        return info
    if not hasattr(ort, "register_execution_provider_library"):
        info["error"] = (
            "onnxruntime %s has no register_execution_provider_library "
            "(plugin EPs need onnxruntime >= 1.22)" % ort.__version__
        )
        return info
    try:
        ort.register_execution_provider_library(ep_name, info["library_path"])
    except Exception as exc:
        info["error"] = _error(exc)
        return info
    info["registered"] = True
    info["registration_name"] = ep_name
    return info


def _plugin_ep(ort, request):
    """Bring one plugin EP up (locate, search path, register) and report each step as data."""
    from . import plugin_ep

    info = {"ep_name": request.get("ep_name"), "module": request.get("module"),
            "requested_library": request.get("library"), "registered": False}
    try:
        plugin_ep.register(ort, request["ep_name"], library=request.get("library"),
                           module=request.get("module"), dll_dir=bool(request.get("dll_dir", True)),
                           info=info)
    except plugin_ep.StepFailed as exc:
        info["step"] = exc.step
        info["error"] = str(exc)
        return info
    except Exception as exc:  # a bug in a plugin package: reported, never a crash
        info["step"] = "register"
        info["error"] = _error(exc)
        return info
    info["registered"] = True
    if info.get("module") and not info.get("version"):
        info["version"] = _dist_version(info["module"].replace("_", "-"))
    return info


def _onnxruntime(plugins, plugin_eps=()):
    try:
        import onnxruntime as ort
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    info = {
        "importable": True,
        "version": getattr(ort, "__version__", None),
        "distributions": {
            name: version
            for name, version in ((d, _dist_version(d)) for d in _ORT_DISTRIBUTIONS)
            if version is not None
        },
        "ep_device_api": hasattr(ort, "get_ep_devices"),
        "plugin_api": hasattr(ort, "register_execution_provider_library"),
    }
    try:
        info["providers"] = list(ort.get_available_providers())
    except Exception as exc:
        info["providers"] = []
        info["providers_error"] = _error(exc)
    try:
        info["device"] = ort.get_device()
    except Exception as exc:
        info["device"] = None
        info["device_error"] = _error(exc)
    try:
        info["ep_devices"] = _ep_devices(ort)
    except Exception as exc:
        info["ep_devices"] = None
        info["ep_devices_error"] = _error(exc)
    if "OpenVINOExecutionProvider" in info["providers"]:
        # The built-in EP (onnxruntime-openvino) names the OpenVINO devices it can open.
        try:
            from onnxruntime.capi import _pybind_state

            info["openvino_device_ids"] = list(_pybind_state.get_available_openvino_device_ids())
        except Exception as exc:
            info["openvino_device_ids"] = None
            info["openvino_device_ids_error"] = _error(exc)
    info["plugins"] = {}
    registered = False
    for module_name in plugins:
        plugin = _plugin(ort, module_name)
        info["plugins"][module_name] = plugin
        registered = registered or plugin["registered"]
    if plugin_eps:
        info["plugin_eps"] = {}
        for request in plugin_eps:
            one = _plugin_ep(ort, request)
            info["plugin_eps"][request.get("key") or request.get("ep_name")] = one
            registered = registered or one["registered"]
    if registered:
        try:
            info["ep_devices_after_plugins"] = _ep_devices(ort)
        except Exception as exc:
            info["ep_devices_after_plugins"] = None
            info["ep_devices_after_plugins_error"] = _error(exc)
        try:
            info["providers_after_plugins"] = list(ort.get_available_providers())
        except Exception as exc:
            info["providers_after_plugins_error"] = _error(exc)
    return info


def _torch_directml():
    try:
        import torch_directml
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    info = {"importable": True, "version": _dist_version("torch-directml"), "adapters": []}
    try:
        for index in range(int(torch_directml.device_count())):
            info["adapters"].append({"index": index, "name": torch_directml.device_name(index)})
    except Exception as exc:
        info["error"] = _error(exc)
    return info


def _torch():
    try:
        import torch
    except Exception as exc:
        return {"importable": False, "error": _error(exc)}
    version = getattr(torch, "version", None)
    info = {
        "importable": True,
        "version": torch.__version__,
        "cuda_version": getattr(version, "cuda", None),
        "hip_version": getattr(version, "hip", None),
        "cuda_available": False,
        "cuda_devices": [],
    }
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                row = {
                    "index": index,
                    "name": props.name,
                    "total_memory": int(props.total_memory),
                    "capability": [props.major, props.minor],
                }
                bus = getattr(props, "pci_bus_id", None)
                if bus is not None:
                    row["pci"] = {
                        "domain": int(getattr(props, "pci_domain_id", 0)),
                        "bus": int(bus),
                        "device": int(getattr(props, "pci_device_id", 0)),
                    }
                try:
                    free, total = torch.cuda.mem_get_info(index)
                    row["free_memory"] = int(free)
                    row["total_memory"] = int(total)
                except Exception as exc:
                    row["free_memory"] = None
                    row["mem_get_info_error"] = _error(exc)
                info["cuda_devices"].append(row)
    except Exception as exc:
        info["cuda_error"] = _error(exc)
    info["torch_directml"] = _torch_directml()
    return info


def collect(want_torch=False, plugins=(), plugin_eps=()):
    """The probe document as a dict (no I/O besides imports)."""
    return {
        "probe_schema": PROBE_SCHEMA,
        "python": _python(),
        "numpy": _numpy(),
        "onnxruntime": _onnxruntime(list(plugins), list(plugin_eps)),
        "torch": _torch() if want_torch else None,
    }


def _parse(argv):
    want_torch = False
    plugins = []
    plugin_eps = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--torch":
            want_torch = True
        elif arg == "--plugin" and args:
            plugins.append(args.pop(0))
        elif arg == "--plugin-ep" and args:
            try:
                request = json.loads(args.pop(0))
            except ValueError:
                request = None
            if not isinstance(request, dict) or not isinstance(request.get("ep_name"), str):
                sys.stderr.write("probe: --plugin-ep takes a JSON object with an ep_name\n")
                sys.exit(64)
            plugin_eps.append(request)
        else:
            sys.stderr.write("probe: unknown argument %r\n" % (arg,))
            sys.exit(64)
    return want_torch, plugins, plugin_eps


def main(argv=None):
    """Write the probe document to the original stdout; everything else goes to stderr."""
    want_torch, plugins, plugin_eps = _parse(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    out_fd = os.dup(1)
    os.dup2(2, 1)  # native libraries that print now print to stderr
    doc = collect(want_torch=want_torch, plugins=plugins, plugin_eps=plugin_eps)
    data = json.dumps(doc, sort_keys=True, default=str).encode("utf-8") + b"\n"
    view = memoryview(data)
    while view:
        written = os.write(out_fd, view)
        view = view[written:]
    os.close(out_fd)
    return 0


if __name__ == "__main__":
    main()
