"""The plugin-EP route family: ``[plugins.<name>]`` tables become routes ``ort-plugin:<name>``.

A plugin execution provider is a library onnxruntime loads at run time
(``register_execution_provider_library``, ORT >= 1.22), whose devices are bound to a session with
``SessionOptions.add_provider_for_devices``. Each table in ``./xstage.toml`` or the user config
file describes one::

    [plugins.ggml]
    module = "onnxruntime_ggml"        # a Python package that ships the library, or:
    # library = "/opt/ep/libmy_ep.so"  # the library itself (relative to the file)
    ep_name = "ggml"                   # its name in get_ep_devices()
    device_type = "cpu"                # cpu | gpu | npu: the EP devices to bind
    # vendor = "amd"                   # only EP devices of this vendor
    package = "onnxruntime-ggml"       # what `xstage env create ort-plugin:ggml` installs
    onnxruntime = ">=1.29,<1.31"       # the onnxruntime it needs (installed, and checked)
    formats = ["onnx:fp32"]
    [plugins.ggml.format_options."onnx:fp32"]
    weights = "f32"                    # given to an fp32 session unless --ep-option says otherwise

``ort-vitisai`` is the family's preset, the built-in table ``vitisai`` (``specs.VITISAI``): a
``[plugins.vitisai]`` table changes its ``library`` and ``options`` only. Its library is found by
:func:`locate_vitisai`, step by step.

Every step can fail by name (``docs/routes.md``, "Plugin EPs"): a malformed table is
``config_invalid``; a library not found ``ep_library_not_found``; the wrong library
``ep_library_wrong``; a dependency that does not load ``ep_dependency_not_loadable``; any other
registration failure ``ep_registration_failed``; no EP device of the type and vendor
``ep_no_device``. Pure but for reading the two config files (``load_tables``); the I/O of the
VitisAI locator (PowerShell, file checks) is passed in.
"""

from __future__ import annotations

import json
import ntpath
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from xstage.routes import config as cfg
from xstage.routes import option_hooks
from xstage.routes.specs import COMPILING_EP, PLUGIN_PREFIX, ROUTES, PluginEP, RouteSpec, get_spec
from xstage.routes.status import ReasonCode

__all__ = [
    "APPX_PACKAGE",
    "RYZEN_AI_ENV",
    "VITISAI_ENV",
    "Location",
    "all_specs",
    "classify_registration_error",
    "find_spec",
    "load_tables",
    "locate_vitisai",
    "parse_table",
    "route_names",
    "table_spec",
    "wrong_library",
]

#: The Windows app package the VitisAI EP ships in (docs/routes.md, ``ort-vitisai``, step 1).
APPX_PACKAGE = "WindowsWorkload.EP.AMD.VitisAI.Framework*"
#: The environment variable that names the VitisAI EP library first.
VITISAI_ENV = "XSTAGE_VITISAI_EP_LIBRARY"
#: The variable AMD's Ryzen AI Software installer sets to its install folder.
RYZEN_AI_ENV = "RYZEN_AI_INSTALLATION_PATH"
_RYZEN_AI_DEFAULT = r"C:\Program Files\RyzenAI"
_DEVICE_TYPES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}
_TABLE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_VERSION_BOUND = re.compile(r"\s*(>=|<)\s*([0-9][0-9.]*)\s*")
_KEYS = {"module", "library", "ep_name", "device_type", "vendor", "package", "onnxruntime", "formats",
         "options", "format_options", "dll_dir", "report"}
_PRESET_KEYS = {"library", "options"}  # what a table may change of a built-in preset
_ONNX_FORMATS = ("onnx:fp32", "onnx:fp16", "onnx:a16w8")
_MiB = 1 << 20


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ValueError(f"{what} must be a string or a list of strings, got {value!r}")


def _options(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str | int | float | bool)
                                              for v in value.values()):
        raise ValueError(f"{what} must be a table of strings or numbers, got {value!r}")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _bounds(text: str) -> tuple[str | None, str | None]:
    """``>=1.29,<1.31`` → (``1.29``, ``1.31``); only ``>=`` and ``<`` bounds are taken."""
    low = high = None
    for part in text.split(","):
        match = _VERSION_BOUND.fullmatch(part)
        if not match:
            raise ValueError(f"onnxruntime must be bounds like '>=1.29,<1.31', got {text!r}")
        if match.group(1) == ">=":
            low = match.group(2)
        else:
            high = match.group(2)
    return low, high


def parse_table(name: str, table: Any, source: Path) -> PluginEP:
    """One ``[plugins.<name>]`` table as a :class:`PluginEP`; never raises.

    A malformed table comes back with ``error`` set (the route is then ``config_invalid``), so
    a route never disappears because its table has a typo.
    """
    where = f"{source} [plugins.{name}]"
    try:
        if not _TABLE_NAME.fullmatch(name):
            raise ValueError(f"the table name must be lower-case letters, digits, '-', '_' or '.', "
                             f"got {name!r}")
        if not isinstance(table, dict):
            raise ValueError("must be a table")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ValueError(f"unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
        ep_name = table.get("ep_name")
        if not isinstance(ep_name, str) or not ep_name:
            raise ValueError("ep_name (the EP's name in get_ep_devices()) is required")
        module, library = table.get("module"), table.get("library")
        if (module is None) == (library is None):
            raise ValueError("give exactly one of module (a Python package that ships the library) "
                             "and library (its path)")
        if module is not None and (not isinstance(module, str) or not module.isidentifier()):
            raise ValueError(f"module must be a Python package name, got {module!r}")
        if library is not None:
            if not isinstance(library, str) or not library.strip():
                raise ValueError(f"library must be a path, got {library!r}")
            library = _absolute(library, source.parent)
        kind = str(table.get("device_type", "cpu")).lower()
        if kind not in _DEVICE_TYPES:
            raise ValueError(f"device_type must be one of {', '.join(_DEVICE_TYPES)}, got {kind!r}")
        vendor = table.get("vendor")
        if vendor is not None and (not isinstance(vendor, str) or not vendor):
            raise ValueError(f"vendor must be a name like 'amd', got {vendor!r}")
        formats = _strings(table.get("formats", ["onnx:fp32", "onnx:fp16"]), "formats")
        bad = [f for f in formats if f not in _ONNX_FORMATS]
        if bad:
            raise ValueError(f"formats must be among {', '.join(_ONNX_FORMATS)}, got {', '.join(bad)}")
        format_options = table.get("format_options", {})
        if not isinstance(format_options, dict):
            raise ValueError("format_options must be a table of tables")
        per_format = {}
        for fmt, opts in format_options.items():
            if fmt not in _ONNX_FORMATS:
                raise ValueError(f"format_options.{fmt!r} is not a format ({', '.join(_ONNX_FORMATS)})")
            per_format[fmt] = _frozen(_options(opts, f"format_options.{fmt!r}"))
        package = table.get("package", module.replace("_", "-") if module else None)
        packages = _strings(package, "package") if package is not None else ()
        ort = table.get("onnxruntime", ">=1.23")
        if not isinstance(ort, str):
            raise ValueError(f"onnxruntime must be a version bound string, got {ort!r}")
        _bounds(ort)
        dll_dir = table.get("dll_dir", True)
        if not isinstance(dll_dir, bool):
            raise ValueError(f"dll_dir must be true or false, got {dll_dir!r}")
        report = table.get("report")
        if report not in (None, "vitisai"):
            raise ValueError(f"report must be 'vitisai' (the EP's own operator report), got {report!r}")
        return PluginEP(
            table=name, ep_name=ep_name, device_type=_DEVICE_TYPES[kind],
            vendor=vendor.lower() if vendor else None,
            module=module, library=library, dll_dir=dll_dir, report=report,
            options=_frozen(_options(table.get("options", {}), "options")),
            format_options=_frozen(per_format), package=(f"onnxruntime{ort}", *packages),
            source=str(source), formats=formats,
        )
    except ValueError as exc:
        return PluginEP(table=name, ep_name="", source=str(source), error=f"{where}: {exc}")


def _absolute(path: str, base: Path) -> str:
    if ntpath.isabs(path) and re.match(r"^[A-Za-z]:[\\/]", path):
        return path  # a Windows path: kept as written (the route's interpreter reads it)
    expanded = Path(path).expanduser()
    return str(expanded if expanded.is_absolute() else base / expanded)


def _device_classes(plugin: PluginEP) -> tuple[tuple[str, str | None], ...]:
    if plugin.device_type == "GPU":
        return (("gpu_integrated", plugin.vendor), ("gpu_discrete", plugin.vendor))
    return (("npu" if plugin.device_type == "NPU" else "cpu", plugin.vendor),)


def table_spec(plugin: PluginEP) -> RouteSpec:
    """The route ``ort-plugin:<table>`` for one table (a malformed one too: it stays listed)."""
    from xstage.ledger.footprint import RouteCost

    low, high = _bounds(plugin.package[0][len("onnxruntime"):]) if plugin.package else (None, None)
    drives = _device_classes(plugin)
    return RouteSpec(
        name=PLUGIN_PREFIX + plugin.table,
        runtime="onnxruntime",
        device_class=drives[0][0],
        drives=drives,
        formats=plugin.formats,
        os_side="this",
        platforms=("linux", "wsl", "windows", "darwin"),
        verified=False,  # a user's table: xstage cannot know it ran anywhere
        packages=_frozen({"default": (*plugin.package, "numpy")}),
        ep=plugin.ep_name or None,
        ep_options=_frozen(plugin.options),
        min_runtime=low,
        max_runtime=high,
        version_note=f"[plugins.{plugin.table}] onnxruntime = {plugin.package[0][len('onnxruntime'):]!r}"
        if plugin.package else "",
        docs=plugin.source,
        ep_hook=option_hooks.format_options(plugin.format_options),
        plugin_ep=plugin,
        # A GPU plugin EP's process memory: NVML answers on an NVIDIA GPU and says why elsewhere.
        device_memory="nvml" if plugin.device_type == "GPU" and plugin.vendor in (None, "nvidia") else None,
        cost=RouteCost(120 * _MiB, 3.2, "not measured: a plugin EP, costed as a compiling EP in host RAM",
                       False, a16w8=COMPILING_EP.a16w8),
    )


def load_tables(*, cwd: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> list[PluginEP]:
    """Every ``[plugins.<name>]`` table of ``./xstage.toml`` and the user config file.

    The project file wins over the user file for a name both have. A file that is not valid
    TOML contributes nothing here (resolution reports it as ``config_invalid``); a ``plugins``
    value that is not a table is one malformed table named ``plugins``.
    """
    base = Path(cwd if cwd is not None else os.getcwd())
    env = dict(os.environ if environ is None else environ)
    found: dict[str, PluginEP] = {}
    for loaded in (cfg.user_config(env), cfg.project_config(base)):  # the project's if trusted
        path = loaded.path
        if loaded.error or "plugins" not in loaded.data:
            continue
        tables = loaded.data["plugins"]
        if not isinstance(tables, dict):
            found["plugins"] = PluginEP(table="plugins", ep_name="", source=str(path),
                                        error=f"{path}: [plugins] must hold tables [plugins.<name>]")
            continue
        for name, table in tables.items():
            found[name] = _preset_override(name, table, path) or parse_table(name, table, path)
    return list(found.values())


def _preset_override(name: str, table: Any, path: Path) -> PluginEP | None:
    """A table named after a built-in preset changes that preset (``library``, ``options``)."""
    preset = next((s.plugin_ep for s in ROUTES if s.plugin_ep and s.plugin_ep.table == name), None)
    if preset is None:
        return None
    where = f"{path} [plugins.{name}]"
    if not isinstance(table, dict) or set(table) - _PRESET_KEYS:
        extra = sorted(set(table) - _PRESET_KEYS) if isinstance(table, dict) else []
        return replace(preset, source=str(path), error=f"{where}: the built-in table {name} takes only "
                       f"{', '.join(sorted(_PRESET_KEYS))}" + (f", not {', '.join(extra)}" if extra else ""))
    try:
        library = table.get("library")
        if library is not None and (not isinstance(library, str) or not library.strip()):
            raise ValueError(f"library must be a path, got {library!r}")
        options = _options(table.get("options", {}), "options")
    except ValueError as exc:
        return replace(preset, source=str(path), error=f"{where}: {exc}")
    return replace(preset, source=str(path),
                   library=_absolute(library, path.parent) if library else preset.library,
                   options=_frozen({**preset.options, **options}))


def all_specs(*, cwd: str | os.PathLike[str] | None = None,
              environ: Mapping[str, str] | None = None) -> tuple[RouteSpec, ...]:
    """The built-in routes (a preset changed by its table), then one route per plugin table."""
    tables = load_tables(cwd=cwd, environ=environ)
    by_table = {t.table: t for t in tables}
    out = []
    for spec in ROUTES:
        if spec.plugin_ep is not None and spec.plugin_ep.table in by_table:
            spec = replace(spec, plugin_ep=by_table.pop(spec.plugin_ep.table))
        out.append(spec)
    out += [table_spec(t) for t in by_table.values()]
    return tuple(out)


def route_names(*, cwd: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every route's name in the fixed order: the built-in ones, then the plugin tables'."""
    return tuple(s.name for s in all_specs(cwd=cwd, environ=environ))


def find_spec(name: str, *, cwd: str | os.PathLike[str] | None = None,
              environ: Mapping[str, str] | None = None) -> RouteSpec:
    """The spec called ``name``, a plugin table's included.

    Raises:
        KeyError: no route has that name (the message lists the names that exist, and for an
            ``ort-plugin:`` name, where its table would go).
    """
    specs = all_specs(cwd=cwd, environ=environ)
    for spec in specs:
        if spec.name == name:
            return spec
    if name.startswith(PLUGIN_PREFIX):
        raise KeyError(f"unknown route {name!r}: no [plugins.{name[len(PLUGIN_PREFIX):]}] table in "
                       f"{cfg.project_config_path(cwd)} or "
                       f"{cfg.user_config_path(dict(environ or os.environ))}"
                       f"; routes: {', '.join(s.name for s in specs)}")
    try:
        return get_spec(name)
    except KeyError:
        raise KeyError(f"unknown route {name!r}; routes: {', '.join(s.name for s in specs)}") from None


# ---------------------------------------------------------------------------- library location


@dataclass(frozen=True)
class Location:
    """Where a plugin EP's library is, or which step failed, with every step taken.

    Attributes:
        path: the library's path as its interpreter sees it (None: not found, or the probe
            asks the table's module for it).
        steps: each step, for people (``1. XSTAGE_VITISAI_EP_LIBRARY: not set``).
        failure: (code, reason, remedy) when a step failed.
    """

    path: str | None
    steps: tuple[str, ...] = ()
    failure: tuple[ReasonCode, str, str] | None = None


def _basename(path: str) -> str:
    """A library's file name, lower case, from a Windows or a POSIX path."""
    return (ntpath.basename(path) if "\\" in path else os.path.basename(path)).lower()


def wrong_library(plugin: PluginEP, path: str) -> tuple[ReasonCode, str, str] | None:
    """Step 2: ``ep_library_wrong`` when ``path`` is a library known to run nothing."""
    base = _basename(path)
    for name, why in plugin.wrong_libraries.items():
        if base == name.lower():
            right = " or ".join(plugin.library_names) or "the EP's general library"
            return (ReasonCode.EP_LIBRARY_WRONG,
                    f"{path} is {name}, {why}", f"point the route at {right} (in the same folder) instead")
    return None


def _appx_locations(text: str | None) -> list[str]:
    """``InstallLocation`` of each package in ``Get-AppxPackage ... | ConvertTo-Json`` output."""
    if not text or not text.strip():
        return []
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    rows = doc if isinstance(doc, list) else [doc]
    return [str(r["InstallLocation"]) for r in rows
            if isinstance(r, dict) and isinstance(r.get("InstallLocation"), str) and r["InstallLocation"]]


def locate_vitisai(
    plugin: PluginEP,
    *,
    environ: Mapping[str, str],
    appx_json: str | None,
    ryzen_ai_files: Sequence[str],
    is_file: Callable[[str], bool],
) -> Location:
    """Steps 1-2 of the VitisAI recipe: find the general EP library, never the light one.

    In order, the first that names a library decides: ``XSTAGE_VITISAI_EP_LIBRARY``; the
    ``[plugins.vitisai] library`` of the config; the Windows app package
    (``Get-AppxPackage WindowsWorkload.EP.AMD.VitisAI.Framework*``: its ``InstallLocation`` +
    ``ExecutionProvider\\onnxruntime_vitisai_ep.dll`` — ``WindowsApps`` denies directory
    listing to a normal process, so the file is checked by its full path, never globbed);
    Ryzen AI's install folder (``RYZEN_AI_INSTALLATION_PATH``, else ``C:\\Program Files\\RyzenAI``).

    Args:
        plugin: the preset (its ``library`` is the config's).
        environ: the environment (the two variables).
        appx_json: what ``Get-AppxPackage ... | ConvertTo-Json`` printed (None: not run).
        ryzen_ai_files: the general library's paths found under Ryzen AI's folder.
        is_file: whether a Windows path names a readable file.
    """
    steps: list[str] = []
    wanted = plugin.library_names[0] if plugin.library_names else "the EP library"

    def found(path: str, how: str) -> Location:
        steps.append(f"{len(steps) + 1}. {how}: {path}")
        wrong = wrong_library(plugin, path)
        if wrong is not None:
            return Location(None, tuple(steps), wrong)
        if not is_file(path):
            return Location(None, tuple(steps), (
                ReasonCode.EP_LIBRARY_NOT_FOUND, f"{how} names {path}, which is not a readable file",
                f"fix {how}, or unset it to let the next step look"))
        return Location(path, tuple(steps))

    named = environ.get(VITISAI_ENV, "").strip()
    if named:
        return found(named, VITISAI_ENV)
    steps.append(f"1. {VITISAI_ENV}: not set")
    if plugin.library:
        return found(plugin.library, f"{plugin.source} [plugins.vitisai] library")
    steps.append("2. [plugins.vitisai] library: not set")
    locations = _appx_locations(appx_json)
    if appx_json is None:
        steps.append(f"3. Get-AppxPackage {APPX_PACKAGE}: not run (no PowerShell here)")
    elif not locations:
        steps.append(f"3. Get-AppxPackage {APPX_PACKAGE}: no such package")
    for location in locations:
        folder = ntpath.join(location, "ExecutionProvider")
        general = ntpath.join(folder, wanted)
        if is_file(general):
            steps.append(f"3. Get-AppxPackage {APPX_PACKAGE}: {location}")
            return found(general, "the app package's ExecutionProvider folder")
        light = [n for n in plugin.wrong_libraries if is_file(ntpath.join(folder, n))]
        only = f" (only {', '.join(light)}, the light EP)" if light else ""
        steps.append(f"3. Get-AppxPackage {APPX_PACKAGE}: {location}, but no {wanted} in its "
                     f"ExecutionProvider folder{only}")
    root = environ.get(RYZEN_AI_ENV, "").strip() or _RYZEN_AI_DEFAULT
    general = [p for p in ryzen_ai_files if ntpath.basename(p).lower() == wanted.lower()]
    if general:
        steps.append(f"4. Ryzen AI ({root}): {general[0]}")
        return Location(general[0], tuple(steps))
    steps.append(f"4. Ryzen AI ({root}): no {wanted}")
    return Location(None, tuple(steps), (
        ReasonCode.EP_LIBRARY_NOT_FOUND,
        f"the VitisAI EP library {wanted} was not found: " + "; ".join(steps),
        f"install the AMD NPU driver's EP package ({APPX_PACKAGE}) or AMD Ryzen AI Software, or set "
        f"{VITISAI_ENV} to the full path of {wanted}",
    ))


# ---------------------------------------------------------------------------- registration errors

_DEPENDENCY = re.compile(
    r"(which depends on|depend|error loading|the specified module could not be found|error 126|"
    r"cannot open shared object file)", re.IGNORECASE)


def classify_registration_error(error: str, library: str | None) -> ReasonCode:
    """Step 3-4's failures by what onnxruntime said when registering the library.

    ``Error loading "...": ... But no dependency`` (Windows, the library's own folder not on the
    DLL search path) and ``cannot open shared object file`` for another file than the library
    itself are a dependency that does not load; an absent library is ``ep_library_not_found``;
    anything else is ``ep_registration_failed`` with onnxruntime's message.
    """
    lowered = error.lower()
    base = _basename(library or "")
    if _DEPENDENCY.search(error):
        names = re.findall(r"[\w.+-]+\.(?:dll|so(?:\.\d+)*|dylib)", error, re.IGNORECASE)
        others = [n for n in names if n.lower() != base]
        if others or "depend" in lowered or "error 126" in lowered or "module could not be found" in lowered:
            return ReasonCode.EP_DEPENDENCY_NOT_LOADABLE
        return ReasonCode.EP_LIBRARY_NOT_FOUND
    if "no such file" in lowered or "not found" in lowered and base and base in lowered:
        return ReasonCode.EP_LIBRARY_NOT_FOUND
    return ReasonCode.EP_REGISTRATION_FAILED
