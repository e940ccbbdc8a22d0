"""Export the torch programs of the corpus's torch classes; run by the export venv's python.

``python torch_programs.py SPEC.json OUTDIR``: SPEC is a list of ``{"name", "kind", "ops",
"shape"}``; each becomes ``OUTDIR/<name>.pt2`` with its manifest, through xstage's own
``export_artifact`` (so the worker loads it as any exported stage). Nothing here decides a
verdict: the corpus's oracle reads the same SPEC.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.while_loop import while_loop

from xstage.export.torch_export import export_artifact

UNARY = {"sin": torch.sin, "cos": torch.cos, "relu": torch.relu, "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "neg": torch.neg, "abs": torch.abs}
VIEWS = {"reshape": lambda x: x.reshape(-1), "transpose": lambda x: x.transpose(0, -1),
         "unsqueeze": lambda x: x.unsqueeze(0), "flatten": lambda x: x.flatten()}


def _chain(names):
    def apply(x):
        for name in names:
            x = UNARY[name](x)
        return x
    return apply


class Cond(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        half = max(1, len(ops) // 2)
        self.then, self.other = _chain(ops[:half]), _chain(ops[half:] or ops[:1])

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.then(t), lambda t: self.other(t), (x,))


class While(torch.nn.Module):
    def __init__(self, ops, steps=3):
        super().__init__()
        self.body, self.steps = _chain(ops), steps

    def forward(self, x):
        i0 = torch.zeros((), dtype=torch.int64)
        _, out = while_loop(lambda i, t: i < self.steps, lambda i, t: (i + 1, self.body(t)), (i0, x))
        return out


class Map(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.body = _chain(ops)

    def forward(self, x):
        return hop_map(lambda row: self.body(row), x)


class Views(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x):
        for name in self.ops:
            x = VIEWS[name](x)
        return x


def build(kind, ops):
    return {"cond": Cond, "while_loop": While, "map": Map, "views": Views}[kind](ops)


def main(spec_path: str, out_dir: str) -> None:
    out = Path(out_dir)
    results = {}
    for case in json.loads(Path(spec_path).read_text()):
        torch.manual_seed(0)
        path = out / f"{case['name']}.pt2"
        try:
            module = build(case["kind"], case["ops"]).eval()
            example = (torch.randn(*case["shape"]),)
            with torch.no_grad():
                y = module(*example)
            io = ([{"name": "x", "dtype": "float32", "shape": list(case["shape"])}],
                  [{"name": "y", "dtype": "float32", "shape": list(y.shape)}])
            export_artifact(module, example, path, fmt="pt:fp32", opset=17, input_names=["x"],
                            output_names=["y"], component="adversarial", source={"config": case},
                            fp32_source=None, io_spec=io, wrapper_check={"bitwise": True})
            results[case["name"]] = {"path": str(path)}
        except Exception as exc:  # the corpus reports it: a program torch cannot export is no case
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
