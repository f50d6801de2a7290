"""Layout kernels of the wasm backend: permute_dims, broadcast_to, slice, concat as one strided
copy each (``copy.c``), for every dtype (1-, 4- and 8-byte elements; float16 is stored as
float32 in this backend). Views of rank > 6 after merging axes run the python kernel.

``take`` (int32 indices) is one call of ``take_x*``, which checks every index before it reads
anything and reports the first bad one through its i32 result; the wrapper then runs the python
kernel, which raises ``IndexingError`` naming the index. In a replayed plan's command table the
call is a guarded command: a position past the end stops the table and the same error is raised.

>>> import ember
>>> t = ember.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device="wasm")   # doctest: +SKIP
>>> ember.take(t, ember.tensor([2, -3], dtype="int32", device="wasm"), axis=0).tolist()   # doctest: +SKIP
[[5.0, 6.0], [1.0, 2.0]]
"""
from __future__ import annotations

from array import array
from math import prod

from ..backends import python as _py
from .fallback import PY
from .runtime import R, W
from .team import Moved

_FN = {1: "copy_strided_x8", 4: "copy_strided_x32", 8: "copy_strided_x64"}
RANK = 6


def merge_dims(shape, strides):
    """(shape, strides) lists of the merged view (``python.merge_dims``)."""
    merged = _py.merge_dims(shape, strides)
    return [m for m, _ in merged], [s for _, s in merged]


def _reach(shape, strides, offset):
    """(lowest, highest) element index a strided view touches (for the bounds check)."""
    lo = hi = offset
    for m, s in zip(shape, strides):
        if s > 0:
            hi += (m - 1) * s
        else:
            lo += (m - 1) * s
    return lo, hi


def make_gather(rt):
    """``gather(buf, shape, strides, offset) -> array``: the python backend's ``gather`` on the
    SIMD module (same contract), or the python one when the view is too high-rank."""
    def gather(buf, shape, strides, offset=0, out_buf=None, out_offset=0):
        n = prod(shape)
        fn = _FN.get(buf.itemsize)
        sh, st = merge_dims(shape, strides)
        if n == 0:
            return out_buf if out_buf is not None else array(buf.typecode) if buf.__class__ is Moved else buf[:0]
        if fn is None or len(sh) > RANK:   # (Python reads buf: a moved one gets its elements, team.Moved)
            if out_buf is None:
                return _py.gather(buf, shape, strides, offset)
            out_buf[out_offset:out_offset + n] = _py.gather(buf, shape, strides, offset)
            return out_buf
        # a contiguous run: one C-level slice (of an array in the thread team's shared memory,
        # team.Moved, a copy made there: Python would need all of its elements first)
        if len(sh) <= 1 and (not st or st[0] == 1) and out_buf is None and buf.__class__ is not Moved:
            return buf[offset:offset + n]
        lo, hi = _reach(sh, st, offset)
        pad = RANK - len(sh)
        shp = array("i", [1] * pad + sh)
        stp = array("i", [0] * pad + st)
        dst = out_buf if out_buf is not None else array(buf.typecode, bytes(n * buf.itemsize))
        # The kernel walks from element `offset`; the span R(...) covers exactly what it reads.
        rt.call(fn, R(buf, hi - lo + 1, lo, offset), W(dst, n, out_offset), R(shp, RANK), R(stp, RANK))
        return dst
    return gather


_TAKE = {1: "take_x8", 4: "take_x32", 8: "take_x64"}


def make_take(rt):
    """The ``take`` kernel: int32 indices on the module, anything else on the python kernel."""
    py = PY["take"]
    call = rt.call

    def take(out, x, idx, *, axis, **attrs):
        buf, ib = x._buf, idx._buf
        fn = _TAKE.get(buf.itemsize)
        n = x.shape[axis]
        outer, inner, m = prod(x.shape[:axis]), prod(x.shape[axis + 1:]), len(ib)
        total = outer * m * inner
        if fn is None or ib.__class__ is not array or ib.typecode != "i" or total == 0 or n == 0:
            return py(out, x, idx, axis=axis, **attrs)
        dst = array(buf.typecode, bytes(total * buf.itemsize))
        if call(fn, R(buf, outer * n * inner), R(ib, m), W(dst, total), outer, n, inner, m):
            return py(out, x, idx, axis=axis, **attrs)   # an index out of range: IndexingError
        return dst
    return take


def kernels(rt) -> dict:
    gather = make_gather(rt)

    def permute_dims(out, x, *, axes, **_):
        st = _py.contiguous_strides(x.shape)
        return gather(x._buf, out.shape, [st[a] for a in axes])

    def broadcast_to(out, x, **_):
        return gather(x._buf, out.shape, _py.broadcast_strides(x.shape, out.shape))

    def slice_(out, x, *, slices, **_):
        st = _py.contiguous_strides(x.shape)
        offset = sum(s[0] * k for s, k in zip(slices, st))
        return gather(x._buf, out.shape, [s[2] * k for s, k in zip(slices, st)], offset)

    return {"permute_dims": permute_dims, "broadcast_to": broadcast_to, "slice": slice_, "take": make_take(rt)}
