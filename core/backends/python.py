"""The pure-Python backend: the living specification. Flat, contiguous, row-major
``array.array`` buffers; runs anywhere CPython or Pyodide runs, with no dependency.

Values are computed with Python floats/ints and stored back into the dtype's array, which rounds
float32 (and float16, see ``dtypes``) and wraps integers like a real cast.
"""
from __future__ import annotations

import math
import struct
from array import array
from math import prod

from .. import dtypes as _dt


def _store(values, dtype) -> array:
    """Python values -> the buffer of ``dtype`` (rounding / wrapping like a cast)."""
    if dtype is _dt.float16:
        from ..tensor import _round_half

        return array("f", _round_half(values))
    if dtype.kind == "f":
        return array("f", values)
    if dtype is _dt.bool_:
        return array("B", [1 if v else 0 for v in values])
    try:
        return array(dtype.typecode, values)
    except OverflowError:
        bits = dtype.itemsize * 8
        if dtype.kind == "u":
            return array(dtype.typecode, [int(v) % (1 << bits) for v in values])
        half = 1 << (bits - 1)
        return array(dtype.typecode, [((int(v) + half) % (1 << bits)) - half for v in values])


def broadcast_index(in_shape, out_shape):
    """For each flat output position, the flat input position under broadcasting
    (``range`` when no broadcasting happens)."""
    n_out = prod(out_shape)
    if tuple(in_shape) == tuple(out_shape):
        return range(n_out)
    nd = len(out_shape)
    in_shape = (1,) * (nd - len(in_shape)) + tuple(in_shape)
    idx = [0]
    stride = 1
    for ax in range(nd - 1, -1, -1):  # innermost first: idx covers axes ax+1.. so far
        n = out_shape[ax]
        s = stride if in_shape[ax] != 1 else 0
        idx = idx * n if s == 0 else [k * s + i for k in range(n) for i in idx]
        stride *= in_shape[ax]
    return idx


class PythonBackend:
    """``device="python"``: pure Python, ``array.array`` storage."""

    name = "python"

    def __init__(self):
        self.kernels = dict(KERNELS)

    @staticmethod
    def available():
        return True, "pure Python, always available"

    def from_bytes(self, data, shape, dtype) -> array:
        if dtype is _dt.float16:
            n = len(data) // 2
            return array("f", struct.unpack(f"<{n}e", data))
        a = array(dtype.typecode)
        a.frombytes(bytes(data))
        return a

    def to_bytes(self, buf, shape, dtype) -> bytes:
        if dtype is _dt.float16:
            return struct.pack(f"<{len(buf)}e", *buf)
        return buf.tobytes()

    async def to_bytes_async(self, buf, shape, dtype) -> bytes:
        return self.to_bytes(buf, shape, dtype)


# ---- kernels ---------------------------------------------------------------------------------

def _full(out, *, shape, value, dtype, **_):
    return _store([value], dtype) * prod(out.shape)


def _binary(fn):
    def kernel(out, a, b):
        ia = broadcast_index(a.shape, out.shape)
        ib = broadcast_index(b.shape, out.shape)
        A, B = a._buf, b._buf
        if isinstance(ia, range) and isinstance(ib, range):
            return _store(list(map(fn, A, B)), out.dtype)
        return _store([fn(A[i], B[j]) for i, j in zip(ia, ib)], out.dtype)
    return kernel


def _unary(fn):
    def kernel(out, x):
        return _store(list(map(fn, x._buf)), out.dtype)
    return kernel


KERNELS = {
    "full": _full,
    "add": _binary(lambda x, y: x + y),
    "multiply": _binary(lambda x, y: x * y),
    "exp": _unary(lambda x: math.exp(x) if x < 709 else math.inf),
}

from .python_nn import KERNELS as _NN_KERNELS  # noqa: E402

KERNELS.update(_NN_KERNELS)
