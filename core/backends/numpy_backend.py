"""The numpy backend (optional): buffers are C-contiguous numpy arrays of the tensor's shape.
float16 stays float16 in memory; arithmetic on it runs in float32 and rounds back.

Every kernel returns an array of exactly the output dtype and shape; semantics that numpy
leaves to the platform (float -> int casts of NaN or out-of-range values) are pinned to the
python backend's (saturate, NaN -> 0).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import IndexingError
from .numpy_blas import matmul

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64,
             "uint8": np.uint8, "bool": np.bool_, "float64": np.float64, "int8": np.int8, "int16": np.int16,
             "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64}


def np_dtype(dtype):
    return NP_DTYPES[dtype.name]


# glibc malloc: freed heap memory is given back to the system (trimmed) once more than
# M_TRIM_THRESHOLD of it is free at the top of the heap, and blocks over M_MMAP_THRESHOLD get an
# mmap of their own, unmapped when freed. A training step allocates and frees tens of MB of
# activations and gradients (arrays of a few MB each): by default that memory goes back to the
# system at the end of every step and comes back one zero-filled page fault per 4 KB on the next
# (~4,500 faults, ~15 ms of system time per MNIST CNN step at batch 64, a quarter of the step).
# The numpy device keeps it instead: blocks up to 32 MB (glibc's own ceiling for its adaptive
# threshold) come from the heap, and up to 256 MB of free heap stays mapped.
# EMBER_NUMPY_MALLOC=default leaves the process's malloc settings alone.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MALLOC_SETTINGS = {_M_TRIM_THRESHOLD: 256 << 20, _M_MMAP_THRESHOLD: 32 << 20}
_MALLOC_TUNED = [False]


def tune_malloc() -> bool:
    """Apply ``MALLOC_SETTINGS`` with glibc's ``mallopt`` (once per process; Linux with glibc
    only, not under ``EMBER_NUMPY_MALLOC=default``). Returns whether the settings are in effect."""
    import os
    import sys

    if _MALLOC_TUNED[0]:
        return True
    if os.environ.get("EMBER_NUMPY_MALLOC", "").lower() == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):   # musl & co: other allocators, other knobs
            return False
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        ok = all(mallopt(k, v) == 1 for k, v in MALLOC_SETTINGS.items())
    except (OSError, AttributeError):   # pragma: no cover - no ctypes / no libc symbols
        return False
    _MALLOC_TUNED[0] = ok
    return ok


class NumpyBackend:
    """``device="numpy"``: numpy arrays, vectorised kernels."""

    name = "numpy"

    def __init__(self):
        self.kernels = dict(KERNELS)

    @staticmethod
    def available():
        return True, f"numpy {np.__version__}"

    def compile_plan(self, plan):
        """A replay of ``plan`` with activation chains fused and elementwise steps in place
        (``numpy_plan``), or None."""
        from .numpy_plan import compile_plan
        return compile_plan(plan)

    def from_bytes(self, data, shape, dtype):
        if dtype is _dt.bool_:  # any nonzero byte is True
            return (np.frombuffer(bytes(data), dtype=np.uint8) != 0).reshape(shape)
        return np.frombuffer(bytes(data), dtype=np.dtype(np_dtype(dtype)).newbyteorder("<")).astype(
            np_dtype(dtype), copy=True).reshape(shape)

    def from_array(self, a, dtype):
        """A copy of numpy array ``a``, already C-contiguous in ``dtype``'s little-endian layout
        (``ember.from_numpy``): one copy, not bytes and back (what ``from_bytes`` would give)."""
        return np.array(a, dtype=np_dtype(dtype), copy=True)

    def to_bytes(self, buf, shape, dtype) -> bytes:
        return np.ascontiguousarray(buf, dtype=np.dtype(np_dtype(dtype)).newbyteorder("<")).tobytes()

    async def to_bytes_async(self, buf, shape, dtype) -> bytes:
        return self.to_bytes(buf, shape, dtype)


_NPD = {name: np.dtype(t) for name, t in NP_DTYPES.items()}


def _out(a, out):
    """``a`` as a C-contiguous array of the output dtype and shape."""
    want = _NPD[out.dtype.name]
    if type(a) is np.ndarray and a.dtype == want and a.flags.c_contiguous:   # the usual case: as is
        return a if a.shape == out.shape else a.reshape(out.shape)
    return np.ascontiguousarray(np.asarray(a).astype(want, copy=False)).reshape(out.shape)


def _f32(x):
    """Compute float16 in float32 (numpy's half loops differ between platforms)."""
    b = x._buf
    return b.astype(np.float32) if b.dtype == np.float16 else b


# ---- creation --------------------------------------------------------------------------------

def _full(out, *, value, **_):
    return np.full(out.shape, value, dtype=np_dtype(out.dtype))


def _arange(out, *, start, step, **_):
    if out.dtype.kind == "f":
        return _out(np.arange(out.shape[0], dtype=np.float64) * step + start, out)
    return _out(np.arange(out.shape[0], dtype=np.int64) * step + start, out)


# ---- elementwise -----------------------------------------------------------------------------

def _unary(fn, int_fn=None, quiet=True):
    """``quiet``: the function can raise floating-point warnings (exp overflow, log(-1)...),
    which numpy's errstate silences (IEEE results stand); the others skip its cost."""
    def run(out, x):
        if int_fn is not None and x.dtype.kind != "f":
            return _out(int_fn(x._buf), out)
        a = _f32(x)
        if out.dtype.kind == "f" and a.dtype.kind != "f":
            a = a.astype(np.float32)  # exp/sqrt/... of ints compute in float32
        return _out(fn(a), out)

    if not quiet:
        return run

    def kernel(out, x):
        with np.errstate(all="ignore"):
            return run(out, x)
    return kernel


def _same(a):
    return a.copy()


def _round(a):
    return np.rint(a)  # half to even


_UNARY = {   # name: (float function, integer function or None, can raise FP warnings)
    "negative": (np.negative, None, False),
    "abs": (np.abs, None, False),
    "exp": (np.exp, None, True),
    "log": (np.log, None, True),
    "sqrt": (np.sqrt, None, True),
    "sin": (np.sin, None, True),
    "cos": (np.cos, None, True),
    "tanh": (np.tanh, None, False),
    "sign": (np.sign, None, False),
    "floor": (np.floor, _same, False),
    "ceil": (np.ceil, _same, False),
    "round": (_round, _same, False),
    "isnan": (np.isnan, lambda a: np.zeros(a.shape, dtype=bool), False),
    "logical_not": (np.logical_not, None, False),
    "acos": (np.arccos, None, True),
    "acosh": (np.arccosh, None, True),
    "asin": (np.arcsin, None, True),
    "asinh": (np.arcsinh, None, True),
    "atan": (np.arctan, None, True),
    "atanh": (np.arctanh, None, True),
    "cosh": (np.cosh, None, True),
    "sinh": (np.sinh, None, True),
    "tan": (np.tan, None, True),
    "expm1": (np.expm1, None, True),
    "log1p": (np.log1p, None, True),
    "log2": (np.log2, None, True),
    "log10": (np.log10, None, True),
    "trunc": (np.trunc, _same, False),
    "signbit": (np.signbit, lambda a: a < 0, False),
    "bitwise_invert": (None, np.invert, False),
}


def _erf(out, x):
    """erf in float32, vectorised (numpy_nn.erf_f32: two fitted polynomial pieces)."""
    from .numpy_nn import erf_f32
    return _out(erf_f32(_f32(x)), out)


def _common(a, b, out):
    """Both inputs in the dtype the op computes in (float16 via float32)."""
    A, B = a._buf, b._buf
    if a.dtype is b.dtype and (a.dtype is out.dtype or out.dtype is _dt.bool_) and a.dtype is not _dt.float16:
        return A, B                                      # the usual case: nothing to convert
    ct = np_dtype(out.dtype) if out.dtype is not _dt.bool_ else None
    if ct is None:  # comparisons / logical ops: compare in the promoted dtype
        ct = np_dtype(_dt.result_type(a.dtype, b.dtype))
    if ct is np.float16:
        ct = np.float32
    return A.astype(ct, copy=False), B.astype(ct, copy=False)


def _binary(fn, quiet=True):
    """``quiet``: float inputs can raise FP warnings (inf - inf, overflow, x / 0), which
    numpy's errstate silences; integer inputs and the ops that never warn skip its cost."""
    def kernel(out, a, b):
        A, B = _common(a, b, out)
        if quiet and (A.dtype.kind == "f" or B.dtype.kind == "f"):
            with np.errstate(all="ignore"):
                return _out(fn(A, B), out)
        return _out(fn(A, B), out)
    return kernel


def _int_div(fn):
    """numpy gives 0 for integer division by zero already; keep it explicit and warning-free."""
    def f(A, B):
        if A.dtype.kind in "iub" and B.dtype.kind in "iub":
            safe = np.where(B == 0, 1, B)
            return np.where(B == 0, 0, fn(A, safe))
        return fn(A, B)
    return f


def _pow(A, B):
    if A.dtype.kind in "iu":
        neg = B < 0
        if neg.any():  # truncate 1 / a**|b| toward zero, like the python backend
            r = np.power(A, np.where(neg, 0, B))
            special = np.where(A == 1, 1, np.where(A == -1, np.where(B % 2 == 1, -1, 1), 0))
            return np.where(neg, special, r)
    return np.power(A, B)


def _shift(fn, A, B):
    """Shifts pinned to the python backend's (Python's) results: a count of the width or more
    gives 0 (-1 for a negative value shifted right), a negative count 0."""
    bits = A.dtype.itemsize * 8
    if A.dtype == np.bool_:
        A, B = A.astype(np.int64), B.astype(np.int64)
    r = fn(A, np.clip(B, 0, bits - 1).astype(A.dtype))
    over = np.where((A < 0) & (fn is np.right_shift), -1, 0).astype(A.dtype)
    return np.where(B < 0, np.zeros((), A.dtype), np.where(B >= bits, over, r))


def _floor_div_inf(fn, A, B):
    """floor_divide with an infinite operand: floor(A / B), the array API's preferred result
    (numpy and Python give nan for inf // 2 and -1.0 for -2 // inf), as the python backend."""
    r = fn(A, B)
    if A.dtype.kind == "f":
        inf = np.isinf(A) | np.isinf(B)
        if inf.any():
            r = np.where(inf, np.floor(A / B), r)
    return r


_BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.true_divide,
    "floor_divide": lambda A, B: _floor_div_inf(_int_div(np.floor_divide), A, B),
    "remainder": _int_div(np.remainder),
    "pow": _pow,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "atan2": np.arctan2,
    "copysign": np.copysign,
    "hypot": np.hypot,
    "logaddexp": np.logaddexp,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "bitwise_left_shift": lambda A, B: _shift(np.left_shift, A, B),
    "bitwise_right_shift": lambda A, B: _shift(np.right_shift, A, B),
}


def _where(out, c, x, y):
    ct = np_dtype(out.dtype)
    return _out(np.where(c._buf, x._buf.astype(ct, copy=False), y._buf.astype(ct, copy=False)), out)


_INT_LIMITS = {d.name: _dt.int_range(d) for d in _dt.ALL if d.kind in "iu"}


def _cast(out, x, *, dtype, **_):
    a = x._buf
    if out.dtype is _dt.bool_:
        return a != 0
    if out.dtype.kind in "iu" and x.dtype.kind == "f":
        # truncate toward zero, saturate, NaN -> 0 (pinned: numpy's own result is undefined)
        lo, hi = _INT_LIMITS[out.dtype.name]
        r = np.nan_to_num(a.astype(np.float64), nan=0.0)
        hi_mask = r >= float(hi)
        lo_mask = r <= float(lo)
        res = np.asarray(np.trunc(np.where(hi_mask | lo_mask, 0.0, r)).astype(np_dtype(out.dtype)))
        res[hi_mask] = hi        # (0-d arrays too: np.asarray keeps them arrays)
        res[lo_mask] = lo
        return res.reshape(out.shape)
    with np.errstate(all="ignore"):
        return _out(a.astype(np_dtype(out.dtype)), out)


def _clip(out, x, *, min=None, max=None):  # noqa: A002
    """clip with scalar bounds in one kernel (the decomposition is maximum then minimum):
    computed in the dtype the decomposition promotes to, then cast back to x's dtype."""
    a = x._buf
    floats = a.dtype.kind == "f" or any(isinstance(v, float) for v in (min, max))
    ct = np.float32 if floats and a.dtype != np.float64 else a.dtype.type
    y = a.astype(ct, copy=False)
    if floats:
        # one np.clip with both bounds: numpy's vectorised clip loop (maximum/minimum with a
        # scalar operand are ~3x slower); NaN stays NaN
        y = np.clip(y, ct(-np.inf if min is None else min), ct(np.inf if max is None else max))
    else:
        if min is not None:
            y = np.maximum(y, min)
        if max is not None:
            y = np.minimum(y, max)
    if y is a:
        y = a.copy()
    if a.dtype.kind in "iu" and y.dtype.kind == "f":
        return _out(np.trunc(y), out)          # bounds between integers: toward zero, as a cast does
    return _out(y, out)


# ---- reductions ------------------------------------------------------------------------------

# float32 sums over trailing axes of a C-contiguous array with at least this many rows and at
# most _ROW_SUM_MAX values a row go through one BLAS matrix-vector product with a ones vector:
# numpy sums each short row on its own (a squeeze-excite's global pooling, 576 rows of 49:
# ~24 us vs ~4 us). The rows are short, so float32 accumulation stays within a few ulp.
_ROW_SUM_MIN_ROWS = 16
_ROW_SUM_MAX = 1024


def _row_sums(a, axes, keepdims):
    """np.sum(a, axes) as a matrix-vector product when that fits the rule above, else None."""
    nd = a.ndim
    axes = sorted(ax % nd for ax in axes) if nd else []
    if a.dtype != np.float32 or not axes or axes != list(range(nd - len(axes), nd)) or not a.flags.c_contiguous:
        return None
    k = 1
    for ax in axes:
        k *= a.shape[ax]
    rows = a.size // k if k else 0
    if not (2 <= k <= _ROW_SUM_MAX and rows >= _ROW_SUM_MIN_ROWS):
        return None
    y = matmul(a.reshape(rows, k), np.ones(k, np.float32))
    return y.reshape(a.shape[:nd - len(axes)] + ((1,) * len(axes) if keepdims else ()))


def _reduce(fn):
    def kernel(out, x, *, axes, keepdims=False, **_):
        a = _f32(x)
        if out.dtype.kind in "iu" and a.dtype.kind in "biu":
            a = a.astype(np.int64)
        with np.errstate(all="ignore"):
            y = _row_sums(a, axes, keepdims) if fn is np.sum else None
            return _out(fn(a, axis=tuple(axes), keepdims=keepdims) if y is None else y, out)
    return kernel


def _arg(fn):
    def kernel(out, x, *, axis, keepdims=False, **_):
        return _out(fn(_f32(x), axis=axis, keepdims=keepdims), out)  # first NaN wins, like numpy
    return kernel


# ---- matmul ----------------------------------------------------------------------------------

def _matmul(out, a, b):
    A, B = a._buf, b._buf
    if out.dtype is _dt.bool_:
        return _out(np.matmul(A.astype(np.int64), B.astype(np.int64)) != 0, out)
    ct = np_dtype(out.dtype)
    if ct is np.float16:
        ct = np.float32
    if out.dtype.kind in "iu" and A.size and B.size:
        ft = _exact_float(A, B)
        if ft is not None:
            # numpy's integer matmul is a plain loop, no BLAS: float BLAS is exact here (every
            # partial sum is an integer below 2**24 / 2**53) and many times faster (int8 models'
            # MatMulInteger: |a - zp| <= 255, |w| <= 128 and k <= 514 fit float32)
            return _out(_int_matmul_as(A, B, ft), out)
    A, B = A.astype(ct, copy=False), B.astype(ct, copy=False)
    with np.errstate(all="ignore"):
        if A.ndim > 2 and B.ndim == 2 and A.flags.c_contiguous:
            # (..., M, K) @ (K, N): one GEMM over all the rows, not one per leading index
            return _out(matmul(A.reshape(_rows(A), A.shape[-1]), B), out)
        return _out(matmul(A, B), out)


def _rows(a) -> int:
    """The number of rows when every leading axis of ``a`` is flattened (0-size safe)."""
    r = 1
    for d in a.shape[:-1]:
        r *= d
    return r


def max_abs(a) -> float:
    """max |a| of a non-empty integer array, with no temporary array (-min, not abs: no
    wrap-around at the type's minimum)."""
    return max(float(a.max()), -float(a.min()))


def exact_float_type(k: int, amax: float, bmax: float):
    """float32 or float64 when a length-``k`` dot product of integers bounded by ``amax`` and
    ``bmax`` is exact in it (every partial sum below 2**24 / 2**53), else None."""
    bound = amax * bmax * k
    return np.float32 if bound < 2.0 ** 24 else np.float64 if bound < 2.0 ** 53 else None


def _exact_float(A, B):
    k = A.shape[-1]
    if A.dtype.itemsize == 1 and B.dtype.itemsize == 1:
        amax, bmax = 255.0, 255.0            # (the type's bound is a cheaper test than a pass)
    else:
        amax, bmax = max_abs(A), max_abs(B)
    return exact_float_type(k, amax, bmax)


def _int_matmul_as(A, B, ft):
    """The integer product A @ B computed with ``ft`` BLAS (exact: see exact_float_type),
    leading axes of A folded into one GEMM."""
    A, B = A.astype(ft), B.astype(ft, copy=False)
    if A.ndim > 2 and B.ndim == 2:
        return matmul(A.reshape(_rows(A), A.shape[-1]), B).reshape(A.shape[:-1] + B.shape[-1:])
    return matmul(A, B)


# ---- movement --------------------------------------------------------------------------------

def _slice(out, x, *, slices, **_):
    key = []
    for (start, _stop, step), n in zip(slices, out.shape):
        stop = start + n * step
        key.append(slice(start, stop if stop >= 0 else None, step))
    return np.ascontiguousarray(x._buf[tuple(key)])


def _check(ids, n, op, axis):
    ids = np.asarray(ids, dtype=np.int64)
    bad = (ids < -n) | (ids >= n)
    if bad.any():
        i = int(ids[bad].flat[0])
        raise IndexingError(f"{op}: index {i} is out of range for axis {axis} with size {n}")
    return np.where(ids < 0, ids + n, ids)


def _take(out, x, idx, *, axis, **_):
    ids = _check(idx._buf, x.shape[axis], "take", axis)
    a = x._buf
    if a.ndim and axis % a.ndim == a.ndim - 1 and a.size >= _REPEAT_MIN:
        y = _repeat_last(a, ids)
        if y is not None:
            return _out(y, out)
    return _out(np.take(a, ids, axis=axis), out)


# a nearest-neighbour upsampling's take along the last axis (indices 0, 0, 1, 1, ...) of 2- or
# 4-byte values: each doubling as one widening of the bits and one multiply (x * (2**bits + 1)
# puts the value's bits in both halves): 4x faster than np.take's per-element gather
_REPEAT_MIN = 1 << 14
_WIDER = {2: (np.uint16, np.uint32, (1 << 16) + 1), 4: (np.uint32, np.uint64, (1 << 32) + 1)}


def _repeat_last(a, ids):
    """``np.take(a, ids, axis=-1)`` when ids repeat each index 2**m times in order (m >= 1) and
    ``a`` is C-contiguous with 2- or 4-byte items, bit for bit; else None."""
    n = a.shape[-1]
    if a.itemsize not in _WIDER or not a.flags.c_contiguous or ids.ndim != 1 or n == 0 or ids.size % n:
        return None
    r = ids.size // n
    if r < 2 or r & (r - 1) or not np.array_equal(ids, np.repeat(np.arange(n), r)):
        return None
    y = a
    while r > 1:
        narrow, wide, k = _WIDER[y.itemsize]
        w = y.view(narrow).astype(wide)
        w *= wide(k)                                      # (bits << half) + bits: no carry
        y = w.view(a.dtype).reshape(y.shape[:-1] + (2 * y.shape[-1],))
        r //= 2
    return y


def _take_along_axis(out, x, idx, *, axis, **_):
    ids = _check(idx._buf, x.shape[axis], "take_along_axis", axis)
    shape = list(out.shape)
    xshape = list(shape)
    xshape[axis] = x.shape[axis]
    return _out(np.take_along_axis(np.broadcast_to(x._buf, xshape), np.broadcast_to(ids, shape), axis=axis), out)


def _concat(out, *xs, axis, **_):
    ct = np_dtype(out.dtype)
    return np.concatenate([t._buf.astype(ct, copy=False) for t in xs], axis=axis)


def _la(fn, n=1):
    """ember.linalg's factorizations on numpy.linalg (float16 computes in float32)."""
    def kernel(out, *xs, **kw):
        args = [_f32(x) for x in xs]
        with np.errstate(all="ignore"):
            try:
                r = fn(*args, **kw)
            except np.linalg.LinAlgError:   # singular / not positive-definite: nan, like the python kernels
                shapes = [m.shape for m in out] if n > 1 else [out.shape]
                r = tuple(np.full(s, np.nan) for s in shapes)
                r = r if n > 1 else r[0]
        if n == 1:
            return _out(r, out)
        return tuple(_out(a, m) for a, m in zip(r, out))
    return kernel


def _cholesky(a, upper=False):
    L = np.linalg.cholesky(a)
    return np.swapaxes(L, -1, -2) if upper else L


def _qr(a, mode="reduced"):
    return tuple(np.linalg.qr(a, mode=mode))


def _svd(a, full_matrices=True):
    return tuple(np.linalg.svd(a, full_matrices=full_matrices))


def _eigh(a):
    return tuple(np.linalg.eigh(a, UPLO="L"))


_LINALG = {"linalg_det": _la(np.linalg.det), "linalg_slogdet": _la(lambda a: tuple(np.linalg.slogdet(a)), 2),
           "linalg_inv": _la(np.linalg.inv), "linalg_solve": _la(np.linalg.solve), "linalg_cholesky": _la(_cholesky),
           "linalg_qr": _la(_qr, 2), "linalg_eigh": _la(_eigh, 2), "linalg_svd": _la(_svd, 3)}


def _searchsorted(out, a, v, *, side, **_):
    return _out(np.searchsorted(a._buf, v._buf, side=side), out)


KERNELS = {
    **_LINALG,
    "searchsorted": _searchsorted,
    "full": _full,
    "arange": _arange,
    "cast": _cast,
    "where": _where,
    "clip": _clip,
    "erf": _erf,
    "sum": _reduce(np.sum),
    "prod": _reduce(np.prod),
    "max": _reduce(np.max),
    "min": _reduce(np.min),
    "argmax": _arg(np.argmax),
    "argmin": _arg(np.argmin),
    "matmul": _matmul,
    "reshape": lambda out, x, **_: x._buf.reshape(out.shape),
    "permute_dims": lambda out, x, *, axes, **_: np.ascontiguousarray(np.transpose(x._buf, axes)),
    "broadcast_to": lambda out, x, **_: np.ascontiguousarray(np.broadcast_to(x._buf, out.shape)),
    "slice": _slice,
    "concat": _concat,
    "take": _take,
    "take_along_axis": _take_along_axis,
}
KERNELS.update({name: _unary(f, g, q) for name, (f, g, q) in _UNARY.items()})
# comparisons, logical ops and maximum/minimum never raise floating-point warnings (NaN is quiet)
_NEVER_WARN = {"equal", "not_equal", "less", "less_equal", "logical_and", "logical_or", "maximum", "minimum"}
KERNELS.update({name: _binary(f, quiet=name not in _NEVER_WARN) for name, f in _BINARY.items()})

from . import numpy_nn as _numpy_nn  # noqa: E402
from .numpy_nn import KERNELS as _NN_KERNELS  # noqa: E402

KERNELS.update(_NN_KERNELS)

from .numpy_llm import KERNELS as _LLM_KERNELS  # noqa: E402  (ember.ops.llm)

KERNELS.update(_LLM_KERNELS)
# numpy_nn keeps its own dtype map (importing this module from there would be circular): give it
# the array API's extra dtypes too (sort/argsort/cumsum of int8... write through it)
_numpy_nn._NP.update(NP_DTYPES)

from .numpy_quant import KERNELS as _QUANT_KERNELS  # noqa: E402  (quantized weights, ember.quant)

KERNELS.update(_QUANT_KERNELS)
