"""The numpy backend's row kernels in C (core/native/rows.c), where ember.native is loaded.

numpy makes one pass over memory per operation: GELU is ~17 passes, a layer norm ~8, a softmax
~4, DynamicQuantizeLinear ~6, and MatMulInteger runs as float32 BLAS on a float copy of its
uint8 input. The kernels here are one loop per row (or element) instead:

- ``gelu`` (erf and tanh forms), ``layer_norm`` (one normalized axis, float32 weight and bias),
  ``softmax`` (last axis): each returns the float32 result, or None where the library is not in
  use or the case is not one the kernel takes (then the numpy path runs). Non-contiguous inputs
  are copied contiguous first. Large inputs are split into whole-row ranges over
  ``numpy_blas.parallel_for`` (ctypes releases the GIL): the bits do not depend on the threads.
- ``dynamic_quantize``: DynamicQuantizeLinear whole (range, scale, zero point, y) in one call.
- ``QGemm``: MatMulInteger's ``(A - za) @ W`` for uint8 A and a constant W of int8 values, with
  W packed once (for vpdpbusd: 64 columns by 4 values of k) and exact int32 results, or float32
  ones (the int32 value converted). Used only where the library's product is vectorised
  (``ember_qgemm_vectorised``: AVX-512 VNNI here); elsewhere float32 BLAS stays faster.

Accuracy (tests/test_native_rows.py, against float64): GELU erf within 4e-7 absolute (the numpy
path: 5.5e-7), <= 1 ulp for x >= 3, <= 2.5 ulp on [-1, 3), <= 5.3 ulp relative on [-8, -1) and 8
on the tail below -8 (values under 1e-14; the numpy path is accurate there in absolute terms
only: gelu(-5) 0.2% off); tanh form within 6e-7; layer norm and softmax within a few ulp (other
summation orders than numpy's).
"""
from __future__ import annotations

import ctypes

import numpy as np

from .. import native
from .numpy_blas import parallel_for, threads

_P, _I64, _F32, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32
# elements from which a call is split over the threads: ~120-250 us of work on one thread. A
# handoff to parallel_for's helper costs 15-40 us here, more while the other core is busy: at
# 8x32x512 (GELU, 120 us) two threads were no faster on this 2-core machine under load 1-2, and
# layer norm / softmax at 32768 values (20-25 us) 1.5x slower
PARALLEL_ELEMENTS = 1 << 18
_F = np.dtype(np.float32)


def _contig(a):
    return a if a.flags.c_contiguous and a.dtype == _F else np.ascontiguousarray(a, dtype=np.float32)


def _ranges(rows: int, cost: int) -> list:
    """Whole-row ranges for the threads: one range below PARALLEL_ELEMENTS, else one per thread."""
    t = threads() if rows > 1 and cost >= PARALLEL_ELEMENTS else 1
    t = min(t, rows)
    return [(rows * i // t, rows * (i + 1) // t) for i in range(t)]


def _run(ranges, call) -> None:
    if len(ranges) == 1:
        call(*ranges[0])
    else:
        parallel_for(len(ranges), lambda i: call(*ranges[i]))


def gelu(a, approximate: str):
    """GELU of float32 ``a`` (any shape) by ember_gelu_erf / ember_gelu_tanh, or None."""
    name = "ember_gelu_tanh" if approximate == "tanh" else "ember_gelu_erf" if approximate == "none" else None
    fn = None if name is None or a.dtype != _F else native.kernel(name, None, _I64, _P, _P)
    if fn is None:
        return None
    x = _contig(a)
    y = np.empty(x.shape, np.float32)
    n = x.size
    if n:
        # elements in blocks of 16 (whole vectors), so a split changes no element's code path
        blocks = (n + 15) // 16
        xp, yp = x.ctypes.data, y.ctypes.data

        def call(b0, b1):
            e0, e1 = b0 * 16, min(b1 * 16, n)
            fn(e1 - e0, xp + 4 * e0, yp + 4 * e0)
        _run(_ranges(blocks, n), call)
    return y


def softmax(a):
    """softmax over the last axis of float32 ``a`` (ndim >= 1, rows of >= 1 value), or None."""
    fn = None if a.dtype != _F or a.ndim == 0 or a.size == 0 else native.kernel("ember_softmax", None, _I64, _I64,
                                                                                  _P, _P)
    if fn is None:
        return None
    x = _contig(a)
    n = x.shape[-1]
    rows = x.size // n
    y = np.empty(x.shape, np.float32)
    xp, yp = x.ctypes.data, y.ctypes.data
    _run(_ranges(rows, x.size), lambda r0, r1: fn(r1 - r0, n, xp + 4 * r0 * n, yp + 4 * r0 * n))
    return y


def layer_norm(a, weight, bias, eps: float):
    """layer norm of float32 ``a`` over its last axis with (n,) float32 weight and bias, or None."""
    if a.dtype != _F or a.ndim == 0 or a.size == 0 or weight.dtype != _F or bias.dtype != _F:
        return None
    n = a.shape[-1]
    if weight.size != n or bias.size != n:
        return None
    fn = native.kernel("ember_layer_norm", None, _I64, _I64, _P, _P, _P, _F32, _P)
    if fn is None:
        return None
    x, w, b = _contig(a), _contig(weight), _contig(bias)
    rows = x.size // n
    y = np.empty(x.shape, np.float32)
    xp, yp, wp, bp = x.ctypes.data, y.ctypes.data, w.ctypes.data, b.ctypes.data
    e = float(np.float32(eps))
    _run(_ranges(rows, x.size),
         lambda r0, r1: fn(r1 - r0, n, xp + 4 * r0 * n, wp, bp, e, yp + 4 * r0 * n))
    return y


# ---- int8 -----------------------------------------------------------------------------------------

def dynamic_quantize(a, consts, centered: bool):
    """DynamicQuantizeLinear of float32 ``a`` in one native call (rows.c's ember_dynamic_quantize:
    the numpy path's float32 operations), ``consts`` its float32 constants (lo0, hi0, n255, zero,
    one, zlo, zhi, ylo, yhi; 0 <= zlo <= zhi <= 255): (y, scale, zero point) as uint8, float32 0-d
    and uint8 0-d arrays, y as float32 ``y - zp`` when ``centered``; None where the library is not
    in use or ``a`` holds NaN or inf (the numpy path's recorded steps then run)."""
    fn = None if a.dtype != _F or a.size == 0 else native.kernel(
        "ember_dynamic_quantize", ctypes.c_int, _I64, _P, _P, _P, _P, _P, _P)
    if fn is None:
        return None
    x = _contig(a)
    y = np.empty(x.shape, np.float32 if centered else np.uint8)
    scale = np.empty((), np.float32)
    zp = np.empty((), np.uint8)
    yp = y.ctypes.data
    if not fn(x.size, x.ctypes.data, consts.ctypes.data, scale.ctypes.data, zp.ctypes.data,
              None if centered else yp, yp if centered else None):
        return None
    return y, scale, zp


QN = 64          # the packed weight's block of columns (rows.c's QN)
# K from which the int32 sums could overflow: K * 255 * 128 < 2**31
_QGEMM_MAX_K = (2 ** 31 - 1) // (255 * 128)


def qgemm_available() -> bool:
    """Whether the library is in use and its integer product vectorised (else BLAS is faster)."""
    fn = native.kernel("ember_qgemm_vectorised", ctypes.c_int)
    return fn is not None and fn() == 1


def pack_weight(w):
    """(packed int8 blocks, padded int32 column sums) of an integer (K, N) matrix ``w`` whose values
    are in [-128, 127] (see rows.c's ember_qgemm), or None when they are not or K is too large."""
    w = np.asarray(w)
    if w.ndim != 2 or not w.size or w.shape[0] > _QGEMM_MAX_K or w.dtype.kind not in "iu" \
            or w.min() < -128 or w.max() > 127:
        return None
    k, n = w.shape
    kp, np_ = -(-k // 4) * 4, -(-n // QN) * QN
    w8 = np.zeros((kp, np_), np.int8)
    w8[:k, :n] = w
    packed = np.ascontiguousarray(w8.reshape(kp // 4, 4, np_ // QN, QN).transpose(2, 0, 3, 1))
    colsum = np.zeros(np_, np.int32)
    colsum[:n] = w.astype(np.int64).sum(axis=0)
    return packed, colsum


class QGemm:
    """``(A - za) @ W`` for uint8 A (..., K) and a constant integer W (K, N) with int8 values,
    packed once; ``__call__`` returns int32 (or float32 with ``as_float``) (..., N), or None
    where the library is not in use or its product is not vectorised (the caller's path runs)."""

    def __init__(self, w, generic: bool = False):
        w = np.asarray(w)
        self.k, self.n = w.shape
        self.packed = pack_weight(w)
        self.name = "ember_qgemm_generic" if generic else "ember_qgemm"
        self.generic = generic

    @property
    def ok(self) -> bool:
        return self.packed is not None

    def __call__(self, a, za, as_float: bool = False):
        if self.packed is None or a.dtype != np.uint8 or a.ndim < 1 or a.shape[-1] != self.k:
            return None
        if not self.generic and not qgemm_available():
            return None
        fn = native.kernel(self.name, None, _I64, _I64, _I64, _I64, _P, _I64, _I32, _P, _P, _P, _P, _I64)
        if fn is None:
            return None
        x = np.ascontiguousarray(a)
        m = x.size // self.k if self.k else 0
        y = np.empty(x.shape[:-1] + (self.n,), np.float32 if as_float else np.int32)
        if m == 0 or self.n == 0:
            return y
        packed, colsum = self.packed
        xp, yp, pp, cp = x.ctypes.data, y.ctypes.data, packed.ctypes.data, colsum.ctypes.data
        zi = int(za)
        _run(_ranges(m, m * self.k * self.n // 128),         # (~150 multiply-adds a ns on one core)
             lambda r0, r1: fn(r0, r1, self.k, self.n, xp, self.k, zi, pp, cp,
                               None if as_float else yp, yp if as_float else None, self.n))
        return y
