"""Make the torch-cuda records on a CUDA machine (the lent GPU host): run with the repository's
``src`` on ``PYTHONPATH`` and ``OUT`` set; everything it writes goes under ``$OUT``.

1. the tiny Qwen3-VL tower and a 4-block full-width tower (448x448) exported as ``.pt2``
   there (the host's own torch and transformers, when transformers >= 5.24);
2. a module that moves part of its work to the CPU and back (``.to("cpu")`` -> ``sin`` ->
   ``.to("cuda")``), exported on the GPU with its manifest;
3. ``xstage external`` on ``torch-cuda`` (with ``--compare-cpu``: the torch-cpu reference
   timed too) and ``torch-cpu``; the detour at the default and at ``--min-placement 0.999``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(os.environ["OUT"])
ART = OUT / "artifacts"
REC = OUT / "records"


ENV = None


def sh(*args, check=False):
    print("$", " ".join(args), flush=True)
    done = subprocess.run(args, capture_output=True, text=True, env=ENV)
    print(done.stdout[-3000:], done.stderr[-3000:], "exit", done.returncode, flush=True)
    if check and done.returncode:
        sys.exit(done.returncode)
    return done.returncode


def detour(path):
    import torch

    from xstage.manifest import write_manifest

    class Detour(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 256)
            self.b = torch.nn.Linear(256, 256)

        def forward(self, x):
            h = self.a(x)
            h = torch.sin(h.to("cpu")).to("cuda")  # part of the work on the CPU, and back
            return self.b(h)

    torch.manual_seed(0)
    module = Detour().cuda()
    x = torch.randn(64, 256, device="cuda")
    program = torch.export.export(module, (x,), strict=False)
    torch.export.save(program, str(path))
    write_manifest(path, component="detour", fmt="pt:fp32", files=[path],
                   source={"kind": "script", "what": "Linear, .to(cpu), sin, .to(cuda), Linear"},
                   exporter={"torch": torch.__version__},
                   inputs=[{"name": "x", "dtype": "float32", "shape": [64, 256]}],
                   outputs=[{"name": "y", "dtype": "float32", "shape": [64, 256]}])


def main():
    import torch
    import transformers

    wheel = os.environ.get("XS_TRANSFORMERS_WHEEL")
    env = dict(os.environ)
    if wheel:  # the host's transformers is too old for the exporters: a carried one
        import zipfile

        target = OUT / "tf"
        zipfile.ZipFile(wheel).extractall(target)
        env["PYTHONPATH"] = f"{target}:{env.get('PYTHONPATH', '')}"
    global ENV
    ENV = env

    ART.mkdir(parents=True, exist_ok=True)
    REC.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__,
                      "cuda": torch.version.cuda, "transformers": transformers.__version__,
                      "gpu": torch.cuda.get_device_name(0)}), flush=True)
    x = [sys.executable, "-m", "xstage"]
    done = subprocess.run([*x, "devices", "--json"], capture_output=True, text=True, env=ENV)
    (REC / "devices.json").write_text(done.stdout)
    (ART / "mid.json").write_text(json.dumps({"depth": 4, "deepstack_visual_indexes": [1, 3]}))
    sh(*x, "export", "vision-tower", "--family", "qwen3_vl", "--config", "tiny", "--format",
       "pt:fp32", "--out", str(ART / "tower-tiny"))
    carried = os.environ.get("XS_CARRIED_PT2")  # the same tower saved by another torch
    if carried:
        (ART / "carried").mkdir(exist_ok=True)
        for f in Path(carried).iterdir():
            (ART / "carried" / f.name).write_bytes(f.read_bytes())
        sh(*x, "external", "--graph", str(ART / "carried" / "tower-tiny.pt2"), "--route", "torch-cuda",
           "--runs", "5", "--json", str(REC / "tower-tiny-carried.torch-cuda.json"))
    sh(*x, "export", "vision-tower", "--family", "qwen3_vl", "--config", str(ART / "mid.json"),
       "--image-size", "448", "--format", "pt:fp32", "--out", str(ART / "tower-mid"))
    detour(ART / "detour.pt2")
    for name in ("tower-tiny", "tower-mid"):
        graph = str(ART / f"{name}.pt2")
        sh(*x, "external", "--graph", graph, "--route", "torch-cuda", "--runs", "20",
           "--compare-cpu", "--json", str(REC / f"{name}.torch-cuda.json"))
        sh(*x, "external", "--graph", graph, "--route", "torch-cpu", "--runs", "10",
           "--json", str(REC / f"{name}.torch-cpu.json"))
    graph = str(ART / "detour.pt2")
    sh(*x, "external", "--graph", graph, "--route", "torch-cuda", "--runs", "5",
       "--json", str(REC / "detour.torch-cuda.json"))
    sh(*x, "external", "--graph", graph, "--route", "torch-cuda", "--min-placement", "0.999",
       "--runs", "5", "--json", str(REC / "detour.torch-cuda.min-placement-0.999.json"))
    for f in ART.glob("**/*.pt2"):  # megabytes to hundreds: the records are what comes back
        f.unlink()


if __name__ == "__main__":
    main()
