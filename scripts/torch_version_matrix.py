"""Which exporter's ``.pt2`` loads on which worker's torch: the matrix in docs/torch.md.

Each exporter interpreter saves programs; each worker interpreter loads every one of them and
runs it on the exporter's inputs; a cell is ``bitwise`` (same outputs), ``max|d| X`` or the
first line of the load error. Exporters with xstage and transformers (the export venv) save
the tiny Qwen3.5 and Qwen3-VL towers and code2wav, also ``--for-torch 2.4``; any other torch
saves a small program of its own (conv, layer norm, attention, GELU, a factory op).

    python3 scripts/torch_version_matrix.py --exporter .test-cache/export/venv/bin/python \\
        --exporter /path/to/torch241/venv/bin/python \\
        --worker .test-cache/export/venv/bin/python --worker /path/to/torch241/venv/bin/python

Run from the repository root (the exporters' ``xstage`` is this tree's ``src``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SMALL = r'''
import sys, numpy as np, torch
torch.manual_seed(0)
class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.norm = torch.nn.LayerNorm(8)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    def forward(self, x):
        h = self.conv(x).flatten(2).transpose(1, 2)
        h = self.norm(h)
        h = self.attn(h, h, h, need_weights=False)[0]
        pos = torch.arange(h.shape[1], device=h.device, dtype=h.dtype)
        return torch.nn.functional.gelu(h + pos[None, :, None])
x = torch.randn(1, 3, 10, 10)
ep = torch.export.export(Small().eval(), (x,))
torch.export.save(ep, sys.argv[1] + "/small.pt2")
np.save(sys.argv[1] + "/small.in.npy", x.numpy())
np.save(sys.argv[1] + "/small.out.npy", ep.module()(x).detach().numpy())
'''

_TOWER_OUT = r'''
import sys, numpy as np, torch
ep = torch.export.load(sys.argv[1])
torch.manual_seed(0)
args = [torch.randn(*[int(d) for d in spec["shape"]]) if spec["dtype"].startswith("float") else
        torch.randint(0, 8, [int(d) for d in spec["shape"]]) for spec in __import__("json").load(
        open(sys.argv[2]))["inputs"]]
np.save(sys.argv[3], args[0].numpy())
out = ep.module()(*args)
out = out[0] if isinstance(out, (list, tuple)) else out
np.save(sys.argv[4], out.detach().numpy())
'''

_LOAD = r'''
import sys, warnings, numpy as np, torch
warnings.simplefilter("ignore")
try:
    ep = torch.export.load(sys.argv[1])
    out = ep.module()(torch.from_numpy(np.load(sys.argv[2])))
    out = (out[0] if isinstance(out, (list, tuple)) else out).detach().numpy()
except Exception as exc:
    print("FAIL %s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:160]))
    sys.exit(0)
want = np.load(sys.argv[3])
print("bitwise" if np.array_equal(out, want) else "max|d| %.2e" % float(np.abs(out - want).max()))
'''


def _version(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _can_export_towers(python: str) -> bool:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([python, "-c", "import transformers, xstage.export.torch_export"], env=env,
                          capture_output=True).returncode == 0


def _artifacts(python: str, root: Path) -> list[tuple[str, Path, Path, Path]]:
    """(label, .pt2, input .npy, output .npy) saved by ``python``."""
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = []
    if _can_export_towers(python):
        jobs = [("tower qwen3_5", ["vision-tower", "--config", "tiny"]),
                ("tower qwen3_vl", ["vision-tower", "--family", "qwen3_vl", "--config", "tiny"]),
                ("code2wav", ["code2wav", "--frames", "8"])]
        for label, args in jobs:
            for fmt in ("pt:fp32", "pt:fp16"):
                for legacy in (False, True):
                    name = f"{label.replace(' ', '-')}-{fmt[3:]}{'-legacy' if legacy else ''}"
                    cmd = [python, "-m", "xstage", "export", *args, "--format", fmt,
                           "--out", str(root / name)] + (["--for-torch", "2.4"] if legacy else [])
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                    if done.returncode:
                        print(f"  export {name} failed: {done.stderr.strip().splitlines()[-1:]}")
                        continue
                    plain = root / (name.removesuffix("-legacy") + ".pt2")
                    if not legacy:  # the inputs and outputs, from the exporter's own torch
                        subprocess.run([python, "-c", _TOWER_OUT, str(plain),
                                        str(root / f"{name}.manifest.json"), str(root / f"{name}.in.npy"),
                                        str(root / f"{name}.out.npy")], check=True, env=env,
                                       capture_output=True)
                    base = name.removesuffix("-legacy")
                    out.append((f"{label} {fmt}{' --for-torch 2.4' if legacy else ''}",
                                root / f"{name}.pt2", root / f"{base}.in.npy", root / f"{base}.out.npy"))
    done = subprocess.run([python, "-c", _SMALL, str(root)], capture_output=True, text=True)
    if done.returncode == 0:
        out.append(("small program", root / "small.pt2", root / "small.in.npy", root / "small.out.npy"))
    else:
        print(f"  small program failed: {done.stderr.strip().splitlines()[-1:]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", action="append", required=True)
    parser.add_argument("--worker", action="append", required=True)
    parser.add_argument("--json", help="write the cells here too")
    args = parser.parse_args()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, exporter in enumerate(args.exporter):
            saved_by = _version(exporter)
            print(f"exporter torch {saved_by} ({exporter})")
            for label, pt2, x, y in _artifacts(exporter, Path(tmp) / str(i)):
                for worker in args.worker:
                    loaded_by = _version(worker)
                    done = subprocess.run([worker, "-c", _LOAD, str(pt2), str(x), str(y)],
                                          capture_output=True, text=True)
                    result = (done.stdout.strip() or done.stderr.strip().splitlines()[-1:] or ["?"])
                    result = result if isinstance(result, str) else result[0]
                    cells.append({"saved_by": saved_by, "artifact": label, "loaded_by": loaded_by,
                                  "result": result})
                    print(f"  | {saved_by} | {label} | {loaded_by} | {result} |")
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=2) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
