"""Backward-only kernels of the pure-Python backend (autodiff): ``scatter_add`` and the pooling
gradients. The wasm backend inherits them with the rest of the python table."""
from __future__ import annotations

from array import array
from math import prod

from ..errors import IndexingError
from .python import _store, broadcast_index, contiguous_strides


def _scatter_add(out, u, idx, *, axis, size, **_):
    shape = u.shape
    n_out = prod(out.shape)
    acc = [0.0 if out.dtype.kind == "f" else 0] * n_out
    outer, k, inner = prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])
    ub = u._buf

    def norm(i):
        if not -size <= i < size:
            raise IndexingError(f"scatter_add: index {i} is out of range for axis {axis} with size {size}")
        return i + size if i < 0 else i

    if all(m == 1 for a, m in enumerate(idx.shape) if a != axis):
        ids = [norm(i) for i in idx._buf]     # one index per position along axis: whole rows
        for o in range(outer):
            for j, i in enumerate(ids):
                s = (o * size + i) * inner
                src = (o * k + j) * inner
                acc[s:s + inner] = map(float.__add__, acc[s:s + inner], ub[src:src + inner]) \
                    if out.dtype.kind == "f" else [a + b for a, b in zip(acc[s:s + inner], ub[src:src + inner])]
        return _store(acc, out.dtype)
    ib = idx._buf
    pos = broadcast_index(idx.shape, shape)
    ost = contiguous_strides(out.shape)[axis]
    for flat, (v, p) in enumerate(zip(ub, pos)):
        o, rest = divmod(flat, k * inner)
        r = rest % inner
        acc[o * size * inner + norm(ib[p]) * ost + r] += v
    return _store(acc, out.dtype)


KERNELS = {
    "scatter_add": _scatter_add,
}
