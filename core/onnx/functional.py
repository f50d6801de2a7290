"""ONNX operators that ember has no single op for, written as compositions of ember ops.

Generated model code (``ember import``) calls these as ``onnxf.<name>(...)``; the run-time
loader calls them through the op table. Every function takes and returns ember Tensors and
creates any helper tensor on its input's device.

>>> import ember
>>> from ember.onnx import functional as onnxf
>>> onnxf.trilu(ember.ones((2, 3)), 0, upper=True).tolist()
[[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
"""
from __future__ import annotations

import math
from math import prod

import ember as E

from .. import dtypes as _dt
from ..errors import IndexingError, ShapeError, UnsupportedOp
from ..tensor import Tensor

HOST = "python"


def _const(values, dtype, like: Tensor) -> Tensor:
    return E.tensor(values, dtype=dtype, device=like.device)


def _norm_axis(axis, ndim, what):
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{what}: axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def node(op_type: str, inputs, attrs: dict, opset: int, outputs: int = 1):
    """Run one ONNX operator through ember's op table (``ember.onnx.ops``): what generated code
    calls for a node whose arguments are only known at run time.

    >>> import ember
    >>> from ember.onnx import functional as onnxf
    >>> onnxf.node("Reshape", [ember.ones((2, 3)), ember.tensor([0, -1])], {}, opset=13).shape
    (2, 3)
    """
    from .runtime import run_node
    return run_node(op_type, inputs, attrs, opset, outputs)


# ---- shapes --------------------------------------------------------------------------------

def _shape_device(x: Tensor) -> str:
    # A shape is data even when x has none: while loading (x on "meta") it is a real host tensor,
    # so the shape arithmetic after it can be folded.
    return HOST if x.device == "meta" else x.device


def shape(x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
    """``x.shape[start:end]`` as an int64 tensor (on ``x``'s device).

    >>> import ember
    >>> from ember.onnx import functional as onnxf
    >>> onnxf.shape(ember.ones((2, 3, 4)), 1).tolist()
    [3, 4]
    """
    return E.tensor(list(x.shape[start:end]), dtype=_dt.int64, device=_shape_device(x))


def size(x: Tensor) -> Tensor:
    """The number of elements of ``x`` as a 0-d int64 tensor."""
    return E.tensor(prod(x.shape), dtype=_dt.int64, device=_shape_device(x))


def flat_values(t: Tensor) -> list:
    """The values of ``t`` as a flat Python list (row-major)."""
    v = t.tolist()
    if not isinstance(v, list):
        return [v]
    while v and isinstance(v[0], list):
        v = [a for row in v for a in row]
    return v


def int_list(t: Tensor) -> list:
    """The values of a small integer tensor as Python ints (used by generated code for
    shapes that are only known at run time)."""
    return [int(a) for a in flat_values(t)]


def reshape(x: Tensor, shape, allowzero: bool = False) -> Tensor:
    """ONNX Reshape: a 0 in ``shape`` copies the input's dimension (unless ``allowzero``),
    one -1 is inferred."""
    shape = list(shape)
    if not allowzero:
        for i, s in enumerate(shape):
            if s == 0:
                if i >= x.ndim:
                    raise ShapeError(f"Reshape: a 0 at position {i} of shape {shape} has no input "
                                     f"dimension to copy (input shape {x.shape})")
                shape[i] = x.shape[i]
    return E.reshape(x, tuple(shape))


def expand(x: Tensor, shape) -> Tensor:
    """ONNX Expand: broadcast ``x`` and ``shape`` together (either may have the larger dims)."""
    from ..registry import broadcast_shapes
    out = broadcast_shapes(tuple(x.shape), tuple(shape), op="Expand")
    return x if out == tuple(x.shape) else E.broadcast_to(x, out)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    """ONNX Flatten: a 2-D view ``(prod(shape[:axis]), prod(shape[axis:]))``."""
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"Flatten: axis {axis} is out of range for rank {x.ndim}")
    return E.reshape(x, (prod(x.shape[:axis]), prod(x.shape[axis:])))


def slice_(x: Tensor, starts, ends, axes=None, steps=None) -> Tensor:
    """ONNX Slice. Its clamping rules are Python's slicing rules, so this is ``x[...]`` with
    one ``slice(start, end, step)`` per listed axis (INT64 "infinities" clamped first)."""
    nd = x.ndim
    axes = list(range(len(starts))) if axes is None else [_norm_axis(a, nd, "Slice") for a in axes]
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"Slice: starts, ends, axes and steps must have the same length "
                         f"({len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"Slice: repeated axis in {axes}")
    idx = [slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ShapeError("Slice: step 0")
        n = x.shape[a]
        idx[a] = slice(max(-n - 1, min(n, s)), max(-n - 1, min(n, e)), st)
    return x[tuple(idx)]


def split(x: Tensor, sizes, axis: int = 0) -> tuple:
    """Split ``x`` along ``axis`` into pieces of the given ``sizes`` (ONNX/PyTorch style)."""
    axis = _norm_axis(axis, x.ndim, "Split")
    if sum(sizes) != x.shape[axis] or any(n < 0 for n in sizes):
        raise ShapeError(f"Split: sizes {list(sizes)} do not add up to the axis length {x.shape[axis]} "
                         f"(shape {x.shape}, axis {axis})")
    points = []
    for n in sizes[:-1]:
        points.append((points[-1] if points else 0) + n)
    return tuple(E.split(x, points, axis=axis))


def split_sizes(n: int, parts: int) -> list:
    """ONNX Split with ``num_outputs``: equal pieces, the last one smaller."""
    if parts < 1:
        raise ShapeError(f"Split: num_outputs must be positive, got {parts}")
    step = -(-n // parts)
    sizes = [step] * (n // step if step else 0)
    if sum(sizes) < n:
        sizes.append(n - sum(sizes))
    if len(sizes) != parts:
        raise ShapeError(f"Split: cannot split {n} into {parts} pieces of ceil({n}/{parts})")
    return sizes


def squeeze(x: Tensor, axes=None) -> Tensor:
    if axes is None:
        axes = [i for i, n in enumerate(x.shape) if n == 1]
    axes = sorted({_norm_axis(a, x.ndim, "Squeeze") for a in axes})
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"Squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    return E.reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def unsqueeze(x: Tensor, axes) -> Tensor:
    nd = x.ndim + len(axes)
    axes = sorted({_norm_axis(a, nd, "Unsqueeze") for a in axes})
    if len(axes) != len(list(axes)):
        raise ShapeError("Unsqueeze: repeated axes")
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return E.reshape(x, tuple(shape))


def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    n, c, h, w = x.shape
    b = blocksize
    if c % (b * b):
        raise ShapeError(f"DepthToSpace: channels {c} not divisible by blocksize^2 = {b * b}")
    if mode == "DCR":
        t = E.reshape(x, (n, b, b, c // (b * b), h, w))
        t = E.permute_dims(t, (0, 3, 4, 1, 5, 2))
    else:
        t = E.reshape(x, (n, c // (b * b), b, b, h, w))
        t = E.permute_dims(t, (0, 1, 4, 2, 5, 3))
    return E.reshape(t, (n, c // (b * b), h * b, w * b))


def space_to_depth(x: Tensor, blocksize: int) -> Tensor:
    n, c, h, w = x.shape
    b = blocksize
    if h % b or w % b:
        raise ShapeError(f"SpaceToDepth: spatial size {h}x{w} not divisible by blocksize {b}")
    t = E.reshape(x, (n, c, h // b, b, w // b, b))
    t = E.permute_dims(t, (0, 3, 5, 1, 2, 4))
    return E.reshape(t, (n, c * b * b, h // b, w // b))


# ---- arithmetic the array API spells differently -------------------------------------------

def int_divide(a: Tensor, b: Tensor) -> Tensor:
    """Integer division truncating toward zero (ONNX Div on ints; C semantics)."""
    q = E.floor_divide(a, b)
    r = E.remainder(a, b)
    fix = E.logical_and(E.not_equal(r, 0), E.not_equal(E.less(a, 0), E.less(b, 0)))
    return E.where(fix, E.add(q, 1), q)


def fmod(a: Tensor, b: Tensor) -> Tensor:
    """C ``fmod``: the remainder has the sign of the dividend."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        r = E.remainder(a, b)
        # Python-style remainder has the divisor's sign; move it to the dividend's side.
        fix = E.logical_and(E.not_equal(r, 0), E.not_equal(E.less(r, 0), E.less(a, 0)))
        out = E.where(fix, E.subtract(r, b), r)
        # fmod(x, +-inf) == x for finite x
        return E.where(E.isinf(b), a, out) if b.dtype.kind == "f" else out
    r = E.remainder(a, b)
    fix = E.logical_and(E.not_equal(r, 0), E.not_equal(E.less(r, 0), E.less(a, 0)))
    return E.where(fix, E.subtract(r, b), r)


def tan(x: Tensor) -> Tensor:
    return E.divide(E.sin(x), E.cos(x))


def sinh(x: Tensor) -> Tensor:
    return E.multiply(E.subtract(E.exp(x), E.exp(E.negative(x))), 0.5)


def cosh(x: Tensor) -> Tensor:
    return E.multiply(E.add(E.exp(x), E.exp(E.negative(x))), 0.5)


def asinh(x: Tensor) -> Tensor:
    return E.log(E.add(x, E.sqrt(E.add(E.multiply(x, x), 1.0))))


def acosh(x: Tensor) -> Tensor:
    return E.log(E.add(x, E.sqrt(E.subtract(E.multiply(x, x), 1.0))))


def atanh(x: Tensor) -> Tensor:
    return E.multiply(E.log(E.divide(E.add(1.0, x), E.subtract(1.0, x))), 0.5)


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), computed as max(x, 0) + log(1 + exp(-|x|)) so large x do not overflow."""
    return E.add(E.maximum(x, 0.0), E.log(E.add(E.exp(E.negative(E.abs(x))), 1.0)))


def softsign(x: Tensor) -> Tensor:
    return E.divide(x, E.add(E.abs(x), 1.0))


def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    return E.clip(E.add(E.multiply(x, alpha), beta), 0.0, 1.0)


def hard_swish(x: Tensor) -> Tensor:
    return E.multiply(x, hard_sigmoid(x, 1.0 / 6.0, 0.5))


def mish(x: Tensor) -> Tensor:
    return E.multiply(x, E.tanh(softplus(x)))


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return E.where(E.greater(x, 0.0), x, E.multiply(E.subtract(E.exp(E.minimum(x, 0.0)), 1.0), alpha))


def selu(x: Tensor, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875) -> Tensor:
    return E.multiply(elu(x, alpha), gamma)


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    neg = E.multiply(E.subtract(E.exp(E.divide(E.minimum(x, 0.0), alpha)), 1.0), alpha)
    return E.add(E.maximum(x, 0.0), E.minimum(neg, 0.0))


def thresholded_relu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return E.where(E.greater(x, alpha), x, 0.0)


def shrink(x: Tensor, lambd: float = 0.5, bias: float = 0.0) -> Tensor:
    lo = E.where(E.less(x, -lambd), E.add(x, bias), 0.0)
    return E.where(E.greater(x, lambd), E.subtract(x, bias), lo).astype(x.dtype)


def prelu(x: Tensor, slope: Tensor) -> Tensor:
    return E.where(E.less(x, 0), E.multiply(x, slope), x)


def isinf(x: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    if x.dtype.kind != "f":
        return E.full(x.shape, False, dtype=_dt.bool_, device=x.device)
    if detect_positive and detect_negative:
        return E.isinf(x)
    if detect_positive:
        return E.equal(x, math.inf)
    if detect_negative:
        return E.equal(x, -math.inf)
    return E.full(x.shape, False, dtype=_dt.bool_, device=x.device)


def variadic(fn, *xs: Tensor) -> Tensor:
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


def mean_of(*xs: Tensor) -> Tensor:
    return E.divide(variadic(E.add, *xs), float(len(xs)))


# ---- reductions -----------------------------------------------------------------------------

def reduce(kind: str, x: Tensor, axes=None, keepdims: bool = True) -> Tensor:
    """ONNX ReduceX over ``axes`` (None: all). Empty reductions follow ONNX (sum 0, prod 1,
    max -inf, min +inf, log_sum -inf)."""
    ax = None if axes is None else tuple(_norm_axis(a, x.ndim, f"Reduce{kind}") for a in axes)
    if ax is not None and len(set(ax)) != len(ax):
        raise ShapeError(f"Reduce{kind}: repeated axis in {axes}")
    if kind in ("Max", "Min") and (x.size == 0):
        out_shape = tuple(1 if ax is None or i in ax else n for i, n in enumerate(x.shape)) if keepdims \
            else tuple(n for i, n in enumerate(x.shape) if ax is not None and i not in ax)
        if x.dtype.kind == "f":
            fill = -math.inf if kind == "Max" else math.inf
        elif x.dtype is _dt.uint8:
            fill = 0 if kind == "Max" else 255
        elif x.dtype is _dt.bool_:
            fill = kind != "Max"
        else:
            info = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}[x.dtype.name]
            fill = info[0] if kind == "Max" else info[1]
        return E.full(out_shape, fill, dtype=x.dtype, device=x.device)
    if kind == "Sum":
        return E.sum(x, axis=ax, keepdims=keepdims, dtype=x.dtype)
    if kind == "Mean":
        return E.mean(x, axis=ax, keepdims=keepdims)
    if kind == "Max":
        return E.max(x, axis=ax, keepdims=keepdims)
    if kind == "Min":
        return E.min(x, axis=ax, keepdims=keepdims)
    if kind == "Prod":
        return E.prod(x, axis=ax, keepdims=keepdims, dtype=x.dtype)
    if kind == "L1":
        return E.sum(E.abs(x), axis=ax, keepdims=keepdims, dtype=x.dtype)
    if kind == "L2":
        return E.sqrt(E.sum(E.multiply(x, x), axis=ax, keepdims=keepdims)).astype(x.dtype)
    if kind == "SumSquare":
        return E.sum(E.multiply(x, x), axis=ax, keepdims=keepdims, dtype=x.dtype)
    if kind == "LogSum":
        return E.log(E.sum(x, axis=ax, keepdims=keepdims))
    if kind == "LogSumExp":
        if x.size == 0:
            return E.log(E.sum(E.exp(x), axis=ax, keepdims=keepdims))
        m = E.max(x, axis=ax, keepdims=True)
        m = E.where(E.isinf(m), 0.0, m) if x.dtype.kind == "f" else m
        s = E.log(E.sum(E.exp(E.subtract(x, m)), axis=ax, keepdims=True))
        out = E.add(s, m)
        if not keepdims:
            out = squeeze(out, list(range(x.ndim)) if ax is None else list(ax))
        return out.astype(x.dtype) if x.dtype.kind == "f" else out
    raise UnsupportedOp(f"Reduce{kind}")


def arg_reduce(kind: str, x: Tensor, axis: int, keepdims: bool, select_last_index: bool) -> Tensor:
    axis = _norm_axis(axis, x.ndim, kind)
    fn = E.argmax if kind == "ArgMax" else E.argmin
    if not select_last_index:
        return fn(x, axis=axis, keepdims=keepdims)
    n = x.shape[axis]
    i = fn(E.flip(x, axis=axis), axis=axis, keepdims=keepdims)
    return E.subtract(n - 1, i)


def softmax_2d(fn, x: Tensor, axis: int) -> Tensor:
    """Softmax/LogSoftmax/Hardmax before opset 13: over all dims from ``axis`` on, jointly."""
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"softmax: axis {axis} out of range for rank {x.ndim}")
    y = fn(E.reshape(x, (prod(x.shape[:axis]), prod(x.shape[axis:]))), -1)
    return E.reshape(y, x.shape)


def hardmax(x: Tensor, axis: int = -1) -> Tensor:
    axis = _norm_axis(axis, x.ndim, "Hardmax")
    n = x.shape[axis]
    i = E.argmax(x, axis=axis, keepdims=True)
    shape = [1] * x.ndim
    shape[axis] = n
    r = E.reshape(E.arange(n, dtype=_dt.int64, device=x.device), tuple(shape))
    return E.astype(E.equal(r, i), x.dtype)


# ---- normalization / pooling helpers ---------------------------------------------------------

def layer_norm(x: Tensor, scale: Tensor, bias: Tensor | None, axis: int, eps: float, stats: bool = False):
    """ONNX LayerNormalization over dims ``axis..``; with ``stats`` also mean and 1/std."""
    axis = _norm_axis(axis, x.ndim, "LayerNormalization")
    ns = tuple(x.shape[axis:])
    w = scale if tuple(scale.shape) == ns else E.broadcast_to(scale, ns)
    b = None if bias is None else (bias if tuple(bias.shape) == ns else E.broadcast_to(bias, ns))
    y = E.layer_norm(x, ns, w, b, eps=eps)
    if not stats:
        return y
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(_dt.float32)
    mean = E.mean(xf, axis=axes, keepdims=True)
    d = E.subtract(xf, mean)
    inv = E.divide(1.0, E.sqrt(E.add(E.mean(E.multiply(d, d), axis=axes, keepdims=True), eps)))
    return y, mean, inv


def instance_norm(x: Tensor, scale: Tensor, bias: Tensor, eps: float) -> Tensor:
    axes = tuple(range(2, x.ndim))
    mean = E.mean(x, axis=axes, keepdims=True)
    d = E.subtract(x, mean)
    var = E.mean(E.multiply(d, d), axis=axes, keepdims=True)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = E.divide(d, E.sqrt(E.add(var, eps)))
    return E.add(E.multiply(y, E.reshape(scale, shape)), E.reshape(bias, shape))


def group_norm(x: Tensor, scale: Tensor, bias: Tensor, num_groups: int, eps: float) -> Tensor:
    n, c = x.shape[:2]
    if c % num_groups:
        raise ShapeError(f"GroupNormalization: channels {c} not divisible by num_groups {num_groups}")
    g = E.reshape(x, (n, num_groups, -1))
    mean = E.mean(g, axis=2, keepdims=True)
    d = E.subtract(g, mean)
    var = E.mean(E.multiply(d, d), axis=2, keepdims=True)
    y = E.reshape(E.divide(d, E.sqrt(E.add(var, eps))), x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return E.add(E.multiply(y, E.reshape(scale, shape)), E.reshape(bias, shape))


def lrn(x: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Tensor:
    """Local response normalization across channels (ONNX LRN): a sum of squares over a
    window of ``size`` channels, as a 1-wide average pool over the channel axis."""
    n, c = x.shape[:2]
    rest = x.shape[2:]
    sq = E.multiply(x, x)
    lo = (size - 1) // 2
    hi = size - 1 - lo
    t = E.reshape(sq, (n, 1, c, prod(rest) if rest else 1))
    t = E.pad(t, ((0, 0), (0, 0), (lo, hi), (0, 0)))
    s = E.avg_pool2d(t, (size, 1), stride=1)                       # (n, 1, c, hw): window mean
    s = E.reshape(s, x.shape)
    denom = E.pow(E.add(E.multiply(s, alpha), bias), beta)           # mean * size * alpha / size
    return E.divide(x, denom)


def lp_normalization(x: Tensor, axis: int, p: int) -> Tensor:
    if p == 1:
        n = E.sum(E.abs(x), axis=axis, keepdims=True)
    else:
        n = E.sqrt(E.sum(E.multiply(x, x), axis=axis, keepdims=True))
    return E.where(E.equal(n, 0.0), 0.0, E.divide(x, n)).astype(x.dtype)




def pool1d(fn, x: Tensor, kernel, stride, padding, **kw) -> Tensor:
    """A 1-D pooling as the 2-D one over a height-1 image."""
    y = fn(E.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])), (1, kernel), stride=(1, stride),
           padding=((0, 0), padding), **kw)
    return E.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))


def pool_big_pads(kind: str, x: Tensor, kernel, stride, pads, dilation=(1, 1), ceil_mode: bool = False,
                  count_include_pad: bool = False) -> Tensor:
    """2-D pooling whose padding exceeds half the kernel (ONNX allows it, ember's pools do
    not): pad explicitly, then pool without padding."""
    width = ((0, 0), (0, 0)) + tuple(tuple(p) for p in pads)
    if kind == "max":
        fill = -math.inf if x.dtype.kind == "f" else {"uint8": 0, "int32": -(1 << 31), "int64": -(1 << 63)}[x.dtype.name]
        xp = E.pad(x, width, value=fill)
        return E.max_pool2d(xp, kernel, stride=stride, dilation=dilation, ceil_mode=ceil_mode)
    xp = E.pad(x, width)
    y = E.avg_pool2d(xp, kernel, stride=stride, ceil_mode=ceil_mode)
    if count_include_pad:
        return y
    ones = E.pad(E.ones(x.shape[2:], dtype=x.dtype, device=x.device), tuple(tuple(p) for p in pads))
    frac = E.avg_pool2d(E.reshape(ones, (1, 1) + ones.shape), kernel, stride=stride, ceil_mode=ceil_mode)
    return E.divide(y, frac)


def conv1d(x: Tensor, w: Tensor, b: Tensor | None, stride: int, padding, dilation: int, groups: int) -> Tensor:
    """A 1-D convolution as the 2-D one over a height-1 image."""
    x4 = E.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    w4 = E.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    y = E.conv2d(x4, w4, b, stride=(1, stride), padding=((0, 0), padding), dilation=(1, dilation), groups=groups)
    return E.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))


def conv_transpose1d(x: Tensor, w: Tensor, b: Tensor | None, stride: int, padding, output_padding: int,
                     dilation: int, groups: int) -> Tensor:
    x4 = E.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    w4 = E.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    y = E.conv_transpose2d(x4, w4, b, stride=(1, stride), padding=((0, 0), padding),
                           output_padding=(0, output_padding), dilation=(1, dilation), groups=groups)
    return E.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))


def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0,
         trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """ONNX Gemm: ``alpha * a' @ b' + beta * c``."""
    if trans_a:
        a = E.permute_dims(a, (1, 0))
    if trans_b:
        b = E.permute_dims(b, (1, 0))
    y = E.matmul(a, b)
    if alpha != 1.0:
        y = E.multiply(y, alpha)
    if c is not None and beta != 0.0:
        y = E.add(y, c if beta == 1.0 else E.multiply(c, beta))
    return y.astype(a.dtype) if y.dtype is not a.dtype else y


# ---- indexing ---------------------------------------------------------------------------------

def _fix_negative(idx: Tensor, n, what: str = "Gather") -> Tensor:
    """Negative indices count from the end (ONNX Gather/GatherElements/GatherND); the valid range
    is ``[-n, n - 1]``. An index still negative after adding ``n`` is out of range: it becomes
    ``n``, which ``take`` refuses (IndexingError), instead of wrapping around. No values are read
    here, so an execution plan can still record it."""
    neg = E.less(idx, 0)
    fixed = E.where(neg, E.add(idx, n), idx)
    return E.where(E.less(fixed, 0), E.add(E.multiply(fixed, 0), n), fixed)


def gather(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    """ONNX Gather: ``take`` along ``axis`` with any-shaped (possibly negative) indices. ``take``
    itself counts negative indices from the end and refuses any outside ``[-n, n)`` on every
    backend (IndexingError naming the index), so the indices go to it as they are: an index
    tensor keeps what its backend knows of its range (webgpu: an upload's min/max, which lets a
    replayed plan check it with no GPU read and stay one dispatch stream)."""
    if x.ndim == 0:
        raise ShapeError("Gather: data must have rank >= 1, got a scalar")
    axis = _norm_axis(axis, x.ndim, "Gather")
    idx = indices if indices.dtype is _dt.int64 else indices.astype(_dt.int64)
    flat = E.take(x, E.reshape(idx, (-1,)), axis=axis)
    return E.reshape(flat, x.shape[:axis] + indices.shape + x.shape[axis + 1:])


def gather_elements(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    if x.ndim == 0:
        raise ShapeError("GatherElements: data must have rank >= 1, got a scalar")
    axis = _norm_axis(axis, x.ndim, "GatherElements")
    idx = _fix_negative(indices.astype(_dt.int64), x.shape[axis], "GatherElements")
    return E.take_along_axis(x, idx, axis=axis)


def gather_nd(x: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
    """ONNX GatherND as one ``take`` over the flattened data."""
    q = indices.shape[-1]
    b = batch_dims
    if b + q > x.ndim:
        raise ShapeError(f"GatherND: index depth {q} + batch_dims {b} exceeds data rank {x.ndim}")
    batch = x.shape[:b]
    nb = prod(batch)
    inner = x.shape[b:b + q]
    rest = x.shape[b + q:]
    idx = indices.astype(_dt.int64)
    flat = None
    stride = 1
    for k in range(q - 1, -1, -1):
        sel = idx[(..., slice(k, k + 1))]
        sel = _fix_negative(sel, inner[k], "GatherND")
        term = E.multiply(sel, stride)
        flat = term if flat is None else E.add(flat, term)
        stride *= inner[k]
    lead = indices.shape[b:-1]
    flat = E.reshape(flat, (nb, prod(lead)) if flat is not None else (nb, prod(lead)))
    offs = E.reshape(E.multiply(E.arange(nb, dtype=_dt.int64, device=x.device), stride), (nb, 1))
    flat = E.reshape(E.add(flat, offs), (-1,))
    data = E.reshape(x, (nb * stride,) + rest)
    out = E.take(data, flat, axis=0)
    return E.reshape(out, tuple(indices.shape[:-1]) + rest)


def _scatter_index(n_data: int, positions: list) -> list:
    """Source index of each output element when ``positions[j]`` receives update ``j``:
    positions [0, n) read the data, [n, n + len(updates)) the updates."""
    src = list(range(n_data))
    for j, p in enumerate(positions):
        src[p] = n_data + j
    return src


def scatter_elements(x: Tensor, indices: Tensor, updates: Tensor, axis: int, positions_of) -> Tensor:
    """ONNX ScatterElements (reduction none) as one ``take`` from ``concat(data, updates)``;
    the flat positions are computed in Python from the (small) index values."""
    axis = _norm_axis(axis, x.ndim, "ScatterElements")
    if tuple(indices.shape) != tuple(updates.shape):
        raise ShapeError(f"ScatterElements: indices {indices.shape} and updates {updates.shape} differ")
    idx = positions_of(indices)
    n = x.shape[axis]
    strides = [prod(x.shape[i + 1:]) for i in range(x.ndim)]
    ushape = indices.shape
    pos = []
    for j, v in enumerate(idx):
        if not -n <= v < n:
            raise IndexingError(f"ScatterElements: index {v} out of range for axis {axis} of size {n}")
        v %= n
        rem = j
        coords = []
        for d in reversed(ushape):
            coords.append(rem % d)
            rem //= d
        coords.reverse()
        coords[axis] = v
        pos.append(sum(c * s for c, s in zip(coords, strides)))
    src = _scatter_index(x.size, pos)
    both = E.concat([E.reshape(x, (-1,)), E.reshape(updates.astype(x.dtype), (-1,))], axis=0)
    return E.reshape(E.take(both, _const(src, _dt.int64, x), axis=0), x.shape)


def scatter_nd(x: Tensor, indices: Tensor, updates: Tensor, positions_of) -> Tensor:
    q = indices.shape[-1]
    inner = x.shape[:q]
    chunk = prod(x.shape[q:])
    idx = positions_of(indices)
    pos = []
    for r in range(len(idx) // q if q else 0):
        p = 0
        for k in range(q):
            v = idx[r * q + k]
            if not -inner[k] <= v < inner[k]:
                raise IndexingError(f"ScatterND: index {v} out of range for axis {k} of size {inner[k]}")
            p = p * inner[k] + (v % inner[k])
        pos.extend(range(p * chunk, p * chunk + chunk))
    src = _scatter_index(x.size, pos)
    both = E.concat([E.reshape(x, (-1,)), E.reshape(updates.astype(x.dtype), (-1,))], axis=0)
    return E.reshape(E.take(both, _const(src, _dt.int64, x), axis=0), x.shape)


def one_hot(indices: Tensor, depth: int, values: Tensor, axis: int = -1) -> Tensor:
    nd = indices.ndim + 1
    axis = _norm_axis(axis, nd, "OneHot")
    idx = E.where(E.less(indices, 0), E.add(indices, depth), indices).astype(_dt.int64)
    idx = unsqueeze(idx, [axis])
    shape = [1] * nd
    shape[axis] = depth
    r = E.reshape(E.arange(depth, dtype=_dt.int64, device=indices.device), tuple(shape))
    hot = E.equal(idx, r)
    off, on = split(values, [1, 1], 0)
    return E.where(hot, E.reshape(on, ()), E.reshape(off, ()))


def trilu(x: Tensor, k: int = 0, upper: bool = True) -> Tensor:
    """Keep the upper (``j - i >= k``) or lower (``j - i <= k``) triangle of the last two dims."""
    n, m = x.shape[-2:]
    rows = E.reshape(E.arange(n, dtype=_dt.int64, device=x.device), (n, 1))
    cols = E.reshape(E.arange(m, dtype=_dt.int64, device=x.device), (1, m))
    d = E.subtract(cols, rows)
    keep = E.greater_equal(d, k) if upper else E.less_equal(d, k)
    zero = E.full((), False if x.dtype is _dt.bool_ else 0, dtype=x.dtype, device=x.device)
    return E.where(keep, x, zero)


def eye_like(x: Tensor, k: int = 0, dtype=None) -> Tensor:
    n, m = x.shape
    rows = E.reshape(E.arange(n, dtype=_dt.int64, device=x.device), (n, 1))
    cols = E.reshape(E.arange(m, dtype=_dt.int64, device=x.device), (1, m))
    return E.astype(E.equal(E.subtract(cols, rows), k), dtype or x.dtype)


def range_(start, limit, delta, dtype, device) -> Tensor:
    """ONNX Range: ``max(ceil((limit - start) / delta), 0)`` elements."""
    if delta == 0:
        raise ShapeError("Range: delta is 0")
    try:
        n = max(int(math.ceil((limit - start) / delta)), 0)
    except (OverflowError, ValueError):
        raise ShapeError(f"Range: start {start}, limit {limit}, delta {delta} give no finite length") from None
    from ..limits import check_alloc
    check_alloc("Range", (n,), dtype)     # before any Python list of n values exists
    if device == "meta":
        return E.zeros((n,), dtype=dtype, device=device)
    if dtype.kind == "f":
        vals = [start + i * delta for i in range(n)]
    else:
        vals = [int(start) + i * int(delta) for i in range(n)]
    return E.tensor(vals, dtype=dtype, device=device) if n else E.zeros((0,), dtype=dtype, device=device)




def cumsum(x: Tensor, axis: int, exclusive: bool = False, reverse: bool = False) -> Tensor:
    y = E.cumsum(x, axis, exclusive=exclusive, reverse=reverse)
    return y if y.dtype is x.dtype else y.astype(x.dtype)




# ---- resize -------------------------------------------------------------------------------

def _source_coord(mode, o, scale, n_in, n_out, roi_lo, roi_hi):
    # ONNX measures the output length as in * scale (not rounded) in these formulas
    w = scale * n_in
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        off = n_in / 2.0 * (1 - n_out / w)
        return off + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if w != 1 else -0.5
    if mode == "align_corners":
        return 0.0 if w == 1 else o * (n_in - 1) / (w - 1)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_crop_and_resize":
        if w == 1:
            return (roi_hi - roi_lo) * (n_in - 1) / 2 + roi_lo * (n_in - 1)
        return o * (roi_hi - roi_lo) * (n_in - 1) / (w - 1) + roi_lo * (n_in - 1)
    raise UnsupportedOp(f"Resize: coordinate_transformation_mode {mode!r}")


def _nearest(v, mode, n_in):
    if mode == "round_prefer_floor":
        i = math.floor(v) if v - math.floor(v) == 0.5 else math.floor(v + 0.5)
    elif mode == "round_prefer_ceil":
        i = math.floor(v + 0.5)
    elif mode == "floor":
        i = math.floor(v)
    elif mode == "ceil":
        i = math.ceil(v)
    else:
        raise UnsupportedOp(f"Resize: nearest_mode {mode!r}")
    return min(max(i, 0), n_in - 1)


def _cubic_weights(t, a):
    def w(d):
        d = abs(d)
        if d <= 1:
            return ((a + 2) * d - (a + 3)) * d * d + 1
        if d < 2:
            return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        return 0.0
    return [w(t + 1), w(t), w(1 - t), w(2 - t)]


def _antialias_taps(c: float, scale: float, n_in: int, mode: str, a: float, exclude: bool) -> list:
    """The (index, weight) taps of one output position when downsampling with antialias: the
    interpolation kernel stretched by 1/scale, normalised, over the nearest input positions."""
    i0 = math.floor(c)
    ratio = 1.0 if c == i0 else c - i0
    if mode == "linear":
        start = math.floor(-1 / scale) + 1
        ws = [min(max(1 - abs((i - ratio) * scale), 0.0), 1.0) for i in range(start, start + 2 - 2 * start)]
    else:
        def k(d):
            d = abs(d)
            if d <= 1:
                return ((a + 2) * d - (a + 3)) * d * d + 1
            return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a if d < 2 else 0.0
        start = math.floor(-2 / scale) + 1
        ws = [k(scale * (i - ratio)) for i in range(start, 2 - start)]
    tot = sum(ws)
    ws = [w / tot for w in ws]
    n = len(ws)
    pad = -(-n // 2)
    xp = c + pad
    p = math.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        off = -(n // 2) if frac == 0 else -(n // 2) + 1
    else:
        off = -((n - 1) // 2) + (0 if frac <= 0.5 else 1)
    idx = [p + off + j - pad for j in range(n)]
    if exclude:
        ws = [w if 0 <= i < n_in else 0.0 for i, w in zip(idx, ws)]
        tot = sum(ws) or 1.0
        ws = [w / tot for w in ws]
    return list(zip(idx, ws))


def resize(x: Tensor, out_shape, scales, mode: str = "nearest", coord_mode: str = "half_pixel",
           nearest_mode: str = "round_prefer_floor", cubic_a: float = -0.75, exclude_outside: bool = False,
           extrapolation_value: float = 0.0, roi=None, antialias: bool = False) -> Tensor:
    """ONNX Resize, one axis at a time: every output position reads a few input positions
    (computed in Python from the sizes) through ``take`` and mixes them with fixed weights."""
    nd = x.ndim
    if len(out_shape) != nd or any(n < 0 for n in out_shape):
        raise ShapeError(f"Resize: output shape {tuple(out_shape)} does not fit input {x.shape}")
    if x.device == "meta":  # shapes only (loading): skip the per-position tables
        return E.full(tuple(out_shape), 0, dtype=x.dtype, device="meta")
    y = x
    for ax in range(nd):
        n_in, n_out = x.shape[ax], out_shape[ax]
        scale = scales[ax]
        lo = roi[ax] if roi else 0.0
        hi = roi[ax + nd] if roi else 1.0
        if n_in == n_out and scale == 1.0 and coord_mode != "tf_crop_and_resize":
            continue
        coords = [_source_coord(coord_mode, o, scale, n_in, n_out, lo, hi) for o in range(n_out)]
        outside = [c < 0 or c > n_in - 1 for c in coords] if coord_mode == "tf_crop_and_resize" else None
        if mode == "nearest":
            idx = [_nearest(c, nearest_mode, n_in) for c in coords]
            y = E.take(y, _const(idx, _dt.int64, y), axis=ax)
        elif mode in ("linear", "cubic"):
            if antialias and scale < 1.0:
                taps = [_antialias_taps(c, scale, n_in, mode, cubic_a, exclude_outside) for c in coords]
            elif mode == "linear":
                taps = []
                for c in coords:
                    c = min(max(c, 0.0), n_in - 1.0) if coord_mode != "tf_crop_and_resize" else c
                    i0 = math.floor(c)
                    t = c - i0
                    taps.append([(i0, 1.0 - t), (i0 + 1, t)])
            else:
                taps = []
                for c in coords:
                    i0 = math.floor(c)
                    t = c - i0
                    ws = _cubic_weights(t, cubic_a)
                    pts = [(i0 - 1 + j, ws[j]) for j in range(4)]
                    if exclude_outside:
                        tot = sum(wt for i, wt in pts if 0 <= i < n_in)
                        pts = [(i, (wt / tot if tot else 0.0) if 0 <= i < n_in else 0.0) for i, wt in pts]
                    taps.append(pts)
            k = len(taps[0]) if taps else 0
            acc = None
            bshape = [1] * nd
            bshape[ax] = n_out
            for j in range(k):
                idx = [min(max(t[j][0], 0), n_in - 1) for t in taps]
                wts = [t[j][1] for t in taps]
                part = E.multiply(E.take(y, _const(idx, _dt.int64, y), axis=ax),
                                  E.reshape(_const(wts, y.dtype if y.dtype.kind == "f" else _dt.float32, y),
                                            tuple(bshape)))
                acc = part if acc is None else E.add(acc, part)
            y = acc.astype(x.dtype) if acc.dtype is not x.dtype else acc
        else:
            raise UnsupportedOp(f"Resize: mode {mode!r}")
        if outside is not None and any(outside):
            bshape = [1] * nd
            bshape[ax] = n_out
            m = E.reshape(_const(outside, _dt.bool_, y), tuple(bshape))
            y = E.where(m, float(extrapolation_value), y)
        # later axes read the already-resized tensor
    return y


# ---- einsum -------------------------------------------------------------------------------

def einsum(equation: str, *xs: Tensor) -> Tensor:
    """``einsum`` for the forms models use (batched matmuls, transposes, reductions, outer
    products): operands are contracted pairwise with ``matmul``. Repeated letters within one
    operand (diagonals) are not supported."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ShapeError(f"Einsum: equation {equation!r} has {len(terms)} operands, got {len(xs)}")
    letters = [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    used = set(eq)
    free = [c for c in letters if c not in used]
    ell = None
    subs = []
    for t, x in zip(terms, xs):
        if "..." in t:
            k = x.ndim - (len(t) - 3)
            if ell is None or len(ell) < k:
                ell = "".join(free[:k]) if ell is None or len(ell) < k else ell
            t = t.replace("...", ell[len(ell) - k:] if k else "")
        if len(t) != x.ndim:
            raise ShapeError(f"Einsum: term {t!r} does not match operand rank {x.ndim}")
        if len(set(t)) != len(t):
            raise UnsupportedOp(f"Einsum: repeated index within one operand ({equation!r})")
        subs.append(t)
    if rhs is None:
        counts = {}
        for t in subs:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = (ell or "") + "".join(sorted(c for c, n in counts.items() if n == 1 and (not ell or c not in ell)))
    else:
        rhs = rhs.replace("...", ell or "")
    ops = list(zip(subs, xs))
    # Sum out letters that appear in one operand only and not in the output.
    def reduce_private(i):
        s, x = ops[i]
        others = "".join(t for j, (t, _) in enumerate(ops) if j != i) + rhs
        drop = [k for k, c in enumerate(s) if c not in others]
        if drop:
            x = E.sum(x, axis=tuple(drop))
            s = "".join(c for c in s if c in others)
        ops[i] = (s, x)
    for i in range(len(ops)):
        reduce_private(i)
    while len(ops) > 1:
        (sa, a), (sb, b) = ops[0], ops[1]
        rest = "".join(t for t, _ in ops[2:]) + rhs
        batch = [c for c in sa if c in sb and c in rest]
        contract = [c for c in sa if c in sb and c not in rest]
        left = [c for c in sa if c not in sb]
        right = [c for c in sb if c not in sa]
        size = {}
        for s, x in ((sa, a), (sb, b)):
            for c, n in zip(s, x.shape):
                if size.get(c, 1) == 1:
                    size[c] = n
        a = _broadcast_dims(a, sa, size)
        b = _broadcast_dims(b, sb, size)
        pa = [sa.index(c) for c in batch + left + contract]
        pb = [sb.index(c) for c in batch + contract + right]
        a = E.permute_dims(a, tuple(pa)) if pa != list(range(len(pa))) else a
        b = E.permute_dims(b, tuple(pb)) if pb != list(range(len(pb))) else b
        nb = [size[c] for c in batch]
        a = E.reshape(a, tuple(nb) + (prod(size[c] for c in left), prod(size[c] for c in contract)))
        b = E.reshape(b, tuple(nb) + (prod(size[c] for c in contract), prod(size[c] for c in right)))
        y = E.matmul(a, b)
        y = E.reshape(y, tuple(nb) + tuple(size[c] for c in left) + tuple(size[c] for c in right))
        ops = [("".join(batch + left + right), y)] + ops[2:]
        reduce_private(0)
    s, y = ops[0]
    drop = [k for k, c in enumerate(s) if c not in rhs]
    if drop:
        y = E.sum(y, axis=tuple(drop))
        s = "".join(c for c in s if c in rhs)
    if set(s) != set(rhs):
        raise ShapeError(f"Einsum: output {rhs!r} names letters not in the inputs ({equation!r})")
    perm = [s.index(c) for c in rhs]
    if perm != list(range(len(perm))):
        y = E.permute_dims(y, tuple(perm))
    return y


def _broadcast_dims(x, s, size):
    want = tuple(size[c] for c in s)
    return x if tuple(x.shape) == want else E.broadcast_to(x, want)


# ---- attention (ONNX opset 23+) ----------------------------------------------------------------

def _heads(x: Tensor, n: int) -> Tensor:
    b, t, h = x.shape
    return E.permute_dims(E.reshape(x, (b, t, n, h // n)), (0, 2, 1, 3))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, past_key: Tensor | None = None,
              past_value: Tensor | None = None, nonpad: Tensor | None = None, *, scale: float | None = None,
              is_causal: bool = False, q_heads: int = 0, kv_heads: int = 0, softcap: float = 0.0,
              qk_output: int = -1, window=(-1, -1)) -> tuple:
    """ONNX Attention: ``softmax(q k^T * scale + bias) v`` with an optional KV cache
    (``past_key``/``past_value`` concatenated before ``k``/``v``), a bool or additive mask
    (padded to the key length), bottom-right aligned causal masking, grouped-query heads,
    softcap and sliding windows. 3-D inputs ``(B, S, H*D)`` use ``q_heads``/``kv_heads``.
    Returns ``(y, present_key, present_value, qk)`` where ``qk`` is the scores selected by
    ``qk_output`` (0/1: after softcap, 2: with the bias, 3: after softmax; -1: not needed)."""
    three = q.ndim == 3
    if three:
        q, k, v = _heads(q, q_heads), _heads(k, kv_heads), _heads(v, kv_heads)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    if past_key is not None:
        k = E.concat([past_key, k], axis=2)
        v = E.concat([past_value, v], axis=2)
    present_k, present_v = k, v
    L, S = q.shape[2], k.shape[2]
    dt = q.dtype
    bias = None
    if mask is not None and mask.shape[-1] < S:
        fill = False if mask.dtype is _dt.bool_ else -math.inf
        mask = E.pad(mask, ((0, 0),) * (mask.ndim - 1) + ((0, S - mask.shape[-1]),), value=fill)
    if mask is not None:
        bias = E.where(mask, 0.0, -math.inf).astype(dt) if mask.dtype is _dt.bool_ else mask
    rows = E.reshape(E.arange(L, dtype=_dt.int64, device=q.device), (L, 1))
    cols = E.reshape(E.arange(S, dtype=_dt.int64, device=q.device), (1, S))
    offset = None
    if past_key is not None:
        offset = past_key.shape[2]
    elif nonpad is not None:
        offset = E.reshape(E.subtract(nonpad.astype(_dt.int64), L), (-1, 1, 1, 1))  # per batch
    allowed = []
    if is_causal:
        allowed.append(E.less_equal(cols, E.add(rows, offset if offset is not None else 0)))
    left, right = window
    if left >= 0 or right >= 0:
        diff = E.subtract(E.add(rows, offset if offset is not None else 0), cols)
        if left >= 0:
            allowed.append(E.less_equal(diff, left))
        if right >= 0:
            allowed.append(E.less_equal(E.negative(diff), right))
    if nonpad is not None:
        allowed.append(E.less(E.reshape(cols, (1, 1, 1, S)), E.reshape(nonpad.astype(_dt.int64), (-1, 1, 1, 1))))
    for a in allowed:
        extra = E.where(a, 0.0, -math.inf).astype(dt)
        bias = extra if bias is None else E.add(bias, extra)
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        if hq % hk:
            raise ShapeError(f"Attention: {hq} query heads are not a multiple of {hk} key/value heads")
        rep = hq // hk
        b = k.shape[0]
        k = E.reshape(E.broadcast_to(E.reshape(k, (b, hk, 1, S, k.shape[3])), (b, hk, rep, S, k.shape[3])),
                      (b, hq, S, k.shape[3]))
        v = E.reshape(E.broadcast_to(E.reshape(v, (b, hk, 1, S, v.shape[3])), (b, hk, rep, S, v.shape[3])),
                      (b, hq, S, v.shape[3]))
    s = math.sqrt(scale)   # the reference scales both sides by sqrt(scale)
    kt = E.permute_dims(k, (0, 1, 3, 2))
    qk = E.matmul(E.multiply(q, s), E.multiply(kt, s))
    if softcap > 0:
        qk = E.multiply(E.tanh(E.divide(qk, softcap)), softcap)
    scores = qk if bias is None else E.add(qk, bias)
    m = E.max(scores, axis=-1, keepdims=True)
    dead = E.equal(m, -math.inf)
    e = E.exp(E.subtract(scores, E.where(dead, 0.0, m)))
    tot = E.sum(e, axis=-1, keepdims=True)
    p = E.divide(e, E.where(E.equal(tot, 0.0), 1.0, tot))
    if bias is not None:
        # rows whose bias masks every key give 0 (not a uniform average of -inf scores)
        p = E.where(E.equal(E.max(bias, axis=-1, keepdims=True), -math.inf), 0.0, p).astype(p.dtype)
    y = E.matmul(p.astype(dt), v)
    if three:
        y = E.reshape(E.permute_dims(y, (0, 2, 1, 3)), (y.shape[0], y.shape[2], -1))
    out = {0: qk, 1: qk, 2: scores, 3: p}.get(qk_output)
    return y, present_k, present_v, (out.astype(dt) if out is not None else None)


def nll_loss(x: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean",
             ignore_index: int | None = None) -> Tensor:
    """ONNX NegativeLogLikelihoodLoss: ``-x[n, target[n, ...], ...] * weight[target]``,
    summed or averaged (by the total weight of the targets not ignored)."""
    t = target.astype(_dt.int64)
    keep = None
    if ignore_index is not None:
        keep = E.not_equal(t, ignore_index)
        t = E.where(keep, t, 0)
    picked = E.take_along_axis(x, unsqueeze(t, [1]), axis=1)
    picked = squeeze(picked, [1])
    w = E.take(weight, E.reshape(t, (-1,)), axis=0) if weight is not None else None
    if w is not None:
        w = E.reshape(w, t.shape)
    if keep is not None:
        w = E.where(keep, w if w is not None else 1.0, 0.0).astype(x.dtype)
    loss = E.negative(picked if w is None else E.multiply(picked, w))
    if reduction == "none":
        return loss
    total = E.sum(loss)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise UnsupportedOp(f"NegativeLogLikelihoodLoss: reduction {reduction!r}")
    denom = E.sum(w) if w is not None else float(prod(t.shape))
    return E.divide(total, denom).astype(x.dtype)


def softmax_cross_entropy(x: Tensor, labels: Tensor, weight: Tensor | None = None, reduction: str = "mean",
                          ignore_index: int | None = None) -> tuple:
    """ONNX SoftmaxCrossEntropyLoss: ``nll_loss(log_softmax(x, axis=1), labels)``; also returns
    the log-probabilities."""
    logp = E.log_softmax(x, 1)
    return nll_loss(logp, labels, weight, reduction, ignore_index), logp


def lp_pool(x: Tensor, p: int, kernel, stride, pads, ceil_mode: bool = False) -> Tensor:
    """ONNX LpPool: ``(sum over the window of |x|^p) ^ (1/p)``, from an average pool of
    ``|x|^p`` (zero padding counted) times the window size."""
    a = E.pow(E.abs(x), float(p)) if p != 2 else E.multiply(x, x)
    n = prod(kernel)
    if x.ndim == 3:
        s = pool1d(E.avg_pool2d, a, kernel[0], stride[0], pads[0], ceil_mode=ceil_mode)
    elif any(max(pp) * 2 > kk for kk, pp in zip(kernel, pads)):
        s = pool_big_pads("avg", a, tuple(kernel), tuple(stride), tuple(pads), ceil_mode=ceil_mode,
                          count_include_pad=True)
    else:
        s = E.avg_pool2d(a, tuple(kernel), stride=tuple(stride), padding=tuple(tuple(q) for q in pads),
                         ceil_mode=ceil_mode)
    return E.pow(E.multiply(s, float(n)), 1.0 / p).astype(x.dtype)


def center_crop_pad(x: Tensor, shape, axes=None) -> Tensor:
    """ONNX CenterCropPad: crop (centred, extra element at the start kept) or zero-pad (extra
    at the end) each listed axis to ``shape``."""
    nd = x.ndim
    axes = list(range(nd)) if axes is None else [_norm_axis(a, nd, "CenterCropPad") for a in axes]
    width = [(0, 0)] * nd
    for a, n in zip(axes, shape):
        d = n - x.shape[a]
        if d >= 0:
            width[a] = (d // 2, d - d // 2)
        else:
            c = -d
            width[a] = (-(c // 2), -(c - c // 2))
    return E.pad(x, tuple(width))


def compress(x: Tensor, condition: Tensor, axis: int | None = None) -> Tensor:
    """ONNX Compress: the slices where ``condition`` is true (the count is data: it is read)."""
    cond = [bool(c) for c in int_list(condition.astype(_dt.int64))]
    if axis is None:
        x = E.reshape(x, (-1,))
        axis = 0
    axis = _norm_axis(axis, x.ndim, "Compress")
    if len(cond) > x.shape[axis]:
        raise ShapeError(f"Compress: condition has {len(cond)} entries for axis {axis} of size {x.shape[axis]}")
    idx = [i for i, c in enumerate(cond) if c]
    return E.take(x, _const(idx, _dt.int64, x), axis=axis) if idx else \
        E.zeros(x.shape[:axis] + (0,) + x.shape[axis + 1:], dtype=x.dtype, device=x.device)


def reverse_sequence(x: Tensor, lengths: Tensor, batch_axis: int = 1, time_axis: int = 0) -> Tensor:
    """ONNX ReverseSequence: reverse the first ``lengths[b]`` steps of each batch entry."""
    lens = int_list(lengths)
    t_n = x.shape[time_axis]
    nb = x.shape[batch_axis]
    # one gather along time per batch entry, done as a take_along_axis with a (T, B) index map
    idx = [[(lens[b] - 1 - t) if t < lens[b] else t for b in range(nb)] for t in range(t_n)]
    shape = [1] * x.ndim
    shape[time_axis], shape[batch_axis] = t_n, nb
    flat = [v for row in idx for v in row]
    order = (time_axis, batch_axis)
    im = _const(flat, _dt.int64, x)
    im = E.reshape(im, (t_n, nb))
    if order[0] > order[1]:
        im = E.permute_dims(im, (1, 0))
    im = E.broadcast_to(E.reshape(im, tuple(shape)), x.shape)
    return E.take_along_axis(x, im, axis=time_axis)


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, *,
                     interleaved: bool = False, num_heads: int = 0, rotary_dim: int = 0) -> Tensor:
    """ONNX RotaryEmbedding on ``(B, H, S, D)`` or ``(B, S, H*D)`` inputs: rotate the first
    ``rotary_dim`` features of each head by the cached angles (rotate-half or interleaved)."""
    three = x.ndim == 3
    if three:
        b, t, hid = x.shape
        n = num_heads if num_heads else None
        if not n:
            raise ShapeError("RotaryEmbedding: 3-D input needs num_heads")
        x4 = E.permute_dims(E.reshape(x, (b, t, n, hid // n)), (0, 2, 1, 3))
    else:
        x4 = x
    d = x4.shape[3]
    rd = rotary_dim or d
    if position_ids is not None:
        cos = E.take(cos, E.reshape(position_ids.astype(_dt.int64), (-1,)), axis=0)
        sin = E.take(sin, E.reshape(position_ids.astype(_dt.int64), (-1,)), axis=0)
        cos = E.reshape(cos, tuple(position_ids.shape) + (cos.shape[-1],))
        sin = E.reshape(sin, tuple(position_ids.shape) + (sin.shape[-1],))
    # cos/sin: (B, S, rd/2) -> (B, 1, S, rd/2)
    cos = E.reshape(cos, (cos.shape[0], 1, cos.shape[1], cos.shape[2])) if cos.ndim == 3 else cos
    sin = E.reshape(sin, (sin.shape[0], 1, sin.shape[1], sin.shape[2])) if sin.ndim == 3 else sin
    rot = x4[..., :rd]
    rest = x4[..., rd:] if rd < d else None
    half = rd // 2
    if interleaved:
        x1 = rot[..., 0::2]
        x2 = rot[..., 1::2]
    else:
        x1 = rot[..., :half]
        x2 = rot[..., half:]
    r1 = E.subtract(E.multiply(x1, cos), E.multiply(x2, sin))
    r2 = E.add(E.multiply(x2, cos), E.multiply(x1, sin))
    if interleaved:
        out = E.reshape(E.stack([r1, r2], axis=-1), r1.shape[:-1] + (rd,))
    else:
        out = E.concat([r1, r2], axis=-1)
    if rest is not None:
        out = E.concat([out, rest], axis=-1)
    if three:
        out = E.reshape(E.permute_dims(out, (0, 2, 1, 3)), x.shape)
    return out.astype(x.dtype)


def nonzero(x: Tensor) -> Tensor:
    """ONNX NonZero: the ``(ndim, count)`` int64 coordinates of the non-zero elements, in
    row-major order. The output size depends on the data, so the values are read back."""
    v = x.tolist()
    flat = []

    def walk(a, prefix):
        if isinstance(a, list):
            for i, b in enumerate(a):
                walk(b, prefix + (i,))
        elif a:
            flat.append(prefix)
    walk(v, ())
    rows = [[p[d] for p in flat] for d in range(x.ndim)] if x.ndim else [[0] * len(flat)]
    if not flat:
        return E.zeros((max(x.ndim, 1), 0), dtype=_dt.int64, device=x.device)
    return E.tensor(rows, dtype=_dt.int64, device=x.device)


# ---- inverse trigonometry (no ember primitive: argument halving + a short series) ----------

def atan(x: Tensor) -> Tensor:
    """arctan: |x| > 1 folds to pi/2 - atan(1/|x|); two halvings t -> t / (1 + sqrt(1 + t^2))
    bring |t| below tan(pi/16) ~ 0.2, where the odd series to t^15 is exact in float32."""
    a = E.abs(x)
    inv = E.greater(a, 1.0)
    t = E.where(inv, E.divide(1.0, a), a)
    for _ in range(2):
        t = E.divide(t, E.add(E.sqrt(E.add(E.multiply(t, t), 1.0)), 1.0))
    t2 = E.multiply(t, t)
    acc = None
    for k in range(7, -1, -1):            # sum_{k} (-1)^k t^(2k+1) / (2k+1), Horner in t^2
        c = (-1.0) ** k / (2 * k + 1)
        acc = E.full((), c, dtype=t.dtype, device=t.device) if acc is None else E.add(E.multiply(acc, t2), c)
    r = E.multiply(E.multiply(acc, t), 4.0)
    r = E.where(inv, E.subtract(math.pi / 2, r), r)
    return E.where(E.less(x, 0.0), E.negative(r), r).astype(x.dtype)


def asin(x: Tensor) -> Tensor:
    """arcsin(x) = atan(x / sqrt(1 - x^2)) (x = +-1 gives +-pi/2 through atan(+-inf))."""
    return atan(E.divide(x, E.sqrt(E.subtract(1.0, E.multiply(x, x)))))


def acos(x: Tensor) -> Tensor:
    return E.subtract(math.pi / 2, asin(x)).astype(x.dtype)


# ---- data-dependent outputs (values are read back) ----------------------------------------

def unique(x: Tensor, axis: int | None = None, sorted_: bool = True) -> tuple:
    """ONNX Unique: unique values (or slices along ``axis``), first-occurrence indices, inverse
    indices and counts. The output size depends on the data, so the values are read."""
    if axis is None:
        items = [(v,) for v in flat_values(x)]
    else:
        axis = _norm_axis(axis, x.ndim, "Unique")
        moved = E.permute_dims(x, (axis,) + tuple(i for i in range(x.ndim) if i != axis))
        n = x.shape[axis]
        vals = flat_values(moved)
        k = len(vals) // n if n else 0
        items = [tuple(vals[i * k:(i + 1) * k]) for i in range(n)]
    first = {}
    order = []
    for i, it in enumerate(items):
        if it not in first:
            first[it] = i
            order.append(it)
    if sorted_:
        order.sort()
    pos = {it: j for j, it in enumerate(order)}
    inverse = [pos[it] for it in items]
    counts = [0] * len(order)
    for j in inverse:
        counts[j] += 1
    idx = [first[it] for it in order]
    i64 = _dt.int64
    dev = x.device
    if axis is None:
        y = E.tensor([it[0] for it in order], dtype=x.dtype, device=dev) if order else \
            E.zeros((0,), dtype=x.dtype, device=dev)
    else:
        y = E.take(x, E.tensor(idx, dtype=i64, device=dev), axis=axis)
    t = (lambda v: E.tensor(v, dtype=i64, device=dev) if v else E.zeros((0,), dtype=i64, device=dev))
    return y, t(idx), t(inverse), t(counts)


# ---- grid sample ---------------------------------------------------------------------------

def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
    rng = hi - lo
    if rng <= 0:
        return E.full(v.shape, lo, dtype=v.dtype, device=v.device)
    below, above = E.less(v, lo), E.greater(v, hi)
    dx = E.where(below, E.subtract(lo, v), E.where(above, E.subtract(v, hi), 0.0))
    n = E.floor(E.divide(dx, rng))
    r = E.subtract(dx, E.multiply(n, rng))
    even = E.equal(E.remainder(n, 2.0), 0.0)
    from_lo = E.where(even, E.add(lo, r), E.subtract(hi, r))
    from_hi = E.where(even, E.subtract(hi, r), E.add(lo, r))
    return E.where(below, from_lo, E.where(above, from_hi, v))


def _keys(t: Tensor, a: float = -0.75) -> list:
    """Keys cubic weights of the taps at offsets -1, 0, 1, 2 for fractions ``t``."""
    def w_near(d):      # |d| <= 1
        return E.add(E.multiply(E.multiply(E.subtract(E.multiply(d, a + 2), a + 3), d), d), 1.0)

    def w_far(d):       # 1 < |d| < 2
        return E.subtract(E.multiply(E.add(E.multiply(E.subtract(E.multiply(d, a), 5 * a), d), 8 * a), d), 4 * a)
    return [w_far(E.add(t, 1.0)), w_near(t), w_near(E.subtract(1.0, t)), w_far(E.subtract(2.0, t))]


def grid_sample(x: Tensor, grid: Tensor, mode: str = "linear", padding_mode: str = "zeros",
                align_corners: bool = False) -> Tensor:
    """ONNX GridSample over N-D spatial inputs: every output point reads the input at the
    grid's (normalised) coordinates, by nearest, (multi)linear or cubic interpolation; out of
    range points follow ``padding_mode`` (zeros, border, reflection). All tensor ops: the taps'
    flat indices are computed on the device and gathered with ``take_along_axis``."""
    n, ch = x.shape[:2]
    sp = x.shape[2:]
    nd = len(sp)
    out_sp = grid.shape[1:-1]
    p = prod(out_sp)
    g = E.reshape(grid.astype(_dt.float32), (n, p, nd))
    coords = []
    for d in range(nd):
        c = E.reshape(g[:, :, nd - 1 - d], (n, p))
        size = sp[d]
        c = E.multiply(E.add(c, 1.0), (size - 1) / 2.0) if align_corners else \
            E.divide(E.subtract(E.multiply(E.add(c, 1.0), float(size)), 1.0), 2.0)
        if mode == "nearest":
            c = E.round(c)
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if padding_mode == "border":
            c = E.clip(c, 0.0, size - 1.0)
        elif padding_mode == "reflection":
            c = _reflect(c, lo, hi)
        coords.append((c, size, lo, hi))
    taps_per_dim = []
    for c, size, lo, hi in coords:
        if mode == "nearest":
            taps_per_dim.append([(c, None)])
            continue
        f = E.floor(c)
        t = E.subtract(c, f)
        if mode == "linear":
            taps_per_dim.append([(f, E.subtract(1.0, t)), (E.add(f, 1.0), t)])
        elif mode == "cubic":
            ws = _keys(t)
            taps_per_dim.append([(E.add(f, float(k - 1)), ws[k]) for k in range(4)])
        else:
            raise UnsupportedOp(f"GridSample: mode {mode!r}")
    data = E.reshape(x, (n, ch, prod(sp)))
    out = None

    def combos(d):
        if d == nd:
            yield []
            return
        for tap in taps_per_dim[d]:
            for rest in combos(d + 1):
                yield [tap] + rest
    for combo in combos(0):
        flat = None
        weight = None
        valid = None
        stride = 1
        for d in range(nd - 1, -1, -1):
            pos, w = combo[d]
            size, lo, hi = coords[d][1], coords[d][2], coords[d][3]
            if padding_mode == "reflection":
                pos = _reflect(pos, lo, hi)
            i = pos.astype(_dt.int64)          # truncation toward zero, like the reference's int()
            if padding_mode == "zeros":
                ok = E.logical_and(E.greater_equal(i, 0), E.less(i, size))
                valid = ok if valid is None else E.logical_and(valid, ok)
            i = E.clip(i, 0, size - 1)
            term = E.multiply(i, stride)
            flat = term if flat is None else E.add(flat, term)
            if w is not None:
                weight = w if weight is None else E.multiply(weight, w)
            stride *= size
        if valid is not None:
            weight = E.where(valid, weight if weight is not None else 1.0, 0.0)
        idx = E.broadcast_to(E.reshape(flat, (n, 1, p)), (n, ch, p))
        vals = E.take_along_axis(data, idx, axis=2)
        if weight is not None:
            vals = E.multiply(vals, E.reshape(weight.astype(x.dtype) if x.dtype.kind == "f" else weight, (n, 1, p)))
        out = vals if out is None else E.add(out, vals)
    return E.reshape(out, (n, ch) + tuple(out_sp)).astype(x.dtype)


# ---- recurrent layers --------------------------------------------------------------------------

def _act(name: str, alpha, beta):
    name = name.lower()
    table = {
        "sigmoid": E.sigmoid, "tanh": E.tanh, "relu": E.relu, "softsign": softsign, "softplus": softplus,
        "leakyrelu": lambda v: E.leaky_relu(v, 0.01 if alpha is None else alpha),
        "thresholdedrelu": lambda v: thresholded_relu(v, 1.0 if alpha is None else alpha),
        "hardsigmoid": lambda v: hard_sigmoid(v, 0.2 if alpha is None else alpha, 0.5 if beta is None else beta),
        "elu": lambda v: elu(v, 1.0 if alpha is None else alpha),
        "affine": lambda v: E.add(E.multiply(v, 1.0 if alpha is None else alpha), 0.0 if beta is None else beta),
        "scaledtanh": lambda v: E.multiply(E.tanh(E.multiply(v, 1.0 if beta is None else beta)),
                                           1.0 if alpha is None else alpha),
    }
    fn = table.get(name)
    if fn is None:
        raise UnsupportedOp(f"recurrent activation {name!r}")
    return fn


def rnn(kind: str, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None, seq_lens: Tensor | None,
        h0: Tensor | None, c0: Tensor | None = None, peep: Tensor | None = None, *, hidden: int,
        direction: str = "forward", activations=(), clip: float | None = None, linear_before_reset: bool = False,
        input_forget: bool = False, layout: int = 0) -> tuple:
    """ONNX RNN / GRU / LSTM (``kind``), unrolled over time with ember matmuls. Returns
    ``(Y, Y_h)`` or, for LSTM, ``(Y, Y_h, Y_c)`` in the ONNX layouts."""
    if layout:
        x = E.permute_dims(x, (1, 0, 2))
        h0 = None if h0 is None else E.permute_dims(h0, (1, 0, 2))
        c0 = None if c0 is None else E.permute_dims(c0, (1, 0, 2))
    seq, batch, _ = x.shape
    ndir = 2 if direction == "bidirectional" else 1
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    lens = None
    if seq_lens is not None:
        lens = int_list(seq_lens)
        if all(v == seq for v in lens):
            lens = None
    dt = x.dtype
    acts = list(activations)
    per_dir = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
    ys, hs, cs = [], [], []
    for d in range(ndir):
        f_acts = acts[d * per_dir:(d + 1) * per_dir]
        wd = E.reshape(w[d:d + 1], (gates * hidden, -1))
        rd = E.reshape(r[d:d + 1], (gates * hidden, hidden))
        xw = E.matmul(x, E.permute_dims(wd, (1, 0)))                     # (seq, batch, G*H)
        if b is not None:
            bd = E.reshape(b[d:d + 1], (2 * gates * hidden,))
            wb, rb = bd[:gates * hidden], bd[gates * hidden:]
            xw = E.add(xw, wb)
        else:
            rb = None
        h = E.zeros((batch, hidden), dtype=dt, device=x.device) if h0 is None else E.reshape(h0[d:d + 1], (batch, hidden))
        cst = None
        if kind == "LSTM":
            cst = E.zeros((batch, hidden), dtype=dt, device=x.device) if c0 is None else \
                E.reshape(c0[d:d + 1], (batch, hidden))
            pd = None if peep is None else E.reshape(peep[d:d + 1], (3, hidden))
        reverse = direction == "reverse" or d == 1
        if reverse and lens is not None:
            raise UnsupportedOp("reverse recurrent direction with per-batch sequence_lens")
        rt_w = E.permute_dims(rd, (1, 0))
        steps = range(seq - 1, -1, -1) if reverse else range(seq)
        outs = [None] * seq
        for t in steps:
            pre = xw[t]                                                     # (batch, G*H)
            def lin(k, hv=None):
                part = E.matmul(h if hv is None else hv, rt_w[:, k * hidden:(k + 1) * hidden])
                if rb is not None:
                    part = E.add(part, rb[k * hidden:(k + 1) * hidden])
                return part

            def cl(v):
                return E.clip(v, -clip, clip) if clip is not None else v

            def gx(k):
                return pre[:, k * hidden:(k + 1) * hidden]
            if kind == "RNN":
                h_new = f_acts[0](cl(E.add(gx(0), lin(0))))
            elif kind == "GRU":
                z = f_acts[0](cl(E.add(gx(0), lin(0))))
                rr = f_acts[0](cl(E.add(gx(1), lin(1))))
                if linear_before_reset:
                    hh = f_acts[1](cl(E.add(gx(2), E.multiply(rr, lin(2)))))
                else:
                    hh = f_acts[1](cl(E.add(gx(2), lin(2, E.multiply(rr, h)))))
                h_new = E.add(E.multiply(E.subtract(1.0, z), hh), E.multiply(z, h))
            else:
                i_pre = E.add(gx(0), lin(0))
                o_pre = E.add(gx(1), lin(1))
                f_pre = E.add(gx(2), lin(2))
                c_pre = E.add(gx(3), lin(3))
                if pd is not None:
                    i_pre = E.add(i_pre, E.multiply(pd[0], cst))
                    f_pre = E.add(f_pre, E.multiply(pd[2], cst))
                ig = f_acts[0](cl(i_pre))
                fg = E.subtract(1.0, ig) if input_forget else f_acts[0](cl(f_pre))
                cg = f_acts[1](cl(c_pre))
                c_new = E.add(E.multiply(fg, cst), E.multiply(ig, cg))
                if pd is not None:
                    o_pre = E.add(o_pre, E.multiply(pd[1], c_new))
                og = f_acts[0](cl(o_pre))
                h_new = E.multiply(og, f_acts[2](c_new))
                if lens is not None:
                    m = E.reshape(E.tensor([t < v for v in lens], dtype=_dt.bool_, device=x.device), (batch, 1))
                    c_new = E.where(m, c_new, cst)
                cst = c_new
            if lens is not None:
                m = E.reshape(E.tensor([t < v for v in lens], dtype=_dt.bool_, device=x.device), (batch, 1))
                outs[t] = E.where(m, h_new, 0.0).astype(dt)
                h = E.where(m, h_new, h).astype(dt)
            else:
                outs[t] = h_new
                h = h_new
        ys.append(E.stack(outs, axis=0))                                    # (seq, batch, H)
        hs.append(h)
        cs.append(cst)
    y = E.stack(ys, axis=1)                                                 # (seq, ndir, batch, H)
    yh = E.stack(hs, axis=0)                                                # (ndir, batch, H)
    yc = E.stack(cs, axis=0) if kind == "LSTM" else None
    if layout:
        y = E.permute_dims(y, (2, 0, 1, 3))
        yh = E.permute_dims(yh, (1, 0, 2))
        yc = None if yc is None else E.permute_dims(yc, (1, 0, 2))
    return (y, yh, yc) if kind == "LSTM" else (y, yh)


def cumprod(x: Tensor, axis: int, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """Cumulative product along ``axis`` in log2(n) steps (each multiplies by a copy shifted
    by 1, 2, 4... with ones shifted in)."""
    axis = _norm_axis(axis, x.ndim, "CumProd")
    n = x.shape[axis]
    y = E.flip(x, axis=axis) if reverse else x

    def shifted(t, k):
        width = [(0, 0)] * t.ndim
        width[axis] = (k, -k)            # k ones in front, k elements cropped at the end
        one = True if t.dtype is _dt.bool_ else 1
        return E.pad(t, tuple(width), value=one)
    if exclusive and n:
        y = shifted(y, 1)
    k = 1
    while k < n:
        y = E.multiply(y, shifted(y, k))
        k *= 2
    return E.flip(y, axis=axis) if reverse else y


def affine_grid(theta: Tensor, size, align_corners: bool = False) -> Tensor:
    """ONNX AffineGrid: the sampling grid ``theta @ [x, y(, z), 1]`` over a normalised
    ``[-1, 1]`` base grid of the spatial ``size`` (for GridSample)."""
    n, sp = size[0], list(size[2:])
    nd = len(sp)

    def axis_coords(m):
        if align_corners:
            return [(-1.0 + 2.0 * i / (m - 1)) if m > 1 else 0.0 for i in range(m)]
        return [(2.0 * i + 1.0) / m - 1.0 for i in range(m)]
    coords = [axis_coords(m) for m in sp]          # per spatial dim, outermost first
    rows = []

    def walk(d, pre):
        if d == nd:
            rows.append(list(reversed(pre)) + [1.0])   # (x, y, z...) is innermost first
            return
        for v in coords[d]:
            walk(d + 1, pre + [v])
    walk(0, [])
    base = E.tensor(rows, dtype=theta.dtype, device=theta.device)                  # (P, nd+1)
    grid = E.matmul(base, E.permute_dims(theta, (0, 2, 1)))                        # (N, P, nd)
    return E.reshape(grid, (n,) + tuple(sp) + (nd,))


# ---- quantization and onnxruntime's fused ops (own modules; here so generated code finds them) --

from .contrib import (bias_gelu, embed_layer_norm, fast_gelu, fused_matmul, ms_attention,  # noqa: E402,F401
                      quick_gelu, skip_layer_norm, skip_simplified_layer_norm)
from .quant import (conv_integer, dequantize_linear, dynamic_quantize_linear, matmul_integer,  # noqa: E402,F401
                    qgemm, qlinear_binary, qlinear_conv, qlinear_matmul, quantize_linear, wrap_int)
