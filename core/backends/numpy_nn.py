"""numpy kernels for the neural-network ops (conv, pooling, norms, sort...).

Convolution and pooling read the (padded) input through one strided view per kernel tap: pooling
combines the taps pairwise (``np.maximum`` / ``+=``); convolutions copy them once into an im2col
matrix laid out so that one GEMM per group (depthwise: one small product per channel, batched)
writes the NCHW result directly (a 1x1 convolution uses the input itself); 3x3 stride-1
convolutions with many channels and pixels go through Winograd's F(2x2, 3x3) (_conv_winograd:
2.25x fewer products, float32 rounding only). Depthwise convolutions run the native kernel
(core/native/conv.c, bias included) where ember.native is loaded. float16 inputs are computed
in float32 and rounded back once. Small stride-1 groups-1 convolutions (below 1024 output pixels)
run dense.c's ember_conv_pad there, which pads the input itself and can max-pool 2x2 in its
epilogue (numpy_plan's conv + activation + pool step). The compiled plan's fused steps call
core/native/fused.c through NativeLinear (a layer norm, linear, GELU and residual add as one
call), NativeAttention and NativeSqueezeExcite.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import native
from ..errors import DeviceError
from . import numpy_rows
from .numpy_blas import matmul, parallel_for, threads

# numpy_backend imports this module for its KERNELS, so the dtype map is not imported from there
# (importing this module first would otherwise be circular)
_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
       "bool": np.bool_}


def np_dtype(dtype):
    return _NP[dtype.name]


def _f(t):
    """The buffer as a float array to compute in (float16 widened to float32)."""
    a = t._buf
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _out(a, out):
    return np.ascontiguousarray(a, dtype=np_dtype(out.dtype))


# ---- activations, softmax, norms ----------------------------------------------------------------

def _clip_ufunc():
    """numpy's clip ufunc itself: what np.clip calls after ~2 us of Python argument checks
    (a small activation's whole cost); np.clip where this numpy does not expose it."""
    for mod in ("numpy._core.umath", "numpy.core.umath"):
        try:
            fn = getattr(__import__(mod, fromlist=["clip"]), "clip", None)
        except ImportError:
            continue
        if isinstance(fn, np.ufunc):
            return fn
    return np.clip


# clip(a, lo, hi[, out=]) for an array a and scalar bounds of its dtype (the same loop np.clip runs)
clip = _clip_ufunc()


def _relu(out, x):
    a = x._buf
    if a.dtype.kind == "f":
        # clip with both bounds takes numpy's vectorised clip loop (~3x np.maximum(a, 0),
        # whose scalar operand misses the SIMD path); NaN stays NaN either way
        return _out(clip(a, a.dtype.type(0), a.dtype.type(np.inf)), out)
    return _out(np.maximum(a, a.dtype.type(0)), out)


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


# erf without scipy, vectorised: erf(x) = x * P(x^2) / Q(x^2) on x clipped to [-3.92, 3.92]
# (beyond, erf rounds to +-1 in float32), a (5, 5) rational whose coefficients were fitted for
# this file by least squares (relative error, against math.erf). Evaluated in float64, in
# cache-sized chunks, and rounded once: within one float32 ulp of erf (tests/test_numpy_kernels.py
# checks it against math.erf on a dense grid).
_ERF_P = (1.1283791487637447, 0.189963140042527, 0.052690236696227355, 0.003746880885666328,
          0.00028451177162329075, 2.0540086991260864e-06)
_ERF_Q = (1.0, 0.5016832520119313, 0.11392606816769195, 0.014931346101563036,
          0.0011581049482978648, 3.811326051676722e-05)
_ERF_CLIP = 3.92
_CHUNK = 32768      # elements per step: the float64 temporaries stay in the L2 cache


def _erf_chunk(x):
    """erf of a float array chunk, as float64 (a new array)."""
    xc = np.clip(x, -_ERF_CLIP, _ERF_CLIP, dtype=np.float64)
    t = xc * xc
    num = t * _ERF_P[5]
    num += _ERF_P[4]
    den = t * _ERF_Q[5]
    den += _ERF_Q[4]
    for i in (3, 2, 1, 0):
        num *= t
        num += _ERF_P[i]
        den *= t
        den += _ERF_Q[i]
    num *= xc
    num /= den
    return num


def _chunked(fn, a):
    """``fn`` (float array chunk -> float64 array) over ``a``, into a new float32 array."""
    x = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(x.shape, np.float32)
    for i in range(0, x.size, _CHUNK):
        out[i:i + _CHUNK] = fn(x[i:i + _CHUNK])
    return out.reshape(np.shape(a))


def erf_f32(a):
    """erf of a float array as float32 (same shape), within one float32 ulp.

    >>> import numpy as np
    >>> [round(float(v), 6) for v in erf_f32(np.array([-2.0, 0.0, 0.5, 3.0]))]
    [-0.995322, 0.0, 0.5205, 0.999978]
    """
    return _chunked(_erf_chunk, a)


# GELU x * Phi(x) in float32 through Phi(x) = sigmoid(g(x)) = (1 + tanh(g / 2)) / 2, g the logit
# of Phi: an odd, smooth function, g(x) = x * h(x^2) with h a degree-6 polynomial fitted for this
# file (weighted least squares on [0, 7], the weight x Phi (1 - Phi) being what an error in g
# costs the result). Beyond the fit h keeps growing: g / 2 >= 12.5 for every x^2 >= 36 (up to
# float32's overflow, where h is inf), and tanh of that is +-1 in float32, as Phi is there; so x^2
# needs no cap (the same bits as capping it at 49: test_gelu_large_magnitudes_without_a_cap).
# numpy's float32 tanh is vectorised, so this is 17 float32 passes and no division: ~1.7x faster
# than the erfcx rational it replaces. Error <= 5.5e-7 on [-8, 8] (~1.1 ulp at 5, from tanh's
# rounding near 1; onnxruntime's Gelu: 4.5e-7, PyTorch's: 1.1e-6; tests/test_numpy_kernels.py).
_GELU_H = (1.5957705441085075, 0.07266368556092255, -6.265928257091016e-05, -0.00011162366090392162,
           8.108011042395364e-06, -2.7830116997680936e-07, 3.887201903180794e-09)
_GH = tuple(np.float32(0.5 * v) for v in _GELU_H)      # (g / 2)
_GELU_CHUNK = 32768


def _gelu_chunk(x, out):
    """GELU of a float32 chunk into ``out`` (as above)."""
    t = np.multiply(x, x)
    h = t * _GH[6]
    for c in _GH[5:0:-1]:
        h += c
        h *= t
    h += _GH[0]
    h *= x                                               # g / 2
    np.tanh(h, out=h)
    half = np.multiply(x, np.float32(0.5), out=out)
    h *= half
    np.add(half, h, out=out)                             # x/2 + x/2 tanh: NaN for NaN and -inf


def _gelu_erf(a):
    """x * Phi(x) in float32, a cache-sized chunk at a time (see above)."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    out = np.empty(x.shape, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(0, x.size, _GELU_CHUNK):
            _gelu_chunk(x[i:i + _GELU_CHUNK], out[i:i + _GELU_CHUNK])
    return out.reshape(np.shape(a))


def _gelu(out, x, *, approximate):
    a = _f(x).astype(np.float32, copy=False)
    y = numpy_rows.gelu(a, approximate)                 # (core/native/rows.c where it is loaded)
    if y is not None:
        return _out(y, out)
    if approximate == "tanh":
        shape, a = a.shape, a.reshape(-1)     # 1-D, so 0-d inputs stay arrays for out=
        y = a * a
        y *= np.float32(0.044715)
        y += np.float32(1.0)
        y *= a
        y *= np.float32(math.sqrt(2.0 / math.pi))
        np.tanh(y, out=y)
        y += np.float32(1.0)
        y *= a
        y *= np.float32(0.5)
        y = y.reshape(shape)
    else:
        y = _gelu_erf(a)
    return _out(y, out)


# numpy reduces each short row on its own (attention's 32 keys: ~100 ns a row); over the rows
# of the transposed copy, the same maxima are one vectorised pass per key
_SHORT_ROW = 128


def _row_max(a):
    """``a.max(axis=-1, keepdims=True)`` (NaN-propagating, like max)."""
    k = a.shape[-1]
    if k > _SHORT_ROW or a.size < 64 * k or k < 2:
        return a.max(axis=-1, keepdims=True)
    t = np.ascontiguousarray(a.reshape(-1, k).T)
    return np.maximum.reduce(t, axis=0).reshape(a.shape[:-1] + (1,))


# softmax over the last axis without the max shift, where each row's sum shows it changes
# nothing: exp(x) / sum(exp(x)) is exp(x - m) / sum(exp(x - m)) without the subtraction's
# rounding, and without two passes (the row maxima and the broadcast subtraction: on attention's
# 32-key rows ~34 of ~65 us). A row sum s >= 1 means the row's maximum is >= -ln(n) > -88, so
# exp(x) loses nothing to underflow that the shifted form keeps (an exp(x) below float32's normal
# range belongs to a result below it, s >= 1); a finite s means nothing overflowed. Other rows (a
# sum below 1, inf or NaN: large or very negative rows, NaN, +-inf, a row of -inf) are made again
# the shifted way, so their results, NaN included, are those of the shifted form.
_SOFTMAX_MAX_SUM = float(np.finfo(np.float32).max)


def _row_sums(e):
    """Each row's sum of a float32 (R, n) array: one BLAS matrix-vector product for short rows
    (numpy reduces each short row on its own), numpy's pairwise sum for long ones."""
    if e.shape[1] <= _SHORT_ROW:
        return matmul(e, np.ones(e.shape[1], np.float32))
    return e.sum(axis=1)


def _softmax_shifted(rows):
    """exp(rows - row max) / its row sums, a float32 (R, n) array."""
    e = rows - _row_max(rows)                         # the one new array; the rest in place
    np.exp(e, out=e)
    e /= _row_sums(e)[:, None]
    return e


def _softmax(out, x, *, axis):
    a = _f(x).astype(np.float32, copy=False)
    if a.size == 0 or a.ndim == 0:
        return _out(np.exp(a - a), out)   # empty stays empty, one element gives 1
    if axis % a.ndim == a.ndim - 1 and a.shape[-1] > 1:
        y = numpy_rows.softmax(a)                       # (core/native/rows.c where it is loaded)
        if y is not None:
            return _out(y, out)
        rows = a.reshape(-1, a.shape[-1])
        e = np.exp(rows)
        s = _row_sums(e)
        if not (s.min() >= 1.0 and s.max() <= _SOFTMAX_MAX_SUM):      # (NaN fails both)
            redo = np.flatnonzero(~((s >= 1.0) & (s <= _SOFTMAX_MAX_SUM)))
            e[redo] = _softmax_shifted(rows[redo])
            s[redo] = 1.0
        e /= s[:, None]
        return _out(e.reshape(a.shape), out)
    e = a - a.max(axis=axis, keepdims=True)          # the one new array; the rest in place
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return _out(e, out)


def _log_softmax(out, x, *, axis):
    a = _f(x).astype(np.float32, copy=False)
    if a.size == 0 or a.ndim == 0:
        return _out(a - a, out)
    z = a - a.max(axis=axis, keepdims=True)
    s = np.exp(z).sum(axis=axis, keepdims=True)
    np.log(s, out=s)
    z -= s
    return _out(z, out)


def _batch_norm(out, x, mean, var, weight, bias, *, eps):
    scale = _f(weight) / np.sqrt(_f(var) + np.float32(eps))
    shift = _f(bias) - _f(mean) * scale
    a = _f(x)
    if a.shape[0] == 1:   # one sample: the rows would be as large as the input
        shape = (-1,) + (1,) * (a.ndim - 2)
        return _out(a * scale.reshape(shape) + shift.reshape(shape), out)
    a = _channel_rows(a)
    y = a * _per_channel(scale, a)
    y += _per_channel(shift, a)
    return _out(y.reshape(out.shape), out)


# ---- cross entropy --------------------------------------------------------------------------------

def _ce_logits(x):
    """The logits as (M, C) rows, class axis last, in the dtype to compute in."""
    a = _f(x)
    if a.ndim == 1:
        return a.reshape(1, a.shape[0])
    if a.ndim > 2:
        a = np.moveaxis(a, 1, -1)
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def ce_targets(x2, t, w, ignore_index, label_smoothing, probs):
    """numpy's ``losses._targets``: the per-class coefficients q (M, C), loss_i = -sum_c q_ic
    log p_ic, and the denominator of reduction='mean', op for op (scalars in x2's dtype)."""
    m, c = x2.shape
    ct = x2.dtype.type
    eps = label_smoothing
    wf = None if w is None else _f(w).astype(ct, copy=False)
    if probs:
        q = _ce_logits(t).astype(ct, copy=False)
        if eps:
            q = q * ct(1.0 - eps) + ct(eps / c)
        if wf is not None:
            q = q * wf.reshape(1, c)
        return q, ct(m)
    t1 = t._buf.reshape(m).astype(np.int64, copy=False)
    valid = t1 != ignore_index
    ts = np.where(valid, t1, 0)
    q = (ts[:, None] == np.arange(c)[None, :]).astype(ct)
    vw = valid.astype(ct)
    if wf is not None:
        if ts.size and (ts.min() < -c or ts.max() >= c):
            from ..errors import IndexingError
            bad = int(ts.min() if ts.min() < -c else ts.max())
            raise IndexingError(f"take: index {bad} is out of range for axis 0 with size {c}")
        vw = vw * wf[np.where(ts < 0, ts + c, ts)]
    q *= vw[:, None]
    if eps:
        smooth = valid.astype(ct)[:, None]
        if wf is not None:
            smooth = smooth * wf.reshape(1, c)
        q = q * ct(1.0 - eps) + smooth * ct(eps / c)
    return q, vw.sum(dtype=ct)


def _cross_entropy(out, x, t, w=None, *, reduction, ignore_index, label_smoothing, probs):
    """The decomposition's loss in one kernel: -sum(q * log_softmax(x)) per row, then the
    reduction."""
    x2 = _ce_logits(x)
    q, denom = ce_targets(x2, t, w, ignore_index, label_smoothing, probs)
    if x2.size == 0:
        z = x2.copy()
    else:
        z = x2 - x2.max(axis=1, keepdims=True)
        s = np.exp(z).sum(axis=1, keepdims=True)
        np.log(s, out=s)
        z -= s
    z *= q
    loss = -z.sum(axis=1)
    if reduction == "none":
        return _out(loss.reshape(out.shape), out)
    total = loss.sum()
    return _out(total if reduction == "sum" else total / denom, out)


def _channel_rows(a):
    """``a`` (N, C, ...) as (N, C, L): the per-channel reductions of batch norm are then a
    pairwise sum over the contiguous L axis and a sum over N (numpy reduces (0, 2, 3) at once
    ~1.5x slower)."""
    n, c = a.shape[:2]
    return a.reshape(n, c, math.prod(a.shape[2:]))


def _channel_sum(a3):
    return a3.sum(axis=2).sum(axis=0)


def _per_channel(v, a3):
    """Per-channel values ``v`` (C,) as a (C, L) operand for ``a3`` (N, C, L): a materialised
    row per channel, which numpy's loops take ~2x faster than the stride-0 (C, 1) broadcast."""
    return np.ascontiguousarray(np.broadcast_to(v[:, None], a3.shape[1:]))


def _batch_norm_train(outs, x, weight, bias, *, eps):
    """Training batch norm in one kernel: the batch mean, the biased variance from the
    deviations (two passes, as the decomposition), y = (x - mean) * (w * rstd) + b written over
    the deviations."""
    a = _channel_rows(_f(x))
    ct = a.dtype.type
    count = a.shape[0] * a.shape[2]
    mean = _channel_sum(a) / ct(count)
    d = a - _per_channel(mean, a)
    sq = d * d
    var = _channel_sum(sq) / ct(count)
    scale = _f(weight) / np.sqrt(var + ct(eps))
    d *= _per_channel(scale, a)
    d += _per_channel(_f(bias), a)
    y, m, v = outs
    return _out(d.reshape(y.shape), y), _out(mean, m), _out(var, v)


def _rowdot(d):
    """Each row's dot product with itself, (R, n) -> (R,): np.vecdot (numpy >= 2), else einsum."""
    return _VECDOT(d, d) if _VECDOT is not None else np.einsum("ij,ij->i", d, d)


_VECDOT = getattr(np, "vecdot", None)


def _layer_norm(out, x, weight, bias, *, normalized_shape, eps):
    a = _f(x)
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    if len(axes) == 1 and a.ndim and a.size and a.shape[-1] > 1 and a.dtype == np.float32:
        y = numpy_rows.layer_norm(a, _f(weight), _f(bias), eps)    # (core/native/rows.c where loaded)
        if y is not None:
            return _out(y, out)
        # one normalized axis: the row sums as one BLAS matrix-vector product and the squared
        # deviations as np.vecdot (numpy's mean over a short last axis costs ~5x the GEMV)
        n = a.shape[-1]
        rows = a.reshape(-1, n)
        mean = matmul(rows, np.ones(n, np.float32))
        mean /= np.float32(n)
        d = rows - mean[:, None]                      # the one new array; the rest in place
        var = _rowdot(d)
        var /= np.float32(n)
        var += np.float32(eps)
        np.sqrt(var, out=var)
        d /= var[:, None]
        d *= _f(weight).reshape(-1)
        d += _f(bias).reshape(-1)
        return _out(d.reshape(a.shape), out)
    d = a - a.mean(axis=axes, keepdims=True)         # the one new array; the rest in place
    if len(axes) == 1 and d.ndim:
        var = np.einsum("...i,...i->...", d, d)[..., None]
        var /= np.float32(d.shape[-1])
    else:
        var = np.square(d).mean(axis=axes, keepdims=True)
    var += np.float32(eps)
    np.sqrt(var, out=var)
    d /= var
    d *= _f(weight)
    d += _f(bias)
    return _out(d, out)


def _linear(out, x, weight, bias=None):
    """x @ weight.T + bias: BLAS reads the (out, in) weight transposed in place, all leading
    axes go through one GEMM, the bias is added in place."""
    a, w = _f(x), _f(weight)
    if a.ndim > 2 and a.flags.c_contiguous:
        a = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
    if a.ndim == 2 and a.shape[0] == 1 and w.ndim == 2:
        # one row (a classifier's at batch 1): the native matrix-vector kernel, bias included
        y = _gemv_native(w, a[0], None if bias is None else _f(bias))
        if y is not None:
            return _out(y.reshape(out.shape), out)
    y = matmul(a, w.T)
    if bias is not None:
        y += _f(bias)
    return _out(y.reshape(out.shape), out)


def _sdpa(out, q, k, v, mask=None, *, is_causal, scale):
    """softmax(q k^T * scale + mask) v as two stacked matmuls over every (batch, head) at once,
    the softmax in place between them; rows whose keys are all masked give zeros."""
    Q, K, V = _f(q), _f(k), _f(v)
    if 0 in out.shape or K.shape[-2] == 0:
        return np.zeros(out.shape, np_dtype(out.dtype))
    s = matmul(Q, np.swapaxes(K, -1, -2))                                     # (..., L, S)
    s *= np.float32(scale)
    if is_causal:
        L, S = s.shape[-2:]
        mask_arr = np.tri(L, S, dtype=bool)
    else:
        mask_arr = None if mask is None else mask._buf
    if mask_arr is not None:
        if mask_arr.dtype == np.bool_:
            s = np.where(mask_arr, s, np.float32(-np.inf))
        else:
            s = s + mask_arr.astype(np.float32, copy=False)
    m = s.max(axis=-1, keepdims=True)
    dead = m == -np.inf
    if dead.any():
        m[dead] = 0
    s -= m
    np.exp(s, out=s)
    den = s.sum(axis=-1, keepdims=True)
    if dead.any():
        den[dead] = 1
    s /= den
    return _out(matmul(s, V), out)


# ---- convolution ------------------------------------------------------------------------------

# weights in the forms the convolutions multiply by (Winograd's transformed kernels, the
# channels-last depthwise path's tiled taps), made once per weight buffer:
# {(id(buffer), key): (weakref to it, array)}. ember never writes a tensor's buffer in place (an
# update swaps in a new one: Tensor._set_), so an entry is valid while its buffer object lives.
# Entries of dead buffers go at the next insertion; bounded by bytes (full, it is emptied).
_DERIVED: dict = {}
_DERIVED_BYTES = 64 << 20


def _derived(w, key, make):
    """``make(w)`` (an array), kept for later calls with the same buffer object ``w`` and key."""
    k = (id(w), key)
    hit = _DERIVED.get(k)
    if hit is not None and hit[0]() is w:
        return hit[1]
    v = make(w)
    if v.nbytes <= _DERIVED_BYTES:
        live = [(kk, e) for kk, e in list(_DERIVED.items()) if e[0]() is not None]   # (dead buffers' go)
        if sum(e[1].nbytes for _, e in live) + v.nbytes > _DERIVED_BYTES:
            live = []
        if len(live) < len(_DERIVED):
            _DERIVED.clear()
            _DERIVED.update(live)
        try:
            _DERIVED[k] = (weakref.ref(w), v)
        except TypeError:                    # (a buffer type without weak references: not cached)
            pass
    return v


def _padded(a, pads, value=0, extra_h=0, extra_w=0):
    """``a`` (N, C, H, W) with H and W padded by ((top, bottom), (left, right)) plus ``extra_*``
    more at the end: one allocation and one copy (np.pad does the same work with more Python)."""
    (pt, pb), (pl, pr) = pads
    pb, pr = pb + extra_h, pr + extra_w
    if not (pt or pb or pl or pr):
        return a
    n, c, h, w = a.shape
    shape = (n, c, h + pt + pb, w + pl + pr)
    buf = np.zeros(shape, dtype=a.dtype) if value == 0 else np.full(shape, value, dtype=a.dtype)
    buf[:, :, pt:pt + h, pl:pl + w] = a
    return buf


def _taps(a, oh, ow, kh, kw, stride, dilation):
    """For each kernel tap (i, j): the (N, C, oh, ow) strided view of ``a`` it reads."""
    (sh, sw), (dh, dw) = stride, dilation
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            yield i, j, a[:, :, y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw]


def strided_view(a, shape, strides, offset=0):
    """A read-only view of ``a``'s memory from ``offset`` bytes on, with the given shape and
    byte strides (which must stay inside ``a``). A C-contiguous ``a`` is viewed through the
    ndarray constructor (~0.3 us; numpy's as_strided costs ~7 us a call, a good part of a small
    convolution)."""
    if a.flags.c_contiguous and a.size:
        v = np.ndarray(shape, a.dtype, a, offset, strides)
        v.flags.writeable = False
        return v
    if offset:
        raise ValueError("strided_view: an offset needs a C-contiguous array")
    return as_strided(a, shape=shape, strides=strides, writeable=False)


def _cols(a, oh, ow, kh, kw, stride, dilation):
    """im2col: the (N, C, kh, kw, oh, ow) copy of the windows of the padded ``a``, made by one
    strided-view copy (one C loop; a copy per tap costs twice as much on small inputs)."""
    s0, s1, s2, s3 = a.strides
    (sh, sw), (dh, dw) = stride, dilation
    v = strided_view(a, a.shape[:2] + (kh, kw, oh, ow), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw))
    return np.ascontiguousarray(v)


def _conv2d(out, x, weight, bias=None, *, stride, padding, dilation, groups):
    n, o, oh, ow = out.shape
    _, cg, kh, kw = weight.shape
    c = x.shape[1]
    if n * o * oh * ow == 0:
        return np.zeros(out.shape, np_dtype(out.dtype))
    a = _f(x)
    w = _f(weight)
    g = groups
    if g == c and cg == 1 and c > 1:
        y = _conv_depthwise_native(a, w, None if bias is None else _f(bias), o // g, oh, ow, kh, kw, stride,
                                   padding, dilation)
        if y is not None:                    # (the bias is in it)
            return _out(y, out)
        y = _conv_depthwise(a, w, o // g, oh, ow, kh, kw, stride, padding, dilation)
    else:
        og = o // g
        if g == 1:
            y = _conv_dense_native(a, w, None if bias is None else _f(bias), oh, ow, kh, kw, stride, padding,
                                   dilation)
            if y is not None:                # (the bias is in it)
                return _out(y, out)
        if kh == kw == 1 and padding == ((0, 0), (0, 0)):
            # 1x1: the input itself (strided: its subsampled view) is the column matrix
            if stride != (1, 1):
                a = a[:, :, ::stride[0], ::stride[1]][:, :, :oh, :ow]
            cols = a.reshape(n, g, cg, oh * ow)                                  # copies only if strided
        else:
            if g == 1 and x._buf.dtype == weight._buf.dtype == np.float32 \
                    and _winograd_case(c, o, oh, ow, kh, kw, stride, dilation):
                y = _conv_winograd(a, w, padding)
                if y is not None:
                    if bias is not None:
                        y += _f(bias).reshape(1, o, 1, 1)
                    return _out(y, out)
            ap = _padded(a, padding)
            if n == 1 and g == 1 and cg * kh * kw * oh * ow * 4 > _COLS_BYTES and oh > 1:
                y = _conv_tiled(ap, w.reshape(o, cg * kh * kw), oh, ow, kh, kw, stride, dilation)
                if bias is not None:
                    y += _f(bias).reshape(1, o, 1, 1)
                return _out(y, out)
            # im2col straight into (n, g, cg*kh*kw, oh*ow): the GEMM below then writes NCHW order,
            # so neither the columns nor the result need a transpose
            cols = _cols(ap, oh, ow, kh, kw, stride, dilation).reshape(n, g, cg * kh * kw, oh * ow)
        wm = w.reshape(g, og, cg * kh * kw)
        if n == 1 and g == 1:
            y = matmul(wm[0], cols[0, 0])                                          # one GEMM
        else:
            y = matmul(wm, cols)                                                  # (n, g, og, oh*ow)
        y = y.reshape(n, o, oh, ow)
    if bias is not None:
        y += _f(bias).reshape(1, o, 1, 1)
    return _out(y, out)


# im2col columns larger than this are made and multiplied a slice at a time, so that each slice
# is still in the (per-core) L2 cache when the GEMM reads it: one 44 MB matrix for a 3x3
# convolution of 16 channels at 240x320 went out to memory twice (and, above glibc's mmap
# threshold, came back as fresh zero pages on every call)
_COLS_BYTES = 512 << 10


def _conv_tiled(ap, wm, oh, ow, kh, kw, stride, dilation):
    """One image (``ap`` padded, (1, C, H, W)), groups 1: im2col and GEMM a band of output rows
    at a time, each band's product written straight into its columns of the (O, oh*ow) result."""
    o, kk = wm.shape
    y = np.empty((o, oh * ow), np.float32 if ap.dtype != np.float64 else ap.dtype)
    rows = max(1, _COLS_BYTES // (kk * ow * 4))
    sh = stride[0]
    starts = range(0, oh, rows)

    def band(i):
        r0 = starts[i]
        r1 = min(oh, r0 + rows)
        cols = _cols(ap[:, :, r0 * sh:], r1 - r0, ow, kh, kw, stride, dilation).reshape(kk, (r1 - r0) * ow)
        matmul(wm, cols, out=y[:, r0 * ow:r1 * ow])
    parallel_for(len(starts), band)               # (bands on this thread and any helper thread)
    return y.reshape(1, o, oh, ow)


# ---- Winograd F(2x2, 3x3) for stride-1 3x3 convolutions -----------------------------------------

# tile rows per band: at least 4 (a band copies one more row of its input's parity planes), more
# while its working set (~(10 C + 12 O) floats per tile: parity planes, a row of B^T d, its 4
# transforms; the GEMMs' results and the two rows of A^T M) stays about this size (each band is
# ~40 numpy calls). Measured, best of 9, 96->24: 120x160 rows 2/3/4/6/8 11.5/10.0/9.6/11.9/11.7 ms,
# 60x80 3.2/2.7/2.6/2.7/2.9; 4 rows on 32->16 at 60x80 were 1.3x slower than 24
_WINO_BAND_MIN_ROWS = 4
_WINO_BAND_BYTES = 5 << 18
# when it is taken (_conv2d): where it measured faster than im2col (best of 5-15 alternating, load
# ~2, time ratio to im2col): at least 64 input channels (96->24 at 120x160 / 60x80 / 15x20: 0.68 /
# 0.65 / 0.85, 64->64 and 128->128 at 28x28 0.76, 128->32 0.72; 32->32 at 56x56 0.93, 48->48 at
# 28x28 0.88, 16->16 at 120x160 1.26), at most twice as many outputs (64->128 at 28x28 0.90,
# 64->256 0.95; 24->96 at 60x80 1.18: the output transform grows with them and im2col's GEMM is
# faster with many output rows) and enough tiles for the GEMMs (256->256 at 7x7 1.20, 10x10 1.00;
# 64->64 at 14x14 1.16, 128->128 0.75)
_WINO_MIN_CHANNELS = 64
_WINO_MAX_OUT_PER_IN = 2
_WINO_MIN_PIXELS = 144
_WINO_MIN_VALUES = 1 << 14          # input channels x output pixels


def _winograd_case(c, o, oh, ow, kh, kw, stride, dilation) -> bool:
    """Whether a float32 groups-1 convolution of c -> o channels at oh x ow output pixels takes
    _conv_winograd (3x3, stride and dilation 1, the sizes above)."""
    return (kh == kw == 3 and stride == dilation == (1, 1) and c >= _WINO_MIN_CHANNELS
            and o <= _WINO_MAX_OUT_PER_IN * c and oh * ow >= _WINO_MIN_PIXELS and c * oh * ow >= _WINO_MIN_VALUES)


def _wino_weights(w):
    """(16, O, C) float32: G g G^T of each (O, C) 3x3 kernel g, computed in float64 and rounded
    once (tile position 4 * i + j first); made once per weight buffer (_derived)."""
    return _derived(w, "winograd", _wino_transform)


def _wino_transform(w):
    o, c = w.shape[:2]
    g = w.astype(np.float64).transpose(2, 3, 0, 1)                                 # (3, 3, o, c)
    r = np.empty((4, 3, o, c))
    s = g[0] + g[2]
    r[0], r[1], r[2], r[3] = g[0], (s + g[1]) * 0.5, (s - g[1]) * 0.5, g[2]          # G g
    u = np.empty((4, 4, o, c), np.float32)
    s = r[:, 0] + r[:, 2]
    u[:, 0], u[:, 1], u[:, 2], u[:, 3] = r[:, 0], (s + r[:, 1]) * 0.5, (s - r[:, 1]) * 0.5, r[:, 2]   # (G g) G^T
    return u.reshape(16, o, c)


def _wino_span(p, start, pad, size, count):
    """Plane indices [s0, s1) of padded positions 2 * (start + s) + p (s < count) that hold input
    values (pad zeros before ``size`` of them), and the input index at s0."""
    base = 2 * start + p - pad
    s0 = max(0, (1 - base) // 2)
    s1 = max(s0, min(count, (size - 1 - base) // 2 + 1))
    return s0, s1, base + 2 * s0


def _conv_winograd(a, w, padding):
    """3x3 convolution, stride 1, dilation 1, groups 1, float32 ``a`` (N, C, H, W) and ``w``
    (O, C, 3, 3) by Winograd's F(2x2, 3x3) (None where the result is not finite: see the end):
    each 2x2 block of outputs from the 4x4 padded input
    tile d at its top left, Y = A^T [sum_c (G g G^T) * (B^T d B)] A. The channel sums are 16
    GEMMs, one per tile position, with 16 * O * C products per 2x2 block instead of im2col's
    36 * O * C (2.25x fewer); B^T d B costs 8 additions per tile and channel, A^T M A 12 per
    block and output channel, all numpy passes over a band of tile rows at a time, and each
    row i of B^T d is transformed, multiplied and summed into the output before the next, so
    that a band's intermediates stay in the caches. PP-OCR det's 96->24 at 120x160: 14.2 ->
    ~9.6 ms on one core.

    Accuracy: the input and output transforms only add and subtract, and G g G^T is computed in
    float64 and rounded once, so the result differs from the exact sum by float32 rounding of
    a differently ordered sum. Its bound is eps32 * (C + 8) * M_abs per output, M_abs being the
    algorithm run on |d|, |g| with |B|, |G|, |A| (2 roundings in B^T d B, 1 in G g G^T, 1 per
    product, C - 1 in the channel sum, 4 in A^T M A); M_abs is a few times sum |w x|, so the
    bound is a few times a direct sum's. Measured it is smaller than im2col's own error
    (relative to the largest output, ~4e-7 vs 7e-7 on 96 channels of [0, 1) inputs);
    tests/test_numpy_winograd.py checks the bound."""
    n, c, h, wd = a.shape
    o = w.shape[0]
    (pt, pb), (pl, pr) = padding
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = (oh + 1) // 2, (ow + 1) // 2               # tiles (an odd size computes one more row/column)
    w1 = tw + 1                                          # tiles per row plus one junk column (see below)
    u = _wino_weights(w)
    y = np.empty((n, o, th, 2, tw, 2), np.float32)
    rows = max(1, min(th, max(_WINO_BAND_MIN_ROWS, _WINO_BAND_BYTES // ((10 * c + 12 * o) * w1 * 4))))
    # the band's padded input by row and column parity: [p, q, :, s, j] = padded row
    # 2 * (t0 + s) + p, column 2 * j + q; a tile's columns are then runs of two planes, and the
    # band's tiles one flat run per channel. Columns that are padding are zeroed once.
    planes = np.empty((2, 2, c, rows + 1, w1), np.float32)
    cols = [_wino_span(q, 0, pl, wd, w1) for q in range(2)]
    for q, (j0, j1, _) in enumerate(cols):
        planes[:, q, :, :, :j0] = 0
        planes[:, q, :, :, j1:] = 0
    ub = np.empty((2, c * rows * w1), np.float32)
    vb = np.empty((4, c * rows * w1), np.float32)
    for b in range(n):
        for t0 in range(0, th, rows):
            t1 = min(th, t0 + rows)
            rr, m = t1 - t0, (t1 - t0) * w1                                            # rows, tiles in the band
            k = c * m
            zp = planes if rr == rows else np.zeros((2, 2, c, rr + 1, w1), np.float32)  # (the last band: short)
            for p in range(2):
                s0, s1, i0 = _wino_span(p, t0, pt, h, rr + 1)
                for q, (j0, j1, k0) in enumerate(cols):
                    dst = zp[p, q]
                    dst[:, :s0] = 0
                    dst[:, s1:] = 0
                    if s1 > s0 and j1 > j0:
                        dst[:, s0:s1, j0:j1] = a[b, :, i0:i0 + 2 * (s1 - s0) - 1:2, k0:k0 + 2 * (j1 - j0) - 1:2]
            for i in range(4):
                # row i of B^T d: of the tile's rows 0..3 (plane rows s, s + 1 of parities 0, 1),
                # d0 - d2, d1 + d2, d2 - d1 or d1 - d3, for both column parities
                for q in range(2):
                    e, f = zp[0, q].reshape(c, -1), zp[1, q].reshape(c, -1)
                    x0, x1 = ((e[:, :m], e[:, w1:]), (f[:, :m], e[:, w1:]), (e[:, w1:], f[:, :m]),
                              (f[:, :m], f[:, w1:]))[i]
                    (np.add if i == 1 else np.subtract)(x0, x1, out=ub[q, :k].reshape(c, m))
                # times B: columns j and j + 1 of both parities, over the band flattened: a row's
                # last tile (j = tw) reads the next row's first column, a junk column that the
                # GEMM carries along and the output drops
                ue, uo = ub[0, :k], ub[1, :k]
                e0, e1, e2, e3 = ue[:k - 1], uo[:k - 1], ue[1:], uo[1:]
                np.subtract(e0, e2, out=vb[0, :k - 1])
                np.add(e1, e2, out=vb[1, :k - 1])
                np.subtract(e2, e1, out=vb[2, :k - 1])
                np.subtract(e1, e3, out=vb[3, :k - 1])
                vb[:, k - 1] = 0
                mi = matmul(u[4 * i:4 * i + 4], vb[:, :k].reshape(4, c, m))            # (4, o, m)
                # A^T's rows (1, 1, 1, 0) and (0, 1, -1, -1) over i
                if i == 0:
                    r0 = mi
                elif i == 1:
                    r0 += mi
                    r1 = mi
                elif i == 2:
                    r0 += mi
                    r1 -= mi
                else:
                    r1 -= mi
            # and over j, into the output's 2x2 blocks
            yb = y[b, :, t0:t1]
            for r, s in enumerate((r0, r1)):
                s = s.reshape(4, o, rr, w1)[..., :tw]
                y0 = np.add(s[0], s[1], out=yb[:, :, r, :, 0])
                y0 += s[2]
                y1 = np.subtract(s[1], s[2], out=yb[:, :, r, :, 1])
                y1 -= s[3]
    y = y.reshape(n, o, 2 * th, 2 * tw)
    if (2 * th, 2 * tw) != (oh, ow):
        y = np.ascontiguousarray(y[:, :, :oh, :ow])
    # an infinite or NaN input (or a transform that overflows) would not stay in its own windows:
    # the tile's transforms subtract it from itself (inf - inf), so every output of the tiles that
    # read it would be NaN. Then the caller convolves by im2col, whose NaN and infinities are
    # those of a direct sum (~40 us on PP-OCR det's 24x120x160 result)
    if not np.isfinite(y).all():
        return None
    return y


# the native depthwise kernel (core/native/conv.c) over ranges of whole input planes: on more
# than one thread from this many multiply-adds, in this many ranges per thread (handed out to
# whichever thread is free: numpy_blas.parallel_for). Below it, waking the helper thread costs
# more than it saves (7x7 to 28x28 planes: 1.3-2x slower on two threads, load ~0.4)
_NATIVE_DW_PARALLEL_MACS = 1 << 22
_NATIVE_DW_RANGES_PER_THREAD = 2
# what the kernel takes (conv.c's MAX_TAPS and MAX_STRIDE); other cases run the numpy paths
_NATIVE_DW_MAX_TAPS = 256
_NATIVE_DW_MAX_STRIDE = 16
# scratch (one padded input plane) up to this many floats is kept per thread between calls
_NATIVE_DW_KEEP = 1 << 22
_native_scratch = threading.local()
_P, _I64 = ctypes.c_void_p, ctypes.c_int64


def _scratch_for(count=0):
    """This thread's float32 scratch of at least ``count`` floats and its address (kept for the
    next call up to _NATIVE_DW_KEEP floats, else a fresh one)."""
    got = getattr(_native_scratch, "buf", None)
    if got is not None and got[0].size >= count:
        return got
    buf = np.empty(max(count, 1 << 14), np.float32)
    got = (buf, buf.ctypes.data)
    if buf.size <= _NATIVE_DW_KEEP:
        _native_scratch.buf = got
    return got


_char_at, _address = ctypes.c_char.from_buffer, ctypes.addressof


# ---- the kernels' second thread (core/native/team.c) ----------------------------------------------

# kernels go to the team from this many multiply-adds (a spinning helper joins in ~1 us; a sleeping
# one is woken, and the caller runs items until it comes)
_GEMV_TEAM_MACS = 1 << 18
_ATTENTION_TEAM_MACS = 1 << 19
# 1x1 products are split by output channels: each thread reads the whole input, so few channels
# (16-48: MobileNetV3's projections) ran slower on two cores (the input crossing to the other
# core's cache), 64 and more faster (96 -> 576 at 7x7: 41 -> 27 us)
_GEMM_TEAM_MIN_ROWS = 64
_CONV_TEAM_MACS = 1 << 18
_TEAM_IDLE_NS = 500_000        # a helper with no job for this long stops spinning (sleeps until woken)
_TEAM_ITEMS = 4                # items a job is cut into (the caller takes them all if the helper is late)
_J_LINEAR, _J_DEPTHWISE, _J_GEMM, _J_DIRECT, _J_GEMV, _J_ATTENTION = 1, 2, 3, 4, 5, 6


class Team:
    """One helper thread for the native kernels (team.c): a daemon Python thread inside
    ember_team_serve (the GIL released), spinning on an int64 control block for jobs; the caller
    publishes a job with ember_team_run, runs items itself and waits for the helper's, no Python
    between them (parallel_for's handoff cost 20-50 us on a 2-vCPU VM: here a spinning helper
    joins within ~1 us). Where the helper sleeps (after _TEAM_IDLE_NS without a job, or parked:
    numpy_plan parks it when a replay ends), a job wakes it and the caller runs the items until it
    comes. ``team()`` gives the one for the loaded library, or None (no library, one thread)."""

    def __init__(self, lib):
        self.lib = lib
        self.ctl = np.zeros(16, np.int64)
        self.ctlp = self.ctl.ctypes.data
        self.run = native.kernel("ember_team_run", _I64, _P, _I64, _P, _P, _P, _P, _P, _I64)
        self.serve = native.kernel("ember_team_serve", _I64, _P, _I64)
        self.event = threading.Event()
        self.lock = threading.Lock()                # (one caller at a time; another runs alone)
        self.active = False
        self.scratch = np.empty(0, np.float32)     # (the helper's own scratch: ``scratch_for``)
        threading.Thread(target=self._loop, daemon=True, name="ember-native-team").start()

    def _loop(self):
        while True:
            self.event.wait()
            self.event.clear()
            self.serve(self.ctlp, _TEAM_IDLE_NS)

    def __call__(self, kind, args, d0=None, d1=None, d2=None, d3=None, n=_TEAM_ITEMS):
        """Run job ``kind`` (team.c's kinds) with the argument array's address ``args`` and the
        per-call pointers in ``n`` items: the first error code of its kernels (0: done), or None
        where another thread is using the team (then the caller runs the kernel alone)."""
        if not self.lock.acquire(False):
            return None
        try:
            ctl = self.ctl
            ctl[11] = 0                              # (unparked)
            if not ctl[10]:                          # (not spinning: wake it; the caller starts alone)
                self.event.set()
            self.active = True
            return self.run(self.ctlp, kind, args, d0, d1, d2, d3, n)
        finally:
            self.lock.release()

    def park(self):
        """Stop the helper's spinning (until the next job)."""
        self.ctl[11] = 1
        self.active = False

    def scratch_for(self, count):
        """The helper's scratch of at least ``count`` floats (kept) and its address."""
        if self.scratch.size < count:
            self.scratch = np.empty(max(count, 1 << 14), np.float32)
        return self.scratch, self.scratch.ctypes.data


_teams: dict = {}


def team():
    """The Team of the loaded library where more than one thread is allowed (numpy_blas.threads()),
    else None."""
    lib = native.lib()
    if lib is None or threads() < 2:
        return None
    t = _teams.get(id(lib))
    if t is None or t.lib is not lib:
        if native.kernel("ember_team_run", _I64) is None:
            return None
        t = _teams[id(lib)] = Team(lib)
    return t


def park_team() -> bool:
    """Park the helpers a job woke (numpy_plan: a replay's end); whether there was one."""
    woke = False
    for t in _teams.values():
        if t.active:
            t.park()
            woke = True
    return woke


def wake_team() -> None:
    """Wake the loaded library's team's helper ahead of its first job (numpy_plan: a replay's start,
    where the last run used the team: a helper woken by the job itself joins ~50 us late)."""
    t = team()
    if t is not None:
        t.ctl[11] = 0
        if not t.ctl[10]:
            t.event.set()
        t.active = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_teams.clear)       # (a forked child has no helper thread)


def _addr(a) -> int:
    """The address of a C-contiguous array's data through ctypes' buffer export (~0.25 us) where
    the array is writable, else ``a.ctypes.data`` (~1 us)."""
    try:
        return _address(_char_at(a))
    except (TypeError, ValueError, BufferError):   # read-only
        return a.ctypes.data


# one-range depthwise calls seen before: (weight ref, bias ref or None, library, kernel, addresses
# of the weight / bias / geometry, output shape, planes, the arrays kept alive), by (id(w),
# id(bias), input shape, the geometry): ~10 -> ~4 us of Python a call (MobileNetV3 makes 11)
_DW_CALLS: dict = {}
_DW_CALLS_MAX = 1024


def _conv_depthwise_native(a, w, bias, mult, oh, ow, kh, kw, stride, padding, dilation, act=None,
                           act_args=(0.0, 0.0, 0.0, 0.0)):
    """Depthwise convolution by the native kernel (core/native/conv.c: a zero-padded copy of each
    input plane, then blocks of output rows and 8-column vectors with the taps inside, the bias
    added first, then ``act`` (None, "relu", "clip", "hard_sigmoid", "hard_swish" with ``act_args``
    (a, b, lo, hi)) on each output plane while it is in the cache: dense.c's ember_activation, the
    bits of activation_ after it), float32 ``a`` (N, C, H, W) in any strides, ``w`` (C * mult, 1,
    kh, kw), ``bias`` (C * mult,) or None; the (N, C * mult, oh, ow) float32 result. None where the
    library is not in use (ember.native) or the kernel does not take the case: then the numpy
    paths run."""
    key = (id(w), id(bias), a.shape, mult, oh, ow, kh, kw, stride, padding, dilation, act, act_args)
    hit = _DW_CALLS.get(key)
    if hit is not None and hit[0]() is w and (hit[1] is None if bias is None else hit[1]() is bias) \
            and a.dtype == np.float32 and a.flags.c_contiguous and native.lib() is hit[2]:
        fn, ptrs, shape, planes = hit[3:7]
        y = np.empty(shape, np.float32)
        buf, ptr = _scratch_for()
        args = (_addr(a), ptrs[0], ptrs[1], _address(_char_at(y)), ptrs[2], ptrs[3], ptrs[4])
        r = fn(*args, ptr, buf.size, 0, planes)
        if r > 0:                            # (a larger scratch: the kernel wrote nothing)
            buf, ptr = _scratch_for(r)
            r = fn(*args, ptr, buf.size, 0, planes)
        if r:
            raise DeviceError(f"conv2d: the native depthwise kernel refused geometry {hit[8].tolist()} ({r})")
        return y
    n, c, h, wd = a.shape
    if a.dtype != np.float32 or w.dtype != np.float32 or (bias is not None and bias.dtype != np.float32) \
            or kh * kw > _NATIVE_DW_MAX_TAPS or stride[1] > _NATIVE_DW_MAX_STRIDE or h * wd == 0:
        return None
    fn = native.kernel("ember_conv_depthwise_act", _I64, _P, _P, _P, _P, _P, _P, _I64, _P, _I64, _I64, _I64)
    if fn is None:
        return None
    s0, s1, s2, s3 = a.strides
    if s0 % 4 or s1 % 4 or s2 % 4 or s3 % 4:
        a = np.ascontiguousarray(a)
        s0, s1, s2, s3 = a.strides
    (sh, sw), (dh, dw), ((pt, _), (pl, _)) = stride, dilation, padding
    geom = np.array([n, c, h, wd, s0 // 4, s1 // 4, s2 // 4, s3 // 4, mult, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl],
                    np.int64)
    if not w.flags.c_contiguous:
        w = np.ascontiguousarray(w)
    if bias is not None and not bias.flags.c_contiguous:
        bias = np.ascontiguousarray(bias)
    ap = np.array(act_args, np.float32)
    code = _NATIVE_DENSE_ACTS[act]
    y = np.empty((n, c * mult, oh, ow), np.float32)
    args = (a.ctypes.data, w.ctypes.data, None if bias is None else bias.ctypes.data, y.ctypes.data, geom.ctypes.data,
            ap.ctypes.data, code)
    planes = n * c
    parts = 1
    if planes > 1 and planes * mult * oh * ow * kh * kw >= _NATIVE_DW_PARALLEL_MACS:
        parts = min(planes, threads() * _NATIVE_DW_RANGES_PER_THREAD)

    def run(i):
        p0, p1 = planes * i // parts, planes * (i + 1) // parts
        buf, ptr = _scratch_for()
        r = fn(*args, ptr, buf.size, p0, p1)
        if r > 0:                            # (a larger scratch: the kernel wrote nothing)
            buf, ptr = _scratch_for(r)
            r = fn(*args, ptr, buf.size, p0, p1)
        if r:
            raise DeviceError(f"conv2d: the native depthwise kernel refused geometry {geom.tolist()} ({r})")
    if parts == 1:
        run(0)
        if a.flags.c_contiguous:
            if len(_DW_CALLS) >= _DW_CALLS_MAX:
                _DW_CALLS.clear()
            try:
                _DW_CALLS[key] = (weakref.ref(w), None if bias is None else weakref.ref(bias), native.lib(), fn,
                                  (w.ctypes.data, None if bias is None else bias.ctypes.data, geom.ctypes.data,
                                   ap.ctypes.data, code),
                                  y.shape, planes, (w, bias, ap), geom)
            except TypeError:                # (a buffer without weak references: not kept)
                pass
    else:
        parallel_for(parts, run)
    return y


# the native dense kernel (core/native/dense.c): a product of the packed weight by the input
# itself (1x1, stride 1, no padding) or by its im2col columns, the bias and an activation in its
# epilogue. Columns are split over threads from this many multiply-adds, in whole blocks of 32
# columns, this many ranges per thread; im2col columns above _NATIVE_DENSE_MAX_COLS floats and
# Winograd's cases keep the numpy paths (bands of columns, fewer products)
_NATIVE_DENSE_PARALLEL_MACS = 1 << 23
_NATIVE_DENSE_RANGES_PER_THREAD = 2
_NATIVE_DENSE_MAX_COLS = 1 << 21
# 1x1 convolutions from this many output pixels (one pixel: ember_gemv). Measured (conv2d_act with
# hard swish, median us, load 1.3, dense.c / BLAS + the activation pass): 96->576 at 7x7 73 / 88,
# 576->96 at 7x7 70 / 82, 48->288 at 7x7 23 / 32, 96->576 at 3x3 23 / 34, at 2x2 22 / 22
_NATIVE_DENSE_MIN_PIXELS = 9
_NATIVE_DENSE_MIN_PIXELS_COLS = 1024
_NATIVE_DENSE_MIN_K = 16
# dense.c's ember_conv_direct (no im2col matrix, a column panel per block of 32 pixels) for
# convolutions of at most this many taps per output (C * kh * kw; the kernel takes up to 4096) and
# at least this many output pixels. Measured, best of 3 x 40, load ~1.2, us, im2col + BLAS /
# direct: 3->16 3x3 s2 at 224x224 340 / 204 (1 thread), at 480x640 2005 / 1259; 16->32 3x3 at
# 28x28 (K = 144) 125 / 128, at 14x14 39 / 44 (MNIST's: left to BLAS); 96->24 3x3 at 120x160
# (K = 864) Winograd 9.6 ms / 15.5 ms (its cases stay Winograd's)
_NATIVE_DIRECT_MAX_K = 256
_NATIVE_DIRECT_MIN_PIXELS = 1024
_NATIVE_DIRECT_ROW_PANEL = 16384     # (dense.c's DIRECT_ROW_PANEL)
# dense.c's ember_conv_rows (stride 1, more taps: the padded input read in place) from this wide
# and this many output pixels
_NATIVE_ROWS_MIN_WIDTH = 16
_NATIVE_ROWS_MIN_PIXELS = 1024
# dense.c's ember_conv_pad (stride 1; the kernel copies the zero-padded rows it reads, two output rows
# per block; 2x2 max pooling in its epilogue for numpy_plan's conv + activation + pool step) below
# this many output pixels, where the kernels above are not taken. Measured (relu, median us, load
# ~0.3; im2col + BLAS or Winograd + the activation pass / ember_conv_pad's call alone): MNIST's 1->16
# 3x3 at 28x28 21 / 3.5, 16->32 at 14x14 40 / 14; 32->64 at 7x7 41 / 23; PP-OCR det's 96->24 at
# 15x20 (Winograd) 250 / 132; PP-OCR rec's 480->60 1x3 at 1x40 93 / 71, 960->60 171 / 137; 64->64 at
# 16x16 263 / 100; at 32x32 (1024 pixels) ember_conv_rows 390 / 454: left to it
_NATIVE_PAD_MAX_PIXELS = 1024
# dense.c's ember_gemv (one output pixel of a 1x1 convolution, one row of a linear) up to this many
# multiply-adds; larger products keep BLAS (its threads)
_NATIVE_GEMV_MAX_MACS = 1 << 23
_NATIVE_DENSE_ACTS = {None: 0, "relu": 1, "clip": 2, "hard_sigmoid": 3, "hard_swish": 4}


# 1x1 convolutions with a bias seen before: (weight ref, bias ref, library, kernel, addresses of the
# packed weight / bias / geometry / activation parameters, output shape, pixels, the arrays kept
# alive, geometry), by (id(w), id(bias), input shape, kernel size, padding, stride, activation)
_DENSE_CALLS: dict = {}
_DENSE_CALLS_MAX = 1024


def _pack_dense(w):
    """(O, K) float32 weight as dense.c's panels: (ceil(O / 8), K, 8), rows past O zero."""
    o, k = w.shape[0], w.size // max(1, w.shape[0])
    p = -(-o // 8)
    wp = np.zeros((p * 8, k), np.float32)
    wp[:o] = w.reshape(o, k)
    return np.ascontiguousarray(wp.reshape(p, 8, k).transpose(0, 2, 1))


def _conv_dense_native(a, w, bias, oh, ow, kh, kw, stride, padding, dilation, act=None, act_args=(0, 0, 0, 0)):
    """Groups-1 convolution by the native kernel (core/native/dense.c), float32 ``a`` (N, C, H, W),
    ``w`` (O, C, kh, kw), ``bias`` (O,) or None, then ``act`` (None, "relu", "clip",
    "hard_sigmoid", "hard_swish" with ``act_args`` (a, b, lo, hi)); the (N, O, oh, ow) float32
    result. None where the library is not in use or the case is not taken: Winograd's cases,
    im2col columns above _NATIVE_DENSE_MAX_COLS floats, other dtypes."""
    key = (id(w), id(bias), a.shape, kh, kw, padding, stride, act, act_args)
    hit = _DENSE_CALLS.get(key)
    if hit is not None and hit[0]() is w and hit[1]() is bias and a.flags.c_contiguous and a.dtype == np.float32 \
            and native.lib() is hit[2]:
        # a 1x1 convolution seen before with these buffers: the packed weight, geometry and their
        # addresses kept (~11 -> ~4 us of Python a call; MobileNetV3 makes ~40 of them)
        fn, ptrs, shape, npix = hit[3:7]
        y = np.empty(shape, np.float32)
        if fn(ptrs[0], a.ctypes.data, ptrs[1], y.ctypes.data, ptrs[2], ptrs[3], 0, npix):
            raise DeviceError(f"conv2d: the native dense kernel refused geometry {hit[8].tolist()}")
        return y
    n, c, h, wd = a.shape
    o = w.shape[0]
    if a.dtype != np.float32 or w.dtype != np.float32 or (bias is not None and bias.dtype != np.float32):
        return None
    one = kh == kw == 1 and padding == ((0, 0), (0, 0)) and stride == (1, 1)
    k = c * kh * kw
    direct = not one and k <= _NATIVE_DIRECT_MAX_K
    taps = not one and not direct and stride == (1, 1) and ow >= _NATIVE_ROWS_MIN_WIDTH \
        and oh * ow >= _NATIVE_ROWS_MIN_PIXELS
    if one and n == 1 and oh * ow == 1:
        return _conv_gemv_native(key, a, w, bias, o, c, act, act_args)
    if _pad_case(c, o, oh, ow, kh, kw, stride, padding, dilation, 0):
        return _conv_pad_native(a, w, bias, oh, ow, kh, kw, padding, dilation, act, act_args)
    if direct:
        if oh * ow < _NATIVE_DIRECT_MIN_PIXELS:
            return None
    elif taps:
        pass
    elif oh * ow < (_NATIVE_DENSE_MIN_PIXELS if one else _NATIVE_DENSE_MIN_PIXELS_COLS) or k < _NATIVE_DENSE_MIN_K:
        return None
    if not one and not direct and not taps:
        if k * oh * ow > _NATIVE_DENSE_MAX_COLS:
            return None
        if _winograd_case(c, o, oh, ow, kh, kw, stride, dilation):
            return None
    fn = native.kernel("ember_conv_gemm", _I64, _P, _P, _P, _P, _P, _P, _I64, _I64)
    if fn is None:
        return None
    wp = _derived(w, "dense8", _pack_dense)
    if bias is not None and not bias.flags.c_contiguous:
        bias = np.ascontiguousarray(bias)
    npix = oh * ow
    y = np.empty((n, o, oh, ow), np.float32)
    ap = np.array(act_args, np.float32)
    geom = np.array([o, k, npix, npix, npix, _NATIVE_DENSE_ACTS[act]], np.int64)
    blocks = -(-npix // 32)
    parts = 1
    if blocks > 1 and o * k * npix >= _NATIVE_DENSE_PARALLEL_MACS:
        parts = min(blocks, threads() * _NATIVE_DENSE_RANGES_PER_THREAD)
    if direct:
        return _conv_direct_native(a, wp, bias, y, oh, ow, kh, kw, stride, padding, dilation, act, ap)
    if taps:
        return _conv_rows_native(a, wp, bias, y, oh, ow, kh, kw, padding, dilation, act, ap)
    if one and n == 1 and parts == 1 and bias is not None and a.flags.c_contiguous:
        if len(_DENSE_CALLS) >= _DENSE_CALLS_MAX:
            _DENSE_CALLS.clear()
        try:
            _DENSE_CALLS[key] = (weakref.ref(w), weakref.ref(bias), native.lib(), fn,
                                 (wp.ctypes.data, bias.ctypes.data, geom.ctypes.data, ap.ctypes.data), y.shape, npix,
                                 (wp, bias, ap), geom)
        except TypeError:                    # (a buffer without weak references: not kept)
            pass
    for b in range(n):
        if one:
            x = a[b].reshape(c, npix) if a[b].flags.c_contiguous else np.ascontiguousarray(a[b]).reshape(c, npix)
        else:
            x = _cols(_padded(a[b:b + 1], padding), oh, ow, kh, kw, stride, dilation).reshape(k, npix)
        args = (wp.ctypes.data, x.ctypes.data, None if bias is None else bias.ctypes.data, y[b].ctypes.data,
                geom.ctypes.data, ap.ctypes.data)

        def run(i):
            r = fn(*args, 32 * (blocks * i // parts), min(npix, 32 * (blocks * (i + 1) // parts)))
            if r:
                raise DeviceError(f"conv2d: the native dense kernel refused geometry {geom.tolist()} ({r})")
        parallel_for(parts, run)      # (one part: run(0) on this thread)
    return y


def _gemv_native(w, x, bias, act=None, act_args=(0, 0, 0, 0)):
    """``act(w @ x + bias)`` by dense.c's ember_gemv: float32 ``w`` (M, K) C-contiguous, ``x`` (K,)
    contiguous, ``bias`` (M,) or None; the (M,) float32 result. None where the library is not in
    use or the case is not taken (other dtypes, more than _NATIVE_GEMV_MAX_MACS: BLAS's threads)."""
    m, k = w.shape
    if w.dtype != np.float32 or x.dtype != np.float32 or (bias is not None and bias.dtype != np.float32) \
            or not m or not k or m * k > _NATIVE_GEMV_MAX_MACS or x.shape != (k,) \
            or (bias is not None and bias.shape != (m,)):
        return None
    fn = native.kernel("ember_gemv", _I64, _P, _P, _P, _P, _P, _P, _I64, _I64)
    if fn is None:
        return None
    w = w if w.flags.c_contiguous else np.ascontiguousarray(w)
    x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    if bias is not None and not bias.flags.c_contiguous:
        bias = np.ascontiguousarray(bias)
    y = np.empty(m, np.float32)
    geom = np.array([m, k, 1, 1, 1, _NATIVE_DENSE_ACTS[act]], np.int64)
    ap = np.array(act_args, np.float32)
    if fn(w.ctypes.data, x.ctypes.data, None if bias is None else bias.ctypes.data, y.ctypes.data,
          geom.ctypes.data, ap.ctypes.data, 0, m):
        raise DeviceError(f"linear: the native matrix-vector kernel refused geometry {geom.tolist()}")
    return y


class NativeGemv:
    """``act(w @ x + bias)`` by dense.c's ember_gemv for one float32 weight (M, K) and bias (M,) or
    None (numpy_plan's one-row linear [+ relu / clip] step): the addresses of the weight, bias,
    geometry and activation parameters taken once, ~8 -> ~1.5 us of Python a call. ``ok``: whether
    the kernel takes them (the library in use, float32, at most _NATIVE_GEMV_MAX_MACS); calling it
    with ``x`` gives the (M,) result, or None where it cannot run now (the library not in use on
    this thread, ``x`` not K contiguous float32 values): then the caller runs the numpy path."""

    __slots__ = ("w", "bias", "ok", "lib", "fn", "m", "k", "ptrs", "keep", "args")

    def __init__(self, w, bias, act=None, act_args=(0, 0, 0, 0)):
        self.w, self.bias, self.ok, self.args = w, bias, False, None
        lib = native.lib()
        if lib is None or not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 2 or not w.size \
                or w.size > _NATIVE_GEMV_MAX_MACS or (bias is not None and (
                    not isinstance(bias, np.ndarray) or bias.dtype != np.float32 or bias.shape != (w.shape[0],))):
            return
        fn = native.kernel("ember_gemv", _I64, _P, _P, _P, _P, _P, _P, _I64, _I64)
        if fn is None:
            return
        m, k = w.shape
        wc = np.ascontiguousarray(w)
        bc = None if bias is None else np.ascontiguousarray(bias)
        geom = np.array([m, k, 1, 1, 1, _NATIVE_DENSE_ACTS[act]], np.int64)
        ap = np.array(act_args, np.float32)
        self.lib, self.fn, self.m, self.k = lib, fn, m, k
        self.ptrs = (wc.ctypes.data, None if bc is None else bc.ctypes.data, geom.ctypes.data, ap.ctypes.data)
        self.keep = (wc, bc, geom, ap)
        self.ok = True

    def __call__(self, x):
        if native.lib() is not self.lib or x.dtype != np.float32 or x.size != self.k or not x.flags.c_contiguous:
            return None
        y = np.empty(self.m, np.float32)
        p = self.ptrs
        xp, yp = _addr(x), _address(_char_at(y))
        r = None
        if self.m * self.k >= _GEMV_TEAM_MACS and self.m >= 16:
            tm = team()                      # (rows over two threads: the weight's bandwidth of two cores)
            if tm is not None:
                if self.args is None:
                    self.args = np.array((p[0], p[1] or 0, p[2], p[3], self.m), np.int64)
                r = tm(_J_GEMV, self.args.ctypes.data, xp, yp)
        if r is None:
            r = self.fn(p[0], xp, p[1], yp, p[2], p[3], 0, self.m)
        if r:
            raise DeviceError(f"linear: the native matrix-vector kernel refused geometry {self.keep[2].tolist()}")
        return y


# fused.c's ember_linear (numpy_plan's linear steps with a layer norm before them, an activation
# or a residual add after them): the activation codes it takes (vec.h's)
_LINEAR_ACTS = {None: 0, "relu": 1, "clip": 2, "hard_sigmoid": 3, "hard_swish": 4, "gelu": 5, "gelu_tanh": 6}
# rows split over threads from this many multiply-adds (an encoder's 256 x 128 -> 128 linear is
# 4.2M: ~45 us on one core; parallel_for's handoff costs ~5-15 us, 15-40 under load), in
# blocks of _LINEAR_ROW_BLOCK rows (the kernel's 8-row blocks whole), this many ranges per thread
_LINEAR_PARALLEL_MACS = 1 << 25
# from this many multiply-adds rows go to the native team (Team: a spinning helper, ~1 us to join)
_LINEAR_TEAM_MACS = 1 << 20
_LINEAR_ROW_BLOCK = 8
_LINEAR_RANGES_PER_THREAD = 1


class NativeLinear:
    """``act(ln(x) @ w.T + bias) + res`` by fused.c's ember_linear for one float32 weight (N, K):
    the weight packed once, the bias (N,) or None, ``act`` one of _LINEAR_ACTS (with ``act_args``
    (a, b, lo, hi) for clip / hard sigmoid / hard swish), ``ln`` None or a layer norm of x's rows
    first, (weight (K,), bias (K,), eps) (numpy_plan's fused linear step: layer norm, linear,
    activation and residual add as one call; the layer norm's bits are rows.c's ember_layer_norm,
    GELU's ember_gelu_erf's, the add numpy's). ``ok``: whether the kernel takes them (the library
    in use, float32). Calling it with x (..., K) and res (..., N) or None gives the (rows, N)
    result, or None where it cannot run now (the library not in use on this thread, other dtypes,
    non-contiguous arrays): then the caller runs the numpy path. Rows are split over the threads
    from _LINEAR_PARALLEL_MACS multiply-adds (the same bits on any number of threads)."""

    __slots__ = ("w", "bias", "ln", "ok", "lib", "fn", "n", "k", "ptrs", "keep")

    def __init__(self, w, bias=None, act=None, act_args=(0, 0, 0, 0), ln=None):
        self.w, self.bias, self.ln, self.ok = w, bias, ln, False
        lib = native.lib()
        f32 = np.float32
        if lib is None or not isinstance(w, np.ndarray) or w.dtype != f32 or w.ndim != 2 or not w.size \
                or (bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != f32
                                          or bias.shape != (w.shape[0],))):
            return
        n, k = w.shape
        if ln is not None and any(not isinstance(t, np.ndarray) or t.dtype != f32 or t.size != k for t in ln[:2]):
            return
        fn = native.kernel("ember_linear", _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64)
        pack = native.kernel("ember_linear_pack", _I64, _P, _I64, _I64, _I64, _P, _I64)
        if fn is None or pack is None:
            return
        wc = np.ascontiguousarray(w)
        need = pack(wc.ctypes.data, n, k, k, None, 0)
        wp = np.empty(max(need, 1), f32)
        if need <= 0 or pack(wc.ctypes.data, n, k, k, wp.ctypes.data, need) != need:
            return
        bc = None if bias is None else np.ascontiguousarray(bias)
        lw = lb = None
        eps = 0.0
        if ln is not None:
            lw, lb = np.ascontiguousarray(ln[0]).reshape(k), np.ascontiguousarray(ln[1]).reshape(k)
            eps = float(np.float32(ln[2]))
        ap = np.array(tuple(act_args) + (eps,), f32)
        self.lib, self.fn, self.n, self.k = lib, fn, n, k
        self.ptrs = (wp.ctypes.data, None if bc is None else bc.ctypes.data, ap.ctypes.data,
                     None if lw is None else lw.ctypes.data, None if lb is None else lb.ctypes.data,
                     _LINEAR_ACTS[act])
        self.keep = (wp, bc, ap, lw, lb)
        self.ok = True

    def __call__(self, x, res=None):
        n, k = self.n, self.k
        if native.lib() is not self.lib or x.dtype != np.float32 or not x.flags.c_contiguous or not x.size \
                or x.shape[-1] != k:
            return None
        m = x.size // k
        if res is not None and (res.dtype != np.float32 or not res.flags.c_contiguous or res.size != m * n):
            return None
        y = np.empty((m, n), np.float32)
        wp, bp, app, lwp, lbp, act = self.ptrs
        g = np.array((m, k, n, k, n, n, act), np.int64)
        xp, yp, rp, gp = _addr(x), _address(_char_at(y)), None if res is None else _addr(res), g.ctypes.data
        fn = self.fn
        parts = 1
        if m * k * n >= _LINEAR_TEAM_MACS and m > _LINEAR_ROW_BLOCK:
            tm = team()
            if tm is not None:
                need = k * 8 if lwp is not None else 0
                s0, s1 = _scratch_for(need)[1], tm.scratch_for(need)[1]
                args = np.array((lwp or 0, lbp or 0, wp, bp or 0, gp, app, s0, s1, max(need, 1), m), np.int64)
                r = tm(_J_LINEAR, args.ctypes.data, xp, yp, rp)
                if r is not None:
                    if r:
                        raise DeviceError(f"linear: the native kernel refused geometry {g.tolist()} ({r})")
                    return y
        elif m * k * n >= _LINEAR_PARALLEL_MACS:
            blocks = -(-m // _LINEAR_ROW_BLOCK)
            parts = min(blocks, threads() * _LINEAR_RANGES_PER_THREAD)
        if parts == 1:
            buf, sp = _scratch_for() if lwp is not None else (None, None)
            r = fn(xp, lwp, lbp, wp, bp, rp, yp, gp, app, sp, 0 if buf is None else buf.size, 0, m)
            if r > 0:                            # (a larger scratch: the kernel wrote nothing)
                buf, sp = _scratch_for(r)
                r = fn(xp, lwp, lbp, wp, bp, rp, yp, gp, app, sp, buf.size, 0, m)
            if r:
                raise DeviceError(f"linear: the native kernel refused geometry {g.tolist()} ({r})")
            return y
        blocks = -(-m // _LINEAR_ROW_BLOCK)

        def run(i):
            r0 = min(m, _LINEAR_ROW_BLOCK * (blocks * i // parts))
            r1 = min(m, _LINEAR_ROW_BLOCK * (blocks * (i + 1) // parts))
            buf, sp = _scratch_for() if lwp is not None else (None, None)
            r = fn(xp, lwp, lbp, wp, bp, rp, yp, gp, app, sp, 0 if buf is None else buf.size, r0, r1)
            if r > 0:
                buf, sp = _scratch_for(r)
                r = fn(xp, lwp, lbp, wp, bp, rp, yp, gp, app, sp, buf.size, r0, r1)
            if r:
                raise DeviceError(f"linear: the native kernel refused geometry {g.tolist()} ({r})")
        parallel_for(parts, run)
        return y


class NativeSqueezeExcite:
    """MobileNetV3's squeeze-excite after its means m (N, C): ``x * act2(w2 @ act1(w1 @ m + b1) + b2)``
    by fused.c's ember_squeeze_excite for constant float32 1x1 weights w1 (C1, C, 1, 1), w2 (C, C1,
    1, 1), biases (or None), activations of _NATIVE_DENSE_ACTS with their (a, b, lo, hi):
    numpy_plan's step for the four steps after the global pool (two 1x1 convolutions at one pixel
    with their activations, the product). The products are ember_gemv's: the bits of the plan's
    own one-pixel convolutions, and numpy's product. ``ok``: whether the kernel takes them; a
    call with x (N, C, H, W) C-contiguous float32, m (N * C floats) and ``out`` (x itself: in
    place, or None) gives the result, or None where it cannot run now (the library off on this
    thread, another dtype or layout)."""

    __slots__ = ("ok", "lib", "fn", "c", "c1", "ptrs", "keep")

    def __init__(self, w1, b1, w2, b2, act1, args1, act2, args2):
        self.ok = False
        lib = native.lib()
        f = np.float32
        arrs = [a for a in (w1, b1, w2, b2) if a is not None]
        if lib is None or any(not isinstance(a, np.ndarray) or a.dtype != f for a in arrs) or w1.ndim != 4 \
                or w2.ndim != 4 or w1.shape[2:] != (1, 1) or w2.shape[2:] != (1, 1):
            return
        c1, c = w1.shape[:2]
        if w2.shape[:2] != (c, c1) or (b1 is not None and b1.shape != (c1,)) or (b2 is not None and b2.shape != (c,)):
            return
        fn = native.kernel("ember_squeeze_excite", _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64)
        if fn is None:
            return
        w1c, w2c = np.ascontiguousarray(w1).reshape(c1, c), np.ascontiguousarray(w2).reshape(c, c1)
        b1c = None if b1 is None else np.ascontiguousarray(b1)
        b2c = None if b2 is None else np.ascontiguousarray(b2)
        ap = np.array((*args1, *args2), f)
        self.keep = (w1c, w2c, b1c, b2c, ap)
        self.lib, self.fn, self.c, self.c1 = lib, fn, c, c1
        self.ptrs = (w1c.ctypes.data, None if b1c is None else b1c.ctypes.data, w2c.ctypes.data,
                     None if b2c is None else b2c.ctypes.data, ap.ctypes.data,
                     _NATIVE_DENSE_ACTS[act1], _NATIVE_DENSE_ACTS[act2])
        self.ok = True

    def __call__(self, x, m, out=None):
        if native.lib() is not self.lib or x.dtype != np.float32 or x.ndim != 4 or x.shape[1] != self.c \
                or not x.flags.c_contiguous or not x.size or m.dtype != np.float32 or m.size != x.shape[0] * self.c \
                or not m.flags.c_contiguous:
            return None
        n, c, h, w = x.shape
        y = np.empty(x.shape, np.float32) if out is None else out
        w1, b1, w2, b2, ap, a1, a2 = self.ptrs
        g = np.array((n, c, h * w, self.c1, a1, a2), np.int64)
        xp = _addr(x)
        yp = xp if out is x else _address(_char_at(y))
        buf, sp = _scratch_for()
        r = self.fn(xp, yp, _addr(m), w1, b1, w2, b2, g.ctypes.data, ap, sp, buf.size)
        if r > 0:                            # (a larger scratch: the kernel wrote nothing)
            buf, sp = _scratch_for(r)
            r = self.fn(xp, yp, _addr(m), w1, b1, w2, b2, g.ctypes.data, ap, sp, buf.size)
        if r:
            raise DeviceError(f"squeeze-excite: the native kernel refused geometry {g.tolist()} ({r})")
        return y


class NativeAttention:
    """``softmax(q @ kt [* scale]) @ v`` by fused.c's ember_attention, set up once for float32 views
    q (B, H, T, D), kt (B, H, D, S) and v (B, H, S, E) of these shapes and strides (views of a
    fused projection: no copies), or 3-d (B, T, D) ones (one head): the kernel's geometry kept, a
    call takes the three data addresses (~4 us of Python). The result is (B, H, T, E), or with
    ``merge`` (B, T, H, E) (the heads merged back, as a permute (0, 2, 1, 3) would give); 3-d:
    (B, T, E). ``ok``: whether the kernel takes the case (the library in use, float32, these
    shapes, strides of whole floats); a call returns None where the library is no longer in use
    on this thread. numpy_plan's attention step."""

    __slots__ = ("ok", "lib", "fn", "g", "gp", "shape", "out", "units", "c", "args", "need", "team")

    def __init__(self, q, kt, v, scale=None, merge=False):
        self.ok = False
        lib = native.lib()
        nd = q.ndim
        if lib is None or q.dtype != np.float32 or kt.dtype != np.float32 or v.dtype != np.float32 \
                or nd not in (3, 4) or kt.ndim != nd or v.ndim != nd or (merge and nd != 4):
            return
        if nd == 3:
            q, kt, v = q[:, None], kt[:, None], v[:, None]
        b, h, t, d = q.shape
        s, e = kt.shape[3], v.shape[3]
        if kt.shape != (b, h, d, s) or v.shape != (b, h, s, e) or not (b and h and t and d and s and e) \
                or any(x % 4 for a in (q, kt, v) for x in a.strides):
            return
        fn = native.kernel("ember_attention", _I64, _P, _P, _P, _P, _P, ctypes.c_float, _P, _I64, _I64, _I64)
        if fn is None:
            return
        qs, ks, vs = ([x // 4 for x in a.strides] for a in (q, kt, v))
        ys = [t * h * e, e, h * e, 1] if merge else [h * t * e, t * e, e, 1]
        self.g = np.array([b, h, t, s, d, e, *qs, ks[0], ks[1], ks[3], ks[2], *vs, *ys, scale is not None], np.int64)
        self.gp, self.lib, self.fn, self.units = self.g.ctypes.data, lib, fn, b * h
        self.shape = (b, t, h, e) if merge else (b, h, t, e)
        self.out = self.shape if nd == 4 else (b, t, e)
        self.c = 0.0 if scale is None else float(scale)
        # the team's job (units over two threads) where there is enough work
        self.need = fn(0, 0, 0, 0, self.gp, 0.0, 0, 0, 0, 0)          # (the scratch one call needs)
        self.team = b * h > 1 and b * h * t * s * (d + e) >= _ATTENTION_TEAM_MACS
        bits = int(np.array(self.c, np.float32).view(np.int32))
        self.args = np.array((self.gp, bits, 0, 0, max(self.need, 1), b * h), np.int64)
        self.ok = True

    def __call__(self, qp, kp, vp):
        if native.lib() is not self.lib:
            return None
        y = np.empty(self.shape, np.float32)
        yp = _address(_char_at(y))
        if self.team:
            tm = team()
            if tm is not None:
                args = self.args
                args[2], args[3] = _scratch_for(self.need)[1], tm.scratch_for(self.need)[1]
                r = tm(_J_ATTENTION, args.ctypes.data, qp, kp, vp, yp)
                if r is not None:
                    if r:
                        raise DeviceError(f"attention: the native kernel refused geometry {self.g.tolist()} ({r})")
                    return y if y.shape == self.out else y.reshape(self.out)
        args = (qp, kp, vp, yp, self.gp, self.c)
        buf, sp = _scratch_for()
        r = self.fn(*args, sp, buf.size, 0, self.units)
        if r > 0:                            # (a larger scratch: the kernel wrote nothing)
            buf, sp = _scratch_for(r)
            r = self.fn(*args, sp, buf.size, 0, self.units)
        if r:
            raise DeviceError(f"attention: the native kernel refused geometry {self.g.tolist()} ({r})")
        return y if y.shape == self.out else y.reshape(self.out)


def native_attention(q, kt, v, scale=None, merge=False):
    """NativeAttention's result for these views, or None (see there)."""
    att = NativeAttention(q, kt, v, scale, merge)
    return att(q.ctypes.data, kt.ctypes.data, v.ctypes.data) if att.ok else None


def _conv_gemv_native(key, a, w, bias, o, c, act, act_args):
    """A 1x1 convolution of one image at one pixel (squeeze-excite's) as ``_gemv_native``, the
    (1, O, 1, 1) result; a call with a bias kept in _DENSE_CALLS as ember_conv_gemm's are."""
    x = a.reshape(c) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(c)
    wm = w.reshape(o, c) if w.flags.c_contiguous else np.ascontiguousarray(w).reshape(o, c)
    y = _gemv_native(wm, x, bias, act, act_args)
    if y is None:
        return None
    if bias is not None and bias.flags.c_contiguous and a.flags.c_contiguous:
        fn = native.kernel("ember_gemv", _I64, _P, _P, _P, _P, _P, _P, _I64, _I64)
        geom = np.array([o, c, 1, 1, 1, _NATIVE_DENSE_ACTS[act]], np.int64)
        ap = np.array(act_args, np.float32)
        if len(_DENSE_CALLS) >= _DENSE_CALLS_MAX:
            _DENSE_CALLS.clear()
        try:
            _DENSE_CALLS[key] = (weakref.ref(w), weakref.ref(bias), native.lib(), fn,
                                 (wm.ctypes.data, bias.ctypes.data, geom.ctypes.data, ap.ctypes.data),
                                 (1, o, 1, 1), o, (wm, bias, ap), geom)
        except TypeError:                    # (a buffer without weak references: not kept)
            pass
    return y.reshape(1, o, 1, 1)


def activation_(y, act, act_args):
    """``y`` (a float32 array of the caller's own) through ``act`` in place, each step rounded as
    the plan's separate steps round it (numpy_plan: relu / clip as numpy's clip, hard sigmoid /
    hard swish as multiply, add, clip[, multiply]): natively in one pass where the library is
    loaded (dense.c's ember_activation), else those numpy steps. Returns ``y``."""
    lo_hi = (np.float32(act_args[2]), np.float32(act_args[3]))
    fn = native.kernel("ember_activation", _I64, _P, _I64, _I64, _P) if y.flags.c_contiguous else None
    if fn is not None and y.dtype == np.float32:
        ap = np.array(act_args, np.float32)
        if fn(y.ctypes.data, y.size, _NATIVE_DENSE_ACTS[act], ap.ctypes.data) == 0:
            return y
    if act in ("relu", "clip"):
        clip(y, *((np.float32(0.0), np.float32(np.inf)) if act == "relu" else lo_hi), out=y)
    elif act is not None:
        a, b = np.float32(act_args[0]), np.float32(act_args[1])
        if act == "hard_swish":
            t = y * a
            t += b
            clip(t, np.float32(0.0), np.float32(1.0), out=t)
            y *= t
        else:
            y *= a
            y += b
            clip(y, np.float32(0.0), np.float32(1.0), out=y)
    return y


def conv2d_act(out, x, weight, bias=None, *, stride, padding, dilation, groups, act, act_args, pool=0):
    """``act(conv2d(...))`` for float32 (numpy_plan's conv + activation step): groups-1
    convolutions that dense.c takes with the activation in its epilogue, others convolved as
    ``_conv2d`` does, then ``activation_`` on the result (its own fresh array). ``out``: the
    convolution's (N, O, oh, ow). ``pool`` 2: then a 2x2 max pooling of stride 2 (floor mode: the
    (N, O, oh // 2, ow // 2) result), in ember_conv_pad's epilogue where it takes the
    convolution, else ``_max_pool_tiled`` on the activation's result (the plan's max_pool2d step)."""
    n, o, oh, ow = out.shape
    c = x.shape[1]
    if groups == c and c > 1 and weight.shape[1] == 1 and n * o * oh * ow and \
            x._buf.dtype == weight._buf.dtype == np.float32 and (bias is None or bias._buf.dtype == np.float32):
        kh, kw = weight.shape[2:]
        y = _conv_depthwise_native(x._buf, weight._buf, None if bias is None else bias._buf, o // c, oh, ow, kh, kw,
                                   stride, padding, dilation, act, act_args)
        if y is not None:                    # (the bias and the activation are in it)
            return _max_pool_floor(y) if pool else y
    if groups == 1 and n * o * oh * ow and x._buf.dtype == weight._buf.dtype == np.float32 \
            and (bias is None or bias._buf.dtype == np.float32):
        kh, kw = weight.shape[2:]
        a, w, b = x._buf, weight._buf, None if bias is None else bias._buf
        if _pad_case(a.shape[1], o, oh, ow, kh, kw, stride, padding, dilation, pool):
            y = _conv_pad_native(a, w, b, oh, ow, kh, kw, padding, dilation, act, act_args, pool)
        else:
            y = _conv_dense_native(a, w, b, oh, ow, kh, kw, stride, padding, dilation, act, act_args)
            if y is not None and pool:
                y = _max_pool_floor(y)
        if y is not None:
            return y
    y = _conv2d(out, x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if y.dtype != np.float32 or not y.flags.writeable:
        y = np.array(y, np.float32)
    y = activation_(y, act, act_args)
    return _max_pool_floor(y) if pool else y


_NO_PAD = ((0, 0), (0, 0))


def native_conv_pad_case(out_shape, attrs, pool) -> bool:
    """Whether a conv2d step of this output shape and these attributes may run as ember_conv_pad
    (numpy_plan sets a NativeConvPad up for it): groups 1, stride 1, few output pixels."""
    return (attrs.get("groups") == 1 and tuple(attrs.get("stride", ())) == (1, 1) and len(out_shape) == 4
            and out_shape[2] * out_shape[3] < _NATIVE_PAD_MAX_PIXELS)


def _pad_case(c, o, oh, ow, kh, kw, stride, padding, dilation, pool) -> bool:
    """Whether ember_conv_pad takes a float32 groups-1 convolution: stride 1, below
    _NATIVE_PAD_MAX_PIXELS output pixels, not Winograd's cases (measured faster there too, e.g.
    PP-OCR det's 96->24 at 15x20 250 -> 132 us, but tests/test_numpy_winograd.py pins that path),
    and 1x1 ones without padding only when pooled (else ember_conv_gemm / ember_gemv)."""
    return (stride == (1, 1) and oh * ow < _NATIVE_PAD_MAX_PIXELS
            and (pool or kh * kw > 1 or padding != _NO_PAD)
            and not _winograd_case(c, o, oh, ow, kh, kw, stride, dilation))


def _max_pool_floor(y):
    """2x2 max pooling of stride 2 of (N, C, H, W) ``y``, floor mode (an odd last row or column
    left out): numpy's maximum over each window's rows, then its columns (_max_pool_tiled)."""
    n, c, h, w = y.shape
    if h % 2 or w % 2:
        y = y[:, :, :h // 2 * 2, :w // 2 * 2]
    return _max_pool_tiled(y, h // 2, w // 2, 2, 2)


class NativeConvPad:
    """One convolution by dense.c's ember_conv_pad on one thread, set up once: the packed weight,
    geometry and activation parameters made and their addresses taken for an input shape (~12 ->
    ~3 us of Python a call; numpy_plan's conv steps hold one, _conv_pad_native keeps them in
    _PAD_CALLS). Calling it with a C-contiguous float32 input of that shape gives the result, or
    None where the library is not in use on this thread (then the caller runs another path)."""

    __slots__ = ("shape", "lib", "fn", "ptrs", "out", "units", "need", "keep", "geom")

    def __init__(self, lib, fn, a_shape, w, bias, oh, ow, kh, kw, padding, dilation, act, act_args, pool):
        n, c, h, wd = a_shape
        o = w.shape[0]
        wp = _derived(w, "dense8", _pack_dense)
        bc = None if bias is None or bias.flags.c_contiguous else np.ascontiguousarray(bias)
        (dh, dw), ((pt, _), (pl, _)) = dilation, padding
        self.geom = np.array([n, c, h, wd, c * h * wd, h * wd, wd, 1, o, oh, ow, kh, kw, dh, dw, pt, pl,
                              _NATIVE_DENSE_ACTS[act], pool], np.int64)
        ap = np.array(act_args, np.float32)
        self.shape, self.lib, self.fn = tuple(a_shape), lib, fn
        b = bias if bc is None else bc
        self.ptrs = (wp.ctypes.data, None if b is None else b.ctypes.data, self.geom.ctypes.data, ap.ctypes.data)
        self.keep = (wp, b, ap)
        self.out = (n, o, oh // 2, ow // 2) if pool else (n, o, oh, ow)
        per = oh // 2 if pool else (oh + 1) // 2          # units per image: pairs of output rows
        self.units = n * per
        self.need = _pad_scratch(c, min(2 * per, oh // 2 * 2 if pool else oh), kh, dh, ow + (kw - 1) * dw)

    def __call__(self, a):
        if native.lib() is not self.lib or a.dtype != np.float32 or a.shape != self.shape or not a.flags.c_contiguous:
            return None
        y = np.empty(self.out, np.float32)
        buf, sp = _scratch_for(self.need)
        p = self.ptrs
        if self.fn(p[0], _addr(a), p[1], _address(_char_at(y)), p[2], p[3], sp, buf.size, 0, self.units):
            raise DeviceError(f"conv2d: the native padded kernel refused geometry {self.geom.tolist()}")
        return y


def _pad_scratch(c, rows, kh, dh, wp):
    """Floats of scratch ember_conv_pad needs for ``rows`` output rows: the band of input rows they
    read, ``wp`` padded columns each, and a vector of slack."""
    return c * (rows + (kh - 1) * dh) * wp + 16


# one-thread ember_conv_pad calls seen before: (weight ref, bias ref or None, NativeConvPad), by
# (id(w), id(bias), input shape and the convolution's parameters), checked through the weak
# references (the call keeps the packed weight and the bias it reads, as _DENSE_CALLS does)
_PAD_CALLS: dict = {}
_PAD_CALLS_MAX = 1024


def conv_pad_call(a, w, bias, oh, ow, kh, kw, padding, dilation, act, act_args, pool):
    """The NativeConvPad for this stride-1 convolution of C-contiguous float32 ``a`` (kept in
    _PAD_CALLS), or None where ember_conv_pad does not take it (``_pad_case``), would run it on
    more than one thread, or does not run here (the library not in use, other dtypes)."""
    key = (id(w), id(bias), a.shape, oh, ow, kh, kw, padding, dilation, act, act_args, pool)
    hit = _PAD_CALLS.get(key)
    if hit is not None and hit[0]() is w and (hit[1] is None if bias is None else hit[1]() is bias) \
            and native.lib() is hit[2].lib:
        return hit[2]
    n, c, h, wd = a.shape
    o = w.shape[0]
    if not _pad_case(c, o, oh, ow, kh, kw, (1, 1), padding, dilation, pool) or a.dtype != np.float32 \
            or w.dtype != np.float32 or (bias is not None and bias.dtype != np.float32) \
            or not a.flags.c_contiguous or (pool and (oh < 2 or ow < 2)) or pool not in (0, 2) \
            or not n * c * h * wd or n * o * c * kh * kw * oh * ow >= _NATIVE_DENSE_PARALLEL_MACS:
        return None
    fn = native.kernel("ember_conv_pad", _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64)
    if fn is None:
        return None
    call = NativeConvPad(native.lib(), fn, a.shape, w, bias, oh, ow, kh, kw, padding, dilation, act, act_args, pool)
    if len(_PAD_CALLS) >= _PAD_CALLS_MAX:
        _PAD_CALLS.clear()
    try:
        _PAD_CALLS[key] = (weakref.ref(w), None if bias is None else weakref.ref(bias), call)
    except TypeError:                        # (a buffer without weak references: not kept)
        pass
    return call


class NativeConvCall:
    """A depthwise (conv.c) or 1x1 (dense.c: a product, or ember_gemv at one pixel) convolution
    of one input shape that ran before on one range, from the addresses _DW_CALLS / _DENSE_CALLS
    kept: numpy_plan's conv step calls it with the C-contiguous float32 input (~1.5 us of Python,
    not conv2d_act's dispatch and the cache lookup: ~5-8 us, more after other work evicted the
    caches); the result, or None where it cannot run now (the library off on this thread, another
    input): then the caller's path runs."""

    __slots__ = ("lib", "fn", "ptrs", "shape", "out", "units", "dw", "geom", "keep", "job", "args", "need")

    def __init__(self, hit, in_shape, dw, macs):
        self.lib, self.fn, self.ptrs, self.out, self.units = hit[2], hit[3], hit[4], hit[5], hit[6]
        self.keep, self.geom, self.shape, self.dw = hit[7], hit[8], in_shape, dw
        # the team's job where the convolution is large enough: depthwise planes, a product's output
        # channels (whole panels of 8), a one-pixel product's rows
        self.job, self.args, self.need = None, None, 0
        p = self.ptrs
        if dw and macs >= _CONV_TEAM_MACS and self.units > 1:
            self.job = _J_DEPTHWISE
            self.need = self.fn(0, 0, 0, 0, p[2], p[3], p[4], 0, 0, 0, 0)       # (the scratch it needs)
            self.args = np.zeros(9, np.int64)
            self.args[[0, 1, 2, 3, 4, 7, 8]] = (p[0], p[1] or 0, p[2], p[3], p[4], max(self.need, 1), self.units)
        elif not dw and macs >= _CONV_TEAM_MACS and self.out[1] >= _GEMM_TEAM_MIN_ROWS:
            gemv = self.out[2:] == (1, 1) and self.units == self.out[1]
            self.job = _J_GEMV if gemv else _J_GEMM
            self.args = np.array((p[0], p[1] or 0, p[2], p[3], self.out[1]), np.int64)

    def __call__(self, a):
        if native.lib() is not self.lib or a.dtype != np.float32 or a.shape != self.shape or not a.flags.c_contiguous:
            return None
        y = np.empty(self.out, np.float32)
        p = self.ptrs
        if self.job is not None:
            tm = team()
            if tm is not None:
                args = self.args
                if self.job == _J_DEPTHWISE:
                    args[5], args[6] = _scratch_for(self.need)[1], tm.scratch_for(self.need)[1]
                r = tm(self.job, args.ctypes.data, _addr(a), _address(_char_at(y)))
                if r is not None:
                    if r:
                        raise DeviceError(f"conv2d: the native kernel refused geometry {self.geom.tolist()} ({r})")
                    return y
        if self.dw:
            buf, sp = _scratch_for()
            args = (_addr(a), p[0], p[1], _address(_char_at(y)), p[2], p[3], p[4])
            r = self.fn(*args, sp, buf.size, 0, self.units)
            if r > 0:                        # (a larger scratch: the kernel wrote nothing)
                buf, sp = _scratch_for(r)
                r = self.fn(*args, sp, buf.size, 0, self.units)
        else:
            r = self.fn(p[0], _addr(a), p[1], _address(_char_at(y)), p[2], p[3], 0, self.units)
        if r:
            raise DeviceError(f"conv2d: the native kernel refused geometry {self.geom.tolist()} ({r})")
        return y


def native_conv_call(a, w, bias, oh, ow, stride, padding, dilation, groups, act, act_args):
    """The NativeConvCall of a convolution conv2d_act has just run natively on one range (a
    depthwise or a 1x1 one with a bias; its kept addresses), or None."""
    if not isinstance(a, np.ndarray) or a.ndim != 4 or w.ndim != 4:
        return None
    o, cg, kh, kw = w.shape
    c = a.shape[1]
    if groups == c and cg == 1 and c > 1:
        key = (id(w), id(bias), a.shape, o // c, oh, ow, kh, kw, stride, padding, dilation, act, act_args)
        hit, dw = _DW_CALLS.get(key), True
    elif groups == 1:
        key = (id(w), id(bias), a.shape, kh, kw, padding, stride, act, act_args)
        hit, dw = _DENSE_CALLS.get(key), False
    else:
        return None
    if hit is None or hit[0]() is not w or (hit[1] is None if bias is None else hit[1]() is not bias) \
            or native.lib() is not hit[2]:
        return None
    return NativeConvCall(hit, a.shape, dw, a.shape[0] * o * (c // groups) * kh * kw * oh * ow)


def _conv_pad_native(a, w, bias, oh, ow, kh, kw, padding, dilation, act=None, act_args=(0, 0, 0, 0), pool=0):
    """Stride-1 groups-1 convolution by dense.c's ember_conv_pad: float32 ``a`` (N, C, H, W) in any
    strides, ``w`` (O, C, kh, kw), ``bias`` (O,) or None, then ``act`` (as _conv_dense_native) and,
    with ``pool`` 2, a 2x2 max pooling of stride 2 (floor mode); the (N, O, oh, ow) float32 result,
    (N, O, oh // 2, ow // 2) pooled. The kernel copies the zero-padded input rows it reads into this
    thread's scratch, so nothing is padded here. One thread below _NATIVE_DENSE_PARALLEL_MACS
    multiply-adds (set up once: conv_pad_call), else ranges of output row pairs on parallel_for's.
    None where the library is not in use or the dtypes are not float32 (then the numpy paths run)."""
    if a.flags.c_contiguous:
        call = conv_pad_call(a, w, bias, oh, ow, kh, kw, padding, dilation, act, act_args, pool)
        if call is not None:
            return call(a)
    n, c, h, wd = a.shape
    o = w.shape[0]
    if a.dtype != np.float32 or w.dtype != np.float32 or (bias is not None and bias.dtype != np.float32) \
            or (pool and (oh < 2 or ow < 2)) or pool not in (0, 2) or not n * c * h * wd:
        return None
    fn = native.kernel("ember_conv_pad", _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64)
    if fn is None:
        return None
    if any(s % 4 for s in a.strides):
        a = np.ascontiguousarray(a)
    wp = _derived(w, "dense8", _pack_dense)
    if bias is not None and not bias.flags.c_contiguous:
        bias = np.ascontiguousarray(bias)
    (dh, dw), ((pt, _), (pl, _)) = dilation, padding
    geom = np.array([n, c, h, wd, *(s // 4 for s in a.strides), o, oh, ow, kh, kw, dh, dw, pt, pl,
                     _NATIVE_DENSE_ACTS[act], pool], np.int64)
    ap = np.array(act_args, np.float32)
    y = np.empty((n, o, oh // 2, ow // 2) if pool else (n, o, oh, ow), np.float32)
    units = n * (oh // 2 if pool else (oh + 1) // 2)
    parts = 1
    if units > 1 and n * o * c * kh * kw * oh * ow >= _NATIVE_DENSE_PARALLEL_MACS:
        parts = min(units, threads() * _NATIVE_DENSE_RANGES_PER_THREAD)
    args = (wp.ctypes.data, a.ctypes.data, None if bias is None else bias.ctypes.data, y.ctypes.data,
            geom.ctypes.data, ap.ctypes.data)

    def run(i):
        u0, u1 = units * i // parts, units * (i + 1) // parts
        buf, sp = _scratch_for(_pad_scratch(c, min(2 * (u1 - u0), oh // 2 * 2 if pool else oh), kh, dh,
                                            ow + (kw - 1) * dw))
        r = fn(*args, sp, buf.size, u0, u1)
        if r:
            raise DeviceError(f"conv2d: the native padded kernel refused geometry {geom.tolist()} ({r})")
    parallel_for(parts, run)      # (one part: run(0) on this thread)
    return y


def _conv_rows_native(a, wp, bias, y, oh, ow, kh, kw, padding, dilation, act, ap):
    """dense.c's ember_conv_rows into ``y`` (N, O, oh, ow): stride 1, the zero-padded input's taps
    read in place (one padded copy per image), over ranges of output rows."""
    fn = native.kernel("ember_conv_rows", _I64, _P, _P, _P, _P, _P, _P, _I64, _I64)
    n, c = a.shape[:2]
    o = y.shape[1]
    parts = 1
    if oh > 1 and o * c * kh * kw * oh * ow >= _NATIVE_DENSE_PARALLEL_MACS:
        parts = min(oh, threads() * _NATIVE_DENSE_RANGES_PER_THREAD)
    for b in range(n):
        xp = np.ascontiguousarray(_padded(a[b:b + 1], padding))
        geom = np.array([c, xp.shape[2], xp.shape[3], o, oh, ow, kh, kw, dilation[0], dilation[1],
                         _NATIVE_DENSE_ACTS[act]], np.int64)
        args = (wp.ctypes.data, xp.ctypes.data, None if bias is None else bias.ctypes.data, y[b].ctypes.data,
                geom.ctypes.data, ap.ctypes.data)

        def run(i):
            r = fn(*args, oh * i // parts, oh * (i + 1) // parts)
            if r:
                raise DeviceError(f"conv2d: the native rows kernel refused geometry {geom.tolist()} ({r})")
        parallel_for(parts, run)      # (one part: run(0) on this thread)
    return y


def _conv_direct_native(a, wp, bias, y, oh, ow, kh, kw, stride, padding, dilation, act, ap):
    """dense.c's ember_conv_direct into ``y`` (N, O, oh, ow): the im2col columns gathered a block
    of 32 output pixels at a time (K = C * kh * kw <= _NATIVE_DIRECT_MAX_K), over ranges of whole
    blocks."""
    fn = native.kernel("ember_conv_direct", _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64)
    n, c, h, wd = a.shape
    if any(s % 4 for s in a.strides):
        a = np.ascontiguousarray(a)
    o = y.shape[1]
    (sh, sw), (dh, dw), ((pt, _), (pl, _)) = stride, dilation, padding
    geom = np.array([c, h, wd, a.strides[1] // 4, a.strides[2] // 4, a.strides[3] // 4, o, oh, ow, kh, kw, sh, sw,
                     dh, dw, pt, pl, _NATIVE_DENSE_ACTS[act]], np.int64)
    npix = oh * ow
    blocks = -(-npix // 32)
    parts = 1
    if blocks > 1 and o * c * kh * kw * npix >= _NATIVE_DENSE_PARALLEL_MACS:
        parts = min(blocks, threads() * _NATIVE_DENSE_RANGES_PER_THREAD)
    # the panel: a block of 32 pixels' columns, or one output row's where rows are that wide and
    # the row's panel small (dense.c's DIRECT_ROW_PANEL: a row at a time)
    owp = -(-ow // 32) * 32
    panel = owp if ow >= 32 and c * kh * kw * owp <= _NATIVE_DIRECT_ROW_PANEL else 32
    tm = team() if blocks > 1 and o * c * kh * kw * npix >= _CONV_TEAM_MACS else None
    if tm is not None:                 # (pixel ranges over the team: each thread its own panel)
        need = c * kh * kw * panel
        args = np.array((wp.ctypes.data, 0 if bias is None else bias.ctypes.data, geom.ctypes.data, ap.ctypes.data,
                         _scratch_for(need)[1], tm.scratch_for(need)[1], need, npix), np.int64)
        for b in range(n):
            r = tm(_J_DIRECT, args.ctypes.data, a[b].ctypes.data, y[b].ctypes.data)
            if r is None:
                break
            if r:
                raise DeviceError(f"conv2d: the native direct kernel refused geometry {geom.tolist()} ({r})")
        else:
            return y
    for b in range(n):
        args = (wp.ctypes.data, a[b].ctypes.data, None if bias is None else bias.ctypes.data, y[b].ctypes.data,
                geom.ctypes.data, ap.ctypes.data)

        def run(i):
            buf, ptr = _scratch_for(c * kh * kw * panel)
            r = fn(*args, ptr, buf.size, 32 * (blocks * i // parts), min(npix, 32 * (blocks * (i + 1) // parts)))
            if r:
                raise DeviceError(f"conv2d: the native direct kernel refused geometry {geom.tolist()} ({r})")
        parallel_for(parts, run)      # (one part: run(0) on this thread)
    return y


def _conv_depthwise(a, w, mult, oh, ow, kh, kw, stride, padding, dilation):
    """groups == channels: the kernel taps of each channel copied once into (kh*kw, oh*ow)
    columns, then one small matrix product per channel, all in one batched matmul (no
    per-group Python loop; ~3x faster than multiply-adding the taps over the whole output).
    ``mult`` outputs per input channel (output c*mult + m reads input channel c). Columns
    larger than _COLS_BYTES are made a few channels at a time (see there). Usually the columns
    copy kernel columns only (_conv_depthwise_rows), or at stride 1 on small and mid-sized images
    runs of the padded plane (_conv_depthwise_flat); many channels on a small image with a large
    kernel go channels last (_conv_depthwise_taps)."""
    n, c = a.shape[:2]
    k = kh * kw
    (pt, pb), (pl, pr) = padding
    if stride == (1, 1) and oh * ow <= _FLAT_MAX_PIXELS and oh == a.shape[2] + pt + pb - (kh - 1) * dilation[0] \
            and ow == a.shape[3] + pl + pr - (kw - 1) * dilation[1]:
        if mult == 1 and k >= 25 and oh * ow <= _FLAT_TAPS_MAX_PIXELS and c >= _FLAT_TAPS_MIN_CHANNELS:
            return _conv_depthwise_taps(a, w, oh, ow, kh, kw, stride, padding, dilation)
        return _conv_depthwise_flat(a, w, mult, oh, ow, kh, kw, padding, dilation)
    if mult == 1 and k >= 25 and oh * ow <= _TAPS_MAX_PIXELS and c >= _TAPS_MIN_CHANNELS:
        return _conv_depthwise_taps(a, w, oh, ow, kh, kw, stride, padding, dilation)
    ap = _padded(a, padding)
    phases = _row_phases(oh, kh, stride[0], dilation[0])
    if phases is not None:
        return _conv_depthwise_rows(ap, w, mult, oh, ow, kh, kw, stride, dilation, phases)
    wm = w.reshape(c, mult, k)                                                     # (c, mult, k)
    step = max(1, _COLS_BYTES // (n * k * oh * ow * 4))
    if step >= c:
        cols = _cols(ap, oh, ow, kh, kw, stride, dilation)
        y = matmul(wm, cols.reshape(n, c, k, oh * ow))                              # (n, c, mult, oh*ow)
        return y.reshape(n, c * mult, oh, ow)
    y = np.empty((n, c, mult, oh * ow), np.float32 if ap.dtype != np.float64 else ap.dtype)
    for c0 in range(0, c, step):
        c1 = min(c, c0 + step)
        cols = _cols(ap[:, c0:c1], oh, ow, kh, kw, stride, dilation)
        matmul(wm[c0:c1], cols.reshape(n, c1 - c0, k, oh * ow), out=y[:, c0:c1])
    return y.reshape(n, c * mult, oh, ow)


def _row_phases(oh, kh, sh, dh):
    """For the row path: {phase: rows to copy}, kernel row i reading phase (i*dh) % sh from row
    (i*dh) // sh on; None when that copies no fewer rows than im2col (kh * oh)."""
    phases: dict = {}
    for i in range(kh):
        p, r = (i * dh) % sh, (i * dh) // sh
        phases[p] = max(phases.get(p, 0), oh + r)
    return phases if kh > 1 and sum(phases.values()) < kh * oh else None


def _conv_depthwise_rows(ap, w, mult, oh, ow, kh, kw, stride, dilation, phases):
    """Depthwise (``ap`` padded) with the columns holding kernel columns only: per channel and
    row phase (padded rows phase, phase + sh, ...: one phase at stride 1) a (kw, rows, ow) copy.
    Kernel row i reads oh consecutive rows of its phase, a contiguous (kw, oh*ow) view, so the
    kernel rows are kh batched matmuls over the same copies: about sh / kh of im2col's copying,
    which is what depthwise columns cost (5x5 at stride 1: 30-40% faster, 3x3: 10-20%)."""
    n, c = ap.shape[:2]
    (sh, sw), (dh, dw) = stride, dilation
    ap = np.ascontiguousarray(ap)                 # (a copy only for an unpadded strided input)
    wm = w.reshape(c, mult, kh, kw)
    ft = np.float32 if ap.dtype != np.float64 else ap.dtype
    y = np.empty((n, c, mult, oh * ow), ft)
    s0, s1, s2, s3 = ap.strides
    windows = {p: strided_view(ap, (n, c, kw, hu, ow), (s0, s1, s3 * dw, s2 * sh, s3 * sw), p * s2)
               for p, hu in phases.items()}
    step = max(1, _COLS_BYTES // (n * kw * sum(phases.values()) * ow * 4))
    for c0 in range(0, c, step):
        c1 = min(c, c0 + step)
        cols = {p: np.ascontiguousarray(v[:, c0:c1]) for p, v in windows.items()}   # (n, cc, kw, hu, ow)
        yb = y[:, c0:c1]
        for i in range(kh):
            r = (i * dh) // sh
            rows = cols[(i * dh) % sh][:, :, :, r:r + oh, :].reshape(n, c1 - c0, kw, oh * ow)   # a view
            if i == 0:
                matmul(wm[c0:c1, :, 0], rows, out=yb)
            else:
                yb += matmul(wm[c0:c1, :, i], rows)
    return y.reshape(n, c * mult, oh, ow)


def _conv_depthwise_flat(a, w, mult, oh, ow, kh, kw, padding, dilation):
    """Stride-1 depthwise over padded-width rows: each output row is computed over the padded
    width (the last (kw - 1) * dw of its values are junk, dropped at the end), so that tap (i, j)
    reads one contiguous run of the flattened padded plane, from i*dh*wp + j*dw on. The copies
    are then kw runs of that plane per channel, shifted by j*dw (long runs: a third of the row
    path's copy time, whose runs are ow values), and kernel row i multiplies (kw, oh*wp) views of
    them at offset i*dh*wp, kh batched matmuls as in the row path: the same products and sums in
    the same order (OpenBLAS's matrix-vector kernel rounds a product's last few columns its own
    way, so where they fall differently a value can differ from the row path's in the last bit);
    ~wp/ow more multiply-adds, which cost less than the copy saves on images up to
    _FLAT_MAX_PIXELS."""
    n, c = a.shape[:2]
    dh, dw = dilation
    ap = _padded(a, padding, extra_h=1)           # (one more row: the last shifted runs' tails)
    hp1, wp = ap.shape[2:]
    span_out = oh * wp                            # outputs per channel, junk columns included
    span = (kh - 1) * dh * wp + span_out          # each shifted run
    s0, s1 = ap.strides[:2]
    it = ap.itemsize
    wm = w.reshape(c, mult, kh, kw)
    y = np.empty((n, c, mult, span_out), ap.dtype)
    step = max(1, _COLS_BYTES // (n * kw * span * it))
    for c0 in range(0, c, step):
        c1 = min(c, c0 + step)
        runs = np.ascontiguousarray(strided_view(ap, (n, c1 - c0, kw, span), (s0, s1, dw * it, it), c0 * s1))
        yb = y[:, c0:c1]
        for i in range(kh):
            rows = runs[:, :, :, i * dh * wp:i * dh * wp + span_out]             # (n, cc, kw, oh*wp)
            if i == 0:
                matmul(wm[c0:c1, :, 0], rows, out=yb)
            else:
                yb += matmul(wm[c0:c1, :, i], rows)
    return np.ascontiguousarray(y.reshape(n, c * mult, oh, wp)[:, :, :, :ow])


def _conv_depthwise_taps(a, w, oh, ow, kh, kw, stride, padding, dilation):
    """Depthwise with many channels on a small image and a large kernel (MobileNetV3's 5x5 at
    7x7 and 14x14): channels last, so each tap is one multiply-add of (rows, ow, C) views whose
    inner axes are ow * C values, against that tap's weights tiled to (ow, C) once per call (a
    (C,) weight row broadcast over every output pixel makes numpy run C-long inner loops: 1.4x
    slower here). Output rows go a band at a time (_TAPS_BYTES) so that the accumulator and its
    temporary stay in the L2 cache across the taps. Per channel the im2col columns would be a
    few dozen values, and one product per channel costs more than its arithmetic."""
    n, c, h, wd = a.shape
    (pt, pb), (pl, pr) = padding
    ap = np.zeros((n, h + pt + pb, wd + pl + pr, c), a.dtype)
    ap[:, pt:pt + h, pl:pl + wd, :] = a.transpose(0, 2, 3, 1)
    wt = _derived(w, ("taps", ow, a.dtype.str), lambda w: _taps_tiled(w, ow, a.dtype))   # (taps, ow, c)
    (sh, sw), (dh, dw) = stride, dilation
    y = np.empty((n, oh, ow, c), a.dtype)
    rows = max(1, _TAPS_BYTES // (n * ow * c * a.itemsize))
    tmp = np.empty((n, min(rows, oh), ow, c), a.dtype)
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        yb, tb = y[:, r0:r1], tmp[:, :r1 - r0]
        for i in range(kh):
            y0 = r0 * sh + i * dh
            for j in range(kw):
                v = ap[:, y0:y0 + (r1 - r0 - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :]
                if i == j == 0:
                    np.multiply(v, wt[0], out=yb)
                else:
                    np.multiply(v, wt[i * kw + j], out=tb)
                    yb += tb
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def _taps_tiled(w, ow, dtype):
    """(kh * kw, ow, C): each tap's (C,) weights repeated for ``ow`` output columns."""
    c, _, kh, kw = w.shape
    wt = np.empty((kh * kw, ow, c), dtype)
    wt[...] = w.reshape(c, kh * kw).T[:, None, :]
    return wt


# output rows of the channels-last depthwise path per band (accumulator bytes), and when it is
# taken: its ~2 * kh * kw numpy calls over every pixel cost less than the row path's kh small
# products per channel only on small images with many channels (5x5, best of 25, load ~4:
# 14x14x240 400 vs 553 us, 7x7x576 275 vs 356; but 14x14x160 358 vs 216, 15x20x384 1995 vs 1614)
_TAPS_BYTES = 192 << 10
_TAPS_MAX_PIXELS = 200
_TAPS_MIN_CHANNELS = 200
# stride 1: the flat path (_conv_depthwise_flat) up to this many output pixels, except the taps
# path from this many channels on up to this many pixels with a 5x5 or larger kernel. Measured
# (best of 20 x 4 alternating, load ~1, time ratio flat / the path taken before): 5x5 at 14x14 x
# 240 0.84 (taps before), 144 / 120 channels 0.84, 30x40x192 0.90, 15x20x384 0.89, 12x80x240 0.93,
# 10x20x200 0.80 (taps), 8x8x200 0.74 (taps), 12x12x400 0.79 (taps); 3x3 at 28x28x88 0.92, 14x14x128
# 0.85, 7x7x256 0.79, 56x56x32 0.95, 60x80x96 1.00; but 120x160x48 1.08 and 240x320x16 1.12 (the
# row path's copy has long runs there too); taps / flat with many channels: 7x7x576 0.72,
# 9x9x480 0.77, 10x10x480 0.90, 10x10x672 1.01
_FLAT_MAX_PIXELS = 5000
_FLAT_TAPS_MAX_PIXELS = 100
_FLAT_TAPS_MIN_CHANNELS = 400


def _conv_transpose2d(out, x, weight, bias=None, *, stride, padding, output_padding, dilation, groups):
    n, c, h, w = x.shape
    _, og, kh, kw = weight.shape
    o, oh, ow = out.shape[1:]
    g, cg = groups, c // groups
    (sh, sw), (dh, dw) = stride, dilation
    a = _f(x).reshape(n, g, cg, h * w)
    wt = _f(weight).reshape(g, cg, og * kh * kw).transpose(0, 2, 1)               # (g, og*kh*kw, cg)
    # every input pixel times every tap, one GEMM whose rows are (og, tap): each tap's products
    # are then a contiguous (og, h, w) block (rows (h, w, og, tap) made the scatter below read
    # with a stride of og*kh*kw values: 4x slower on PP-OCR's 2x2 stride-2 upsampling)
    y = matmul(wt, a).reshape(n, g, og, kh, kw, h, w)
    (pt, pb), (pl, pr) = padding
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, pt + oh)
    full_w = max((w - 1) * sw + dw * (kw - 1) + 1, pl + ow)
    apart = (kh - 1) * dh < sh and (kw - 1) * dw < sw         # no two taps write one output
    # every output written: the taps' offsets i * dh are 0..sh-1 only with dh == 1 and kh == sh (a
    # dilated 1x1 kernel at stride 2 writes every other row: those rows are zeros, not np.empty's)
    covered = apart and dh == 1 and dw == 1 and kh == sh and kw == sw and full_h == h * sh and full_w == w * sw
    full = (np.empty if covered else np.zeros)((n, g, og, full_h, full_w), dtype=y.dtype)   # (each written once)
    for i in range(kh):
        for j in range(kw):
            dst = full[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (w - 1) * sw + 1:sw]
            if apart:
                dst[...] = y[:, :, :, i, j]
            else:
                dst += y[:, :, :, i, j]
    res = full.reshape(n, o, full_h, full_w)[:, :, pt:pt + oh, pl:pl + ow]
    if bias is not None:
        res = res + _f(bias).reshape(1, o, 1, 1)
    return _out(res, out)


# ---- pooling ------------------------------------------------------------------------------------

def _ceil_extra(size, pads, oh, k, s, d):
    """Extra end padding so that ceil-mode windows (``oh`` of them) stay inside the array."""
    return max(0, (oh - 1) * s + d * (k - 1) + 1 - size - pads[0] - pads[1])


def _max_pool_tiled(a, oh, ow, kh, kw):
    """Max pooling whose windows tile the input exactly (kernel == stride, no padding or
    dilation): the kh rows of every window combined first over the whole flat array (kh - 1
    maxima of long contiguous runs, row r shifted by r * w), then the kw columns at each
    window's start (plain reshaped views of that flat result: window row 0 of every window,
    column j). The window rows are short (w elements), so this does the strided work once, on
    a kh-th of the data, instead of for every tap."""
    n, c, h, w = a.shape
    x = np.ascontiguousarray(a).reshape(-1)
    m = n * c * oh
    span = x.size - (kh - 1) * w
    if kh > 1:
        vm = np.empty(x.size, x.dtype)      # (the last kh - 1 rows are never read: odd window rows)
        np.maximum(x[:span], x[w:w + span], out=vm[:span])
        for r in range(2, kh):
            np.maximum(vm[:span], x[r * w:r * w + span], out=vm[:span])
    else:
        vm = x
    v = vm.reshape(m, kh, ow, kw)[:, 0]                  # (m, ow, kw): row 0 of each window
    if kw == 1:
        return v[:, :, 0].copy().reshape(n, c, oh, ow)
    y = np.maximum(v[:, :, 0], v[:, :, 1])
    for j in range(2, kw):
        np.maximum(y, v[:, :, j], out=y)
    return y.reshape(n, c, oh, ow)


def _max_pool2d(out, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    oh, ow = out.shape[2:]
    a = x._buf
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    kh, kw = kernel_size
    if (tuple(stride) == (kh, kw) and tuple(dilation) == (1, 1) and padding == ((0, 0), (0, 0)) and kh * kw > 1
            and a.shape[2] == oh * kh and a.shape[3] == ow * kw and a.size):
        return _out(_max_pool_tiled(a, oh, ow, kh, kw), out)
    low = -np.inf if a.dtype.kind == "f" else np.iinfo(a.dtype).min
    a = _padded(a, padding, low, _ceil_extra(a.shape[2], padding[0], oh, kh, stride[0], dilation[0]),
                _ceil_extra(a.shape[3], padding[1], ow, kw, stride[1], dilation[1]))
    # pairwise maxima over the kernel taps: kh*kw - 1 ufunc calls on strided views, far cheaper
    # than one reduction over two tiny window axes (np.maximum propagates NaN, like max)
    y = None
    for _i, _j, v in _taps(a, oh, ow, kh, kw, stride, dilation):
        if y is None:
            y = v.copy()
        else:
            np.maximum(y, v, out=y)
    return _out(y, out)


def _avg_divisors(size, k, s, p0, p1, n_out, include_pad):
    a = np.arange(n_out) * s - p0
    b = np.minimum(a + k, size + p1)
    return (b - a) if include_pad else (np.minimum(b, size) - np.maximum(a, 0))


def _avg_pool2d(out, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
    oh, ow = out.shape[2:]
    kh, kw = kernel_size
    a = _f(x)
    a = _padded(a, padding, 0, _ceil_extra(a.shape[2], padding[0], oh, kh, stride[0], 1),
                _ceil_extra(a.shape[3], padding[1], ow, kw, stride[1], 1))
    y = None
    for _i, _j, v in _taps(a, oh, ow, kh, kw, stride, (1, 1)):
        if y is None:
            y = v.astype(np.float32, copy=True)
        else:
            y += v
    dy = _avg_divisors(x.shape[2], kh, stride[0], *padding[0], oh, count_include_pad)
    dx = _avg_divisors(x.shape[3], kw, stride[1], *padding[1], ow, count_include_pad)
    y /= np.outer(dy, dx).astype(y.dtype)
    return _out(y, out)


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
    run.__wrapped__ = kernel     # (a caller already inside errstate, the plan replay, calls it directly)
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
    "batch_norm_train": _batch_norm_train,
    "cross_entropy": _cross_entropy,
    "layer_norm": _layer_norm,
    "scaled_dot_product_attention": _sdpa,
    "linear": _linear,
    "conv2d": _conv2d,
    "conv_transpose2d": _conv_transpose2d,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "cumsum": _cumsum,
    "sort": _sort,
    "pad": _pad,
}
# kernels that cannot raise floating-point warnings skip errstate's cost (it is per call)
_NEVER_WARN = {"relu", "max_pool2d", "sort", "pad"}
KERNELS = {name: (k if name in _NEVER_WARN else _quiet(k)) for name, k in KERNELS.items()}
