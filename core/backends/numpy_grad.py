"""Backward-only kernels of the numpy backend (autodiff): ``scatter_add`` and the pooling
gradients. ``create_backend`` is the numpy device's factory: the numpy backend with these
kernels added (kept apart from numpy_backend.py / numpy_nn.py, the forward kernels), and
glibc's malloc told to keep freed memory (``numpy_backend.tune_malloc``)."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import IndexingError
from .numpy_backend import NumpyBackend, np_dtype, tune_malloc
from .numpy_blas import matmul
from .numpy_nn import _quiet


def _scatter_add(out, u, idx, *, axis, size, **_):
    ids = idx._buf.astype(np.int64)
    if ids.size and (ids.min() < -size or ids.max() >= size):
        bad = ids.min() if ids.min() < -size else ids.max()
        raise IndexingError(f"scatter_add: index {bad} is out of range for axis {axis} with size {size}")
    ids = np.where(ids < 0, ids + size, ids)
    ub = u._buf
    acc = np.zeros(out.shape, dtype=np.float64 if out.dtype.kind == "f" else np.int64)
    if all(m == 1 for a, m in enumerate(idx.shape) if a != axis):
        flat = ids.reshape(-1)
        outer = int(np.prod(u.shape[:axis], dtype=np.int64))
        inner = int(np.prod(u.shape[axis + 1:], dtype=np.int64))
        a3 = acc.reshape(outer, size, inner)
        u3 = ub.reshape(outer, len(flat), inner)
        if outer == 1 and inner > 1:
            # rows of an embedding table: sort once, add contiguous runs with reduceat
            order = np.argsort(flat, kind="stable")
            srt = flat[order]
            starts = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]]) if len(srt) else srt
            if len(srt):
                a3[0, srt[starts]] = np.add.reduceat(u3[0, order].astype(np.float64), starts, axis=0)
        else:
            np.add.at(a3, (slice(None), flat), u3)
    else:
        ib = np.broadcast_to(ids, u.shape)
        grids = list(np.indices(u.shape, sparse=True))
        grids[axis] = ib
        np.add.at(acc, tuple(grids), ub)
    return acc.astype(np_dtype(out.dtype))


# ---- pooling and convolution gradients -----------------------------------------------------------

def _f32(t):
    a = t._buf
    return a.astype(np.float32) if a.dtype != np.float32 else a


def _pad_to(a, pt, pl, hp, wp, value):
    """``a`` (N, C, H, W) placed at (pt, pl) in a (N, C, hp, wp) array of ``value``."""
    n, c, h, w = a.shape
    if pt == 0 and pl == 0 and hp == h and wp == w:
        return a
    buf = np.full((n, c, hp, wp), value, dtype=a.dtype)
    buf[:, :, pt:pt + h, pl:pl + w] = a[:, :, :min(h, hp - pt), :min(w, wp - pl)]
    return buf


def _span(o, s, k, d):
    return (o - 1) * s + d * (k - 1) + 1


def _tap(a, i, j, oh, ow, stride, dilation):
    y0, x0 = i * dilation[0], j * dilation[1]
    return (slice(None), slice(None), slice(y0, y0 + (oh - 1) * stride[0] + 1, stride[0]),
            slice(x0, x0 + (ow - 1) * stride[1] + 1, stride[1]))


def _max_pool2d_backward(out, g, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    a = _f32(x)
    n, c, h, w = a.shape
    oh, ow = g.shape[2:]
    (pt, pb), (pl, pr) = padding
    kh, kw = kernel_size
    hp = max(h + pt + pb, _span(oh, stride[0], kh, dilation[0]))
    wp = max(w + pl + pr, _span(ow, stride[1], kw, dilation[1]))
    ap = _pad_to(a, pt, pl, hp, wp, -np.inf) if (pt or pl or hp > h or wp > w) else a
    nan = bool(np.isnan(a).any())
    best = arg = None
    for t in range(kh * kw):      # pairwise over the taps (strided views): which tap holds the max
        v = ap[_tap(ap, t // kw, t % kw, oh, ow, stride, dilation)]
        if best is None:
            best, arg = v.copy(), np.zeros(v.shape, dtype=np.int8 if kh * kw < 128 else np.int32)
            continue
        # the first maximum wins (strictly greater replaces), a NaN beats everything, as PyTorch.
        # Arithmetic blends, not np.where / masked copies: those branch per element and crawl
        # on the random masks of real data.
        upd = v > best
        if nan:
            upd |= np.isnan(v) & ~np.isnan(best)
            best = np.where(upd, v, best)
        else:
            np.maximum(best, v, out=best)
        arg += upd.view(np.int8).astype(arg.dtype, copy=False) * (arg.dtype.type(t) - arg)
    gf = _f32(g)
    overlap = stride[0] < _span(2, 1, kh, dilation[0]) - 1 or stride[1] < _span(2, 1, kw, dilation[1]) - 1
    gp = np.zeros(ap.shape, dtype=np.float32) if overlap or ap is not a or gf.size * kh * kw != a.size \
        else np.empty(ap.shape, dtype=np.float32)   # tiled exactly by the windows: every element written
    for t in range(kh * kw):
        sl = _tap(gp, t // kw, t % kw, oh, ow, stride, dilation)
        if overlap:
            gp[sl] += gf * (arg == t)
        else:         # windows do not overlap: each input position gets at most one gradient
            gp[sl] = gf * (arg == t)
    res = gp[:, :, pt:pt + h, pl:pl + w] if gp.shape != a.shape else gp
    return res.astype(np_dtype(out.dtype), copy=False)


def _shift_applies(x_shape, w_shape, g_shape, stride, padding, dilation, groups) -> bool:
    """Whether ``_conv2d_grad_input_shift`` applies: groups 1, stride 1, no dilation, no
    negative padding, a kernel of more than one tap, the outputs exactly those of the padded
    input, and planes that are not tiny."""
    n, c, h, w = x_shape
    o, _, kh, kw = w_shape
    oh, ow = g_shape[2:]
    return (groups == 1 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and kh * kw > 1
            and min(min(p) for p in padding) >= 0 and n * c * o > 0 and oh * ow >= 16
            and oh == h + sum(padding[0]) - kh + 1 and ow == w + sum(padding[1]) - kw + 1)


def _conv2d_grad_weight(out, x, g, *, stride, padding, dilation, groups, kernel_size):
    a = _f32(x)
    n, c, h, w = a.shape
    o, oh, ow = g.shape[1:]
    kh, kw = kernel_size
    (pt, pb), (pl, pr) = padding
    hp = max(h + pt + pb, _span(oh, stride[0], kh, dilation[0]))
    wp = max(w + pl + pr, _span(ow, stride[1], kw, dilation[1]))
    ap = _pad_to(a, pt, pl, hp, wp, 0.0)
    gr, cg, og = groups, c // groups, o // groups
    # columns laid out (C, kh, kw, N, oh, ow) and the gradient as (O, N, oh, ow): the sum over
    # the batch and the output positions is then one plain GEMM per group, without transposes
    at = ap.transpose(1, 0, 2, 3)
    cols = np.empty((c, kh, kw, n, oh, ow), dtype=np.float32)
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dilation[0], j * dilation[1]
            cols[:, i, j] = at[:, :, y0:y0 + (oh - 1) * stride[0] + 1:stride[0], x0:x0 + (ow - 1) * stride[1] + 1:stride[1]]
    cols = cols.reshape(gr, cg * kh * kw, n * oh * ow)
    gm = np.ascontiguousarray(_f32(g).transpose(1, 0, 2, 3)).reshape(gr, og, n * oh * ow)
    res = matmul(gm, cols.transpose(0, 2, 1)) if gr > 1 else matmul(gm[0], cols[0].T)[None]
    return res.reshape(o, cg, kh, kw).astype(np_dtype(out.dtype), copy=False)


def _conv2d_grad_input_stride1(gf, wf, groups, h, w, padding):
    """Stride 1, no dilation: the input gradient is the full correlation of the (zero padded)
    output gradient with the flipped, transposed kernel -- one im2col copy of ``g`` and one
    GEMM per group, instead of a GEMM and a scatter-add per kernel tap (col2im)."""
    n, o, oh, ow = gf.shape
    _, cg, kh, kw = wf.shape
    gr, og = groups, o // groups
    (pt, pb), (pl, pr) = padding
    gp = np.zeros((n, o, h + kh - 1, w + kw - 1), dtype=np.float32)
    gp[:, :, kh - 1 - pt:kh - 1 - pt + oh, kw - 1 - pl:kw - 1 - pl + ow] = gf
    s0, s1, s2, s3 = gp.strides
    cols = np.ascontiguousarray(as_strided(gp, (n, gr, og, kh, kw, h, w), (s0, s1 * og, s1, s2, s3, s2, s3),
                                           writeable=False)).reshape(n, gr, og * kh * kw, h * w)
    # wf[o, c, i, j] -> (group, c, o, flipped i, flipped j): the GEMM's (cg, og*kh*kw) matrix
    wt = np.ascontiguousarray(wf.reshape(gr, og, cg, kh, kw)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4))
    res = matmul(wt.reshape(gr, cg, og * kh * kw), cols)                # (n, gr, cg, h*w)
    return res.reshape(n, gr * cg, h, w)


def _conv2d_grad_input_shift(gf, wf, h, w, padding):
    """Stride 1 as shifted rows. Output (Y, X) of tap (i, j) read padded input (Y + i, X + j):
    with every padded (hp, wp) plane flattened row-major and the output gradient laid out on
    the padded width (its columns ow.. zero), tap (i, j) feeds ONE contiguous run of the flat
    plane, from i * wp + j. So: the columns W^T g as one GEMM over the whole batch, then one
    contiguous add per tap (the zero columns land on the next row, adding nothing), instead of
    an im2col of g or short strided adds. (An infinite weight makes 0 * inf = NaN there, as the
    zero padding does in the im2col path.)"""
    n, o, oh, ow = gf.shape
    _, c, kh, kw = wf.shape
    (pt, pb), (pl, pr) = padding
    hp, wp = h + pt + pb, w + pl + pr
    L = oh * wp
    gp = np.zeros((o, n, oh, wp), dtype=gf.dtype)
    gp[:, :, :, :ow] = gf.transpose(1, 0, 2, 3)
    cols = matmul(wf.reshape(o, c * kh * kw).T, gp.reshape(o, n * L)).reshape(c, kh, kw, n, L)
    buf = np.zeros((c, n, (hp + 1) * wp), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            off = i * wp + j
            buf[:, :, off:off + L] += cols[:, i, j]
    planes = buf[:, :, :hp * wp].reshape(c, n, hp, wp)
    return np.ascontiguousarray(planes[:, :, pt:pt + h, pl:pl + w].transpose(1, 0, 2, 3))


def _conv2d_grad_input(out, g, weight, *, stride, padding, dilation, groups, input_size):
    gf = _f32(g)
    wf = _f32(weight)
    n, o, oh, ow = gf.shape
    _, cg, kh, kw = wf.shape
    gr, og = groups, o // groups
    h, w = input_size
    (pt, pb), (pl, pr) = padding
    if _shift_applies((n, cg * gr, h, w), wf.shape, gf.shape, stride, padding, dilation, groups):
        return _conv2d_grad_input_shift(gf, wf, h, w, padding).astype(np_dtype(out.dtype), copy=False)
    if tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and 0 <= pt < kh and 0 <= pl < kw and \
            oh == h + pt + pb - kh + 1 and ow == w + pl + pr - kw + 1 and 0 <= pb < kh and 0 <= pr < kw:
        return _conv2d_grad_input_stride1(gf, wf, gr, h, w, padding).astype(np_dtype(out.dtype), copy=False)
    # columns = W^T g, then each kernel tap adds its columns back where the forward read them
    cols = matmul(wf.reshape(gr, og, cg * kh * kw).transpose(0, 2, 1), gf.reshape(n, gr, og, oh * ow))
    cols = cols.reshape(n, gr * cg, kh, kw, oh, ow)
    hp = max(h + pt + pb, _span(oh, stride[0], kh, dilation[0]))
    wp = max(w + pl + pr, _span(ow, stride[1], kw, dilation[1]))
    buf = np.zeros((n, gr * cg, hp, wp), dtype=np.float32)
    for i in range(kh):
        for j in range(kw):
            buf[_tap(buf, i, j, oh, ow, stride, dilation)] += cols[:, :, i, j]
    return np.ascontiguousarray(buf[:, :, pt:pt + h, pl:pl + w]).astype(np_dtype(out.dtype), copy=False)


def _relu_backward(out, g, x):
    """g * (x > 0): one multiply by the boolean mask (numpy reads it as 0 / 1), as the
    decomposition's multiply by the mask cast to g's dtype."""
    return np.multiply(g._buf, x._buf > 0, dtype=np_dtype(out.dtype)).reshape(out.shape)


def _batch_norm_train_backward(outs, g, x, mean, var, weight, *, eps):
    """dx, dweight, dbias of training batch norm in one kernel, the decomposition's formula
    (dx = (dy - sum(dy) / n - xhat * sum(dy * xhat) / n) * (w * rstd)) over (N, C, L) views:
    two full-size arrays (xhat, then dy * xhat reused for dx) instead of one per op."""
    from .numpy_nn import _channel_rows, _channel_sum, _per_channel

    ct = np.float64 if any(t._buf.dtype == np.float64 for t in (g, x, mean, var, weight)) else np.float32

    def f(t):
        return t._buf.astype(ct, copy=False)

    gy, a = _channel_rows(f(g)), _channel_rows(f(x))
    count = ct(a.shape[0] * a.shape[2] if a.shape[1] else 1)
    rstd = ct(1.0) / np.sqrt(f(var) + ct(eps))
    xhat = a - _per_channel(f(mean), a)
    xhat *= _per_channel(rstd, a)
    gsum = _channel_sum(gy)
    t = gy * xhat
    gxh = _channel_sum(t)
    xhat *= _per_channel(gxh / count, a)
    np.subtract(gy, _per_channel(gsum / count, a), out=t)
    t -= xhat
    t *= _per_channel(f(weight) * rstd, a)
    gx, gw, gb = outs
    return (t.reshape(gx.shape).astype(np_dtype(gx.dtype), copy=False),
            gxh.astype(np_dtype(gw.dtype), copy=False), gsum.astype(np_dtype(gb.dtype), copy=False))


def _cross_entropy_backward(out, g, x, t, w=None, *, reduction, ignore_index, label_smoothing, probs):
    """d loss / d logits = (softmax(x) * sum(q) - q) * (upstream / denominator), the
    decomposition's formula in one kernel, back in the logits' layout."""
    from .numpy_nn import _ce_logits, ce_targets

    x2 = _ce_logits(x)
    q, denom = ce_targets(x2, t, w, ignore_index, label_smoothing, probs)
    ct = x2.dtype.type
    gf = g._buf.astype(ct, copy=False)
    if x2.size:
        e = x2 - x2.max(axis=1, keepdims=True)
        np.exp(e, out=e)
        e /= e.sum(axis=1, keepdims=True)
    else:
        e = x2.copy()
    e *= q.sum(axis=1, keepdims=True)
    e -= q
    if reduction == "none":
        e *= gf.reshape(x2.shape[0], 1)
    elif reduction == "sum":
        e *= gf
    else:
        e *= gf / denom
    if x.ndim == 1:
        e = e.reshape(x.shape)
    elif x.ndim > 2:
        e = np.moveaxis(e.reshape((x.shape[0],) + tuple(x.shape[2:]) + (x.shape[1],)), -1, 1)
    return np.ascontiguousarray(e, dtype=np_dtype(out.dtype))


def _linear_grad_weight(out, g, x, **_):
    # g^T x with BLAS reading g transposed in place (no copy of the transpose)
    g2 = _f32(g).reshape(-1, g.shape[-1])
    x2 = _f32(x).reshape(-1, x.shape[-1])
    return matmul(g2.T, x2).astype(np_dtype(out.dtype), copy=False)


KERNELS = {
    "scatter_add": _scatter_add,
    "linear_grad_weight": _linear_grad_weight,
    "max_pool2d_backward": _max_pool2d_backward,
    "conv2d_grad_weight": _conv2d_grad_weight,
    "conv2d_grad_input": _conv2d_grad_input,
    "batch_norm_train_backward": _quiet(_batch_norm_train_backward),
    "relu_backward": _quiet(_relu_backward),
    "cross_entropy_backward": _quiet(_cross_entropy_backward),
}


def create_backend() -> NumpyBackend:
    tune_malloc()
    b = NumpyBackend()
    b.kernels.update(KERNELS)
    return b
