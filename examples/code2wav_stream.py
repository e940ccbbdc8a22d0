"""Stream codec codes through code2wav on a stage and write the audio as a WAV.

The whole integration is three lines (open, stream, write):

    stage = xstage.open_stage("code2wav-stream.onnx", route="ort-cpu")  # proven, gated
    for audio in stream(stage, talker_codes()):                          # a chunk at a time
        play(audio)                                                       # first audio after N frames

By default it opens the shipped ``code2wav-stream-tiny`` (tiny config, 8 samples per frame:
the "audio" is a few milliseconds long); pass ``--graph`` a full-size window exported with
``xstage export code2wav --config full.json --chunk 25 --left-context 25`` (see
``scripts/code2wav_stream.py``) for 1920 samples per frame at 24 kHz. Either way the weights
are **random** (seeded, not trained): the WAV is noise-like and says so in its INFO comment,
its default name and this script's output. Needs only xstage (numpy, onnxruntime):

    python examples/code2wav_stream.py [--graph W.onnx] [--route ort-cpu] [--seconds 2]
"""

from __future__ import annotations

import argparse
import struct
import time
import wave
from pathlib import Path

import numpy as np

import xstage
from xstage.builtin_graphs import builtin_artifact
from xstage.integrations.stream import stream, stream_spec

LABEL = "xstage code2wav stream, RANDOM WEIGHTS (seeded, untrained): not speech"


def write_wav(path: Path, audio: np.ndarray, rate: int, comment: str) -> None:
    """16-bit mono PCM with a RIFF ``LIST/INFO`` ``ICMT`` comment (standard library only)."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    text = comment.encode("ascii") + b"\0"
    if len(text) % 2:
        text += b"\0"
    info = b"INFO" + b"ICMT" + struct.pack("<I", len(text)) + text
    with open(path, "r+b") as f:
        f.seek(0, 2)
        f.write(b"LIST" + struct.pack("<I", len(info)) + info)
        size = f.tell()
        f.seek(4)
        f.write(struct.pack("<I", size - 8))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", help="a streaming window (default: the shipped code2wav-stream-tiny)")
    p.add_argument("--route", default="ort-cpu")
    p.add_argument("--seconds", type=float, default=2.0, help="audio to decode (default 2)")
    p.add_argument("--out", default="code2wav-random-weights.wav")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    graph = args.graph or str(builtin_artifact("code2wav-stream-tiny"))
    with xstage.open_stage(graph, route=args.route, record_on_close=False) as stage:
        spec = stream_spec(stage)
        rate = spec.sample_rate or 24000
        frames = max(1, round(args.seconds * rate / spec.samples_per_frame))
        rng = np.random.default_rng(args.seed)
        codes = rng.integers(0, spec.codebook_size or 8, (spec.quantizers, frames))
        print(f"{Path(graph).name}: {stage.proof.verdict} on {stage.device} via {stage.route}; "
              f"chunk {spec.chunk} frames, left context {spec.left_context}")
        started, chunks, first = time.perf_counter(), [], None
        for audio in stream(stage, (codes[:, i:i + 1] for i in range(frames))):  # frame by frame
            first = first or time.perf_counter() - started
            chunks.append(audio)
        wall = time.perf_counter() - started
    audio = np.concatenate(chunks)
    write_wav(Path(args.out), audio, rate, LABEL)
    print(f"{len(chunks)} chunks, {len(audio)} samples ({len(audio) / rate:.3f} s at {rate} Hz); "
          f"first audio after {first * 1e3:.1f} ms, real-time factor {wall / (len(audio) / rate):.3f}")
    print(f"wrote {args.out}: {LABEL}")


if __name__ == "__main__":
    main()
