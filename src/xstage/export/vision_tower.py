"""``xstage export vision-tower``: the Qwen3.5 (or Qwen3-VL) vision tower at one fixed image size.

``FixedGridTower`` wraps transformers' own ``Qwen3_5VisionModel`` / ``Qwen3VLVisionModel``
instance; no layer is redefined. Everything that depends on the grid is computed once, for
the fixed size, with transformers' own public helpers (``transformers.vision_utils``:
interpolation indices and weights, position ids, the attention segment lengths) and the
model's own rotary module, and held as buffers. What that leaves for the graph:

* the position-embedding lookup becomes ``one_hot @ pos_embed.weight``: exactly the same
  numbers (one non-zero term per dot product), the learned table stays a weight, and the
  graph has **no integer Gather**;
* attention over ``--images N`` of one size splits at fixed, Python-integer segment lengths
  (the model itself splits at ``lengths.tolist()``, which ``torch.export`` cannot trace for
  more than one image).

Replicated from transformers 5.24 (the only copies of upstream logic, ~20 lines): the top of
the vision model's forward, the block's two residual lines, and the non-flash branch of its
attention. The export checks that the wrapper's outputs are **bitwise identical** to the
model's own forward before anything is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from xstage import errors

__all__ = ["FAMILIES", "TINY", "build_model", "check_image_size", "export_vision_tower"]

FAMILIES = ("qwen3_5", "qwen3_vl")
#: ``--config tiny``: every dimension small, every mechanism present (a 6x6 position table
#: resampled to the grid, 2x2 merging, deepstack for Qwen3-VL).
TINY = {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "out_hidden_size": 48, "num_position_embeddings": 36}
PREFIXES = ("model.visual.", "visual.")


def _classes(family: str) -> tuple[Any, Any]:
    if family == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

        return Qwen3_5VisionConfig, Qwen3_5VisionModel
    if family == "qwen3_vl":
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        return Qwen3VLVisionConfig, Qwen3VLVisionModel
    raise errors.UsageError(f"--family {family!r} is not one of {', '.join(FAMILIES)}")


def _make_tower_class() -> Any:
    import torch
    from torch import nn
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.vision_utils import (
        get_vision_attention_seqlens,
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    class FixedGridTower(nn.Module):
        """The tower for ``num_images`` images of ``height`` x ``width``; see the module doc."""

        def __init__(self, model: Any, height: int, width: int, num_images: int = 1) -> None:
            super().__init__()
            cfg = model.config
            self.model = model
            family = sys.modules[type(model).__module__]  # the family's own module
            self._apply_rope = family.apply_rotary_pos_emb_vision
            self._eager = family.eager_attention_forward
            p, m = cfg.patch_size, cfg.spatial_merge_size
            if height % (p * m) or width % (p * m):
                raise errors.UsageError(
                    f"--image-size {height}x{width} is not a multiple of {p * m} "
                    "(patch size x merge size)", remedy=f"use a multiple of {p * m}")
            gh, gw = height // p, width // p
            grid = torch.tensor([[1, gh, gw]] * num_images, dtype=torch.long)
            self.num_patches = num_images * gh * gw
            self.patch_dim = cfg.in_channels * cfg.temporal_patch_size * p * p
            with torch.no_grad():  # the calls the model's own forward makes, once
                idx, w = get_vision_interpolation_indices_and_weights(
                    grid, num_grid_per_side=model.num_grid_per_side, mode=model.interpolation_mode,
                    align_corners=model.interpolation_align_corners,
                    spatial_merge_size=cfg.spatial_merge_size)
                position_ids = get_vision_position_ids(grid, model.spatial_merge_size)
                cu_seqlens, _ = get_vision_attention_seqlens(grid, cfg)
                # In the parameters' dtype, as the model's forward computes them.
                dummy = torch.empty(0, dtype=model.pos_embed.weight.dtype)
                cos, sin = model.rotary_pos_emb(dummy, position_ids)
            self.seg_lens = [int(n) for n in (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()]
            self.taps = idx.shape[1]
            onehot = torch.zeros(idx.numel(), cfg.num_position_embeddings, dtype=torch.float32)
            onehot[torch.arange(idx.numel()), idx.reshape(-1)] = 1.0
            self.register_buffer("interp_onehot", onehot, persistent=False)
            self.register_buffer("interp_weights", w, persistent=False)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
            self.deepstack = list(getattr(model, "deepstack_visual_indexes", None) or [])

        def _attention(self, attn: Any, x: Any) -> Any:
            # Qwen3_5VisionAttention.forward, non-flash branch, with fixed split sizes.
            s = x.shape[0]
            q, k, v = attn.qkv(x).reshape(s, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            q, k = self._apply_rope(q, k, self.rope_cos, self.rope_sin)
            q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            fn = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, self._eager)
            splits = [torch.split(t, self.seg_lens, dim=2) for t in (q, k, v)]
            out = torch.cat([fn(attn, a, b, c, attention_mask=None, scaling=attn.scaling,
                                dropout=0.0, is_causal=False)[0]
                             for a, b, c in zip(*splits, strict=True)], dim=1)
            return attn.proj(out.reshape(s, -1).contiguous())

        def forward(self, patches: Any) -> Any:
            m = self.model
            h = m.patch_embed(patches)
            table = m.pos_embed.weight
            taps = (self.interp_onehot.to(table.dtype) @ table).view(-1, self.taps, h.shape[-1])
            h = h + (taps * self.interp_weights[:, :, None]).sum(1).to(h.dtype)
            deep = []
            for i, blk in enumerate(m.blocks):  # Qwen3_5VisionBlock.forward
                h = h + self._attention(blk.attn, blk.norm1(h))
                h = h + blk.mlp(blk.norm2(h))
                if i in self.deepstack:
                    deep.append(m.deepstack_merger_list[self.deepstack.index(i)](h))
            return tuple(t.float() for t in (m.merger(h), *deep))

    return FixedGridTower


#: transformers' defaults for both families' vision configs (``patch_size``, ``spatial_merge_size``).
_DEFAULT_PATCH, _DEFAULT_MERGE = 16, 2


def _grid_fields(config: str | None, checkpoint: str | None) -> dict[str, Any] | None:
    """The vision-config fields as files hold them (no torch), or None where unreadable."""
    try:
        if checkpoint is not None:
            data = json.loads((Path(checkpoint) / "config.json").read_text())
            vision = data.get("vision_config") if isinstance(data, dict) else None
            return vision if isinstance(vision, dict) else None
        if config == "tiny":
            return dict(TINY)
        if config is not None:
            data = json.loads(Path(config).read_text())
            return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None  # build_model says what is wrong with the file, in its own words
    return None


def check_image_size(image_size: tuple[int, int], *, config: str | None = None,
                     checkpoint: str | None = None) -> None:
    """``--image-size`` against the grid (patch size x merge size), before torch is imported.

    The tower checks it again with the model's own config (``FixedGridTower``); this check only
    answers a bad size at once, from the config's file.

    Raises:
        UsageError: a side that is not a positive multiple of patch size x merge size.
    """
    height, width = image_size
    fields = _grid_fields(config, checkpoint)
    if fields is None:
        return  # an unreadable config: the tower's own check (and build_model's message) decide
    p = fields.get("patch_size", _DEFAULT_PATCH)
    m = fields.get("spatial_merge_size", _DEFAULT_MERGE)
    if not (isinstance(p, int) and isinstance(m, int) and p > 0 and m > 0):
        return
    if height <= 0 or width <= 0 or height % (p * m) or width % (p * m):
        raise errors.UsageError(
            f"--image-size {height}x{width} is not a multiple of {p * m} (patch size x merge size)",
            remedy=f"use a multiple of {p * m}, e.g. --image-size {max(1, round(height / (p * m))) * p * m}")


def _read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(vision config dict, tower state dict with the prefix stripped) from safetensors shards."""
    from safetensors import safe_open

    cfg_file = directory / "config.json"
    if not cfg_file.is_file():
        raise errors.ArtifactError(f"--checkpoint {directory} has no config.json",
                                   remedy="point at the model's folder (config.json + *.safetensors)")
    cfg = json.loads(cfg_file.read_text())
    vision = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else None
    if vision is None:
        raise errors.ArtifactError(f"{cfg_file} has no vision_config",
                                   remedy="this is not a Qwen3.5/Qwen3-VL checkpoint")
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise errors.ArtifactError(f"--checkpoint {directory} holds no .safetensors files",
                                   remedy="the checkpoint's weights are safetensors shards")
    state: dict[str, Any] = {}
    prefixes_seen = set()
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                prefix = next((p for p in PREFIXES if key.startswith(p)), None)
                if prefix is None:
                    continue
                prefixes_seen.add(prefix)
                state[key[len(prefix):]] = f.get_tensor(key)
    if not state:
        raise errors.ArtifactError(
            f"--checkpoint {directory}: no tensor under {' or '.join(PREFIXES)}",
            remedy="the vision tower's weights must be under model.visual.* or visual.*")
    if len(prefixes_seen) > 1:
        raise errors.ArtifactError(f"--checkpoint {directory} has tower weights under both "
                                   f"{sorted(prefixes_seen)}", remedy="keep one prefix")
    return vision, state


def build_model(family: str, *, config: str | None = None, checkpoint: str | None = None,
                seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The transformers vision model and a description of its source for the manifest.

    ``config``: ``tiny`` or a JSON file of vision-config fields (random weights, seeded,
    every parameter perturbed). ``checkpoint``: a folder with ``config.json`` and safetensors
    shards; the load is strict (every name of the model matched, nothing left over).
    """
    torch, _ = _torch()
    config_cls, model_cls = _classes(family)
    if (config is None) == (checkpoint is None):
        raise errors.UsageError("give exactly one of --config tiny|FILE.json or --checkpoint DIR")
    if checkpoint is not None:
        directory = Path(checkpoint)
        fields, state = _read_checkpoint(directory)
        cfg = config_cls(**fields)
        model = model_cls._from_config(cfg, attn_implementation="sdpa").eval()
        missing = sorted(set(model.state_dict()) - set(state))
        extra = sorted(set(state) - set(model.state_dict()))
        if missing or extra:
            raise errors.ArtifactError(
                f"--checkpoint {directory}: {len(missing)} tower tensors missing "
                f"{missing[:5]}, {len(extra)} unexpected {extra[:5]}",
                remedy="the checkpoint does not match this --family; every name must match")
        model.load_state_dict(state, strict=True)
        source = {"kind": "checkpoint", "path": str(directory.resolve()), "tensors": len(state),
                  "family": family, "sha256": _shards_digest(directory)}
        return model, source
    if config == "tiny":
        fields = dict(TINY)
        if family == "qwen3_vl":
            fields["deepstack_visual_indexes"] = [0, TINY["depth"] - 1]
    else:
        try:
            fields = json.loads(Path(config).read_text())  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:
            raise errors.UsageError(f"--config {config}: {exc}",
                                    remedy="tiny, or a JSON file of vision-config fields") from exc
    torch.manual_seed(seed)
    model = model_cls._from_config(config_cls(**fields), attn_implementation="sdpa").eval()
    from xstage.export.torch_export import perturb_

    perturb_(model, seed)
    return model, {"kind": "config", "config": config if config != "tiny" else "tiny",
                   "fields": fields, "seed": seed, "family": family}


def _shards_digest(directory: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for shard in sorted(directory.glob("*.safetensors")):
        h.update(shard.name.encode() + b"\0")
        with open(shard, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _torch() -> tuple[Any, Any]:
    from xstage.export.torch_export import require_torch

    return require_torch()


def export_vision_tower(out: str | Path, *, family: str = "qwen3_5", config: str | None = None,
                        checkpoint: str | None = None, image_size: tuple[int, int] = (64, 64),
                        images: int = 1, fmt: str = "onnx:fp32", opset: int = 21, seed: int = 0,
                        fp32_source: str | None = None, for_torch: str | None = None) -> dict[str, Any]:
    """Export the tower at one size; see the module docstring. Returns the report."""
    torch, transformers = _torch()
    from xstage.export.torch_export import FORMATS, artifact_paths, bitwise_check, export_artifact

    if fmt not in FORMATS:
        raise errors.UsageError(f"--format {fmt} is not one of {', '.join(FORMATS)}")
    if images < 1:
        raise errors.UsageError("--images must be >= 1")
    model, source = build_model(family, config=config, checkpoint=checkpoint, seed=seed)
    if fmt.endswith("fp16"):
        with torch.no_grad():  # parameters only: buffers such as inv_freq stay fp32
            for param in model.parameters():
                param.data = param.data.half()
    tower = _make_tower_class()(model, image_size[0], image_size[1], images).eval()
    grid = torch.tensor([[1, image_size[0] // model.config.patch_size,
                          image_size[1] // model.config.patch_size]] * images)
    patches = torch.randn(tower.num_patches, tower.patch_dim,
                          generator=torch.Generator().manual_seed(seed + 1))

    def reference() -> Any:
        out = model(patches.to(model.patch_embed.proj.weight.dtype), grid_thw=grid)
        feats = getattr(out, "deepstack_features", None) or []
        return tuple(t.float() for t in (out.pooler_output, *feats))

    check = bitwise_check(reference, lambda: tower(patches))
    names = ["embeds"] + [f"deepstack_{i}" for i in range(len(tower.deepstack))]
    with torch.no_grad():
        shapes = [list(t.shape) for t in tower(patches)]
    # ``grid_thw`` on the input: the images the rows hold, so a model's proxy
    # (``xstage.integrations.transformers``) can check each image's grid against it.
    io = ([{"name": "patches", "dtype": "float32", "shape": list(patches.shape),
            "grid_thw": grid.tolist()}],
          [{"name": n, "dtype": "float32", "shape": s} for n, s in zip(names, shapes, strict=True)])
    path = artifact_paths(Path(out), fmt)
    report = export_artifact(tower, (patches,), path, fmt=fmt, opset=opset,
                             input_names=["patches"], output_names=names,
                             component="vision_tower", source=source, fp32_source=fp32_source,
                             io_spec=io, wrapper_check=check, for_torch=for_torch)
    report.update(family=family, image_size=list(image_size), images=images, wrapper=check,
                  grid_thw=grid.tolist(), transformers=transformers.__version__)
    return report
