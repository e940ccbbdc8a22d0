"""Streaming code2wav: the windowed decoder chunk by chunk against transformers (docs/pipelines.md,
"Streaming code2wav").

The references come from the export environment (``export_python``: torch 2.13 CPU and
transformers), run against this tree's ``src``: ``Qwen3OmniMoeCode2Wav.chunked_decode(codes,
N, M)`` and the whole-utterance forward, on the same seeded tiny weights as the shipped
``code2wav-stream-tiny`` (N = 8, M = 50, the measured receptive field) and a second window
with a short context (M = 6). The stream runs through ``xstage.integrations.stream`` on a
real stage on ``ort-cpu``, ``ort-openvino`` and ``torch-cpu`` (a ``.pt2`` of the same window).

The bound: every chunk, the first and the last included, within ``BOUND`` = 1e-5 of
``chunked_decode`` (fp32's noise tier, the measured reorder bound of the numeric gate; the
audio is clamped to [-1, 1]). Measured here: at most 2.2e-6 (ort-cpu), 1.8e-6 (ort-openvino),
1.0e-6 (torch-cpu).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import runcache

import xstage
from xstage import errors
from xstage.builtin_graphs import builtin_artifact
from xstage.integrations.stream import StreamBroken, astream, stream, stream_spec

REPO = Path(__file__).resolve().parents[2]
BOUND = 1e-5
#: first chunk (no context), a partial context (8, 16, ... < 50), full contexts, a 3-frame tail
FRAMES = 75

_REFERENCE = r"""
import json, sys, numpy as np, torch
from xstage.export.code2wav import build_model, measure_receptive_field, _make_window_class, _decode
out, frames = sys.argv[1], int(sys.argv[2])
model, _ = build_model("tiny", 0, "onnx:fp32")
cfg, spf = model.config, int(model.total_upsample)
g = torch.Generator().manual_seed(7)
codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames), generator=g)
arrays = {"codes": codes.numpy()}
with torch.no_grad():
    arrays["full"] = model(codes).float().numpy()
    for left in (50, 6):
        arrays[f"chunked_{left}"] = model.chunked_decode(codes, 8, left).float().numpy()
    # absent frames are absent: their content never reaches the audio (bitwise)
    window = _make_window_class()(model, 8, 50).eval()
    ctx = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 50), generator=g)
    noisy = ctx.clone()
    noisy[..., :30] = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 30), generator=g)
    a = window(codes[..., :8], ctx, torch.tensor([20]))[0]
    b = window(codes[..., :8], noisy, torch.tensor([20]))[0]
    absent_diff = float((a - b).abs().max())
    # the receptive field, measured again on the whole model from the codes (float64, no clamp)
    m = model.double()
    at = 20
    other = codes.clone()
    other[0, 0, at] = (other[0, 0, at] + 1) % cfg.codebook_size
    def run(c):
        h = m.code_embedding(c + m.code_offset).mean(1)
        return _decode(m, m.pre_transformer(inputs_embeds=h).last_hidden_state.permute(0, 2, 1))
    hit = torch.nonzero((run(codes) - run(other)).abs()[0, 0] > 0).flatten()
np.savez(out + ".npz", **arrays)
field = measure_receptive_field(build_model("tiny", 0, "onnx:fp32")[0])
json.dump({"absent_diff": absent_diff, "field": field, "spf": spf,
           "whole_last_frame": int(hit.max()) // spf - at, "whole_first": at * spf - int(hit.min())},
          open(out + ".json", "w"))
"""


def _export(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "xstage", "export", "code2wav", *args],
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src")))


@pytest.fixture(scope="module")
def made(export_python, tmp_path_factory) -> dict:
    """The references, a .pt2 of the shipped window and an ONNX window of M = 6."""
    root = tmp_path_factory.mktemp("stream")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    # Each command is kept in the test cache while its code and inputs are unchanged
    # (tests/runcache.py: a change to the exporter runs it again).
    done = runcache.run(export_python, ["-c", _REFERENCE, "{out}/ref", str(FRAMES)], root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = {"ref": dict(np.load(root / "ref.npz")), **json.loads((root / "ref.json").read_text())}
    for name, args in (("pt", ["--left-context", "50", "--format", "pt:fp32"]),
                       ("short", ["--left-context", "6"])):
        done = runcache.run(export_python, ["-m", "xstage", "export", "code2wav", "--config", "tiny",
                                            "--chunk", "8", *args, "--out", "{out}/c2w",
                                            "--json", "{out}/report.json"], root / name, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        out[name] = json.loads((root / name / "report.json").read_text())[-1]
    return out


@pytest.fixture
def routes_env(monkeypatch, export_python, openvino_python):
    monkeypatch.setenv("XSTAGE_PYTHON_TORCH_CPU", str(export_python))
    monkeypatch.setenv("XSTAGE_PYTHON_ORT_OPENVINO", str(openvino_python))


def _graph(made: dict, route: str, name: str = "shipped") -> str:
    if name == "short":
        return made["short"]["path"]
    return made["pt"]["path"] if route == "torch-cpu" else str(builtin_artifact("code2wav-stream-tiny"))


def _pieces(codes: np.ndarray, step: int = 3) -> list[np.ndarray]:
    """A talker's frames, 3 at a time: chunks never line up with what arrives."""
    return [codes[0, :, i:i + step] for i in range(0, codes.shape[-1], step)]


def _split(reference: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    return np.split(reference.reshape(-1), np.cumsum(lengths)[:-1])


def test_the_export_checks_itself_and_states_its_receptive_field(made):
    for report in (made["pt"], made["short"]):
        assert report["wrapper"]["bitwise_equal"]  # a full-context window is the model's forward
        assert report["stream"]["max_abs"] < BOUND and report["stream"]["chunks"] >= 3
    field = made["field"]
    # measured in halves (attention, convolutions) = measured on the whole model from the codes
    assert field["frames"] == made["whole_last_frame"] == 50
    assert (field["attention_frames"], field["convolution_frames"]) == (14, 36)
    assert field["causal"] and field["samples_before_frame"] == made["whole_first"] == 6
    assert made["absent_diff"] == 0.0  # frames not received never reach the audio
    spec = json.loads(Path(made["short"]["manifest"]).read_text())
    assert spec["stream"]["lookahead_samples"] == 6 and spec["stream"]["samples_per_frame"] == 8
    assert [p["input"] for p in spec["state"]] == ["context", "context_len"]


@pytest.mark.parametrize("route", ["ort-cpu", "ort-openvino", "torch-cpu"])
def test_the_stream_matches_chunked_decode_on_every_chunk(made, routes_env, route):
    ref = made["ref"]
    with xstage.open_stage(_graph(made, route), route=route, record_on_close=False) as stage:
        assert stage.proof.verdict == "placed"
        chunks = list(stream(stage, _pieces(ref["codes"])))
        again = asyncio.run(_collect(stage, ref["codes"]))
    # 9 whole chunks and a tail of 3 frames: 8*8-6 samples each, 3*8-6 for the tail
    assert [len(c) for c in chunks] == [58] * 9 + [18]
    expected = _split(ref["chunked_50"], [len(c) for c in chunks])
    diffs = [float(np.abs(a - b).max()) for a, b in zip(chunks, expected, strict=True)]
    assert max(diffs) <= BOUND, diffs  # the first (no context) and the last (padded) included
    # M = 50 covers the measured receptive field: the whole-utterance decode, on this route too
    assert max(_vs_full(chunks, ref["full"])) <= BOUND
    assert all(np.array_equal(a, b) for a, b in zip(chunks, again, strict=True))  # async = sync


async def _collect(stage, codes):
    async def talker():
        for piece in _pieces(codes, step=5):
            await asyncio.sleep(0)
            yield piece
    return [c async for c in astream(stage, talker())]


def _vs_full(chunks: list[np.ndarray], full: np.ndarray) -> list[float]:
    """Each chunk against the whole-utterance decode at the same samples (a chunk starts on its
    first frame's sample; chunked_decode leaves the last 6 of each out)."""
    flat = full.reshape(-1)
    return [float(np.abs(c - flat[i * 8 * 8:i * 8 * 8 + len(c)]).max()) for i, c in enumerate(chunks)]


@pytest.mark.parametrize(("name", "left"), [("shipped", 50), ("short", 6)])
def test_the_stream_against_the_full_decode(made, name, left):
    ref = made["ref"]
    with xstage.open_stage(_graph(made, "ort-cpu", name), route="ort-cpu",
                           record_on_close=False) as stage:
        assert stream_spec(stage).left_context == left
        chunks = list(stream(stage, _pieces(ref["codes"])))
    diffs = _vs_full(chunks, ref["full"])
    assert diffs[0] <= BOUND  # the first chunk has the utterance's own start as its context
    if left >= made["field"]["frames"]:
        assert max(diffs) <= BOUND, diffs  # M covers the receptive field
    else:
        assert BOUND < max(diffs) <= 2.0, diffs  # bounded (audio in [-1, 1]), not within BOUND
        expected = _split(ref[f"chunked_{left}"], [len(c) for c in chunks])
        assert max(float(np.abs(a - b).max()) for a, b in zip(chunks, expected, strict=True)) <= BOUND


def test_a_stage_that_is_not_a_window_is_a_usage_error():
    with xstage.open_stage(str(builtin_artifact("code2wav-tiny")), route="ort-cpu",
                           record_on_close=False) as stage:
        with pytest.raises(errors.UsageError, match="is not a streaming window") as exc:
            list(stream(stage, []))
    assert "--chunk N --left-context M" in exc.value.remedy


def test_a_piece_of_another_shape_is_an_input_error():
    with xstage.open_stage(str(builtin_artifact("code2wav-stream-tiny")), route="ort-cpu",
                           record_on_close=False) as stage:
        out = stream(stage, [np.zeros((4, 5), np.int64), np.zeros((3, 2), np.int64)])
        with pytest.raises(errors.InputError) as exc:
            list(out)
    assert str(exc.value) == ("piece 1 of the stream is int64[3, 2]; the stage takes integer "
                              "codes [4, frames] (or [1, 4, frames])")


def test_a_stream_whose_context_was_lost_ends_instead_of_yielding_audio_without_it():
    codes = np.random.default_rng(0).integers(0, 16, (4, 40))
    with xstage.open_stage(str(builtin_artifact("code2wav-stream-tiny")), route="ort-cpu",
                           record_on_close=False) as stage:
        out = stream(stage, _pieces(codes[None], step=8))
        assert len(next(out)) == 58
        stage.reset_state()  # as a restarted worker does: the next call runs from zero context
        with pytest.raises(StreamBroken) as exc:
            next(out)
    assert str(exc.value) == ("chunk 1 of the stream ran from the initial state (the stage's "
                              "state was reset or its worker restarted): the utterance's context "
                              "is gone")


def test_a_worker_killed_mid_stream_never_yields_audio_without_its_context():
    codes = np.random.default_rng(0).integers(0, 16, (4, 40))
    with xstage.open_stage(str(builtin_artifact("code2wav-stream-tiny")), route="ort-cpu",
                           restart="on_death", record_on_close=False) as stage:
        out = stream(stage, _pieces(codes[None], step=8))
        assert len(next(out)) == 58
        os.kill(stage.worker_pid, signal.SIGKILL)
        # the call finds it dead (WorkerDied), or is served by generation 2 from zero context
        with pytest.raises((StreamBroken, errors.WorkerDied)):
            next(out)


@pytest.mark.parametrize(("args", "message"), [
    (["--chunk", "8", "--frames", "50"], "--frames and --chunk are two kinds of export"),
    (["--left-context", "4"], "--left-context applies to a streaming window"),
    (["--chunk", "8", "--left-context", "0"], "both must be >= 1"),
])
def test_bad_stream_options_are_usage_errors(export_python, tmp_path, args, message):
    done = _export(export_python, "--config", "tiny", *args, "--out", str(tmp_path / "c"))
    assert done.returncode == 64, done.stderr[-1000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


def test_the_example_writes_a_labelled_wav(tmp_path):
    out = tmp_path / "stream.wav"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "code2wav_stream.py"),
                           "--seconds", "0.05", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RANDOM WEIGHTS" in done.stdout and b"ICMT" in out.read_bytes()
    assert b"RANDOM WEIGHTS" in out.read_bytes()  # the label travels in the file's INFO chunk
    with wave.open(str(out)) as w:  # and the file still reads as a plain WAV
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (24000, 1, 1086)
