"""Backward-only kernels of the numpy backend (autodiff): ``scatter_add`` and the pooling
gradients. ``create_backend`` is the numpy device's factory: the numpy backend with these
kernels added (kept apart from numpy_backend.py / numpy_nn.py, the forward kernels)."""
from __future__ import annotations

import numpy as np

from ..errors import IndexingError
from .numpy_backend import NumpyBackend, np_dtype


def _scatter_add(out, u, idx, *, axis, size, **_):
    ids = idx._buf.astype(np.int64)
    if ids.size and (ids.min() < -size or ids.max() >= size):
        bad = ids.min() if ids.min() < -size else ids.max()
        raise IndexingError(f"scatter_add: index {bad} is out of range for axis {axis} with size {size}")
    ids = np.where(ids < 0, ids + size, ids)
    ub = u._buf
    acc = np.zeros(out.shape, dtype=np.float64 if out.dtype.kind == "f" else np.int64)
    if all(m == 1 for a, m in enumerate(idx.shape) if a != axis):
        flat = ids.reshape(-1)
        outer = int(np.prod(u.shape[:axis], dtype=np.int64))
        inner = int(np.prod(u.shape[axis + 1:], dtype=np.int64))
        a3 = acc.reshape(outer, size, inner)
        u3 = ub.reshape(outer, len(flat), inner)
        if outer == 1 and inner > 1:
            # rows of an embedding table: sort once, add contiguous runs with reduceat
            order = np.argsort(flat, kind="stable")
            srt = flat[order]
            starts = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]]) if len(srt) else srt
            if len(srt):
                a3[0, srt[starts]] = np.add.reduceat(u3[0, order].astype(np.float64), starts, axis=0)
        else:
            np.add.at(a3, (slice(None), flat), u3)
    else:
        ib = np.broadcast_to(ids, u.shape)
        grids = list(np.indices(u.shape, sparse=True))
        grids[axis] = ib
        np.add.at(acc, tuple(grids), ub)
    return acc.astype(np_dtype(out.dtype))


KERNELS = {
    "scatter_add": _scatter_add,
}


def create_backend() -> NumpyBackend:
    b = NumpyBackend()
    b.kernels.update(KERNELS)
    return b
