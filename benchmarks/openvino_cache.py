"""Where an ort-openvino open's compile goes, and whether OpenVINO's own cache is read back.

``benchmarks/compile_cache.py`` times whole xstage opens; this one takes the compile apart, each
measurement in a fresh process, ``--repeats`` times interleaved, medians (wall and the process's
CPU time: the machine is shared, CPU time is the steadier of the two):

* ``ov``: the OpenVINO inside the route's env (onnxruntime-openvino ships its libraries beside
  onnxruntime's; driven here through its C API with ctypes, nothing imported from onnxruntime):
  the readers it has (``read_model`` of an IR file), its start-up (library, core, CPU plugin;
  with ``pip`` below the start-up includes ``import openvino``),
  and ``compile_model`` from the graph file without a cache, with a fresh ``CACHE_DIR`` (cold)
  and with that folder again (warm), with ``LOADED_FROM_CACHE`` as OpenVINO reports it;
* ``ort``: onnxruntime with the OpenVINO EP in the same env: the EP's start-up (a one-Add session
  first), then the graph's session creation with the CPU EP alone (onnxruntime's own graph work),
  with the OpenVINO EP without ``cache_dir``, cold and warm, and whether the warm session
  rewrote the cache's blob (it compiled again) or left it (it read it);
* ``pip`` (with ``--openvino-python``, an interpreter with the ``openvino`` package of the same
  version): the same ``compile_model`` cold and warm, for what a build that reads its cache saves.

Run: ``python benchmarks/openvino_cache.py --python ENV/bin/python [--graph PATH]…
[--openvino-python PY] [--repeats 5] [--json OUT]``; the graphs default to the built-in vision
tower (``src/xstage/builtins/vision-tower-tiny.onnx``) and the PP-OCRv4 detector when it exists
(compiled with its dynamic dimensions, as the EP does). Not a test: nothing asserts.
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

HERE = Path(__file__).resolve().parent
GRAPHS = [HERE.parent / "src/xstage/builtins/vision-tower-tiny.onnx",
          Path("/work/main/.devtree/graphs/ch_PP-OCRv4_det_infer.onnx")]

_CLOCK = r'''
import json, sys, time
out = {}
_t = [time.perf_counter(), time.process_time()]
def mark(name):
    t, c = time.perf_counter(), time.process_time()
    out[name] = (t - _t[0]) * 1e3
    out[name + "_cpu"] = (c - _t[1]) * 1e3
    _t[:] = [t, c]
'''

OV_CHILD = _CLOCK + r'''
import ctypes as C, importlib.util, os
graph, cache, ir = sys.argv[1:4]
capi = os.path.join(importlib.util.find_spec("onnxruntime").submodule_search_locations[0], "capi")
mark("find")
ov = C.CDLL(os.path.join(capi, "libopenvino_c.so"))
ov.ov_get_last_err_msg.restype = C.c_char_p
core = C.c_void_p()
if ov.ov_core_create(C.byref(core)):
    raise SystemExit("ov_core_create failed")
name = C.c_char_p()
if ov.ov_core_get_property(core, b"CPU", b"FULL_DEVICE_NAME", C.byref(name)):
    raise SystemExit("the CPU plugin did not load: %s" % ov.ov_get_last_err_msg())
mark("start")
if ir != "-":
    model = C.c_void_p()
    rc = ov.ov_core_read_model(core, ir.encode(), None, C.byref(model))
    out["reads_ir"] = rc == 0
    if rc:
        msg = (ov.ov_get_last_err_msg() or b"").decode("utf-8", "replace")
        tail = msg.strip().splitlines()[-1] if msg.strip() else "rc %d" % rc
        out["ir_error"] = tail[tail.find("Available frontends"):] if "Available frontends" in tail else tail
    mark("read_ir")
props = [b"CACHE_DIR", cache.encode()] if cache != "-" else []
compiled = C.c_void_p()
rc = ov.ov_core_compile_model_from_file(core, graph.encode(), b"CPU", C.c_size_t(len(props)),
                                        C.byref(compiled), *[C.c_char_p(p) for p in props])
if rc:
    raise SystemExit("compile_model failed: %s" % ov.ov_get_last_err_msg())
mark("compile")
value = C.c_char_p()
if ov.ov_compiled_model_get_property(compiled, b"LOADED_FROM_CACHE", C.byref(value)) == 0:
    out["loaded_from_cache"] = {"YES": "True", "NO": "False"}.get(value.value.decode(), value.value.decode())
print(json.dumps(out))
'''

PIP_CHILD = _CLOCK + r'''
import openvino as ov
graph, cache = sys.argv[1:3]
core = ov.Core()
core.get_property("CPU", "FULL_DEVICE_NAME")
mark("start")
compiled = core.compile_model(graph, "CPU", {"CACHE_DIR": cache} if cache != "-" else {})
mark("compile")
out["loaded_from_cache"] = str(compiled.get_property("LOADED_FROM_CACHE"))
print(json.dumps(out))
'''

ORT_CHILD = _CLOCK + r'''
import glob, os
import onnxruntime as ort
graph, cache, trivial, ep = sys.argv[1:5]
mark("import")
so = ort.SessionOptions()
so.log_severity_level = 3
ov_ep = ("OpenVINOExecutionProvider", {"device_type": "CPU"})
ort.InferenceSession(trivial, so, providers=[ov_ep])
mark("ep_start")
before = {p: os.stat(p) for p in glob.glob(os.path.join(cache, "*"))} if cache != "-" else {}
options = {"device_type": "CPU", "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}})}
if cache != "-":
    options["cache_dir"] = cache
providers = ["CPUExecutionProvider"] if ep == "cpu" else [("OpenVINOExecutionProvider", options),
                                                        "CPUExecutionProvider"]
ort.InferenceSession(graph, so, providers=providers)
mark("session")
if before:
    now = {p: os.stat(p) for p in glob.glob(os.path.join(cache, "*"))}
    out["rewrote"] = any(p not in now or (now[p].st_ino, now[p].st_mtime_ns) != (s.st_ino, s.st_mtime_ns)
                         for p, s in before.items())
print(json.dumps(out))
'''


def child(python: str, code: str, *args: str) -> dict:
    proc = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"{python}: {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_add(path: Path) -> str:
    """Serialize the one-Add model by hand (field numbers of onnx.proto3; no onnx package in the env)."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    def field(num: int, payload: bytes) -> bytes:
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    def value_info(name: str) -> bytes:
        dims = field(1, varint(1 << 3) + varint(1)) + field(1, varint(1 << 3) + varint(4))
        tensor = varint(1 << 3) + varint(1) + field(2, dims)  # elem_type FLOAT, shape
        return field(1, name.encode()) + field(2, field(1, tensor))

    node = field(1, b"a") + field(1, b"a") + field(2, b"b") + field(3, b"add") + field(4, b"Add")
    graph = field(1, node) + field(2, b"g") + field(11, value_info("a")) + field(12, value_info("b"))
    model = varint(1 << 3) + varint(8) + field(7, graph) + field(8, varint(2 << 3) + varint(17))
    path.write_bytes(model)
    return str(path)


def medians(rows: list[dict]) -> dict:
    keys = [k for k, v in rows[0].items() if isinstance(v, float)]
    out: dict = {k: round(statistics.median(r[k] for r in rows), 1) for k in keys}
    for k, v in rows[0].items():
        if not isinstance(v, float):
            out[k] = sorted({str(r.get(k)) for r in rows})
    return out


def bench(args: argparse.Namespace, graph: Path, work: Path, say) -> dict:
    rows: dict[str, list[dict]] = {}
    ir = str(work / "probe.xml")
    trivial = str(work / "add.onnx")

    def add(name: str, row: dict) -> None:
        rows.setdefault(name, []).append(row)
        say(f"  {graph.name} {name}: {row}")

    for _ in range(args.repeats):
        for kind, python, code in (("ov", args.python, OV_CHILD), ("pip", args.openvino_python, PIP_CHILD)):
            if python is None:
                continue
            cache = work / f"{kind}-cache"
            shutil.rmtree(cache, ignore_errors=True)
            extra = (ir,) if kind == "ov" else ()
            add(f"{kind} no cache", child(python, code, str(graph), "-", *extra))
            add(f"{kind} cold", child(python, code, str(graph), str(cache), *(("-",) if extra else ())))
            add(f"{kind} warm", child(python, code, str(graph), str(cache), *(("-",) if extra else ())))
        cache = work / "ort-cache"
        shutil.rmtree(cache, ignore_errors=True)
        add("ort CPU EP", child(args.python, ORT_CHILD, str(graph), "-", trivial, "cpu"))
        add("ort no cache", child(args.python, ORT_CHILD, str(graph), "-", trivial, "ov"))
        add("ort cold", child(args.python, ORT_CHILD, str(graph), str(cache), trivial, "ov"))
        add("ort warm", child(args.python, ORT_CHILD, str(graph), str(cache), trivial, "ov"))
    return {"graph": str(graph), "repeats": args.repeats, "median": {k: medians(v) for k, v in rows.items()},
            "rows": rows}


def table(results: list[dict]) -> str:
    lines = ["| graph | measurement | start-up ms (cpu) | compile / session ms (cpu) | note |",
             "|---|---|---|---|---|"]
    for r in results:
        for name, m in r["median"].items():
            start = m.get("start", m.get("ep_start"))
            main = m.get("compile", m.get("session"))
            main_cpu = m.get("compile_cpu", m.get("session_cpu"))
            start_cpu = m.get("start_cpu", m.get("ep_start_cpu"))
            notes = []
            if "loaded_from_cache" in m:
                notes.append("LOADED_FROM_CACHE " + "/".join(m["loaded_from_cache"]))
            if "rewrote" in m:
                notes.append("blob rewritten " + "/".join(m["rewrote"]))
            if "reads_ir" in m:
                notes.append("reads IR " + "/".join(m["reads_ir"])
                             + (f" ({'; '.join(m['ir_error'])})" if "ir_error" in m else ""))
            lines.append(f"| {Path(r['graph']).name} | {name} | {start:.0f} ({start_cpu:.0f}) "
                         f"| {main:.0f} ({main_cpu:.0f}) | {', '.join(notes)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=os.environ.get("XSTAGE_PYTHON_ORT_OPENVINO"),
                    help="the ort-openvino env's interpreter (default: $XSTAGE_PYTHON_ORT_OPENVINO)")
    ap.add_argument("--openvino-python", help="an interpreter with the openvino package (optional)")
    ap.add_argument("--graph", action="append", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not args.python:
        ap.error("--python (or XSTAGE_PYTHON_ORT_OPENVINO) names the ort-openvino env's interpreter")
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    graphs = args.graph or [g for g in GRAPHS if g.is_file()]
    work = Path(tempfile.mkdtemp(prefix="xstage-openvino-cache-"))
    try:
        _write_add(work / "add.onnx")
        # an IR file to probe the env's readers with: any IR will do, this one has no weights
        (work / "probe.xml").write_text(
            '<?xml version="1.0"?><net name="p" version="11"><layers>'
            '<layer id="0" name="x" type="Parameter" version="opset1"><data shape="1" element_type="f32"/>'
            '<output><port id="0" precision="FP32"><dim>1</dim></port></output></layer>'
            '<layer id="1" name="r" type="Result" version="opset1"><input><port id="0" precision="FP32">'
            '<dim>1</dim></port></input></layer></layers>'
            '<edges><edge from-layer="0" from-port="0" to-layer="1" to-port="0"/></edges></net>')
        results = [bench(args, g, work, say) for g in graphs]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
