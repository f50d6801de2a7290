"""Pure-Python kernels for the neural-network ops (conv, pooling, norms, sort...).

Speed matters here (the MNIST demo runs this code in the browser), so the hot loops avoid
per-element Python calls: convolution gathers image patches with one cached
``operator.itemgetter`` (im2col) and takes row dot products with ``math.sumprod`` (Python 3.12+,
so in Pyodide) or ``sum(map(mul, ...))``; pooling gathers one tuple per kernel tap and combines
taps with ``map(max, ...)``. Values are computed as Python floats and rounded once on store.
"""
from __future__ import annotations

import math
from itertools import accumulate, repeat
from math import exp, prod, sqrt
from operator import add, itemgetter, mul

_sumprod = getattr(math, "sumprod", None)
_INF = float("inf")


def _store(values, dtype):
    # The python backend's own store (rounding to float32/float16, integer wrapping), looked up
    # late because python.py imports this module while it is being defined.
    from .python import _store as store
    return store(values, dtype)


def _gather(idx):
    """A callable picking ``seq[i] for i in idx`` as one tuple (itemgetter returns a bare item
    for a single index, so that case is wrapped)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    if not idx:
        return lambda seq: ()
    return itemgetter(*idx)


_CACHE: dict = {}
_CACHE_LIMIT = 64          # entries
_CACHE_MAX_INDICES = 1 << 21  # larger index lists are rebuilt per call instead of kept


def _cached(key, build, size):
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    value = build()
    if size <= _CACHE_MAX_INDICES:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = value
    return value


# ---- activations and softmax ------------------------------------------------------------------

def _unary(fn):
    def kernel(out, x, **_):
        return _store(list(map(fn, x._buf)), out.dtype)
    return kernel


def _relu(v):
    return 0.0 if v < 0 else v   # NaN passes through


def _sigmoid(v):
    if v >= 0:
        return 1.0 / (1.0 + exp(-v))
    e = exp(v)   # v < 0 (or NaN): no overflow; underflow gives 0.0
    return e / (1.0 + e)


def _gelu_erf(v):
    return 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))


_TANH_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(_TANH_C * (v + 0.044715 * v * v * v)))


def _relu_kernel(out, x):
    buf = x._buf
    if out.dtype.kind != "f":
        return _store([0 if v < 0 else v for v in buf], out.dtype)
    return _store(list(map(_relu, buf)), out.dtype)


def _leaky_relu(out, x, *, negative_slope):
    s = negative_slope
    return _store([v * s if v < 0 else v for v in x._buf], out.dtype)


def _gelu(out, x, *, approximate):
    return _store(list(map(_gelu_tanh if approximate == "tanh" else _gelu_erf, x._buf)), out.dtype)


def _silu(v):
    return v * _sigmoid(v)


def _lines(buf, shape, axis, fn, nout=1):
    """Apply ``fn(list) -> list`` (or a tuple of ``nout`` lists) to every 1-D line of the flat
    row-major ``buf`` along ``axis``; return flat list(s) in the same layout."""
    shape = tuple(shape) or (1,)
    n = shape[axis]
    inner = prod(shape[axis + 1:])
    outer = prod(shape[:axis])
    total = len(buf)
    if total == 0:
        return ([] for _ in range(nout)) if nout > 1 else []
    if inner == 1:
        outs = [[] for _ in range(nout)]
        for o in range(outer):
            r = fn(buf[o * n:(o + 1) * n].tolist())
            if nout == 1:
                outs[0].extend(r)
            else:
                for dst, part in zip(outs, r):
                    dst.extend(part)
        return outs[0] if nout == 1 else outs
    outs = [[0] * total for _ in range(nout)]
    span = n * inner
    for o in range(outer):
        base = o * span
        for j in range(inner):
            s = base + j
            r = fn(buf[s:s + span:inner].tolist())
            if nout == 1:
                outs[0][s:s + span:inner] = r
            else:
                for dst, part in zip(outs, r):
                    dst[s:s + span:inner] = part
    return outs[0] if nout == 1 else outs


def _softmax_line(row):
    m = max(row)
    e = [exp(v - m) for v in row]
    inv = 1.0 / sum(e)
    return [v * inv for v in e]


def _log_softmax_line(row):
    m = max(row)
    lse = m + math.log(sum([exp(v - m) for v in row]))
    return [v - lse for v in row]


def _softmax(out, x, *, axis):
    axis = axis % max(len(x.shape), 1)
    return _store(_lines(x._buf, x.shape, axis, _softmax_line), out.dtype)


def _log_softmax(out, x, *, axis):
    axis = axis % max(len(x.shape), 1)
    return _store(_lines(x._buf, x.shape, axis, _log_softmax_line), out.dtype)


# ---- normalization --------------------------------------------------------------------------

def _batch_norm(out, x, mean, var, weight, bias, *, eps):
    c = x.shape[1]
    spatial = prod(x.shape[2:])
    scale = [w / sqrt(v + eps) for w, v in zip(weight._buf, var._buf)]
    shift = [b - m * s for b, m, s in zip(bias._buf, mean._buf, scale)]
    buf = x._buf
    res = []
    for i in range(x.shape[0] * c):
        s, t = scale[i % c], shift[i % c]
        res.extend([v * s + t for v in buf[i * spatial:(i + 1) * spatial].tolist()])
    return _store(res, out.dtype)


def _layer_norm(out, x, weight, bias, *, normalized_shape, eps):
    m = prod(normalized_shape)
    w = weight._buf.tolist()
    b = bias._buf.tolist()
    buf = x._buf
    res = []
    for g in range(len(buf) // m if m else 0):
        row = buf[g * m:(g + 1) * m].tolist()
        mu = sum(row) / m
        d = [v - mu for v in row]
        r = 1.0 / sqrt(sum([v * v for v in d]) / m + eps)
        res.extend([v * r * wi + bi for v, wi, bi in zip(d, w, b)])
    return _store(res, out.dtype)


# ---- convolution ------------------------------------------------------------------------------

def _im2col(cg, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow):
    """Gatherers for the patches of one (batch, group) slice of the input, flattened to
    ``cg*h*w`` values followed by one zero (the index of every padding element). Returns a
    list of (gather, n_positions); each gather yields n_positions patches of
    ``cg*kh*kw`` values back to back, in (channel, ky, kx) order like the weight rows."""
    k = cg * kh * kw
    zero = cg * h * w
    rows_per_chunk = max(1, _CACHE_MAX_INDICES // max(1, ow * k))

    def build():
        # input column for each (output column, kx); -1 when it falls in the padding
        xcols = [[x if 0 <= x < w else -1 for x in (o * sw - pl + j * dw for j in range(kw))] for o in range(ow)]
        chunks = []
        for r0 in range(0, oh, rows_per_chunk):
            idx = []
            for r in range(r0, min(oh, r0 + rows_per_chunk)):
                ys = [y if 0 <= y < h else -1 for y in (r * sh - pt + i * dh for i in range(kh))]
                for xc in xcols:
                    for c in range(cg):
                        for y in ys:
                            if y < 0:
                                idx.extend(repeat(zero, kw))
                            else:
                                base = (c * h + y) * w
                                idx.extend([base + x if x >= 0 else zero for x in xc])
            chunks.append((_gather(idx), len(idx) // k))
        return chunks

    key = ("im2col", cg, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow)
    return _cached(key, build, oh * ow * k)


def _conv_core(xbuf, n, c, h, w, wbuf, o, kh, kw, bias, stride, pads, dilation, groups, oh, ow):
    """Direct 2-D convolution on flat buffers; returns the flat NCHW output as a list."""
    (pt, _), (pl, _) = pads
    cg, og = c // groups, o // groups
    k = cg * kh * kw
    plane = cg * h * w
    gathers = _im2col(cg, h, w, kh, kw, stride[0], stride[1], pt, pl, dilation[0], dilation[1], oh, ow)
    wl = wbuf.tolist() if hasattr(wbuf, "tolist") else list(wbuf)
    wrows = [wl[i * k:(i + 1) * k] for i in range(o)]
    bl = bias.tolist() if bias is not None else None
    out = []
    for b in range(n):
        for g in range(groups):
            start = (b * c + g * cg) * h * w
            xs = xbuf[start:start + plane]
            xs = xs.tolist() if hasattr(xs, "tolist") else xs   # array slice or list slice (a copy)
            xs.append(0.0)
            rows = wrows[g * og:(g + 1) * og]
            res = []   # one list of og outputs per position
            for gather, npos in gathers:
                t = gather(xs)
                if _sumprod is not None:
                    for p in range(0, npos * k, k):
                        col = t[p:p + k]
                        res.append(list(map(_sumprod, rows, repeat(col))))
                else:
                    for p in range(0, npos * k, k):
                        col = t[p:p + k]
                        res.append([sum(map(mul, r, col)) for r in rows])
            for j, vals in enumerate(zip(*res)):
                if bl is not None:
                    vals = map(bl[g * og + j].__add__, vals)
                out.extend(vals)
    return out


def _conv2d(out, x, weight, bias=None, *, stride, padding, dilation, groups):
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh, ow = out.shape[2:]
    if out.shape[0] * o * oh * ow == 0:
        return _store([], out.dtype)
    res = _conv_core(x._buf, n, c, h, w, weight._buf, o, kh, kw, bias._buf if bias is not None else None,
                     stride, padding, dilation, groups, oh, ow)
    return _store(res, out.dtype)


def _conv_transpose2d(out, x, weight, bias=None, *, stride, padding, output_padding, dilation, groups):
    """A transposed convolution is a stride-1 convolution, with the kernel flipped and its
    in/out axes swapped, over the input spread out by the stride and padded by
    ``dilation*(k-1) - padding`` (negative: cropped) plus ``output_padding`` at the end."""
    n, c, h, w = x.shape
    _, og, kh, kw = weight.shape
    cg = c // groups
    o, oh, ow = out.shape[1:]
    if n * o * oh * ow == 0:
        return _store([], out.dtype)
    # weight (c, og, kh, kw) -> conv weight (o, cg, kh, kw), flipped
    wb = weight._buf
    wconv = []
    for g in range(groups):
        for oo in range(og):
            for ci in range(cg):
                base = ((g * cg + ci) * og + oo) * kh * kw
                wconv.extend(wb[base:base + kh * kw][::-1])
    # the spread-out, padded input: positions along each axis map to input index or -1
    axes = []
    for size, s, d, k, (p0, _), size_out in zip((h, w), stride, dilation, (kh, kw), padding, (oh, ow)):
        lead = d * (k - 1) - p0
        span = size_out + d * (k - 1)
        src = []
        for j in range(span):
            q = j - lead
            src.append(q // s if q >= 0 and q % s == 0 and q // s < size else -1)
        axes.append(src)
    ys, xs_ = axes
    hp, wp = len(ys), len(xs_)
    plane = h * w
    idx = []
    for ci in range(c):
        for y in ys:
            if y < 0:
                idx.extend(repeat(-1, wp))
            else:
                base = ci * plane + y * w
                idx.extend([base + x if x >= 0 else -1 for x in xs_])
    spread = _gather(idx)
    xb = x._buf
    big = []
    for b in range(n):
        src = xb[b * c * plane:(b + 1) * c * plane].tolist()
        src.append(0.0)   # index -1: the zeros between and around the input values
        big.extend(spread(src))
    res = _conv_core(big, n, c, hp, wp, wconv, o, kh, kw, bias._buf if bias is not None else None,
                     (1, 1), ((0, 0), (0, 0)), dilation, groups, oh, ow)
    return _store(res, out.dtype)


# ---- pooling ------------------------------------------------------------------------------------

def _pool_taps(h, w, kh, kw, sh, sw, pads, dh, dw, oh, ow):
    """One gather per kernel tap over a plane flattened to ``h*w`` values plus one padding value:
    tap (i, j) yields the element it touches for each output position."""
    (pt, _), (pl, _) = pads

    def build():
        pad = h * w
        taps = []
        for i in range(kh):
            ys = [r * sh - pt + i * dh for r in range(oh)]
            for j in range(kw):
                xs = [q * sw - pl + j * dw for q in range(ow)]
                taps.append(_gather([y * w + x if 0 <= y < h and 0 <= x < w else pad for y in ys for x in xs]))
        return taps

    return _cached(("pool", h, w, kh, kw, sh, sw, pads, dh, dw, oh, ow), build, kh * kw * oh * ow)


def _nanmax(*vals):
    for v in vals:
        if v != v:
            return v
    return max(vals)


def _max_pool2d(out, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    taps = _pool_taps(h, w, *kernel_size, *stride, padding, *dilation, oh, ow)
    buf = x._buf
    plane = h * w
    # max() lets NaN through only in first position; a NaN anywhere (sum is NaN) takes the slow path
    maxfn = max
    if out.dtype.kind == "f" and len(buf):
        s = sum(buf)
        if s != s:
            maxfn = _nanmax
    # padding never wins; a dilated window entirely in the padding gives -inf (the dtype's minimum
    # for integers), as in PyTorch
    low = -_INF if out.dtype.kind == "f" else -(1 << (8 * out.dtype.itemsize - 1)) if out.dtype.kind == "i" else 0
    res = []
    for p in range(n * c):
        src = buf[p * plane:(p + 1) * plane].tolist()
        src.append(low)
        cols = [t(src) for t in taps]
        res.extend(cols[0] if len(cols) == 1 else map(maxfn, *cols))
    return _store(res, out.dtype)


def _avg_divisors(size, k, s, p0, p1, n_out, include_pad):
    # PyTorch's rule: a window is clipped to the padded input, then (without count_include_pad)
    # to the input itself.
    out = []
    for i in range(n_out):
        a = i * s - p0
        b = min(a + k, size + p1)
        out.append(b - a if include_pad else min(b, size) - max(a, 0))
    return out


def _avg_pool2d(out, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    taps = _pool_taps(h, w, *kernel_size, *stride, padding, 1, 1, oh, ow)
    dy = _avg_divisors(h, kernel_size[0], stride[0], *padding[0], oh, count_include_pad)
    dx = _avg_divisors(w, kernel_size[1], stride[1], *padding[1], ow, count_include_pad)
    inv = [1.0 / (a * b) for a in dy for b in dx]
    buf = x._buf
    plane = h * w
    res = []
    for p in range(n * c):
        src = buf[p * plane:(p + 1) * plane].tolist()
        src.append(0.0)
        acc = None
        for t in taps:
            v = t(src)
            acc = v if acc is None else map(add, acc, v)
        res.extend(map(mul, acc, inv))
    return _store(res, out.dtype)


# ---- cumsum, sort ---------------------------------------------------------------------------

def _cumsum(out, x, *, axis, exclusive, reverse):
    isfloat = out.dtype.kind == "f"

    def line(row):
        if not isfloat:
            row = [int(v) for v in row]
        if reverse:
            row.reverse()
        acc = list(accumulate(row))
        if exclusive:
            acc = [0.0 if isfloat else 0] + acc[:-1]
        if reverse:
            acc.reverse()
        return acc

    return _store(_lines(x._buf, x.shape, axis, line), out.dtype)


def _sort(outs, x, *, axis, descending, stable):
    def line(row):
        key = row.__getitem__
        if any(v != v for v in row):
            # NaN sorts as the largest value (numpy and PyTorch agree)
            key = lambda i: (1, 0.0) if row[i] != row[i] else (0, row[i])  # noqa: E731
        # Python's sort is stable in both directions (reverse=True keeps equal items in order)
        order = sorted(range(len(row)), key=key, reverse=descending)
        return [row[i] for i in order], order

    values, indices = _lines(x._buf, x.shape, axis, line, nout=2)
    return _store(values, outs[0].dtype), _store(indices, outs[1].dtype)


# ---- pad --------------------------------------------------------------------------------------

def _pad_kept(n, before, after):
    """(first kept index, elements kept) along an axis of ``n`` after negative pads crop it."""
    lo = max(-before, 0)
    return lo, n - lo - max(-after, 0)


def _pad_source(n, before, after, mode):
    """Source index along one axis for each output position (-1: the constant)."""
    lo, m = _pad_kept(n, before, after)
    src = []
    for j in range(-max(before, 0), m + max(after, 0)):
        if 0 <= j < m:
            src.append(lo + j)
        elif mode == "constant":
            src.append(-1)
        elif mode == "edge":
            src.append(lo if j < 0 else lo + m - 1)
        elif mode == "reflect":
            if m == 1:
                src.append(lo)
            else:
                r = j % (2 * (m - 1))
                src.append(lo + (r if r < m else 2 * (m - 1) - r))
        else:  # wrap
            src.append(lo + j % m)
    return src


def _pad(out, x, *, pad_width, mode, value):
    # Row by row: a constant/edge row is two repeated blocks around one slice of the input (C-speed
    # list operations), other modes gather each row through its source indices; whole padded
    # blocks of the outer axes are one repeated constant.
    shape = x.shape
    oshape = out.shape
    if not prod(oshape):
        return _store([], out.dtype)
    kind = out.dtype.kind
    v = float(value) if kind == "f" else bool(value) if kind == "b" else int(value)
    buf = x._buf.tolist()
    rank = len(shape)
    if rank == 0:
        return _store(buf, out.dtype)
    srcs = [_pad_source(n, b, a, mode) for n, (b, a) in zip(shape, pad_width)]
    strides = [prod(shape[ax + 1:]) for ax in range(rank)]
    blocks = [prod(oshape[ax + 1:]) for ax in range(rank)]
    last = srcs[-1]
    b_last, a_last = pad_width[-1]
    lo, m = _pad_kept(shape[-1], b_last, a_last)
    left, right = max(b_last, 0), max(a_last, 0)
    res: list = []
    ext = res.extend

    if mode == "constant" or mode == "edge":
        def row(base):
            if m <= 0:
                ext([v] * len(last))
                return
            lv = v if mode == "constant" else buf[base + lo]
            rv = v if mode == "constant" else buf[base + lo + m - 1]
            if left:
                ext([lv] * left)
            ext(buf[base + lo:base + lo + m])
            if right:
                ext([rv] * right)
    else:
        def row(base):
            ext([buf[base + s_] for s_ in last])

    def walk(ax, base):
        if ax == rank - 1:
            row(base)
            return
        st, blk = strides[ax], blocks[ax]
        for s_ in srcs[ax]:
            if s_ < 0:
                ext([v] * blk)
            else:
                walk(ax + 1, base + s_ * st)

    walk(0, 0)
    return _store(res, out.dtype)


KERNELS = {
    "relu": _relu_kernel,
    "leaky_relu": _leaky_relu,
    "sigmoid": _unary(_sigmoid),
    "gelu": _gelu,
    "silu": _unary(_silu),
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
