"""vLLM-Omni's external stage with xstage behind it: the swap is the import.

The engine's call site stays as it is; only where the names come from changes:

    # from vllm_omni.edge.local.external.stage import ExternalStage, PlacementRefused, plan_external_stage
    # from vllm_omni.edge.local.manifest import build_graph_artifact
    from xstage.integrations.vllm_omni import (ExternalStage, PlacementRefused, build_graph_artifact,
                                               enumerate_devices, plan_external_stage)

Then the engine's ``external`` sequence runs unchanged (below: plan, open, run, stats, close,
a ``PlacementRefused`` printed with its code and remedy, exit 2). By default the plan has the
engine's scope, the integrated GPU and the NPU: on a machine with neither it is refused, as the
engine refuses. ``--kinds gpu_integrated,npu,cpu`` widens the scope so the built-in tower runs
on this machine's CPU (through the first route that drives it, ort-openvino where it resolves).
``--backend`` runs the graph backend's worker instead (``ExternalWorker`` on ``--route``). docs/engines.md
maps every call to the xstage call behind it.

    python examples/vllm_omni_backend.py [--kinds gpu_integrated,npu,cpu] [--runs 10]
    python examples/vllm_omni_backend.py --backend --route ort-openvino
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from xstage.builtin_graphs import builtin_artifact
from xstage.integrations.vllm_omni import (
    ExternalStage,
    ExternalWorker,
    PlacementRefused,
    build_graph_artifact,
    enumerate_devices,
    plan_external_stage,
    resolve_route,
)


def example_inputs(spec: tuple[dict, ...]) -> dict[str, np.ndarray]:
    """Seeded float32 inputs of the artifact's declared shapes."""
    rng = np.random.default_rng(0)
    return {i["name"]: rng.standard_normal(i["shape"]).astype(np.float32) for i in spec}


def external(graph: str, kinds: tuple[str, ...], runs: int) -> int:
    """The engine's ``external`` command, on xstage."""
    artifact = build_graph_artifact(graph, fmt="onnx:fp32", opset=17, source_model="(tiny, random weights)",
                                    component="vision_tower", exporter="xstage export vision-tower")
    plan = plan_external_stage(artifact, enumerate_devices(), kinds=kinds)
    print(plan.summary())
    if not plan.admitted:
        return 2
    example = example_inputs(artifact.input_spec)
    stage = ExternalStage(plan)
    try:
        report = stage.open(example)
        print(f"\n{report.summary()}\n  {report.note}")
        timings = [stage.run(example)[1] for _ in range(runs)]
        mid = len(timings) // 2
        worker = sorted(t.worker_s for t in timings)[mid]
        trip = sorted(t.round_trip_s for t in timings)[mid]
        transport = sorted(t.transport_s for t in timings)[mid]
        print(f"\n  {runs} runs: device {worker * 1e3:.3f} ms median, round trip {trip * 1e3:.3f} ms, "
              f"transport {transport * 1e3:.3f} ms")
        stats = stage.stats()
        rss, peak = stats["rss_bytes"] / 2**20, stats["peak_rss_bytes"] / 2**20
        print(f"  worker rss {rss:.0f} MiB, peak {peak:.0f} MiB")
    except PlacementRefused as exc:
        print(f"\nREFUSED [{exc.refusal.code}] {exc.refusal.message}\n  remedy: {exc.refusal.remedy}")
        return 2
    finally:
        stage.close()
    return 0


def backend(graph: str, route_name: str) -> int:
    """The graph backend's worker, on xstage: start, load (threshold 1.0), one call, terminate."""
    worker = ExternalWorker(resolve_route(route_name), start_timeout_s=120.0, max_payload_bytes=8 << 20)
    worker.start()
    try:
        report = worker.load(graph)
    except PlacementRefused as exc:
        print(f"REFUSED [{exc.refusal.code}] {exc.refusal.message}")
        worker.terminate()
        return 2
    print(f"{report.summary()}\n  {report.note}")
    outputs, timing = worker.run(example_inputs(report.inputs))
    print(f"  {', '.join(f'{k} {list(v.shape)}' for k, v in outputs.items())}; {timing.to_dict()}")
    print(f"  drained: {worker.terminate()}")
    return 0


def main() -> int:
    """Parse the flags and run one sequence."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="gpu_integrated,npu", help="the device kinds in scope")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--backend", action="store_true", help="the graph backend's ExternalWorker")
    parser.add_argument("--route", default="ort-openvino", help="the backend's route")
    args = parser.parse_args()
    graph = str(builtin_artifact("vision-tower-tiny"))
    if args.backend:
        return backend(graph, args.route)
    return external(graph, tuple(k for k in args.kinds.split(",") if k), args.runs)


if __name__ == "__main__":
    sys.exit(main())
