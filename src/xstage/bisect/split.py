"""The split artifact: each accepted region as its own graph, the rest on the CPU, run in order.

``write_split`` writes, into one folder, the graph's nodes in their bisect order as parts:
``region-<i>.onnx`` (an accepted region, with its ``<file>.manifest.json``, to open on the
bisect's route) and ``cpu-<i>.onnx`` (the nodes between regions: the CPU remainder), and
``split.json``, which lists the parts in order with the values each reads and writes, the route
and device, and the original graph's inputs and outputs.

``run_split`` runs the parts in order: each region through ``xstage.open_stage`` on the recorded
route and device with ``min_placement`` 1.0 (the same admission as ``xstage external``: proof,
gate, peak), each CPU part on onnxruntime's CPU EP in this process. It returns the original
graph's outputs and each part's proof.

.. versionadded:: 0.3
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xstage import errors
from xstage._version import __version__
from xstage.bisect.graph import BisectGraph
from xstage.device_table import DeviceReport
from xstage.evidence import PlacementProof
from xstage.home import atomic_write
from xstage.manifest import write_manifest
from xstage.stage import open_stage

__all__ = ["SPLIT_FILE", "PartRun", "SplitRun", "read_split", "run_split", "write_split"]

SPLIT_FILE = "split.json"
_KIND = "xstage.split"


@dataclass(frozen=True)
class PartRun:
    """One part of a split run: where it ran and, for a region, its proof."""

    name: str
    kind: str  # "region" or "cpu"
    route: str | None
    device: str | None
    proof: PlacementProof | None


@dataclass(frozen=True)
class SplitRun:
    """A split run: the original graph's outputs, and each part in the order it ran."""

    outputs: dict[str, np.ndarray]
    parts: tuple[PartRun, ...]


def _spec(name: str, array: np.ndarray) -> dict[str, Any]:
    return {"name": name, "dtype": str(array.dtype), "shape": [int(d) for d in array.shape]}


def write_split(graph: BisectGraph, values: Mapping[str, Any], regions: Sequence[tuple[int, int]],
                folder: str | os.PathLike[str], *, route: str, device: str,
                source_sha256: str) -> dict[str, Any]:
    """Write the split artifact of ``graph`` into ``folder``; returns ``split.json``'s document.

    Side effects: creates ``folder`` and writes one graph per part, a manifest per region and
    ``split.json`` (each file written whole before it is named).

    Raises:
        UsageError: ``folder`` exists and holds files (nothing is overwritten).
        ArtifactError: a part could not be extracted.
    """
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise errors.UsageError(f"--out {out} exists and is not an empty folder",
                                remedy="name a new folder (nothing is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    bounds: list[tuple[str, int, int]] = []
    at = 0
    for start, stop in sorted(regions):
        if start > at:
            bounds.append(("cpu", at, start))
        bounds.append(("region", start, stop))
        at = stop
    if at < len(graph):
        bounds.append(("cpu", at, len(graph)))
    parts = []
    counts = {"cpu": 0, "region": 0}
    for kind, start, stop in bounds:
        name = f"{kind}-{counts[kind]}"
        counts[kind] += 1
        path = out / f"{name}.onnx"
        inputs, outputs = graph.write_region(start, stop, path, values)
        if kind == "region":
            write_manifest(path, component=f"{graph.path.stem}.{name}", fmt=graph.fmt, files=[path],
                           source={"kind": "bisect", "graph": graph.path.name,
                                   "sha256": source_sha256, "start": start, "stop": stop},
                           exporter={"xstage": __version__, "by": "xstage bisect --out"},
                           inputs=[_spec(n, values[n]) for n in inputs],
                           outputs=[_spec(n, values[n]) for n in outputs])
        parts.append({"name": name, "kind": kind, "start": start, "stop": stop,
                      "graph": path.name, "inputs": inputs, "outputs": outputs})
    doc = {"kind": _KIND, "version": 1, "route": route, "device": device, "format": graph.fmt,
           "source": {"graph": graph.path.name, "sha256": source_sha256, "nodes": len(graph)},
           "inputs": list(graph.inputs), "outputs": list(graph.outputs), "parts": parts}
    atomic_write(out / SPLIT_FILE, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return doc


def read_split(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``split.json`` of a split folder, checked: its kind, and every part a plain file beside it.

    Raises:
        ArtifactError: no ``split.json``, not JSON, another kind, or a part that is missing or
            names a path outside the folder.
    """
    where = Path(folder) / SPLIT_FILE
    try:
        doc = json.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise errors.ArtifactError(f"no split at {folder}: {exc.strerror or exc}",
                                   remedy="pass a folder written by xstage bisect --out") from None
    except ValueError as exc:
        raise errors.ArtifactError(f"{where} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != _KIND or doc.get("version") != 1:
        raise errors.ArtifactError(f"{where} is not an xstage split (kind {_KIND}, version 1)",
                                   remedy="pass a folder written by xstage bisect --out")
    for part in doc.get("parts") or []:
        name = str(part.get("graph", ""))
        if not name or "/" in name or "\\" in name or name.startswith(".") \
                or not (Path(folder) / name).is_file():
            raise errors.ArtifactError(f"{where}: part {name!r} is missing or escapes its folder")
    return doc


def run_split(folder: str | os.PathLike[str], feeds: Mapping[str, Any], *,
              report: DeviceReport | None = None, **options: Any) -> SplitRun:
    """Run a split artifact on ``feeds``: regions as stages, the rest on the CPU, in order.

    ``options`` go to every region's ``open_stage`` (``deadlines``, ``ep_options``, ``threads``,
    ``tolerance``).

    Raises:
        ArtifactError: the folder is not a split (``read_split``).
        InputError: ``feeds`` lacks one of the graph's inputs.
        Refused: a region was not admitted (its refusal says why).
        WorkerError: a region's worker failed.
    """
    import onnxruntime as ort

    doc = read_split(folder)
    missing = [n for n in doc["inputs"] if n not in feeds]
    if missing:
        raise errors.InputError(f"the split's graph needs inputs {missing}",
                                remedy=f"pass every input: {doc['inputs']}")
    env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
    runs: list[PartRun] = []
    for part in doc["parts"]:
        path = Path(folder) / part["graph"]
        part_feeds = {n: env[n] for n in part["inputs"]}
        if part["kind"] == "region":
            with open_stage(path, route=doc["route"], device=doc["device"], min_placement=1.0,
                            inputs=part_feeds, fmt=doc["format"], report=report,
                            **options) as stage:
                got = stage(part_feeds)
                runs.append(PartRun(part["name"], "region", stage.route, stage.device,
                                    stage.proof))
        else:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            got = dict(zip(names, session.run(names, part_feeds), strict=True))
            runs.append(PartRun(part["name"], "cpu", None, None, None))
        env.update({n: np.asarray(got[n]) for n in part["outputs"]})
    return SplitRun(outputs={n: env[n] for n in doc["outputs"]}, parts=tuple(runs))
