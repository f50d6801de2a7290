"""``ember.linalg``: the array API standard's linear-algebra extension. The factorizations
(det, slogdet, inv, solve, cholesky, qr, eigh, svd) are registry ops with kernels on the CPU
backends (``ember.linalg_kernels`` on python/wasm, numpy.linalg on numpy) and a host fallback
elsewhere; the rest are composites of ember's ops. ``ember.ops.linalg`` is the op family that
declares ``matmul``; this module is the extension namespace.

Float inputs only (float32, float64; float16 computes in float32). Singular matrices give
nan/inf (inv, solve) rather than raising, as numpy's batched routines can't tell which one.

>>> import ember
>>> a = ember.tensor([[4.0, 1.0], [2.0, 3.0]])
>>> round(ember.linalg.det(a).item(), 4)
10.0
>>> ember.linalg.solve(a, ember.tensor([1.0, 2.0])).tolist()
[0.10000000149011612, 0.6000000238418579]
>>> ember.linalg.vector_norm(ember.tensor([3.0, 4.0])).item()
5.0
"""
from __future__ import annotations

import builtins
from collections import namedtuple
from math import prod

from . import dtypes as _dt
from .errors import DTypeError, ShapeError
from .ops import (abs, arange, astype, broadcast_to, concat, expand_dims, full, matmul, matrix_transpose,  # noqa: F401
                  maximum, multiply, reshape, sqrt, subtract, take, where)
from .ops import max as _max
from .ops import min as _min
from .ops import sum as _sum
from .ops.elementwise import host_fallback
from .ops.extra import tensordot, vecdot  # noqa: F401
from .registry import apply, broadcast_shapes, normalize_axis, op
from .tensor import Tensor

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul", "matrix_norm",
           "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "qr", "slogdet", "solve", "svd",
           "svdvals", "tensordot", "trace", "vecdot", "vector_norm"]

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
QRResult = namedtuple("QRResult", ["Q", "R"])
SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])


# ---- rules -------------------------------------------------------------------------------------

def _float(name):
    def rule(*dts, **_):
        for d in dts:
            if d.kind != "f":
                raise DTypeError(f"linalg.{name}: needs floating-point tensors, got {d.name}; "
                                 f"cast with .astype(ember.float32) first")
        r = dts[0]
        for d in dts[1:]:
            r = _dt.result_type(r, d)
        return r
    return rule


def _square(name):
    def check(s):
        if len(s) < 2 or s[-1] != s[-2]:
            raise ShapeError(f"linalg.{name}: needs a stack of square matrices (..., n, n), got shape {tuple(s)}")
    return check


def _matrix(name):
    def check(s):
        if len(s) < 2:
            raise ShapeError(f"linalg.{name}: needs a stack of matrices (..., m, n), got shape {tuple(s)}")
    return check


def _declare(name, shape, outputs=1, doc=""):
    fl = _float(name)
    dtype = fl if outputs == 1 else (lambda *dts, **a: (fl(*dts, **a),) * outputs)
    op(f"linalg_{name}", kind="composite", shape=shape, dtype=dtype, outputs=outputs,
       decompose=host_fallback(f"linalg_{name}"), doc=doc)


def _sq_shape(name, f):
    chk = _square(name)

    def rule(s, **a):
        chk(s)
        return f(tuple(s), **a)
    return rule


_declare("det", _sq_shape("det", lambda s: s[:-2]), doc="Determinant of each square matrix.")
_declare("slogdet", _sq_shape("slogdet", lambda s: (s[:-2], s[:-2])), 2,
         doc="Sign and log |det| of each square matrix.")
_declare("inv", _sq_shape("inv", lambda s: s), doc="Inverse of each square matrix.")
_declare("cholesky", _sq_shape("cholesky", lambda s, **_: s),
         doc="Lower (or upper) Cholesky factor of each symmetric positive-definite matrix.")
_declare("eigh", _sq_shape("eigh", lambda s: (s[:-1], s)), 2,
         doc="Eigenvalues (ascending) and eigenvectors of each symmetric matrix.")


def _solve_shape(a, b, **_):
    _square("solve")(a)
    if tuple(b[:-2]) != tuple(a[:-2]) or b[-2] != a[-1]:
        raise ShapeError(f"linalg.solve: shapes {tuple(a)} and {tuple(b)} do not match")
    return tuple(b)


op("linalg_solve", kind="composite", shape=_solve_shape, dtype=_float("solve"),
   decompose=host_fallback("linalg_solve"), doc="x with a @ x = b for each matrix pair.")


def _qr_shape(s, *, mode="reduced"):
    _matrix("qr")(s)
    *b, m, n = s
    k = m if mode == "complete" else builtins.min(m, n)
    return (tuple(b) + (m, k), tuple(b) + (k, n))


def _svd_shape(s, *, full_matrices=True):
    _matrix("svd")(s)
    *b, m, n = s
    k = builtins.min(m, n)
    b = tuple(b)
    if full_matrices:
        return (b + (m, m), b + (k,), b + (n, n))
    return (b + (m, k), b + (k,), b + (k, n))


op("linalg_qr", kind="composite", shape=_qr_shape, dtype=lambda x, **_: (_float("qr")(x),) * 2, outputs=2,
   decompose=host_fallback("linalg_qr"), doc="QR factorization (Householder).")
op("linalg_svd", kind="composite", shape=_svd_shape, dtype=lambda x, **_: (_float("svd")(x),) * 3, outputs=3,
   decompose=host_fallback("linalg_svd"), doc="Singular value decomposition, S descending.")


def _f(x: Tensor, name) -> Tensor:
    if x.dtype.kind != "f":
        raise DTypeError(f"linalg.{name}: needs a floating-point tensor, got {x.dtype.name}; "
                         f"cast with .astype(ember.float32) first")
    return x


# ---- factorizations --------------------------------------------------------------------------

def det(x: Tensor, /) -> Tensor:
    """Determinant of each square matrix in the stack."""
    return apply("linalg_det", _f(x, "det"))


def slogdet(x: Tensor, /):
    """(sign, log|det|) of each square matrix; sign 0 and logabsdet -inf when singular."""
    return SlogdetResult(*apply("linalg_slogdet", _f(x, "slogdet")))


def inv(x: Tensor, /) -> Tensor:
    """Inverse of each square matrix (nan where singular)."""
    return apply("linalg_inv", _f(x, "inv"))


def solve(x1: Tensor, x2: Tensor, /) -> Tensor:
    """x with ``x1 @ x = x2``; a 1-D ``x2`` is one right-hand-side vector. Batch axes broadcast."""
    _f(x1, "solve"), _f(x2, "solve")
    _square("solve")(x1.shape)
    vec = x2.ndim == 1
    b = expand_dims(x2, -1) if vec else x2
    if b.ndim < 2 or b.shape[-2] != x1.shape[-1]:
        raise ShapeError(f"linalg.solve: shapes {x1.shape} and {x2.shape} do not match")
    batch = broadcast_shapes(x1.shape[:-2], b.shape[:-2], op="linalg.solve")
    a = broadcast_to(x1, batch + x1.shape[-2:])
    b = broadcast_to(b, batch + b.shape[-2:])
    if a.dtype is not b.dtype:
        ct = _dt.result_type(a.dtype, b.dtype)
        a, b = astype(a, ct), astype(b, ct)
    y = apply("linalg_solve", a, b)
    return reshape(y, y.shape[:-1]) if vec else y


def cholesky(x: Tensor, /, *, upper: bool = False) -> Tensor:
    """Cholesky factor L (x = L @ L.mT), or U = L.mT when ``upper``; nan if not positive-definite."""
    return apply("linalg_cholesky", _f(x, "cholesky"), upper=upper)


def qr(x: Tensor, /, *, mode: str = "reduced"):
    """(Q, R) with x = Q @ R; ``mode`` 'reduced' (Q: m x k) or 'complete' (Q: m x m)."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"linalg.qr: mode must be 'reduced' or 'complete', not {mode!r}")
    return QRResult(*apply("linalg_qr", _f(x, "qr"), mode=mode))


def eigh(x: Tensor, /):
    """(eigenvalues ascending, eigenvectors as columns) of each symmetric matrix."""
    return EighResult(*apply("linalg_eigh", _f(x, "eigh")))


def eigvalsh(x: Tensor, /) -> Tensor:
    """Eigenvalues (ascending) of each symmetric matrix."""
    return eigh(x)[0]


def svd(x: Tensor, /, *, full_matrices: bool = True):
    """(U, S, Vh) with x = U @ diag(S) @ Vh, S descending."""
    return SVDResult(*apply("linalg_svd", _f(x, "svd"), full_matrices=full_matrices))


def svdvals(x: Tensor, /) -> Tensor:
    """Singular values, descending."""
    return svd(x, full_matrices=False)[1]


# ---- composites --------------------------------------------------------------------------------

def diagonal(x: Tensor, /, *, offset: int = 0) -> Tensor:
    """Diagonal ``offset`` of each matrix (last two axes)."""
    _matrix("diagonal")(x.shape)
    *b, m, n = x.shape
    lo, hi = (0, builtins.min(m, n - offset)) if offset >= 0 else (-offset, builtins.min(m, n - offset))
    idx = [i * n + i + offset for i in range(lo, hi)] if hi > lo else []
    flat = reshape(x, tuple(b) + (m * n,))
    from .tensor import tensor

    return take(flat, tensor(idx, dtype=_dt.int64, device=x.device), axis=-1 if b else 0) if idx else \
        full(tuple(b) + (0,), 0, dtype=x.dtype, device=x.device)


def trace(x: Tensor, /, *, offset: int = 0, dtype=None) -> Tensor:
    """Sum of diagonal ``offset`` of each matrix."""
    return _sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def outer(x1: Tensor, x2: Tensor, /) -> Tensor:
    """The outer product of two 1-D tensors."""
    if x1.ndim != 1 or x2.ndim != 1:
        raise ShapeError(f"linalg.outer: needs 1-D tensors, got shapes {x1.shape} and {x2.shape}")
    return multiply(reshape(x1, (-1, 1)), reshape(x2, (1, -1)))


def cross(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """The cross product of 3-vectors along ``axis`` (other axes broadcast)."""
    shape = broadcast_shapes(x1.shape, x2.shape, op="linalg.cross")
    if axis >= 0:
        raise ShapeError("linalg.cross: axis must be negative (it counts from the end of both shapes)")
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ShapeError(f"linalg.cross: axis {axis} must have size 3 in both, got {x1.shape} and {x2.shape}")
    a, b = broadcast_to(x1, shape), broadcast_to(x2, shape)
    ax = normalize_axis(axis, len(shape), "linalg.cross")
    from .tensor import tensor

    def comp(t, i):
        return take(t, tensor([i], dtype=_dt.int64, device=t.device), axis=ax)
    a0, a1, a2 = (comp(a, i) for i in range(3))
    b0, b1, b2 = (comp(b, i) for i in range(3))
    return concat([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=ax)


def matrix_power(x: Tensor, n: int, /) -> Tensor:
    """x @ x @ ... (n times) for a stack of square matrices; n = 0: identity, n < 0: of inv(x)."""
    _square("matrix_power")(x.shape)
    if n == 0:
        from .ops import eye

        return broadcast_to(eye(x.shape[-1], dtype=x.dtype, device=x.device), x.shape)
    if n < 0:
        x, n = inv(x), -n
    result = None
    base = x
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def matrix_rank(x: Tensor, /, *, rtol=None) -> Tensor:
    """The number of singular values above ``rtol`` times the largest (int64)."""
    s = svdvals(x)
    m, n = x.shape[-2:]
    if s.shape[-1] == 0:
        return full(s.shape[:-1], 0, dtype=_dt.int64, device=x.device)
    if rtol is None:
        from .ops.array_api import finfo

        rtol = builtins.max(m, n) * finfo(x.dtype).eps
    tol = _max(s, axis=-1, keepdims=True) * (rtol if not isinstance(rtol, Tensor) else expand_dims(rtol, -1))
    return _sum(astype(s > tol, _dt.int64), axis=-1)


def pinv(x: Tensor, /, *, rtol=None) -> Tensor:
    """The Moore-Penrose pseudo-inverse (singular values below ``rtol`` times the largest are
    dropped)."""
    u, s, vh = svd(x, full_matrices=False)
    m, n = x.shape[-2:]
    if rtol is None:
        from .ops.array_api import finfo

        rtol = builtins.max(m, n) * finfo(x.dtype).eps
    if s.shape[-1] == 0:
        return full(x.shape[:-2] + (n, m), 0, dtype=x.dtype, device=x.device)
    cut = _max(s, axis=-1, keepdims=True) * (rtol if not isinstance(rtol, Tensor) else expand_dims(rtol, -1))
    sinv = where(s > cut, 1.0 / where(s > cut, s, 1.0), 0.0)
    return matmul(matrix_transpose(vh) * expand_dims(sinv, -2), matrix_transpose(u))


def _axes_of(x, axis):
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, int):
        return (normalize_axis(axis, x.ndim, "linalg.vector_norm"),)
    return tuple(normalize_axis(a, x.ndim, "linalg.vector_norm") for a in axis)


def vector_norm(x: Tensor, /, *, axis=None, keepdims: bool = False, ord=2) -> Tensor:  # noqa: A002
    """The ``ord``-norm over ``axis`` (all axes when None): 2 (default), 1, inf, -inf, 0 (the
    number of nonzeros) or any other p."""
    if x.dtype.kind != "f":
        x = astype(x, _dt.default_float)
    axes = _axes_of(x, axis)
    a = abs(x)
    inf = float("inf")
    if ord == inf:
        y = _max(a, axis=axes, keepdims=keepdims) if prod(x.shape[i] for i in axes) else \
            _sum(a, axis=axes, keepdims=keepdims)
    elif ord == -inf:
        y = _min(a, axis=axes, keepdims=keepdims)
    elif ord == 0:
        y = astype(_sum(astype(a != 0, x.dtype), axis=axes, keepdims=keepdims), x.dtype)
    elif ord == 1:
        y = _sum(a, axis=axes, keepdims=keepdims)
    elif ord == 2:
        y = sqrt(_sum(a * a, axis=axes, keepdims=keepdims))
    else:
        y = _sum(a ** ord, axis=axes, keepdims=keepdims) ** (1.0 / ord)
    return y


def matrix_norm(x: Tensor, /, *, keepdims: bool = False, ord="fro") -> Tensor:  # noqa: A002
    """Matrix norm of each matrix: 'fro' (default), 'nuc', 1, -1, 2, -2, inf, -inf."""
    _matrix("matrix_norm")(x.shape)
    if x.dtype.kind != "f":
        x = astype(x, _dt.default_float)
    inf = float("inf")
    a = abs(x)
    if ord == "fro":
        y = sqrt(_sum(a * a, axis=(-2, -1), keepdims=keepdims))
        return y
    if ord in ("nuc", 2, -2):
        s = svdvals(x)
        y = _sum(s, axis=-1) if ord == "nuc" else (_max(s, axis=-1) if ord == 2 else _min(s, axis=-1))
    elif ord in (1, -1):
        c = _sum(a, axis=-2)
        y = _max(c, axis=-1) if ord == 1 else _min(c, axis=-1)
    elif ord in (inf, -inf):
        r = _sum(a, axis=-1)
        y = _max(r, axis=-1) if ord == inf else _min(r, axis=-1)
    else:
        raise ValueError(f"linalg.matrix_norm: unsupported ord {ord!r}")
    return reshape(y, y.shape + (1, 1)) if keepdims else y
