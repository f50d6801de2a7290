"""Reductions, softmax and the norms of the wasm backend (``kernels/reduce.c``, ``kernels/norm.c``),
merged into the ``ops_elementwise`` family's table.

Every kernel sees its input as an (outer, r, inner) float32 layout: the reduced axes, after
size-1 axes are dropped, must be adjacent (then they merge into r); otherwise the input is first
permuted so that they are innermost (one strided copy, ``ops_layout``). Other dtypes run the
python backend's kernels.
"""
from __future__ import annotations

from array import array
from math import prod

from .. import dtypes as _dt
from ..backends import python as _py
from .ops_layout import make_gather
from .fallback import PY
from .runtime import R, W

F32, F16 = _dt.float32, _dt.float16
_ZF = array("f", [0.0])
_ZQ = array("q", [0])


def reduce_layout(shape, axes):
    """(outer, r, inner) when the reduced axes (size-1 axes aside) are adjacent, else None."""
    first = last = -1
    for i, m in enumerate(shape):
        if m != 1 and i in axes:
            if first < 0:
                first = i
            elif any(shape[j] != 1 and j not in axes for j in range(last + 1, i)):
                return None
            last = i
    if first < 0:
        return prod(shape), 1, 1
    return prod(shape[:first]), prod(shape[first:last + 1]), prod(shape[last + 1:])


def axis_layout(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def kernels(rt) -> dict:
    call = rt.call
    gather = make_gather(rt)
    table = {}

    layouts = {}

    def layout(x, axes):
        """(buffer, outer, r, inner) with the reduced axes adjacent (a permuted copy if needed)."""
        shape = x.shape
        key = (shape, axes)
        lay = layouts.get(key, False)
        if lay is False:
            if len(layouts) >= 512:
                layouts.clear()
            lay = layouts[key] = reduce_layout(shape, axes)
        if lay is not None:
            return (x._buf,) + lay
        keep = [a for a in range(len(shape)) if a not in axes]
        perm = keep + list(axes)
        st = _py.contiguous_strides(shape)
        buf = gather(x._buf, [shape[a] for a in perm], [st[a] for a in perm])
        return buf, prod(shape[a] for a in keep), prod(shape[a] for a in axes), 1

    def reduction(name, fn, empty, half):
        py = PY[name]

        def kernel(out, x, *, axes, keepdims=False, **kw):
            dt = x.dtype
            if (dt is not F32 and not (half and dt is F16)) or out.dtype is not dt:
                return py(out, x, axes=axes, keepdims=keepdims, **kw)
            buf, outer, r, inner = layout(x, axes)
            m = outer * inner
            if r == 0 or m == 0:   # sum -> 0, prod -> 1 (max/min of nothing is refused by the shape rule)
                return array("f", [empty]) * m
            y = _ZF * m
            call(fn, R(buf, outer * r * inner), W(y, m), outer, r, inner)
            return y
        kernel.__name__ = name
        return kernel

    # max/min of float16 values (stored as float32) are float16 values: exact, so they run too
    for name, fn, empty, half in (("sum", "sum_f32", 0.0, False), ("prod", "prod_f32", 1.0, False),
                                  ("max", "max_f32", 0.0, True), ("min", "min_f32", 0.0, True)):
        table[name] = reduction(name, fn, empty, half)

    def argreduction(name, fn):
        py = PY[name]

        def kernel(out, x, *, axis, keepdims=False, **kw):
            if x.dtype is not F32 and x.dtype is not F16:   # comparisons are exact on halves too
                return py(out, x, axis=axis, keepdims=keepdims, **kw)
            outer, r, inner = axis_layout(x.shape, axis)
            m = outer * inner
            y = _ZQ * m
            if m:
                call(fn, R(x._buf, outer * r * inner), W(y, m), outer, r, inner)
            return y
        kernel.__name__ = name
        return kernel

    table["argmax"] = argreduction("argmax", "argmax_f32")
    table["argmin"] = argreduction("argmin", "argmin_f32")

    def softmax_kernel(name, lg):
        py = PY[name]

        def kernel(out, x, *, axis):
            if x.dtype is not F32:
                return py(out, x, axis=axis)
            buf = x._buf
            n = len(buf)
            y = _ZF * n
            if n:
                outer, r, inner = axis_layout(x.shape, axis) if x.shape else (1, 1, 1)
                call("softmax_f32", R(buf, n), W(y, n), outer, r, inner, lg)
            return y
        kernel.__name__ = name
        return kernel

    table["softmax"] = softmax_kernel("softmax", 0)
    table["log_softmax"] = softmax_kernel("log_softmax", 1)

    py_cumsum = PY["cumsum"]

    def cumsum(out, x, *, axis, exclusive, reverse):
        if x.dtype is not F32:
            return py_cumsum(out, x, axis=axis, exclusive=exclusive, reverse=reverse)
        buf = x._buf
        n = len(buf)
        y = _ZF * n
        if n:
            outer, r, inner = axis_layout(x.shape, axis) if x.shape else (1, 1, 1)
            call("cumsum_f32", R(buf, n), W(y, n), outer, r, inner, int(bool(exclusive)), int(bool(reverse)))
        return y
    table["cumsum"] = cumsum

    py_ln = PY["layer_norm"]

    def layer_norm(out, x, weight, bias, *, normalized_shape, eps):
        if x.dtype is not F32 or weight.dtype is not F32 or bias.dtype is not F32:
            return py_ln(out, x, weight, bias, normalized_shape=normalized_shape, eps=eps)
        buf = x._buf
        n = len(buf)
        m = len(weight._buf)
        y = _ZF * n
        if n and m:
            call("layer_norm_f32", R(buf, n), R(weight._buf, m), R(bias._buf, m), W(y, n), n // m, m, eps)
        return y
    table["layer_norm"] = layer_norm

    py_bn = PY["batch_norm"]

    def batch_norm(out, x, mean, var, weight, bias, *, eps):
        if any(t.dtype is not F32 for t in (x, mean, var, weight, bias)):
            return py_bn(out, x, mean, var, weight, bias, eps=eps)
        buf = x._buf
        n = len(buf)
        c = x.shape[1]
        y = _ZF * n
        if n:
            s = prod(x.shape[2:])
            call("batch_norm_f32", R(buf, n), R(mean._buf, c), R(var._buf, c), R(weight._buf, c), R(bias._buf, c),
                 W(y, n), x.shape[0], c, s, eps)
        return y
    table["batch_norm"] = batch_norm
    return table
