"""Every route as data: what it asks its runtime for, what it runs, what it drives, where.

A route is one way to drive a device: an interpreter + a runtime + what it asks that
runtime for. Adding a route is adding a ``RouteSpec`` here (and, for a new runtime, a
runtime module in ``xstage_remote``); nothing else dispatches on route names except the
resolver's per-runtime checks, which read the spec's fields.

Routes that no machine here can run (VitisAI, DirectML, CUDA, TensorRT, QNN, CoreML and
torch-dml) are written from their documentation and carry ``verified=False``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeVar

__all__ = [
    "DEVICE_CLASSES",
    "DEVICE_PREFERENCE",
    "FORMATS",
    "ROUTES",
    "ROUTE_NAMES",
    "RouteSpec",
    "get_spec",
    "routes_for_class",
]

#: Device classes, and the default preference when a caller names no device (issue 2, §4).
DEVICE_CLASSES = ("cpu", "gpu_integrated", "gpu_discrete", "npu")
DEVICE_PREFERENCE = ("npu", "gpu_integrated", "gpu_discrete", "cpu")

#: Artifact formats (DESIGN §1).
FORMATS = ("onnx:fp32", "onnx:fp16", "onnx:a16w8", "pt:fp32", "pt:fp16")

Runtime = Literal["onnxruntime", "torch"]
OsSide = Literal["this", "windows"]


_T = TypeVar("_T")


def _frozen(mapping: Mapping[str, _T] | None = None) -> Mapping[str, _T]:
    """A read-only copy, so a frozen spec cannot be changed through its dicts."""
    return MappingProxyType(dict(mapping or {}))


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
        reference_arm: the route the numeric gate's reference runs on for its runtime
            (``ort-cpu``, ``torch-cpu``); ``--offload`` tries it last.
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

    @property
    def env_var(self) -> str:
        """The environment variable that names this route's interpreter."""
        return "XSTAGE_PYTHON_" + self.name.upper().replace("-", "_")

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


_ONNX_ALL = ("onnx:fp32", "onnx:fp16", "onnx:a16w8")
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
        formats=_ONNX_ALL,
        os_side="this",
        platforms=_ANY_OS,
        verified=True,
        reference_arm=True,
        ep="CPUExecutionProvider",
        packages=_frozen({"default": ("onnxruntime", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/",
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
        formats=_ONNX_ALL,
        os_side="this",
        platforms=_ANY_OS,
        verified=True,
        ep="OpenVINOExecutionProvider",
        ep_options=_frozen({"device_type": "CPU"}),
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
    ),
    RouteSpec(
        name="ort-vitisai",
        runtime="onnxruntime",
        device_class="npu",
        drives=(("npu", "amd"),),
        formats=("onnx:a16w8",),
        os_side="windows",
        platforms=_WINDOWS,
        verified=False,
        ep="VitisAIExecutionProvider",
        min_runtime="1.25",
        version_note="the VitisAI EP needs onnxruntime >= 1.25, while onnxruntime-directml "
        "stops at 1.24.x, so ort-vitisai and ort-dml cannot share a venv",
        packages=_frozen({"default": ("onnxruntime>=1.25", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/Vitis-AI-ExecutionProvider.html",
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
        ep_options=_frozen({"device_id": 0}),
        max_runtime="1.25",
        version_note="DirectML ships only in onnxruntime-directml, whose last release is "
        "1.24.x, while the VitisAI EP needs >= 1.25, so the two cannot share a venv",
        packages=_frozen({"default": ("onnxruntime-directml<1.25", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/DirectML-ExecutionProvider.html",
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
        ep_options=_frozen({"device_id": 0}),
        packages=_frozen({"default": ("onnxruntime-gpu", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html",
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
        ep_options=_frozen({"device_id": 0}),
        packages=_frozen({"default": ("onnxruntime-gpu", "tensorrt", "numpy")}),
        docs="https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html",
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
        reference_arm=True,
        torch_device="cpu",
        packages=_frozen({"default": ("torch", "numpy")}),
        docs="https://pytorch.org/docs/stable/export.html",
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


def routes_for_class(device_class: str) -> tuple[RouteSpec, ...]:
    """The routes that can drive ``device_class``, in the fixed route order."""
    return tuple(spec for spec in ROUTES if device_class in spec.device_classes)
