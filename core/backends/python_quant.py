"""Quantized-weight kernels of the pure-Python backend: the specification of ``dequantize``,
``qlinear`` and ``qembedding`` (``ember.ops.quant``). They decode with the reference
``FORMATS[qtype].dequantize`` one row at a time, so ``qlinear`` and ``qembedding`` never hold
more than one float row of the weight. The wasm backend inherits them with the python table."""
from __future__ import annotations

import operator
import sys
from array import array

from ..errors import IndexingError
from ..quant import FORMATS, row_bytes

try:  # Python >= 3.12 (Pyodide): a C dot product
    from math import sumprod as _dot
except ImportError:  # pragma: no cover - Python 3.11 hosts
    def _dot(a, b, _mul=operator.mul):
        return sum(map(_mul, a, b))


def _raw(w) -> bytes:
    """The little-endian bytes of an int32 word buffer."""
    buf = w._buf
    if sys.byteorder == "big":  # pragma: no cover - every platform ember runs on is little-endian
        buf = array(buf.typecode, buf)
        buf.byteswap()
    return buf.tobytes()


def _dequantize(out, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    return FORMATS[qtype].dequantize(_raw(w)[:n * rb]) if n else array("f")


def _qlinear(out, x, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    deq = FORMATS[qtype].dequantize
    raw = _raw(w)
    xb = x._buf
    m = 1   # rows of x
    for s in x.shape[:-1]:
        m *= s
    rows = [xb[i * k:(i + 1) * k] for i in range(m)]
    res = array("f", bytes(4 * m * n))
    for j in range(n):
        wr = deq(raw[j * rb:(j + 1) * rb])
        for i, xr in enumerate(rows):
            res[i * n + j] = _dot(xr, wr)
    return res


def _qembedding(out, ids, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    deq = FORMATS[qtype].dequantize
    raw = _raw(w)
    res = array("f")
    for i in ids._buf:
        if not 0 <= i < n:
            raise IndexingError(f"qembedding: id {i} is out of range for a {qtype} weight of {n} rows "
                                f"(ids must be in [0, {n}))")
        res += deq(raw[i * rb:(i + 1) * rb])
    return res


KERNELS = {
    "dequantize": _dequantize,
    "qlinear": _qlinear,
    "qembedding": _qembedding,
}
