"""A PNG writer in pure Python (``zlib`` + ``struct``): 8-bit grayscale or RGB, no filtering.

>>> data = encode_png([0, 255, 255, 0], 2, 2)
>>> data[:8] == b"\\x89PNG\\r\\n\\x1a\\n", data[16:24] == (2).to_bytes(4, "big") * 2
(True, True)
"""
from __future__ import annotations

import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(pixels, width: int, height: int, channels: int = 1) -> bytes:
    """PNG bytes of ``pixels`` (``width * height * channels`` values 0..255, row major;
    ``channels`` 1 = gray, 3 = RGB)."""
    if channels not in (1, 3):
        raise ValueError(f"encode_png: channels must be 1 or 3, got {channels}")
    px = bytes(max(0, min(255, int(v))) for v in pixels)
    stride = width * channels
    if len(px) != stride * height:
        raise ValueError(f"encode_png: {len(px)} values for {width}x{height}x{channels}")
    raw = b"".join(b"\x00" + px[y * stride:(y + 1) * stride] for y in range(height))   # filter 0 per row
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0 if channels == 1 else 2, 0, 0, 0)
    return SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def image_grid(images, rows: int, cols: int, side: int = 28, border: int = 2, background: int = 0) -> tuple:
    """Tile ``rows * cols`` square gray images (lists of ``side * side`` values 0..255) into one
    image with a ``border``; returns ``(pixels, width, height)``."""
    cell = side + border
    w, h = cols * cell + border, rows * cell + border
    out = bytearray([background]) * (w * h)
    for k, img in enumerate(images[:rows * cols]):
        r, c = divmod(k, cols)
        y0, x0 = border + r * cell, border + c * cell
        for y in range(side):
            out[(y0 + y) * w + x0:(y0 + y) * w + x0 + side] = bytes(int(v) for v in img[y * side:(y + 1) * side])
    return bytes(out), w, h
