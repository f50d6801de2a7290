"""Elementwise ops (unary, binary with broadcasting, where) and the Python operators."""
from __future__ import annotations

from .. import dtypes as _dt
from ..registry import apply, broadcast_shapes, op, promote, same_dtype, same_shape, to_float
from ..tensor import Tensor
from . import method
from .creation import full

__all__ = ["add", "multiply", "exp", "asarray_like"]


def asarray_like(x, like: Tensor) -> Tensor:
    """``x`` as a tensor on ``like``'s device; a Python scalar takes a weak dtype next to ``like``."""
    if isinstance(x, Tensor):
        return x
    return full((), x, dtype=_dt.scalar_dtype(x, like.dtype), device=like.device)


def _binary(name, dtype_rule):
    op(name, kind="binary", shape=lambda a, b, **_: broadcast_shapes(a, b, op=name), dtype=dtype_rule)

    def fn(x1, x2):
        if not isinstance(x1, Tensor):
            x1 = asarray_like(x1, x2)
        x2 = asarray_like(x2, x1)
        return apply(name, x1, x2)
    fn.__name__ = name
    return fn


def _unary(name, dtype_rule):
    op(name, kind="unary", shape=same_shape, dtype=dtype_rule)

    def fn(x):
        return apply(name, x)
    fn.__name__ = name
    return fn


add = method(_binary("add", promote))
multiply = method(_binary("multiply", promote))
exp = method(_unary("exp", to_float))

Tensor.__add__ = add
Tensor.__radd__ = lambda self, other: add(other, self)
Tensor.__mul__ = multiply
Tensor.__rmul__ = lambda self, other: multiply(other, self)
