"""``Tensor.__getitem__``: basic numpy indexing lowered to the movement primitives.

Supported: ints (negative count from the end; out of range -> IndexingError), slices (any
step but 0, negative steps included), ``None`` (new axis), ``...``, and one integer index array
(a list or an int Tensor of any shape) on one axis, gathered with ``take``. With ints elsewhere
in the key the array's axes go where numpy puts them (in place when the int/array indices are
adjacent, first otherwise). A bool tensor as the sole index is a mask (``x[x > 0]``, the
array API's boolean indexing; it reads the mask, as the result's shape depends on it). Masks
mixed with other indices and several index arrays raise IndexingError: use ``ember.where`` or
``ember.take`` instead. Tensors are immutable: there is no ``__setitem__``.

>>> import ember
>>> x = ember.arange(12).reshape((3, 4))
>>> x[1].tolist(), x[:, ::-2].tolist(), x[..., None].shape
([4, 5, 6, 7], [[3, 1], [7, 5], [11, 9]], (3, 4, 1))
>>> x[[2, 0], 1:3].tolist()
[[9, 10], [1, 2]]
"""
from __future__ import annotations

from ..errors import IndexingError, UnsupportedOp
from ..registry import apply
from ..tensor import Tensor
from .movement import permute_dims, reshape, take

__all__ = []


def _is_int(k) -> bool:
    if isinstance(k, bool):
        return False
    if isinstance(k, int):
        return True
    if isinstance(k, Tensor):
        return k.ndim == 0 and k.dtype.kind in "iu"
    return hasattr(k, "__index__") and not hasattr(k, "__len__")


def _index_array(k, x: Tensor, axis: int) -> Tensor:
    from ..tensor import tensor

    if isinstance(k, Tensor):
        t = k
    else:  # numpy arrays keep their integer dtype; lists/tuples become int64
        t = tensor(k if hasattr(k, "__array_interface__") else list(k), device=x.device)
    if t.dtype.kind == "b" or (t.size == 0 and not isinstance(k, Tensor)):
        if t.dtype.kind == "b":
            raise IndexingError(f"getitem: a boolean mask must be the only index (axis {axis}); index "
                                f"x[mask] first, or use ember.where(mask, x, fill) or integer indices")
        return tensor([], dtype="int64", device=x.device)
    if t.dtype.kind not in "iu":
        raise IndexingError(f"getitem: index arrays must hold integers, got {t.dtype.name} (axis {axis})")
    if t.device != x.device:
        t = t.to(x.device)
    return t


def _mask(x: Tensor, m: Tensor) -> Tensor:
    """``x[m]`` for a bool tensor ``m`` shaped like x's leading axes (0-d included): the
    selected elements along one new first axis. Reads the mask (the shape depends on it)."""
    from math import prod

    from ..tensor import tensor

    if m.ndim > x.ndim or any(k not in (n, 0) for k, n in zip(m.shape, x.shape)):
        raise IndexingError(f"getitem: a boolean mask of shape {m.shape} does not match the leading axes of "
                            f"shape {x.shape}")
    if 0 in m.shape:   # an empty mask (a size-0 axis against a sized one) selects nothing
        from .creation import zeros

        return zeros((0,) + tuple(x.shape[m.ndim:]), dtype=x.dtype, device=x.device)
    flat = m.tolist() if m.ndim == 0 else reshape(m, (-1,)).tolist()
    hits = [i for i, v in enumerate(flat if m.ndim else [flat]) if v]
    xf = reshape(x, (prod(m.shape),) + tuple(x.shape[m.ndim:]))
    return take(xf, tensor(hits, dtype="int64", device=x.device) if hits else
                tensor([], dtype="int64", device=x.device), axis=0)


def getitem(x: Tensor, key) -> Tensor:
    """``x[key]`` (see the module docstring for what ``key`` may hold)."""
    if isinstance(key, Tensor) and key.dtype.kind == "b":   # a boolean mask: the array API's sole index
        return _mask(x, key)
    if isinstance(key, tuple) and len(key) == 2 and key[1] is Ellipsis and isinstance(key[0], Tensor) \
            and key[0].dtype.kind == "b":
        return _mask(x, key[0])
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexingError("getitem: an index can only have a single ellipsis ('...')")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > x.ndim:
        raise IndexingError(f"getitem: too many indices for a tensor of shape {x.shape}: {consumed} given")
    if n_ell:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - consumed) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - consumed)

    slices = []
    arr = None  # (input axis, index tensor, position in key)
    int_pos = []
    axis = 0
    for pos, k in enumerate(key):
        if k is None:
            continue
        n = x.shape[axis]
        if isinstance(k, slice):
            if k.step == 0:
                raise IndexingError(f"getitem: slice step must not be 0 (axis {axis})")
            try:
                slices.append(k.indices(n))
            except TypeError:
                raise IndexingError(f"getitem: slice bounds must be ints, got {k!r} (axis {axis})") from None
        elif _is_int(k):
            i = int(k)
            if not -n <= i < n:
                raise IndexingError(f"getitem: index {i} is out of range for axis {axis} with size {n} "
                                    f"(shape {x.shape})")
            i %= n
            slices.append((i, i + 1, 1))
            int_pos.append(pos)
        elif isinstance(k, (Tensor, list, tuple)) or hasattr(k, "__array_interface__"):
            if arr is not None:
                raise IndexingError("getitem: only one integer-array index is supported; "
                                    "index one axis at a time")
            slices.append((0, n, 1))
            arr = (axis, _index_array(k, x, axis), pos)
        elif isinstance(k, bool):
            raise IndexingError("getitem: a bool scalar index is not supported")
        else:
            raise IndexingError(f"getitem: unsupported index {k!r} of type {type(k).__name__} (axis {axis})")
        axis += 1

    y = x
    if any(s != (0, n, 1) for s, n in zip(slices, x.shape)):
        y = apply("slice", x, slices=tuple(slices))
    if arr is not None:
        y = take(y, arr[1], axis=arr[0])

    # Result shape: None -> 1, int -> dropped, slice -> its size, array -> the index's shape.
    final = []
    p = 0
    arr_at = None
    for pos, k in enumerate(key):
        if k is None:
            final.append(1)
        elif arr is not None and pos == arr[2]:
            arr_at = len(final)
            final.extend(y.shape[p:p + arr[1].ndim])
            p += arr[1].ndim
        elif isinstance(k, slice):
            final.append(y.shape[p])
            p += 1
        else:  # an int: its size-1 axis is dropped
            p += 1
    y = reshape(y, tuple(final))
    if arr is not None and int_pos:
        positions = sorted(int_pos + [arr[2]])
        if positions != list(range(positions[0], positions[0] + len(positions))) and arr_at:
            # numpy: separated advanced indices put the broadcast index axes first
            nd = arr[1].ndim
            order = list(range(arr_at, arr_at + nd)) + [a for a in range(y.ndim) if not arr_at <= a < arr_at + nd]
            y = permute_dims(y, order)
    return y


def _setitem(self, key, value):
    raise UnsupportedOp("setitem: ember tensors are immutable; build a new tensor with ember.where, "
                        "ember.concat or ember.full instead")


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    for i in range(self.shape[0]):
        yield getitem(self, i)


Tensor.__getitem__ = getitem
Tensor.__setitem__ = _setitem
Tensor.__iter__ = _iter
