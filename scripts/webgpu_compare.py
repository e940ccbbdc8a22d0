"""One torch module as two stages: ONNX on ``ort-plugin:webgpu`` and ``.pt2`` on ``torch-cuda``.

Run on a GPU host where both routes resolve (``scripts/webgpu_check.sh``). It exports a small
conv + attention-like module twice from the same weights (``torch.onnx.export`` at opset 17,
``torch.export``), runs ``xstage external`` on each route, and writes both records and
``xstage compare``'s text under ``OUT`` (argv[1]).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from xstage.manifest import write_manifest


class Block(torch.nn.Module):
    """Conv stem, then a token MLP with a softmax mix: the ops a vision stage is made of."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 4, stride=4)
        self.q = torch.nn.Linear(64, 64)
        self.k = torch.nn.Linear(64, 64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.conv(x).flatten(2).transpose(1, 2)  # (1, 256, 64)
        a = torch.softmax(self.q(t) @ self.k(t).transpose(1, 2) / 8.0, dim=-1)
        return self.mlp(a @ t) + t


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = Block().eval()
    x = torch.randn(1, 3, 64, 64)
    onnx_path, pt2_path = out / "block.onnx", out / "block.pt2"
    torch.onnx.export(module, (x,), str(onnx_path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    program = torch.export.export(module.cuda(), (x.cuda(),), strict=False)
    torch.export.save(program, str(pt2_path))
    write_manifest(pt2_path, component="block", fmt="pt:fp32", files=[pt2_path],
                   source={"kind": "script", "what": "scripts/webgpu_compare.py"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [1, 3, 64, 64]}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": [1, 256, 64]}])
    codes = []
    for route, graph in (("ort-plugin:webgpu", onnx_path), ("torch-cuda", pt2_path)):
        tag = route.replace(":", "-")
        done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(graph),
                               "--route", route, "--runs", "50", "--json", str(out / f"block-{tag}.json")],
                              capture_output=True, text=True)
        (out / f"block-{tag}.txt").write_text(done.stdout + done.stderr)
        codes.append(done.returncode)
    done = subprocess.run([sys.executable, "-m", "xstage", "compare",
                           str(out / "block-ort-plugin-webgpu.json"), str(out / "block-torch-cuda.json")],
                          capture_output=True, text=True)
    (out / "compare.txt").write_text(done.stdout + done.stderr)
    print(done.stdout + done.stderr)
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
