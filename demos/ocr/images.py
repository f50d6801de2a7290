"""Images for the OCR pipeline: ``Image`` (RGB bytes), decoding PNG in pure Python and JPEG
(and anything else) through Pillow when it is installed. In the page the browser decodes and
hands over RGBA pixels (``from_rgba``).

>>> img = Image(2, 1, bytes([255, 0, 0, 0, 0, 255]))
>>> decode(encode_png(img)).data == img.data
True
"""
from __future__ import annotations

import struct
import zlib

MAX_PIXELS = 50_000_000        # refuse images larger than this (width x height)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class ImageError(ValueError):
    """The bytes are not an image this pipeline can read (the message says why)."""


class Image:
    """``width`` x ``height`` pixels, ``data`` = RGB bytes, row major."""

    def __init__(self, width: int, height: int, data: bytes):
        if width <= 0 or height <= 0:
            raise ImageError(f"image of {width}x{height} pixels: nothing to read")
        if len(data) != 3 * width * height:
            raise ImageError(f"image data of {len(data)} bytes does not fit {width}x{height} RGB")
        self.width, self.height, self.data = width, height, bytes(data)

    def padded(self, top: int) -> "Image":
        """The image with ``top`` black rows above and below."""
        pad = bytes(3 * self.width * top)
        return Image(self.width, self.height + 2 * top, pad + self.data + pad)

    def __repr__(self):
        return f"<Image {self.width}x{self.height}>"


def _check_size(w: int, h: int) -> None:
    if w <= 0 or h <= 0:
        raise ImageError(f"image of {w}x{h} pixels: nothing to read")
    if w * h > MAX_PIXELS:
        raise ImageError(f"image of {w}x{h} pixels is too large (at most {MAX_PIXELS // 1_000_000} megapixels)")


def from_rgba(width: int, height: int, rgba) -> Image:
    """An ``Image`` from RGBA bytes (what a canvas gives), composited over white."""
    _check_size(width, height)
    rgba = bytes(rgba)
    if len(rgba) != 4 * width * height:
        raise ImageError(f"{len(rgba)} bytes of RGBA do not fit {width}x{height}")
    alpha = rgba[3::4]
    if alpha.count(255) == len(alpha):            # opaque: just drop alpha
        out = bytearray(3 * width * height)
        out[0::3], out[1::3], out[2::3] = rgba[0::4], rgba[1::4], rgba[2::4]
        return Image(width, height, bytes(out))
    return Image(width, height, _over_white(rgba, 4))


def _over_white(px: bytes, step: int) -> bytes:
    out = bytearray()
    for i in range(0, len(px), step):
        a = px[i + step - 1]
        if step == 4:
            r, g, b = px[i], px[i + 1], px[i + 2]
        else:
            r = g = b = px[i]
        out += bytes(((c * a + 255 * (255 - a) + 127) // 255) for c in (r, g, b))
    return bytes(out)


def decode(data) -> Image:
    """Decode PNG or JPEG bytes (PNG in pure Python when Pillow is missing)."""
    data = bytes(data)
    if not data:
        raise ImageError("the file is empty")
    if data.startswith(PNG_SIGNATURE):
        try:
            return _pillow(data)
        except ImportError:
            return decode_png(data)
    if data.startswith(b"\xff\xd8"):
        try:
            return _pillow(data)
        except ImportError:
            raise ImageError("JPEG needs Pillow here (pip install Pillow); PNG works without it") from None
    raise ImageError("not a PNG or JPEG file")


def _pillow(data: bytes) -> Image:
    from PIL import Image as PILImage
    import io
    try:
        im = PILImage.open(io.BytesIO(data))
        _check_size(*im.size)
        im.load()
    except ImageError:
        raise
    except Exception as e:     # truncated or corrupt
        raise ImageError(f"cannot decode the image: {e}") from None
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA")
        return from_rgba(im.width, im.height, im.tobytes())
    im = im.convert("RGB")
    return Image(im.width, im.height, im.tobytes())


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> Image:
    """A small pure-Python PNG decoder: 8-bit greyscale, grey+alpha, RGB, RGBA and palette
    images (16-bit ones keep their high byte), not interlaced."""
    if not data.startswith(PNG_SIGNATURE):
        raise ImageError("not a PNG file")
    pos, idat, palette, trns, hdr = 8, [], None, None, None
    while True:
        if pos + 8 > len(data):
            raise ImageError("truncated PNG file (no IEND chunk)")
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if len(body) != n:
            raise ImageError("truncated PNG file")
        pos += 12 + n
        if tag == b"IHDR":
            if n != 13:
                raise ImageError("corrupt PNG header")
            hdr = struct.unpack(">IIBBBBB", body)
            _check_size(hdr[0], hdr[1])          # before reading any pixel data
        elif tag == b"PLTE":
            palette = body
        elif tag == b"tRNS":
            trns = body
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if hdr is None:
        raise ImageError("PNG without IHDR")
    w, h, depth, ctype, _, _, interlace = hdr
    _check_size(w, h)
    if interlace:
        raise ImageError("interlaced PNG needs Pillow here")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype)
    if channels is None or depth not in (8, 16) and not (ctype == 3 and depth == 8):
        raise ImageError(f"PNG colour type {ctype} at {depth} bits is not supported without Pillow")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise ImageError(f"corrupt PNG data: {e}") from None
    bpp = channels * depth // 8
    stride = w * bpp
    if len(raw) < h * (stride + 1):
        raise ImageError("truncated PNG image data")
    out = bytearray(h * stride)
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                ul = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], ul)) & 255
        elif f != 0:
            raise ImageError(f"corrupt PNG: filter type {f}")
        out[y * stride:(y + 1) * stride] = line
        prev = line
    px = bytes(out)
    if depth == 16:
        px = px[0::2]
    n = w * h
    if ctype == 2:
        return Image(w, h, px)
    if ctype == 0:
        rgb = bytearray(3 * n)
        rgb[0::3] = rgb[1::3] = rgb[2::3] = px
        return Image(w, h, bytes(rgb))
    if ctype == 6:
        return from_rgba(w, h, px)
    if ctype == 4:
        return Image(w, h, _over_white(px, 2))
    if palette is None:
        raise ImageError("palette PNG without PLTE")
    rgba = bytearray()
    for k in px:
        a = trns[k] if trns and k < len(trns) else 255
        rgba += palette[3 * k:3 * k + 3] + bytes([a])
    return from_rgba(w, h, bytes(rgba))


def encode_png(img: Image) -> bytes:
    """An RGB PNG of ``img`` (no filtering; for tests and samples)."""
    rows = b"".join(b"\x00" + img.data[y * 3 * img.width:(y + 1) * 3 * img.width] for y in range(img.height))

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    return (PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", img.width, img.height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))
