"""webgpu kernels for the neural-network ops: conv2d, conv_transpose2d, max/avg pooling,
cumsum, sort, pad (primitives) and real kernels for the softmax, log_softmax, layer_norm and
scaled_dot_product_attention composites. Elementwise composites (relu, gelu, sigmoid, silu...)
are fused elementwise ops (``fusion.OPS_WGSL``)."""
from __future__ import annotations

from math import prod

from .. import dtypes as _dt
from ..registry import OPS, Meta
from . import fusion
from .driver import cpu_adapter, grid_1d
from .fusion import GBuf, contiguous, contiguous_strides, dense, realize, wgsl_type
from .runtime import env_on

WG = 256


def _info(words):
    from .ops import info_words

    return info_words(words)


def _finish(rt, g, out):
    from .ops import finish

    return finish(rt, g, out)


def f32_view(rt, g: GBuf) -> GBuf:
    """A realised f32 view with ``g``'s values (ints are converted; float16 already is f32)."""
    if wgsl_type(g.dtype) != "f32":
        g = fusion.record(rt, "_cast", Meta(g.shape, _dt.float32), [g])
    return realize(g)


def as_f32(rt, g: GBuf) -> GBuf:
    """``f32_view`` as a contiguous buffer starting at element 0."""
    return dense(f32_view(rt, g))


def _dummy(rt):
    st = getattr(rt, "_dummy", None)
    if st is None:
        st = rt._dummy = rt.alloc(16)
        rt.write(st, bytes(16))
    return st


def _whole(g: GBuf):
    return (g.storage.buf, 0, g.storage.nbytes)


def _new(rt, shape, dtype):
    n = prod(shape)
    st = rt.alloc(n * 4)
    return GBuf(rt, shape, dtype, storage=st), st, n


def _run_1d(rt, pipe, bufs, info, n):
    rt.dispatch(pipe, bufs, info, grid_1d((n + WG - 1) // WG, rt.max_groups))


def _run_rows(rt, pipe, bufs, info, rows):
    rt.dispatch(pipe, bufs, info, grid_1d(rows, rt.max_groups))


# ---- convolution -----------------------------------------------------------------------------

def _conv(rt, name):
    def kernel(out, x, weight, bias=None, *, stride, padding, dilation, groups, output_padding=None):
        if name == "conv2d" and groups == 1 and bias is None and prod(out.shape) and \
                _weight_grad_shaped(rt, x.shape, weight.shape, out.shape):
            vx, vw = f32_view(rt, x._buf), f32_view(rt, weight._buf)
            if vw.strides[2] == vw.shape[3] * vw.strides[3] and min(vx.strides + vw.strides) >= 0:
                g = _conv_over_channels(rt, vx, vw, out.shape, stride, padding, dilation)
                return _finish(rt, g, out)
        gx = as_f32(rt, x._buf)
        gw = as_f32(rt, weight._buf)
        gb = as_f32(rt, bias._buf) if bias is not None else None
        res, st, n = _new(rt, out.shape, _dt.float32)
        if n:
            N, C, H, W = gx.shape
            O, OH, OW = out.shape[1:]
            KH, KW = gw.shape[2:]
            if name == "conv2d":
                per_group, out_per_group = C // groups, O // groups
            else:
                per_group, out_per_group = C // groups, gw.shape[1]
            deep = O >= MATMUL_MIN_CHANNELS or (name == "conv_transpose2d" and C * KH * KW >= MATMUL_MIN_DEPTH)
            if groups == 1 and deep and _as_matmul(rt, N, C * KH * KW, OH * OW):
                if name == "conv2d":
                    return _finish(rt, _conv_matmul(rt, gx, gw, gb, out.shape, stride, padding, dilation), out)
                # stride 1: conv_transpose2d is conv2d with the kernel flipped, its two channel
                # axes swapped and the padding d*(k-1) - p (conv2d's input gradient in training)
                pads = ((dilation[0] * (KH - 1) - padding[0][0], 0), (dilation[1] * (KW - 1) - padding[1][0], 0))
                if tuple(stride) == (1, 1) and pads[0][0] >= 0 and pads[1][0] >= 0:
                    wt = contiguous(GBuf(rt, (O, C, KH, KW), _dt.float32, storage=gw.storage,
                                         offset=gw.offset + KH * KW - 1, strides=(KH * KW, O * KH * KW, -KW, -1)))
                    return _finish(rt, _conv_matmul(rt, gx, wt, gb, out.shape, (1, 1), pads, dilation), out)
            words = [n, N, O, OH, OW, C, H, W, KH, KW, stride[0], stride[1], padding[0][0], padding[1][0],
                     dilation[0], dilation[1], per_group, out_per_group, int(gb is not None)]
            info, info_n = _info(words)
            pipe = rt.kernel("conv", name, INFO=info_n, WG=WG)
            bbuf = _whole(gb) if gb is not None else (_dummy(rt).buf, 0, 16)
            _run_1d(rt, pipe, [(st.buf, 0, n * 4), _whole(gx),
                               _whole(gw), bbuf], info, n)
        return _finish(rt, res, out)
    return kernel


# A convolution with groups = 1 is a matmul of the (O, C*KH*KW) weight with the input's columns
# (the input itself for a 1x1 stride-1 unpadded kernel, else unfolded by ``im2col.wgsl``): the
# tuned matmul kernels then do the work instead of one thread per output looping over C*KH*KW
# scattered reads (PP-OCR's recogniser is 92% 1x1 convolutions, its detector 84% 1x1 and 3x3).
# The columns are a temporary of C*KH*KW*OH*OW floats per image: over this many bytes the direct
# kernel runs instead.
IM2COL_MAX_BYTES = 64 << 20
# Fewer output channels than this leave the matmul's 64-row tiles mostly empty: the direct kernel
# was faster there (lavapipe: a 16-channel transposed conv 676 ms direct, 866 ms as a matmul;
# conv2d 16 -> 16 channels 3x3 at 64x28x28: 208 ms direct, 353 as a matmul), except for a stride-1
# transposed conv (a conv2d's input gradient) summing at least MATMUL_MIN_DEPTH products per
# output, whose direct kernel tests every tap's divisibility (lavapipe: the MNIST CNN's conv2
# input gradient, 32 -> 16 channels 3x3 at 64x14x14: 310-616 ms direct, 95-184 ms as a matmul;
# 16 -> 16 at 4x64x64: 416 vs 104 ms).
MATMUL_MIN_CHANNELS = 32
MATMUL_MIN_DEPTH = 128


def _as_matmul(rt, N, rows, cols) -> bool:
    return N * rows * cols * 4 <= min(IM2COL_MAX_BYTES, rt.max_binding)


def _conv_matmul(rt, gx, gw, gb, out_shape, stride, padding, dilation) -> GBuf:
    from .linalg import MatmulPlan

    N, C, H, W = gx.shape
    O, KH, KW = gw.shape[0], gw.shape[2], gw.shape[3]
    OH, OW = out_shape[2:]
    R, P = C * KH * KW, OH * OW
    if (KH, KW, OH, OW) == (1, 1, H, W) and tuple(stride) == (1, 1) and padding[0][0] == padding[1][0] == 0:
        cols = GBuf(rt, (N, R, P), _dt.float32, storage=gx.storage, offset=gx.offset)
    else:
        cols, st, n = _new(rt, (N, R, P), _dt.float32)
        _im2col(rt, st, gx, gx.strides, (N, C, H, W), (KH, KW), (OH, OW), stride, padding, dilation)
    wmat = GBuf(rt, (O, R), _dt.float32, storage=gw.storage, offset=gw.offset)
    meta = Meta((N, O, P), _dt.float32)
    g = fusion.lazy_matmul(rt, MatmulPlan(rt, wmat, cols, meta), _dt.float32)
    if gb is not None:     # the bias add becomes the matmul's epilogue
        bias = GBuf(rt, (1, O, 1), _dt.float32, storage=gb.storage, offset=gb.offset, strides=(0, 1, 0))
        g = fusion.record(rt, "add", meta, [g, bias])
    g = realize(g)
    return GBuf(rt, tuple(out_shape), _dt.float32, storage=g.storage, offset=g.offset)


def _im2col(rt, st, gx: GBuf, xstrides, xshape, kernel, oshape, stride, padding, dilation) -> None:
    """Unfold input view ``gx`` of shape ``xshape`` (N, C, H, W), read through ``xstrides``, into
    ``st`` as (N, C*KH*KW, OH*OW) columns (``im2col.wgsl``)."""
    N, C, H, W = xshape
    KH, KW = kernel
    OH, OW = oshape
    R, P = C * KH * KW, OH * OW
    n = N * R * P
    info, info_n = _info([n, R, P, OW, C, H, W, KH, KW, stride[0], stride[1], padding[0][0],
                          padding[1][0], dilation[0], dilation[1], gx.offset] + list(xstrides))
    _run_1d(rt, rt.kernel("im2col", INFO=info_n, WG=WG), [(st.buf, 0, n * 4), _whole(gx)], info, n)


def _weight_grad_shaped(rt, xshape, wshape, oshape) -> bool:
    """A convolution whose kernel plane is much larger than its output plane: a weight gradient
    (conv2d of the input with the output gradient, both with their first two axes swapped), where
    the usual forms are latency-bound: the direct kernel loops over C*KH*KW (50,176 for the MNIST
    CNN's first layer: 144 threads, one workgroup), the matmul of im2col's columns has N*O*OH*OW
    outputs of that depth (16 workgroups for its second layer)."""
    (N, C, H, W), (O, _, KH, KW), (OH, OW) = xshape, wshape, oshape[2:]
    cols = C * N * OH * OW * KH * KW * 4
    return KH * KW >= 4 * OH * OW and C >= 2 and cols <= min(IM2COL_MAX_BYTES, rt.max_binding)


def _conv_over_channels(rt, gx: GBuf, gw: GBuf, out_shape, stride, padding, dilation) -> GBuf:
    """conv2d (groups 1, no bias) as a matmul per input channel, summed: with the roles of the
    input's first two axes swapped, x (N, C, H, W) is C images of N channels, whose im2col columns
    (C, N*OH*OW, KH*KW) times the weight's planes (C, O, KH*KW), one product per c, give partial
    outputs (C, O, N*OH*OW) of depth KH*KW; one reduction over c adds them up. For a weight
    gradient this is the batch-times-plane depth split over the batch, as cuDNN's and PyTorch's
    do: C*O*N*OH*OW/tile workgroups instead of N*O*OH*OW/tile. Views are read in place (the
    transposed input and output gradient are not copied)."""
    from .linalg import MatmulPlan
    from .ops import reduce_all

    N, C, H, W = gx.shape
    O, KH, KW = gw.shape[0], gw.shape[2], gw.shape[3]
    OH, OW = out_shape[2:]
    R, P = N * OH * OW, KH * KW
    cols, st, _ = _new(rt, (C, R, P), _dt.float32)
    # x seen as C images of N channels; the (OH, OW) kernel sweeps a (KH, KW) plane, with the
    # stride and dilation exchanged
    xs = gx.strides
    _im2col(rt, st, gx, (xs[1], xs[0], xs[2], xs[3]), (C, N, H, W), (OH, OW), (KH, KW), dilation, padding, stride)
    a = GBuf(rt, (C, O, P), _dt.float32, storage=gw.storage, offset=gw.offset,
             strides=(gw.strides[1], gw.strides[0], gw.strides[3]))
    b = GBuf(rt, (C, P, R), _dt.float32, storage=st, offset=0, strides=(R * P, 1, P))
    part = realize(fusion.lazy_matmul(rt, MatmulPlan(rt, a, b, Meta((C, O, R), _dt.float32)), _dt.float32))
    ps = part.strides
    view = GBuf(rt, (C, N, O, OH * OW), _dt.float32, storage=part.storage, offset=part.offset,
                strides=(ps[0], OH * OW * ps[2], ps[1], ps[2]))
    return reduce_all(rt, Meta(tuple(out_shape), _dt.float32), view, 0, (0,))


# ---- pooling ---------------------------------------------------------------------------------

def _pool(rt, entry):
    def kernel(out, x, *, kernel_size, stride, padding, ceil_mode, dilation=(1, 1), count_include_pad=True):
        g = x._buf
        if entry == "avg_pool" and wgsl_type(g.dtype) != "f32":
            g = as_f32(rt, g)
        g = dense(g)
        res, st, n = _new(rt, out.shape, _dt.float32 if entry == "avg_pool" else g.dtype)
        if n:
            N, C, H, W = g.shape
            OH, OW = out.shape[2:]
            words = [n, C, OH, OW, H, W, kernel_size[0], kernel_size[1], stride[0], stride[1],
                     padding[0][0], padding[1][0], padding[0][1], padding[1][1], dilation[0], dilation[1],
                     int(count_include_pad)]
            info, info_n = _info(words)
            pipe = rt.kernel("pool2d", entry, T=wgsl_type(g.dtype), INFO=info_n, WG=WG)
            _run_1d(rt, pipe, [(st.buf, 0, n * 4), _whole(g)], info, n)
        if entry == "max_pool":
            res.dtype = _dt.float32 if out.dtype is _dt.float16 else out.dtype
        return _finish(rt, res, out)
    return kernel


def _max_pool_backward(rt):
    """max_pool2d's gradient as one kernel (``pool2d_grad.wgsl``: each input element gathers
    from the windows it wins) instead of the composite's taps (a training step's pooling
    backward was ~13 dispatches: pads, slices, compares and a recomputed pooling)."""
    def kernel(out, g, x, *, kernel_size, stride, padding, dilation, ceil_mode):
        if wgsl_type(x.dtype) != "f32" or wgsl_type(g.dtype) != "f32":
            return OPS["max_pool2d_backward"].decompose(g, x, kernel_size=kernel_size, stride=stride, padding=padding,
                                                        dilation=dilation, ceil_mode=ceil_mode)._buf
        gx, gg = as_f32(rt, x._buf), as_f32(rt, g._buf)
        res, st, n = _new(rt, out.shape, _dt.float32)
        if n:
            N, C, H, W = gx.shape
            OH, OW = gg.shape[2:]
            words = [n, H, W, OH, OW, kernel_size[0], kernel_size[1], stride[0], stride[1],
                     padding[0][0], padding[1][0], dilation[0], dilation[1]]
            info, info_n = _info(words)
            pipe = rt.kernel("pool2d_grad", INFO=info_n, WG=WG)
            _run_1d(rt, pipe, [(st.buf, 0, n * 4), _whole(gx), _whole(gg)], info, n)
        return _finish(rt, res, out)
    return kernel


def _float32(*ts) -> bool:
    """Whether every tensor is float32 (the row and channel kernels below; float16, which the
    GPU holds as f32 but rounds after each op, and other dtypes take the op's composite)."""
    return all(t.dtype is _dt.float32 for t in ts)


# ---- training batch norm ---------------------------------------------------------------------

def _per_channel(g: GBuf, shape) -> GBuf:
    """Per-channel values ``g`` (C,) read as ``shape`` (N, C, ...) (stride 0 but on axis 1): a
    leaf of the elementwise expressions below, which then need no (C, 1, 1) copy."""
    g = realize(g)
    st = [0] * len(shape)
    st[1] = g.strides[0] if g.strides else 0
    return GBuf(g.rt, tuple(shape), g.dtype, storage=g.storage, offset=g.offset, strides=st)


def _bn_ops(rt, shape):
    """Record elementwise op ``name`` at ``shape`` (float32) on GBufs / Python numbers."""
    meta = Meta(tuple(shape), _dt.float32)

    def op(name, *args):
        ins = [a if isinstance(a, GBuf) else fusion.const_buf(rt, (), float(a), _dt.float32) for a in args]
        return fusion.record(rt, name, meta, ins)
    return op


def _channel_sum(rt, g: GBuf, C: int, divisor: float = 1.0) -> GBuf:
    """Per-channel sums (over every axis but 1) of ``g``, divided by ``divisor`` (a mean)."""
    from .ops import reduce_all

    return reduce_all(rt, Meta((C,), _dt.float32), g, 0, (0,) + tuple(range(2, len(g.shape))), divisor=divisor)


def _bn_train(rt):
    """batch_norm_train (y, batch mean, biased batch variance) as two reductions of the channels
    (the sum, then the squared deviations computed inside the second: each in parts, ``reduce_all``)
    and y as an elementwise expression that reads the statistics per channel in place: no
    (C, 1, 1) reshapes realised, no second mean (the composite's var recomputes it)."""
    def kernel(outs, x, weight, bias, *, eps):
        if not _float32(x, weight, bias) or x.ndim < 2:
            return tuple(t._buf for t in OPS["batch_norm_train"].decompose(x, weight, bias, eps=eps))
        gx = realize(x._buf)
        shape, C = gx.shape, gx.shape[1]
        n = prod(shape) // C if C else 1
        op = _bn_ops(rt, shape)
        mean = _channel_sum(rt, gx, C, divisor=n)
        d = op("subtract", gx, _per_channel(mean, shape))
        var = _channel_sum(rt, op("multiply", d, d), C, divisor=n)
        rstd = op("rsqrt", op("add", _per_channel(var, shape), eps))
        scale = op("multiply", _per_channel(as_f32(rt, weight._buf), shape), rstd)
        y = op("add", op("multiply", op("subtract", gx, _per_channel(mean, shape)), scale),
               _per_channel(as_f32(rt, bias._buf), shape))
        return _finish(rt, y, outs[0]), _finish(rt, mean, outs[1]), _finish(rt, var, outs[2])
    return kernel


def _bn_train_backward(rt):
    """batch_norm_train_backward (dx, dweight, dbias): sum(dy) and sum(dy * xhat) as two channel
    reductions (xhat computed inside), dx = (dy - sum(dy)/n - xhat * sum(dy * xhat)/n) * w * rstd
    as one elementwise expression reading the per-channel values in place."""
    def kernel(outs, g, x, mean, var, weight, *, eps):
        if not _float32(g, x, mean, var, weight) or x.ndim < 2:
            return tuple(t._buf for t in OPS["batch_norm_train_backward"].decompose(g, x, mean, var, weight, eps=eps))
        gx = realize(x._buf)
        gy = realize(g._buf)     # (read three times: its own expression would pass MAX_NODES)
        shape, C = gx.shape, gx.shape[1]
        n = prod(shape) // C if C else 1
        op = _bn_ops(rt, shape)
        mean_b, var_b = _per_channel(mean._buf, shape), _per_channel(var._buf, shape)

        def xhat():
            return op("multiply", op("subtract", gx, mean_b), op("rsqrt", op("add", var_b, eps)))
        gsum = _channel_sum(rt, gy, C)
        gxh = _channel_sum(rt, op("multiply", gy, xhat()), C)
        inner = op("subtract", op("subtract", gy, op("divide", _per_channel(gsum, shape), n)),
                   op("multiply", xhat(), op("divide", _per_channel(gxh, shape), n)))
        scale = op("multiply", _per_channel(as_f32(rt, weight._buf), shape), op("rsqrt", op("add", var_b, eps)))
        dx = op("multiply", inner, scale)
        return _finish(rt, dx, outs[0]), _finish(rt, gxh, outs[1]), _finish(rt, gsum, outs[2])
    return kernel


# ---- cumsum, sort, pad -----------------------------------------------------------------------

def _lines(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def _cumsum(rt):
    def kernel(out, x, *, axis, exclusive, reverse):
        g = contiguous(x._buf)
        acc = wgsl_type(out.dtype)
        res, st, n = _new(rt, out.shape, _dt.float32 if acc == "f32" else out.dtype)
        if n:
            outer, m, inner = _lines(g.shape or (1,), axis if g.shape else 0)
            lines = outer * inner
            info, info_n = _info([lines, m, inner, int(exclusive), int(reverse), g.offset])
            pipe = rt.kernel("cumsum", T=wgsl_type(g.dtype), A=acc, FLOAT=str(acc == "f32").lower(),
                             INFO=info_n, WG=WG)
            _run_1d(rt, pipe, [(st.buf, 0, n * 4), _whole(g)], info, lines)
        return _finish(rt, res, out)
    return kernel


def _sort(rt):
    def kernel(outs, x, *, axis, descending, stable=True):
        g = dense(x._buf)
        t = wgsl_type(g.dtype)
        vals, sv, n = _new(rt, outs[0].shape, _dt.float32 if g.dtype is _dt.float16 else g.dtype)
        idx, si, _ = _new(rt, outs[1].shape, _dt.int64)
        if n:
            shape = g.shape or (1,)
            ax = axis if g.shape else 0
            outer, m, inner = _lines(shape, ax)
            info, info_n = _info([n, m, inner, int(descending)])
            pipe = rt.kernel("sort", T=t, FLOAT=str(t == "f32").lower(), INFO=info_n, WG=WG)
            _run_1d(rt, pipe, [(sv.buf, 0, n * 4), (si.buf, 0, n * 4),
                               _whole(g)], info, n)
        return _finish(rt, vals, outs[0]), idx
    return kernel


def _pad(rt):
    def kernel(out, x, *, pad_width, mode, value):
        g = x._buf
        if g.expr is not None and g.expr.kind != "const" or fusion.is_half(g):
            g = realize(g)      # (a 4-byte buffer: the pad kernel reads 4-byte elements)
        if g.expr is not None:  # a constant: padding does not change it unless the mode is constant
            g = contiguous(g)
        # crop negative widths first: a view
        off = g.offset
        sizes = []
        for (b, a), n, s in zip(pad_width, g.shape, g.strides):
            lo = max(-b, 0)
            off += lo * s
            sizes.append(n - lo - max(-a, 0))
        res, st, n = _new(rt, out.shape, out.dtype)
        if n:
            from .ops import value_bits

            rank = max(len(out.shape), 1)
            shape = list(out.shape) or [1]
            strides = list(g.strides) or [0]
            before = [max(b, 0) for b, _ in pad_width] or [0]
            sizes = sizes or [1]
            mode_code = {"constant": 0, "edge": 1, "reflect": 2, "wrap": 3}[mode]
            words = [n, mode_code, value_bits(value, out.dtype) if mode == "constant" else 0, off, 0, 0, 0, 0]
            words += shape + strides + before + sizes
            info, info_n = _info(words)
            pipe = rt.kernel("pad", T=wgsl_type(out.dtype), RANK=rank, INFO=info_n, WG=WG)
            _run_1d(rt, pipe, [(st.buf, 0, n * 4), _whole(g)], info, n)
        if out.dtype is _dt.float16 and mode == "constant":
            return fusion.record(rt, "_cast", out, [GBuf(rt, out.shape, _dt.float32, storage=st)])
        return res
    return kernel


# ---- softmax, layer_norm, attention ------------------------------------------------------------

def _softmax(rt, entry):
    def kernel(out, x, *, axis):
        if x.ndim and axis % x.ndim == x.ndim - 1:
            res = softmax_rows(rt, x._buf, log=entry == "log_softmax")
            if res is not None:
                return _finish(rt, res, out)
        g = as_f32(rt, x._buf)
        res, st, n = _new(rt, out.shape, _dt.float32)
        if n:
            shape = g.shape or (1,)
            outer, m, inner = _lines(shape, axis % len(shape))
            lines = outer * inner
            wg = 64 if m <= 256 else 256
            info, info_n = _info([lines, m, inner, g.offset])
            pipe = rt.kernel("softmax", entry, INFO=info_n, WG=wg)
            _run_rows(rt, pipe, [(st.buf, 0, n * 4), _whole(g)], info, lines)
        return _finish(rt, res, out)
    return kernel


# EMBER_WEBGPU_SOFTMAX_ROWS=0 runs every softmax through softmax.wgsl (a workgroup per line, the
# line read three times) instead of softmax_rows.wgsl (A/B). On an H100 (2026-12-08) BERT's
# attention at 32x128 (its composite: max, exp and sum, divide over 49,152 rows of 128) spent
# ~370 us a layer in its softmax's three reduce and elementwise passes.
SOFTMAX_ROWS = env_on("EMBER_WEBGPU_SOFTMAX_ROWS")


def softmax_rows_fit(D: int) -> bool:
    """Whether softmax_rows takes rows of ``D`` elements (``rows_used`` with SOFTMAX_ROWS)."""
    return rows_used(D, SOFTMAX_ROWS) is not None


def softmax_rows(rt, g: GBuf, *, log: bool = False, dead_zero: bool = False) -> GBuf | None:
    """softmax (``log``: log_softmax) of ``g`` along its last axis in one dispatch of
    ``softmax_rows.wgsl`` (each row read once into registers), as a new f32 buffer; a contiguous
    f32 view is read in place, at its offset. ``dead_zero``: rows whose every entry is -inf give
    zeros (attention's fully masked rows) instead of NaN. None where ``softmax_rows_fit`` says no."""
    D = g.shape[-1] if g.shape else 0
    shape = rows_used(D, SOFTMAX_ROWS)
    if shape is None:
        return None
    g = f32_view(rt, g)
    if not g.is_contiguous():
        g = dense(g)
    vec = shape[0]
    res, st, n = _new(rt, g.shape, _dt.float32)
    if n:
        rows = n // D
        params, xoff = _rows_params(rt, shape, g)
        params.update(
            HMAX="return max_f32(max_f32(v.x, v.y), max_f32(v.z, v.w));" if vec else "return v;",
            UEXP=("return vec4<f32>(exp_f32(v.x), exp_f32(v.y), exp_f32(v.z), exp_f32(v.w));" if vec
                  else "return exp_f32(v);"))
        info, info_n = _info([rows, D // 4 if vec else D, int(log) | 2 * int(dead_zero), xoff])
        _run_row_kernel(rt, rt.kernel("softmax_rows", INFO=info_n, **params), shape,
                        [(st.buf, 0, n * 4), _whole(g)], info, rows)
    return res


def _softmax_backward(rt):
    """softmax_backward (y * (g - sum(g * y)) along an axis) as one row kernel
    (``softmax_grad.wgsl``) instead of three dispatches (g * y realised, its row sums, dx)."""
    def kernel(out, g, y, *, axis):
        if not ROW_GRADS or not _float32(g, y):
            return OPS["softmax_backward"].decompose(g, y, axis=axis)._buf
        gg, gy = as_f32(rt, g._buf), as_f32(rt, y._buf)
        res, st, n = _new(rt, out.shape, _dt.float32)
        if n:
            outer, m, inner = _lines(out.shape, axis % len(out.shape))
            lines = outer * inner
            info, info_n = _info([lines, m, inner, gg.offset, gy.offset])
            pipe = rt.kernel("softmax_grad", INFO=info_n, WG=64 if m <= 256 else 256)
            _run_rows(rt, pipe, [(st.buf, 0, n * 4), _whole(gg), _whole(gy)], info, lines)
        return _finish(rt, res, out)
    return kernel


# EMBER_WEBGPU_LN_ROWS=0 runs every layer_norm through layer_norm.wgsl (a workgroup per row, the
# row read from global memory three times) instead of layer_norm_rows.wgsl (A/B)
LN_ROWS = env_on("EMBER_WEBGPU_LN_ROWS")
# layer_norm_rows takes rows of up to LN_ROWS_LANES lanes (D <= 1024 in vec4s): on an H100
# (2026-12-07, tests/bench/bench_layer_norm_gpu.py) it read 4096x384 in 8.9 us against 22.1 for
# layer_norm.wgsl, 512x384 7.1 / 7.9, but 4096x4096 (128 lanes a row) in 112.5 against 87.2
LN_ROWS_LANES = 32
# layer_norm_rows: units (vec4s where D % 4 == 0, else elements) one thread keeps in registers
# at most; rows over LN_LANES_MAX threads' worth take layer_norm.wgsl
LN_UNITS_VEC4 = 8
LN_UNITS_F32 = 16
LN_LANES_MAX = 256


def ln_rows_shape(D: int) -> tuple | None:
    """``(vec4, lanes, units, wg)`` of ``layer_norm_rows.wgsl`` for rows of ``D`` elements, or
    None where a row is longer than LN_LANES_MAX threads hold. Lanes per row: the fewest (a power
    of two) that hold the row in at most LN_UNITS_* units each, but no fewer than min(32, the
    row's units) (a subgroup on NVIDIA: a 384-wide row is 32 lanes of 3 vec4s); a workgroup of
    max(64, lanes) threads, so short rows share one."""
    vec = D % 4 == 0
    n = D // 4 if vec else D
    cap = LN_UNITS_VEC4 if vec else LN_UNITS_F32
    lanes = max(1 << (-(-n // cap) - 1).bit_length(), min(32, 1 << (n - 1).bit_length()))
    if lanes > LN_LANES_MAX:
        return None
    return vec, lanes, -(-n // lanes), max(64, lanes)


def rows_used(D: int, on: bool) -> tuple | None:
    """``ln_rows_shape(D)`` where a ``*_rows.wgsl`` kernel takes rows of ``D`` elements (switched
    ``on``, at most LN_ROWS_LANES lanes a row), else None."""
    shape = ln_rows_shape(D) if on and D else None
    return shape if shape is not None and shape[1] <= LN_ROWS_LANES else None


def ln_rows_used(D: int) -> tuple | None:
    """``rows_used`` for layer_norm (LN_ROWS): layer_norm_rows.wgsl, or None (layer_norm.wgsl)."""
    return rows_used(D, LN_ROWS)


def _rows_params(rt, shape, g: GBuf):
    """Template values of a ``*_rows.wgsl`` kernel (``ln_rows_shape``'s ``shape``) reading the
    contiguous f32 view ``g``, and x's offset word (in units: vec4 loads where the offset allows,
    else four scalar loads a unit)."""
    from .quant import _sg_params

    vec, lanes, units, wg = shape
    xvec = vec and g.offset % 4 == 0
    xget = ("let e = u(3u) + 4u * i; return vec4<f32>(x[e], x[e + 1u], x[e + 2u], x[e + 3u]);"
            if vec and not xvec else "return x[u(3u) + i];")
    sg = _sg_params(rt)
    params = dict(WG=wg, LANES=lanes, NV=units, T="vec4<f32>" if vec else "f32",
                  XT="vec4<f32>" if xvec else "f32", XGET=xget,
                  HSUM="return dot(v, vec4<f32>(1.0));" if vec else "return v;",
                  ENABLE="enable subgroups;" if sg["SG"] == "true" else "",
                  SG_SUM=sg["SG_SUM"], SG_ARGS=sg["SG_ARGS"], SGS=sg["SGS"])
    return params, g.offset // 4 if xvec else g.offset


def _run_row_kernel(rt, pipe, shape, bufs, info, rows) -> None:
    """Dispatch a ``*_rows.wgsl`` kernel of ``shape`` over ``rows`` rows (WG / LANES a workgroup)."""
    _, lanes, _, wg = shape
    rt.dispatch(pipe, bufs, info, grid_1d(-(-rows // (wg // lanes)), rt.max_groups))


def _layer_norm(rt):
    """layer_norm as one dispatch: ``layer_norm_rows.wgsl`` (each row read once into registers,
    rows of up to ~1024 elements several to a workgroup), or ``layer_norm.wgsl`` for rows longer
    than ``ln_rows_shape`` allows (or with EMBER_WEBGPU_LN_ROWS=0)."""
    def kernel(out, x, weight, bias, *, normalized_shape, eps):
        from .runtime import f32_bits

        D = prod(normalized_shape)
        shape = ln_rows_used(D)
        g = f32_view(rt, x._buf)        # a contiguous view is read in place, at its offset
        if not g.is_contiguous():
            g = dense(g)
        gw = as_f32(rt, weight._buf)
        gb = as_f32(rt, bias._buf)
        res, st, n = _new(rt, out.shape, _dt.float32)
        if n and D:
            rows = n // D
            if shape is None:
                wg = 64 if D <= 256 else 256
                info, info_n = _info([rows, D, f32_bits(eps), g.offset])
                pipe = rt.kernel("layer_norm", INFO=info_n, WG=wg)
                _run_rows(rt, pipe, [(st.buf, 0, n * 4), _whole(g), _whole(gw),
                                     _whole(gb)], info, rows)
            else:
                vec = shape[0]
                params, xoff = _rows_params(rt, shape, g)
                info, info_n = _info([rows, D // 4 if vec else D, f32_bits(eps), xoff, D])
                _run_row_kernel(rt, rt.kernel("layer_norm_rows", INFO=info_n, **params), shape,
                                [(st.buf, 0, n * 4), _whole(g), _whole(gw), _whole(gb)], info, rows)
        return _finish(rt, res, out)
    return kernel


# EMBER_WEBGPU_ROW_GRADS=0 runs layer_norm_backward and softmax_backward as their composites (A/B)
ROW_GRADS = env_on("EMBER_WEBGPU_ROW_GRADS")

# layer_norm_backward: rows per workgroup are chosen for about LN_GROUPS workgroups (each writes
# 2 * D partial column sums), at most LN_RMAX (the per-row statistics kept in shared memory).
LN_GROUPS = 256
LN_RMAX = 32


def _layer_norm_backward(rt):
    """layer_norm_backward (dx, dweight, dbias) as one row kernel (``layer_norm_grad.wgsl``: a
    block of rows per workgroup, each row's statistics recomputed, dx written, the block's column
    sums of g * xhat and g as partials) and one column reduction of the partials: 2-3 dispatches
    instead of the composite's ~10 (two means of x, two of the gradient, a realised rstd, two
    column sums in parts, dx)."""
    def kernel(outs, g, x, weight, *, normalized_shape, eps):
        D = prod(normalized_shape)
        rows = prod(x.shape) // D if D else 0
        if not ROW_GRADS or not _float32(g, x, weight) \
                or not rows:
            return tuple(t._buf for t in OPS["layer_norm_backward"].decompose(
                g, x, weight, normalized_shape=normalized_shape, eps=eps))
        from .ops import reduce_all
        from .runtime import f32_bits

        gx, gg, gw = as_f32(rt, x._buf), as_f32(rt, g._buf), as_f32(rt, weight._buf)
        R = min(LN_RMAX, -(-rows // LN_GROUPS))
        blocks = -(-rows // R)
        res, st, n = _new(rt, tuple(x.shape), _dt.float32)
        part = rt.alloc(blocks * 2 * D * 4)
        wg = 64 if D <= 256 else 128 if D <= 768 else 256
        info, info_n = _info([rows, D, f32_bits(eps), R, gx.offset, gg.offset, gw.offset, blocks])
        pipe = rt.kernel("layer_norm_grad", INFO=info_n, WG=wg, RMAX=LN_RMAX)
        _run_rows(rt, pipe, [(st.buf, 0, n * 4), (part.buf, 0, blocks * 2 * D * 4), _whole(gx), _whole(gg),
                             _whole(gw)], info, blocks)
        sums = reduce_all(rt, Meta((2, D), _dt.float32),
                          GBuf(rt, (blocks, 2, D), _dt.float32, storage=part), 0, (0,))
        ws = tuple(weight.shape)
        dw = GBuf(rt, ws, _dt.float32, storage=sums.storage, offset=sums.offset)
        db = GBuf(rt, ws, _dt.float32, storage=sums.storage, offset=sums.offset + D)
        return _finish(rt, res, outs[0]), _finish(rt, dw, outs[1]), _finish(rt, db, outs[2])
    return kernel


SMAX = 2048

# The tiled attention kernel (attention_tiled.wgsl: a block of query rows per workgroup, k and v
# read once per block) for L >= ATTN_TILED_MIN_L query rows and E, Ev <= ATTN_TILED_EMAX, on CPU
# adapters (lavapipe (32, 12, 128, 32): 273 ms against 1,145 per row and 1,007 composite);
# EMBER_WEBGPU_ATTN_TILED=0 keeps the per-row kernel (attention.wgsl) everywhere (A/B), =1
# takes the tiled kernel on GPUs too. On a GPU (H100, 2026-12-07, tests/bench/bench_attn_encoder.py,
# GPU us) the tiled kernel lost to the composite (scores product, softmax, product: 3 dispatches)
# at (32, 12, 128, 32) 1,127 vs 309 and (8, 12, 64, 32) 60 vs 36, and to the per-row kernel at
# (1, 12, 16, 32) 52 vs 18.5 (composite 38.5): GPUs take the per-row kernel below
# ATTN_GPU_COMPOSITE_FROM scores (batch x L x S), the composite from there.
ATTN_GPU_COMPOSITE_FROM = 32768
ATTN_TILED_MIN_L = 8
ATTN_TILED_EMAX = 128
# Blocks of 32 query rows when that still gives at least this many workgroups, else blocks of
# 16 (twice the k / v traffic, twice the workgroups: small batches keep the GPU's cores busy).
# A guess (about 8 workgroups of 64 threads per core of a 132-core H100), not yet measured;
# EMBER_WEBGPU_ATTN_TILE=BQxBK (16 or 32 each) forces a tile for timing (the per-row kernel runs
# where that tile does not fit the device's shared memory).
ATTN_BQ32_MIN_GROUPS = 1024


def _attn_shared_bytes(BQ, BK, E, Ev):
    """Shared memory of attention_tiled.wgsl: q, k rows of E (+ a vec4 of padding), v rows of Ev
    rounded up to 32, probability rows of BK (+ 4), 8 partials a row."""
    qw, vw = -(-E // 4) + 1, -(-Ev // 32) * 8
    return 16 * (BQ * qw + BK * qw + BK * vw + BQ * (BK // 4 + 1) + BQ * 2)


def attn_route(rt, shape, E, S):
    """How webgpu runs an attention with output ``shape`` (..., L, Ev), E features and S keys:
    ``(BQ, BK)`` (the tiled kernel), ``"rows"`` (attention.wgsl) or ``"composite"`` (the
    registry's decomposition: two products and a softmax)."""
    import os

    forced = os.environ.get("EMBER_WEBGPU_ATTN_TILED", "").strip().lower()
    if S == 0 or len(shape) < 2:
        return "composite"
    gpu = not _cpu_adapter(rt)
    if gpu and forced not in ("1", "on", "true", "yes"):
        if prod(shape[:-1]) * S >= ATTN_GPU_COMPOSITE_FROM or S > SMAX:
            return "composite"
        return "rows"
    tile = attn_tile(rt, shape, E, S)
    if tile is not None:
        return tile
    return "rows" if S <= SMAX else "composite"


def _cpu_adapter(rt) -> bool:
    return cpu_adapter(getattr(rt.driver, "info", None) or {})


def attn_tile(rt, shape, E, S):
    """(BQ, BK) of the tiled attention kernel for an output of ``shape`` (..., L, Ev) with
    features E and S keys, or None where the per-row kernel runs (switched off, few query rows,
    wide heads, or no tile fits the device's shared memory)."""
    import os

    if len(shape) < 2 or not env_on("EMBER_WEBGPU_ATTN_TILED"):
        return None
    L, Ev = shape[-2:]
    if L < ATTN_TILED_MIN_L or not 0 < E <= ATTN_TILED_EMAX or not 0 < Ev <= ATTN_TILED_EMAX or S == 0:
        return None
    limit = int(rt.limits.get("max_compute_workgroup_storage_size", 16384))
    forced = os.environ.get("EMBER_WEBGPU_ATTN_TILE", "").lower()
    if forced:
        try:
            BQ, BK = (int(x) for x in forced.split("x"))
        except ValueError:
            raise ValueError(f"EMBER_WEBGPU_ATTN_TILE={forced!r}: expected BQxBK, e.g. 32x32") from None
        if BQ not in (16, 32) or BK not in (16, 32):
            raise ValueError(f"EMBER_WEBGPU_ATTN_TILE={forced!r}: BQ and BK are 16 or 32")
        cands = [(BQ, BK)]
    else:
        big = prod(shape[:-2]) * -(-L // 32) >= ATTN_BQ32_MIN_GROUPS
        cands = ([(32, 32), (32, 16)] if big else []) + [(16, 32), (16, 16)]
    for BQ, BK in cands:
        if _attn_shared_bytes(BQ, BK, E, Ev) <= limit:
            return BQ, BK
    return None


def _operand(g: GBuf, batch):
    """offset, row stride, column stride and batch strides (0 where broadcast) of a view."""
    g = realize(g)
    if any(s < 0 for s in g.strides):
        g = contiguous(g)
    sh, st = g.shape, g.strides
    pad = len(batch) + 2 - len(sh)
    bst = []
    for d in range(len(batch)):
        k = d - pad
        bst.append(0 if k < 0 or sh[k] == 1 else st[k])
    row = st[-2] if len(sh) >= 2 and sh[-2] != 1 else 0
    col = st[-1] if sh and sh[-1] != 1 else 0
    return g, [g.offset, row, col, 0], bst


def _attention_composite(rt, q, k, v, mask, is_causal, scale):
    """The composite attention of float32 operands with its softmax as one ``softmax_rows``
    dispatch (fully masked rows give zeros, as the registry's composite does) between the two
    products, instead of the composite's max, exp and sum, and divide passes; None where the
    rows do not fit it (the registry's decomposition runs)."""
    from ..ops.nnops import _ops, _sdpa_masked_scores
    from ..tensor import Tensor

    f32 = _dt.float32
    if any(t.dtype is not f32 for t in (q, k, v)) or mask is not None and mask.dtype not in (f32, _dt.bool_):
        return None
    if not softmax_rows_fit(k.shape[-2]):
        return None
    s = _sdpa_masked_scores(q, k, mask, is_causal, scale)
    p = softmax_rows(rt, s._buf, dead_zero=True)
    if p is None:
        return None
    return _ops().matmul(Tensor._wrap(p, s.shape, f32, s.device), v)._buf


def _attention(rt):
    """scaled_dot_product_attention as ``attn_route`` says: in one dispatch of the tiled kernel
    (``attention_tiled.wgsl``, a block of query rows per workgroup; any S) or the per-row kernel
    (``attention.wgsl``, S <= SMAX), or as the composite. Both kernels take the same info words
    and write the same heads-interleaved output."""
    def kernel(out, q, k, v, mask=None, *, is_causal, scale):
        S = k.shape[-2]
        route = attn_route(rt, out.shape, q.shape[-1], S)
        tile = route if isinstance(route, tuple) else None
        if route == "composite":
            res = _attention_composite(rt, q, k, v, mask, is_causal, scale)
            if res is not None:
                return res
            args = (q, k, v) if mask is None else (q, k, v, mask)
            return OPS["scaled_dot_product_attention"].decompose(*args, is_causal=is_causal, scale=scale)._buf
        from .runtime import f32_bits

        batch = tuple(out.shape[:-2])
        L, Ev = out.shape[-2:]
        E = q.shape[-1]
        gq, wq, bq = _operand(f32_view(rt, q._buf), batch)   # strided views are read in place
        gk, wk, bk = _operand(f32_view(rt, k._buf), batch)
        gv, wv, bv = _operand(f32_view(rt, v._buf), batch)
        if mask is not None:
            gm = mask._buf
            kind = 1 if gm.dtype is _dt.bool_ else 2
            if kind == 2:
                gm = f32_view(rt, gm)
            gm, wm, bm = _operand(gm, batch)
            mbuf = _whole(gm)
        else:
            kind, wm, bm, mbuf = 0, [0, 0, 0, 0], [0] * len(batch), (_dummy(rt).buf, 0, 16)
        res, st, n = _new(rt, out.shape, _dt.float32)
        H = batch[-1] if batch else 1
        # heads-interleaved storage (see attention.wgsl): strides of the logical (..., H, L, Ev)
        outer = contiguous_strides(batch[:-1] + (1,)) if batch else ()
        res.strides = tuple(v * L * H * Ev for v in outer[:-1]) + ((Ev,) if batch else ()) + (H * Ev, 1)
        if n:
            rows = prod(batch) * L
            wq = wq[:3] + [H]   # word 11
            words = [rows, L, S, E, Ev, kind, int(is_causal), f32_bits(scale)] + wq + wk + wv + wm
            words += list(batch) + bq + bk + bv + bm
            info, info_n = _info(words)
            bufs = [(st.buf, 0, n * 4), _whole(gq), _whole(gk), _whole(gv), mbuf]
            if tile is not None:
                (BQ, BK), EQ, NV = tile, -(-E // 4) * 4, -(-Ev // 32)
                pipe = rt.kernel("attention_tiled", RANK=len(batch), INFO=info_n, BQ=BQ, BK=BK, EQ=EQ, NV=NV)
                _run_rows(rt, pipe, bufs, info, prod(batch) * -(-L // BQ))
            else:
                pipe = rt.kernel("attention", RANK=len(batch), INFO=info_n, WG=64)
                _run_rows(rt, pipe, bufs, info, rows)
        return _finish(rt, res, out)
    return kernel


def build_kernels(rt) -> dict:
    return {
        "conv2d": _conv(rt, "conv2d"),
        "conv_transpose2d": _conv(rt, "conv_transpose2d"),
        "max_pool2d": _pool(rt, "max_pool"),
        "max_pool2d_backward": _max_pool_backward(rt),
        "batch_norm_train": _bn_train(rt),
        "batch_norm_train_backward": _bn_train_backward(rt),
        "avg_pool2d": _pool(rt, "avg_pool"),
        "cumsum": _cumsum(rt),
        "sort": _sort(rt),
        "pad": _pad(rt),
        "softmax": _softmax(rt, "softmax"),
        "log_softmax": _softmax(rt, "log_softmax"),
        "softmax_backward": _softmax_backward(rt),
        "layer_norm": _layer_norm(rt),
        "layer_norm_backward": _layer_norm_backward(rt),
        "scaled_dot_product_attention": _attention(rt),
    }
