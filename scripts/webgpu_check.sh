#!/usr/bin/env bash
# ort-plugin:webgpu on a lent NVIDIA GPU host, in one call: set-up, the records, the live tests.
#
# Carried from the repository root (ignored folders): .gl/ (Debian's libvulkan1 libegl1 libglvnd0
# libopengl0 libgl1 libglx0 libgles2: without the GL ones the NVIDIA Vulkan ICD does not load),
# .whl/ (onnxruntime_ep_webgpu 0.4.0 and what xstage needs that the image lacks: platformdirs),
# and GRAPHS (a folder with a PP-OCR det graph). Usage there: scripts/webgpu_check.sh GRAPHS OUT
# Each step runs under its own timeout and stamps OUT/steps.txt, so a call cut short still says
# how far it got; the records come first, the test files last.
set -u
graphs=$1
out=$2
mkdir -p "$out/cases"
step() { echo "$(date +%T) $*" >> "$out/steps.txt"; }
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src XSTAGE_HOME=/tmp/xstage-webgpu PYTHONUNBUFFERED=1 COLUMNS=150
x() { name=$1; limit=$2; shift 2; step "$name"; timeout "$limit" python3 -m xstage "$@" > "$out/$name.txt" 2>&1; echo "$name rc=$?" >> "$out/rc.txt"; }
nvidia-smi --query-gpu=name,pci.bus_id,pci.device_id,driver_version --format=csv > "$out/gpu.txt"
python3 -c 'import onnxruntime, onnxruntime_ep_webgpu as w; print("onnxruntime", onnxruntime.__version__, "webgpu", w.__file__)' >> "$out/gpu.txt"
x devices 90 devices
x tower-webgpu 120 external --builtin vision-tower-tiny --route ort-plugin:webgpu --runs 50 --json "$out/tower-webgpu.json"
x ppocr-det-webgpu 120 external --graph "$graphs/ch_PP-OCRv4_det_infer.onnx" --shape x=1x3x320x320 \
    --route ort-plugin:webgpu --runs 20 --json "$out/ppocr-det-webgpu.json"
# The declined case and the bisect, from the same graphs the live tests build.
python3 - "$out/cases" <<'PY'
import sys
sys.path.insert(0, "tests/gpu")
from pathlib import Path
from xstage import builtin_graphs
import test_webgpu as t
out = Path(sys.argv[1])
builtin_graphs.write(t._mlp(), out / "mlp.onnx")
builtin_graphs.write(t._mlp("Hardmax"), out / "mlp_hardmax.onnx")
builtin_graphs.write(t._chain(), out / "chain.onnx")
PY
x mlp-webgpu 90 external --graph "$out/cases/mlp.onnx" --route ort-plugin:webgpu --runs 20 --json "$out/mlp-webgpu.json"
x declined-webgpu 90 external --graph "$out/cases/mlp_hardmax.onnx" --min-placement 1 --route ort-plugin:webgpu \
    --runs 5 --json "$out/declined-webgpu.json"
x bisect-webgpu 150 bisect --graph "$out/cases/chain.onnx" --route ort-plugin:webgpu --json "$out/bisect-webgpu.json"
step compare
timeout 180 python3 scripts/webgpu_compare.py "$out/compare" > /dev/null 2>&1; echo "compare rc=$?" >> "$out/rc.txt"
step nvml
timeout 60 python3 - "$out/nvml-webgpu.json" <<'PY'
import json, sys
import numpy as np, onnxruntime as ort, onnxruntime_ep_webgpu as w
from xstage import builtin_graphs
from xstage_remote import nvml
ort.register_execution_provider_library("webgpu", w.get_library_path())
so = ort.SessionOptions()
so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == w.get_ep_name()], {})
s = ort.InferenceSession(str(builtin_graphs.builtin_stage()), sess_options=so)
s.run(None, {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32) for i in s.get_inputs()})
json.dump(nvml.read(), open(sys.argv[1], "w"), indent=1)
PY
step capture
timeout 90 python3 tests/fixtures/profiles/capture.py --device --only webgpu130_vision --out "$out/capture" > "$out/capture.txt" 2>&1
step pytest
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_webgpu.py tests/evidence tests/stage/test_ort_gpu_memory.py > "$out/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$out/rc.txt"
step done
