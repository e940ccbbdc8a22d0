"""What every torch exporter shares: seeded weights, the bitwise check, and writing an artifact
(``.pt2`` or ONNX, fp32 or fp16) with its sanitize report and manifest.

Needs ``torch`` and ``transformers`` (the ``export`` extra); nothing else in xstage imports
this module, so the main job runs without them.

fp16: parameters are cast, buffers are not (``inv_freq``, interpolation weights, masks stay
fp32, as the model keeps them); the artifact still takes and gives fp32 tensors, so it is
gated against its fp32 source with the same inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xstage import errors
from xstage.artifact import runtime_of

__all__ = ["FORMATS", "MIN_TRANSFORMERS", "artifact_paths", "bitwise_check", "export_artifact",
           "perturb_", "require_torch", "versions"]

FORMATS = ("onnx:fp32", "onnx:fp16", "pt:fp32", "pt:fp16")
#: The oldest transformers whose helpers the wrappers were verified against (bitwise).
MIN_TRANSFORMERS = "5.24.0"


def require_torch() -> tuple[Any, Any]:
    """``(torch, transformers)``, or a UsageError naming the extra to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise errors.UsageError(
            f"xstage export needs torch and transformers ({exc.name} is not importable here)",
            remedy="pip install 'xstage[export]' (torch >= 2.5 and transformers >= "
            f"{MIN_TRANSFORMERS})") from exc
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise errors.UsageError(
            f"transformers {transformers.__version__} is older than {MIN_TRANSFORMERS}, the first "
            "version the export wrappers were checked against",
            remedy=f"python3 -m pip install 'transformers>={MIN_TRANSFORMERS}'")
    return torch, transformers


def versions() -> dict[str, str]:
    import onnx
    import torch
    import transformers

    from xstage._version import __version__

    out = {"xstage": __version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "onnx": onnx.__version__}
    try:
        import onnxscript

        out["onnxscript"] = onnxscript.__version__
    except ImportError:  # pragma: no cover - the ONNX exporter needs it
        pass
    return out


def perturb_(model: Any, seed: int, scale: float = 0.05) -> Any:
    """Add seeded noise to every parameter, so no norm or bias is the trivial 1 or 0 an
    exporter's optimizer could fold away or merge."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale)
    return model


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def bitwise_check(reference: Callable[[], Any], wrapper: Callable[[], Any]) -> dict[str, Any]:
    """Run both, compare every output with ``torch.equal``; raise if any differs."""
    import torch

    with torch.no_grad():
        ref, got = _flat(reference()), _flat(wrapper())
    equal = len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got, strict=False))
    diff = max((float((a.float() - b.float()).abs().max()) for a, b in zip(ref, got, strict=False)),
               default=0.0)
    if not equal:
        raise errors.XstageError(
            f"the export wrapper does not reproduce the model's forward bitwise (max |diff| {diff:.3g})",
            remedy="check the transformers version against the one the wrapper was verified with "
            f"({MIN_TRANSFORMERS})")
    return {"bitwise_equal": True, "outputs": len(ref), "max_abs_diff": diff}


def _external(module: Any) -> bool:
    """Weights over ~1.8 GB go to a sidecar (a protobuf holds at most 2 GB)."""
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    size += sum(b.numel() * b.element_size() for b in module.buffers())
    return size > 1_800_000_000


class _quiet:
    """torch.onnx's progress lines and its warnings about optional packages are not ours to print."""

    def __enter__(self) -> None:
        import contextlib
        import io
        import logging
        import warnings

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        logger = logging.getLogger("torch")
        self._level = logger.level
        logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        import logging

        logging.getLogger("torch").setLevel(self._level)
        self._stack.close()


def _ort_vs_torch(module: Any, example: tuple[Any, ...], path: Path,
                  input_names: Sequence[str]) -> float:
    """The exported graph on onnxruntime's CPU EP against the module in torch."""
    import numpy as np
    import torch

    from xstage.export.sanitize import run_on_cpu

    feeds = {n: t.detach().numpy() for n, t in zip(input_names, example, strict=True)}
    got = list(run_on_cpu(path, feeds).values())
    with torch.no_grad():
        ref = [t.detach().float().numpy() for t in _flat(module(*example))]
    return max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(got, ref, strict=True))


def artifact_paths(out: Path, fmt: str) -> Path:
    """``out`` with the right extension for ``fmt``."""
    return out.with_suffix(".pt2" if runtime_of(fmt) == "torch" else ".onnx")


def export_artifact(module: Any, example: tuple[Any, ...], path: Path, *, fmt: str, opset: int,
                    input_names: Sequence[str], output_names: Sequence[str],
                    component: str, source: dict[str, Any], fp32_source: str | None,
                    io_spec: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                    wrapper_check: dict[str, Any],
                    state: Sequence[dict[str, str]] | None = None,
                    stream: dict[str, Any] | None = None,
                    for_torch: str | None = None) -> dict[str, Any]:
    """Write ``module`` as ``fmt`` at ``path`` (ONNX: exported, then sanitized in place of the
    raw export; .pt2: saved and reloaded to check it, or with ``for_torch`` written for that
    older torch by ``pt2_legacy``, which checks itself) and its manifest; return the report.

    ``state``: state pairs the manifest declares (``{input, output, init}``, docs/serving.md);
    ``stream``: a windowed decoder's facts (docs/pipelines.md).
    """
    import torch

    from xstage.manifest import write_manifest

    path.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"format": fmt, "path": str(path)}
    t0 = time.perf_counter()
    sanitize_report = None
    exporter = versions()
    if runtime_of(fmt) == "torch" and for_torch:
        from xstage.export.pt2_legacy import write_legacy_pt2

        program = torch.export.export(module, example, strict=False)
        report["legacy"] = write_legacy_pt2(program, path, for_torch)
        exporter.update(pt2_for_torch=for_torch, pt2_schema=report["legacy"]["schema"])
        files = [path]
    elif runtime_of(fmt) == "torch":
        program = torch.export.export(module, example, strict=False)
        torch.export.save(program, str(path))
        loaded = torch.export.load(str(path))
        with torch.no_grad():
            same = all(torch.equal(a, b) for a, b in zip(_flat(module(*example)),
                                                         _flat(loaded.module()(*example)), strict=True))
        report["reload_bitwise"] = same
        if not same:
            raise errors.XstageError(f"{path.name} does not reload to the same outputs",
                                     remedy="report it with the torch version")
        files = [path]
    else:
        from xstage.export.sanitize import sanitize_onnx

        raw = path.with_name(path.stem + ".raw.onnx")
        try:
            with _quiet():
                torch.onnx.export(module, example, str(raw), dynamo=True, opset_version=opset,
                                  input_names=list(input_names), output_names=list(output_names),
                                  external_data=_external(module), verbose=False)
            feeds = {n: t.detach().numpy() for n, t in zip(input_names, example, strict=True)}
            sanitize_report = sanitize_onnx(raw, path, inputs=feeds)
        finally:
            for leftover in (raw, raw.with_name(raw.name + ".data")):
                leftover.unlink(missing_ok=True)
        files = [path.parent / f["path"] for f in sanitize_report["files"]]
        report["onnxruntime_vs_torch_max_abs"] = _ort_vs_torch(module, example, path, input_names)
    report["export_s"] = round(time.perf_counter() - t0, 3)
    report["bytes"] = sum(f.stat().st_size for f in files)
    report["manifest"] = str(write_manifest(
        path, component=component, fmt=fmt, files=files, source=source, exporter=exporter,
        inputs=io_spec[0], outputs=io_spec[1], opset=None if runtime_of(fmt) == "torch" else opset,
        sanitize=sanitize_report, fp32_source=fp32_source, state=state, stream=stream,
        parity={"wrapper_vs_model": wrapper_check,
                **({"onnxruntime_cpu_vs_torch_max_abs": report["onnxruntime_vs_torch_max_abs"]}
                   if "onnxruntime_vs_torch_max_abs" in report else {})}))
    report["sanitize"] = sanitize_report and sanitize_report["counts"]
    return report
