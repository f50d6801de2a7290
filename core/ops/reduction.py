"""Reductions: sum, prod, max, min, argmax, argmin (primitives); mean, var, std, all, any
(composites).

``axis`` is None (all axes), an int or a tuple of ints (negative counts from the end);
``keepdims=True`` keeps reduced axes with size 1. Sums and products of bools and ints give int64
(like numpy on 64-bit platforms), floats keep their dtype; ``mean``/``var``/``std`` of ints give
float32 (float16 inputs accumulate in float32). Reducing a size-0 axis: ``sum`` -> 0, ``prod`` ->
1, ``mean`` -> nan; ``max``/``min``/``argmax``/``argmin`` raise ShapeError. NaN propagates
through ``max``/``min``, and ``argmax``/``argmin`` return the first NaN's index.

>>> import ember
>>> x = ember.tensor([[1.0, 5.0], [3.0, 2.0]])
>>> x.sum(axis=1).tolist(), x.max(axis=0).tolist(), x.argmax(axis=1).tolist()
([6.0, 5.0], [3.0, 5.0], [1, 0])
>>> ember.mean(x, axis=(0, 1), keepdims=True).tolist()
[[2.75]]
"""
from __future__ import annotations

import builtins

from .. import dtypes as _dt
from ..autograd import keeps_output
from ..errors import DTypeError, ShapeError
from ..registry import apply, normalize_axes, normalize_axis, op
from ..tensor import Tensor
from . import method

__all__ = ["sum", "prod", "max", "min", "argmax", "argmin", "mean", "var", "std", "all", "any"]


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _reduce_shape(name, nonempty=False):
    def rule(x, *, axes, keepdims=False, **_):
        if nonempty:
            empty = [a for a in axes if x[a] == 0]
            if empty:
                raise ShapeError(f"{name}: cannot reduce over the size-0 axis {empty[0]} of shape {tuple(x)} "
                                 f"(the result has no identity)")
        return _reduced_shape(x, axes, keepdims)
    return rule


def _acc_dtype(x, *, dtype=None, **_):
    if dtype is not None:
        return dtype
    if x.kind == "u":
        return _dt.uint64   # unsigned sums stay unsigned (array API), bools and signed ints: int64
    return _dt.int64 if x.kind in "bi" else x


def _same(x, **_):
    return x


def _to_float(x, **_):
    return x if x.kind == "f" else _dt.default_float


def _float_only(name):
    def rule(x, **_):
        if x is _dt.bool_:
            raise DTypeError(f"{name}: not defined for bool tensors; cast with .astype(ember.float32)")
        return _to_float(x)
    return rule


def _spread(g, x_shape, axes, keepdims):
    """A reduction's output gradient broadcast back over the reduced axes."""
    if not keepdims:
        g = apply("reshape", g, shape=_reduced_shape(x_shape, axes, True))
    return g if g.shape == tuple(x_shape) else apply("broadcast_to", g, shape=tuple(x_shape))


def _sum_grad(g, y, x, *, axes, keepdims=False, **_):
    return _spread(g, x.shape, axes, keepdims)


@keeps_output
def _prod_grad(g, y, x, *, axes, keepdims=False, **_):
    # y / x: exact where x has no zeros (a zero's gradient needs the product of the others)
    return _spread(g, x.shape, axes, keepdims) * _spread(y, x.shape, axes, keepdims) / x


@keeps_output
def _extreme_grad(g, y, x, *, axes, keepdims=False, **_):
    # max/min over axes: the gradient is shared evenly between tied extremes (like torch.amax)
    hit = (x == _spread(y, x.shape, axes, keepdims)).astype(x.dtype)
    count = apply("sum", hit, axes=axes, keepdims=True)
    return _spread(g, x.shape, axes, keepdims) * hit / count


op("sum", kind="reduce", shape=_reduce_shape("sum"), dtype=_acc_dtype, doc="Sum over axes.", grad=_sum_grad)
op("prod", kind="reduce", shape=_reduce_shape("prod"), dtype=_acc_dtype, doc="Product over axes.",
   grad=_prod_grad)
op("max", kind="reduce", shape=_reduce_shape("max", True), dtype=_same, doc="Maximum over axes.",
   grad=_extreme_grad)
op("min", kind="reduce", shape=_reduce_shape("min", True), dtype=_same, doc="Minimum over axes.",
   grad=_extreme_grad)


def _arg_shape(name):
    def rule(x, *, axis, keepdims=False, **_):
        if x[axis] == 0:
            raise ShapeError(f"{name}: cannot reduce over the size-0 axis {axis} of shape {tuple(x)}")
        return _reduced_shape(x, (axis,), keepdims)
    return rule


op("argmax", kind="reduce", shape=_arg_shape("argmax"), dtype=lambda x, **_: _dt.int64,
   doc="Index of the first maximum along one axis.")
op("argmin", kind="reduce", shape=_arg_shape("argmin"), dtype=lambda x, **_: _dt.int64,
   doc="Index of the first minimum along one axis.")


def _count(shape, axes):
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _wide(x):
    """float32 and float64 compute as they are; float16 and ints in float32."""
    return x if x.dtype is _dt.float32 or x.dtype is _dt.float64 else x.astype(_dt.float32)


def _mean(x, *, axes, keepdims=False):
    f = _wide(x)
    y = apply("sum", f, axes=axes, keepdims=keepdims) / _count(x.shape, axes)
    return y if x.dtype is not _dt.float16 else y.astype(_dt.float16)


def _var(x, *, axes, keepdims=False, correction=0.0):
    f = _wide(x)
    d = f - _mean(f, axes=axes, keepdims=True)
    y = apply("sum", d * d, axes=axes, keepdims=keepdims) / (_count(x.shape, axes) - correction)
    return y if x.dtype is not _dt.float16 else y.astype(_dt.float16)


def _std(x, *, axes, keepdims=False, correction=0.0):
    v = _var(x.astype(_dt.float32) if x.dtype is _dt.float16 else x, axes=axes, keepdims=keepdims,
             correction=correction)
    y = v.sqrt()
    return y if x.dtype is not _dt.float16 else y.astype(_dt.float16)


def _any(x, *, axes, keepdims=False):
    b = x if x.dtype is _dt.bool_ else x.astype(_dt.bool_)
    return apply("max", b, axes=axes, keepdims=keepdims) if builtins.all(x.shape[a] for a in axes) else \
        apply("sum", b.astype(_dt.int64), axes=axes, keepdims=keepdims) > 0


def _all(x, *, axes, keepdims=False):
    b = x if x.dtype is _dt.bool_ else x.astype(_dt.bool_)
    return apply("min", b, axes=axes, keepdims=keepdims) if builtins.all(x.shape[a] for a in axes) else \
        apply("sum", b.logical_not().astype(_dt.int64), axes=axes, keepdims=keepdims) == 0


op("mean", kind="composite", shape=_reduce_shape("mean"), dtype=_float_only("mean"), decompose=_mean,
   doc="Arithmetic mean over axes.",
   grad=lambda g, y, x, *, axes, keepdims=False, **_: _spread(g, x.shape, axes, keepdims) / _count(x.shape, axes))
op("var", kind="composite", shape=_reduce_shape("var"), dtype=_float_only("var"), decompose=_var,
   doc="Variance over axes (divides by N - correction).")
op("std", kind="composite", shape=_reduce_shape("std"), dtype=_float_only("std"), decompose=_std,
   doc="Standard deviation over axes (sqrt of var).")
op("any", kind="composite", shape=_reduce_shape("any"), dtype=lambda x, **_: _dt.bool_, decompose=_any,
   doc="True where any value along the axes is nonzero.")
op("all", kind="composite", shape=_reduce_shape("all"), dtype=lambda x, **_: _dt.bool_, decompose=_all,
   doc="True where every value along the axes is nonzero.")


def _axes(x, axis, name):
    if axis is not None and not isinstance(axis, int):
        try:
            axis = tuple(int(a) for a in axis)
        except TypeError:
            raise ShapeError(f"{name}: axis must be None, an int or a tuple of ints, got {axis!r}") from None
    return normalize_axes(axis, x.ndim, name)


@method
def sum(x: Tensor, axis=None, *, dtype=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (bools/ints give int64 unless ``dtype`` is given; the input is cast to
    ``dtype`` first when one is given).

    >>> import ember
    >>> ember.sum(ember.tensor([[1, 2], [3, 4]]), axis=0).tolist()
    [4, 6]
    """
    axes = _axes(x, axis, "sum")
    given = dtype is not None
    dtype = _dt.get(dtype) if given else _acc_dtype(x.dtype)
    if not given and dtype in _dt.WIDE and x.device not in _dt.FULL_DEVICES:
        dtype = _dt.int64   # devices without uint64 (webgpu, wasm) accumulate unsigned ints in int64
    x = x.astype(dtype)  # the kernel accumulates in its input dtype
    if given:   # sum(x_u8, dtype=uint8) stays uint8: the rule must see the choice
        return apply("sum", x, axes=axes, keepdims=keepdims, dtype=dtype)
    return apply("sum", x, axes=axes, keepdims=keepdims)


@method
def prod(x: Tensor, axis=None, *, dtype=None, keepdims: bool = False) -> Tensor:
    """Product over ``axis`` (bools/ints give int64 and wrap on overflow).

    >>> import ember
    >>> ember.prod(ember.tensor([1.5, 2.0, 4.0])).item()
    12.0
    """
    axes = _axes(x, axis, "prod")
    given = dtype is not None
    dtype = _dt.get(dtype) if given else _acc_dtype(x.dtype)
    if not given and dtype in _dt.WIDE and x.device not in _dt.FULL_DEVICES:
        dtype = _dt.int64   # devices without uint64 (webgpu, wasm) accumulate unsigned ints in int64
    x = x.astype(dtype)  # the kernel accumulates in its input dtype
    if given:   # sum(x_u8, dtype=uint8) stays uint8: the rule must see the choice
        return apply("prod", x, axes=axes, keepdims=keepdims, dtype=dtype)
    return apply("prod", x, axes=axes, keepdims=keepdims)


@method
def max(x: Tensor, axis=None, *, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Maximum over ``axis`` (NaN wins; ShapeError on a size-0 axis).

    >>> import ember
    >>> ember.max(ember.tensor([[1, 7], [3, 2]]), axis=1).tolist()
    [7, 3]
    """
    return apply("max", x, axes=_axes(x, axis, "max"), keepdims=keepdims)


@method
def min(x: Tensor, axis=None, *, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Minimum over ``axis`` (NaN wins; ShapeError on a size-0 axis)."""
    return apply("min", x, axes=_axes(x, axis, "min"), keepdims=keepdims)


def _arg(name, x, axis, keepdims):
    if axis is None:
        y = apply(name, x.reshape((x.size,)), axis=0, keepdims=False)
        return y.reshape((1,) * x.ndim) if keepdims else y
    if not isinstance(axis, int):
        raise ShapeError(f"{name}: axis must be None or an int, got {axis!r}")
    if x.ndim == 0:
        normalize_axis(axis, 1, name)
        return apply(name, x.reshape((1,)), axis=0, keepdims=False)
    return apply(name, x, axis=normalize_axis(axis, x.ndim, name), keepdims=keepdims)


@method
def argmax(x: Tensor, axis: int | None = None, *, keepdims: bool = False) -> Tensor:
    """Index (int64) of the first maximum along ``axis`` (over the flattened tensor if None).

    >>> import ember
    >>> ember.argmax(ember.tensor([[1, 9], [8, 2]])).item()
    1
    """
    return _arg("argmax", x, axis, keepdims)


@method
def argmin(x: Tensor, axis: int | None = None, *, keepdims: bool = False) -> Tensor:
    """Index (int64) of the first minimum along ``axis`` (over the flattened tensor if None)."""
    return _arg("argmin", x, axis, keepdims)


@method
def mean(x: Tensor, axis=None, *, keepdims: bool = False) -> Tensor:
    """Arithmetic mean (ints give float32; float16 accumulates in float32).

    >>> import ember
    >>> ember.mean(ember.tensor([1, 2, 3, 4])).item()
    2.5
    """
    return apply("mean", x, axes=_axes(x, axis, "mean"), keepdims=keepdims)


@method
def var(x: Tensor, axis=None, *, correction: float = 0.0, keepdims: bool = False) -> Tensor:
    """Variance: sum((x - mean)**2) / (N - correction). ``correction=0`` (the default, like the
    array API and numpy) is the population variance, 1 the unbiased sample variance.

    >>> import ember
    >>> ember.var(ember.tensor([1.0, 2.0, 3.0, 4.0])).item()
    1.25
    """
    return apply("var", x, axes=_axes(x, axis, "var"), keepdims=keepdims, correction=correction)


@method
def std(x: Tensor, axis=None, *, correction: float = 0.0, keepdims: bool = False) -> Tensor:
    """Standard deviation: sqrt(var(x, axis, correction=correction))."""
    return apply("std", x, axes=_axes(x, axis, "std"), keepdims=keepdims, correction=correction)


@method
def any(x: Tensor, axis=None, *, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where any value along ``axis`` is nonzero (False over a size-0 axis).

    >>> import ember
    >>> ember.any(ember.tensor([[0, 1], [0, 0]]), axis=1).tolist()
    [True, False]
    """
    return apply("any", x, axes=_axes(x, axis, "any"), keepdims=keepdims)


@method
def all(x: Tensor, axis=None, *, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where every value along ``axis`` is nonzero (True over a size-0 axis)."""
    return apply("all", x, axes=_axes(x, axis, "all"), keepdims=keepdims)
