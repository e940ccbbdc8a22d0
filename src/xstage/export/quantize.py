"""``quantize``: onnxruntime's own static QDQ quantization, 8-bit weights and 16-bit (A16W8) or
8-bit (A8W8) activations.

Why A16W8: the XDNA2 NPU declines A8W8 and fp32 graphs without an error; QDQ with ``QUInt16``
activations and ``QInt8`` weights is the format it takes. A8W8 (``QUInt8`` activations, what
``quantize_static`` makes by default) is its own format, ``onnx:a8w8``: the CPU EP and OpenVINO
run it, the NPU's route refuses it by name (docs/external.md). The quantizer itself is
onnxruntime's (``quantize_static``, MinMax calibration): nothing here re-implements it.

16-bit ``QuantizeLinear``/``DequantizeLinear`` are standard ONNX from opset 21, so an older
graph is converted with ``onnx.version_converter`` first (or refused with the remedy when the
converter cannot). The calibration set is recorded (count, digest, source), and the result is
run against its fp32 source on onnxruntime's CPU EP with the same parity code the stage gate
uses; the figures go into the report and the manifest, which names the fp32 source so that
``xstage external`` gates the quantized graph against it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.snapshot import releasing

__all__ = ["MIN_OPSET", "SCHEMES", "calibration_set", "quantize", "quantize_a16w8"]

MIN_OPSET = 21

#: scheme → (activation type, weight type, the lowest opset its Q/DQ needs, in words).
SCHEMES: Mapping[str, tuple[str, str, int, str]] = {
    "a16w8": ("QUInt16", "QInt8", 21, "a16w8: QDQ, activations QUInt16, weights QInt8, MinMax, "
              "per tensor"),
    "a8w8": ("QUInt8", "QInt8", 13, "a8w8: QDQ, activations QUInt8, weights QInt8, MinMax, "
             "per tensor (quantize_static's default types)"),
}


def calibration_set(declared: Any, *, directory: str | os.PathLike[str] | None = None,
                    synthetic: int | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None,
                    dims: Mapping[str, int] | None = None) -> tuple[list[dict[str, np.ndarray]], dict]:
    """The samples and their record: one ``.npz`` per sample in ``directory`` (keyed by input
    names, no pickle), or ``synthetic`` samples at seeds 0..N-1.

    Raises:
        UsageError: neither or both sources, an empty directory, N < 1.
        InputError: a sample that does not match the graph's inputs.
    """
    from xstage.inputs import SEED, load_npz, synthesize

    if (directory is None) == (synthetic is None):
        raise errors.UsageError("give exactly one of --calibration DIR or --calibration-synthetic N")
    digest = hashlib.sha256()
    samples: list[dict[str, np.ndarray]] = []
    if directory is not None:
        folder = Path(directory)
        files = sorted(folder.glob("*.npz")) if folder.is_dir() else []
        if not files:
            raise errors.UsageError(f"--calibration {folder} holds no .npz files",
                                    remedy="one .npz per sample, keyed by the graph's input names")
        for f in files:
            samples.append(load_npz(f, declared, flag="--calibration"))
            digest.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
        source = {"kind": "directory", "path": str(folder.resolve()), "files": len(files)}
    else:
        if synthetic < 1:  # type: ignore[operator]
            raise errors.UsageError("--calibration-synthetic needs N >= 1")
        for i in range(int(synthetic)):  # type: ignore[arg-type]
            sample = synthesize(declared, shapes=shapes, dims=dims, seed=SEED + i,
                                data_flag="--calibration DIR")
            samples.append(sample)
            for name in sorted(sample):
                digest.update(name.encode() + b"\0" + np.ascontiguousarray(sample[name]).tobytes())
        source = {"kind": "synthetic", "seeds": [SEED, SEED + int(synthetic) - 1],  # type: ignore[arg-type]
                  "note": "standard normal floats: a stand-in, not the data the stage will see"}
    return samples, {"count": len(samples), "sha256": digest.hexdigest(), "source": source}


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it: Iterator[dict[str, np.ndarray]] = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - used by some calibrators only
        pass


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def quantize_a16w8(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                   calibration: str | os.PathLike[str] | None = None,
                   synthetic: int | None = None,
                   shapes: Mapping[str, tuple[int, ...]] | None = None,
                   dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """:func:`quantize` with ``scheme="a16w8"``."""
    return quantize(src, dst, scheme="a16w8", calibration=calibration, synthetic=synthetic,
                    shapes=shapes, dims=dims)


@releasing  # the snapshots it read, once it is done
def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, scheme: str,
             calibration: str | os.PathLike[str] | None = None,
             synthetic: int | None = None,
             shapes: Mapping[str, tuple[int, ...]] | None = None,
             dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Quantize the fp32 graph ``src`` into ``dst`` (beside it) by ``scheme`` (:data:`SCHEMES`)
    and write ``dst``'s manifest.

    Raises:
        UsageError: an unknown scheme; bad calibration options; ``dst`` not beside ``src`` (its
            manifest names the fp32 source, which must stay in the manifest's folder).
        ArtifactError: ``src`` is not an fp32 ONNX graph, or cannot be brought to the scheme's
            opset (21 for A16W8's 16-bit Q/DQ).
    """
    import onnx
    import onnxruntime as ort
    from onnx import version_converter
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from xstage import parity
    from xstage.artifact import inspect_artifact
    from xstage.export.sanitize import run_on_cpu
    from xstage.manifest import write_manifest

    if scheme not in SCHEMES:
        raise errors.UsageError(f"unknown scheme {scheme!r}", remedy=f"schemes: {', '.join(SCHEMES)}")
    act_type, weight_type, min_opset, words = SCHEMES[scheme]
    fmt = f"onnx:{scheme}"
    src, dst = Path(src), Path(dst)
    if src.resolve().parent != dst.resolve().parent or src.resolve() == dst.resolve():
        raise errors.UsageError(
            f"write the quantized graph beside its fp32 source, under another name "
            f"({src.parent}/…)", remedy="its manifest names the fp32 source, which must stay in "
            "the manifest's folder")
    art = inspect_artifact(src)
    if art.format != "onnx:fp32":
        raise errors.ArtifactError(f"{src.name} is {art.format}; {scheme.upper()} starts from an fp32 graph",
                                   remedy="quantize the fp32 export")
    samples, calib = calibration_set(art.inputs, directory=calibration, synthetic=synthetic,
                                     shapes=shapes, dims=dims)
    model = onnx.load(str(art.path))  # the snapshot: the bytes whose sha256 the manifest names
    converted_from = None
    if _opset(model) < min_opset:
        converted_from = _opset(model)
        try:
            model = version_converter.convert_version(model, min_opset)
            model.ir_version = max(model.ir_version, 10)
            onnx.checker.check_model(model)
        except Exception as exc:  # noqa: BLE001 - the converter raises many kinds
            raise errors.ArtifactError(
                f"{src.name} is opset {converted_from}; converting it to {min_opset} failed: "
                f"{str(exc).splitlines()[0][:200]}",
                remedy=f"re-export the fp32 graph at opset {min_opset} (xstage export --opset "
                       f"{min_opset})") from exc
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        converted = tmp / "fp32.onnx"
        onnx.save_model(model, str(converted))
        # onnxruntime's own pre-processing (shape inference + graph optimization), as its
        # quantizer asks for; a graph it cannot process is quantized as it is, and said so.
        staged_in = tmp / "fp32-pre.onnx"
        try:
            quant_pre_process(str(converted), str(staged_in))
            preprocessed = True
        except Exception:  # noqa: BLE001 - symbolic shape inference fails on some graphs
            staged_in, preprocessed = converted, False
        staged = tmp / dst.name
        quantize_static(str(staged_in), str(staged), _Reader(samples),
                        quant_format=QuantFormat.QDQ, activation_type=getattr(QuantType, act_type),
                        weight_type=getattr(QuantType, weight_type))
        check = samples[-1]
        gate = parity.compare(run_on_cpu(staged, check), run_on_cpu(art.path, check),
                              fmt=fmt, reference_kind="fp32_source")
        os.replace(staged, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    parity_doc = gate.to_dict()
    manifest = write_manifest(
        dst, component=art.component, fmt=fmt, files=[dst],
        source={"kind": "quantized", "from": src.name, "sha256": art.sha256},
        exporter={"onnxruntime.quantization": ort.__version__, "onnx": onnx.__version__,
                  "scheme": words,
                  "quant_pre_process": preprocessed},
        inputs=[s.to_dict() for s in art.inputs], outputs=[s.to_dict() for s in art.outputs],
        opset=max(min_opset, converted_from or 0, _opset(model)), parity=parity_doc,
        fp32_source=src.name, calibration=calib)
    return {"kind": "xstage.quantize", "scheme": scheme, "input": str(src), "output": str(dst),
            "manifest": str(manifest), "converted_from_opset": converted_from,
            "preprocessed": preprocessed,
            "calibration": calib, "parity": parity_doc}
