"""Fetches real third-party ONNX graphs that registry wheels ship, pinned and hash-checked.

For tests, benchmarks and docs only: ``xstage external`` must be shown on graphs xstage did not
write. Each entry pins a wheel (exact version *and* the wheel's sha256, so pip runs with
``--require-hashes``), the one ``.onnx`` inside it and that file's sha256. ``fetch`` downloads
the wheel once with ``python -m pip download --no-deps``, extracts every graph of the table that
lives in it, checks each hash, and keeps them under the folder it is given (the tests use
``.test-cache/thirdparty/``). Nothing here loads a model from a hub at run time.

The facts in each entry were measured on the development VM (2-core AMD EPYC, no AMX), with
onnxruntime 1.32.0 (CPU EP) in the main interpreter and onnxruntime-openvino 1.24.1 (the
built-in OpenVINO EP, which accepts ONNX IR ≤ 13 — every graph here is IR 7–10) in the
``ort-openvino`` env. "Nodes" are counted from ``session.record_ep_graph_assignment_info``
(graph after onnxruntime's optimizations, so fewer than the file's ``Constant``-heavy node
list); "kernels" from ``_kernel_time`` events of one profiled run. ``tests/test_thirdparty.py``
re-measures them.

.. versionadded:: 0.1
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xstage.errors import XstageError
from xstage.manifest import sha256_file

__all__ = [
    "GRAPHS", "FetchError", "InputSpec", "ThirdPartyGraph", "cached", "fetch", "inputs", "write_inputs",
]


class FetchError(XstageError):
    """Raised when a pinned wheel cannot be downloaded or does not hold the expected graph.

    ``registry_unreachable`` is true only when pip could not reach the package index at all
    (the one case where a test may skip instead of failing).
    """

    def __init__(
        self, message: str, *, registry_unreachable: bool = False, remedy: str | None = None
    ) -> None:
        super().__init__(message, remedy=remedy)
        self.registry_unreachable = registry_unreachable


@dataclass(frozen=True)
class InputSpec:
    """One graph input: what the graph declares, and a concrete shape and fill that make sense.

    ``declared`` holds an int for a fixed dimension, the symbolic name for a named one, and
    None for a dimension with neither (anonymous: only ``--shape`` can fix it).
    ``fill`` is ``normal`` (standard normal, fixed seed), ``zeros``, or ``value`` (``value``).
    """

    name: str
    dtype: str
    declared: tuple[int | str | None, ...]
    shape: tuple[int, ...]
    fill: str = "normal"
    value: float | int | None = None


@dataclass(frozen=True)
class ThirdPartyGraph:
    """One pinned graph and what was measured about it (see the module docstring)."""

    name: str
    requirement: str
    wheel: str
    wheel_sha256: str
    member: str
    sha256: str
    bytes: int
    license: str
    what: str
    ir_version: int
    opset: int
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    #: Flags that give ``xstage external`` a sensible run (symbolic dims fixed, or an .npz).
    cli_args: tuple[str, ...]
    #: Why those flags: which dims are symbolic and what happens without them.
    dims_note: str
    #: onnxruntime 1.32 CPU EP: nodes after optimization, and milliseconds per run on the VM.
    cpu_nodes: int
    cpu_ms: float
    #: ort-openvino (built-in EP 1.24.1): ``{provider: nodes}``, or None when it fails to load.
    openvino_nodes: Mapping[str, int] | None
    openvino_kernels: Mapping[str, int] | None
    openvino_note: str
    notes: str = field(default="")

    @property
    def filename(self) -> str:
        """The graph's file name, as the wheel has it."""
        return self.member.rsplit("/", 1)[-1]


_RAPIDOCR = ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
             "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
_SILERO = ("silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
           "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8")
_PPOCR_LICENSE = "Apache-2.0 (rapidocr-onnxruntime; the PP-OCR models are PaddleOCR's, Apache-2.0)"
_SILERO_LICENSE = "MIT (silero-vad)"
_VAD_INPUTS = (
    InputSpec("input", "float32", ("batch", "sequence"), (1, 512)),
    InputSpec("sr", "int64", (), (), fill="value", value=16000),
    InputSpec("state", "float32", (2, "batch", 128), (2, 1, 128), fill="zeros"),
)

GRAPHS: dict[str, ThirdPartyGraph] = {g.name: g for g in (
    ThirdPartyGraph(
        name="ppocr-det-v4",
        requirement=_RAPIDOCR[0], wheel=_RAPIDOCR[1], wheel_sha256=_RAPIDOCR[2],
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        bytes=4_745_517,
        license=_PPOCR_LICENSE,
        what="PP-OCRv4 text detector (DB): image → per-pixel text probability map (a sparse sigmoid map)",
        ir_version=8, opset=12,
        inputs=(InputSpec("x", "float32",
                          ("p2o.DynamicDimension.0", 3, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"),
                          (1, 3, 640, 640)),),
        outputs=("sigmoid_0.tmp_0",),
        cli_args=("--shape", "x=1x3x640x640"),
        dims_note="batch, height, width are symbolic (p2o.DynamicDimension.0/1/2); height and width "
                  "must be multiples of 32 (RapidOCR resizes to a 736 short side)",
        cpu_nodes=328, cpu_ms=30.0,
        openvino_nodes={"OpenVINOExecutionProvider": 328},
        openvino_kernels={"OpenVINOExecutionProvider": 1},
        openvino_note="taken whole: one fused OpenVINO kernel, no CPU node",
        notes="≥ 5 ms of compute here: the graph for the overhead benchmark; its output is near zero "
              "almost everywhere, the ill-conditioned case for relative metrics",
    ),
    ThirdPartyGraph(
        name="ppocr-rec-v4",
        requirement=_RAPIDOCR[0], wheel=_RAPIDOCR[1], wheel_sha256=_RAPIDOCR[2],
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        bytes=10_857_958,
        license=_PPOCR_LICENSE,
        what="PP-OCRv4 text recognizer (SVTR-LCNet, CTC): a 48-pixel-high text line → per-step "
             "character probabilities over 6625 classes",
        ir_version=8, opset=12,
        inputs=(InputSpec("x", "float32", ("p2o.DynamicDimension.0", 3, "?", "p2o.DynamicDimension.1"),
                          (1, 3, 48, 320)),),
        outputs=("softmax_11.tmp_0",),
        cli_args=("--shape", "x=1x3x48x320"),
        dims_note="batch and width are symbolic; the height is a dim literally named '?', so --shape "
                  "is the practical flag; the height must be 48 (the model's rec_img_shape)",
        cpu_nodes=407, cpu_ms=6.6,
        openvino_nodes={"OpenVINOExecutionProvider": 407},
        openvino_kernels={"OpenVINOExecutionProvider": 1},
        openvino_note="taken whole: one fused OpenVINO kernel, no CPU node",
        notes="output (1, 40, 6625) for a 320-wide line",
    ),
    ThirdPartyGraph(
        name="ppocr-cls-v2",
        requirement=_RAPIDOCR[0], wheel=_RAPIDOCR[1], wheel_sha256=_RAPIDOCR[2],
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        bytes=585_532,
        license=_PPOCR_LICENSE,
        what="PP-OCR mobile v2.0 text-direction classifier: text line → [0°, 180°] probabilities",
        ir_version=7, opset=11,
        inputs=(InputSpec("x", "float32", (-1, 3, "?", "?"), (1, 3, 48, 192)),),
        outputs=("save_infer_model/scale_0.tmp_1",),
        cli_args=("--shape", "x=1x3x48x192"),
        dims_note="the batch is declared -1 and height/width are both named '?': only --shape can "
                  "fix them (cls_image_shape is 3x48x192)",
        cpu_nodes=179, cpu_ms=0.5,
        openvino_nodes={"OpenVINOExecutionProvider": 179},
        openvino_kernels={"OpenVINOExecutionProvider": 1},
        openvino_note="taken whole: one fused OpenVINO kernel, no CPU node",
        notes="the smallest and fastest: the one for quick tests",
    ),
    ThirdPartyGraph(
        name="silero-vad-op18",
        requirement=_SILERO[0], wheel=_SILERO[1], wheel_sha256=_SILERO[2],
        member="silero_vad/data/silero_vad_op18_ifless.onnx",
        sha256="7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
        bytes=2_845_718,
        license=_SILERO_LICENSE,
        what="Silero VAD v6 (opset 18 export): one audio chunk + recurrent state → speech "
             "probability and the next state; an If on the sample rate picks the 16k or 8k branch",
        ir_version=10, opset=18,
        inputs=_VAD_INPUTS,
        outputs=("output", "stateN"),
        cli_args=("--dim", "batch=1", "--dim", "sequence=512"),
        dims_note="batch and sequence are symbolic; 512 samples is one 32 ms chunk at 16 kHz. "
                  "Synthesized integers (sr in [0, 8)) take the 8 kHz branch and still run; pass an "
                  ".npz with sr=16000 for the realistic path",
        cpu_nodes=90, cpu_ms=0.06,
        openvino_nodes={"OpenVINOExecutionProvider": 4},
        openvino_kernels={"OpenVINOExecutionProvider": 1},
        openvino_note="taken whole, control flow included: the 4 top-level nodes (the If with both "
                      "branches inside) in one OpenVINO kernel",
        notes="control flow (If) at the top level; microseconds of compute, so transport dominates",
    ),
    ThirdPartyGraph(
        name="silero-vad",
        requirement=_SILERO[0], wheel=_SILERO[1], wheel_sha256=_SILERO[2],
        member="silero_vad/data/silero_vad.onnx",
        sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        bytes=2_327_524,
        license=_SILERO_LICENSE,
        what="Silero VAD v6, the default export (opset 16): same contract as silero-vad-op18, with "
             "nested If nodes",
        ir_version=8, opset=16,
        inputs=(
            InputSpec("input", "float32", (None, None), (1, 512)),
            InputSpec("state", "float32", (2, None, 128), (2, 1, 128), fill="zeros"),
            InputSpec("sr", "int64", (), (), fill="value", value=16000),
        ),
        outputs=("output", "stateN"),
        cli_args=("--inputs", "silero-vad.npz"),
        dims_note="input and state have anonymous dims (no name, no value): --dim cannot name them, "
                  "--shape input=1x512 --shape state=2x1x128 can. sr must be 16000 (512 samples) or "
                  "8000 (256): a synthesized sr in [0, 8) fails inside the If (LSTM 'Input X must "
                  "have 3 dimensions'), so this graph needs an .npz (write_inputs)",
        cpu_nodes=224, cpu_ms=0.12,
        openvino_nodes=None,
        openvino_kernels=None,
        openvino_note="fails to load: OpenVINO compiles the If subgraph and its CPU plugin refuses "
                      "\"Parameter operation with dynamic rank\" (If_0_else_branch__Inline_0__/decoder/"
                      "If_output_0); the reshape_input and disable_dynamic_shapes options do not help",
        notes="a real graph the OpenVINO EP cannot take: session creation raises, nothing falls back",
    ),
)}


_UNREACHABLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known"
    r"|Network is unreachable|ConnectTimeout|ReadTimeout|Connection refused|ProxyError|No route to host",
)


def _download(graph: ThirdPartyGraph, into: Path) -> Path:
    requirements = into / "requirements.txt"
    requirements.write_text(f"{graph.requirement} --hash=sha256:{graph.wheel_sha256}\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
           "-r", str(requirements), "-d", str(into)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip download {graph.requirement} did not finish in 900 s",
                         registry_unreachable=True) from None
    except OSError as exc:
        raise FetchError(f"cannot run pip ({cmd[0]}): {exc.strerror or exc}") from None
    wheel = into / graph.wheel
    if done.returncode != 0 or not wheel.is_file():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise FetchError(
            f"pip download {graph.requirement} failed (exit {done.returncode}): {tail}",
            registry_unreachable=bool(_UNREACHABLE.search(done.stderr + done.stdout)),
            remedy="check that PyPI is reachable, or put the wheel where pip's find-links can see it",
        )
    return wheel


def cached(name: str, cache_dir: str | os.PathLike[str]) -> Path | None:
    """The path of graph ``name`` if ``cache_dir`` already holds it, hash-checked; else None."""
    graph = GRAPHS[name]
    target = Path(cache_dir) / graph.name / graph.filename
    return target if target.is_file() and sha256_file(target) == graph.sha256 else None


def fetch(name: str, cache_dir: str | os.PathLike[str]) -> Path:
    """The path of graph ``name``, downloading its pinned wheel once into ``cache_dir``.

    Side effects: on a miss, runs ``python -m pip download --no-deps --require-hashes`` into a
    temporary folder, then writes ``<cache_dir>/<name>/<file name>`` for every graph of the
    table that the same wheel holds (each hash-checked, each written atomically); the wheel
    itself is not kept.

    Raises:
        KeyError: if ``name`` is not in ``GRAPHS``.
        FetchError: if pip fails (``registry_unreachable`` says whether the index was reached at
            all), or if the wheel lacks the graph or the graph's sha256 differs from the pin.
    """
    hit = cached(name, cache_dir)
    if hit is not None:
        return hit
    graph = GRAPHS[name]
    cache = Path(cache_dir)
    target = cache / graph.name / graph.filename
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xstage-thirdparty-", dir=cache) as tmp:
        wheel = _download(graph, Path(tmp))
        siblings = [g for g in GRAPHS.values() if g.wheel == graph.wheel]
        with zipfile.ZipFile(wheel) as archive:
            for other in siblings:
                try:
                    data = archive.read(other.member)
                except KeyError:
                    raise FetchError(f"{graph.wheel} has no {other.member}") from None
                digest = hashlib.sha256(data).hexdigest()
                if digest != other.sha256:
                    raise FetchError(
                        f"{other.member} in {graph.wheel} has sha256 {digest}, pinned {other.sha256}",
                        remedy="the pin in tests/thirdparty.py is stale or the wheel was replaced",
                    )
                out = cache / other.name / other.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # one per process
                partial.write_bytes(data)
                os.replace(partial, out)
    return target


def inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for graph ``name`` at its sensible shapes (fixed seed; floats standard normal)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in GRAPHS[name].inputs:
        dtype = np.dtype(spec.dtype)
        if spec.fill == "normal":
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        elif spec.fill == "zeros":
            feeds[spec.name] = np.zeros(spec.shape, dtype)
        else:
            feeds[spec.name] = np.full(spec.shape, spec.value, dtype)
    return feeds


def write_inputs(name: str, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write ``inputs(name, seed)`` as an ``.npz`` for ``xstage external --inputs``; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    feeds: dict[str, Any] = inputs(name, seed)
    with open(out, "wb") as handle:  # a file object: np.savez would append .npz to a bare name
        np.savez(handle, **feeds)
    return out
