"""Quantized ONNX graphs: the functions behind QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv and the
onnxruntime (``com.microsoft``) QGemm / QLinearAdd / QLinearMul, written with public ember ops
so they run on every backend (and the code generator can write them out as calls).

ember has no int8/int16 dtypes: the ONNX reader widens INT8, INT16 and UINT16 tensors to int32
(UINT8 stays uint8) and :func:`tag_narrow` remembers, per tensor, which narrow type it came
from. A quantizing op takes its saturation range from its zero point's type (int8 when an
int32 zero point carries no tag), and its output is uint8 for a uint8 range, int32 otherwise.

Arithmetic follows onnxruntime's CPU kernels: ``x / scale`` in float32, rounded half to even,
saturated; requantization multiplies the int32 accumulator by ``in_scale * w_scale / y_scale``
computed in float32. Integer matmuls are exact (int32); integer convolutions accumulate in
float32, exact while every partial sum stays below 2**24 in magnitude.

>>> import ember
>>> from ember.onnx import quant
>>> x = ember.tensor([-1.0, 0.0, 0.26, 2.0])
>>> q = quant.quantize_linear(x, ember.tensor(0.01), ember.tensor(128, dtype=ember.uint8))
>>> q.tolist(), q.dtype.name
([28, 128, 154, 255], 'uint8')
>>> [round(v, 2) for v in quant.dequantize_linear(q, ember.tensor(0.01), ember.tensor(128, dtype=ember.uint8)).tolist()]
[-1.0, 0.0, 0.26, 1.27]
"""
from __future__ import annotations

import weakref

import ember as E

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor

__all__ = ["tag_narrow", "narrow_range", "wrap_int", "dequantize_linear", "quantize_linear", "dynamic_quantize_linear",
           "matmul_integer", "conv_integer", "qlinear_matmul", "qlinear_conv", "qgemm", "qlinear_binary"]

# ONNX element type code -> (low, high)
_RANGES = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767)}
UINT8 = (0, 255)
INT8 = (-128, 127)
_NARROW: dict = {}          # id(tensor) -> (low, high), for int32 tensors widened from narrow types


def tag_narrow(t: Tensor, code: int) -> Tensor:
    """Remember that int32 tensor ``t`` holds values of ONNX integer type ``code``."""
    key = id(t)
    if key not in _NARROW:                   # the entry goes when the tensor does
        weakref.finalize(t, _NARROW.pop, key, None)
    _NARROW[key] = _RANGES[code]
    return t


def narrow_range(zp: Tensor | None, default=UINT8) -> tuple:
    """The (low, high) range a quantizing op saturates to, from its zero point's type."""
    if zp is None:
        return default
    if zp.dtype is _dt.uint8:
        return UINT8
    if zp.dtype is _dt.int32:
        return _NARROW.get(id(zp), INT8)
    raise DTypeError(f"zero point must be uint8, int8, int16 or uint16, got {zp.dtype.name}")


def wrap_int(x: Tensor, low: int, high: int) -> Tensor:
    """Cast to a narrow integer type held as int32: truncate toward zero, then wrap modulo
    ``high - low + 1`` into ``[low, high]`` (two's complement, as a C cast of an integer does).

    >>> import ember
    >>> wrap_int(ember.tensor([127.9, 128.0, -129.0, 300]), -128, 127).tolist()
    [127, -128, 127, 44]
    """
    v = E.astype(x, _dt.int64) if x.dtype is not _dt.int64 else x
    return E.astype(E.add(E.remainder(E.subtract(v, low), high - low + 1), low), _dt.int32)


def _out_dtype(rng):
    return _dt.uint8 if tuple(rng) == UINT8 else _dt.int32


def _along(p: Tensor, x: Tensor, axis: int, what: str, block: int = 0) -> Tensor:
    """A per-tensor (one element) or per-axis (1-D, one per entry of ``x``'s ``axis``) parameter,
    shaped to broadcast against ``x``; with ``block`` > 0 a blocked one (``x``'s shape with
    ``ceil(n / block)`` along ``axis``), repeated to ``x``'s shape."""
    if block:
        ax = axis % x.ndim
        n = x.shape[ax]
        want = tuple(x.shape[:ax]) + (-(-n // block),) + tuple(x.shape[ax + 1:])
        if tuple(p.shape) != want:
            raise ShapeError(f"{what} must have shape {want} for block_size {block} along axis {axis} of "
                             f"input {x.shape}, got {p.shape}")
        from ..tensor import tensor
        idx = tensor([i // block for i in range(n)], dtype=_dt.int64, device=p.device)
        return E.take(p, idx, axis=ax)
    if p.size == 1:
        return E.reshape(p, ()) if p.ndim else p
    if p.ndim != 1:
        raise ShapeError(f"{what} must be a scalar or 1-D (per axis), got shape {p.shape}; blocked "
                         f"quantization is not supported")
    ax = axis % x.ndim if x.ndim else 0
    if x.ndim == 0 or x.shape[ax] != p.shape[0]:
        raise ShapeError(f"{what} has {p.shape[0]} entries but the input's axis {axis} has size "
                         f"{x.shape[ax] if x.ndim else 1} (input {x.shape})")
    shape = [1] * x.ndim
    shape[ax] = p.shape[0]
    return E.reshape(p, tuple(shape))


def _f32(t: Tensor) -> Tensor:
    return t if t.dtype is _dt.float32 else E.astype(t, _dt.float32)


def _saturate(y: Tensor, rng) -> Tensor:
    """Round half to even, clip to ``rng``, cast to the output dtype."""
    lo, hi = rng
    return E.astype(E.clip(E.round(y), float(lo), float(hi)), _out_dtype(rng))


def dequantize_linear(x: Tensor, scale: Tensor, zero_point: Tensor | None = None, axis: int = 1,
                      block_size: int = 0) -> Tensor:
    """``(x - zero_point) * scale`` in float32; ``scale`` / ``zero_point`` per tensor, per
    ``axis`` or per block of ``block_size`` along ``axis``."""
    s = _along(_f32(scale), x, axis, "DequantizeLinear: x_scale", block_size)
    v = _f32(x)
    if zero_point is not None:
        v = E.subtract(v, _along(_f32(zero_point), x, axis, "DequantizeLinear: x_zero_point", block_size))
    return E.multiply(v, s)


def quantize_linear(x: Tensor, scale: Tensor, zero_point: Tensor | None = None, axis: int = 1,
                    low: int | None = None, high: int | None = None, block_size: int = 0) -> Tensor:
    """``saturate(round(x / scale) + zero_point)``; the range is the zero point's type's unless
    ``low``/``high`` say otherwise (uint8 when there is no zero point)."""
    rng = (low, high) if low is not None else narrow_range(zero_point)
    y = E.divide(_f32(x), _along(_f32(scale), x, axis, "QuantizeLinear: y_scale", block_size))
    y = E.round(y)
    if zero_point is not None:
        y = E.add(y, _along(_f32(zero_point), x, axis, "QuantizeLinear: y_zero_point", block_size))
    return _saturate(y, rng)


def dynamic_quantize_linear(x: Tensor) -> tuple:
    """uint8 quantization with the scale and zero point taken from ``x``'s range (always
    including 0): ``(y, y_scale, y_zero_point)``."""
    v = _f32(x)
    lo = E.minimum(E.min(v), 0.0) if v.size else E.zeros((), device=v.device)
    hi = E.maximum(E.max(v), 0.0) if v.size else E.zeros((), device=v.device)
    scale = E.divide(E.subtract(hi, lo), 255.0)
    scale = E.where(E.equal(scale, 0.0), 1.0, scale)      # an all-zero input: scale 1, like onnxruntime
    zp = _saturate(E.negative(E.divide(lo, scale)), UINT8)
    y = E.add(E.round(E.divide(v, scale)), _f32(zp))
    return _saturate(y, UINT8), scale, zp


def _centered(t: Tensor, zp: Tensor | None, axis: int, what: str) -> Tensor:
    """``t - zp`` as int32 (zp per tensor, or 1-D along ``axis``)."""
    v = E.astype(t, _dt.int32) if t.dtype is not _dt.int32 else t
    if zp is None:
        return v
    z = E.astype(zp, _dt.int32) if zp.dtype is not _dt.int32 else zp
    if z.size == 1:
        z = E.reshape(z, ())
    else:
        z = _along(z, t, axis, what)
    return E.subtract(v, z)


def matmul_integer(a: Tensor, b: Tensor, a_zero_point: Tensor | None = None,
                   b_zero_point: Tensor | None = None) -> Tensor:
    """``(a - a_zp) @ (b - b_zp)`` in int32 (a_zp per row of a, b_zp per column of b allowed)."""
    A = _centered(a, a_zero_point, -2 if a.ndim > 1 else 0, "MatMulInteger: a_zero_point")
    B = _centered(b, b_zero_point, -1, "MatMulInteger: b_zero_point")
    return E.matmul(A, B)


def _conv_f32(x, x_zp, w, w_zp, bias, conv):
    X = _f32(x)
    if x_zp is not None:
        X = E.subtract(X, E.reshape(_f32(x_zp), ()) if x_zp.size == 1 else _along(_f32(x_zp), x, 1, "x_zero_point"))
    W = _f32(w)
    if w_zp is not None:
        W = E.subtract(W, E.reshape(_f32(w_zp), ()) if w_zp.size == 1 else _along(_f32(w_zp), w, 0, "w_zero_point"))
    return conv(X, W, None if bias is None else _f32(bias))


def _conv_fn(kw):
    from .functional import conv1d

    def conv(X, W, b):
        if X.ndim == 3:
            return conv1d(X, W, b, kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1),
                          kw.get("groups", 1))
        return E.conv2d(X, W, b, **kw)
    return conv


def conv_integer(x: Tensor, w: Tensor, x_zero_point: Tensor | None = None, w_zero_point: Tensor | None = None,
                 **conv_kw) -> Tensor:
    """ONNX ConvInteger: the convolution of ``x - x_zp`` and ``w - w_zp`` as int32 (padding
    holds the zero point, so it adds nothing)."""
    acc = _conv_f32(x, x_zero_point, w, w_zero_point, None, _conv_fn(conv_kw))
    return E.astype(E.round(acc), _dt.int32)


def _requantize(acc: Tensor, multiplier: Tensor, y_zero_point: Tensor | None, rng) -> Tensor:
    y = E.round(E.multiply(_f32(acc), multiplier))
    if y_zero_point is not None:
        y = E.add(y, E.reshape(_f32(y_zero_point), ()))
    return _saturate(y, rng)


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point) -> Tensor:
    """ONNX QLinearMatMul: the int32 product of the centred inputs, requantized with
    ``a_scale * b_scale / y_scale`` (b's scale and zero point may be per column)."""
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    bs = _f32(b_scale)
    if bs.size > 1:
        bs = _along(bs, b, -1, "QLinearMatMul: b_scale")
    mult = E.divide(E.multiply(E.reshape(_f32(a_scale), ()), bs), E.reshape(_f32(y_scale), ()))
    return _requantize(acc, mult, y_zero_point, narrow_range(y_zero_point))


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias=None,
                 **conv_kw) -> Tensor:
    """ONNX QLinearConv: conv of the centred inputs plus the int32 bias, requantized per output
    channel with ``x_scale * w_scale / y_scale``."""
    acc = _conv_f32(x, x_zero_point, w, w_zero_point, bias, _conv_fn(conv_kw))
    ws = _f32(w_scale)
    if ws.size > 1:
        ws = E.reshape(ws, (1, ws.shape[0]) + (1,) * (x.ndim - 2))
    else:
        ws = E.reshape(ws, ())
    mult = E.divide(E.multiply(E.reshape(_f32(x_scale), ()), ws), E.reshape(_f32(y_scale), ()))
    return _requantize(acc, mult, y_zero_point, narrow_range(y_zero_point))


def qgemm(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None,
          alpha: float = 1.0, trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """onnxruntime's QGemm: ``alpha * (a - a_zp) @ (b - b_zp) * a_scale * b_scale`` plus the
    int32 bias ``c`` (in the accumulator's scale); quantized with ``y_scale``/``y_zero_point``
    when given, float32 otherwise."""
    if trans_a:
        a = E.permute_dims(a, (1, 0))
    if trans_b:
        b = E.permute_dims(b, (1, 0))          # b_zero_point / b_scale stay per output column
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    if c is not None:
        acc = E.add(acc, E.astype(c, _dt.int32) if c.dtype is not _dt.int32 else c)
    bs = _f32(b_scale)
    bs = E.reshape(bs, ()) if bs.size == 1 else E.reshape(bs, (1, bs.shape[0]))
    scale = E.multiply(E.multiply(E.reshape(_f32(a_scale), ()), bs), float(alpha))
    if y_scale is None:
        return E.multiply(_f32(acc), scale)
    mult = E.divide(scale, E.reshape(_f32(y_scale), ()))
    return _requantize(acc, mult, y_zero_point, narrow_range(y_zero_point))


def qlinear_binary(kind: str, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point) -> Tensor:
    """onnxruntime's QLinearAdd / QLinearMul: dequantize both, add or multiply in float32,
    quantize to ``y_scale``/``y_zero_point``."""
    fa = dequantize_linear(a, a_scale, a_zero_point)
    fb = dequantize_linear(b, b_scale, b_zero_point)
    y = E.add(fa, fb) if kind == "add" else E.multiply(fa, fb)
    return quantize_linear(y, y_scale, y_zero_point)
