"""Movement ops: change the layout, not the values.

Primitives: ``reshape`` (zero copy on the python backend), ``permute_dims``, ``broadcast_to``,
``slice`` (one strided window per axis: start, stop, step, negative steps allowed; what
indexing lowers to), ``concat``, ``take`` (gather along one axis) and ``take_along_axis``.
Composites: ``expand_dims``, ``squeeze``, ``flatten``, ``transpose``, ``matrix_transpose``,
``flip``, ``tile``; plain functions over them: ``stack``, ``split``, ``moveaxis``.

>>> import ember
>>> x = ember.arange(6).reshape((2, 3))
>>> x.permute_dims((1, 0)).tolist()
[[0, 3], [1, 4], [2, 5]]
>>> [t.tolist() for t in ember.split(ember.arange(6), 3)]
[[0, 1], [2, 3], [4, 5]]
"""
from __future__ import annotations

import builtins
import operator
from math import prod

from .. import dtypes as _dt
from ..autograd import sum_to
from ..errors import DTypeError, ShapeError
from ..registry import apply, broadcast_shapes, normalize_axes, normalize_axis, op, promote, same_dtype
from ..tensor import Tensor
from . import method

__all__ = ["reshape", "permute_dims", "broadcast_to", "concat", "stack", "split", "expand_dims",
           "squeeze", "flatten", "transpose", "matrix_transpose", "moveaxis", "flip", "tile", "take",
           "take_along_axis", "scatter_add", "strided_slice"]


# ---- primitives -------------------------------------------------------------------------------

def _reshape_shape(x, *, shape, **_):
    return tuple(shape)


op("reshape", kind="movement", shape=_reshape_shape, dtype=same_dtype,
   doc="Same values in row-major order, new shape (fully resolved, no -1).",
   grad=lambda g, y, x, **_: apply("reshape", g, shape=x.shape))


def _resolve_shape(old, shape, name="reshape") -> tuple:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        # ints only (numpy ints too): 2.0, "3" and True are mistakes, not sizes
        if isinstance(shape, (str, bytes)) or any(isinstance(s, (bool, float, str)) for s in shape):
            raise TypeError
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ShapeError(f"{name}: shape must be a sequence of ints, got {shape!r}") from None
    n = prod(old)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"{name}: invalid target shape {shape} (at most one -1, no other negatives)")
    if unknown:
        known = prod(s for s in shape if s != -1)
        if known == 0 or n % known:
            raise ShapeError(f"{name}: cannot reshape {tuple(old)} ({n} elements) to {shape}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    if prod(shape) != n:
        raise ShapeError(f"{name}: cannot reshape {tuple(old)} ({n} elements) to {shape} "
                         f"({prod(shape)} elements)")
    return shape


def reshape(x: Tensor, /, shape, *, copy=None) -> Tensor:
    """The same values with a new shape (one entry may be -1). No copy on the python backend;
    ``copy`` (array API) is accepted: tensors are immutable, so sharing is never observable.

    >>> import ember
    >>> ember.reshape(ember.arange(6), (3, -1)).shape
    (3, 2)
    """
    shape = _resolve_shape(x.shape, shape)
    if shape == x.shape:
        return x
    return apply("reshape", x, shape=shape)


def _varargs(fn, name, doc):
    """A Tensor method taking a shape/axes either as one sequence or spread out (torch style)."""
    def m(x: Tensor, *args, **kwargs) -> Tensor:
        if len(args) == 1 and not isinstance(args[0], int):
            args = args[0]
        return fn(x, args, **kwargs)
    m.__name__ = name
    m.__doc__ = doc
    return method(m, name=name)


_varargs(reshape, "reshape", "``x.reshape(2, 3)`` or ``x.reshape((2, 3))``.")


def _perm_shape(x, *, axes, **_):
    return tuple(x[a] for a in axes)


def _permute_grad(g, y, x, *, axes, **_):
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return apply("permute_dims", g, axes=tuple(inverse))


op("permute_dims", kind="movement", shape=_perm_shape, dtype=same_dtype,
   doc="Reorder axes: output axis i is input axis axes[i].", grad=_permute_grad)


def _check_perm(axes, ndim, name):
    try:
        axes = tuple(int(a) for a in axes)
    except TypeError:
        raise ShapeError(f"{name}: axes must be a sequence of ints, got {axes!r}") from None
    if len(axes) != ndim:
        raise ShapeError(f"{name}: axes {axes} do not match a tensor of rank {ndim}")
    norm = tuple(normalize_axis(a, ndim, name) for a in axes)
    if sorted(norm) != list(range(ndim)):
        raise ShapeError(f"{name}: axes {axes} are not a permutation of range({ndim})")
    return norm


@method
def permute_dims(x: Tensor, axes) -> Tensor:
    """Reorder the axes (``axes[i]`` is the input axis that becomes axis i).

    >>> import ember
    >>> ember.permute_dims(ember.zeros((2, 3, 4)), (2, 0, 1)).shape
    (4, 2, 3)
    """
    axes = _check_perm(axes, x.ndim, "permute_dims")
    if axes == tuple(range(x.ndim)):
        return x
    return apply("permute_dims", x, axes=axes)


_varargs(permute_dims, "permute", "``x.permute(2, 0, 1)`` (torch style) or ``x.permute((2, 0, 1))``.")


def _bcast_to_shape(x, *, shape, **_):
    shape = tuple(shape)
    ok = len(shape) >= len(x)
    if ok:
        try:
            ok = broadcast_shapes(x, shape) == shape
        except ShapeError:
            ok = False
    if not ok:
        raise ShapeError(f"broadcast_to: cannot broadcast shape {tuple(x)} to {shape}")
    return shape


op("broadcast_to", kind="movement", shape=_bcast_to_shape, dtype=same_dtype,
   doc="Repeat size-1 axes (and add leading axes) to reach ``shape``.",
   grad=lambda g, y, x, **_: sum_to(g, x.shape))


@method
def broadcast_to(x: Tensor, shape) -> Tensor:
    """``x`` broadcast to ``shape`` (numpy rules).

    >>> import ember
    >>> ember.broadcast_to(ember.tensor([1, 2]), (2, 2)).tolist()
    [[1, 2], [1, 2]]
    """
    shape = tuple(int(s) for s in ((shape,) if isinstance(shape, int) else shape))
    if shape == x.shape:
        return x
    return apply("broadcast_to", x, shape=shape)


def _slice_shape(x, *, slices, **_):
    if len(slices) != len(x):
        raise ShapeError(f"slice: {len(slices)} slices for a tensor of rank {len(x)}")
    return tuple(len(range(*s)) for s in slices)


def _unslice(g, shape, slices):
    """The gradient of ``slice``: ``g`` placed at the sliced positions of zeros of ``shape``
    (flip the negative steps, interleave zeros for steps > 1, then one zero pad / crop)."""
    from .creation import zeros

    if 0 in g.shape:
        return zeros(shape, dtype=g.dtype, device=g.device)
    flips, starts, steps = [], [], []
    for ax, (start, stop, step) in enumerate(slices):
        m = g.shape[ax]
        if step < 0:
            flips.append(ax)
            start, step = start + (m - 1) * step, -step
        starts.append(start)
        steps.append(step)
    if flips:
        g = apply("slice", g, slices=tuple((m - 1, -1, -1) if ax in flips else (0, m, 1)
                                           for ax, m in enumerate(g.shape)))
    for ax, step in enumerate(steps):
        if step > 1:
            m, post = g.shape[ax], g.shape[ax + 1:]
            g = apply("reshape", g, shape=g.shape[:ax + 1] + (1,) + post)
            g = apply("pad", g, pad_width=((0, 0),) * (ax + 1) + ((0, step - 1),) + ((0, 0),) * len(post),
                      mode="constant", value=0.0)
            g = apply("reshape", g, shape=g.shape[:ax] + (m * step,) + post)
    widths = tuple((s0, n - s0 - m) for s0, n, m in zip(starts, shape, g.shape))
    if any(w != (0, 0) for w in widths):
        g = apply("pad", g, pad_width=widths, mode="constant", value=0.0)
    return g


op("slice", kind="movement", shape=_slice_shape, dtype=same_dtype,
   grad=lambda g, y, x, *, slices, **_: _unslice(g, x.shape, slices),
   doc="Strided window: ``slices`` holds one normalized (start, stop, step) per axis, as given by "
       "Python's slice.indices(size); the output size of an axis is len(range(start, stop, step)).")


def strided_slice(x: Tensor, slices) -> Tensor:
    """``x[s0, s1, ...]`` for Python ``slice`` objects (one per leading axis; the rest whole).

    >>> import ember
    >>> ember.strided_slice(ember.arange(6), [slice(None, None, -2)]).tolist()
    [5, 3, 1]
    """
    slices = list(slices)
    if len(slices) > x.ndim:
        raise ShapeError(f"slice: {len(slices)} slices for a tensor of rank {x.ndim}")
    norm = []
    for s, n in zip(slices + [slice(None)] * (x.ndim - len(slices)), x.shape):
        if s.step == 0:
            raise ShapeError("slice: step must not be 0")
        norm.append(s.indices(n))
    if builtins.all(r == (0, n, 1) for r, n in zip(norm, x.shape)):
        return x
    return apply("slice", x, slices=tuple(norm))


def _concat_shape(*shapes, axis, **_):
    if not shapes:
        raise ShapeError("concat: needs at least one tensor")
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or builtins.any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
            shown = ", ".join(str(tuple(t)) for t in shapes)
            raise ShapeError(f"concat: shapes {shown} differ outside axis {axis}")
    return tuple(builtins.sum(s[axis] for s in shapes) if i == axis else n for i, n in enumerate(first))


def _concat_grad(g, y, *xs, axis, need, **_):
    out, start = [], 0
    for x, nd in zip(xs, need):
        n = x.shape[axis]
        out.append(apply("slice", g, slices=tuple((start, start + n, 1) if a == axis else (0, m, 1)
                                                  for a, m in enumerate(g.shape))) if nd else None)
        start += n
    return tuple(out)


op("concat", kind="movement", shape=_concat_shape, dtype=promote,
   doc="Join tensors along an existing axis (dtypes promote).", grad=_concat_grad)


def concat(tensors, axis: int | None = 0) -> Tensor:
    """Join tensors along ``axis`` (None: flatten them first). Dtypes promote.

    >>> import ember
    >>> ember.concat([ember.tensor([[1, 2]]), ember.tensor([[3, 4]])], axis=0).tolist()
    [[1, 2], [3, 4]]
    """
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("concat: needs at least one tensor")
    if not builtins.all(isinstance(t, Tensor) for t in tensors):
        raise DTypeError("concat: every item must be a Tensor")
    if axis is None:
        tensors = [t.reshape((t.size,)) for t in tensors]
        axis = 0
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ShapeError("concat: cannot concatenate 0-d tensors (use stack)")
    for t in tensors:
        if t.ndim != ndim:
            shown = ", ".join(str(u.shape) for u in tensors)
            raise ShapeError(f"concat: tensors must have the same rank, got shapes {shown}")
    axis = normalize_axis(axis, ndim, "concat")
    if len(tensors) == 1:
        return tensors[0]
    ct = promote(*[t.dtype for t in tensors])
    tensors = [t if t.dtype is ct else t.astype(ct) for t in tensors]  # the kernel sees one dtype
    return apply("concat", *tensors, axis=axis)


def _take_shape(x, i, *, axis, **_):
    return tuple(x[:axis]) + tuple(i) + tuple(x[axis + 1:])


def _index_dtype(name):
    def rule(x, i, **_):
        if i.kind not in "iu":
            raise DTypeError(f"{name}: indices must be an integer tensor, got {i.name}")
        return x
    return rule


def _take_grad(g, y, x, idx, *, axis, **_):
    # g: x.shape[:axis] + idx.shape + x.shape[axis+1:]; flatten the index axes into one
    k = idx.size
    g = apply("reshape", g, shape=x.shape[:axis] + (k,) + x.shape[axis + 1:])
    flat = apply("reshape", idx, shape=(1,) * axis + (k,) + (1,) * (x.ndim - axis - 1))
    return apply("scatter_add", g, flat, axis=axis, size=x.shape[axis]), None


op("take", kind="movement", shape=_take_shape, dtype=_index_dtype("take"), grad=_take_grad,
   doc="Gather whole slices along ``axis``: out[..., j, ...] = x[..., indices[j], ...] "
       "(indices of any shape; negative ones count from the end; out of range -> IndexingError).")


def _as_index(indices, like: Tensor, name: str) -> Tensor:
    if isinstance(indices, Tensor):
        return indices
    from ..tensor import tensor

    if isinstance(indices, bool):
        raise DTypeError(f"{name}: indices must be ints, got a bool")
    t = tensor(indices, device=like.device)
    if t.dtype.kind not in "iu" and t.size:
        raise DTypeError(f"{name}: indices must be ints, got {t.dtype.name}")
    return t if t.dtype.kind in "iu" else t.astype(_dt.int64)


@method
def take(x: Tensor, indices, axis: int | None = None) -> Tensor:
    """Elements (or whole slices along ``axis``) at ``indices``, like ``numpy.take``; with
    ``axis=None`` the tensor is flattened first. Out-of-range indices raise IndexingError.

    >>> import ember
    >>> ember.take(ember.tensor([[1, 2], [3, 4]]), [1, 0, -1], axis=1).tolist()
    [[2, 1, 2], [4, 3, 4]]
    """
    indices = _as_index(indices, x, "take")
    if axis is None:
        x = x.reshape((x.size,))
        axis = 0
    if x.ndim == 0:
        raise ShapeError("take: cannot index a 0-d tensor along an axis")
    return apply("take", x, indices, axis=normalize_axis(axis, x.ndim, "take"))


def _tal_shape(x, i, *, axis, **_):
    if len(x) != len(i):
        raise ShapeError(f"take_along_axis: x {tuple(x)} and indices {tuple(i)} must have the same rank")
    try:
        out = list(broadcast_shapes(tuple(1 if k == axis else n for k, n in enumerate(x)),
                                    tuple(1 if k == axis else n for k, n in enumerate(i)), op="take_along_axis"))
    except ShapeError:
        raise ShapeError(f"take_along_axis: x {tuple(x)} and indices {tuple(i)} do not broadcast outside "
                         f"axis {axis}") from None
    out[axis] = i[axis]
    return tuple(out)


def _tal_grad(g, y, x, idx, *, axis, **_):
    return sum_to(apply("scatter_add", g, idx, axis=axis, size=x.shape[axis]), x.shape), None


op("take_along_axis", kind="movement", shape=_tal_shape, dtype=_index_dtype("take_along_axis"), grad=_tal_grad,
   doc="out[..., j, ...] = x[..., indices[..., j, ...], ...] along ``axis`` (numpy "
       "take_along_axis; ONNX GatherElements); other axes broadcast.")


@method
def take_along_axis(x: Tensor, indices, axis: int = -1) -> Tensor:
    """Pick one element per position of ``indices`` along ``axis`` (same rank as ``x``; the other
    axes broadcast), like ``numpy.take_along_axis``.

    >>> import ember
    >>> x = ember.tensor([[10, 30, 20], [60, 40, 50]])
    >>> ember.take_along_axis(x, ember.tensor([[1], [0]]), axis=1).tolist()
    [[30], [60]]
    """
    indices = _as_index(indices, x, "take_along_axis")
    if x.ndim == 0:
        raise ShapeError("take_along_axis: cannot index a 0-d tensor along an axis")
    return apply("take_along_axis", x, indices, axis=normalize_axis(axis, x.ndim, "take_along_axis"))


def _scatter_shape(u, i, *, axis, size, **_):
    if len(u) != len(i):
        raise ShapeError(f"scatter_add: updates {tuple(u)} and indices {tuple(i)} must have the same rank")
    for k, (a, b) in enumerate(zip(u, i)):
        if b != a and b != 1:
            raise ShapeError(f"scatter_add: indices {tuple(i)} do not broadcast to updates {tuple(u)} (axis {k})")
    return tuple(size if k == axis else n for k, n in enumerate(u))


def _dec_scatter_add(u, idx, *, axis, size):
    """Zeros of the output shape plus ``u`` at ``idx`` along ``axis``, from matmul and compare
    ops (for backends without a kernel): a one-hot (size, k) matrix times ``u`` when the indices
    vary along ``axis`` only (the gradient of take / embedding), else a one-hot axis summed."""
    from .creation import arange
    from .elementwise import equal, multiply
    from .reduction import sum as _sum

    if u.dtype.kind != "f":
        raise ShapeError("scatter_add: the decomposition handles floating-point updates only")
    n = size
    k = u.shape[axis]
    idx = apply("remainder", idx, apply("full", shape=(), value=n, dtype=idx.dtype, device=idx.device)) \
        if n else idx   # negative indices count from the end, as in take
    if all(m == 1 for a, m in enumerate(idx.shape) if a != axis):
        onehot = equal(apply("reshape", arange(n, device=u.device), shape=(n, 1)),
                       apply("reshape", idx, shape=(1, k))).astype(u.dtype)          # (n, k)
        outer, inner = prod(u.shape[:axis]), prod(u.shape[axis + 1:])
        u3 = apply("reshape", u, shape=(outer, k, inner))
        out = apply("matmul", onehot, u3)                                             # (outer, n, inner)
        return apply("reshape", out, shape=u.shape[:axis] + (n,) + u.shape[axis + 1:])
    ib = broadcast_to(idx, u.shape)
    pos = apply("reshape", arange(n, device=u.device), shape=(1,) * (axis + 1) + (n,) + (1,) * (u.ndim - axis - 1))
    hit = equal(expand_dims(ib, axis + 1), pos).astype(u.dtype)                      # u.shape with n after axis
    return _sum(multiply(hit, expand_dims(u, axis + 1)), axis=axis)


op("scatter_add", kind="composite", shape=_scatter_shape, dtype=_index_dtype("scatter_add"),
   decompose=_dec_scatter_add,
   grad=lambda g, y, u, idx, *, axis, **_: (apply("take_along_axis", g, broadcast_to(idx, u.shape), axis=axis), None),
   doc="Zeros of ``updates``' shape with axis ``axis`` of size ``size``, plus out[..., indices[..., j, ...], "
       "...] += updates[..., j, ...] (indices broadcast to updates; the gradient of take and "
       "take_along_axis, PyTorch's scatter_add / index_add).")


def scatter_add(updates: Tensor, indices, axis: int, size: int) -> Tensor:
    """Sum ``updates`` into zeros along ``axis`` (of length ``size``) at ``indices`` (an int tensor
    of updates' rank whose other axes are 1 or match): the adjoint of ``take_along_axis``.

    >>> import ember
    >>> ember.scatter_add(ember.tensor([1.0, 2.0, 3.0]), ember.tensor([0, 2, 0]), 0, 3).tolist()
    [4.0, 0.0, 2.0]
    """
    indices = _as_index(indices, updates, "scatter_add")
    axis = normalize_axis(axis, updates.ndim, "scatter_add")
    return apply("scatter_add", updates, indices, axis=axis, size=int(size))


# ---- composites ------------------------------------------------------------------------------

def _expand_axes(ndim, axis, name):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return normalize_axes(axes, ndim + len(axes), name)


def _expand_dims_shape(x, *, axis=0, **_):
    axes = _expand_axes(len(x), axis, "expand_dims")
    it = iter(x)
    return tuple(1 if i in axes else next(it) for i in range(len(x) + len(axes)))


op("expand_dims", kind="composite", shape=_expand_dims_shape, dtype=same_dtype,
   decompose=lambda x, *, axis=0: reshape(x, _expand_dims_shape(x.shape, axis=axis)),
   doc="Insert size-1 axes.")


@method
def expand_dims(x: Tensor, axis=0) -> Tensor:
    """Insert a size-1 axis at ``axis`` (an int, or a tuple of them; positions in the result).

    >>> import ember
    >>> ember.expand_dims(ember.zeros((2, 3)), axis=-1).shape
    (2, 3, 1)
    """
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    n = x.ndim + len(axes)
    for a in axes:
        if not -n <= a < n:   # an IndexError, as the array API (and numpy's AxisError) say
            from ..errors import IndexingError

            raise IndexingError(f"expand_dims: axis {a} is out of range for a result of rank {n} "
                                f"(input shape {x.shape})")
    return apply("expand_dims", x, axis=axis)


def _squeeze_shape(x, *, axis=None, **_):
    if axis is None:
        return tuple(n for n in x if n != 1)
    axes = normalize_axes(axis, len(x), "squeeze")
    for a in axes:
        if x[a] != 1:
            raise ShapeError(f"squeeze: axis {a} of shape {tuple(x)} has size {x[a]}, not 1")
    return tuple(n for i, n in enumerate(x) if i not in axes)


op("squeeze", kind="composite", shape=_squeeze_shape, dtype=same_dtype,
   decompose=lambda x, *, axis=None: reshape(x, _squeeze_shape(x.shape, axis=axis)),
   doc="Remove size-1 axes.")


@method
def squeeze(x: Tensor, axis=None) -> Tensor:
    """Remove size-1 axes: all of them (``axis=None``) or the given ones (ShapeError if one
    is not size 1).

    >>> import ember
    >>> ember.squeeze(ember.zeros((1, 3, 1)), axis=0).shape
    (3, 1)
    """
    return apply("squeeze", x, axis=axis)


def _flatten_shape(x, *, start_axis=0, end_axis=-1, **_):
    if not x:
        return (1,)
    s = normalize_axis(start_axis, len(x), "flatten")
    e = normalize_axis(end_axis, len(x), "flatten")
    if s > e:
        raise ShapeError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis} for rank {len(x)}")
    return tuple(x[:s]) + (prod(x[s:e + 1]),) + tuple(x[e + 1:])


op("flatten", kind="composite", shape=_flatten_shape, dtype=same_dtype,
   decompose=lambda x, *, start_axis=0, end_axis=-1: reshape(x, _flatten_shape(x.shape, start_axis=start_axis,
                                                                                 end_axis=end_axis)),
   doc="Merge axes start_axis..end_axis into one.")


@method
def flatten(x: Tensor, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    """Merge axes ``start_axis``..``end_axis`` (inclusive) into one, like ``torch.flatten``
    (a 0-d tensor becomes shape (1,)).

    >>> import ember
    >>> ember.flatten(ember.zeros((2, 3, 4)), 1).shape
    (2, 12)
    """
    return apply("flatten", x, start_axis=start_axis, end_axis=end_axis)


def _swap(ndim, a0, a1, name):
    a0 = normalize_axis(a0, ndim, name)
    a1 = normalize_axis(a1, ndim, name)
    axes = list(range(ndim))
    axes[a0], axes[a1] = axes[a1], axes[a0]
    return tuple(axes)


def _transpose_shape(x, *, axis0=-2, axis1=-1, **_):
    if len(x) < 2:
        raise ShapeError(f"transpose: needs at least 2 axes, got shape {tuple(x)}")
    return _perm_shape(x, axes=_swap(len(x), axis0, axis1, "transpose"))


op("transpose", kind="composite", shape=_transpose_shape, dtype=same_dtype,
   decompose=lambda x, *, axis0=-2, axis1=-1: permute_dims(x, _swap(x.ndim, axis0, axis1, "transpose")),
   doc="Swap two axes.")


@method
def transpose(x: Tensor, axis0: int = -2, axis1: int = -1) -> Tensor:
    """Swap two axes (the last two by default), like ``torch.transpose(x, 1, 2)``.

    >>> import ember
    >>> ember.transpose(ember.zeros((2, 3, 4)), 0, 2).shape
    (4, 3, 2)
    """
    return apply("transpose", x, axis0=axis0, axis1=axis1)


def _mt_shape(x, **_):
    if len(x) < 2:
        raise ShapeError(f"matrix_transpose: needs at least 2 axes, got shape {tuple(x)}")
    return tuple(x[:-2]) + (x[-1], x[-2])


op("matrix_transpose", kind="composite", shape=_mt_shape, dtype=same_dtype,
   decompose=lambda x: permute_dims(x, _swap(x.ndim, -2, -1, "matrix_transpose")),
   doc="Swap the last two axes.")


@method
def matrix_transpose(x: Tensor) -> Tensor:
    """Swap the last two axes (a stack of matrices transposed); also ``x.mT``."""
    return apply("matrix_transpose", x)


def moveaxis(x: Tensor, source, destination) -> Tensor:
    """Move axes to new positions, the others keeping their order (like ``numpy.moveaxis``).

    >>> import ember
    >>> ember.moveaxis(ember.zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise ShapeError(f"moveaxis: {len(src)} source axes but {len(dst)} destinations")
    src = [normalize_axis(a, x.ndim, "moveaxis") for a in src]
    dst = [normalize_axis(a, x.ndim, "moveaxis") for a in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"moveaxis: repeated axis in {source} or {destination}")
    rest = [a for a in range(x.ndim) if a not in src]
    order = [None] * x.ndim
    for s, d in zip(src, dst):
        order[d] = s
    it = iter(rest)
    return permute_dims(x, [o if o is not None else next(it) for o in order])


def _flip(x, *, axis=None):
    axes = normalize_axes(axis, x.ndim, "flip")
    return strided_slice(x, [slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim)])


def _flip_shape(x, *, axis=None, **_):
    normalize_axes(axis, len(x), "flip")
    return tuple(x)


op("flip", kind="composite", shape=_flip_shape, dtype=same_dtype, decompose=_flip,
   doc="Reverse the order along axes (a slice with step -1).")


@method
def flip(x: Tensor, axis=None) -> Tensor:
    """Reverse the order of elements along ``axis`` (all axes when None).

    >>> import ember
    >>> ember.flip(ember.tensor([[1, 2], [3, 4]]), axis=1).tolist()
    [[2, 1], [4, 3]]
    """
    return apply("flip", x, axis=axis)


def _tile_reps(ndim, reps):
    reps = (reps,) if isinstance(reps, int) else tuple(int(r) for r in reps)
    if builtins.any(r < 0 for r in reps):
        raise ShapeError(f"tile: negative repetitions {reps}")
    d = builtins.max(ndim, len(reps))
    return (1,) * (d - len(reps)) + reps, d


def _tile_shape(x, *, reps, **_):
    reps, d = _tile_reps(len(x), reps)
    shape = (1,) * (d - len(x)) + tuple(x)
    return tuple(n * r for n, r in zip(shape, reps))


def _tile(x, *, reps):
    reps, d = _tile_reps(x.ndim, reps)
    shape = (1,) * (d - x.ndim) + x.shape
    # (s0, s1) -> (1, s0, 1, s1) -> broadcast (r0, s0, r1, s1) -> (r0*s0, r1*s1)
    inter = [v for n in shape for v in (1, n)]
    big = [v for n, r in zip(shape, reps) for v in (r, n)]
    y = broadcast_to(reshape(x, inter), big)
    return reshape(y, [n * r for n, r in zip(shape, reps)])


op("tile", kind="composite", shape=_tile_shape, dtype=same_dtype, decompose=_tile,
   doc="Repeat the whole tensor ``reps`` times along each axis (numpy.tile).")


@method
def tile(x: Tensor, reps) -> Tensor:
    """Repeat ``x`` ``reps[i]`` times along axis i, like ``numpy.tile`` (a shorter ``reps`` is
    padded with leading 1s; a longer one adds leading axes to ``x``).

    >>> import ember
    >>> ember.tile(ember.tensor([1, 2]), (2, 2)).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    return apply("tile", x, reps=reps)


def stack(tensors, axis: int = 0) -> Tensor:
    """Join same-shaped tensors along a new axis.

    >>> import ember
    >>> ember.stack([ember.tensor([1, 2]), ember.tensor([3, 4])], axis=1).tolist()
    [[1, 3], [2, 4]]
    """
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack: needs at least one tensor")
    shape = tensors[0].shape
    for t in tensors:
        if t.shape != shape:
            shown = ", ".join(str(u.shape) for u in tensors)
            raise ShapeError(f"stack: tensors must have the same shape, got {shown}")
    axis = normalize_axis(axis, len(shape) + 1, "stack")
    return concat([expand_dims(t, axis) for t in tensors], axis=axis)


def split(x: Tensor, indices_or_sections, axis: int = 0) -> list:
    """Split into a list of tensors along ``axis``, with numpy's semantics: an int N gives N
    equal parts (ShapeError when the axis does not divide); a sequence gives the split points
    (``[2, 5]`` -> ``x[:2], x[2:5], x[5:]``). For section *sizes* (torch/ONNX style) pass the
    running sums of the sizes, without the last.

    >>> import ember
    >>> [t.shape for t in ember.split(ember.zeros((5, 2)), [1, 3])]
    [(1, 2), (2, 2), (2, 2)]
    """
    if x.ndim == 0:
        raise ShapeError("split: cannot split a 0-d tensor")
    axis = normalize_axis(axis, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if k <= 0 or n % k:
            raise ShapeError(f"split: axis {axis} of shape {x.shape} (size {n}) does not split into {k} equal parts")
        points = [n // k * i for i in range(1, k)]
    else:
        points = [int(p) for p in indices_or_sections]
    bounds = [0] + points + [n]
    pre = [slice(None)] * axis
    return [strided_slice(x, pre + [slice(a, b)]) for a, b in zip(bounds[:-1], bounds[1:])]


# ---- Tensor properties -----------------------------------------------------------------------

def _T(x: Tensor) -> Tensor:
    if x.ndim > 2:
        raise ShapeError(f"T: defined for tensors of rank <= 2, got shape {x.shape}; use .mT or permute_dims")
    return x if x.ndim < 2 else permute_dims(x, (1, 0))


Tensor.T = property(_T, doc="The transpose of a matrix (rank <= 2).")
Tensor.mT = property(matrix_transpose, doc="The last two axes swapped.")
