"""The ``ember`` command line (also ``python -m ember``).

    ember import model.onnx -o OUTDIR [--name NAME] [--shape input=1,3,224,224] [--quiet]

writes ``OUTDIR/model.py`` (a readable ember ``nn.Module``, its class named after the model file)
and ``OUTDIR/model.safetensors``; ``--name NAME`` writes ``OUTDIR/NAME.py`` and
``OUTDIR/NAME.safetensors`` with a class named after NAME.
"""
from __future__ import annotations

import argparse
import os
import sys


def _shape(text: str):
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--shape wants NAME=D1,D2,..., got {text!r}")
    try:
        return name, tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: dimensions must be integers") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ember", description="ember command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import", help="turn an ONNX model into an ember nn.Module + safetensors weights")
    imp.add_argument("model", help="path of the .onnx file")
    imp.add_argument("-o", "--out", required=True, help="output folder")
    imp.add_argument("--name", help="module and class name (default: files out/model.py and out/model.safetensors, class named after the model file)")
    imp.add_argument("--shape", action="append", type=_shape, default=[],
                     help="fix an input's shape, e.g. --shape image=1,3,224,224 (repeatable)")
    imp.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    if args.cmd == "import":
        from .errors import EmberError
        from .onnx.codegen import generate

        try:
            stem = os.path.splitext(os.path.basename(str(args.model)))[0] or "model"
            r = generate(args.model, args.out, name=args.name or "model", input_shapes=dict(args.shape),
                         progress=not args.quiet, class_name=args.name or stem)
        except EmberError as e:
            print(f"ember import: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {r['module']} (class {r['class']}, {r['nodes']} lines) and {r['weights']}")
        if r["generic"] and not args.shape:
            print(f"ember import: {r['generic']} line(s) read sizes at run time because the model's input "
                  f"shapes are symbolic; --shape NAME=D1,D2,... gives fixed, plainer code", file=sys.stderr)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
