"""numpy kernels for the neural-network ops (conv, pooling, norms, sort...).

Convolution and pooling read the (padded) input through a strided window view, without copying,
then reduce it (pooling) or reshape the windows into one matrix per group and multiply (conv).
float16 inputs are computed in float32 and rounded back once.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .numpy_backend import np_dtype


def _f(t):
    """The buffer as a float array to compute in (float16 widened to float32)."""
    a = t._buf
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _out(a, out):
    return np.ascontiguousarray(a, dtype=np_dtype(out.dtype))


def _windows(a, oh, ow, kh, kw, stride, dilation):
    """View (N, C, oh, ow, kh, kw) of the windows of the 4-D array ``a`` (already padded)."""
    s0, s1, s2, s3 = a.strides
    (sh, sw), (dh, dw) = stride, dilation
    return as_strided(a, shape=a.shape[:2] + (oh, ow, kh, kw),
                      strides=(s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw), writeable=False)


def _pad4(a, pads, value, oh=None, ow=None, kh=1, kw=1, stride=(1, 1), dilation=(1, 1)):
    """Pad H and W; also extend the end so ceil-mode windows (oh, ow) stay inside the array."""
    (pt, pb), (pl, pr) = pads
    if oh is not None:
        pb = max(pb, (oh - 1) * stride[0] + dilation[0] * (kh - 1) + 1 - a.shape[2] - pt)
        pr = max(pr, (ow - 1) * stride[1] + dilation[1] * (kw - 1) + 1 - a.shape[3] - pl)
    if pt or pb or pl or pr:
        a = np.pad(a, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)
    return a


# ---- activations, softmax, norms ----------------------------------------------------------------

def _relu(out, x):
    return _out(np.maximum(x._buf, 0), out)   # np.maximum propagates NaN


def _leaky_relu(out, x, *, negative_slope):
    a = _f(x)
    return _out(np.where(a < 0, a * negative_slope, a), out)


def _sigmoid_of(a):
    # exp of a non-positive number only: no overflow warnings for large |x|
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _sigmoid(out, x):
    return _out(_sigmoid_of(_f(x).astype(np.float32, copy=False)), out)


def _silu(out, x):
    a = _f(x).astype(np.float32, copy=False)
    return _out(a * _sigmoid_of(a), out)


def _erf(a):
    # numpy has no erf; math.erf elementwise (exact to double precision) keeps the reference honest
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(a.astype(np.float64)), dtype=np.float64)


def _gelu(out, x, *, approximate):
    a = _f(x).astype(np.float32, copy=False)
    if approximate == "tanh":
        y = 0.5 * a * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (a + np.float32(0.044715) * a * a * a)))
    else:
        y = 0.5 * a * (1.0 + _erf(a * (1.0 / math.sqrt(2.0))))
    return _out(y, out)


def _softmax(out, x, *, axis):
    a = _f(x).astype(np.float32, copy=False)
    if a.size == 0 or a.ndim == 0:
        return _out(np.exp(a - a), out)   # empty stays empty, one element gives 1
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return _out(e / e.sum(axis=axis, keepdims=True), out)


def _log_softmax(out, x, *, axis):
    a = _f(x).astype(np.float32, copy=False)
    if a.size == 0 or a.ndim == 0:
        return _out(a - a, out)
    z = a - a.max(axis=axis, keepdims=True)
    return _out(z - np.log(np.exp(z).sum(axis=axis, keepdims=True)), out)


def _batch_norm(out, x, mean, var, weight, bias, *, eps):
    shape = (-1,) + (1,) * (x._buf.ndim - 2)
    scale = _f(weight) / np.sqrt(_f(var) + np.float32(eps))
    shift = _f(bias) - _f(mean) * scale
    return _out(_f(x) * scale.reshape(shape) + shift.reshape(shape), out)


def _layer_norm(out, x, weight, bias, *, normalized_shape, eps):
    a = _f(x)
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    d = a - a.mean(axis=axes, keepdims=True)
    var = (d * d).mean(axis=axes, keepdims=True)
    return _out(d / np.sqrt(var + np.float32(eps)) * _f(weight) + _f(bias), out)


# ---- convolution ------------------------------------------------------------------------------

def _conv2d(out, x, weight, bias=None, *, stride, padding, dilation, groups):
    n, o, oh, ow = out.shape
    _, cg, kh, kw = weight.shape
    if n * o * oh * ow == 0:
        return np.zeros(out.shape, np_dtype(out.dtype))
    a = _pad4(_f(x), padding, 0)
    win = _windows(a, oh, ow, kh, kw, stride, dilation)                         # (n, c, oh, ow, kh, kw)
    g, og, k = groups, o // groups, cg * kh * kw
    cols = win.reshape(n, g, cg, oh, ow, kh, kw).transpose(0, 1, 3, 4, 2, 5, 6).reshape(n, g, oh * ow, k)
    w = _f(weight).reshape(g, og, k).transpose(0, 2, 1)                          # (g, k, og)
    y = np.matmul(cols, w)                                                       # (n, g, oh*ow, og)
    y = y.transpose(0, 1, 3, 2).reshape(n, o, oh, ow)
    if bias is not None:
        y = y + _f(bias).reshape(1, o, 1, 1)
    return _out(y, out)


def _conv_transpose2d(out, x, weight, bias=None, *, stride, padding, output_padding, dilation, groups):
    n, c, h, w = x.shape
    _, og, kh, kw = weight.shape
    o, oh, ow = out.shape[1:]
    g, cg = groups, c // groups
    (sh, sw), (dh, dw) = stride, dilation
    a = _f(x).reshape(n, g, cg, h * w).transpose(0, 1, 3, 2)                     # (n, g, hw, cg)
    wt = _f(weight).reshape(g, cg, og * kh * kw)
    y = np.matmul(a, wt).reshape(n, g, h, w, og, kh, kw)                         # every input x tap
    y = y.transpose(0, 1, 4, 5, 6, 2, 3)                                         # (n, g, og, kh, kw, h, w)
    (pt, pb), (pl, pr) = padding
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, pt + oh)
    full_w = max((w - 1) * sw + dw * (kw - 1) + 1, pl + ow)
    full = np.zeros((n, g, og, full_h, full_w), dtype=y.dtype)
    for i in range(kh):
        for j in range(kw):
            full[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (w - 1) * sw + 1:sw] += y[:, :, :, i, j]
    res = full.reshape(n, o, full_h, full_w)[:, :, pt:pt + oh, pl:pl + ow]
    if bias is not None:
        res = res + _f(bias).reshape(1, o, 1, 1)
    return _out(res, out)


# ---- pooling ------------------------------------------------------------------------------------

def _max_pool2d(out, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    oh, ow = out.shape[2:]
    a = x._buf
    low = -np.inf if a.dtype.kind == "f" else np.iinfo(a.dtype).min
    a = _pad4(a, padding, low, oh, ow, *kernel_size, stride, dilation)
    win = _windows(a, oh, ow, *kernel_size, stride, dilation)
    return _out(win.max(axis=(4, 5)), out)   # max propagates NaN


def _avg_divisors(size, k, s, p0, p1, n_out, include_pad):
    a = np.arange(n_out) * s - p0
    b = np.minimum(a + k, size + p1)
    return (b - a) if include_pad else (np.minimum(b, size) - np.maximum(a, 0))


def _avg_pool2d(out, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
    oh, ow = out.shape[2:]
    a = _pad4(_f(x), padding, 0, oh, ow, *kernel_size, stride)
    s = _windows(a, oh, ow, *kernel_size, stride, (1, 1)).sum(axis=(4, 5))
    dy = _avg_divisors(x.shape[2], kernel_size[0], stride[0], *padding[0], oh, count_include_pad)
    dx = _avg_divisors(x.shape[3], kernel_size[1], stride[1], *padding[1], ow, count_include_pad)
    return _out(s / np.outer(dy, dx).astype(s.dtype), out)


# ---- cumsum, sort, pad ------------------------------------------------------------------------

def _cumsum(out, x, *, axis, exclusive, reverse):
    a = x._buf.reshape(x.shape or (1,))
    dt = np.float32 if out.dtype.kind == "f" else np.int64
    if reverse:
        a = np.flip(a, axis)
    r = np.cumsum(a, axis=axis, dtype=dt)
    if exclusive:
        # shift by one along axis, starting from 0
        shifted = np.zeros_like(r)
        dst = [slice(None)] * r.ndim
        src = [slice(None)] * r.ndim
        dst[axis], src[axis] = slice(1, None), slice(0, -1)
        shifted[tuple(dst)] = r[tuple(src)]
        r = shifted
    if reverse:
        r = np.flip(r, axis)
    return _out(r.reshape(out.shape), out)


def _sort(outs, x, *, axis, descending, stable):
    a = x._buf.reshape(x.shape or (1,))
    if descending:
        # a stable descending order (equal values keep their order, NaN first): the stable
        # ascending order of the reversed array, reversed
        n = a.shape[axis]
        idx = n - 1 - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)
    else:
        idx = np.argsort(a, axis=axis, kind="stable")
    vals = np.take_along_axis(a, idx, axis=axis)
    return _out(vals.reshape(outs[0].shape), outs[0]), _out(idx.reshape(outs[1].shape), outs[1])


_NP_PAD_MODE = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(out, x, *, pad_width, mode, value):
    a = x._buf
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, (b, e) in zip(a.shape, pad_width))
    a = a[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in pad_width]
    if not any(b or e for b, e in widths):
        return _out(a, out)
    if mode == "constant":
        return _out(np.pad(a, widths, mode="constant", constant_values=value), out)
    return _out(np.pad(a, widths, mode=_NP_PAD_MODE[mode]), out)


def _quiet(kernel):
    # inf - inf, inf * 0 and friends give NaN as IEEE says; numpy's warnings about them are noise
    def run(*args, **kw):
        with np.errstate(all="ignore"):
            return kernel(*args, **kw)
    return run


KERNELS = {
    "relu": _relu,
    "leaky_relu": _leaky_relu,
    "sigmoid": _sigmoid,
    "silu": _silu,
    "gelu": _gelu,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "conv2d": _conv2d,
    "conv_transpose2d": _conv_transpose2d,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "cumsum": _cumsum,
    "sort": _sort,
    "pad": _pad,
}
KERNELS = {name: _quiet(k) for name, k in KERNELS.items()}
