"""``xstage export vision-tower|code2wav``: artifacts device runtimes accept, with a manifest.

Needs the export extra (torch, transformers >= 5.24): ``pip install -e '.[export]'``. Each
export checks that its wrapper reproduces the model's own forward bitwise, sanitizes ONNX
(every site in the manifest), and writes ``<out file>.manifest.json``. An fp16 ONNX export also
writes its fp32 source beside it (``<out>-fp32.onnx``), so ``xstage external`` gates it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from xstage import errors
from xstage.artifact import runtime_of
from xstage.cli._flags import add_json_flag, resolve_out
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK

__all__ = ["register"]

_FORMATS = ("onnx:fp32", "onnx:fp16", "pt:fp32", "pt:fp16")


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.lower().partition("x")
    try:
        return int(h), int(w or h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or HxW") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model component (needs the export extra)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_subparsers(dest="component", metavar="COMPONENT", required=True,
                            parser_class=type(p))
    vt = what.add_parser("vision-tower", help="the Qwen3.5 / Qwen3-VL vision tower at one size")
    vt.add_argument("--family", choices=["qwen3_5", "qwen3_vl"], default="qwen3_5")
    src = vt.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", metavar="tiny|FILE.json", help="random weights (seeded, perturbed)")
    src.add_argument("--checkpoint", metavar="DIR", help="config.json + safetensors shards")
    vt.add_argument("--image-size", type=_size, default=(64, 64), metavar="N|HxW",
                    help="multiple of 32 (patch 16 x merge 2); default 64")
    vt.add_argument("--images", type=int, default=1, metavar="N", help="images of that size")
    c2w = what.add_parser("code2wav", help="Qwen3-Omni's code2wav at a fixed number of frames")
    c2w.add_argument("--config", default="tiny", metavar="tiny|FILE.json")
    c2w.add_argument("--frames", type=int, default=None, metavar="T",
                     help="codec frames (default 325, the model's own chunk)")
    c2w.add_argument("--chunk", type=int, default=None, metavar="N",
                     help="a streaming window instead: N new frames per call, the context kept "
                     "in the worker (docs/pipelines.md)")
    c2w.add_argument("--left-context", type=int, default=None, metavar="M",
                     help="with --chunk: frames of left context (default 25, chunked_decode's)")
    for q in (vt, c2w):
        q.add_argument("--format", dest="fmt", choices=_FORMATS, default="onnx:fp32")
        q.add_argument("--opset", type=int, default=21)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--out", required=True, metavar="PATH",
                       help="the artifact: a file whose suffix names --format (.onnx, .pt2), or a "
                       "folder (the file is named after the component in it)")
        add_json_flag(q, "the export report", files=("out", "config", "checkpoint"))
        q.add_argument("--for-torch", choices=["2.4"], default=None, metavar="2.4",
                       help="pt:* only: write the .pt2 in the layout and schema torch 2.4 reads "
                       "(torch-directml pins torch 2.4.1; see docs/torch.md)")
        q.set_defaults(func=run)


def _export(args: argparse.Namespace, fmt: str, out: Path, fp32_source: str | None) -> dict[str, Any]:
    if args.component == "vision-tower":
        from xstage.export.vision_tower import export_vision_tower

        return export_vision_tower(out, family=args.family, config=args.config,
                                   checkpoint=args.checkpoint, image_size=args.image_size,
                                   images=args.images, fmt=fmt, opset=args.opset, seed=args.seed,
                                   fp32_source=fp32_source, for_torch=args.for_torch)
    from xstage.export.code2wav import DEFAULT_FRAMES, DEFAULT_LEFT_CONTEXT, export_code2wav

    left = DEFAULT_LEFT_CONTEXT if args.left_context is None else args.left_context
    frames = DEFAULT_FRAMES if args.frames is None else args.frames
    return export_code2wav(out, config=args.config, frames=frames, fmt=fmt, opset=args.opset,
                           seed=args.seed, fp32_source=fp32_source,
                           for_torch=args.for_torch, chunk=args.chunk, left_context=left)


def _target(args: argparse.Namespace) -> Path:
    """``--out`` as a file of ``--format``'s suffix (``resolve_out``), checked before any work.

    Raises:
        UsageError: a suffix that is not the format's, or a missing folder.
    """
    suffix = ".pt2" if runtime_of(args.fmt) == "torch" else ".onnx"
    other = ".onnx" if suffix == ".pt2" else ".pt2"
    if Path(args.out).suffix.lower() == other:
        raise errors.UsageError(f"--out {args.out} ends in {other}, but --format {args.fmt} writes "
                                f"a {suffix}", remedy=f"end --out in {suffix}, or change --format")
    return resolve_out("--out", args.out, suffixes=(suffix,), name=args.component.replace("-", "_") + suffix)


def run(args: argparse.Namespace, out: Output) -> int:
    if args.for_torch and runtime_of(args.fmt) != "torch":
        raise errors.UsageError(f"--for-torch applies to a .pt2 (--format pt:fp32 or pt:fp16), "
                                f"not {args.fmt}", remedy="drop --for-torch, or export a pt: format")
    target = _target(args)
    if args.component == "vision-tower":
        from xstage.export.vision_tower import check_image_size  # no torch: answers at once

        check_image_size(args.image_size, config=args.config, checkpoint=args.checkpoint)
    elif args.chunk is None and args.left_context is not None:
        raise errors.UsageError("--left-context applies to a streaming window",
                                remedy="add --chunk N, or drop --left-context")
    elif args.chunk is not None and args.frames is not None:
        raise errors.UsageError("--frames and --chunk are two kinds of export: a whole utterance "
                                "of T frames, or a window of N new frames",
                                remedy="pass one of them")
    target.parent.mkdir(exist_ok=True)  # a new folder named by --out, whose parent exists
    reports = []
    fp32_source = None
    with out.progress(f"exporting {args.component}") as bar:
        if args.fmt == "onnx:fp16":
            bar.update(description="its fp32 source first")
            source = target.with_name(target.with_suffix("").name + "-fp32")
            reports.append(_export(args, "onnx:fp32", source, None))
            fp32_source = Path(reports[-1]["path"]).name
            bar.update(description=args.fmt)
        reports.append(_export(args, args.fmt, target, fp32_source))
    out.emit(reports)
    for r in reports:
        wrapper = r["wrapper"]
        if not wrapper["bitwise_equal"]:  # pragma: no cover - bitwise_check raises first
            raise errors.XstageError("wrapper mismatch")
        extra = ""
        if r.get("sanitize"):
            extra = "; sanitize " + ", ".join(f"{k} {v['applied']} applied/{v['skipped']} skipped"
                                              for k, v in r["sanitize"].items())
        out.result(f"{escape(r['path'])} ({r['format']}, {r['bytes'] / 1024:.0f} KiB, "
                   f"{r['export_s']:.1f} s): wrapper bitwise equal to the model's forward "
                   f"({wrapper['outputs']} output(s)){escape(extra)}")
        if r.get("legacy"):
            legacy = r["legacy"]
            out.result(f"  for torch {legacy['for_torch']}: schema {legacy['schema']}, the flat "
                       "archive layout; read back by this torch's deserializer bitwise equal")
        if r.get("stream"):
            check, field = r["stream"], r["receptive_field"]
            out.result(f"  stream: chunk {r['chunk']}, left context {r['left_context']}; "
                       f"{check['chunks']} chunks of {check['frames']} frames against "
                       f"chunked_decode: max |diff| {check['max_abs']:.2g}; receptive field "
                       f"{field['frames']} frames ({field['attention_frames']} attention + "
                       f"{field['convolution_frames']} convolutions), measured")
        out.result(f"  manifest {escape(r['manifest'])}")
    return EXIT_OK
