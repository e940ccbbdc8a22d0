"""``xstage export code2wav``: Qwen3-Omni's code-to-waveform decoder at a fixed number of frames.

``FixedFramesCode2Wav`` wraps transformers' own ``Qwen3OmniMoeCode2Wav``. The sliding-window
causal mask is built once with transformers' own ``create_sliding_window_causal_mask`` and
held as an **additive float buffer** (0 / -inf), handed to the model's pre-transformer
through its documented prepared-mask path: a boolean mask lowers to ``Where(IsNaN(softmax))``
guards per layer, the float one to none. The model's ``forward`` does not pass a mask on, so
its 8 lines are replicated. Outputs are checked **bitwise** against the model's own forward.
The default of 325 frames is the model's own chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xstage import errors

__all__ = ["DEFAULT_FRAMES", "TINY", "export_code2wav"]

DEFAULT_FRAMES = 325
#: ``--config tiny``: a sliding window shorter than the frames, every block kind present.
TINY = {"codebook_size": 16, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_quantizers": 4, "sliding_window": 8,
        "upsample_rates": [2, 2], "upsampling_ratios": [2], "decoder_dim": 32,
        "max_position_embeddings": 512}


def _make_wrapper_class() -> Any:
    import torch
    from torch import nn
    from transformers.masking_utils import create_sliding_window_causal_mask

    class FixedFramesCode2Wav(nn.Module):
        def __init__(self, model: Any, frames: int, batch: int = 1) -> None:
            super().__init__()
            self.model = model
            cfg = model.config
            dtype = model.code_embedding.weight.dtype
            dummy = torch.empty(batch, frames, cfg.hidden_size, dtype=dtype)
            pos = torch.arange(frames).unsqueeze(0)
            # allow_is_causal_skip=False: always a real mask (eager may skip it for short input)
            keep = create_sliding_window_causal_mask(config=cfg, inputs_embeds=dummy,
                                                     attention_mask=None, cache=None,
                                                     position_ids=pos, allow_is_causal_skip=False)
            mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
            self.register_buffer("mask", mask, persistent=False)
            self.register_buffer("position_ids", pos, persistent=False)
            self.layer_types = sorted(set(cfg.layer_types))

        def forward(self, codes: Any) -> Any:  # Qwen3OmniMoeCode2Wav.forward, with the mask
            m = self.model
            hidden = m.code_embedding(codes + m.code_offset).mean(1)
            masks = {t: self.mask for t in self.layer_types}
            hidden = m.pre_transformer(inputs_embeds=hidden, attention_mask=masks,
                                       position_ids=self.position_ids).last_hidden_state
            hidden = hidden.permute(0, 2, 1)
            for blocks in m.upsample:
                for block in blocks:
                    hidden = block(hidden)
            wav = hidden
            for block in m.decoder:
                wav = block(wav)
            return wav.clamp(min=-1, max=1).float()

    return FixedFramesCode2Wav


def export_code2wav(out: str | Path, *, config: str = "tiny", frames: int = DEFAULT_FRAMES,
                    fmt: str = "onnx:fp32", opset: int = 21, seed: int = 0,
                    fp32_source: str | None = None, for_torch: str | None = None) -> dict[str, Any]:
    """Export code2wav for ``frames`` codec frames; see the module docstring."""
    from xstage.export.torch_export import (
        FORMATS,
        artifact_paths,
        bitwise_check,
        export_artifact,
        perturb_,
        require_torch,
    )

    torch, transformers = require_torch()
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    if fmt not in FORMATS:
        raise errors.UsageError(f"--format {fmt} is not one of {', '.join(FORMATS)}")
    if frames < 1:
        raise errors.UsageError("--frames must be >= 1")
    if config == "tiny":
        fields = dict(TINY)
    else:
        try:
            fields = json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise errors.UsageError(f"--config {config}: {exc}",
                                    remedy="tiny, or a JSON file of code2wav config fields") from exc
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav._from_config(Qwen3OmniMoeCode2WavConfig(**fields),
                                              attn_implementation="sdpa").eval()
    perturb_(model, seed, scale=0.1)
    if fmt.endswith("fp16"):
        with torch.no_grad():  # parameters only: buffers (rotary inv_freq, offsets) stay
            for param in model.parameters():
                param.data = param.data.half()
    wrapper = _make_wrapper_class()(model, frames).eval()
    cfg = model.config
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(seed + 1))
    check = bitwise_check(lambda: model(codes).float(), lambda: wrapper(codes))
    with torch.no_grad():
        wav_shape = list(wrapper(codes).shape)
    io = ([{"name": "codes", "dtype": "int64", "shape": list(codes.shape)}],
          [{"name": "wav", "dtype": "float32", "shape": wav_shape}])
    source = {"kind": "config", "config": config, "fields": fields, "seed": seed}
    report = export_artifact(wrapper, (codes,), artifact_paths(Path(out), fmt), fmt=fmt,
                             opset=opset, input_names=["codes"], output_names=["wav"],
                             component="code2wav", source=source, fp32_source=fp32_source,
                             io_spec=io, wrapper_check=check, for_torch=for_torch)
    report.update(frames=frames, wrapper=check, transformers=transformers.__version__)
    return report
