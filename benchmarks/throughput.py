"""Throughput at depth K: xstage's stage against the same runtime's session driven by K threads.

For each graph and route, in one run, interleaved in rounds so machine noise lands on every arm:

* ``xstage d1``: ``Stage.measure_throughput(depth=1)`` — one request in flight (what
  ``xstage external --throughput --depth 1`` reports);
* ``xstage dK``: the same at depth K (the region's K slot sets; ``--throughput --depth K``);
* ``in-proc K threads``: the runtime's own session, in the interpreter the stage's worker ran
  (the same onnxruntime or torch build), built with the options the route gives it (ort-cpu: the
  CPU EP; ort-openvino: ``device_type=CPU`` and the f32 precision hint; torch: the program moved
  to the device), called by K threads over the same inputs until N requests are done. ONNX:
  each thread runs its own I/O binding over preallocated outputs (the worker's slot sets do the
  same; ``sess.run`` would allocate every output every call); torch: numpy in, numpy out.
* ``in-proc 1 thread``: the same session, one thread (context for the K-thread figure).

The in-process helper runs in a session of its own, as xstage's worker does: on a Linux host
that schedules by autogroup, a process's CPU share depends on its session (measured here under
load: the same session at 13-48 calls/s in this script's session, 48-60 in its own).

The ratio printed is ``xstage dK / in-proc K threads``, per round, then its median. The runtime's
own benchmark tool (OpenVINO's ``benchmark_app``) is run where the worker's interpreter has it.

Graphs: ``mlp`` (the built-in ``mlp-512x6-b64``, ≥ 1 ms of compute on a CPU) and ``ppocr`` (the
PP-OCRv4 detector at 1x3x320x320, from ``--ppocr PATH`` where it exists). ``--route torch-cuda``
(or ``torch-cpu``) runs a ``.pt2`` exported from the same MLP (its weights read from the ONNX
graph) with ``--torch-python`` (default: ``XSTAGE_PYTHON_TORCH_CUDA``/``_CPU``).

``--session-config KEY=VALUE`` gives both arms' onnxruntime sessions the same config entries
(``session.intra_op.allow_spinning=0``: docs/throughput.md, "Session config"); with
``--and-default`` each graph also runs without them, in the same run. The in-process arm takes
the entries the worker's session holds (``worker.runtime.session_config``), a route's own
defaults included, so both arms run the same session.

Run: ``PYTHONPATH=src python benchmarks/throughput.py [--route ort-cpu --route ort-openvino]
[--graph mlp --graph ppocr] [--depth 4] [--requests 200] [--repeats 5]
[--session-config KEY=VALUE [--and-default]] [--concurrency C] [--busy N] [--json OUT.json]``.
``--concurrency C`` opens the stage with C concurrent runs (1..K) at depth K; the in-process arm
keeps K threads. ``--busy N`` runs N busy-looping neighbours (``benchmarks/_busy.py``) through
the whole run, so every arm of every round is measured beside them alike.
Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from xstage import builtin_graphs, open_stage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _busy import Neighbours  # noqa: E402

PPOCR_DEFAULT = "/work/main/.devtree/graphs/ch_PP-OCRv4_det_infer.onnx"

# Runs in the worker's interpreter (Python >= 3.9, numpy and the runtime only): reads one JSON
# line per command from stdin ({"threads": K, "requests": N}), answers one JSON line.
_HELPER = r'''
import json, sys, threading, time
import numpy as np
cfg = json.loads(sys.argv[1])
with np.load(cfg["inputs"], allow_pickle=False) as z:
    feeds = {k: z[k] for k in z.files}
if cfg["kind"] == "onnx":
    import onnxruntime as ort
    providers = [(cfg["ep"], cfg["ep_options"])]
    so = ort.SessionOptions()
    for key, value in cfg.get("config", {}).items():  # the stage's --session-config, the same
        so.add_session_config_entry(key, value)
    sess = ort.InferenceSession(cfg["graph"], so, providers=providers)
    sample = sess.run(None, feeds)
    local = threading.local()
    def call():
        # Each thread its own I/O binding over preallocated outputs, as the worker's slot sets
        # have: no allocation per call (sess.run allocates every output every call).
        binding = getattr(local, "binding", None)
        if binding is None:
            binding, keep = sess.io_binding(), []
            for name, arr in feeds.items():
                binding.bind_cpu_input(name, arr)
            for o, v in zip(sess.get_outputs(), sample):
                keep.append(np.empty_like(v))
                binding.bind_output(o.name, "cpu", 0, keep[-1].dtype, list(keep[-1].shape),
                                    keep[-1].__array_interface__["data"][0])
            local.binding, local.keep = binding, keep
        sess.run_with_iobinding(binding)
    version = "onnxruntime " + ort.__version__
else:
    import torch
    dev = torch.device(cfg["device"])
    program = torch.export.load(cfg["graph"])
    try:
        from torch.export.passes import move_to_device_pass
        program = move_to_device_pass(program, dev)
    except ImportError:
        pass
    module = program.module()
    names = cfg["names"]
    def call():
        with torch.inference_mode():
            out = module(*[torch.from_numpy(feeds[n]).to(dev) for n in names])
        out = out if isinstance(out, (list, tuple)) else [out]
        return [o.cpu().numpy() for o in out]
    version = "torch " + torch.__version__
for _ in range(5):
    call()
print(json.dumps({"ready": version}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    left = [cmd["requests"]]
    lock = threading.Lock()
    def worker():
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            call()
    threads = [threading.Thread(target=worker) for _ in range(cmd["threads"])]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    print(json.dumps({"requests_per_s": cmd["requests"] / wall}), flush=True)
'''

_EXPORT = r'''
import sys, numpy as np, torch
w = np.load(sys.argv[1], allow_pickle=False)
depth = len([k for k in w.files if k.startswith("w")])
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        P = torch.nn.Parameter
        self.w = torch.nn.ParameterList([P(torch.from_numpy(w["w%d" % i])) for i in range(depth)])
        self.b = torch.nn.ParameterList([P(torch.from_numpy(w["b%d" % i])) for i in range(depth)])
    def forward(self, x):
        for wi, bi in zip(self.w, self.b):
            x = torch.relu(x @ wi + bi)
        return torch.tanh(x)
x = torch.from_numpy(np.zeros(tuple(int(d) for d in sys.argv[3].split("x")), np.float32))
torch.export.save(torch.export.export(MLP().eval(), (x,), strict=False), sys.argv[2])
'''


def _ep(route: str) -> tuple[str, dict[str, str]]:
    if route == "ort-openvino":
        return "OpenVINOExecutionProvider", {
            "device_type": "CPU", "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}})}
    if route == "ort-cpu":
        return "CPUExecutionProvider", {}
    raise SystemExit(f"no in-process arm for route {route}")


def mlp_pt2(onnx_path: Path, folder: Path, python: str) -> Path:
    """The built-in MLP as a ``.pt2`` (same weights), with its manifest."""
    from xstage.manifest import write_manifest

    model = onnx.load(str(onnx_path))
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    npz = folder / "mlp-weights.npz"
    np.savez(npz, **weights)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    path = folder / "mlp-512x6-b64.pt2"
    subprocess.run([python, "-c", _EXPORT, str(npz), str(path), "x".join(map(str, shape))],
                   check=True, timeout=600)
    write_manifest(path, component="mlp-512x6-b64", fmt="pt:fp32", files=[path],
                   source={"kind": "benchmark", "what": "the built-in MLP's weights"},
                   exporter={"script": "benchmarks/throughput.py"},
                   inputs=[{"name": "x", "dtype": "float32", "shape": shape}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": shape}])
    return path


class InProc:
    """The helper process: one session (or program) in the worker's interpreter."""

    def __init__(self, python: str, cfg: dict) -> None:
        # A session of its own, as xstage starts its worker: where the kernel schedules by
        # autogroup (Linux, sched_autogroup_enabled=1) CPU time is shared between sessions
        # first, and a helper in this script's session would get another share than the worker.
        self.proc = subprocess.Popen([python, "-c", _HELPER, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.version = self._read()["ready"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the in-process helper ended early")
        return json.loads(line)

    def rps(self, threads: int, requests: int) -> float:
        self.proc.stdin.write(json.dumps({"threads": threads, "requests": requests}) + "\n")
        self.proc.stdin.flush()
        return self._read()["requests_per_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _benchmark_app(python: str, graph: Path, k: int, seconds: int = 10) -> float | None:
    """OpenVINO's own tool at ``-nireq k -hint throughput``, where the interpreter has it."""
    tool = shutil.which("benchmark_app", path=str(Path(python).parent))
    if tool is None:
        return None
    proc = subprocess.run([tool, "-m", str(graph), "-d", "CPU", "-hint", "throughput", "-nireq", str(k),
                           "-t", str(seconds)], capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if "Throughput:" in line:
            return float(line.split(":")[1].split()[0])
    return None


def bench(graph: Path, route: str, *, k: int, requests: int, repeats: int, shapes: dict | None,
          torch_python: str | None, say, config: dict[str, str] | None = None,
          concurrency: int | None = None) -> dict:
    torch_route = route.startswith("torch-")
    with open_stage(graph, route=route, depth=k, concurrency=concurrency or k, shapes=shapes,
                    session_config=config or None) as stage:
        rec = stage.record()
        python = rec["worker"]["interpreter"]
        # What the worker's session holds: the --session-config entries and the route's own
        # defaults (ort-openvino's spinning off), so both arms run the same session.
        held = {k: v for k, v in (rec["worker"]["runtime"].get("session_config") or {}).items()
                if v is not None}
        feeds = {n: np.ascontiguousarray(v) for n, v in stage.inputs.items()}
        tmp = Path(tempfile.mkdtemp(prefix="xstage-throughput-"))
        np.savez(tmp / "inputs.npz", **feeds)
        if torch_route:
            cfg = {"kind": "torch", "graph": str(graph), "names": list(feeds),
                   "inputs": str(tmp / "inputs.npz"), "device": "cuda:0" if route == "torch-cuda" else "cpu"}
        else:
            ep, options = _ep(route)
            cfg = {"kind": "onnx", "graph": str(graph), "ep": ep, "ep_options": options,
                   "inputs": str(tmp / "inputs.npz"), "config": held}
        helper = InProc(python, cfg)
        stage.measure(runs=20, warmup=5)
        compute_ms = stage.timings["compute"]["p50_ms"]
        rounds = []
        def xstage_at(depth: int) -> float:
            return stage.measure_throughput(feeds, depth=depth, requests=requests)["requests_per_s"]

        arms = {"xstage_d1": lambda: xstage_at(1), "xstage_dk": lambda: xstage_at(k),
                "inproc_k": lambda: helper.rps(k, requests), "inproc_1": lambda: helper.rps(1, requests)}
        try:
            for r in range(repeats):
                order = list(arms) if r % 2 == 0 else list(reversed(arms))  # drift lands on every arm
                row = {name: arms[name]() for name in order}
                row = {name: row[name] for name in arms}
                row["ratio"] = row["xstage_dk"] / row["inproc_k"]
                rounds.append(row)
                say(f"  round {r + 1}: " + " ".join(
                    f"{key}={v:.1f}" if key != "ratio" else f"ratio={v:.3f}" for key, v in row.items()))
        finally:
            helper.close()
            shutil.rmtree(tmp, ignore_errors=True)
        tool = None if torch_route or route != "ort-openvino" else _benchmark_app(python, graph, k)
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"graph": graph.name, "route": route, "session_config": held,
            "concurrency": concurrency or k,
            "depth": k, "requests": requests, "repeats": repeats,
            "compute_p50_ms": compute_ms, "runtime": helper.version, "median": med,
            "ratio_min": min(r["ratio"] for r in rounds), "ratio_max": max(r["ratio"] for r in rounds),
            "rounds": rounds, "benchmark_app_fps": tool, "cpu_count": os.cpu_count(),
            "loadavg": os.getloadavg()}


def table(results: list[dict]) -> str:
    head = ("| graph | route | session config | compute p50 | xstage d1 | xstage dK | in-proc K threads "
            "| in-proc 1 thread | dK / in-proc K (median, range) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in results:
        m = r["median"]
        config = ", ".join(f"{k}={v}" for k, v in r["session_config"].items()) or "—"
        runs = f" ({r['concurrency']} runs at once)" if r["concurrency"] != r["depth"] else ""
        lines.append(f"| {r['graph']} | {r['route']}{runs} | {config} | {r['compute_p50_ms']:.2f} ms "
                     f"| {m['xstage_d1']:.1f}/s | {m['xstage_dk']:.1f}/s | {m['inproc_k']:.1f}/s "
                     f"| {m['inproc_1']:.1f}/s "
                     f"| **{m['ratio']:.3f}×** ({r['ratio_min']:.3f}–{r['ratio_max']:.3f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--route", action="append", help="ort-cpu, ort-openvino, torch-cuda, torch-cpu "
                    "(repeatable; default ort-cpu and ort-openvino)")
    ap.add_argument("--graph", action="append", help="mlp, ppocr or a .onnx path (default mlp and ppocr)")
    ap.add_argument("--ppocr", default=PPOCR_DEFAULT, help="the PP-OCRv4 detector (skipped where absent)")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--concurrency", type=int, help="the worker's concurrent runs (default: the depth)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-python", help="the interpreter that exports the MLP's .pt2 (torch routes)")
    ap.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                    help="an onnxruntime session config entry for both arms' sessions (repeatable)")
    ap.add_argument("--and-default", action="store_true",
                    help="with --session-config: each graph also without it, in the same run")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N busy-looping neighbours running through every round of every arm")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    routes = args.route or ["ort-cpu", "ort-openvino"]
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix="xstage-throughput-graphs-"))
    mlp = builtin_graphs.write(builtin_graphs.mlp(width=512, depth=6, batch=64), work / "mlp-512x6-b64.onnx")
    results = []
    with Neighbours(args.busy) as neighbours:
        neighbours.busy()  # every arm measured beside them alike (none with --busy 0)
        _run_routes(args, routes, mlp, work, say, results)
    print(table(results))
    for r in results:
        if r["benchmark_app_fps"] is not None:
            print(f"benchmark_app -hint throughput -nireq {r['depth']} on {r['graph']}: "
                  f"{r['benchmark_app_fps']} FPS")
    print(f"host: {os.cpu_count()} CPUs, {args.busy} busy neighbours, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "busy": args.busy}, indent=2,
                                              default=str) + "\n")
    return 0


def _run_routes(args, routes, mlp, work, say, results) -> None:  # type: ignore[no-untyped-def]
    for route in routes:
        if route.startswith("torch-"):
            python = args.torch_python or os.environ.get(f"XSTAGE_PYTHON_{route.upper().replace('-', '_')}") \
                or sys.executable
            graphs = [(mlp_pt2(mlp, work, python), None)]
        else:
            graphs = []
            for name in args.graph or ["mlp", "ppocr"]:
                if name == "mlp":
                    graphs.append((mlp, None))
                elif name == "ppocr":
                    if Path(args.ppocr).is_file():
                        graphs.append((Path(shutil.copy(args.ppocr, work / "ppocr-det.onnx")),
                                       {"x": (1, 3, 320, 320)}))
                    else:
                        say(f"skipping ppocr: {args.ppocr} is absent")
                else:
                    graphs.append((Path(name), None))
        configs = [dict(item.split("=", 1) for item in args.session_config)]
        if args.and_default and configs[0]:
            configs.insert(0, {})
        for graph, shapes in graphs:
            for config in configs if not route.startswith("torch-") else [{}]:
                say(f"{graph.name} on {route} {config or ''}, depth {args.depth}, "
                    f"{args.requests} requests x {args.repeats}")
                results.append(bench(graph, route, k=args.depth, requests=args.requests,
                                     repeats=args.repeats, shapes=shapes,
                                     torch_python=args.torch_python, say=say, config=config,
                                     concurrency=args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
