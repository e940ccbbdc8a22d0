"""The plugin OpenVINO EP's session creation, cold and warm compile cache, per session option.

Where ``benchmarks/compile_cache.py`` times xstage's opens, this times onnxruntime's session
creation alone, in a fresh process per sample, with the plugin EP (``onnxruntime_ep_openvino``)
bound as xstage's route binds it (``load_config``'s CPU section: the f32 precision hint, and
``CACHE_DIR`` for the cached kinds), with the session options in turn: ``plain`` (none),
``prof+assign+bytes`` (what xstage's profiled warm-up adds: ``enable_profiling``,
``session.record_ep_graph_assignment_info``, the model handed over as bytes with its node names
checked or renamed by ``xstage_remote.onnx_names``), ``+nospin``
(``session.intra_op.allow_spinning=0``, the route's default: ``prof+assign+bytes+nospin`` is what
the worker does), ``+intra1`` (``intra_op_num_threads=1``) and ``+noopt`` (onnxruntime's graph
optimizations off). Each sample's process CPU time is printed beside its wall time: a pool that
spins shows there. Kinds: ``off`` (no cache),
``cold`` (an empty cache folder), ``warm`` and ``warm2`` (the folder the cold one wrote). Medians
of wall and process CPU time, onnxruntime's own session events where profiled, and warm/cold.

Needs the plugin EP (an Intel CPU: it lists no device elsewhere). Run from the repository root:
``python benchmarks/plugin_session_options.py [PPOCR.onnx] [--repeats 5]``. Not a test.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, "src")
from xstage.builtin_graphs import builtin_artifact  # noqa: E402

RAW = r'''
import sys, time, json, os
import onnxruntime as ort
import onnxruntime_ep_openvino as e
g, cache, variant, prof = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, "src")
ort.register_execution_provider_library("OpenVINOExecutionProvider", e.get_library_path())
devs = [d for d in ort.get_ep_devices()
        if d.ep_name == "OpenVINOExecutionProvider" and d.device.type == ort.OrtHardwareDeviceType.CPU]
so = ort.SessionOptions()
so.log_severity_level = 3
sect = {"INFERENCE_PRECISION_HINT": "f32"}
if cache != "-":
    sect["CACHE_DIR"] = cache
so.add_provider_for_devices(devs[:1], {"load_config": json.dumps({"CPU": sect})})
model = g
if "prof" in variant:
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(prof, "p")
if "assign" in variant:
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
if "bytes" in variant:
    from xstage_remote import onnx_names
    model, names, leftover = onnx_names.prepare(g, True)
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", os.path.dirname(g))
if "noopt" in variant:
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
if "nospin" in variant:
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
if "intra1" in variant:
    so.intra_op_num_threads = 1
t1 = time.perf_counter()
c0 = time.process_time()
s = ort.InferenceSession(model, so)
t2 = time.perf_counter()
c1 = time.process_time()
out = {"session_ms": (t2 - t1) * 1e3, "cpu_ms": (c1 - c0) * 1e3, "providers": s.get_providers()[:1]}
if "prof" in variant:
    f = s.end_profiling()
    ev = json.load(open(f))
    out["events"] = {x["name"]: x["dur"] / 1e3 for x in ev if x.get("cat") == "Session"}
print(json.dumps(out))
'''
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("ppocr", nargs="?", help="a third-party graph (the PP-OCRv4 detector)")
ap.add_argument("--repeats", type=int, default=5)
args = ap.parse_args()
graphs = {"tower": str(builtin_artifact("vision-tower-tiny"))}
if args.ppocr:
    graphs["det"] = args.ppocr
RAW_PATH = os.path.join(tempfile.mkdtemp(), "session.py")
with open(RAW_PATH, "w") as f:
    f.write(RAW)
variants = ["plain", "plain+nospin", "plain+intra1", "prof+assign+bytes", "prof+assign+bytes+nospin",
            "plain+noopt+nospin"]
res = {}
prof = tempfile.mkdtemp()
for _ in range(args.repeats):
    for gname, g in graphs.items():
        for v in variants:
            d = tempfile.mkdtemp()
            for kind in ("off", "cold", "warm", "warm2"):
                out = subprocess.run([sys.executable, RAW_PATH, g, "-" if kind == "off" else d, v, prof],
                                     capture_output=True, text=True, timeout=120)
                try:
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                except Exception:
                    print("FAIL", gname, v, kind, out.stdout[-300:], out.stderr[-600:])
                    continue
                res.setdefault((gname, v, kind), []).append(r)
            shutil.rmtree(d, ignore_errors=True)
for (gname, v, kind), rs in sorted(res.items()):
    med = statistics.median(r["session_ms"] for r in rs)
    cpu = statistics.median(r["cpu_ms"] for r in rs)
    ev = {}
    for r in rs:
        for k, x in (r.get("events") or {}).items():
            ev.setdefault(k, []).append(x)
    evs = {k: round(statistics.median(x), 1) for k, x in ev.items()}
    print(f"{gname:5} {v:22} {kind:5} session {med:7.1f} ms cpu {cpu:7.1f} ms  {evs}")
for gname in graphs:
    for v in variants:
        try:
            c = statistics.median(r["session_ms"] for r in res[(gname, v, "cold")])
            w = statistics.median(r["session_ms"] for r in res[(gname, v, "warm")])
            w2 = statistics.median(r["session_ms"] for r in res[(gname, v, "warm2")])
            print(f"RATIO {gname} {v}: warm/cold {w/c:.2f} warm2/cold {w2/c:.2f}")
        except KeyError:
            pass
