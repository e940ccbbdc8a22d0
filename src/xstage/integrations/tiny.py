"""Tiny Qwen3.5 / Qwen3-VL generation models with fixed random weights, and inputs for them.

The models are transformers' own ``Qwen3_5ForConditionalGeneration`` and
``Qwen3VLForConditionalGeneration``, built from a config with no download:

* the vision tower is exactly ``xstage export vision-tower --family F --config tiny --seed S``
  (``xstage.export.vision_tower.build_model``; its weights are copied in, so that export is
  this model's tower, and an exported stage can be checked against the module it replaces);
* the language model is as small as the tower (hidden size = the tower's output width, 48;
  two layers, so Qwen3-VL's two deepstack features each land in a layer; Qwen3.5 has one
  linear-attention and one full-attention layer), seeded and perturbed like the tower.

Inputs are built without a processor: token ids with the placeholders the model expects
(``<vision_start>``, one ``<image>`` per merged patch group, ``<vision_end>``), the matching
``mm_token_type_ids``, and seeded random patches (``pixel_values``) with their ``image_grid_thw``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xstage.export.vision_tower import build_model

__all__ = ["SPECIAL", "TINY_TEXT", "VlPair", "tiny_pairs", "tiny_vl_model"]

#: Special token ids of the tiny models (a vocabulary of 128: text ids are 0..99).
SPECIAL = {"image_token_id": 124, "video_token_id": 125, "vision_start_token_id": 126,
           "vision_end_token_id": 127}
TEXT_IDS = 100

_COMMON = {"vocab_size": 128, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512}
#: The language model's config per family (the tower's is ``vision_tower.TINY``).
TINY_TEXT: dict[str, dict[str, Any]] = {
    "qwen3_vl": {**_COMMON, "head_dim": 24, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 4, 4],
        "mrope_interleaved": True}},
    "qwen3_5": {**_COMMON, "head_dim": 32, "layer_types": ["linear_attention", "full_attention"],
                "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "linear_num_key_heads": 2, "linear_num_value_heads": 2,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                    "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                                    "partial_rotary_factor": 0.25}},
}


def _classes(family: str) -> tuple[Any, Any]:
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        return Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    return Qwen3_5Config, Qwen3_5ForConditionalGeneration


def tiny_vl_model(family: str = "qwen3_vl", *, seed: int = 0) -> Any:
    """The tiny generation model of ``family`` (``qwen3_vl`` or ``qwen3_5``), in eval mode.

    Its tower's weights are those of ``xstage export vision-tower --family FAMILY --config
    tiny --seed SEED``.

    Raises:
        UsageError: an unknown family, or torch/transformers missing.
    """
    import torch

    from xstage.export.torch_export import perturb_

    tower, _ = build_model(family, config="tiny", seed=seed)  # UsageError for a bad family
    config_cls, model_cls = _classes(family)
    config = config_cls(text_config=dict(TINY_TEXT[family]), vision_config=tower.config.to_dict(),
                        **SPECIAL)
    torch.manual_seed(seed)
    model = model_cls._from_config(config, attn_implementation="sdpa").eval()
    perturb_(model, seed + 1000)
    model.model.visual.load_state_dict(tower.state_dict(), strict=True)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # every run generates max_new_tokens
    return model


@dataclass
class VlPair:
    """One (image, prompt) pair: the keyword arguments ``model.generate`` takes.

    Attributes:
        index: the pair's number.
        inputs: ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``pixel_values``,
            ``image_grid_thw`` (torch tensors, batch of one).
    """

    index: int
    inputs: dict[str, Any]


def tiny_pairs(model: Any, count: int = 16, *, image_size: tuple[int, int] = (64, 64),
               seed: int = 0) -> list[VlPair]:
    """``count`` (image, prompt) pairs for ``model``.

    Each pair: seeded patches for one image of ``image_size``, and a prompt of 3 to 10 seeded
    text tokens around that image's placeholders.
    """
    import torch

    vision = model.config.vision_config
    p, m = vision.patch_size, vision.spatial_merge_size
    grid = [1, image_size[0] // p, image_size[1] // p]
    rows = grid[1] * grid[2]
    tokens = rows // (m * m)
    width = vision.in_channels * vision.temporal_patch_size * p * p
    cfg = model.config
    pairs = []
    for i in range(count):
        rng = np.random.default_rng(seed * 1000 + i)
        before = rng.integers(0, TEXT_IDS, int(rng.integers(1, 5))).tolist()
        after = rng.integers(0, TEXT_IDS, int(rng.integers(2, 7))).tolist()
        ids = before + [cfg.vision_start_token_id] + [cfg.image_token_id] * tokens \
            + [cfg.vision_end_token_id] + after
        input_ids = torch.tensor([ids])
        patches = rng.standard_normal((rows, width)).astype(np.float32)
        pairs.append(VlPair(i, {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == cfg.image_token_id).int(),
            "pixel_values": torch.from_numpy(patches),
            "image_grid_thw": torch.tensor([grid]),
        }))
    return pairs

