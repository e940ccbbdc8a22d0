"""Record what NVML says about GPU processes on an NVIDIA machine (the lent H200), for the tests.

One command, from the repository root, with a CUDA torch and xstage's dependencies importable
(on the H200: the carried ``device-py/site``), everything written under ``$OUT``::

    OUT=/tmp/nvml-out PYTHONPATH=$PWD/src:$PWD/.test-cache/device-py/site XSTAGE_HOME=/tmp/xs-nvml \\
        python3 scripts/nvml_record.py

It writes ``$OUT/nvml/``:

* ``idle.json``: ``xstage_remote.nvml.read()`` in a process that has not touched CUDA (it must
  not be listed);
* ``context.json``, ``alloc-2gib.json``: the same read in a child process after CUDA's
  context and one matmul, then after 2 GiB more of tensors, each with nvidia-smi's
  ``--query-compute-apps`` line and torch's own counters beside it (``cross_check``);
* ``torch-cuda-record.json`` and ``.txt``: ``xstage external --route torch-cuda`` on a small
  exported program, whose worker now reads its device memory through the same NVML reader
  (the ledger's ``measured_peak_bytes`` is NVML's figure for the worker).

Copy ``context.json`` and ``alloc-2gib.json`` to ``tests/fixtures/h200/nvml/`` (the tests of
the ORT GPU routes' admission replay them) and list them in ``tests/fixtures/README.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(os.environ["OUT"]) / "nvml"

_CHILD = r'''
import json, os, subprocess, sys
import torch
from xstage_remote import nvml

def snap(tag):
    raw = nvml.read()
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    raw["cross_check"] = {"tag": tag, "nvidia_smi_compute_apps": smi.strip().splitlines(),
                          "torch_reserved": int(torch.cuda.memory_reserved()),
                          "torch_allocated": int(torch.cuda.memory_allocated()),
                          "torch": torch.__version__, "report": nvml.report(raw)}
    with open(os.path.join(sys.argv[1], tag + ".json"), "w") as f:
        json.dump(raw, f, indent=2)
    print(tag, json.dumps(raw["cross_check"]["report"])[:400], raw["cross_check"]["nvidia_smi_compute_apps"])

x = torch.randn(1024, 1024, device="cuda")
(x @ x).sum().item()
torch.cuda.synchronize()
snap("context")
hold = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
hold.fill_(1)
torch.cuda.synchronize()
snap("alloc-2gib")
'''


def _program(root: Path) -> Path:
    import torch

    from xstage.manifest import write_manifest

    class MLP(torch.nn.Module):  # forward(x): the program's input is named as the manifest says
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                            torch.nn.Linear(1024, 512))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    torch.manual_seed(0)
    module = MLP()
    x = torch.randn(64, 512)
    path = root / "mlp.pt2"
    torch.export.save(torch.export.export(module, (x,), strict=False), str(path))
    write_manifest(path, component="mlp", fmt="pt:fp32", files=[path],
                   source={"kind": "script", "what": "Linear 512-1024, GELU, Linear 1024-512"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [64, 512]}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": [64, 512]}])
    return path


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    from xstage_remote import nvml

    idle = nvml.read()
    (OUT / "idle.json").write_text(json.dumps(idle, indent=2))
    print("idle", json.dumps(nvml.report(idle))[:400], flush=True)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(OUT)], capture_output=True, text=True)
    print(done.stdout, done.stderr[-3000:], "exit", done.returncode, flush=True)
    graph = _program(OUT)
    rec = OUT / "torch-cuda-record.json"
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(graph), "--route",
                           "torch-cuda", "--runs", "5", "--json", str(rec)], capture_output=True,
                          text=True, env=dict(os.environ, COLUMNS="120"))
    (OUT / "torch-cuda-record.txt").write_text(done.stdout + done.stderr)
    print(done.stdout[-4000:], done.stderr[-2000:], "exit", done.returncode, flush=True)
    if rec.exists():
        ledger = json.loads(rec.read_text()).get("ledger") or {}
        print("ledger: pool", (ledger.get("pool") or {}).get("name"), "measured_peak_bytes",
              ledger.get("measured_peak_bytes"), "budget/measured", ledger.get("budget_over_measured"),
              "verdict", ledger.get("verdict"), flush=True)


if __name__ == "__main__":
    main()
