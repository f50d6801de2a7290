"""Elementwise kernels of the wasm backend (``kernels/elementwise.c``, math in ``kernels/mathf.h``):
the float32 unary ops and activations, broadcasting binary ops and comparisons, ``where``; the
reductions and norms come from ``ops_reduce`` and are merged into this family's table.

Each kernel takes the SIMD path for float32 and hands every other dtype to the python backend's
kernel on the same buffers. Ops whose results are exact in any float format (negative, abs,
floor, ceil, round, sign, relu, maximum, minimum, comparisons, isnan, where) also take float16,
which this backend stores as float32 values that are already rounded to half.

Binary ops pick one of four entry points: same shapes (``*_vv``), a one-element operand passed as
a number (``*_vs`` / ``*_sv``), else a strided walk (``*_bc``) over the broadcast shape after
merging axes, described by an int32 array cached per shape pair. The common model patterns
(bias along the last axis, per-channel scale on an inner axis, row statistics) have a
contiguous or splatted innermost row there, which runs as SIMD.
"""
from __future__ import annotations

import importlib
import math
from array import array
from math import prod

from .. import dtypes as _dt
from ..registry import OPS
from ..backends import python as _py
from .fallback import PY
from .runtime import R, W

F32, F16, I32, BOOL = _dt.float32, _dt.float16, _dt.int32, _dt.bool_
RANK = 6
_ZF = array("f", [0.0])
_ZB = array("B", [0])

# op name: (kernel, float16 too: the result is exact in half precision)
UNARY = {
    "negative": ("negative_f32", True), "abs": ("abs_f32", True), "sqrt": ("sqrt_f32", False),
    "floor": ("floor_f32", True), "ceil": ("ceil_f32", True), "round": ("round_f32", True),
    "sign": ("sign_f32", True), "exp": ("exp_f32", False), "log": ("log_f32", False),
    "tanh": ("tanh_f32", False), "erf": ("erf_f32", False), "relu": ("relu_f32", True),
    "sigmoid": ("sigmoid_f32", False), "silu": ("silu_f32", False),
}
TRIG = {"sin": ("sin_f32", math.sin), "cos": ("cos_f32", math.cos)}
# op name: (kernel prefix, float16 too, writes bool)
BINARY = {
    "add": ("add_f32", False, False), "subtract": ("subtract_f32", False, False),
    "multiply": ("multiply_f32", False, False), "divide": ("divide_f32", False, False),
    "maximum": ("maximum_f32", True, False), "minimum": ("minimum_f32", True, False),
    "pow": ("pow_f32", False, False),
    "equal": ("equal_f32", True, True), "not_equal": ("not_equal_f32", True, True),
    "less": ("less_f32", True, True), "less_equal": ("less_equal_f32", True, True),
}
TRIG_LIMIT = 1048576.0   # |x| from which sin/cos are redone in Python (see mathf.h)

_DESC: dict = {}


def broadcast_desc(shapes, out_shape):
    """int32 array: the merged broadcast shape (``RANK`` axes, size-1 axes in front) followed by
    each input's element strides over it; None when more than ``RANK`` axes remain. Cached."""
    key = (shapes, out_shape)
    d = _DESC.get(key)
    if d is None:
        strides = [_py.broadcast_strides(s, out_shape) for s in shapes]
        dims = [(m, [st[i] for st in strides]) for i, m in enumerate(out_shape) if m != 1]
        merged = []
        for m, st in reversed(dims):   # merge an axis into its inner neighbour when every stride spans it
            if merged:
                im, ist = merged[-1]
                if all(s == t * im for s, t in zip(st, ist)):
                    merged[-1] = (m * im, ist)
                    continue
            merged.append((m, st))
        merged.reverse()
        if len(merged) > RANK:
            d = False
        else:
            pad = RANK - len(merged)
            vals = [1] * pad + [m for m, _ in merged]
            for k in range(len(shapes)):
                vals += [0] * pad + [st[k] for _, st in merged]
            d = array("i", vals)
        if len(_DESC) >= 1024:
            _DESC.clear()
        _DESC[key] = d
    return d or None


def kernels(rt) -> dict:
    call = rt.call
    table = {}

    def unary(name, fn, half):
        py = PY[name]

        def kernel(out, x):
            dt = x.dtype
            if dt is not F32 and not (half and dt is F16):
                return py(out, x)
            buf = x._buf
            n = len(buf)
            y = _ZF * n
            if n:
                call(fn, R(buf, n), W(y, n), n)
            return y
        kernel.__name__ = name
        return kernel

    for name, (fn, half) in UNARY.items():
        table[name] = unary(name, fn, half)

    def trig(name, fn, exact):
        py = PY[name]

        def kernel(out, x):
            if x.dtype is not F32:
                return py(out, x)
            buf = x._buf
            n = len(buf)
            y = _ZF * n
            left = call(fn, R(buf, n), W(y, n), n) if n else 0
            if left:   # |x| >= 2^20: Python's libm reduces by pi/2 with every bit it needs
                for i, v in enumerate(buf):
                    if TRIG_LIMIT <= abs(v) < math.inf:
                        y[i] = exact(v)
                        left -= 1
                        if not left:
                            break
            return y
        kernel.__name__ = name
        return kernel

    for name, (fn, exact) in TRIG.items():
        table[name] = trig(name, fn, exact)

    py_isnan = PY["isnan"]

    def isnan(out, x):
        if x.dtype is not F32 and x.dtype is not F16:
            return py_isnan(out, x)
        buf = x._buf
        n = len(buf)
        y = _ZB * n
        if n:
            call("isnan_f32", R(buf, n), W(y, n), n)
        return y
    table["isnan"] = isnan

    py_leaky = PY["leaky_relu"]

    def leaky_relu(out, x, *, negative_slope):
        if x.dtype is not F32:
            return py_leaky(out, x, negative_slope=negative_slope)
        buf = x._buf
        n = len(buf)
        y = _ZF * n
        if n:
            call("leaky_relu_f32", R(buf, n), W(y, n), n, negative_slope)
        return y
    table["leaky_relu"] = leaky_relu

    py_gelu = PY["gelu"]

    def gelu(out, x, *, approximate):
        if x.dtype is not F32:
            return py_gelu(out, x, approximate=approximate)
        buf = x._buf
        n = len(buf)
        y = _ZF * n
        if n:
            call("gelu_tanh_f32" if approximate == "tanh" else "gelu_f32", R(buf, n), W(y, n), n)
        return y
    table["gelu"] = gelu

    clip_decompose = OPS["clip"].decompose

    def clip(out, x, *, min=None, max=None):  # noqa: A002
        # float32 with number bounds (rounded to float32 as the decomposition's maximum/minimum
        # would); other dtypes, and float16 (bounds round to half there), decompose
        if (x.dtype is not F32 or (min is not None and not isinstance(min, (int, float)))
                or (max is not None and not isinstance(max, (int, float)))):
            return clip_decompose(x, min=min, max=max)._buf
        buf = x._buf
        n = len(buf)
        y = _ZF * n
        if n:
            call("clip_f32", R(buf, n), W(y, n), n, -math.inf if min is None else float(min),
                 math.inf if max is None else float(max))
        return y
    table["clip"] = clip

    def binary(name, prefix, half, to_bool):
        py = PY[name]
        vv, vs, sv, bc = prefix + "_vv", prefix + "_vs", prefix + "_sv", prefix + "_bc"
        zero = _ZB if to_bool else _ZF
        square = name == "pow"

        def kernel(out, a, b):
            dt = a.dtype
            if dt is not F32 and not (half and dt is F16):
                return py(out, a, b)
            A, B = a._buf, b._buf
            sa, sb = a.shape, b.shape
            if sa == sb:
                n = len(A)
                y = zero * n
                if n:
                    call(vv, R(A, n), R(B, n), W(y, n), n)
                return y
            nb = len(B)
            if nb == 1:   # out has a's size
                n = len(A)
                y = zero * n
                if n:
                    if square and B[0] == 2.0:   # x ** 2: one product, rounded once like pow
                        call("multiply_f32_vv", R(A, n), R(A, n), W(y, n), n)
                    else:
                        call(vs, R(A, n), B[0], W(y, n), n)
                return y
            na = len(A)
            if na == 1:
                y = zero * nb
                if nb:
                    call(sv, A[0], R(B, nb), W(y, nb), nb)
                return y
            so = out.shape
            n = prod(so)
            y = zero * n
            if n:
                d = broadcast_desc((sa, sb), so)
                if d is None:
                    return py(out, a, b)
                call(bc, R(A, na), R(B, nb), W(y, n), R(d, 3 * RANK))
            return y
        kernel.__name__ = name
        return kernel

    for name, (prefix, half, to_bool) in BINARY.items():
        table[name] = binary(name, prefix, half, to_bool)

    py_where = PY["where"]

    def where(out, c, x, y):
        dt = out.dtype
        if dt is not F32 and dt is not F16 and dt is not I32:
            return py_where(out, c, x, y)
        C, X, Y = c._buf, x._buf, y._buf
        so = out.shape
        n = prod(so)
        res = (_ZF if dt is not I32 else array("i", [0])) * n
        if not n:
            return res
        if c.shape == so and x.shape == so and y.shape == so:
            call("where_vvv", R(C, n), R(X, n), R(Y, n), W(res, n), n)
            return res
        d = broadcast_desc((c.shape, x.shape, y.shape), so)
        if d is None:
            return py_where(out, c, x, y)
        call("where_bc", R(C, len(C)), R(X, len(X)), R(Y, len(Y)), W(res, n), R(d, 4 * RANK))
        return res
    table["where"] = where

    try:
        reduce_family = importlib.import_module(f"{__package__}.ops_reduce")
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.ops_reduce":
            raise
    else:
        table.update(reduce_family.kernels(rt))
    return table
