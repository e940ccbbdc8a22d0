"""``sanitize_onnx``: run the passes, write atomically, then prove the output computes the same.

The output is written beside its final name in a temporary folder (graph plus, when the input
had external data, one sidecar named ``<OUT>.data``), checked with ``onnx.checker`` and run
against the input on onnxruntime's CPU EP with the same inputs. Only then do the files take
their final names: sidecar first, so the graph never names a file that is not there. A
graph with a symbolic dimension nobody fixed is reported "unchecked", never guessed.

Assumptions (``assume_finite``: NaN guards on values the user vouches for, docs/export.md):
the provable rewrites must stay bitwise; a guard removed on the user's word is checked on
sample inputs (the given ones, or :data:`ASSUMPTION_SAMPLES` synthesized at the declared
shapes) against the input graph on the CPU EP: bitwise equal, or within fp32's tight tier
(``xstage.parity``, the difference reported), or every assumed removal is reverted (the guard
kept, each site ``reverted`` with why) and the graph written without them.

Presets (``preset``, ``--for``): the rewrites one toolchain needs (:data:`PRESETS`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage.export.passes import (
    ALL,
    ClearReshapeAllowzeroPass,
    PromoteScalarAxesPass,
    RemoveNanGuardPass,
    Site,
    SitePass,
)
from xstage.snapshot import releasing

__all__ = ["ASSUMPTION_SAMPLES", "PRESETS", "REPORT_KIND", "run_on_cpu", "sanitize_onnx"]

REPORT_KIND = "xstage.sanitize"

#: Synthesized samples an assumption is checked on when no inputs are given.
ASSUMPTION_SAMPLES = 8

#: ``--for``: what each toolchain needs, from each toolchain's documented limits. QNN's converter has no
#: ``IsNaN`` and wants rank-1 ``axes`` and ``allowzero=0``: every rewrite, NaN guards assumed
#: finite (unless ``assume_finite`` names the values). DirectML rejects ``allowzero=1`` at
#: session init: that rewrite alone.
PRESETS: Mapping[str, str] = {
    "qnn": "Reshape allowzero cleared, rank-0 axes promoted, NaN guards assumed finite (all)",
    "dml": "Reshape allowzero cleared",
}


def _passes(preset: str | None, assume: frozenset[str] | str) -> list[SitePass]:
    if preset == "dml":
        return [ClearReshapeAllowzeroPass()]
    return [ClearReshapeAllowzeroPass(), RemoveNanGuardPass(assume), PromoteScalarAxesPass()]


def _assumption(preset: str | None, assume_finite: str | Sequence[str] | None) -> frozenset[str] | str:
    """The values assumed finite: the flag's, else the preset's (``qnn``: all), else none."""
    if assume_finite is None:
        return ALL if preset == "qnn" else frozenset()
    if isinstance(assume_finite, str):
        return ALL if assume_finite == ALL else frozenset({assume_finite})
    return frozenset(assume_finite)


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
                  dims: Mapping[str, int] | None = None,
                  assume_finite: str | Sequence[str] | None = None,
                  preset: str | None = None) -> dict[str, Any]:
    """Sanitize ``src`` into ``dst`` and return the report (see the module docstring).

    ``assume_finite``: ``"all"`` or value names whose NaN guards go on the user's word;
    ``preset``: a key of :data:`PRESETS`.

    Raises:
        UsageError: ``dst`` is ``src``; an unknown preset; ``assume_finite`` naming a value no
            NaN guard reads (the message lists the guarded values).
        ArtifactError: ``src`` cannot be read; the result fails the checker.
        XstageError: the result computes something else (a bug: nothing is written).
    """
    from xstage.artifact import inspect_artifact

    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise errors.UsageError(f"the output {dst} is the input",
                                remedy="write the sanitized graph to another path")
    if preset is not None and preset not in PRESETS:
        raise errors.UsageError(f"unknown preset {preset!r}", remedy=f"--for {'|'.join(PRESETS)}")
    art = inspect_artifact(src)  # validates and names what it found; ArtifactError otherwise
    assume = _assumption(preset, assume_finite)
    model, sites, outputs_before = _rewrite(art, src, preset, assume)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        staged, sidecar = _stage(model, tmp, dst)
        assumption = None
        if any(site.assumed and site.verdict == "applied" for site in sites):
            assumption = _check_assumed(art.path, staged, art, inputs, shapes, dims)
            if assumption["status"] == "reverted":  # the guards stay: rewrite without them
                reverted = {(x.rewrite, x.node): x for x in sites if x.assumed and x.verdict == "applied"}
                model, sites, _ = _rewrite(art, src, preset, frozenset())
                sites = [_reverted(reverted[x.rewrite, x.node], assumption["detail"])
                         if (x.rewrite, x.node) in reverted else x for x in sites]
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                staged, sidecar = _stage(model, tmp, dst)
        parity = _check_parity(art.path, staged, art, inputs, shapes, dims) \
            if assumption is None or assumption["status"] == "reverted" else assumption
        if parity["status"] == "differs":
            raise errors.XstageError(
                f"the sanitized graph computes something else: {parity['detail']}",
                remedy="nothing was written; report it with the input graph")
        if sidecar:
            os.replace(tmp / sidecar, dst.parent / sidecar)
        os.replace(staged, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _report(src, dst, sidecar, sites, parity, outputs_before, preset, assume, assumption)


def _report(src: Path, dst: Path, sidecar: str | None, sites: list[Site], parity: dict[str, Any],
            outputs: list[str], preset: str | None, assume: frozenset[str] | str,
            assumption: dict[str, Any] | None) -> dict[str, Any]:
    files = [{"path": dst.name, "bytes": dst.stat().st_size}]
    if sidecar:
        files.append({"path": sidecar, "bytes": (dst.parent / sidecar).stat().st_size})
    counts: dict[str, dict[str, int]] = {}
    for s in sites:
        counts.setdefault(s.rewrite, {"applied": 0, "skipped": 0})
        counts[s.rewrite][s.verdict] = counts[s.rewrite].get(s.verdict, 0) + 1
    return {"kind": REPORT_KIND, "input": str(src), "output": str(dst), "files": files,
            "sites": [s.to_dict() for s in sites], "counts": counts, "checker": "passed",
            "parity": parity, "outputs": outputs, "preset": preset,
            "assume_finite": assume if isinstance(assume, str) else sorted(assume),
            "assumption": assumption}


def _rewrite(art: Any, src: Path, preset: str | None,
             assume: frozenset[str] | str) -> tuple[Any, list[Site], list[str]]:
    """The snapshot loaded and rewritten by the preset's passes: (model, sites, output names).

    Raises:
        ArtifactError: the graph cannot be read.
        UsageError: an assumed value no NaN guard reads.
    """
    import onnx_ir as ir
    import onnx_ir.passes.common  # noqa: F401 - ShapeInferencePass

    try:
        model = ir.load(art.path)  # the snapshot: the bytes inspect_artifact hashed
    except Exception as exc:  # noqa: BLE001 - onnx-ir raises several kinds
        raise errors.ArtifactError(f"{src} could not be read as ONNX: {exc}",
                                   remedy="check the file (and its external data beside it)") from exc
    if not isinstance(assume, str) and assume:
        guarded = sorted({n.inputs[0].name for n in ir.traversal.RecursiveGraphIterator(model.graph)
                          if n.op_type == "IsNaN" and n.inputs and n.inputs[0] is not None})
        unknown = sorted(assume - set(guarded))
        if unknown:
            raise errors.UsageError(
                f"--assume-finite names {', '.join(unknown)}, which no NaN guard of {src.name} reads",
                remedy=f"the guarded values: {', '.join(guarded) or 'none'} (or --assume-finite all)")
    outputs_before = [v.name for v in model.graph.outputs]
    try:  # shapes of intermediates, for the rewrites that must know them; best effort
        ir.passes.common.ShapeInferencePass()(model)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot read keeps its shapes
        pass
    passes = _passes(preset, assume)
    for p in passes:
        p(model)
    if [v.name for v in model.graph.outputs] != outputs_before:  # pragma: no cover - invariant
        raise errors.XstageError("a sanitizer pass renamed a graph output", remedy="report it")
    return model, [s for p in passes for s in p.sites], outputs_before


def _stage(model: Any, tmp: Path, dst: Path) -> tuple[Path, str | None]:
    """The rewritten graph saved in ``tmp`` under ``dst``'s name (and its sidecar), checked.

    Raises:
        ArtifactError: it fails onnx.checker.
    """
    import onnx
    import onnx_ir as ir

    sidecar = f"{dst.name}.data" if _has_external_data(model) else None
    staged = tmp / dst.name
    ir.save(model, staged, external_data=sidecar)
    try:
        onnx.checker.check_model(str(staged), full_check=False)
    except Exception as exc:  # noqa: BLE001 - the checker's own error types vary by version
        raise errors.ArtifactError(f"the sanitized graph fails onnx.checker: {exc}",
                                   remedy="report it with the input graph") from exc
    return staged, sidecar


def _reverted(site: Site, why: str) -> Site:
    return Site(site.rewrite, site.node, site.op_type, "reverted",
                f"assumed {site.assumed!r} finite, but on the sample inputs {why}: the guard is "
                "kept", site.assumed)


def _samples(art: Any, inputs: Any, shapes: Any, dims: Any) -> list[dict[str, np.ndarray]]:
    """The given inputs, or :data:`ASSUMPTION_SAMPLES` synthesized at the declared shapes."""
    from xstage.inputs import SEED, resolve_feeds, synthesize

    if inputs is not None:
        return [resolve_feeds(art.inputs, inputs, shapes=shapes, dims=dims)]
    return [synthesize(art.inputs, shapes=shapes, dims=dims, seed=SEED + i)
            for i in range(ASSUMPTION_SAMPLES)]


def _check_assumed(src: Path, staged: Path, art: Any, inputs: Any, shapes: Any,
                   dims: Any) -> dict[str, Any]:
    """The graph with assumed removals against the input graph on the sample inputs: bitwise
    (``identical``), within fp32's tight tier (``within_tolerance``, the difference reported),
    else ``reverted``."""
    from xstage import parity

    try:
        samples = _samples(art, inputs, shapes, dims)
    except errors.UsageError as exc:
        if "unknown dimension" not in exc.message:
            raise
        return {"status": "reverted", "samples": 0, "detail": f"nothing could be checked ("
                f"{exc.message}; pass --inputs or --shape)"}
    worst: dict[str, Any] | None = None
    for i, feeds in enumerate(samples):
        try:
            before, after = run_on_cpu(src, feeds), run_on_cpu(staged, feeds)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are not one class
            return {"status": "reverted", "samples": len(samples), "detail": f"sample {i} did "
                    f"not run ({str(exc).strip().splitlines()[-1][:200]}; pass --inputs)"}
        if all(_identical(before[n], after[n]) for n in before):
            continue
        gate = parity.compare(after, before, fmt="onnx:fp32", reference_kind="same_graph_cpu")
        if not gate.passed:
            return {"status": "reverted", "samples": len(samples),
                    "detail": f"sample {i} moved the outputs past fp32's tight tier ({gate.summary})"}
        worst = worst or {"sample": i, "summary": gate.summary}
    if worst is None:
        return {"status": "identical", "samples": len(samples),
                "detail": f"{len(samples)} sample(s): every output bitwise identical on "
                          "onnxruntime's CPU EP"}
    return {"status": "within_tolerance", "samples": len(samples),
            "detail": f"{len(samples)} sample(s): not bitwise (sample {worst['sample']}), within "
                      f"fp32's tight tier: {worst['summary']}"}


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
