"""The array API standard's manipulation, linear-algebra, searching, set and statistical
functions that ember's op families did not have, built from registry ops (so every backend
runs them, and autodiff and plans see their primitives). Data-dependent ones (``nonzero``,
``unique_*``) read the values, as they must: their output shape depends on them.

>>> import ember
>>> ember.roll(ember.arange(5), 2).tolist()
[3, 4, 0, 1, 2]
>>> ember.tril(ember.ones((2, 2), dtype=ember.int32)).tolist()
[[1, 0], [1, 1]]
>>> ember.searchsorted(ember.tensor([1.0, 2.0, 3.0]), ember.tensor([2.5])).tolist()
[2]
"""
from __future__ import annotations

import builtins
import operator
from math import prod

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError
from ..registry import apply, broadcast_shapes, normalize_axis, op
from ..tensor import Tensor, tensor
from . import method
from .creation import arange, full, zeros
from .elementwise import astype, host_fallback, less_equal, multiply, where
from .linalg import matmul
from .movement import broadcast_to, concat, permute_dims, reshape, take
from .reduction import sum as _sum

__all__ = ["broadcast_arrays", "meshgrid", "roll", "repeat", "tensordot", "vecdot", "tril", "triu", "nonzero",
           "unique_all", "unique_counts", "unique_inverse", "unique_values", "searchsorted", "cumulative_sum",
           "unstack", "count_nonzero"]


def broadcast_arrays(*arrays):
    """The tensors broadcast to their common shape (a list)."""
    shape = broadcast_shapes(*[a.shape for a in arrays], op="broadcast_arrays")
    return [a if a.shape == shape else broadcast_to(a, shape) for a in arrays]


def meshgrid(*arrays, indexing: str = "xy"):
    """Coordinate matrices from 1-D tensors (``indexing`` 'xy': Cartesian, 'ij': matrix)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', not {indexing!r}")
    n = len(arrays)
    if any(a.ndim != 1 for a in arrays):
        raise ShapeError("meshgrid: every input must be 1-D")
    if arrays and builtins.any(a.dtype is not arrays[0].dtype for a in arrays):
        raise DTypeError("meshgrid: the inputs must have one dtype")
    sizes = [a.shape[0] for a in arrays]
    if indexing == "xy" and n >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrays):
        pos = i
        if indexing == "xy" and n >= 2 and i < 2:
            pos = 1 - i
        shape = [1] * n
        shape[pos] = a.shape[0]
        out.append(broadcast_to(reshape(a, tuple(shape)), tuple(sizes)))
    return out


@method
def roll(x: Tensor, /, shift, *, axis=None) -> Tensor:
    """Elements shifted by ``shift`` along ``axis`` (flattened when None), wrapping around."""
    if axis is None:
        return reshape(roll(reshape(x, (-1,)), shift, axis=0), x.shape)
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(shifts) != len(axes):
        if len(shifts) == 1:
            shifts = shifts * len(axes)
        else:
            raise ShapeError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    y = x
    for s, a in zip(shifts, axes):
        a = normalize_axis(a, x.ndim, "roll")
        n = x.shape[a]
        if n == 0:
            continue
        s %= n
        if s:
            idx = arange(n, device=x.device)
            idx = (idx - s) % n
            y = take(y, idx, axis=a)
    return y


@method
def repeat(x: Tensor, repeats, /, *, axis=None) -> Tensor:
    """Each element repeated ``repeats`` times (an int, or one count per element along
    ``axis``; the input is flattened when ``axis`` is None)."""
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    axis = normalize_axis(axis, x.ndim, "repeat")
    n = x.shape[axis]
    if isinstance(repeats, Tensor):
        if repeats.dtype.kind not in "iu":
            raise DTypeError(f"repeat: repeats must be an integer tensor, not {repeats.dtype.name}")
        repeats = repeats.tolist()
    if isinstance(repeats, int):
        counts = [repeats] * n
    else:
        counts = list(repeats)
        if len(counts) == 1:
            counts = counts * n
        if len(counts) != n:
            raise ShapeError(f"repeat: {len(counts)} repeats for an axis of size {n}")
    if builtins.any(c < 0 for c in counts):
        raise ShapeError("repeat: repeats must not be negative")
    idx = [i for i, c in enumerate(counts) for _ in range(c)]
    return take(x, tensor(idx, dtype=_dt.int64, device=x.device), axis=axis)


def _axes_pair(axes, a, b):
    if isinstance(axes, int):
        if axes < 0:
            raise ShapeError("tensordot: axes must not be negative")
        return list(range(a.ndim - axes, a.ndim)), list(range(axes))
    xa, xb = axes
    xa = [xa] if isinstance(xa, int) else list(xa)
    xb = [xb] if isinstance(xb, int) else list(xb)
    return [normalize_axis(i, a.ndim, "tensordot") for i in xa], [normalize_axis(i, b.ndim, "tensordot") for i in xb]


def tensordot(x1: Tensor, x2: Tensor, /, *, axes=2) -> Tensor:
    """Sum of products over the given axes of ``x1`` and ``x2`` (an int: the last ``axes``
    of x1 with the first of x2), as one matmul."""
    ax1, ax2 = _axes_pair(axes, x1, x2)
    if len(ax1) != len(ax2):
        raise ShapeError("tensordot: the two axis lists differ in length")
    for i, j in zip(ax1, ax2):
        if x1.shape[i] != x2.shape[j] and x1.shape[i] != 1 and x2.shape[j] != 1:
            raise ShapeError(f"tensordot: axis {i} of x1 ({x1.shape[i]}) and axis {j} of x2 ({x2.shape[j]}) differ")
    free1 = [i for i in range(x1.ndim) if i not in ax1]
    free2 = [j for j in range(x2.ndim) if j not in ax2]
    # contracted sizes broadcast (the standard allows size-1 against n)
    csz = [builtins.max(x1.shape[i], x2.shape[j]) for i, j in zip(ax1, ax2)]
    a = permute_dims(x1, tuple(free1 + ax1))
    b = permute_dims(x2, tuple(ax2 + free2))
    a = broadcast_to(a, tuple(x1.shape[i] for i in free1) + tuple(csz))
    b = broadcast_to(b, tuple(csz) + tuple(x2.shape[j] for j in free2))
    k = prod(csz)
    m = prod(x1.shape[i] for i in free1)
    n = prod(x2.shape[j] for j in free2)
    y = matmul(reshape(a, (m, k)), reshape(b, (k, n)))
    return reshape(y, tuple(x1.shape[i] for i in free1) + tuple(x2.shape[j] for j in free2))


def vecdot(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """Dot product of vectors along ``axis`` (batch axes broadcast)."""
    if x1.shape[axis] != x2.shape[axis] if x1.ndim and x2.ndim else True:
        raise ShapeError(f"vecdot: sizes {x1.shape} and {x2.shape} differ along axis {axis}")
    if axis >= 0:
        raise ShapeError("vecdot: axis must be negative (it counts from the end of both shapes)")
    p = multiply(x1, x2)
    return _sum(p, axis=axis, dtype=p.dtype)


def _tri(x, k, lower):
    if x.ndim < 2:
        raise ShapeError(f"{'tril' if lower else 'triu'}: needs a tensor of rank >= 2, got shape {x.shape}")
    r, c = x.shape[-2:]
    rows = reshape(arange(r, device=x.device), (r, 1))
    cols = reshape(arange(c, device=x.device), (1, c))
    keep = less_equal(cols - rows, k) if lower else less_equal(rows + k, cols)
    return where(keep, x, zeros((), dtype=x.dtype, device=x.device))


@method
def tril(x: Tensor, /, *, k: int = 0) -> Tensor:
    """The lower triangle of the last two axes (diagonal ``k`` and below); the rest 0."""
    return _tri(x, k, True)


@method
def triu(x: Tensor, /, *, k: int = 0) -> Tensor:
    """The upper triangle of the last two axes (diagonal ``k`` and above); the rest 0."""
    return _tri(x, k, False)


@method
def nonzero(x: Tensor, /) -> tuple:
    """Indices of the nonzero elements, one int64 tensor per axis (reads the values)."""
    if x.ndim == 0:
        raise ShapeError("nonzero: not defined for 0-d tensors (use nonzero(x[None]))")
    flat = reshape(x, (-1,)).tolist()
    hits = [i for i, v in enumerate(flat) if v]
    out = []
    strides = [prod(x.shape[a + 1:]) for a in range(x.ndim)]
    for a in range(x.ndim):
        out.append(tensor([(i // strides[a]) % x.shape[a] for i in hits], dtype=_dt.int64, device=x.device)
                   if hits else zeros((0,), dtype=_dt.int64, device=x.device))
    return tuple(out)


def count_nonzero(x: Tensor, /, *, axis=None, keepdims: bool = False) -> Tensor:
    """The number of nonzero elements along ``axis`` (int64)."""
    return _sum(astype(x != 0, _dt.int64), axis=axis, keepdims=keepdims)


def _unique(x):
    """(sorted unique values, first indices, inverse, counts) of the flattened ``x``; NaNs are
    all distinct, as the standard says."""
    flat = reshape(x, (-1,)).tolist()
    firsts, counts, pos = {}, {}, []
    nans = []
    for i, v in enumerate(flat):
        if v != v:
            nans.append(i)
            continue
        if v not in firsts:   # -0.0 and 0.0 are one value (the first seen is kept)
            firsts[v] = i
            counts[v] = 0
        counts[v] += 1
    keys = sorted(firsts)
    rank = {k: j for j, k in enumerate(keys)}
    vals = [flat[firsts[k]] for k in keys] + [flat[i] for i in nans]
    idx = [firsts[k] for k in keys] + nans
    cnt = [counts[k] for k in keys] + [1] * len(nans)
    nan_rank = {i: len(keys) + j for j, i in enumerate(nans)}
    for i, v in enumerate(flat):
        pos.append(nan_rank[i] if v != v else rank[v])
    dev = x.device

    def t(v, dt):
        return tensor(v, dtype=dt, device=dev) if v else zeros((0,), dtype=dt, device=dev)
    return t(vals, x.dtype), t(idx, _dt.int64), reshape(t(pos, _dt.int64), x.shape), t(cnt, _dt.int64)


class UniqueAll(tuple):
    """``unique_all``'s (values, indices, inverse_indices, counts), also by name."""
    values = property(operator.itemgetter(0))
    indices = property(operator.itemgetter(1))
    inverse_indices = property(operator.itemgetter(2))
    counts = property(operator.itemgetter(3))


class UniqueCounts(tuple):
    values = property(operator.itemgetter(0))
    counts = property(operator.itemgetter(1))


class UniqueInverse(tuple):
    values = property(operator.itemgetter(0))
    inverse_indices = property(operator.itemgetter(1))


def unique_all(x: Tensor, /):
    """Sorted unique values, the index of each one's first occurrence, the inverse indices
    (x's shape) and the counts."""
    return UniqueAll(_unique(x))


def unique_counts(x: Tensor, /):
    """Sorted unique values and how often each occurs."""
    v, _, _, c = _unique(x)
    return UniqueCounts((v, c))


def unique_inverse(x: Tensor, /):
    """Sorted unique values and, for each element of x, the index of its value among them."""
    v, _, inv, _ = _unique(x)
    return UniqueInverse((v, inv))


def unique_values(x: Tensor, /) -> Tensor:
    """Sorted unique values of x (flattened)."""
    return _unique(x)[0]


def _ss_shape(a, v, **_):
    return tuple(v)


def _ss_dtype(a, v, **_):
    _dt.result_type(a, v)
    return _dt.int64


op("searchsorted", kind="composite", shape=_ss_shape, dtype=_ss_dtype, decompose=host_fallback("searchsorted"),
   doc="For each value of v, where it would go in the sorted 1-D tensor x1 (side 'left' or 'right').")


def searchsorted(x1: Tensor, x2: Tensor, /, *, side: str = "left", sorter=None) -> Tensor:
    """Insertion indices (int64) of ``x2``'s values in the ascending 1-D ``x1``."""
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', not {side!r}")
    if x1.ndim != 1:
        raise ShapeError(f"searchsorted: x1 must be 1-D, got shape {x1.shape}")
    if sorter is not None:
        x1 = take(x1, sorter)
    if x1.dtype is not x2.dtype:
        ct = _dt.result_type(x1.dtype, x2.dtype)
        x1, x2 = astype(x1, ct), astype(x2, ct)
    return apply("searchsorted", x1, x2, side=side)


def cumulative_sum(x: Tensor, /, *, axis=None, dtype=None, include_initial: bool = False) -> Tensor:
    """Running sums along ``axis`` (may be omitted for 1-D); ``include_initial`` prepends a 0."""
    from .nnops import cumsum

    if axis is None:
        if x.ndim > 1:
            raise ShapeError("cumulative_sum: axis is required for tensors of rank > 1")
        axis = 0
    if x.ndim == 0:
        raise ShapeError("cumulative_sum: not defined for 0-d tensors")
    axis = normalize_axis(axis, x.ndim, "cumulative_sum")
    if dtype is None:
        dt = x.dtype
        if dt is _dt.bool_ or (dt.kind == "i" and dt.itemsize < 8):
            dt = _dt.int64
        elif dt.kind == "u" and dt.itemsize < 8:
            # uint64 where the device holds it; webgpu/wasm accumulate in int64 (like sum)
            dt = _dt.uint64 if x.device in _dt.FULL_DEVICES else _dt.int64
    else:
        dt = _dt.get(dtype)
    xc = astype(x, dt)
    if x.shape[axis] == 0:
        y = xc
    else:
        y = cumsum(xc, axis)
        if y.dtype is not dt:
            y = astype(y, dt)
    if include_initial:
        shape = list(x.shape)
        shape[axis] = 1
        y = concat([full(tuple(shape), 0, dtype=dt, device=x.device), y], axis=axis)
    return y


def unstack(x: Tensor, /, *, axis: int = 0) -> tuple:
    """The slices of x along ``axis``, as a tuple of tensors."""
    if x.ndim == 0:
        raise ShapeError("unstack: not defined for 0-d tensors")
    axis = normalize_axis(axis, x.ndim, "unstack")
    index = (slice(None),) * axis
    return tuple(x[index + (i,)] for i in range(x.shape[axis]))
