#!/usr/bin/env python3
"""Render the OCR page's sample images and the tests' images with Pillow (host side).

    python demos/ocr/make_samples.py          # -> demos/ocr/samples/*.png (committed)

``render(lines, ...)`` draws text lines (font, size, colour, angle per line) on a plain
background; the tests build their images with it too.
"""
from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
FONTS = {
    "sans": "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "serif": "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "mono": "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "bold": "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "cjk": "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
}


def render(lines, size=(640, 400), background=(255, 255, 255)):
    """A Pillow RGB image with ``lines``: dicts {text, xy, font, px, colour, angle}."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, background)
    for ln in lines:
        font = ImageFont.truetype(FONTS[ln.get("font", "sans")], ln.get("px", 28))
        colour = tuple(ln.get("colour", (0, 0, 0)))
        angle = ln.get("angle", 0)
        if not angle:
            ImageDraw.Draw(img).text(ln["xy"], ln["text"], font=font, fill=colour)
            continue
        l, t, r, b = font.getbbox(ln["text"])
        layer = Image.new("RGBA", (r + 20, b + 20), (0, 0, 0, 0))
        ImageDraw.Draw(layer).text((10, 10), ln["text"], font=font, fill=colour + (255,))
        layer = layer.rotate(angle, expand=True, resample=Image.BICUBIC)
        img.paste(layer, ln["xy"], layer)
    return img


SAMPLES = {
    "receipt.png": dict(size=(560, 420), lines=[
        {"text": "CORNER BAKERY", "xy": (150, 20), "font": "bold", "px": 34},
        {"text": "12 Market Street", "xy": (170, 70), "px": 22, "colour": (60, 60, 60)},
        {"text": "Sourdough loaf    4.50", "xy": (60, 130), "font": "mono", "px": 24},
        {"text": "Croissant x2      5.20", "xy": (60, 175), "font": "mono", "px": 24},
        {"text": "Coffee            2.80", "xy": (60, 220), "font": "mono", "px": 24},
        {"text": "TOTAL            12.50", "xy": (60, 280), "font": "mono", "px": 26},
        {"text": "Thank you, come again!", "xy": (110, 350), "font": "serif", "px": 24,
         "colour": (30, 60, 140)},
    ]),
    "chinese.png": dict(size=(520, 300), lines=[
        {"text": "欢迎使用文字识别", "xy": (60, 30), "font": "cjk", "px": 40},
        {"text": "今天天气很好", "xy": (60, 110), "font": "cjk", "px": 32, "colour": (150, 20, 20)},
        {"text": "OCR 演示 2026", "xy": (60, 190), "font": "cjk", "px": 32, "colour": (20, 80, 20)},
    ]),
    "tilted.png": dict(size=(600, 360), background=(245, 240, 225), lines=[
        {"text": "Slightly tilted text", "xy": (40, 40), "px": 34, "angle": 5},
        {"text": "reads fine too", "xy": (80, 160), "font": "serif", "px": 36, "angle": -4,
         "colour": (90, 20, 90)},
        {"text": "ember + PP-OCRv4", "xy": (200, 270), "font": "bold", "px": 30},
    ]),
}


def main():
    out = HERE / "samples"
    out.mkdir(exist_ok=True)
    for name, spec in SAMPLES.items():
        img = render(spec["lines"], spec["size"], spec.get("background", (255, 255, 255)))
        img.save(out / name, optimize=True)
        print(f"wrote {out / name} ({os.path.getsize(out / name)} bytes)")


if __name__ == "__main__":
    main()
