"""Neural-network ops: activations, softmax, convolution, pooling, normalization, attention,
cumsum, sort/topk and pad.

Primitives (every backend needs a kernel): ``conv2d``, ``conv_transpose2d``, ``max_pool2d``,
``avg_pool2d``, ``cumsum``, ``sort`` (values and indices) and ``pad``. Everything else is a
composite with a decomposition into other ops, which a backend may override with a faster
kernel (the python and numpy backends do for the activations, softmax and the norms).

The public functions normalise their arguments (``stride=2`` -> ``(2, 2)``, ``padding="same"``
-> explicit ``((top, bottom), (left, right))``) before calling the registry, so kernels and
shape rules only ever see one canonical form.

>>> import ember
>>> x = ember.tensor([[-1.0, 0.0, 2.0]])
>>> ember.relu(x).tolist()
[[0.0, 0.0, 2.0]]
>>> [round(v, 4) for v in ember.softmax(x)[0].tolist()]
[0.042, 0.1142, 0.8438]
"""
from __future__ import annotations

import math
import operator

from .. import dtypes as _dt
from ..autograd import keeps_output, sum_to
from ..errors import DTypeError, IndexingError, ShapeError, UnsupportedOp
from ..registry import apply, broadcast_shapes, normalize_axis, op, promote, same_dtype, same_shape, to_float
from ..tensor import Tensor
from . import method

__all__ = ["linear", "relu", "leaky_relu", "sigmoid", "gelu", "silu", "softmax", "log_softmax",
           "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "batch_norm", "batch_norm_train", "layer_norm", "embedding", "scaled_dot_product_attention",
           "cumsum", "sort", "argsort", "topk", "pad"]


def _ops():
    # The other op families (A's modules) through the package namespace, looked up at call time
    # so this module does not depend on which family file defines which function.
    from .. import ops
    return ops


# ---- argument normalisation -----------------------------------------------------------------

def _int(v, what: str, opname: str) -> int:
    if isinstance(v, bool):
        raise ShapeError(f"{opname}: {what} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ShapeError(f"{opname}: {what} must be an int, got {v!r}") from None


def _pair(v, what: str, opname: str, low: int = 1) -> tuple:
    """An int or a pair of ints -> (a, b), each >= ``low``."""
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise ShapeError(f"{opname}: {what} must be an int or a pair of ints, got {v!r}")
        t = (_int(v[0], what, opname), _int(v[1], what, opname))
    else:
        t = (_int(v, what, opname),) * 2
    if min(t) < low:
        raise ShapeError(f"{opname}: {what} must be >= {low}, got {v!r}")
    return t


def _pads2d(padding, opname: str) -> tuple:
    """int | (ph, pw) | ((top, bottom), (left, right)) -> ((top, bottom), (left, right))."""
    if isinstance(padding, (list, tuple)) and len(padding) == 2 and all(isinstance(p, (list, tuple)) for p in padding):
        t = tuple(_pair(p, "padding", opname, low=0) for p in padding)
    else:
        ph, pw = _pair(padding, "padding", opname, low=0)
        t = ((ph, ph), (pw, pw))
    return t


def _same_pads(size: int, k: int, s: int, d: int) -> tuple:
    # "same" (ONNX SAME_UPPER; PyTorch's "same" for stride 1): output ceil(size / stride), the odd
    # padding element goes to the end.
    out = -(-size // s)
    total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
    return (total // 2, total - total // 2)


def _need4d(shape, opname: str, what: str = "input"):
    if len(shape) != 4:
        raise ShapeError(f"{opname}: {what} must be 4-D (N, C, H, W), got shape {tuple(shape)}")


def _float_rule(opname: str):
    def rule(*dts, **_):
        for d in dts:
            if d.kind != "f":
                raise DTypeError(f"{opname}: needs floating-point tensors, got {', '.join(x.name for x in dts)} "
                                 f"(cast with .astype(ember.float32))")
        return promote(*dts)
    return rule


def _batched(fn, x: Tensor, *args, **kw):
    """Run a 4-D op on an unbatched (C, H, W) input too, like PyTorch."""
    if x.ndim == 3:
        ops = _ops()
        y = fn(ops.reshape(x, (1,) + x.shape), *args, **kw)
        return ops.reshape(y, y.shape[1:])
    return fn(x, *args, **kw)


# ---- activations (composites) -----------------------------------------------------------------

def _dec_relu(x):
    return _ops().maximum(x, 0)


def _dec_leaky_relu(x, *, negative_slope):
    o = _ops()
    return o.where(o.less(x, 0), o.multiply(x, negative_slope), x)


def _dec_sigmoid(x):
    o = _ops()
    # exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) = 0 is the right limit.
    return o.divide(1.0, o.add(o.exp(o.negative(x)), 1.0))


def _dec_gelu(x, *, approximate):
    o = _ops()
    if approximate == "tanh":
        inner = o.multiply(o.add(x, o.multiply(o.multiply(o.multiply(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
        return o.multiply(o.multiply(x, 0.5), o.add(o.tanh(inner), 1.0))
    return o.multiply(o.multiply(x, 0.5), o.add(o.erf(o.multiply(x, 1.0 / math.sqrt(2.0))), 1.0))


def _dec_silu(x):
    return _ops().multiply(x, sigmoid(x))


@keeps_output
def _gelu_grad(g, y, x, *, approximate, **_):
    o = _ops()
    if approximate == "tanh":
        k0, k1 = math.sqrt(2.0 / math.pi), 0.044715
        x2 = o.multiply(x, x)
        t = o.tanh(o.multiply(o.multiply(x, o.add(o.multiply(x2, k1), 1.0)), k0))
        inner_d = o.multiply(o.add(o.multiply(x2, 3.0 * k1), 1.0), k0)
        d = o.add(o.multiply(o.add(t, 1.0), 0.5),
                  o.multiply(o.multiply(o.multiply(x, 0.5), o.subtract(1.0, o.multiply(t, t))), inner_d))
        return o.multiply(g, d)
    pdf = o.multiply(o.exp(o.multiply(o.multiply(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    # Phi(x) = y / x from the forward's output instead of a second erf (erf is the slow part on
    # CPUs); near 0, where that division loses digits, Phi(x) = 1/2 + x phi(0) to float precision
    far = o.less(0.001, o.abs(x))
    cdf = o.where(far, o.divide(y, o.where(far, x, 1.0)), o.add(o.multiply(x, 1.0 / math.sqrt(2.0 * math.pi)), 0.5))
    return o.multiply(g, o.add(cdf, o.multiply(x, pdf)))


def _positive(x, dtype):
    # (x > 0) as 0/1 numbers: a multiply by a mask, not a select (CPU selects branch per element)
    return _ops().less(0, x).astype(dtype)


def _silu_grad(g, y, x, **_):
    o = _ops()
    sg = sigmoid(x)
    return o.multiply(g, o.multiply(sg, o.add(o.multiply(x, o.subtract(1.0, sg)), 1.0)))


op("relu_backward", kind="composite", shape=lambda gs, xs, **_: broadcast_shapes(gs, xs, op="relu_backward"),
   dtype=lambda gt, xt, **_: gt, decompose=lambda g, x: _ops().multiply(g, _positive(x, g.dtype)),
   doc="the gradient of relu: g * (x > 0) (inputs: output gradient, input)")
op("relu", kind="composite", shape=same_shape, dtype=same_dtype, decompose=_dec_relu,
   doc="max(x, 0)", grad=lambda g, y, x, **_: apply("relu_backward", g, x))
op("leaky_relu", kind="composite", shape=same_shape, dtype=to_float, decompose=_dec_leaky_relu,
   doc="x where x >= 0, else negative_slope * x",
   grad=lambda g, y, x, *, negative_slope, **_: _ops().multiply(
       g, _ops().add(_ops().multiply(_positive(x, g.dtype), 1.0 - negative_slope), negative_slope)))
op("sigmoid", kind="composite", shape=same_shape, dtype=to_float, decompose=_dec_sigmoid,
   doc="1 / (1 + exp(-x))",
   grad=keeps_output(lambda g, y, x, **_: _ops().multiply(g, _ops().multiply(y, _ops().subtract(1.0, y)))))
op("gelu", kind="composite", shape=same_shape, dtype=to_float, decompose=_dec_gelu,
   doc="x * Phi(x); approximate='tanh' uses the tanh formula", grad=_gelu_grad)
op("silu", kind="composite", shape=same_shape, dtype=to_float, decompose=_dec_silu,
   doc="x * sigmoid(x)", grad=_silu_grad)


@method
def relu(x: Tensor) -> Tensor:
    """Rectified linear unit, ``max(x, 0)`` (keeps the dtype; NaN stays NaN).

    >>> import ember
    >>> ember.relu(ember.tensor([-2, 3])).tolist()
    [0, 3]
    """
    return apply("relu", x)


@method
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x >= 0``, else ``negative_slope * x``.

    >>> import ember
    >>> ember.leaky_relu(ember.tensor([-2.0, 3.0]), 0.5).tolist()
    [-1.0, 3.0]
    """
    return apply("leaky_relu", x, negative_slope=float(negative_slope))


@method
def sigmoid(x: Tensor) -> Tensor:
    """The logistic function ``1 / (1 + exp(-x))``.

    >>> import ember
    >>> ember.sigmoid(ember.tensor([0.0])).tolist()
    [0.5]
    """
    return apply("sigmoid", x)


@method
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit ``x * Phi(x)``; ``approximate="tanh"`` uses
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (both as in PyTorch).

    >>> import ember
    >>> round(ember.gelu(ember.tensor([1.0])).item(), 4)
    0.8413
    """
    if approximate not in ("none", "tanh"):
        raise UnsupportedOp(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply("gelu", x, approximate=approximate)


@method
def silu(x: Tensor) -> Tensor:
    """Sigmoid linear unit (swish), ``x * sigmoid(x)``.

    >>> import ember
    >>> ember.silu(ember.tensor([0.0])).tolist()
    [0.0]
    """
    return apply("silu", x)


# ---- softmax ----------------------------------------------------------------------------------

def _axis_shape(opname):
    def rule(xs, *, axis, **_):
        normalize_axis(axis, len(xs) or 1, opname)
        return tuple(xs)
    return rule


def _axis(x, axis, opname):
    # a 0-d tensor takes axis 0 or -1, as in PyTorch (it is treated as one element)
    return normalize_axis(_int(axis, "axis", opname), x.ndim or 1, opname)


def _dec_softmax(x, *, axis):
    o = _ops()
    if x.size == 0:   # nothing to normalise (and max over an empty axis has no value)
        return o.exp(x)
    axis = axis if x.ndim else None
    e = o.exp(o.subtract(x, o.max(x, axis=axis, keepdims=True)))
    return o.divide(e, o.sum(e, axis=axis, keepdims=True))


def _dec_log_softmax(x, *, axis):
    o = _ops()
    if x.size == 0:
        return o.exp(x)
    axis = axis if x.ndim else None
    z = o.subtract(x, o.max(x, axis=axis, keepdims=True))
    return o.subtract(z, o.log(o.sum(o.exp(z), axis=axis, keepdims=True)))


def _softmax_backward_ops(g, y, *, axis):
    """The gradient of softmax from its output ``y``: y * (g - sum(g * y)) along ``axis`` (the
    decomposition of ``softmax_backward``; webgpu runs it as one row kernel)."""
    o = _ops()
    return o.multiply(y, o.subtract(g, o.sum(o.multiply(g, y), axis=axis, keepdims=True)))


def _softmax_backward_shape(gs, ys, *, axis):
    if tuple(gs) != tuple(ys):
        raise ShapeError(f"softmax_backward: gradient shape {tuple(gs)} must equal the output's {tuple(ys)}")
    if not ys:
        raise ShapeError("softmax_backward: the output must have at least one axis")
    normalize_axis(axis, len(ys), "softmax_backward")
    return tuple(ys)


op("softmax_backward", kind="composite", shape=_softmax_backward_shape,
   dtype=lambda gt, yt, **_: _float_rule("softmax_backward")(gt, yt), decompose=_softmax_backward_ops,
   doc="the gradient of softmax (inputs: dy, the softmax's output y): y * (dy - sum(dy * y, axis))")


@keeps_output
def _softmax_grad(g, y, x, *, axis, **_):
    if x.ndim == 0:
        return _softmax_backward_ops(g, y, axis=None)
    return apply("softmax_backward", g, y, axis=normalize_axis(axis, x.ndim, "softmax"))


@keeps_output
def _log_softmax_grad(g, y, x, *, axis, **_):
    o = _ops()
    axis = axis if x.ndim else None
    return o.subtract(g, o.multiply(o.exp(y), o.sum(g, axis=axis, keepdims=True)))


op("softmax", kind="composite", shape=_axis_shape("softmax"), dtype=to_float, decompose=_dec_softmax,
   doc="exp(x - max) / sum(exp(x - max)) along axis", grad=_softmax_grad)
op("log_softmax", kind="composite", shape=_axis_shape("log_softmax"), dtype=to_float,
   decompose=_dec_log_softmax, doc="x - max - log(sum(exp(x - max))) along axis", grad=_log_softmax_grad)


@method
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax along ``axis``, computed stably (the maximum is subtracted first).

    >>> import ember
    >>> ember.softmax(ember.tensor([1000.0, 1000.0])).tolist()
    [0.5, 0.5]
    """
    return apply("softmax", x, axis=_axis(x, axis, "softmax"))


@method
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``log(softmax(x))`` along ``axis`` without overflow or log(0) for large inputs.

    >>> import ember
    >>> [round(v, 4) for v in ember.log_softmax(ember.tensor([0.0, 0.0])).tolist()]
    [-0.6931, -0.6931]
    """
    return apply("log_softmax", x, axis=_axis(x, axis, "log_softmax"))


# ---- convolution (primitives) -------------------------------------------------------------

def _conv_out(size, k, s, p0, p1, d, opname, axis, xs, ws):
    eff = d * (k - 1) + 1
    if size + p0 + p1 < eff:
        raise ShapeError(f"{opname}: kernel extent {eff} (kernel {k}, dilation {d}) is larger than the padded "
                         f"input {size + p0 + p1} along {axis}; input {tuple(xs)}, weight {tuple(ws)}")
    return (size + p0 + p1 - eff) // s + 1


def _conv2d_shape(xs, ws, bs=None, *, stride, padding, dilation, groups):
    _need4d(xs, "conv2d")
    _need4d(ws, "conv2d", "weight")
    n, c, h, w = xs
    o, cg, kh, kw = ws
    if groups < 1 or c % groups or o % groups:
        raise ShapeError(f"conv2d: groups={groups} must divide both the input channels ({c}) and the output "
                         f"channels ({o}); input {tuple(xs)}, weight {tuple(ws)}")
    if c // groups != cg:
        raise ShapeError(f"conv2d: input has {c} channels but weight expects {cg * groups} (groups={groups}); "
                         f"input {tuple(xs)}, weight {tuple(ws)}")
    if kh < 1 or kw < 1:
        raise ShapeError(f"conv2d: weight {tuple(ws)} has an empty kernel")
    if bs is not None and tuple(bs) != (o,):
        raise ShapeError(f"conv2d: bias must have shape ({o},) for weight {tuple(ws)}, got {tuple(bs)}")
    (pt, pb), (pl, pr) = padding
    oh = _conv_out(h, kh, stride[0], pt, pb, dilation[0], "conv2d", "height", xs, ws)
    ow = _conv_out(w, kw, stride[1], pl, pr, dilation[1], "conv2d", "width", xs, ws)
    return (n, o, oh, ow)


def _conv_transpose2d_shape(xs, ws, bs=None, *, stride, padding, output_padding, dilation, groups):
    name = "conv_transpose2d"
    _need4d(xs, name)
    _need4d(ws, name, "weight")
    n, c, h, w = xs
    ci, og, kh, kw = ws
    if c != ci:
        raise ShapeError(f"{name}: input has {c} channels but weight expects {ci} (weight is (in, out/groups, kh, kw)); "
                         f"input {tuple(xs)}, weight {tuple(ws)}")
    if groups < 1 or c % groups:
        raise ShapeError(f"{name}: groups={groups} must divide the input channels ({c}); weight {tuple(ws)}")
    if kh < 1 or kw < 1:
        raise ShapeError(f"{name}: weight {tuple(ws)} has an empty kernel")
    o = og * groups
    if bs is not None and tuple(bs) != (o,):
        raise ShapeError(f"{name}: bias must have shape ({o},) for weight {tuple(ws)} and groups={groups}, got {tuple(bs)}")
    out = []
    for size, k, s, (p0, p1), op_, d, axis in zip((h, w), (kh, kw), stride, padding, output_padding, dilation,
                                                  ("height", "width")):
        if op_ >= max(s, d):
            raise ShapeError(f"{name}: output_padding {op_} along {axis} must be smaller than the stride ({s}) "
                             f"or the dilation ({d})")
        size_out = (size - 1) * s - p0 - p1 + d * (k - 1) + op_ + 1
        if size_out < 1:
            raise ShapeError(f"{name}: output {axis} would be {size_out} (padding {p0}+{p1} too large); "
                             f"input {tuple(xs)}, weight {tuple(ws)}")
        out.append(size_out)
    return (n, o, out[0], out[1])


def _linear_shape(xs, ws, bs=None):
    if len(ws) != 2:
        raise ShapeError(f"linear: weight must be 2-D (out_features, in_features), got {tuple(ws)}")
    if not xs:
        raise ShapeError(f"linear: input must have at least 1 dimension, got a scalar; weight {tuple(ws)}")
    if xs[-1] != ws[1]:
        raise ShapeError(f"linear: input has {xs[-1]} features (last axis of {tuple(xs)}) but weight "
                         f"{tuple(ws)} expects {ws[1]}")
    if bs is not None and tuple(bs) != (ws[0],):
        raise ShapeError(f"linear: bias must have shape ({ws[0]},) for weight {tuple(ws)}, got {tuple(bs)}")
    return tuple(xs[:-1]) + (ws[0],)


def _linear_decompose(x, weight, bias=None):
    y = x @ weight.matrix_transpose()
    return y if bias is None else y + bias


def _linear_grad(g, y, x, weight, bias=None, *, need, **_):
    o = _ops()
    gx = o.matmul(g, weight) if need[0] else None
    gw = apply("linear_grad_weight", g, x) if need[1] else None
    gb = None
    if len(need) > 2 and need[2]:
        gb = o.sum(o.reshape(g, (-1, weight.shape[0])), axis=0)
    return (gx, gw) if bias is None else (gx, gw, gb)


def _dec_linear_grad_weight(g, x):
    o = _ops()
    g2 = o.reshape(g, (-1, g.shape[-1]))                                     # (batch, out)
    return o.matmul(o.permute_dims(g2, (1, 0)), o.reshape(x, (-1, x.shape[-1])))   # (out, in)


op("linear_grad_weight", kind="composite", shape=lambda gs, xs, **_: (gs[-1], xs[-1]),
   dtype=_float_rule("linear_grad_weight"), decompose=_dec_linear_grad_weight,
   doc="g^T x over all leading axes: the weight gradient of linear (a backend may skip the transpose)")


op("linear", kind="composite", shape=_linear_shape, dtype=_float_rule("linear"), decompose=_linear_decompose,
   doc="x @ weight.T + bias (PyTorch's F.linear); a backend may run it without transposing the weight",
   grad=_linear_grad)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``, as
    PyTorch's ``F.linear``: the weight is never transposed in memory where a backend has a
    kernel for it (wasm, numpy).

    >>> import ember
    >>> ember.linear(ember.ones((2, 3)), ember.ones((4, 3)), ember.zeros((4,))).tolist()
    [[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]
    """
    return apply("linear", *((x, weight) if bias is None else (x, weight, bias)))


# ---- convolution gradients: composites over conv2d / conv_transpose2d (a backend may override) --

def _dec_conv_grad_input(g, weight, *, stride, padding, dilation, groups, input_size):
    # conv_transpose2d is the adjoint of conv2d; output_padding restores the rows/columns that
    # the forward's floor division dropped.
    (pt, pb), (pl, pr) = padding
    kh, kw = weight.shape[2:]
    oh, ow = g.shape[2:]
    op_h = input_size[0] - ((oh - 1) * stride[0] - pt - pb + dilation[0] * (kh - 1) + 1)
    op_w = input_size[1] - ((ow - 1) * stride[1] - pl - pr + dilation[1] * (kw - 1) + 1)
    if op_h < max(stride[0], dilation[0]) and op_w < max(stride[1], dilation[1]):
        return apply("conv_transpose2d", g, weight, stride=stride, padding=padding, output_padding=(op_h, op_w),
                     dilation=dilation, groups=groups)
    y = apply("conv_transpose2d", g, weight, stride=stride, padding=padding, output_padding=(0, 0),
              dilation=dilation, groups=groups)
    return _ops().pad(y, ((0, 0), (0, 0), (0, op_h), (0, op_w)))


def _dec_conv_grad_weight(x, g, *, stride, padding, dilation, groups, kernel_size):
    # gw[o, c, i, j] = sum over n, oy, ox of g[n, o, oy, ox] * xpad[n, c, oy*s + i*d, ox*s + j*d]:
    # a conv2d of x (batch and channels swapped) with g as the kernel, stride and dilation
    # exchanged; groups keep their channel blocks.
    o = _ops()
    n, c, h, w = x.shape
    out_c, oh, ow = g.shape[1:]
    gr, cg, og = groups, c // groups, out_c // groups
    xt = o.reshape(o.permute_dims(o.reshape(x, (n, gr, cg, h, w)), (2, 1, 0, 3, 4)), (cg, gr * n, h, w))
    gt = o.reshape(o.permute_dims(o.reshape(g, (n, gr, og, oh, ow)), (1, 2, 0, 3, 4)), (gr * og, n, oh, ow))
    r = apply("conv2d", xt, gt, stride=dilation, padding=padding, dilation=stride, groups=gr)  # (cg, out_c, KH, KW)
    kh, kw = kernel_size
    if r.shape[2:] != (kh, kw):
        r = r[:, :, :kh, :kw]
    return o.permute_dims(r, (1, 0, 2, 3))


op("conv2d_grad_input", kind="composite", shape=lambda gs, ws, *, groups, input_size, **_:
   (gs[0], ws[1] * groups) + tuple(input_size), dtype=_float_rule("conv2d_grad_input"),
   decompose=_dec_conv_grad_input, doc="the gradient of conv2d with respect to its input")
op("conv2d_grad_weight", kind="composite", shape=lambda xs, gs, *, groups, kernel_size, **_:
   (gs[1], xs[1] // groups) + tuple(kernel_size), dtype=_float_rule("conv2d_grad_weight"),
   decompose=_dec_conv_grad_weight, doc="the gradient of conv2d with respect to its weight")


def _conv2d_grad(g, y, x, weight, bias=None, *, need, stride, padding, dilation, groups):
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gx = apply("conv2d_grad_input", g, weight, input_size=x.shape[2:], **conv) if need[0] else None
    gw = apply("conv2d_grad_weight", x, g, kernel_size=weight.shape[2:], **conv) if need[1] else None
    if bias is None:
        return gx, gw
    return gx, gw, (_ops().sum(g, axis=(0, 2, 3)) if need[2] else None)


def _conv_transpose2d_grad(g, y, x, weight, bias=None, *, need, stride, padding, output_padding, dilation,
                           groups):
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gx = gw = None
    if need[0]:   # conv2d is the adjoint of conv_transpose2d
        gx = apply("conv2d", g, weight, **conv)
        if gx.shape[2:] != x.shape[2:]:
            gx = gx[:, :, :x.shape[2], :x.shape[3]]
    if need[1]:   # the weight gradient of the conv2d that maps y's shape onto x's
        gw = apply("conv2d_grad_weight", g, x, kernel_size=weight.shape[2:], **conv)
    if bias is None:
        return gx, gw
    return gx, gw, (_ops().sum(g, axis=(0, 2, 3)) if need[2] else None)


op("conv2d", kind="other", shape=_conv2d_shape, dtype=_float_rule("conv2d"),
   doc="2-D cross-correlation, NCHW input, OIHW weight, optional bias", grad=_conv2d_grad)
op("conv_transpose2d", kind="other", shape=_conv_transpose2d_shape, dtype=_float_rule("conv_transpose2d"),
   doc="2-D transposed convolution, NCHW input, (in, out/groups, kh, kw) weight, optional bias",
   grad=_conv_transpose2d_grad)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation, as in PyTorch) of an NCHW (or CHW) input with an
    ``(out_channels, in_channels / groups, kh, kw)`` weight.

    ``padding`` is an int, a pair, ``((top, bottom), (left, right))``, ``"valid"`` (0) or
    ``"same"`` (output size ``ceil(input / stride)``, the odd padding element at the end).

    >>> import ember
    >>> x = ember.ones((1, 1, 3, 3))
    >>> ember.conv2d(x, ember.ones((1, 1, 2, 2))).tolist()
    [[[[4.0, 4.0], [4.0, 4.0]]]]
    """
    if x.ndim == 3:
        return _batched(conv2d, x, weight, bias, stride, padding, dilation, groups)
    stride = _pair(stride, "stride", "conv2d")
    dilation = _pair(dilation, "dilation", "conv2d")
    groups = _int(groups, "groups", "conv2d")
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            _need4d(x.shape, "conv2d")
            _need4d(weight.shape, "conv2d", "weight")
            padding = tuple(_same_pads(x.shape[2 + i], weight.shape[2 + i], stride[i], dilation[i]) for i in range(2))
        else:
            raise ShapeError(f"conv2d: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return apply("conv2d", *inputs, stride=stride, padding=_pads2d(padding, "conv2d"), dilation=dilation,
                 groups=groups)


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """2-D transposed convolution (the gradient of ``conv2d``), NCHW (or CHW) input, weight
    ``(in_channels, out_channels / groups, kh, kw)``. Output size per axis:
    ``(in - 1) * stride - pad_begin - pad_end + dilation * (k - 1) + output_padding + 1``.

    >>> import ember
    >>> ember.conv_transpose2d(ember.ones((1, 1, 2, 2)), ember.ones((1, 1, 2, 2)), stride=2).shape
    (1, 1, 4, 4)
    """
    name = "conv_transpose2d"
    if x.ndim == 3:
        return _batched(conv_transpose2d, x, weight, bias, stride, padding, output_padding, groups, dilation)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return apply(name, *inputs, stride=_pair(stride, "stride", name),
                 padding=_pads2d(padding, name), output_padding=_pair(output_padding, "output_padding", name, low=0),
                 dilation=_pair(dilation, "dilation", name), groups=_int(groups, "groups", name))


# ---- pooling --------------------------------------------------------------------------------

def _pool_out(size, k, s, p0, p1, d, ceil_mode, opname, axis, xs):
    eff = d * (k - 1) + 1
    if max(p0, p1) * 2 > eff:
        raise ShapeError(f"{opname}: padding {max(p0, p1)} along {axis} must be at most half the kernel extent "
                         f"({eff}); input {tuple(xs)}")
    span = size + p0 + p1 - eff
    if span < 0:
        raise ShapeError(f"{opname}: kernel extent {eff} along {axis} is larger than the padded input "
                         f"({size + p0 + p1}); input {tuple(xs)}")
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    # ceil_mode: the last window must start inside the input or its leading padding (PyTorch).
    if ceil_mode and (out - 1) * s >= size + p0:
        out -= 1
    return out


def _pool_shape(opname):
    def rule(xs, *, kernel_size, stride, padding, ceil_mode, dilation=(1, 1), **_):
        _need4d(xs, opname)
        n, c, h, w = xs
        oh = _pool_out(h, kernel_size[0], stride[0], *padding[0], dilation[0], ceil_mode, opname, "height", xs)
        ow = _pool_out(w, kernel_size[1], stride[1], *padding[1], dilation[1], ceil_mode, opname, "width", xs)
        return (n, c, oh, ow)
    return rule


def _max_pool_dtype(dt, **_):
    if dt is _dt.bool_:
        raise DTypeError("max_pool2d: does not accept bool tensors")
    return dt


# ---- pooling gradients ---------------------------------------------------------------------------

def _dec_max_pool_grad(g, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """Through the window taps: each tap is a strided slice of the padded input; the first tap
    that equals the window's maximum takes the gradient (PyTorch's first-max rule)."""
    o = _ops()
    n, c, h, w = x.shape
    oh, ow = g.shape[2:]
    (pt, _), (pl, _) = padding
    kh, kw = kernel_size
    eb = (oh - 1) * stride[0] + dilation[0] * (kh - 1) + 1 - h - pt   # rows the last window needs below
    er = (ow - 1) * stride[1] + dilation[1] * (kw - 1) + 1 - w - pl
    xp = o.pad(x, ((0, 0), (0, 0), (pt, eb), (pl, er)), value=float("-inf"))
    y = apply("max_pool2d", x, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
              ceil_mode=ceil_mode)
    taken = None
    gp = None
    for i in range(kh):
        for j in range(kw):
            sl = ((0, n, 1), (0, c, 1), (i * dilation[0], i * dilation[0] + (oh - 1) * stride[0] + 1, stride[0]),
                  (j * dilation[1], j * dilation[1] + (ow - 1) * stride[1] + 1, stride[1]))
            tap = apply("slice", xp, slices=sl)
            hit = o.logical_or(o.equal(tap, y), o.isnan(tap))
            if taken is not None:
                hit = o.logical_and(hit, o.logical_not(taken))
            taken = hit if taken is None else o.logical_or(taken, hit)
            part = _unslice_into(o.where(hit, g, 0.0), xp.shape, sl)
            gp = part if gp is None else o.add(gp, part)
    return o.pad(gp, ((0, 0), (0, 0), (-pt, -eb), (-pl, -er)))


def _unslice_into(g, shape, slices):
    from .movement import _unslice
    return _unslice(g, shape, slices)


def _dec_avg_pool_grad(g, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
    """Divide by each window's divisor, then spread over the window: a conv_transpose2d with a
    kernel of ones over (N*C, 1) planes."""
    from ..backends.python_nn import _avg_divisors
    from ..tensor import tensor
    o = _ops()
    n, c, h, w = x.shape
    oh, ow = g.shape[2:]
    (pt, pb), (pl, pr) = padding
    kh, kw = kernel_size
    dy = _avg_divisors(h, kh, stride[0], pt, pb, oh, count_include_pad)
    dx = _avg_divisors(w, kw, stride[1], pl, pr, ow, count_include_pad)
    inv = tensor([[1.0 / (a * b) for b in dx] for a in dy], dtype=g.dtype, device=g.device)
    gs = o.reshape(o.multiply(g, inv), (n * c, 1, oh, ow))
    ones = apply("full", shape=(1, 1, kh, kw), value=1.0, dtype=g.dtype, device=g.device)
    up = apply("conv_transpose2d", gs, ones, stride=stride, padding=((pt, 0), (pl, 0)), output_padding=(0, 0),
               dilation=(1, 1), groups=1)                                   # rows from -pt on
    up = o.pad(up, ((0, 0), (0, 0), (0, h - up.shape[2]), (0, w - up.shape[3])))
    return o.reshape(up, x.shape)


op("max_pool2d_backward", kind="composite", shape=lambda gs, xs, **_: tuple(xs), dtype=lambda gt, xt, **_: xt,
   decompose=_dec_max_pool_grad, doc="the gradient of max_pool2d (inputs: output gradient, input)")
op("avg_pool2d_backward", kind="composite", shape=lambda gs, xs, **_: tuple(xs), dtype=lambda gt, xt, **_: xt,
   decompose=_dec_avg_pool_grad, doc="the gradient of avg_pool2d (inputs: output gradient, input)")

op("max_pool2d", kind="other", shape=_pool_shape("max_pool2d"), dtype=_max_pool_dtype,
   doc="2-D max pooling over NCHW windows (padding never wins)",
   grad=lambda g, y, x, **attrs: apply("max_pool2d_backward", g, x,
                                       **{k: v for k, v in attrs.items() if k != "need"}))
op("avg_pool2d", kind="other", shape=_pool_shape("avg_pool2d"), dtype=_float_rule("avg_pool2d"),
   doc="2-D average pooling over NCHW windows",
   grad=lambda g, y, x, **attrs: apply("avg_pool2d_backward", g, x,
                                       **{k: v for k, v in attrs.items() if k != "need"}))


def _pool_args(opname, kernel_size, stride, padding, ceil_mode):
    k = _pair(kernel_size, "kernel_size", opname)
    s = k if stride is None or stride == () or stride == [] else _pair(stride, "stride", opname)
    return dict(kernel_size=k, stride=s, padding=_pads2d(padding, opname), ceil_mode=bool(ceil_mode))


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False) -> Tensor:
    """2-D max pooling of an NCHW (or CHW) input; ``stride`` defaults to ``kernel_size``; padding
    counts as -inf and may be at most half the kernel.

    >>> import ember
    >>> ember.max_pool2d(ember.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]), 2).tolist()
    [[[[4.0]]]]
    """
    if x.ndim == 3:
        return _batched(max_pool2d, x, kernel_size, stride, padding, dilation, ceil_mode)
    return apply("max_pool2d", x, dilation=_pair(dilation, "dilation", "max_pool2d"),
                 **_pool_args("max_pool2d", kernel_size, stride, padding, ceil_mode))


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """2-D average pooling of an NCHW (or CHW) input. With ``count_include_pad`` the zero padding
    counts in the divisor (PyTorch's default), without it only the input elements do.

    >>> import ember
    >>> ember.avg_pool2d(ember.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]), 2).tolist()
    [[[[2.5]]]]
    """
    if x.ndim == 3:
        return _batched(avg_pool2d, x, kernel_size, stride, padding, ceil_mode, count_include_pad)
    return apply("avg_pool2d", x, count_include_pad=bool(count_include_pad),
                 **_pool_args("avg_pool2d", kernel_size, stride, padding, ceil_mode))


def _adaptive_shape(xs, *, output_size):
    _need4d(xs, "adaptive_avg_pool2d")
    return tuple(xs[:2]) + tuple(output_size)


def _adaptive_matrix(n_in: int, n_out: int) -> list:
    # Row i averages input positions [floor(i * n_in / n_out), ceil((i + 1) * n_in / n_out)).
    rows = []
    for i in range(n_out):
        a, b = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
        rows.append([1.0 / (b - a) if a <= j < b else 0.0 for j in range(n_in)])
    return rows


def _dec_adaptive(x, *, output_size):
    oh, ow = output_size
    h, w = x.shape[2:]
    if h % oh == 0 and w % ow == 0:
        return avg_pool2d(x, (h // oh, w // ow))
    # Uneven windows: average with two small matrices, rows @ x @ cols^T.
    from ..tensor import tensor
    o = _ops()
    ph = tensor(_adaptive_matrix(h, oh), dtype=x.dtype, device=x.device)            # (oh, h)
    pw = tensor(_adaptive_matrix(w, ow), dtype=x.dtype, device=x.device)            # (ow, w)
    return o.matmul(o.matmul(ph, x), o.permute_dims(pw, (1, 0)))                     # (n, c, oh, ow)


op("adaptive_avg_pool2d", kind="composite", shape=_adaptive_shape, dtype=_float_rule("adaptive_avg_pool2d"),
   decompose=_dec_adaptive, doc="average pooling to a fixed output size")


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """Average-pool an NCHW (or CHW) input to ``output_size`` (an int, a pair, ``None`` keeps that
    axis). Window ``i`` covers ``[floor(i*H/OH), ceil((i+1)*H/OH))``, as in PyTorch.

    >>> import ember
    >>> ember.adaptive_avg_pool2d(ember.ones((1, 2, 5, 7)), 1).shape
    (1, 2, 1, 1)
    """
    if x.ndim == 3:
        return _batched(adaptive_avg_pool2d, x, output_size)
    _need4d(x.shape, "adaptive_avg_pool2d")
    if not isinstance(output_size, (list, tuple)):
        output_size = (output_size, output_size)
    if len(output_size) != 2:
        raise ShapeError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}")
    size = tuple(x.shape[2 + i] if s is None else _int(s, "output_size", "adaptive_avg_pool2d")
                 for i, s in enumerate(output_size))
    if min(size) < 1:
        raise ShapeError(f"adaptive_avg_pool2d: output_size must be positive, got {output_size!r}")
    return apply("adaptive_avg_pool2d", x, output_size=size)


# ---- normalization ------------------------------------------------------------------------------

def _bn_shape(xs, ms, vs, ws, bs, *, eps):
    if len(xs) < 2:
        raise ShapeError(f"batch_norm: input must have a channel axis (N, C, ...), got shape {tuple(xs)}")
    c = xs[1]
    for what, s in (("running_mean", ms), ("running_var", vs), ("weight", ws), ("bias", bs)):
        if tuple(s) != (c,):
            raise ShapeError(f"batch_norm: {what} must have shape ({c},) for input {tuple(xs)}, got {tuple(s)}")
    return tuple(xs)


def _dec_batch_norm(x, mean, var, weight, bias, *, eps):
    o = _ops()
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    scale = o.divide(weight, o.sqrt(o.add(var, eps)))
    shift = o.subtract(bias, o.multiply(mean, scale))
    return o.add(o.multiply(x, o.reshape(scale, shape)), o.reshape(shift, shape))


def _ln_shape(xs, ws, bs, *, normalized_shape, eps):
    k = len(normalized_shape)
    if k == 0 or k > len(xs) or tuple(xs[len(xs) - k:]) != tuple(normalized_shape):
        raise ShapeError(f"layer_norm: normalized_shape {tuple(normalized_shape)} must match the trailing "
                         f"dimensions of the input {tuple(xs)}")
    for what, s in (("weight", ws), ("bias", bs)):
        if tuple(s) != tuple(normalized_shape):
            raise ShapeError(f"layer_norm: {what} must have shape {tuple(normalized_shape)}, got {tuple(s)}")
    return tuple(xs)


def _dec_layer_norm(x, weight, bias, *, normalized_shape, eps):
    o = _ops()
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    d = o.subtract(x, o.mean(x, axis=axes, keepdims=True))
    var = o.mean(o.multiply(d, d), axis=axes, keepdims=True)
    return o.add(o.multiply(o.divide(d, o.sqrt(o.add(var, eps))), weight), bias)


def _bn_grad(g, y, x, mean, var, weight, bias, *, need, eps):
    o = _ops()
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    rstd = o.rsqrt(o.add(var, eps))                                   # (C,)
    gx = o.multiply(g, o.reshape(o.multiply(weight, rstd), shape)) if need[0] else None
    gsum = o.sum(g, axis=axes) if (need[1] or need[4]) else None
    gm = gv = gw = None
    if need[2] or need[3]:
        gd = o.sum(o.multiply(g, o.subtract(x, o.reshape(mean, shape))), axis=axes)   # sum g * (x - mean)
        if need[2]:
            gv = o.multiply(o.multiply(gd, weight), o.multiply(o.multiply(rstd, o.multiply(rstd, rstd)), -0.5))
        if need[3]:
            gw = o.multiply(gd, rstd)
    if need[1]:
        gm = o.negative(o.multiply(gsum, o.multiply(weight, rstd)))
    return gx, gm, gv, gw, (gsum if need[4] else None)


def _ln_backward_ops(gy, x, weight, *, normalized_shape, eps):
    """(dx, dweight, dbias) of layer norm from the output gradient ``gy``, the input and the
    weight, as ops (the decomposition of ``layer_norm_backward``): with xhat = (x - mean) * rstd
    and gh = gy * weight over the trailing ``normalized_shape`` axes,
    dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), dweight = sum(gy * xhat) and
    dbias = sum(gy) over the leading axes. Backends may run it as one kernel (webgpu: a row
    kernel and one column sum)."""
    o = _ops()
    axes, outer = _ln_axes(x, normalized_shape)
    xhat, rstd = _ln_xhat(x, axes, eps)
    gh = o.multiply(gy, weight)
    gx = o.multiply(rstd, o.subtract(o.subtract(gh, o.mean(gh, axis=axes, keepdims=True)),
                                     o.multiply(xhat, o.mean(o.multiply(gh, xhat), axis=axes, keepdims=True))))
    gw = o.multiply(gy, xhat)
    return gx, (o.sum(gw, axis=outer) if outer else gw), (o.sum(gy, axis=outer) if outer else gy)


def _ln_axes(x, normalized_shape):
    """The normalized (trailing) axes of a layer norm over ``x`` and the leading ones."""
    k = len(normalized_shape)
    return tuple(range(x.ndim - k, x.ndim)), tuple(range(x.ndim - k))


def _ln_xhat(x, axes, eps):
    """(xhat, rstd): (x - mean) * rstd over ``axes``, rstd = 1 / sqrt(var + eps) (the gradients' form)."""
    o = _ops()
    d = o.subtract(x, o.mean(x, axis=axes, keepdims=True))
    rstd = o.rsqrt(o.add(o.mean(o.multiply(d, d), axis=axes, keepdims=True), eps))
    return o.multiply(d, rstd), rstd


def _ln_backward_shape(gs, xs, ws, *, normalized_shape, eps):
    if tuple(gs) != tuple(xs):
        raise ShapeError(f"layer_norm_backward: gradient shape {tuple(gs)} must equal the input's {tuple(xs)}")
    _ln_shape(xs, ws, ws, normalized_shape=normalized_shape, eps=eps)
    return (tuple(xs), tuple(ws), tuple(ws))


op("layer_norm_backward", kind="composite", shape=_ln_backward_shape,
   dtype=lambda gt, xt, wt, **_: (_float_rule("layer_norm_backward")(gt, xt, wt),) * 3,
   outputs=3, decompose=_ln_backward_ops,
   doc="the gradient of layer_norm (inputs: dy, x, weight): (dx, dweight, dbias)")


def _ln_grad(g, y, x, weight, bias, *, need, normalized_shape, eps):
    if need[0]:
        gx, gw, gb = apply("layer_norm_backward", g, x, weight, normalized_shape=normalized_shape, eps=eps)
        return gx, (gw if need[1] else None), (gb if need[2] else None)
    o = _ops()
    axes, outer = _ln_axes(x, normalized_shape)
    gw = gb = None
    if need[1]:
        gw = o.multiply(g, _ln_xhat(x, axes, eps)[0])
        gw = o.sum(gw, axis=outer) if outer else gw
    if need[2]:
        gb = o.sum(g, axis=outer) if outer else g
    return None, gw, gb


op("batch_norm", kind="composite", shape=_bn_shape, dtype=_float_rule("batch_norm"), decompose=_dec_batch_norm,
   doc="inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias over axis 1", grad=_bn_grad)
op("layer_norm", kind="composite", shape=_ln_shape, dtype=_float_rule("layer_norm"), decompose=_dec_layer_norm,
   doc="layer norm over the trailing normalized_shape dimensions", grad=_ln_grad)


def _bn_train_shape(xs, ws, bs, *, eps):
    if len(xs) < 2:
        raise ShapeError(f"batch_norm_train: input must have a channel axis (N, C, ...), got shape {tuple(xs)}")
    for what, s in (("weight", ws), ("bias", bs)):
        if tuple(s) != (xs[1],):
            raise ShapeError(f"batch_norm_train: {what} must have shape ({xs[1]},) for input {tuple(xs)}, got {tuple(s)}")
    return (tuple(xs), (xs[1],), (xs[1],))


def _dec_bn_train(x, weight, bias, *, eps):
    o = _ops()
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = o.mean(x, axis=axes), o.var(x, axis=axes)
    return apply("batch_norm", x, mean, var, weight, bias, eps=eps), mean, var


def _bn_train_backward_ops(gy, x, mean, var, weight, *, eps):
    """(dx, dweight, dbias) of training batch norm from the output gradient ``gy``, the batch
    statistics and the weight, as ops: the classic fused formula
    dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)), dweight = sum(dy * xhat),
    dbias = sum(dy). (The decomposition of ``batch_norm_train_backward``; the numpy backend
    has one kernel for it.)"""
    o = _ops()
    c = x.shape[1]
    n = x.size // c if c else 1
    shape = (c,) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    rstd = o.rsqrt(o.add(var, eps))
    xhat = o.multiply(o.subtract(x, o.reshape(mean, shape)), o.reshape(rstd, shape))
    gsum = o.sum(gy, axis=axes)
    gxh = o.sum(o.multiply(gy, xhat), axis=axes)
    inner = o.subtract(o.subtract(gy, o.reshape(o.divide(gsum, n), shape)),
                       o.multiply(xhat, o.reshape(o.divide(gxh, n), shape)))
    return o.multiply(inner, o.reshape(o.multiply(weight, rstd), shape)), gxh, gsum


def _bn_train_backward_shape(gs, xs, ms, vs, ws, *, eps):
    return (tuple(xs), (xs[1],), (xs[1],))


op("batch_norm_train_backward", kind="composite", shape=_bn_train_backward_shape,
   dtype=lambda gt, xt, mt, vt, wt, **_: (_float_rule("batch_norm_train_backward")(gt, xt, mt, vt, wt),) * 3,
   outputs=3, decompose=_bn_train_backward_ops,
   doc="the gradient of batch_norm_train's y (inputs: dy, x, batch mean, batch var, weight): (dx, dweight, dbias)")


@keeps_output
def _bn_train_grad(g, y, x, weight, bias, *, need, eps):
    o = _ops()
    gy, gm, gv = g
    c = x.shape[1]
    n = x.size // c if c else 1
    shape = (c,) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = y[1], y[2]
    gx = gw = gb = None
    if gy is not None:
        if need[0]:
            gx, gw, gb = apply("batch_norm_train_backward", gy, x, mean, var, weight, eps=eps)
        else:
            rstd = o.rsqrt(o.add(var, eps))
            xhat = o.multiply(o.subtract(x, o.reshape(mean, shape)), o.reshape(rstd, shape))
            gw, gb = o.sum(o.multiply(gy, xhat), axis=axes), o.sum(gy, axis=axes)
    if need[0] and (gm is not None or gv is not None):   # gradients through the batch statistics outputs
        extra = None
        if gm is not None:
            extra = o.broadcast_to(o.reshape(o.divide(gm, n), shape), x.shape)
        if gv is not None:
            d = o.subtract(x, o.reshape(mean, shape))
            ev = o.multiply(d, o.reshape(o.divide(o.multiply(gv, 2.0), n), shape))
            extra = ev if extra is None else o.add(extra, ev)
        gx = extra if gx is None else o.add(gx, extra)
    return gx, (gw if need[1] else None), (gb if need[2] else None)


op("batch_norm_train", kind="composite", shape=_bn_train_shape,
   dtype=lambda xt, wt, bt, **_: (_float_rule("batch_norm_train")(xt, wt, bt),) * 3, outputs=3,
   decompose=_dec_bn_train, grad=_bn_train_grad,
   doc="training batch norm over axis 1 with the batch's statistics: (y, batch mean, biased batch var)")


def batch_norm_train(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5):
    """Batch normalization with the batch's own statistics (training mode): returns ``(y, mean,
    var)``, ``var`` biased (what normalises; ``nn.BatchNorm2d`` keeps the unbiased one in its
    running average). The gradient is one fused rule, not the chain through mean and var.

    >>> import ember
    >>> y, m, v = ember.batch_norm_train(ember.tensor([[1.0], [3.0]]), eps=0.0)
    >>> y.tolist(), m.tolist(), v.tolist()
    ([[-1.0], [1.0]], [2.0], [1.0])
    """
    c = x.shape[1] if x.ndim > 1 else 0
    return apply("batch_norm_train", x, _param(weight, (c,), x, 1.0), _param(bias, (c,), x, 0.0), eps=float(eps))


def _param(t, n_shape, like: Tensor, fill: float):
    from .creation import full
    return t if t is not None else full(n_shape, fill, dtype=like.dtype, device=like.device)


def batch_norm(x: Tensor, running_mean: Tensor, running_var: Tensor, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Inference-mode batch normalization over the channel axis 1 of ``(N, C, ...)``:
    ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``.

    >>> import ember
    >>> x = ember.tensor([[1.0, 2.0]])
    >>> ember.batch_norm(x, ember.tensor([1.0, 0.0]), ember.tensor([1.0, 4.0]), eps=0.0).tolist()
    [[0.0, 1.0]]
    """
    c = x.shape[1] if x.ndim > 1 else 0
    return apply("batch_norm", x, running_mean, running_var, _param(weight, (c,), x, 1.0),
                 _param(bias, (c,), x, 0.0), eps=float(eps))


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Layer normalization over the trailing ``normalized_shape`` dimensions (biased variance).

    >>> import ember
    >>> [round(v, 3) for v in ember.layer_norm(ember.tensor([1.0, 3.0]), 2).tolist()]
    [-1.0, 1.0]
    """
    ns = (normalized_shape,) if not isinstance(normalized_shape, (list, tuple)) else normalized_shape
    ns = tuple(_int(s, "normalized_shape", "layer_norm") for s in ns)
    return apply("layer_norm", x, _param(weight, ns, x, 1.0), _param(bias, ns, x, 0.0),
                 normalized_shape=ns, eps=float(eps))


# ---- embedding and attention ------------------------------------------------------------------

def _emb_shape(ins, ws):
    if len(ws) != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, dim), got {tuple(ws)}")
    return tuple(ins) + (ws[1],)


def _emb_dtype(it, wt):
    if it.kind not in "iu":
        raise DTypeError(f"embedding: indices must be integers, got {it.name}")
    return wt


def _dec_embedding(indices, weight):
    o = _ops()
    rows = o.take(weight, o.reshape(indices, (-1,)), axis=0)
    return o.reshape(rows, tuple(indices.shape) + (weight.shape[1],))


def _embedding_grad(g, y, indices, weight, **_):
    o = _ops()
    k = indices.size
    rows = o.reshape(g, (k, weight.shape[1]))
    return None, apply("scatter_add", rows, o.reshape(indices, (k, 1)), axis=0, size=weight.shape[0])


op("embedding", kind="composite", shape=_emb_shape, dtype=_emb_dtype, decompose=_dec_embedding,
   doc="rows of weight picked by integer indices", grad=_embedding_grad)


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Look up rows of ``weight`` (``(num_embeddings, dim)``): output ``indices.shape + (dim,)``.
    An index out of range raises IndexingError; negative ones count from the end (like ``take``).

    >>> import ember
    >>> w = ember.tensor([[0.0, 1.0], [2.0, 3.0]])
    >>> ember.embedding(ember.tensor([1, 0, 1]), w).tolist()
    [[2.0, 3.0], [0.0, 1.0], [2.0, 3.0]]
    """
    try:
        return apply("embedding", indices, weight)
    except IndexingError as e:
        raise IndexingError(f"embedding: {e} (indices {indices.shape}, weight {weight.shape}); "
                            f"every index must be below num_embeddings={weight.shape[0]}") from None


def _sdpa_shape(qs, ks, vs, ms=None, *, is_causal, scale):
    name = "scaled_dot_product_attention"
    if min(len(qs), len(ks), len(vs)) < 2:
        raise ShapeError(f"{name}: query, key and value need at least 2 dimensions, got {tuple(qs)}, {tuple(ks)}, {tuple(vs)}")
    if qs[-1] != ks[-1]:
        raise ShapeError(f"{name}: query feature size {qs[-1]} differs from key feature size {ks[-1]}; "
                         f"query {tuple(qs)}, key {tuple(ks)}")
    if ks[-2] != vs[-2]:
        raise ShapeError(f"{name}: key length {ks[-2]} differs from value length {vs[-2]}; key {tuple(ks)}, value {tuple(vs)}")
    batch = broadcast_shapes(tuple(qs[:-2]), tuple(ks[:-2]), tuple(vs[:-2]), op=name)
    if ms is not None:
        scores = batch + (qs[-2], ks[-2])
        try:
            ok = broadcast_shapes(tuple(ms), scores, op=name) == scores
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"{name}: attn_mask {tuple(ms)} does not broadcast to the scores {scores}")
    return batch + (qs[-2], vs[-1])


def _sdpa_dtype(qt, kt, vt, mt=None, **_):
    r = _float_rule("scaled_dot_product_attention")(qt, kt, vt)
    if mt is not None and mt.kind not in "fb":
        raise DTypeError(f"scaled_dot_product_attention: attn_mask must be bool or float, got {mt.name}")
    return r


def _sdpa_scores(q, k, scale):
    """q @ k^T * scale, (..., L, S)."""
    o = _ops()
    nd = k.ndim
    return o.multiply(o.matmul(q, o.permute_dims(k, tuple(range(nd - 2)) + (nd - 1, nd - 2))), scale)


def _sdpa_masked_scores(q, k, mask, is_causal, scale):
    """q @ k^T * scale with the mask applied (-inf where a bool or causal mask hides a key, a float
    mask added), (..., L, S): the softmax's input."""
    from ..tensor import tensor
    o = _ops()
    s = _sdpa_scores(q, k, scale)                                            # (..., L, S)
    if is_causal:
        # PyTorch aligns the causal mask top-left: query i sees keys 0..i.
        L, S = q.shape[-2], k.shape[-2]
        mask = tensor([[j <= i for j in range(S)] for i in range(L)], dtype=_dt.bool_, device=q.device)
    if mask is not None:
        if mask.dtype is _dt.bool_:
            s = o.where(mask, s, float("-inf"))
        else:
            s = o.add(s, mask)
    return s


def _sdpa_probs(q, k, mask, is_causal, scale):
    o = _ops()
    s = _sdpa_masked_scores(q, k, mask, is_causal, scale)
    # A row whose keys are all masked gives zeros (as PyTorch does), not NaN.
    m = o.max(s, axis=-1, keepdims=True)
    dead = o.equal(m, float("-inf"))
    e = o.exp(o.subtract(s, o.where(dead, 0.0, m)))
    return o.divide(e, o.where(dead, 1.0, o.sum(e, axis=-1, keepdims=True)))


def _dec_sdpa(q, k, v, mask=None, *, is_causal, scale):
    return _ops().matmul(_sdpa_probs(q, k, mask, is_causal, scale), v)


def _sdpa_grad(g, y, q, k, v, mask=None, *, need, is_causal, scale):
    # softmax recomputed from q and k (one matmul) instead of keeping the (L, S) probabilities;
    # without a mask as the softmax op (one row kernel on webgpu: no row can be all masked, the
    # dead-row zeros of _sdpa_probs only differ where the scores themselves are all -inf)
    o = _ops()
    if mask is None and not is_causal:
        p = o.softmax(_sdpa_scores(q, k, scale), axis=-1)
    else:
        p = _sdpa_probs(q, k, mask, is_causal, scale)                       # (..., L, S)
    gq = gk = gv = gm = None
    if need[2]:
        gv = sum_to(o.matmul(o.matrix_transpose(p), g), v.shape)
    if need[0] or need[1] or (mask is not None and need[3]):
        gp = o.matmul(g, o.matrix_transpose(v))
        gs = apply("softmax_backward", gp, p, axis=p.ndim - 1)
        if need[0]:
            gq = sum_to(o.multiply(o.matmul(gs, k), scale), q.shape)
        if need[1]:
            gk = sum_to(o.multiply(o.matmul(o.matrix_transpose(gs), q), scale), k.shape)
        if mask is not None and need[3] and mask.dtype.kind == "f":
            gm = sum_to(gs, mask.shape)
    return (gq, gk, gv) if mask is None else (gq, gk, gv, gm)


op("scaled_dot_product_attention", kind="composite", shape=_sdpa_shape, dtype=_sdpa_dtype, decompose=_dec_sdpa,
   doc="softmax(q k^T * scale + mask) v", grad=_sdpa_grad)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over shapes ``(..., L, E)``,
    ``(..., S, E)``, ``(..., S, Ev)`` -> ``(..., L, Ev)``. A bool ``attn_mask`` keeps positions
    where True, a float one is added to the scores; ``is_causal`` lets query ``i`` see keys
    ``0..i``; ``scale`` defaults to ``1 / sqrt(E)``. Rows with every key masked give zeros.

    >>> import ember
    >>> q = ember.ones((1, 2, 4))
    >>> ember.scaled_dot_product_attention(q, q, ember.ones((1, 2, 3))).tolist()
    [[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]]
    """
    if is_causal and attn_mask is not None:
        raise ShapeError("scaled_dot_product_attention: give either attn_mask or is_causal=True, not both")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.ndim and query.shape[-1] else 1.0
    inputs = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    return apply("scaled_dot_product_attention", *inputs, is_causal=bool(is_causal), scale=float(scale))


# ---- cumsum, sort, topk -----------------------------------------------------------------------

def _cumsum_dtype(dt, **_):
    return dt if dt.kind == "f" else _dt.int64


op("cumsum", kind="other", shape=_axis_shape("cumsum"), dtype=_cumsum_dtype,
   doc="cumulative sum along axis (exclusive: start at 0; reverse: from the end)",
   grad=lambda g, y, x, *, axis, exclusive, reverse, **_: apply("cumsum", g, axis=axis, exclusive=exclusive,
                                                                reverse=not reverse))


@method
def cumsum(x: Tensor, axis: int | None = None, *, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """Cumulative sum along ``axis`` (may be omitted for 1-D input). Integer and bool inputs sum
    in int64. ``exclusive`` leaves out the current element; ``reverse`` sums from the end (as in
    ONNX CumSum).

    >>> import ember
    >>> ember.cumsum(ember.tensor([1, 2, 3])).tolist()
    [1, 3, 6]
    >>> ember.cumsum(ember.tensor([1, 2, 3]), 0, exclusive=True, reverse=True).tolist()
    [5, 3, 0]
    """
    if axis is None:
        if x.ndim != 1:
            raise ShapeError(f"cumsum: axis is required for a tensor of rank {x.ndim}")
        axis = 0
    axis = normalize_axis(_int(axis, "axis", "cumsum"), x.ndim, "cumsum")
    return apply("cumsum", x, axis=axis, exclusive=bool(exclusive), reverse=bool(reverse))


def _sort_shape(xs, *, axis, descending, stable):
    normalize_axis(axis, len(xs), "sort")
    return (tuple(xs), tuple(xs))


@keeps_output
def _sort_grad(g, y, x, *, axis, **_):
    gv = g[0]
    return None if gv is None else apply("scatter_add", gv, y[1], axis=axis, size=x.shape[axis])


op("sort", kind="other", shape=_sort_shape, dtype=lambda dt, **_: (dt, _dt.int64), outputs=2,
   doc="sorted values and their int64 source indices along axis (NaN sorts as the largest)", grad=_sort_grad)


def _sort(x, axis, descending, stable=True):
    axis = normalize_axis(_int(axis, "axis", "sort"), x.ndim, "sort")
    return apply("sort", x, axis=axis, descending=bool(descending), stable=bool(stable))


@method
def sort(x: Tensor, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """The values of ``x`` sorted along ``axis`` (array-API ``sort``; ``argsort`` gives the
    indices, ``topk`` both). NaN sorts as the largest value.

    >>> import ember
    >>> ember.sort(ember.tensor([3, 1, 2]), descending=True).tolist()
    [3, 2, 1]
    """
    return _sort(x, axis, descending, stable)[0]


def _argsort_shape(xs, *, axis, descending, stable):
    return _sort_shape(xs, axis=axis, descending=descending, stable=stable)[0]


op("argsort", kind="composite", shape=_argsort_shape, dtype=lambda dt, **_: _dt.int64,
   decompose=lambda x, **kw: apply("sort", x, **kw)[1], doc="indices that sort x along axis")


@method
def argsort(x: Tensor, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """int64 indices that sort ``x`` along ``axis``; equal values keep their order when ``stable``.

    >>> import ember
    >>> ember.argsort(ember.tensor([3.0, 1.0, 2.0])).tolist()
    [1, 2, 0]
    """
    axis = normalize_axis(_int(axis, "axis", "argsort"), x.ndim, "argsort")
    return apply("argsort", x, axis=axis, descending=bool(descending), stable=bool(stable))


def _topk_shape(xs, *, k, axis, largest):
    axis = normalize_axis(axis, len(xs), "topk")
    n = xs[axis] if xs else 1
    if not 0 <= k <= n:
        raise ShapeError(f"topk: k={k} is out of range for axis {axis} of size {n} (shape {tuple(xs)})")
    s = tuple(xs[:axis]) + (k,) + tuple(xs[axis + 1:]) if xs else ()
    return (s, s)


def _dec_topk(x, *, k, axis, largest):
    from ..tensor import tensor
    o = _ops()
    values, indices = apply("sort", x, axis=axis, descending=largest, stable=True)
    if x.ndim == 0 or k == x.shape[axis]:
        return values, indices
    first = tensor(list(range(k)), dtype=_dt.int64, device=x.device)
    return o.take(values, first, axis=axis), o.take(indices, first, axis=axis)


op("topk", kind="composite", shape=_topk_shape, dtype=lambda dt, **_: (dt, _dt.int64), outputs=2,
   decompose=_dec_topk, doc="the k largest (or smallest) values along axis and their indices")


@method
def topk(x: Tensor, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    """The ``k`` largest (``largest=False``: smallest) values along ``axis`` and their int64
    indices, best first. Among equal values the lower index comes first.

    >>> import ember
    >>> v, i = ember.topk(ember.tensor([1.0, 5.0, 3.0]), 2)
    >>> v.tolist(), i.tolist()
    ([5.0, 3.0], [1, 2])
    """
    # sorted=False allows any order; the sorted order is one of them.
    axis = normalize_axis(_int(axis, "axis", "topk"), x.ndim, "topk")
    return apply("topk", x, k=_int(k, "k", "topk"), axis=axis, largest=bool(largest))


# ---- pad ------------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_shape(xs, *, pad_width, mode, value):
    out = []
    for ax, (n, (b, a)) in enumerate(zip(xs, pad_width)):
        kept = n - max(-b, 0) - max(-a, 0)
        if kept < 0:
            raise ShapeError(f"pad: cropping {max(-b, 0)}+{max(-a, 0)} removes more than the {n} elements of "
                             f"axis {ax} (shape {tuple(xs)})")
        if kept == 0 and mode != "constant" and (b > 0 or a > 0):
            raise ShapeError(f"pad: mode {mode!r} cannot pad axis {ax}, which has no elements (shape {tuple(xs)})")
        out.append(kept + max(b, 0) + max(a, 0))
    return tuple(out)


def _pad_grad(g, y, x, *, pad_width, mode, value, **_):
    if mode == "constant":   # crop what was padded, pad back what was cropped
        return apply("pad", g, pad_width=tuple((-b, -a) for b, a in pad_width), mode="constant", value=0)
    # reflect / edge / wrap: each axis gathers source positions; the gradient adds them back
    from ..backends.python_nn import _pad_source
    from ..tensor import tensor
    for ax, (n, (b, a)) in enumerate(zip(x.shape, pad_width)):
        if b == 0 and a == 0:
            continue
        src = _pad_source(n, b, a, mode)
        idx = tensor(src, dtype=_dt.int64, device=g.device)
        idx = apply("reshape", idx, shape=(1,) * ax + (len(src),) + (1,) * (g.ndim - ax - 1))
        g = apply("scatter_add", g, idx, axis=ax, size=n)
    return g


op("pad", kind="other", shape=_pad_shape, dtype=same_dtype,
   doc="pad (or, with negative widths, crop) each axis; modes constant, reflect, edge, wrap", grad=_pad_grad)


def pad(x: Tensor, pad_width, mode: str = "constant", value=0) -> Tensor:
    """Pad ``x`` numpy-style: ``pad_width`` is one ``(before, after)`` pair per axis, or a single
    pair (or int) for all axes. Negative widths crop (as ONNX Pad allows). Modes: ``"constant"``
    (``value``), ``"reflect"`` (mirror without the edge), ``"edge"`` (repeat the edge),
    ``"wrap"`` (periodic).

    >>> import ember
    >>> ember.pad(ember.tensor([1, 2, 3]), (1, 2), mode="reflect").tolist()
    [2, 1, 2, 3, 2, 1]
    >>> ember.pad(ember.tensor([1, 2, 3]), [(-1, 1)]).tolist()
    [2, 3, 0]
    """
    if mode not in PAD_MODES:
        raise UnsupportedOp(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    nd = x.ndim
    pw = pad_width
    if isinstance(pw, int) and not isinstance(pw, bool):
        pw = ((pw, pw),) * nd
    else:
        pw = tuple(pw)
        if len(pw) == 2 and all(not isinstance(p, (list, tuple)) for p in pw):
            pw = (tuple(pw),) * nd
        elif len(pw) == 1 and nd != 1 and isinstance(pw[0], (list, tuple)):
            pw = (tuple(pw[0]),) * nd
    if len(pw) != nd or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pw):
        raise ShapeError(f"pad: pad_width {pad_width!r} must be one (before, after) pair per axis "
                         f"({nd} for shape {x.shape}) or a single pair")
    pw = tuple((_int(b, "pad_width", "pad"), _int(a, "pad_width", "pad")) for b, a in pw)
    if not isinstance(value, (int, float)):
        raise DTypeError(f"pad: value must be a Python int or float, got {type(value).__name__}")
    return apply("pad", x, pad_width=pw, mode=mode, value=value)
