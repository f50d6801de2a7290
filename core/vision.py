"""Image classification helpers: torchvision's ImageNet preprocessing on raw pixels, and the
1,000 ImageNet class names. Pure Python on ember's ops (no numpy, no Pillow): it runs in
Pyodide, where the page's canvas decodes the image and hands over RGBA bytes (``ImageData``).

``imagenet_preprocess`` does what ``Resize(256) -> CenterCrop(224) -> ToTensor() ->
Normalize(mean, std)`` does in torchvision on a float image: the shorter side is resized to
256 with antialiased bilinear filtering (PIL's and ``F.interpolate(antialias=True)``'s
triangle filter, widened by the scale when shrinking), the centre 224 x 224 kept, pixels scaled
to [0, 1] and normalised. Only the rows and columns of the crop are resampled: a tap at a
time, as a ``take`` of whole rows (then columns) times its weights, on the tensor's device.

>>> import ember
>>> from ember import vision
>>> rgb = bytes(range(48)) * 4                       # an 8 x 8 RGB image
>>> x = vision.imagenet_preprocess(rgb, 8, 8, channels=3, resize=4, crop=2)
>>> x.shape
(1, 3, 2, 2)
>>> len(vision.imagenet_classes()), vision.imagenet_classes()[281]
(1000, 'tabby')
"""
from __future__ import annotations

from importlib import resources

import ember

from .errors import ShapeError
from .tensor import Tensor

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "imagenet_preprocess", "imagenet_classes", "resize_taps",
           "resized_size", "top_k"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_PIXELS = 100_000_000

_classes: list | None = None


def imagenet_classes() -> list:
    """The 1,000 ImageNet-1k class names in the order of the classifiers' outputs (index 281 is
    'tabby'), as torchvision names them."""
    global _classes
    if _classes is None:
        text = resources.files("ember").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
        _classes = text.splitlines()
        assert len(_classes) == 1000, "imagenet_classes.txt must hold 1000 lines"
    return list(_classes)


def resized_size(width: int, height: int, shorter: int) -> tuple:
    """``(width, height)`` after resizing the shorter side to ``shorter`` (torchvision's rule:
    the longer side is truncated, ``int(shorter * long / short)``)."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def resize_taps(in_size: int, out_size: int, start: int = 0, count: int | None = None) -> list:
    """For the outputs ``start .. start + count`` of resizing ``in_size`` pixels to
    ``out_size`` with an antialiased bilinear (triangle) filter: ``[(first input index,
    [weights...])]``, the weights summing to 1. Output i is centred at input ``(i + 0.5) *
    scale``; shrinking widens the filter to ``scale`` input pixels each side."""
    count = out_size - start if count is None else count
    scale = in_size / out_size
    widen = max(scale, 1.0)          # the triangle's half-width, in input pixels
    taps = []
    for i in range(start, start + count):
        center = (i + 0.5) * scale
        lo = max(int(center - widen + 0.5), 0)
        hi = min(int(center + widen + 0.5), in_size)
        w = [max(0.0, 1.0 - abs((j - center + 0.5) / widen)) for j in range(lo, hi)]
        total = sum(w)
        taps.append((lo, [v / total for v in w] if total else w))
    return taps


def _resample(x: Tensor, axis: int, taps: list) -> Tensor:
    """Resample ``x`` along ``axis`` (0 or 1 of (H, W, C)) with ``taps``: sum over tap k of
    ``take(x, first + k) * weight_k``, a zero weight where an output has fewer taps."""
    n = max(len(w) for _, w in taps)
    last = x.shape[axis] - 1
    wshape = (len(taps), 1, 1) if axis == 0 else (1, len(taps), 1)
    out = None
    for k in range(n):
        idx = ember.tensor([min(lo + k, last) for lo, _ in taps], dtype="int32", device=x.device)
        wk = ember.tensor([w[k] if k < len(w) else 0.0 for _, w in taps], device=x.device).reshape(wshape)
        term = ember.take(x, idx, axis=axis).astype("float32") * wk
        out = term if out is None else out + term
    return out


def imagenet_preprocess(pixels, width: int, height: int, *, channels: int = 4, resize: int = 256,
                        crop: int = 224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                        device: str | None = None) -> Tensor:
    """(1, 3, crop, crop) float32 input for an ImageNet classifier from ``width`` x ``height``
    pixels, row major, ``channels`` bytes each (4: RGBA as a canvas gives, alpha ignored as
    Pillow's ``convert("RGB")`` does; 3: RGB). See the module docstring for the steps.

    Raises ShapeError when the bytes do not fit the size, the image is empty or too large, or
    ``crop`` exceeds the resized image.
    """
    width, height, channels = int(width), int(height), int(channels)
    if channels not in (3, 4):
        raise ShapeError(f"imagenet_preprocess: channels must be 3 (RGB) or 4 (RGBA), got {channels}")
    if width <= 0 or height <= 0:
        raise ShapeError(f"imagenet_preprocess: an image of {width}x{height} pixels has nothing to classify")
    if width * height > MAX_PIXELS:
        raise ShapeError(f"imagenet_preprocess: {width}x{height} pixels is more than "
                         f"{MAX_PIXELS // 1_000_000} megapixels")
    data = pixels.to_bytes() if hasattr(pixels, "to_bytes") else pixels
    if len(data) != width * height * channels:
        raise ShapeError(f"imagenet_preprocess: {len(data)} bytes do not hold {width}x{height} pixels of "
                         f"{channels} bytes ({width * height * channels} bytes)")
    rw, rh = resized_size(width, height, resize)
    if crop > min(rw, rh):
        raise ShapeError(f"imagenet_preprocess: crop {crop} is larger than the resized image {rw}x{rh}")
    top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))
    x = ember.from_bytes(data, (height, width, channels), "uint8", device=device)   # (H, W, C)
    if channels == 4:
        x = ember.take(x, ember.tensor([0, 1, 2], dtype="int32", device=x.device), axis=2)  # (H, W, 3)
    x = _resample(x, 0, resize_taps(height, rh, top, crop))           # (crop, W, 3) float32
    x = _resample(x, 1, resize_taps(width, rw, left, crop))           # (crop, crop, 3)
    x = ember.permute_dims(x, (2, 0, 1))                               # (3, crop, crop)
    m = ember.tensor([[[v * 255.0]] for v in mean], device=x.device)  # (3, 1, 1), in pixel units
    s = ember.tensor([[[v * 255.0]] for v in std], device=x.device)
    return ember.expand_dims((x - m) / s, axis=0)                      # (1, 3, crop, crop)


def top_k(logits, k: int = 5, labels: list | None = None) -> list:
    """``[{"label", "index", "prob"}]`` for the ``k`` most probable classes of one row of
    ``logits`` (a (1, N) or (N,) tensor or a list), probabilities by softmax in float64."""
    import math

    row = logits.tolist() if hasattr(logits, "tolist") else list(logits)
    while row and isinstance(row[0], list):
        if len(row) != 1:
            raise ShapeError(f"top_k: expected one row of logits, got {len(row)} rows")
        row = row[0]
    if not row:
        raise ShapeError("top_k: no logits")
    hi = max(row)
    e = [math.exp(v - hi) for v in row]
    total = sum(e)
    labels = labels if labels is not None else (imagenet_classes() if len(row) == 1000 else None)
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    return [{"label": labels[i] if labels and i < len(labels) else f"class {i}", "index": i, "prob": e[i] / total}
            for i in order]
