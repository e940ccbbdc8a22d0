"""``sanitize_onnx``: run the passes, write atomically, then prove the output computes the same.

The output is written beside its final name in a temporary folder (graph plus, when the input
had external data, one sidecar named ``<OUT>.data``), checked with ``onnx.checker`` and run
against the input on onnxruntime's CPU EP with the same inputs. Only then do the files take
their final names: sidecar first, so the graph never names a file that is not there. A
graph with a symbolic dimension nobody fixed is reported "unchecked", never guessed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.export.passes import (
    ClearReshapeAllowzeroPass,
    PromoteScalarAxesPass,
    RemoveNanGuardPass,
    SitePass,
)
from xstage.snapshot import releasing

__all__ = ["REPORT_KIND", "run_on_cpu", "sanitize_onnx"]

REPORT_KIND = "xstage.sanitize"


def _passes() -> list[SitePass]:
    return [ClearReshapeAllowzeroPass(), RemoveNanGuardPass(), PromoteScalarAxesPass()]


def _has_external_data(model: Any) -> bool:
    import onnx_ir as ir

    for value in model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            return True
    return False


def run_on_cpu(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs by name of ``path`` on onnxruntime's CPU EP (the exporters' own checks)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # failures are reported by the caller, not logged twice
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a.view(np.uint8), b.view(np.uint8))) if a.dtype.kind in "fc" \
        else bool(np.array_equal(a, b))


@releasing  # the snapshots it read, once it is done
def sanitize_onnx(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                  inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
                  shapes: Mapping[str, tuple[int, ...]] | None = None,
                  dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Sanitize ``src`` into ``dst`` and return the report (see the module docstring).

    Raises:
        UsageError: ``dst`` is ``src``.
        ArtifactError: ``src`` cannot be read; the result fails the checker.
        XstageError: the result computes something else (a bug: nothing is written).
    """
    import onnx
    import onnx_ir as ir
    import onnx_ir.passes.common  # noqa: F401 - ShapeInferencePass

    from xstage.artifact import inspect_artifact

    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise errors.UsageError(f"the output {dst} is the input",
                                remedy="write the sanitized graph to another path")
    art = inspect_artifact(src)  # validates and names what it found; ArtifactError otherwise
    try:
        model = ir.load(art.path)  # the snapshot: the bytes inspect_artifact hashed
    except Exception as exc:  # noqa: BLE001 - onnx-ir raises several kinds
        raise errors.ArtifactError(f"{src} could not be read as ONNX: {exc}",
                                   remedy="check the file (and its external data beside it)") from exc
    outputs_before = [v.name for v in model.graph.outputs]
    try:  # shapes of intermediates, for the rewrites that must know them; best effort
        ir.passes.common.ShapeInferencePass()(model)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot read keeps its shapes
        pass
    passes = _passes()
    for p in passes:
        p(model)
    if [v.name for v in model.graph.outputs] != outputs_before:  # pragma: no cover - invariant
        raise errors.XstageError("a sanitizer pass renamed a graph output", remedy="report it")
    sites = [s for p in passes for s in p.sites]

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        sidecar = f"{dst.name}.data" if _has_external_data(model) else None
        staged = tmp / dst.name
        ir.save(model, staged, external_data=sidecar)
        try:
            onnx.checker.check_model(str(staged), full_check=False)
        except Exception as exc:  # noqa: BLE001 - the checker's own error types vary by version
            raise errors.ArtifactError(f"the sanitized graph fails onnx.checker: {exc}",
                                       remedy="report it with the input graph") from exc
        parity = _check_parity(art.path, staged, art, inputs, shapes, dims)
        if parity["status"] == "differs":
            raise errors.XstageError(
                f"the sanitized graph computes something else: {parity['detail']}",
                remedy="nothing was written; report it with the input graph")
        if sidecar:
            os.replace(tmp / sidecar, dst.parent / sidecar)
        os.replace(staged, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = [{"path": dst.name, "bytes": dst.stat().st_size}]
    if sidecar:
        files.append({"path": sidecar, "bytes": (dst.parent / sidecar).stat().st_size})
    counts: dict[str, dict[str, int]] = {}
    for s in sites:
        counts.setdefault(s.rewrite, {"applied": 0, "skipped": 0})[s.verdict] += 1
    return {"kind": REPORT_KIND, "input": str(src), "output": str(dst), "files": files,
            "sites": [s.to_dict() for s in sites], "counts": counts, "checker": "passed",
            "parity": parity, "outputs": outputs_before}


def _check_parity(src: Path, staged: Path, art: Any, inputs: Any, shapes: Any,
                  dims: Any) -> dict[str, Any]:
    from xstage.inputs import resolve_feeds

    try:
        feeds = resolve_feeds(art.inputs, inputs, shapes=shapes, dims=dims)
    except errors.UsageError as exc:
        if "unknown dimension" in exc.message:
            return {"status": "unchecked", "detail": "unchecked: pass --inputs or --shape "
                    f"({exc.message})"}
        raise
    try:
        before = run_on_cpu(src, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are not one class
        why = str(exc).strip().splitlines()[-1][:300]
        try:
            run_on_cpu(staged, feeds)
        except Exception:  # noqa: BLE001
            raise errors.InputError(
                f"the graph does not run on onnxruntime's CPU EP with these inputs: {why}",
                remedy="pass --inputs FILE.npz (or --shape/--dim) that the graph accepts") from exc
        return {"status": "unchecked", "detail": "unchecked: the input graph does not run on "
                f"onnxruntime's CPU EP ({why}); the sanitized one does"}
    try:
        after = run_on_cpu(staged, feeds)
    except Exception as exc:  # noqa: BLE001
        return {"status": "differs", "detail": f"the sanitized graph fails where the input runs: "
                f"{str(exc).strip().splitlines()[-1][:300]}"}
    diffs = [name for name in before if not _identical(before[name], after[name])]
    if diffs:
        return {"status": "differs", "detail": f"outputs {diffs} differ bitwise"}
    return {"status": "identical", "detail": f"{len(before)} output(s) bitwise identical on "
            "onnxruntime's CPU EP", "inputs": {k: list(v.shape) for k, v in feeds.items()}}
