"""Full-size streaming code2wav: first-audio latency and real-time factor per route.

transformers' default ``Qwen3OmniMoeCode2WavConfig()`` (216 M parameters, 1920 samples per
frame at 24 kHz) with random weights (seeded, perturbed: the exporter's), exported as a
streaming window (``xstage export code2wav --chunk N --left-context M``, ONNX and ``.pt2``),
opened on each route, and fed random codes frame by frame through
``xstage.integrations.stream``. Beside it, in this process, transformers' own
``chunked_decode(codes, N, M)`` on the same weights: the reference for the audio (max |diff|
per route) and the in-process baseline for the times.

Figures, per route: admission (open_stage: load, profiled warm-up, proof, gate), the first
chunk's decode (the audio's first latency once its N frames are in; a talker at 12.5 frames
per second adds N / 12.5 s before that), the median chunk, and the real-time factor (decode
time over audio time: below 1 keeps up). Run it with the export venv (torch, transformers,
onnxruntime), one command:

    XSTAGE_PYTHON_ORT_OPENVINO=<ort-openvino env python> PYTHONPATH=src \\
        .test-cache/export/venv/bin/python scripts/code2wav_stream.py \\
        [--chunk 25] [--left-context 25] [--seconds 6] [--routes ort-cpu,ort-openvino,torch-cpu]

It ends by running ``examples/code2wav_stream.py`` on the ONNX window (``--wav PATH``): a WAV of
random-weight output, labelled so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import xstage
from xstage.cli.external import parse_tolerance
from xstage.export.code2wav import build_model, export_code2wav
from xstage.integrations.stream import stream, stream_spec

REPO = Path(__file__).resolve().parents[1]


def _export(out: Path, chunk: int, left: int) -> dict[str, Path]:
    """The ONNX and .pt2 windows, exported once per (chunk, left context) into ``out``."""
    config = out / "full.json"
    config.write_text("{}\n")  # every field at transformers' default
    paths = {}
    for fmt, sub in (("onnx:fp32", "onnx"), ("pt:fp32", "pt")):
        target = out / sub / f"code2wav-{chunk}-{left}"
        path = target.with_suffix(".onnx" if sub == "onnx" else ".pt2")
        if not path.exists():
            t0 = time.perf_counter()
            report = export_code2wav(target, config=str(config), fmt=fmt, chunk=chunk,
                                     left_context=left)
            print(f"exported {path.name} in {time.perf_counter() - t0:.0f} s: stream vs "
                  f"chunked_decode {report['stream']['max_abs']:.2g}, receptive field "
                  f"{report['receptive_field']['frames']} frames "
                  f"({report['receptive_field']['attention_frames']} attention + "
                  f"{report['receptive_field']['convolution_frames']} convolutions)", flush=True)
        paths[sub] = path
    return paths


def _baseline(config: Path, codes: np.ndarray, chunk: int, left: int) -> tuple[np.ndarray, dict]:
    """transformers' chunked_decode in this process: its audio and its times."""
    model, _ = build_model(str(config), 0, "onnx:fp32")
    t = torch.from_numpy(codes)[None]
    times = []
    with torch.no_grad():
        for start in range(0, t.shape[-1], chunk):  # chunked_decode's loop, timed per chunk
            ctx = left if start - left > 0 else start
            t0 = time.perf_counter()
            model(t[..., start - ctx:start + chunk])
            times.append(time.perf_counter() - t0)
        audio = model.chunked_decode(t, chunk, left)[0, 0].float().numpy()
    return audio, {"first_s": times[0], "chunks_s": times}


def _route(graph: Path, route: str, codes: np.ndarray, reference: np.ndarray,
           tolerance: object) -> dict:
    t0 = time.perf_counter()
    with xstage.open_stage(str(graph), route=route, record_on_close=False,
                           tolerance=tolerance) as stage:
        admitted = time.perf_counter() - t0
        spec = stream_spec(stage)
        chunks, times = [], []
        last = time.perf_counter()
        for audio in stream(stage, (codes[:, i:i + 1] for i in range(codes.shape[1]))):
            now = time.perf_counter()
            times.append(now - last)
            chunks.append(audio)
            last = now
        verdict, device, gate = stage.proof.verdict, stage.device, stage.parity.verdict
    audio = np.concatenate(chunks)
    return {"route": route, "device": device, "proof": verdict, "gate": gate,
            "admission_s": admitted, "first_s": times[0], "chunks_s": times,
            "audio_s": len(audio) / (spec.sample_rate or 24000),
            "max_abs_vs_chunked_decode": float(np.abs(audio - reference).max())}


def _row(name: str, r: dict, chunk_audio_s: float, chunk: int) -> str:
    med = statistics.median(r["chunks_s"])
    rtf = sum(r["chunks_s"]) / r["audio_s"]
    adm = f"{r['admission_s']:.0f} s" if "admission_s" in r else "—"
    diff = f"{r['max_abs_vs_chunked_decode']:.1e}" if "max_abs_vs_chunked_decode" in r else "(reference)"
    return (f"| {name} | {adm} | {r['first_s']:.2f} s | {chunk / 12.5 + r['first_s']:.2f} s | "
            f"{med:.2f} s ({med / chunk_audio_s:.2f}×) | {rtf:.2f} | {diff} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--left-context", type=int, default=25)
    p.add_argument("--seconds", type=float, default=6.0, help="audio per route (default 6)")
    p.add_argument("--routes", default="ort-cpu,ort-openvino,torch-cpu")
    p.add_argument("--tolerance", default=None, metavar="KEY=V,...",
                   help="the gate's criteria, as xstage external's --tolerance (default: the "
                   "format's); the table says when it was given")
    p.add_argument("--out", default="/tmp/xstage-code2wav-stream", help="exports and results")
    p.add_argument("--wav", default="code2wav-full-random-weights.wav",
                   help="the example's WAV ('' to skip)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XSTAGE_PYTHON_TORCH_CPU", sys.executable)
    paths = _export(out, args.chunk, args.left_context)
    tolerance = parse_tolerance(args.tolerance)
    frames = round(args.seconds * 12.5)
    codes = np.random.default_rng(1).integers(0, 2048, (16, frames))
    reference, base = _baseline(out / "full.json", codes, args.chunk, args.left_context)
    base["audio_s"] = len(reference) / 24000
    results = [{"route": "transformers in-process", **base}]
    for route in [r for r in args.routes.split(",") if r]:
        graph = paths["pt"] if route.startswith("torch") else paths["onnx"]
        try:
            results.append(_route(graph, route, codes, reference, tolerance))
        except xstage.Refused as exc:  # a refusal is a result: print it, go on
            print(f"{route}: refused: {exc}", flush=True)
    lookahead = json.loads(paths["onnx"].with_suffix(".manifest.json").read_text())["stream"][
        "lookahead_samples"]
    chunk_audio_s = (args.chunk * 1920 - lookahead) / 24000
    print(f"\nchunk {args.chunk} frames ({chunk_audio_s:.3f} s of audio), left context "
          f"{args.left_context}, {frames} frames ({len(reference) / 24000:.2f} s); gate tolerance "
          f"{args.tolerance or 'default'}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    print("| route | admission | first chunk decoded | first audio, talker at 12.5 Hz | median chunk "
          "(× its audio) | real-time factor | max abs vs chunked_decode |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(_row(r["route"], r, chunk_audio_s, args.chunk))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.wav:
        subprocess.run([sys.executable, str(REPO / "examples" / "code2wav_stream.py"), "--graph",
                        str(paths["onnx"]), "--seconds", "1", "--out", args.wav], check=True)


if __name__ == "__main__":
    main()
