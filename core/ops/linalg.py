"""Linear algebra: ``matmul`` (a primitive), with numpy semantics for 1-D operands and
broadcast batch dimensions.

>>> import ember
>>> a = ember.tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (a @ a).tolist()
[[7.0, 10.0], [15.0, 22.0]]
>>> ember.matmul(a, ember.tensor([1.0, 1.0])).tolist()
[3.0, 7.0]
"""
from __future__ import annotations

from ..autograd import sum_to
from ..errors import DTypeError, ShapeError
from ..registry import apply, broadcast_shapes, op, promote
from ..tensor import Tensor
from . import method

__all__ = ["matmul"]


def _mm_shape(a, b, **_):
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul: the primitive needs operands of rank >= 2, got {tuple(a)} and {tuple(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: shapes {tuple(a)} and {tuple(b)} do not match "
                         f"(inner dims {a[-1]} and {b[-2]})")
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: batch dims of {tuple(a)} and {tuple(b)} do not broadcast") from None
    return batch + (a[-2], b[-1])


def _mT(x):
    return apply("permute_dims", x, axes=tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _matmul_grad(g, y, a, b, *, need, **_):
    return (sum_to(apply("matmul", g, _mT(b)), a.shape) if need[0] else None,
            sum_to(apply("matmul", _mT(a), g), b.shape) if need[1] else None)


op("matmul", kind="other", shape=_mm_shape, dtype=promote, grad=_matmul_grad,
   doc="(..., M, K) @ (..., K, N) -> (..., M, N); batch dims broadcast; both operands rank >= 2.")


@method
def matmul(x1: Tensor, x2: Tensor) -> Tensor:
    """Matrix product with numpy semantics: a 1-D ``x1`` is a row vector and a 1-D ``x2`` a
    column vector (the added axis is removed again); batch dims broadcast. Bool @ bool is
    logical (any of ands); ints are exact and wrap on overflow.

    >>> import ember
    >>> ember.matmul(ember.ones((5, 2, 3)), ember.ones((3, 4))).shape
    (5, 2, 4)
    """
    if not isinstance(x1, Tensor) or not isinstance(x2, Tensor):
        raise DTypeError(f"matmul: needs two Tensors, got {type(x1).__name__} and {type(x2).__name__}")
    if x1.ndim == 0 or x2.ndim == 0:
        raise ShapeError(f"matmul: 0-d operands are not allowed (shapes {x1.shape} and {x2.shape}); use multiply")
    a = x1.reshape((1,) + x1.shape) if x1.ndim == 1 else x1
    b = x2.reshape(x2.shape + (1,)) if x2.ndim == 1 else x2
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {x1.shape} and {x2.shape} do not match "
                         f"(inner dims {a.shape[-1]} and {b.shape[-2]})")
    if a.dtype is not b.dtype:  # the kernel sees one dtype
        ct = promote(a.dtype, b.dtype)
        a, b = a.astype(ct), b.astype(ct)
    y = apply("matmul", a, b)
    if x1.ndim == 1 and x2.ndim == 1:
        return y.reshape(y.shape[:-2])
    if x1.ndim == 1:
        return y.reshape(y.shape[:-2] + y.shape[-1:])
    if x2.ndim == 1:
        return y.reshape(y.shape[:-1])
    return y


Tensor.__matmul__ = lambda self, other: matmul(self, other) if isinstance(other, Tensor) else NotImplemented
Tensor.__rmatmul__ = lambda self, other: matmul(other, self) if isinstance(other, Tensor) else NotImplemented
