"""vLLM-Omni's two call sequences, as the engine makes them, against ``xstage.integrations.vllm_omni``.

Written from reading the engine's code (docs/engines.md names the files and commits): the same
calls, in the same order, with the same argument names and types. Used by
``test_vllm_omni.py`` in this interpreter, and run as a script by it under Python 3.10::

    python vllm_omni_calls.py CONFIG.json   # prints one JSON document: every sequence's outcome

Only the standard library, numpy and xstage: nothing from the test suite, so a bare 3.10 venv
runs it.

* ``external_sequence``: ``python -m vllm_omni.edge.local external`` (their ``cli.cmd_external``):
  describe the graph, plan, print the summary, synthesize example inputs from the artifact's
  input spec, open, run ``runs`` times, read the timings, the stats and the report, close in
  ``finally``; a ``PlacementRefused`` is exit 2 with its code, message and remedy.
* ``backend_sequence``: the graph backend (their ``GraphStageClient``): read the bundle's
  manifest, resolve the route, start the worker, load with the hashed files, refuse below the
  backend's threshold or on a provider the config does not permit, run once in a thread, and
  terminate.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The engine's example-input dtypes by ONNX elem_type, and ours by name.
_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int32": np.int32,
           "int64": np.int64}


def synthetic_inputs(spec: tuple[dict[str, Any], ...]) -> dict[str, np.ndarray]:
    """Example inputs from the artifact's input spec, seeded (the engine synthesizes them too)."""
    inputs = {}
    for item in spec:
        shape = [int(d) for d in item["shape"]]
        dtype = _DTYPES.get(str(item.get("dtype", "float32")), np.float32)
        if np.issubdtype(dtype, np.integer):
            inputs[item["name"]] = np.zeros(shape, dtype=dtype)
        else:
            inputs[item["name"]] = np.random.RandomState(0).randn(*shape).astype(dtype)
    return inputs


def external_sequence(vo: Any, devices: list[Any], graph: str, *, fmt: str = "onnx:fp32",
                      opset: int = 17, component: str = "vision_tower", prefer: str | None = None,
                      require: str | None = None, min_placement: float = 0.5,
                      profile_dir: str | None = None, runs: int = 3) -> dict[str, Any]:
    """The engine's ``external`` command: its calls in its order; the record it writes, and exit."""
    artifact = vo.build_graph_artifact(graph, fmt=fmt, opset=opset, source_model="(unrecorded)",
                                       component=component, exporter="(unrecorded)")
    plan = vo.plan_external_stage(artifact, devices, prefer=prefer, require=require,
                                  min_fraction_on_target=min_placement)
    summary = plan.summary()
    record: dict[str, Any] = {"devices": [d.to_dict() for d in devices], "plan": plan.to_dict(),
                              "summaries": [summary]}
    if not plan.admitted:
        record["exit"] = 2
        return record
    example = synthetic_inputs(artifact.input_spec)
    stage = vo.ExternalStage(plan)
    try:
        report = stage.open(example, profile_dir=profile_dir)
        record["summaries"].append(plan.summary())
        timings = []
        for _ in range(runs):
            outputs, timing = stage.run(example)
            timings.append(timing)
        record["timings"] = [t.to_dict() for t in timings]
        record["transport_s"] = sorted(t.transport_s for t in timings)[len(timings) // 2]
        record["outputs"] = {name: list(value.shape) for name, value in outputs.items()}
        record["stats"] = stage.stats()
        record["report"] = report.to_dict()
        record["plan"] = plan.to_dict()
        record["exit"] = 0
    except vo.PlacementRefused as exc:
        record["refused"] = {"code": exc.refusal.code, "message": exc.refusal.message,
                             "remedy": exc.refusal.remedy, "cause": exc.refusal.cause,
                             "report": exc.report.to_dict() if exc.report else None}
        record["plan"] = plan.to_dict()
        record["exit"] = 2
    finally:
        stage.close()
    return record


def write_bundle(graph: str, folder: Path, inputs: dict[str, np.ndarray]) -> Path:
    """A schema-1 bundle as the backend reads it: the graph, its example inputs, the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(graph, folder / "graph.onnx")
    np.savez(folder / "examples.npz", **inputs)
    files = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
             for name in ("graph.onnx", "examples.npz")}
    manifest = {"schema_version": 1, "component": "vision_tower", "files": files,
                "metadata": {"graph_file": "graph.onnx", "example_inputs_file": "examples.npz"}}
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest), encoding="utf-8")
    return path


def backend_sequence(vo: Any, config: dict[str, Any], reserved_bytes: int) -> dict[str, Any]:
    """The graph backend's open, one call and shutdown; its ``execution_plan`` and the call."""
    max_io_bytes = int(config.get("max_io_bytes", 8 << 20))
    manifest_path = Path(config["manifest"]).resolve()
    manifest = vo.ArtifactManifest.read(manifest_path)
    if manifest.artifact_metadata() is not None:
        raise ValueError("a v2 artifact")
    graph_name = manifest.metadata["graph_file"]
    examples_name = manifest.metadata["example_inputs_file"]
    if graph_name not in manifest.files or examples_name not in manifest.files:
        raise ValueError("graph and placement examples must be hashed artifact payloads")
    if sum((manifest_path.parent / n).stat().st_size for n in manifest.files) > reserved_bytes:
        raise RuntimeError("artifact files exceed stage memory reservation")
    route = vo.resolve_route(config["route"])
    worker = vo.ExternalWorker(route, start_timeout_s=float(config.get("start_timeout_s", 120)),
                               max_payload_bytes=max_io_bytes)
    try:
        worker.start()
        with np.load(manifest_path.parent / examples_name, allow_pickle=False) as example:
            inputs = {name: example[name] for name in example.files}
        report = worker.load(
            manifest_path.parent / graph_name,
            example_inputs=inputs,
            ep_dir=config.get("ep_dir"),
            intra_op_num_threads=config.get("intra_op_num_threads"),
            profile_prefix=config.get("profile_prefix"),
            artifact_files=[manifest_path.parent / name for name in manifest.files],
        )
        minimum = float(config.get("min_fraction_on_target", 1.0))
        if (report.requested_provider_missing or report.fraction_on_target is None
                or not 0 < report.fraction_on_target <= 1 or report.target_nodes <= 0
                or report.fraction_on_target < minimum):
            raise RuntimeError(f"REFUSE_EP_PLACEMENT: {report.summary()}")
        allowed = set(config.get("allowed_providers", report.session_providers if route.ep == "cpu" else ()))
        if not allowed or set(report.node_counts) - allowed:
            raise RuntimeError("REFUSE_EP_PLACEMENT: declare all permitted execution providers")
        if report.rss_bytes > reserved_bytes:
            raise RuntimeError("loaded worker RSS exceeds stage memory reservation")
        execution_plan = {"backend": "external.graph.v1", "component": manifest.component,
                          "route": route.to_dict(), "max_io_bytes": max_io_bytes,
                          "placement": report.to_dict(),
                          "worker": {k: v for k, v in worker.hello.items() if k != "token"}}
        outputs, timing = asyncio.run(_in_thread(worker.run, inputs))
    except BaseException:
        worker.terminate()
        raise
    drained = worker.terminate()
    return {"execution_plan": execution_plan, "outputs": {k: list(v.shape) for k, v in outputs.items()},
            "timing": timing.to_dict(), "drained": drained, "terminated_again": worker.terminate()}


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def simulated_igpu_row(vo: Any) -> Any:
    """The engine's iGPU row, standing for this machine's CPU through ort-openvino.

    The engine's scope (iGPU, NPU) has no device on a CPU-only machine; this row is the engine's
    ``gpu_integrated`` row with its worker route ``ort-openvino`` and, behind it, xstage's
    ``cpu`` device (``extra["xstage_device"]``): the proof and the attestation say ``cpu``.
    """
    return vo.DeviceCapability(
        device_id="gpu_integrated:intel", kind="gpu_integrated", vendor="intel",
        name="Intel(R) Graphics (simulated: this machine's CPU behind it)", backend="ort:openvino",
        runnable=True, memory_pool="host_ram", memory_bytes=0, compute_capability=None,
        weight_formats=frozenset({"onnx:fp32", "onnx:fp16"}), evidence="D",
        extra={"worker_route": "ort-openvino", "xstage_device": "cpu"})


def main(argv: list[str]) -> int:
    """Every sequence once, on the config's graph; one JSON document on stdout."""
    from xstage.integrations import vllm_omni as vo

    config = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    graph, work = config["graph"], Path(config["work"])
    devices = [*vo.enumerate_devices(), simulated_igpu_row(vo)]
    out = {"python": list(sys.version_info[:2]),
           "placed": external_sequence(vo, devices, graph, profile_dir=str(work / "profiles")),
           "missing_npu": external_sequence(vo, vo.enumerate_devices(), graph, require="npu:amd")}
    artifact = vo.build_graph_artifact(graph, fmt="onnx:fp32", opset=17, source_model="-",
                                       component="vision_tower", exporter="-")
    manifest = write_bundle(graph, work / "bundle", synthetic_inputs(artifact.input_spec))
    out["backend"] = backend_sequence(vo, {"manifest": str(manifest), "route": "ort-openvino",
                                           "allowed_providers": ["OpenVINOExecutionProvider"]},
                                      reserved_bytes=1 << 30)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")
    sys.exit(main(sys.argv))
