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

__all__ = ["DEFAULT_FRAMES", "DEFAULT_LEFT_CONTEXT", "SAMPLE_RATE", "TINY", "export_code2wav",
           "build_model", "export_code2wav_stream", "measure_receptive_field", "stream_vs_chunked_decode"]

DEFAULT_FRAMES = 325
#: ``--left-context``'s default: ``chunked_decode``'s own ``left_context_size``.
DEFAULT_LEFT_CONTEXT = 25
#: ``--config tiny``: a sliding window shorter than the frames, every block kind present.
TINY = {"codebook_size": 16, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_quantizers": 4, "sliding_window": 8,
        "upsample_rates": [2, 2], "upsampling_ratios": [2], "decoder_dim": 32,
        "max_position_embeddings": 512}



def _waveform(model: Any, hidden: Any) -> Any:
    """The pre-transformer's output ``[B, T, H]`` through the upsampler and the decoder, as
    ``Qwen3OmniMoeCode2Wav.forward`` does (one copy for the fixed and the windowed decoder)."""
    hidden = hidden.permute(0, 2, 1)
    for blocks in model.upsample:
        for block in blocks:
            hidden = block(hidden)
    for block in model.decoder:
        hidden = block(hidden)
    return hidden

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
            return _waveform(m, hidden).clamp(min=-1, max=1).float()

    return FixedFramesCode2Wav


#: The seeded noise of a config other than tiny, as its manifest's ``source`` records it.
FAN_IN_PERTURBATION = "0.1 * N(0, 1) / sqrt(fan_in) per parameter (1-D: fan_in 1)"


def _perturb_fan_in(model: Any, seed: int) -> None:
    """``perturb_`` scaled by each weight's fan-in. A flat 0.1 (tiny's) on the full-size
    decoder (1536 channels, kernel 7: fan-in 10752) multiplies each layer's gain by about 10:
    measured, its pre-clamp audio reached 6e15 and every sample sat on the clamp at +-1, where
    fp32's rounding flips samples from -1 to 1 between runtimes. Scaled, the audio's median
    magnitude is 0.34 and 5% of it is clamped."""
    import math

    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            fan_in = p[0].numel() if p.dim() > 1 else 1
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * (0.1 / math.sqrt(fan_in))
            p.add_(noise.to(p.dtype))


def build_model(config: str, seed: int, fmt: str) -> tuple[Any, dict[str, Any]]:
    """transformers' own ``Qwen3OmniMoeCode2Wav`` from ``config`` (tiny, or a JSON file of
    config fields), seeded and perturbed (tiny: ``perturb_`` at 0.1; any other config:
    scaled by fan-in, ``_perturb_fan_in``); parameters cast to fp16 for an fp16 format."""
    import torch
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from xstage.export.torch_export import perturb_

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
    source = {"kind": "config", "config": config, "fields": fields, "seed": seed}
    if config == "tiny":
        perturb_(model, seed, scale=0.1)
    else:
        _perturb_fan_in(model, seed)
        source["perturb"] = FAN_IN_PERTURBATION
    if fmt.endswith("fp16"):
        with torch.no_grad():  # parameters only: buffers (rotary inv_freq, offsets) stay
            for param in model.parameters():
                param.data = param.data.half()
    return model, source


def export_code2wav(out: str | Path, *, config: str = "tiny", frames: int = DEFAULT_FRAMES,
                    fmt: str = "onnx:fp32", opset: int = 21, seed: int = 0,
                    fp32_source: str | None = None, for_torch: str | None = None,
                    chunk: int | None = None, left_context: int = DEFAULT_LEFT_CONTEXT,
                    ) -> dict[str, Any]:
    """Export code2wav for ``frames`` codec frames; see the module docstring.

    With ``chunk``: the streaming window instead (``export_code2wav_stream``).
    """
    from xstage.export.torch_export import (
        FORMATS,
        artifact_paths,
        bitwise_check,
        export_artifact,
        require_torch,
    )

    torch, transformers = require_torch()
    if fmt not in FORMATS:
        raise errors.UsageError(f"--format {fmt} is not one of {', '.join(FORMATS)}")
    if chunk is not None:
        return export_code2wav_stream(out, config=config, chunk=chunk, left_context=left_context,
                                      fmt=fmt, opset=opset, seed=seed, fp32_source=fp32_source,
                                      for_torch=for_torch)
    if frames < 1:
        raise errors.UsageError("--frames must be >= 1")
    model, source = build_model(config, seed, fmt)
    wrapper = _make_wrapper_class()(model, frames).eval()
    cfg = model.config
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(seed + 1))
    check = bitwise_check(lambda: model(codes).float(), lambda: wrapper(codes))
    with torch.no_grad():
        wav_shape = list(wrapper(codes).shape)
    io = ([{"name": "codes", "dtype": "int64", "shape": list(codes.shape)}],
          [{"name": "wav", "dtype": "float32", "shape": wav_shape}])
    report = export_artifact(wrapper, (codes,), artifact_paths(Path(out), fmt), fmt=fmt,
                             opset=opset, input_names=["codes"], output_names=["wav"],
                             component="code2wav", source=source, fp32_source=fp32_source,
                             io_spec=io, wrapper_check=check, for_torch=for_torch)
    report.update(frames=frames, wrapper=check, transformers=transformers.__version__)
    return report


# --- the streaming window (docs/pipelines.md) -------------------------------------------------

#: The model's output sample rate (Qwen3-Omni's code2wav writes 24 kHz audio).
SAMPLE_RATE = 24000


def _conv_factors(model: Any) -> list[tuple[Any, int]]:
    """Every causal convolution that reads its left neighbours, with its time resolution
    (samples per code frame at its input): upsample, then decoder, as ``forward`` runs them."""
    cfg = model.config
    factor, out = 1, []
    for (_trans, convnext), ratio in zip(model.upsample, cfg.upsampling_ratios, strict=True):
        factor *= ratio  # a ConvTranspose with kernel == stride: sample j reads frame j // ratio
        out.append((convnext.dwconv, factor))
    out.append((model.decoder[0], factor))
    for block, rate in zip(model.decoder[1:1 + len(cfg.upsample_rates)], cfg.upsample_rates,
                           strict=True):
        factor *= rate
        out += [(unit.conv1, factor) for unit in block.block[2:]]  # conv2 is 1 wide
    out.append((model.decoder[-1], factor))
    return [(conv, f) for conv, f in out if conv.kernel_size > 1]


def _make_window_class() -> Any:
    import torch
    from torch import nn
    from transformers.masking_utils import create_sliding_window_causal_mask

    class WindowedCode2Wav(nn.Module):
        """``codes`` [1, Q, N] after ``context`` [1, Q, M] of which the last ``context_len``
        frames were received: the chunk's audio, the next context and its length.

        Frames of the window not received (the first ``M - context_len``) are *absent*, as
        in ``chunked_decode``'s shorter first chunks: no valid query attends to them (an
        absent query attends to itself only, so no softmax row is empty), every causal
        convolution reads zeros there (its own padding in the reference), and positions
        count from the first received frame (RoPE sees the reference's positions).
        """

        def __init__(self, model: Any, chunk: int, left_context: int) -> None:
            super().__init__()
            self.model, self.chunk, self.left_context = model, chunk, left_context
            cfg, width = model.config, chunk + left_context
            dtype = model.code_embedding.weight.dtype
            dummy = torch.empty(1, width, cfg.hidden_size, dtype=dtype)
            keep = create_sliding_window_causal_mask(
                config=cfg, inputs_embeds=dummy, attention_mask=None, cache=None,
                position_ids=torch.arange(width).unsqueeze(0), allow_is_causal_skip=False)
            self.register_buffer("keep", keep, persistent=False)
            self.register_buffer("frames", torch.arange(width), persistent=False)
            self.register_buffer("eye", torch.eye(width, dtype=torch.bool), persistent=False)
            self.samples_per_frame = int(model.total_upsample)
            self.layer_types = sorted(set(cfg.layer_types))
            self._absent: Any = None  # frames not received, set for the length of a forward
            self._hooks = [conv.register_forward_pre_hook(self._zero_hook(f))
                           for conv, f in _conv_factors(model)]

        def _zero_hook(self, factor: int) -> Any:
            def hook(_module: Any, args: tuple[Any, ...]) -> Any:
                if self._absent is None:  # the plain model, called outside the window
                    return None
                (x,) = args
                present = torch.arange(x.shape[-1], device=x.device) >= self._absent * factor
                return (torch.where(present, x, torch.zeros((), dtype=x.dtype)),)
            return hook

        def forward(self, codes: Any, context: Any, context_len: Any) -> Any:
            m = self.model
            window = torch.cat([context, codes], dim=-1)
            absent = self.left_context - context_len  # [1]
            hidden = m.code_embedding(window + m.code_offset).mean(1)
            present = self.frames >= absent
            allowed = self.keep & (present.view(1, 1, 1, -1) | self.eye)
            mask = torch.zeros(allowed.shape, dtype=hidden.dtype).masked_fill(~allowed, float("-inf"))
            positions = (self.frames - absent).unsqueeze(0)
            self._absent = absent
            try:
                hidden = m.pre_transformer(
                    inputs_embeds=hidden, attention_mask={t: mask for t in self.layer_types},
                    position_ids=positions).last_hidden_state
                wav = _waveform(m, hidden)
            finally:
                self._absent = None
            wav = wav[..., self.left_context * self.samples_per_frame:].clamp(min=-1, max=1).float()
            received = torch.clamp(context_len + codes.shape[-1], max=self.left_context)
            return wav, window[..., codes.shape[-1]:], received

    return WindowedCode2Wav


def _decode(model: Any, hidden: Any) -> Any:
    """The convolutional half of ``forward`` (upsample, decoder), without the final clamp."""
    for blocks in model.upsample:
        for block in blocks:
            hidden = block(hidden)
    for block in model.decoder:
        hidden = block(hidden)
    return hidden


def _changed(a: Any, b: Any) -> Any:
    import torch

    return torch.nonzero((a - b).abs().amax(dim=tuple(range(a.dim() - 1))) > 0).flatten()


def measure_receptive_field(model: Any, *, seed: int = 0) -> dict[str, Any]:
    """How far one code frame reaches, measured: a frame perturbed, float64, exact zeros kept.

    Run in float64 (a masked key's weight is exactly 0, so nothing outside the windows can
    change; inside them a change smaller than float64's resolution, about 1e-16 of the value
    it meets, is rounded away, so the reach measured is where one frame's influence is still
    above that, at most the windows' structural reach), each half of the decoder separately,
    since the pre-transformer is the only part that reaches far and the convolutions the only
    part that is expensive:

    * attention: the pre-transformer's input perturbed at one frame of a sequence longer than
      its layers' windows can reach; the last frame whose output changed (and that no earlier
      frame changed: causal);
    * convolutions: the upsampler and decoder's input perturbed at one frame; the last and
      the first audio sample that changed (the transposed convolutions read one step ahead,
      so samples *before* the frame's own change too).

    The receptive field is the sum (the halves compose); ``decay`` is the largest change of
    the attention half's output per frame of distance, relative to the change at the
    perturbed frame (with these random weights: trained weights reach as far, not as much).
    """
    import copy

    import torch

    m = copy.deepcopy(model).double().eval()
    cfg, upsample = m.config, int(m.total_upsample)
    g = torch.Generator().manual_seed(seed)
    layers_reach = cfg.num_hidden_layers * (cfg.sliding_window - 1)
    frames = layers_reach + 2 * cfg.sliding_window + 8
    at = cfg.sliding_window
    x = torch.randn(1, frames, cfg.hidden_size, generator=g, dtype=torch.float64)
    y = x.clone()
    y[:, at] += 1.0
    pos = torch.arange(frames).unsqueeze(0)
    with torch.no_grad():
        a = m.pre_transformer(inputs_embeds=x, position_ids=pos).last_hidden_state
        b = m.pre_transformer(inputs_embeds=y, position_ids=pos).last_hidden_state
    diff = (a - b).abs().amax(dim=-1)[0]
    hit = _changed(a.transpose(1, 2), b.transpose(1, 2))
    attention = int(hit.max()) - at
    decay = [float(diff[at + d] / diff[at]) for d in range(attention + 1)]
    # the convolutions: their reach is short; the sequence doubles until the change ends
    # before it does (a change that reaches the end was cut off, not measured)
    conv_frames, at2 = 32, 4
    while True:
        h = torch.randn(1, cfg.hidden_size, conv_frames, generator=g, dtype=torch.float64)
        k = h.clone()
        k[..., at2] += 1.0
        with torch.no_grad():
            hit2 = _changed(_decode(m, h), _decode(m, k))
        last, first = int(hit2.max()), int(hit2.min())
        if last < (conv_frames - 2) * upsample - upsample:
            break
        conv_frames *= 2
    conv_after = (last // upsample) - at2
    return {"frames": attention + conv_after, "attention_frames": attention,
            "convolution_frames": conv_after, "samples_before_frame": at2 * upsample - first,
            "causal": bool(hit.min() >= at), "decay": decay,
            "method": "one frame perturbed, float64, exact zeros (xstage.export.code2wav)"}


def stream_vs_chunked_decode(model: Any, window: Any, codes: Any) -> dict[str, Any]:
    """``window`` fed ``codes`` chunk by chunk (the last right-padded) against transformers'
    ``chunked_decode(codes, chunk, left_context)`` and against the whole-utterance forward.

    Returns the largest difference over all chunks, each chunk's (the first and last
    included) and the full decode's at the same samples (``chunked_decode`` leaves out the
    last ``lookahead_samples`` of every chunk: they need the next chunk's first frame).
    """
    import torch

    n, left, frames = window.chunk, window.left_context, codes.shape[-1]
    spf = window.samples_per_frame
    quantizers = codes.shape[1]
    with torch.no_grad():
        ref = model.chunked_decode(codes, n, left).float()
        full = model(codes).float()
        context = torch.zeros(1, quantizers, left, dtype=codes.dtype)
        received = torch.zeros(1, dtype=torch.int64)
        chunks, per_chunk, vs_full, at = [], [], [], 0
        for start in range(0, frames, n):
            part = codes[..., start:start + n]
            k = part.shape[-1]
            part = torch.nn.functional.pad(part, (0, n - k))
            wav, context, received = window(part, context, received)
            lookahead = n * spf - wav.shape[-1]
            wav = wav[..., :k * spf - lookahead]
            per_chunk.append(float((ref[..., at:at + wav.shape[-1]] - wav).abs().max()))
            vs_full.append(float((full[..., start * spf:start * spf + wav.shape[-1]] - wav)
                                 .abs().max()))
            chunks.append(wav)
            at += wav.shape[-1]
    got = torch.cat(chunks, dim=-1)
    if got.shape != ref.shape:
        raise errors.XstageError(f"the stream gave {got.shape[-1]} samples, chunked_decode "
                                 f"{ref.shape[-1]}", remedy="report it with the transformers version")
    return {"frames": frames, "chunks": len(chunks), "max_abs": max(per_chunk),
            "per_chunk": per_chunk, "vs_full_decode": vs_full}


def export_code2wav_stream(out: str | Path, *, config: str = "tiny", chunk: int = 300,
                           left_context: int = DEFAULT_LEFT_CONTEXT, fmt: str = "onnx:fp32",
                           opset: int = 21, seed: int = 0, fp32_source: str | None = None,
                           for_torch: str | None = None) -> dict[str, Any]:
    """Export the streaming window: ``chunk`` new frames after ``left_context`` earlier ones.

    Inputs ``codes`` [1, Q, chunk], ``context`` [1, Q, left_context], ``context_len`` [1];
    outputs ``wav`` [1, 1, chunk * samples_per_frame - lookahead_samples], ``context_out``
    and ``context_len_out``, the last two declared as state pairs (initially zeros: nothing
    received), so the worker carries the context. Checked before writing: a full-context
    window bitwise against the model's forward on the same frames, and a whole stream
    against ``chunked_decode`` (every chunk, the first and last included); the decoder's
    receptive field measured (``measure_receptive_field``). The manifest's ``stream`` block
    holds what a streaming caller needs (``xstage.integrations.stream``).
    """
    from xstage.export.torch_export import (
        artifact_paths,
        bitwise_check,
        export_artifact,
        require_torch,
    )

    torch, transformers = require_torch()
    if chunk < 1 or left_context < 1:
        raise errors.UsageError(
            f"--chunk {chunk} --left-context {left_context}: both must be >= 1",
            remedy="decode a whole utterance at once with --frames instead of a window")
    model, source = build_model(config, seed, fmt)
    cfg = model.config
    window = _make_window_class()(model, chunk, left_context).eval()
    g = torch.Generator().manual_seed(seed + 1)
    frames = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, left_context + chunk),
                           generator=g)
    spf = window.samples_per_frame
    example = (frames[..., left_context:], frames[..., :left_context],
               torch.tensor([left_context], dtype=torch.int64))
    check = bitwise_check(lambda: model(frames)[..., left_context * spf:].float(),
                          lambda: window(*example)[0])
    utterance = torch.randint(0, cfg.codebook_size,
                              (1, cfg.num_quantizers, 2 * chunk + left_context + chunk // 2 + 1),
                              generator=g)
    stream_check = stream_vs_chunked_decode(model, window, utterance)
    field = measure_receptive_field(model, seed=seed)
    with torch.no_grad():
        wav_shape = list(window(*example)[0].shape)
    ctx = {"dtype": "int64", "shape": [1, cfg.num_quantizers, left_context]}
    io = ([{"name": "codes", "dtype": "int64", "shape": [1, cfg.num_quantizers, chunk]},
           {"name": "context", **ctx}, {"name": "context_len", "dtype": "int64", "shape": [1]}],
          [{"name": "wav", "dtype": "float32", "shape": wav_shape},
           {"name": "context_out", **ctx}, {"name": "context_len_out", "dtype": "int64", "shape": [1]}])
    stream = {"input": "codes", "output": "wav", "chunk": chunk, "left_context": left_context,
              "samples_per_frame": spf, "lookahead_samples": chunk * spf - wav_shape[-1],
              "sample_rate": SAMPLE_RATE, "codebook_size": cfg.codebook_size,
              "reference": f"transformers Qwen3OmniMoeCode2Wav.chunked_decode(codes, {chunk}, "
              f"{left_context})",
              "vs_chunked_decode_max_abs": stream_check["max_abs"],
              "receptive_field": {k: v for k, v in field.items() if k != "decay"}}
    state = [{"input": "context", "output": "context_out", "init": "zeros"},
             {"input": "context_len", "output": "context_len_out", "init": "zeros"}]
    report = export_artifact(window, example, artifact_paths(Path(out), fmt), fmt=fmt,
                             opset=opset, input_names=["codes", "context", "context_len"],
                             output_names=["wav", "context_out", "context_len_out"],
                             component="code2wav", source=source, fp32_source=fp32_source,
                             io_spec=io, wrapper_check=check, state=state, stream=stream,
                             for_torch=for_torch)
    report.update(chunk=chunk, left_context=left_context, wrapper=check, stream=stream_check,
                  receptive_field=field, transformers=transformers.__version__)
    return report
