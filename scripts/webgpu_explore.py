"""What the WebGPU plugin EP does on a GPU host, with onnxruntime alone (no xstage).

Run there with ``onnxruntime_ep_webgpu`` importable (``scripts/webgpu_check.sh`` says how to
carry it and the Vulkan loader): it prints the GPU (``nvidia-smi``), every EP device onnxruntime
lists with its metadata, and for a three-layer MLP alone and with one extra unary op: the
session's providers, the providers of the profile's kernel events, NVML's compute and graphics
process lists for this process, and the largest difference from the CPU EP. The output of one
run is ``docs/records/webgpu-h100/explore.txt``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import onnxruntime_ep_webgpu as webgpu
import pynvml
from onnx import TensorProto, helper, numpy_helper


def mlp(extra: str | None = None) -> bytes:
    """Three 256-wide MatMul+Relu layers, then ``extra`` (a unary op) if given, then Neg."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(3):
        weight = rng.standard_normal((256, 256)).astype(np.float32) * 0.05
        inits.append(numpy_helper.from_array(weight, f"W{i}"))
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    if extra:
        nodes.append(helper.make_node(extra, [x], ["e"], name="extra"))
        x = "e"
    nodes.append(helper.make_node("Neg", [x], ["y"], name="neg"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 256]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def main() -> None:
    print("ort", ort.__version__, "py", sys.version)
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,pci.bus_id,pci.device_id,memory.total",
                          "--format=csv"], capture_output=True, text=True).stdout)
    ort.register_execution_provider_library("webgpu", webgpu.get_library_path())
    for d in ort.get_ep_devices():
        dev = d.device
        print("EPDEV", d.ep_name, d.ep_vendor, dict(d.ep_metadata), dev.type, dev.vendor, dev.vendor_id,
              dev.device_id, dict(dev.metadata))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for extra in (None, "Hardmax", "Erf", "Softsign", "Celu"):
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = f"/tmp/prof_{extra}"
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        bound = [d for d in ort.get_ep_devices() if d.ep_name == webgpu.get_ep_name()]
        so.add_provider_for_devices(bound, {})
        session = ort.InferenceSession(mlp(extra), sess_options=so)
        print("providers", extra, session.get_providers())
        x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
        for _ in range(4):
            y = session.run(None, {"x": x})[0]
        with open(session.end_profiling()) as f:
            events = json.load(f)
        providers: dict[str, set[str]] = {}
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                providers.setdefault(e["args"].get("provider"), set()).add(e["name"])
        print("profile", extra, {k: sorted(v)[:8] for k, v in providers.items()})
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            procs = getattr(pynvml, fn)(handle)
            print(fn, [(p.pid, p.usedGpuMemory) for p in procs], "me", os.getpid())
        ref = ort.InferenceSession(mlp(extra), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        print("maxdiff vs cpu", float(np.abs(y - ref).max()))


if __name__ == "__main__":
    main()
