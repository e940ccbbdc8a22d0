"""The proxy's cases, run in the export environment (torch + transformers); prints one JSON.

Run by ``test_transformers.py`` as ``python proxy_cases.py OUT_DIR``. Each case is a function
returning a JSON-ready dict; an exception is reported as ``{"error": type, "message", "remedy"}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

import xstage
from xstage import errors
from xstage.builtin_graphs import builtin_artifact
from xstage.export.vision_tower import export_vision_tower
from xstage.integrations.identity import greedy
from xstage.integrations.tiny import tiny_pairs, tiny_vl_model
from xstage.integrations.transformers import find_module, offload

OUT = Path(sys.argv[1])
#: towers exported before with these arguments (``OUT2/<name>/tower.onnx``), used where present
BEFORE = Path(sys.argv[2]) if len(sys.argv) > 2 else None
VL = tiny_vl_model("qwen3_vl", seed=0)
Q35 = tiny_vl_model("qwen3_5", seed=0)


def _export(name, **kw):
    if BEFORE is not None and (BEFORE / name / "tower.onnx.manifest.json").is_file():
        return str(BEFORE / name / "tower.onnx")
    return export_vision_tower(OUT / name / "tower", config="tiny", **kw)["path"]


TWO = _export("vl-two", family="qwen3_vl", images=2)
OTHER = _export("vl-seed1", family="qwen3_vl", seed=1)


def _tower_outputs(model, patches, grid):
    _, tower = find_module(model, "visual")
    with torch.no_grad():
        out = tower(patches, grid_thw=grid)
    return [out.pooler_output, *(getattr(out, "deepstack_features", None) or [])]


def case_three_images_through_a_two_image_stage():
    """Rule 3: 3 images through a stage for 2: two calls, the second padded; same outputs."""
    rng = np.random.default_rng(0)
    patches = torch.from_numpy(rng.standard_normal((48, 1536)).astype(np.float32))
    grid = torch.tensor([[1, 4, 4]] * 3)
    want = _tower_outputs(VL, patches, grid)
    with xstage.open_stage(TWO, route="ort-cpu") as stage, offload(VL, "visual", stage) as proxy:
        got = _tower_outputs(VL, patches, grid)
        calls = [e["images"] for e in proxy.calls.entries]
    return {"calls": calls, "shapes": [list(t.shape) for t in got],
            "max_abs": max(float((a - b).abs().max()) for a, b in zip(want, got, strict=True)),
            "dtype": str(got[0].dtype)}


def case_an_image_of_another_size():
    """Rule 2: a 128x64 image into a 64x64 stage."""
    pair = tiny_pairs(VL, 1, image_size=(128, 64))[0]
    with xstage.open_stage(TWO, route="ort-cpu") as stage, offload(VL, "visual", stage):
        greedy(VL, pair.inputs, 2)
    return {}


def case_the_module_comes_back_after_an_error():
    """Leaving the block by an exception restores the module."""
    _, before = find_module(VL, "visual")
    try:
        case_an_image_of_another_size()
    except errors.InputError:
        pass
    _, after = find_module(VL, "visual")
    return {"restored": after is before, "type": type(after).__name__}


def case_offloading_twice():
    """Rule 5."""
    with xstage.open_stage(TWO, route="ort-cpu") as stage, offload(VL, "visual", stage), \
            offload(VL, "visual", stage):
        pass
    return {}


def case_a_path_that_names_nothing():
    with xstage.open_stage(TWO, route="ort-cpu") as stage, offload(VL, "vision", stage):
        pass
    return {}


def case_a_stage_of_other_weights():
    """Rule 4: the check catches a tower exported with another seed."""
    with xstage.open_stage(OTHER, route="ort-cpu") as stage, offload(VL, "visual", stage):
        pass
    return {}


def case_a_stage_without_deepstack_for_qwen3_vl():
    """Rule 4: Qwen3-VL's tower gives deepstack features; the Qwen3.5 built-in does not."""
    with xstage.open_stage(builtin_artifact("vision-tower-tiny"), route="ort-cpu") as stage, \
            offload(VL, "visual", stage, image_size=(64, 64)):
        pass
    return {}


def case_a_bfloat16_model_gets_bfloat16_features():
    """The proxy gives the tower's dtype; the check's bar follows it."""
    model = tiny_vl_model("qwen3_vl", seed=0).to(torch.bfloat16)
    pair = tiny_pairs(model, 1)[0]
    with xstage.open_stage(TWO, route="ort-cpu") as stage, \
            offload(model, "visual", stage) as proxy:
        out = _tower_outputs(model, pair.inputs["pixel_values"].to(torch.bfloat16),
                             pair.inputs["image_grid_thw"])
        tokens = greedy(model, pair.inputs, 2).tokens
    return {"dtypes": sorted({str(t.dtype) for t in out}), "tokens": len(tokens),
            "check_passed": max(proxy.check_figures.values()) < 5e-2}


def case_the_builtin_needs_an_image_size():
    """Rule 1: the shipped built-in's manifest predates grid_thw."""
    with xstage.open_stage(builtin_artifact("vision-tower-tiny"), route="ort-cpu") as stage, \
            offload(Q35, "visual", stage):
        pass
    return {}


def case_the_builtin_with_its_image_size_generates_the_same_tokens():
    """The shipped built-in is the tiny Qwen3.5 model's tower (seed 0): same tokens."""
    pair = tiny_pairs(Q35, 1)[0]
    want = greedy(Q35, pair.inputs, 6).tokens
    with xstage.open_stage(builtin_artifact("vision-tower-tiny"), route="ort-cpu") as stage, \
            offload(Q35, "visual", stage, image_size=(64, 64)) as proxy:
        got = greedy(Q35, pair.inputs, 6).tokens
        check = proxy.check_figures
    return {"same": want == got, "check": check}


def main() -> None:
    results = {}
    for name, fn in sorted(globals().items()):
        if not name.startswith("case_"):
            continue
        try:
            results[name[5:]] = {"ok": fn()}
        except errors.XstageError as exc:
            results[name[5:]] = {"error": type(exc).__name__, "message": exc.message,
                                 "remedy": exc.remedy}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
