"""``xstage quantize IN.onnx OUT.onnx --scheme a16w8|a8w8 (--calibration DIR | --calibration-synthetic N)``.

onnxruntime's own static QDQ quantization: weights QInt8; activations QUInt16 for a16w8 (opset
>= 21; an older graph is converted first), QUInt8 for a8w8 (onnx:a8w8: the CPU EP and OpenVINO
run it; the XDNA2 NPU declines it, so its route refuses it by name). DIR holds one .npz per
sample keyed by the input names.
The output goes beside its fp32 source, with a manifest naming that source (so `xstage
external` gates the quantized graph against it), the calibration set (count, digest,
source) and the error against fp32 on onnxruntime's CPU EP.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from xstage.cli._flags import add_input_flags, add_json_flag, resolve_out
from xstage.cli._output import Output
from xstage.exit_codes import EXIT_OK
from xstage.inputs import parse_dims, parse_shapes

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="A16W8 or A8W8 static quantization (onnxruntime's, QDQ)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="IN.onnx")
    p.add_argument("dst", metavar="OUT.onnx",
                   help="the quantized graph: a .onnx file beside IN.onnx, or that folder")
    p.add_argument("--scheme", choices=["a16w8", "a8w8"], required=True,
                   help="a16w8: 16-bit activations (the NPU's format); a8w8: 8-bit activations")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--calibration", metavar="DIR", help="one .npz per sample")
    src.add_argument("--calibration-synthetic", type=int, metavar="N",
                     help="N synthesized samples (a stand-in, not real data)")
    add_input_flags(p, npz_help=None)  # samples come from --calibration instead
    add_json_flag(p, "the report", files=("src", "dst", "calibration"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: Output) -> int:
    from xstage.export.quantize import quantize

    dst = resolve_out("OUT.onnx", args.dst, suffixes=(".onnx",),
                      name=f"{Path(args.src).stem}-{args.scheme}.onnx")
    with out.progress("quantizing (calibration, then the error against fp32)"):
        report = quantize(args.src, dst, scheme=args.scheme, calibration=args.calibration,
                          synthetic=args.calibration_synthetic, shapes=parse_shapes(args.shape),
                          dims=parse_dims(args.dim))
    out.emit(report)
    calib = report["calibration"]
    if report["converted_from_opset"]:
        out.result(f"converted opset {report['converted_from_opset']} first")
    out.result(f"calibrated on {calib['count']} {calib['source']['kind']} samples "
               f"(sha256 {calib['sha256'][:12]})")
    out.result(f"vs fp32 on onnxruntime's CPU EP: {escape(report['parity']['summary'])}")
    out.result(f"wrote {escape(report['output'])} and {escape(report['manifest'])}")
    return EXIT_OK
