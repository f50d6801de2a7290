#!/usr/bin/env python3
"""Read the text in an image with PP-OCRv4 running on ember.

    python demos/ocr/ocr.py IMAGE [--device numpy|wasm|webgpu|python] [--json] [--timings]

Prints one line per text line: the text, its score and its box (four x,y corners, clockwise
from the top left), in reading order (top to bottom, then left to right); with ``--json`` a
JSON list of ``{"text", "score", "box": [[x, y] x4]}``. PNG and JPEG (JPEG needs Pillow; PNG is
decoded in pure Python without it). The models come from ``demos/ocr/prepare.py`` (run by
``python build.py demo|test``; it is run here when they are missing).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if os.path.join(HERE, "..", "..") and "ember" not in sys.modules:
    try:
        import ember  # noqa: F401
    except ImportError:   # running from a checkout without the package installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import images  # noqa: E402
import pipeline  # noqa: E402


def default_device() -> str:
    import ember
    return "numpy" if "numpy" in ember.devices() else "python"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ocr.py", description=__doc__.split("\n")[1])
    ap.add_argument("image", help="a PNG or JPEG file")
    ap.add_argument("--device", default=None, help="ember device: numpy (default when installed), wasm, webgpu, python")
    ap.add_argument("--json", action="store_true", help="print a JSON list of {text, score, box}")
    ap.add_argument("--timings", action="store_true", help="print the time of each stage on stderr")
    a = ap.parse_args(argv)
    try:
        with open(a.image, "rb") as f:
            data = f.read()
        img = images.decode(data)
    except (OSError, images.ImageError) as e:
        print(f"ocr.py: {a.image}: {e}", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(HERE, pipeline.REC_FILE)):
        import prepare
        prepare.prepare()
    device = a.device or default_device()
    if device == "webgpu":
        import ember.webgpu  # noqa: F401
    # eager: a single read gains nothing from recording execution plans
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # notes about the models' symbolic input sizes
        ocr = pipeline.OCR.from_folder(HERE, device=device, compile=False)
    result = ocr.read(img)
    if a.json:
        print(json.dumps(result["lines"], ensure_ascii=False))
    else:
        for ln in result["lines"]:
            box = " ".join(f"{x:g},{y:g}" for x, y in ln["box"])
            print(f"{ln['text']}\t{ln['score']:.3f}\t{box}")
    if a.timings:
        print("timings (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in result["timings"].items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
