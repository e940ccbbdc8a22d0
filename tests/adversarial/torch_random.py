"""Export the ``nondet_torch`` class's programs; run by the export venv's python.

``python torch_random.py SPEC.json OUTDIR``: SPEC is a list of ``{"name", "op", "shape", "scale",
"w", "random"}``; each becomes ``OUTDIR/<name>.pt2`` (``y = x·w + s·R``, R a random op, or
``y = x·w + s`` when ``random`` is false) with its manifest. Not through ``export_artifact``:
its reload check compares two runs bit for bit, which a random program never passes. The
manifest is xstage's own (``write_manifest``), as that exporter writes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from xstage.export.torch_export import versions
from xstage.manifest import write_manifest

RANDOM = {
    "rand_like": lambda x: torch.rand_like(x),
    "randn_like": lambda x: torch.randn_like(x),
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    "dropout": lambda x: torch.nn.functional.dropout(x, p=0.5, training=True),
}


class Program(torch.nn.Module):
    def __init__(self, op, w, scale, random):
        super().__init__()
        self.op, self.w, self.scale, self.random = op, w, scale, random

    def forward(self, x):
        noise = RANDOM[self.op](x) if self.random else torch.ones_like(x)
        return x * self.w + noise * self.scale


def main(spec_path: str, out_dir: str) -> None:
    out = Path(out_dir)
    results = {}
    for case in json.loads(Path(spec_path).read_text()):
        path = out / f"{case['name']}.pt2"
        try:
            module = Program(case["op"], case["w"], case["scale"], case["random"]).eval()
            example = (torch.randn(*case["shape"]),)
            program = torch.export.export(module, example, strict=False)
            torch.export.save(program, str(path))
            io = [{"name": "x", "dtype": "float32", "shape": list(case["shape"])}]
            write_manifest(path, component="adversarial-gate", fmt="pt:fp32", files=[path],
                           source={"config": case}, exporter=versions(), inputs=io,
                           outputs=[{"name": "y", "dtype": "float32", "shape": list(case["shape"])}],
                           opset=None, sanitize=None, fp32_source=None,
                           parity={"wrapper_vs_model": {"skipped": "a random program"}})
            results[case["name"]] = {"path": str(path)}
        except Exception as exc:  # the test reports it: a program torch cannot export is no case
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
