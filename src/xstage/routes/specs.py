"""Every route as data: what it asks its runtime for, what it runs, what it drives, where.

A route is one way to drive a device: an interpreter + a runtime + what it asks that
runtime for. Adding a route is adding a ``RouteSpec`` here (and, for a new runtime, a
runtime module in ``xstage_remote``; for a GPU whose memory a new reader measures, that reader
in ``xstage_remote/ort_runtime.py``: docs/architecture.md, "Adding a GPU route with its own
memory reader"). Every per-route fact is a field of its spec: the EP
option hook, the memory it costs (``RouteCost``, with the measurement behind it), the variant
``env create`` builds, whether it is verified, how the runtime judge finds its devices, the
torch options, whether it is its runtime's reference arm, and the per-EP facts (whether its
``device_id`` picks the GPU, the GPU's vendor, the worker's device-memory reader by name).
Nothing outside ``routes/``
branches on a route's name (``tests/routes/test_route_names_stay_in_routes.py``).

Routes that no machine here can run (VitisAI, DirectML, CUDA, TensorRT, QNN, CoreML and
torch-dml) are written from their documentation and carry ``verified=False``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeVar

from xstage.artifact import Runtime
from xstage.ledger.footprint import QdqCost, RouteCost
from xstage.routes import option_hooks

__all__ = [
    "COMPILING_EP",
    "DEVICE_CLASSES",
    "DEVICE_PREFERENCE",
    "FORMATS",
    "OPENVINO_EP_KEYS",
    "PLUGIN_PREFIX",
    "ROUTES",
    "ROUTE_NAMES",
    "SWITCH_OFF",
    "UNKNOWN_COST",
    "PluginEP",
    "RouteSpec",
    "get_spec",
    "reference_spec",
    "routes_for_class",
]

#: Device classes, and the default preference when a caller names no device (docs/routes.md).
DEVICE_CLASSES = ("cpu", "gpu_integrated", "gpu_discrete", "npu")
DEVICE_PREFERENCE = ("npu", "gpu_integrated", "gpu_discrete", "cpu")

#: Artifact formats (docs/design.md §1).
FORMATS = ("onnx:fp32", "onnx:fp16", "onnx:a16w8", "onnx:a8w8", "pt:fp32", "pt:fp16")

OsSide = Literal["this", "windows"]
#: How the runtime judge (``routes.judges``) finds the devices a route drives once its runtime
#: is there: onnxruntime's ``cpu`` (the CPU EP: the host), ``openvino_device_ids`` (the
#: built-in OpenVINO EP's own list) or ``ep_devices`` (``get_ep_devices()``, then the
#: hardware); torch's ``cpu``, ``cuda`` (``torch.cuda``) or ``directml_adapters``.
DevicesFrom = Literal["cpu", "openvino_device_ids", "ep_devices", "cuda", "directml_adapters"]
VariantPolicy = Callable[["RouteSpec", str], "tuple[str, str] | None"]

MiB = 1 << 20
_UNMEASURED = "not measured (no such device here): "
#: What a route without a measured cost reserves (a spec that names no ``cost``).
UNKNOWN_COST = RouteCost(64 * MiB, 2.0, _UNMEASURED + "an unknown route", False)


_T = TypeVar("_T")

#: The plugin-EP route family: ``[plugins.<name>]`` in ``xstage.toml`` is the route
#: ``ort-plugin:<name>`` (``xstage.routes.plugins``).
PLUGIN_PREFIX = "ort-plugin:"


def _frozen(mapping: Mapping[str, _T] | None = None) -> Mapping[str, _T]:
    """A read-only copy, so a frozen spec cannot be changed through its dicts."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class PluginEP:
    """A plugin execution provider: a library onnxruntime loads at run time (ORT >= 1.22).

    Every step of bringing one up is a field here, so each can be checked and fail by name
    (``docs/routes.md``, "Plugin EPs"): locate the library, refuse a known wrong one, put its
    folder on the DLL search path, register it, pick EP devices by hardware type and vendor, bind
    them with ``add_provider_for_devices``.

    Attributes:
        table: the table's name (``ggml`` for ``[plugins.ggml]``; ``vitisai`` for the preset).
        ep_name: the EP's name in ``get_ep_devices()``; also the registration name.
        device_type: the hardware device type to bind: ``CPU``, ``GPU`` or ``NPU``.
        vendor: the xstage vendor (``amd``, ``intel``, ...) the EP devices must have, or None.
        module: a Python package that ships the library (``get_library_path()`` or
            ``library_path()``), or None.
        library: the library's path as configured (absolute), or None.
        locate: how the library is found: ``table`` (``library`` or ``module``) or ``vitisai``
            (an env var, the table, the Windows app package, Ryzen AI's folder:
            ``xstage.routes.plugins.locate_vitisai``).
        library_names: file names the right library has (the locator looks for these).
        wrong_libraries: file names of libraries that register but run nothing, each with why.
        dll_dir: put the library's folder on the DLL search path before registering it.
        report: the EP's own operator report the worker collects (``vitisai``), or None.
        options: EP options for every session.
        format_options: per artifact format, options a session of that format gets unless the
            user sets them (ggml's ``weights=f32`` for ``onnx:fp32``).
        package: what ``xstage env create`` installs for it, or () (nothing installable).
        source: where the table came from (a file path, or ``built-in``).
        error: why the table cannot be used (a malformed table), or None.
        formats: the artifact formats a table's route runs.
    """

    table: str
    ep_name: str
    device_type: str = "CPU"
    vendor: str | None = None
    module: str | None = None
    library: str | None = None
    locate: Literal["table", "vitisai"] = "table"
    library_names: tuple[str, ...] = ()
    wrong_libraries: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    dll_dir: bool = True
    report: str | None = None
    options: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    format_options: Mapping[str, Mapping[str, str]] = field(default_factory=_frozen, hash=False)
    package: tuple[str, ...] = ()
    source: str = "built-in"
    error: str | None = None
    formats: tuple[str, ...] = ("onnx:fp32", "onnx:fp16")


#: The provider options the built-in OpenVINO EP takes: onnxruntime-openvino 1.24.1 refuses any
#: other key ("Invalid OpenVINO EP option"), measured key by key on this project's machine
#: (docs/routes.md, "EP options").
OPENVINO_EP_KEYS = frozenset({
    "cache_dir", "context", "device_id", "device_luid", "device_type", "disable_dynamic_shapes",
    "enable_causallm", "enable_opencl_throttling", "enable_qdq_optimizer", "layout", "load_config",
    "model_priority", "num_of_threads", "num_streams", "precision", "reshape_input"})
#: The values that turn a serving switch off (``--ep-option cuda_graphs=off``).
SWITCH_OFF = ("off", "0", "false", "no")
#: The serving switches that are off unless asked for (``--ep-option device_tensors=on``); asked
#: of a route that lacks one, it is a usage error, not a note.
OPT_IN_SWITCHES = ("device_tensors",)


@dataclass(frozen=True)
class RouteSpec:
    """One route, as data.

    Attributes:
        name: the route's name, e.g. ``ort-openvino``.
        runtime: ``onnxruntime`` or ``torch``.
        device_class: the class it drives first (used for ordering and the docs).
        drives: every ``(device class, vendor)`` it can drive; ``None`` vendor = any vendor.
            ``ort-openvino`` drives ``cpu`` (any vendor) and Intel iGPUs, dGPUs and NPUs.
        formats: artifact formats it runs.
        os_side: ``this`` = an interpreter of the client's OS; ``windows`` = a Windows
            interpreter (this OS on Windows, reached through interop from WSL).
        platforms: host platforms the route can exist on at all: ``linux``, ``wsl``,
            ``windows``, ``darwin``. Anything else is ``wrong_os``.
        verified: True only where a machine of this project ran it.
        ep: the onnxruntime execution provider it asks for (None for torch).
        ep_options: default provider options (read-only mapping).
        torch_device: the torch device string (None for onnxruntime).
        plugin_module: the Python package of a plugin EP (registered with
            ``register_execution_provider_library``), or None for a built-in EP.
        min_runtime: lowest runtime version that carries the EP (inclusive), or None.
        max_runtime: first runtime version that no longer carries it (exclusive), or None.
        version_note: why the bounds exist, for reason strings.
        packages: what ``xstage env create`` installs, per variant; the first variant is
            the default unless ``xstage.routes.envs`` picks one for the host.
        backend_module: an extra module the route needs beside its runtime
            (``torch_directml``), or None.
        docs: where the route's facts come from (for unverified routes: the documentation).
        reference_arm: the route the numeric gate's reference runs on for its runtime
            (``ort-cpu``, ``torch-cpu``); an offload is every other route, and ``--offload``
            tries it last.
        cost: what its worker holds (``RouteCost``: base bytes, weight copies, and the
            measurement or documentation behind them).
        gpu_build_cost: the cost instead when the probe shows a CUDA or ROCm build of torch
            (it loads its GPU libraries even on the CPU route), or None.
        ep_hook: the option builder (``option_hooks``) run before the user's options.
        variant_policy: picks the default variant for a CPU vendor, with why (None: the
            first variant); ``default_variant`` applies it.
        reuses_current: ``env create`` reuses the current interpreter when it already imports
            the runtime (a second torch costs ~1 GB), instead of building a venv.
        devices_from: how the runtime judge finds the devices it drives (``DevicesFrom``).
        assumed_devices: per ``platform.machine()``, the devices an EP that lists none of its
            own is taken to drive (CoreML on Apple silicon).
        fp32_strict_note: for a torch device that computes fp32 in a faster, looser mode by
            default (TF32 on CUDA), the note saying it is switched off for an fp32 artifact.
        adapter_by_name: the torch backend picks its adapter by name, not by index
            (DirectML); the probe's name travels in the load options.
        plugin_ep: for the plugin-EP family (``ort-plugin:<name>``, and ``ort-vitisai`` as its
            preset), every step of bringing the EP up (``PluginEP``); None otherwise.
        adapter_by_identity: a built-in EP that picks its adapter by index (DirectML's
            ``device_id``): the index comes from the adapter matched to the xstage device by
            identity (``xstage.host.adapters``), never 0 by default.
        serving_switches: for a torch route, the ``on``/``off`` options its worker serves with
            (``--ep-option NAME=off``), each with what it turns off (torch-cuda: CUDA graphs,
            the pinned region); any other option is a usage error.
        graph_pool: the worker captures the program in a CUDA graph, whose private memory
            pool the ledger reserves beside the activations (unless ``cuda_graphs=off``).
        ep_option_keys: the ``--ep-option`` keys its EP takes, as measured on the onnxruntime
            build the route was verified with (``launch.check_option_keys``); None where xstage
            cannot know them (a route not run here, a plugin EP's library), so they go to the EP
            unchecked. A torch route's keys are its ``serving_switches``.
        compile_cache: the EP options that point the runtime's own compile cache at a folder
            (``{dir}``: the entry's, ``xstage.compile_cache``); empty: the route has none.
        plugin_compile_cache: the same for the route's plugin EP, where it takes the cache
            another way; a key ``OPTION:PROPERTY`` sets PROPERTY in the device's section of the
            JSON option OPTION (OpenVINO's plugin EP ignores ``cache_dir`` and reads
            ``load_config``'s ``CACHE_DIR``); empty: the plugin takes ``compile_cache``.
        declines: formats the route's device declines by its own documented limit (not
            formats the route merely does not run), each with that limit in words: the planner
            refuses them by name (``no_exported_graph``, cause ``format_not_accepted``) with
            the format the device takes as the remedy, instead of ``format_not_run_here``.
        declines_remedy: the remedy of such a refusal (the command that makes the format the
            device takes).
        device_id_picks_gpu: its EP's ``device_id`` option picks the GPU it runs on, so the
            option as applied attests the device (``evidence.attestation``, source
            ``options_as_applied``) of vendor :attr:`gpu_vendor`.
        gpu_vendor: the vendor of the GPUs its EP runs on (``nvidia`` for ort-cuda; one of
            the vendors of ``drives``); None: any vendor, or no GPU.
        session_defaults: onnxruntime session config entries the route's worker session gets
            unless the user gives the same key (``--session-config`` wins); the load options'
            notes say each one applied. ort-openvino turns the intra-op pool's spinning off:
            OpenVINO runs the graph on threads of its own, and the pool's spinning threads took
            CPUs from them (docs/throughput.md, "Session config").
        device_memory: the worker's reader of the device memory its own process holds, by
            name (a key of ``xstage_remote.ort_runtime.DEVICE_MEMORY_READERS``: ``nvml``,
            ``dxgi``), sent in ``load``; None where the stage's tensors are in host RAM or no
            reader exists (a GPU stage is then ``peak_unreported``). onnxruntime routes only:
            a torch worker reads its device's memory through torch.
    """

    name: str
    runtime: Runtime
    device_class: str
    drives: tuple[tuple[str, str | None], ...]
    formats: tuple[str, ...]
    os_side: OsSide
    platforms: tuple[str, ...]
    verified: bool
    packages: Mapping[str, tuple[str, ...]] = field(hash=False)
    ep: str | None = None
    ep_options: Mapping[str, object] = field(default_factory=_frozen, hash=False)
    torch_device: str | None = None
    plugin_module: str | None = None
    min_runtime: str | None = None
    max_runtime: str | None = None
    version_note: str = ""
    backend_module: str | None = None
    docs: str = ""
    reference_arm: bool = False
    cost: RouteCost = field(default=UNKNOWN_COST, hash=False)
    gpu_build_cost: RouteCost | None = field(default=None, hash=False)
    ep_hook: option_hooks.Hook = field(default=option_hooks.none, hash=False, compare=False)
    variant_policy: VariantPolicy | None = field(default=None, hash=False, compare=False)
    reuses_current: bool = False
    devices_from: DevicesFrom = "ep_devices"
    assumed_devices: Mapping[str, tuple[str, ...]] = field(default_factory=_frozen, hash=False)
    fp32_strict_note: str = ""
    adapter_by_name: bool = False
    plugin_ep: PluginEP | None = field(default=None, hash=False)
    adapter_by_identity: bool = False
    serving_switches: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    graph_pool: bool = False
    ep_option_keys: frozenset[str] | None = field(default=None, hash=False)
    compile_cache: tuple[tuple[str, str], ...] = ()
    plugin_compile_cache: tuple[tuple[str, str], ...] = ()
    declines: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    declines_remedy: str = ""
    device_id_picks_gpu: bool = False
    gpu_vendor: str | None = None
    device_memory: str | None = None
    session_defaults: Mapping[str, str] = field(default_factory=_frozen, hash=False)

    def captures_graph(self, ep_options: Mapping[str, str] | None) -> bool:
        """Whether this route's worker will serve from a captured CUDA graph.

        The ledger reserves the graph's pool when the route captures one and
        ``--ep-option cuda_graphs=off`` was not given.
        """
        value = str((ep_options or {}).get("cuda_graphs", "on")).strip().lower()
        return self.graph_pool and value not in SWITCH_OFF

    def pins_region(self, ep_options: Mapping[str, str] | None) -> bool:
        """Whether this route's worker will page-lock its shared region.

        The ledger charges it to the host's pool when the route pins one and
        ``--ep-option pinned_region=off`` was not given.
        """
        value = str((ep_options or {}).get("pinned_region", "on")).strip().lower()
        return "pinned_region" in self.serving_switches and value not in SWITCH_OFF

    def serves_device_tensors(self, ep_options: Mapping[str, str] | None) -> bool:
        """Whether this route's worker keeps device slots for CUDA tensors in and out.

        Off unless ``--ep-option device_tensors=on``; the ledger then counts the slots in the
        device's pool.
        """
        value = str((ep_options or {}).get("device_tensors", "off")).strip().lower()
        return "device_tensors" in self.serving_switches and value not in SWITCH_OFF

    @property
    def env_var(self) -> str:
        """The environment variable that names this route's interpreter.

        ``ort-plugin:ggml`` → ``XSTAGE_PYTHON_ORT_PLUGIN_GGML``.
        """
        return "XSTAGE_PYTHON_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())

    @property
    def device_classes(self) -> tuple[str, ...]:
        """The classes it drives, in the order ``drives`` lists them, without repeats."""
        return tuple(dict.fromkeys(cls for cls, _ in self.drives))

    @property
    def variants(self) -> tuple[str, ...]:
        """Names of the package sets ``env create`` can install."""
        return tuple(self.packages)

    def can_drive(self, kind: str, vendor: str | None) -> bool:
        """Whether a device of ``kind`` from ``vendor`` is one this route could drive."""
        return any(k == kind and (v is None or v == vendor) for k, v in self.drives)

    def memory_cost(self, versions: Mapping[str, str] | None = None) -> RouteCost:
        """The cost the ledger reserves for this route's worker.

        ``versions`` (the route's probe) tells a CUDA or ROCm build of torch from a CPU one.
        """
        build = str((versions or {}).get("torch", ""))
        if self.gpu_build_cost is not None and ("+cu" in build or "+rocm" in build):
            return self.gpu_build_cost
        return self.cost

    def default_variant(self, cpu_vendor: str) -> tuple[str, str]:
        """The variant ``env create`` builds when none is asked for, and why."""
        chosen = self.variant_policy(self, cpu_vendor) if self.variant_policy else None
        if chosen is not None:
            return chosen
        first = self.variants[0]
        return first, f"{self.name} has one package set" if len(self.variants) == 1 else "the first variant"


def _openvino_variant(spec: RouteSpec, cpu_vendor: str) -> tuple[str, str]:
    """The plugin EP on Intel CPUs, the built-in one elsewhere.

    The plugin EP lists OpenVINO devices only on Intel CPUs; elsewhere the built-in EP of
    onnxruntime-openvino runs.
    """
    if cpu_vendor == "intel":
        return "plugin", "this CPU is Intel, where the plugin EP (onnxruntime-ep-openvino) lists devices"
    return (
        "builtin",
        f"this CPU is {cpu_vendor.upper() if cpu_vendor == 'amd' else cpu_vendor}, not Intel: the plugin "
        "EP onnxruntime-ep-openvino lists no OpenVINO device for it, while the built-in EP of "
        "onnxruntime-openvino runs on it",
    )


#: Calibration (2026-11-29, the 2-vCPU dev VM; CPython 3.11, numpy 2.x, peaks are the worker's
#: own ``VmHWM``; the full table is in docs/memory.md). ``weights_factor`` counts the
#: artifact's own bytes too (1.0 = one copy).
#: What an A16W8 graph costs beyond fp32 (``QdqCost``), measured 2026-12-05 by
#: ``scripts/a16w8_footprint.py`` on six quantized graphs (the built-in tower, code2wav and MLP,
#: PP-OCR cls, rec and det; docs/memory.md has the table). onnxruntime 1.32's CPU EP: 6-17 MiB
#: more than fp32 on the small graphs, 73 MiB on PP-OCR det (a 42 MiB liveness peak).
_QDQ_CPU = QdqCost(16 * MiB, 1.5, "measured on onnxruntime 1.32: the small quantized graphs "
                   "peak 6-17 MiB above their fp32 sources, PP-OCR det 73 MiB (42 MiB live)")
#: onnxruntime-openvino 1.24.1: 33-53 MiB more than fp32 on the small graphs (OpenVINO's
#: low-precision passes), 73 MiB on PP-OCR det.
_QDQ_OPENVINO = QdqCost(64 * MiB, 0.5, "measured on onnxruntime-openvino 1.24.1: the small "
                        "quantized graphs peak 33-53 MiB above their fp32 sources (OpenVINO's "
                        "low-precision passes), PP-OCR det 73 MiB (42 MiB live)")
COMPILING_EP = RouteCost(
    120 * MiB, 3.2, _UNMEASURED + "taken from ort-openvino (a compiling EP in host RAM)", False,
    a16w8=_QDQ_OPENVINO)


#: ort-vitisai as the plugin-EP family's preset (the built-in table ``vitisai``), with every step
#: of the recipe that brought it up on a Ryzen AI laptop (not run here: unverified).
VITISAI = PluginEP(
    table="vitisai",
    ep_name="VitisAIExecutionProvider",
    device_type="NPU",
    vendor="amd",
    locate="vitisai",
    library_names=("onnxruntime_vitisai_ep.dll",),
    wrong_libraries=_frozen({
        "onnxruntime_providers_ryzenai.dll": "the package's light EP library: it registers and "
        "lists the NPU, then claims zero nodes from every graph",
    }),
    dll_dir=True,
    report="vitisai",
)

#: The WebGPU plugin EP (``onnxruntime-ep-webgpu``): a preset, so ``ort-plugin:webgpu`` needs no
#: table. Its package names the library (``get_library_path()``) and the EP
#: (``get_ep_name()``). It lists one EP device per GPU class it finds but picks the physical
#: adapter itself (its README), so the bound EP device does not attest the adapter: the worker's
#: own device memory, read from NVML by PCI address, does (``xstage.evidence.attestation``).
WEBGPU = PluginEP(
    table="webgpu",
    ep_name="WebGpuExecutionProvider",
    device_type="GPU",
    module="onnxruntime_ep_webgpu",
    package=("onnxruntime>=1.24.4", "onnxruntime-ep-webgpu"),
    formats=("onnx:fp32", "onnx:fp16"),
)

_ONNX_ALL = ("onnx:fp32", "onnx:fp16", "onnx:a16w8")
#: The routes measured running A8W8 (8-bit activations, 8-bit weights, QDQ) here: the CPU EP
#: and OpenVINO's CPU plugin (docs/external.md, "A8W8").
_ONNX_QDQ8 = (*_ONNX_ALL, "onnx:a8w8")
_ONNX_FLOAT = ("onnx:fp32", "onnx:fp16")
_PT = ("pt:fp32", "pt:fp16")
_ANY_OS = ("linux", "wsl", "windows", "darwin")
_WINDOWS = ("windows", "wsl")

#: The routes, in their fixed order. Within one device, routes are tried in this order
#: (so ``ort-cpu`` comes before ``ort-openvino`` on ``cpu``); docs/routes.md repeats it.
ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec(
        name="ort-cpu",
        runtime="onnxruntime",
        device_class="cpu",
        drives=(("cpu", None),),
        formats=_ONNX_QDQ8,
        os_side="this",
        platforms=_ANY_OS,
        verified=True,
        ep="CPUExecutionProvider",
        packages=_frozen({"default": ("onnxruntime", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/",
        reference_arm=True,
        devices_from="cpu",
        ep_option_keys=frozenset(),  # onnxruntime's CPU EP takes none (it ignores any it is given)
        cost=RouteCost(
            64 * MiB, 1.7,
            "measured: a worker on onnxruntime 1.32 holding a 16-float Slice peaks at 63.0 MiB; "
            "an 8-layer 2048-wide MLP (128 MiB of weights) at 275 MiB, 1.66x its weights above "
            "that (MLAS keeps prepacked MatMul weights beside the originals)", True,
            a16w8=_QDQ_CPU),
    ),
    RouteSpec(
        name="ort-openvino",
        runtime="onnxruntime",
        device_class="cpu",
        drives=(
            ("cpu", None),
            ("gpu_integrated", "intel"),
            ("gpu_discrete", "intel"),
            ("npu", "intel"),
        ),
        formats=_ONNX_QDQ8,
        os_side="this",
        platforms=_ANY_OS,
        verified=True,
        ep="OpenVINOExecutionProvider",
        ep_options=_frozen({"device_type": "CPU"}),
        compile_cache=(("cache_dir", "{dir}"),),
        # onnxruntime-ep-openvino 1.8.1 warns "Provider option cache_dir is ignored" and reads
        # CACHE_DIR from load_config's device section (measured on an Intel Xeon: PP-OCRv4 det's
        # session 322 ms cold, 133-143 ms warm, the blob read as written).
        plugin_compile_cache=(("load_config:CACHE_DIR", "{dir}"),),
        # Measured on an Intel Xeon, 16 CPUs, plugin EP: with the pool spinning, a session's
        # creation took ~800 ms more CPU than with it off; the tower's warm session 95-110 ms,
        # 77-81 ms with it off (docs/throughput.md, "Session config").
        session_defaults=_frozen({"session.intra_op.allow_spinning": "0"}),
        plugin_module="onnxruntime_ep_openvino",
        packages=_frozen(
            {
                # The plugin EP: registered with register_execution_provider_library,
                # device chosen through the EP-device API (onnxruntime >= 1.23).
                "plugin": ("onnxruntime>=1.23", "onnxruntime-ep-openvino", "numpy"),
                # The built-in EP: onnxruntime-openvino *is* the onnxruntime module, so it
                # never goes beside plain onnxruntime in one venv.
                "builtin": ("onnxruntime-openvino", "numpy"),
            }
        ),
        docs="https://onnxruntime.ai/docs/execution-providers/OpenVINO-ExecutionProvider.html",
        devices_from="openvino_device_ids",
        ep_hook=option_hooks.openvino,
        ep_option_keys=OPENVINO_EP_KEYS,
        variant_policy=_openvino_variant,
        cost=RouteCost(
            120 * MiB, 3.2,
            "measured: onnxruntime-openvino 1.24.1 holding PP-OCR cls (0.56 MB) peaks at 119 MiB "
            "(OpenVINO's CPU plugin loads with the first graph it compiles); the 128 MiB MLP at "
            "488 MiB, 2.9x its weights above that (onnxruntime's initializers, OpenVINO's model "
            "and its compiled copy)", True, a16w8=_QDQ_OPENVINO),
    ),
    RouteSpec(
        name="ort-vitisai",
        runtime="onnxruntime",
        device_class="npu",
        drives=(("npu", "amd"),),
        formats=("onnx:a16w8",),
        declines=_frozen({"onnx:a8w8": "the XDNA2 NPU declines A8W8 graphs (8-bit activations, "
                          "what quantize_static makes by default) without an error and leaves "
                          "every node on the CPU: A16W8 is the format it takes"}),
        declines_remedy="xstage quantize --scheme a16w8 (16-bit activations, 8-bit weights)",
        os_side="windows",
        platforms=_WINDOWS,
        verified=False,
        ep="VitisAIExecutionProvider",
        min_runtime="1.25",
        version_note="the VitisAI EP library requests ORT API 25 (onnxruntime >= 1.25), while "
        "onnxruntime-directml stops at 1.24.x, so ort-vitisai and ort-dml cannot share a venv",
        packages=_frozen({"default": ("onnxruntime>=1.25", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/Vitis-AI-ExecutionProvider.html",
        ep_hook=option_hooks.vitisai,
        plugin_ep=VITISAI,
        cost=RouteCost(
            120 * MiB, 3.2, _UNMEASURED + "taken from ort-openvino, the nearest runtime that "
            "compiles a graph for a device in host RAM", False, a16w8=_QDQ_OPENVINO),
    ),
    RouteSpec(
        name="ort-dml",
        runtime="onnxruntime",
        device_class="gpu_integrated",
        drives=(("gpu_integrated", None), ("gpu_discrete", None)),
        formats=_ONNX_FLOAT,
        os_side="windows",
        platforms=_WINDOWS,
        verified=False,
        ep="DmlExecutionProvider",
        device_id_picks_gpu=True,
        device_memory="dxgi",
        adapter_by_identity=True,  # never device_id=0 by default
        max_runtime="1.25",
        version_note="DirectML ships only in onnxruntime-directml, whose last release is "
        "1.24.x, while the VitisAI EP needs >= 1.25, so the two cannot share a venv",
        packages=_frozen({"default": ("onnxruntime-directml<1.25", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/DirectML-ExecutionProvider.html",
        ep_hook=option_hooks.dml,
        cost=RouteCost(
            256 * MiB, 2.0, _UNMEASURED + "a DirectML device, its heaps and the weights uploaded "
            "once beside onnxruntime's copy", False),
    ),
    RouteSpec(
        name="ort-cuda",
        runtime="onnxruntime",
        device_class="gpu_discrete",
        drives=(("gpu_discrete", "nvidia"),),
        formats=_ONNX_FLOAT,
        os_side="this",
        platforms=("linux", "wsl", "windows"),
        verified=False,
        ep="CUDAExecutionProvider",
        device_id_picks_gpu=True,
        gpu_vendor="nvidia",
        device_memory="nvml",
        ep_options=_frozen({"device_id": 0}),
        packages=_frozen({"default": ("onnxruntime-gpu", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html",
        ep_hook=option_hooks.cuda,
        cost=RouteCost(
            512 * MiB, 1.5, _UNMEASURED + "a CUDA context with cuBLAS/cuDNN handles takes a few "
            "hundred MiB of device memory before any weight", False),
    ),
    RouteSpec(
        name="ort-tensorrt",
        runtime="onnxruntime",
        device_class="gpu_discrete",
        drives=(("gpu_discrete", "nvidia"),),
        formats=_ONNX_ALL,
        os_side="this",
        platforms=("linux", "wsl", "windows"),
        verified=False,
        ep="TensorrtExecutionProvider",
        device_id_picks_gpu=True,
        gpu_vendor="nvidia",
        device_memory="nvml",
        ep_options=_frozen({"device_id": 0}),
        compile_cache=(("trt_engine_cache_enable", "1"), ("trt_engine_cache_path", "{dir}")),
        packages=_frozen({"default": ("onnxruntime-gpu", "tensorrt", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html",
        ep_hook=option_hooks.cuda,
        cost=RouteCost(
            768 * MiB, 2.0, _UNMEASURED + "a CUDA context plus TensorRT's builder workspace",
            False, a16w8=QdqCost(_QDQ_OPENVINO.base_bytes, _QDQ_OPENVINO.activation_factor,
                                 _UNMEASURED + "ort-openvino's A16W8 cost, taken as it is")),
    ),
    RouteSpec(
        name=PLUGIN_PREFIX + "webgpu",
        runtime="onnxruntime",
        device_class="gpu_discrete",
        drives=(("gpu_discrete", None), ("gpu_integrated", None)),
        formats=_ONNX_FLOAT,
        os_side="this",
        platforms=("linux", "windows", "darwin"),
        verified=True,  # its live tests and records on a lent H100: docs/records/webgpu-h100/2026-12-06
        ep="WebGpuExecutionProvider",
        device_memory="nvml",  # any vendor's GPU: NVML answers on NVIDIA's, says why elsewhere
        min_runtime="1.24.4",
        version_note="onnxruntime-ep-webgpu 0.4.0 requires onnxruntime >= 1.24.4 and a Vulkan "
        "loader (libvulkan.so.1) on Linux",
        packages=_frozen({"default": ("onnxruntime>=1.24.4", "onnxruntime-ep-webgpu", "numpy")}),
        docs="https://pypi.org/project/onnxruntime-ep-webgpu/",
        plugin_ep=WEBGPU,
        cost=RouteCost(
            64 * MiB, 1.5, _UNMEASURED + "device memory: a WebGPU (Dawn/Vulkan) device and the "
            "weights uploaded once", False),
    ),
    RouteSpec(
        name="ort-qnn",
        runtime="onnxruntime",
        device_class="npu",
        drives=(("npu", "qualcomm"),),
        formats=("onnx:a16w8",),
        os_side="windows",
        platforms=_WINDOWS,
        verified=False,
        ep="QNNExecutionProvider",
        ep_options=_frozen({"backend_path": "QnnHtp.dll"}),
        packages=_frozen({"default": ("onnxruntime-qnn", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/QNN-ExecutionProvider.html",
        cost=COMPILING_EP,
    ),
    RouteSpec(
        name="ort-coreml",
        runtime="onnxruntime",
        device_class="npu",
        drives=(("npu", "apple"), ("gpu_integrated", "apple")),
        formats=_ONNX_FLOAT,
        os_side="this",
        platforms=("darwin",),
        verified=False,
        ep="CoreMLExecutionProvider",
        ep_options=_frozen({"MLComputeUnits": "ALL"}),
        packages=_frozen({"default": ("onnxruntime", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/CoreML-ExecutionProvider.html",
        assumed_devices=_frozen({"arm64": ("npu:apple", "gpu_integrated:apple")}),
        cost=COMPILING_EP,
    ),
    RouteSpec(
        name="torch-cpu",
        runtime="torch",
        device_class="cpu",
        drives=(("cpu", None),),
        formats=_PT,
        os_side="this",
        platforms=_ANY_OS,
        verified=True,  # tests/routes/test_torch_cpu.py: a real .pt2 through xstage external
        torch_device="cpu",
        packages=_frozen({"default": ("torch", "numpy")}),
        docs="https://pytorch.org/docs/stable/export.html",
        reference_arm=True,
        reuses_current=True,
        devices_from="cpu",
        cost=RouteCost(
            320 * MiB, 1.2,
            "measured: a torch 2.13 (CPU) worker holding the 1 MB tiny tower as .pt2 peaks at "
            "339 MiB after its warm-up (importing torch alone takes 218 MiB)", True),
        gpu_build_cost=RouteCost(
            680 * MiB, 1.2,
            "measured: a CUDA build of torch loads its CUDA libraries even on the CPU route; a "
            "torch 2.11+cu130 worker holding the tiny tower on the CPU peaked at 653 MiB (H200 host)",
            True),
    ),
    RouteSpec(
        name="torch-cuda",
        runtime="torch",
        device_class="gpu_discrete",
        drives=(("gpu_discrete", "nvidia"),),
        formats=_PT,
        os_side="this",
        platforms=("linux", "wsl", "windows"),
        verified=True,  # run on the lent H200: docs/records/torch-cuda
        torch_device="cuda",
        packages=_frozen({"default": ("torch", "numpy")}),
        docs="https://pytorch.org/docs/stable/notes/cuda.html",
        devices_from="cuda",
        fp32_strict_note="TF32 off for an fp32 artifact (cuDNN convolutions use TF32 by default "
        "on Ampere and later: measured rel_l2 7.4e-4 against the CPU on an H200)",
        cost=RouteCost(
            768 * MiB, 1.2,
            "measured: on an H200 (torch 2.11+cu130), a worker holding the 1 MB tiny tower uses "
            "732 MiB of device memory by nvidia-smi (the CUDA context and the caching "
            "allocator's reserve; torch's own max_memory_allocated sees a few MiB of it)", True),
        serving_switches=_frozen({
            "cuda_graphs": "the program captured in a CUDA graph after the eager warm-up and "
                           "replayed for calls at the warm-up's shapes",
            "pinned_region": "the shared region registered with CUDA (cudaHostRegister), so "
                             "inputs and outputs move by DMA",
            "device_tensors": "CUDA tensors in and out through device slots shared by CUDA IPC "
                              "(off unless asked for)"}),
        graph_pool=True,
    ),
    RouteSpec(
        name="torch-dml",
        runtime="torch",
        device_class="gpu_integrated",
        drives=(("gpu_integrated", None), ("gpu_discrete", None)),
        formats=_PT,
        os_side="this",
        platforms=_WINDOWS,
        verified=False,
        torch_device="privateuseone",
        backend_module="torch_directml",
        version_note="torch-directml pins torch 2.4.1",
        packages=_frozen({"default": ("torch-directml", "numpy")}),
        docs="https://learn.microsoft.com/windows/ai/directml/pytorch-wsl",
        devices_from="directml_adapters",
        adapter_by_name=True,
        cost=RouteCost(256 * MiB, 2.0, _UNMEASURED + "a DirectML device and its heaps", False),
    ),
)

ROUTE_NAMES: tuple[str, ...] = tuple(spec.name for spec in ROUTES)
_BY_NAME = {spec.name: spec for spec in ROUTES}


def get_spec(name: str) -> RouteSpec:
    """The spec called ``name``.

    Raises:
        KeyError: no route has that name (the message lists the names that exist).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown route {name!r}; routes: {', '.join(ROUTE_NAMES)}") from None


def reference_spec(runtime: str) -> RouteSpec:
    """The reference arm of ``runtime`` (``onnxruntime`` → ``ort-cpu``, ``torch`` → ``torch-cpu``).

    Raises:
        KeyError: no route of that runtime is a reference arm.
    """
    for spec in ROUTES:
        if spec.reference_arm and spec.runtime == runtime:
            return spec
    raise KeyError(f"no reference arm for runtime {runtime!r}")


def routes_for_class(device_class: str) -> tuple[RouteSpec, ...]:
    """The routes that can drive ``device_class``, in the fixed route order."""
    return tuple(spec for spec in ROUTES if device_class in spec.device_classes)
