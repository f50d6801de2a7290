"""The pure-Python backend: the living specification. Flat, contiguous, row-major
``array.array`` buffers; runs anywhere CPython or Pyodide runs, with no dependency.

Values are computed with Python floats/ints (float64 / exact integers) and stored back into the
dtype's array, which rounds float32 (and float16, see ``dtypes``) and wraps integers like a real
cast. Buffers are never mutated after creation, so ``reshape`` shares its input's buffer.

Layout work (transpose, broadcast, slice, flip) goes through one helper, ``gather``: a row-major
copy of a strided view, built from ``array`` slices with steps so that the inner loop runs in C.
"""
from __future__ import annotations

import math
import operator
import struct
from array import array
from itertools import repeat
from math import prod

from .. import dtypes as _dt
from ..errors import IndexingError

try:  # Python >= 3.12 (Pyodide 3.14): a C dot product, exact for ints
    from math import sumprod as _dot
except ImportError:  # pragma: no cover - exercised on Python 3.11 hosts
    def _dot(a, b, _mul=operator.mul):
        return sum(map(_mul, a, b))


def _wrap_ints(values, dtype) -> array:
    bits = dtype.itemsize * 8
    if dtype.kind == "u":
        return array(dtype.typecode, [int(v) % (1 << bits) for v in values])
    half = 1 << (bits - 1)
    return array(dtype.typecode, [((int(v) + half) % (1 << bits)) - half for v in values])


def _store(values, dtype) -> array:
    """Python values -> the buffer of ``dtype`` (rounding / wrapping like a cast)."""
    if dtype is _dt.float16:
        return array("f", _dt.round_half(values))
    if dtype.kind == "f":
        return array(dtype.typecode, values)
    if dtype is _dt.bool_:
        return array("B", [1 if v else 0 for v in values])
    try:
        return array(dtype.typecode, values)
    except (OverflowError, TypeError):  # TypeError: a float that is integral, e.g. from pow
        return _wrap_ints(values, dtype)


def contiguous_strides(shape) -> list:
    st = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        st[i] = acc
        acc *= shape[i]
    return st


def broadcast_strides(in_shape, out_shape) -> list:
    """Element strides that read ``in_shape`` broadcast to ``out_shape`` (0 on broadcast axes)."""
    pad = len(out_shape) - len(in_shape)
    st = contiguous_strides(in_shape)
    return [0] * pad + [0 if m == 1 and o != 1 else s for m, s, o in zip(in_shape, st, out_shape[pad:])]


def _starts(dims, offset) -> list:
    starts = [offset]
    for m, s in dims:
        starts = [b + k * s for b in starts for k in range(m)] if s else [b for b in starts for _ in range(m)]
    return starts


def merge_dims(shape, strides) -> list:
    """The same strided view as fewer, longer axes: ``[(size, stride), ...]``. Size-1 axes do
    not move; an axis whose stride spans its inner neighbour merges with it."""
    dims = [(m, s) for m, s in zip(shape, strides) if m != 1]
    if not dims:
        return []
    merged = [dims[-1]]
    for m, s in reversed(dims[:-1]):
        im, ist = merged[-1]
        if s == ist * im:
            merged[-1] = (m * im, ist)
        else:
            merged.append((m, s))
    merged.reverse()
    return merged


def gather(buf, shape, strides, offset: int = 0) -> array:
    """A row-major copy of the strided view of ``buf`` (element strides, possibly 0 or < 0)."""
    n = prod(shape)
    if n == 0:
        return buf[:0]
    merged = merge_dims(shape, strides)
    if not merged:
        return buf[offset:offset + 1]
    m, s = merged[-1]
    starts = _starts(merged[:-1], offset)
    tc = buf.typecode
    if s == 0:
        if len(starts) == 1:
            return array(tc, [buf[starts[0]]]) * m
        return array(tc, [v for v in map(buf.__getitem__, starts) for _ in range(m)])
    if m < 8:  # short rows: one index list beats many tiny slices
        return array(tc, [buf[i] for b in starts for i in range(b, b + m * s, s)])
    out = array(tc)
    for b in starts:
        stop = b + m * s
        out += buf[b:stop if stop >= 0 else None:s]
    return out


def broadcast_buf(t, out_shape):
    """``t``'s values broadcast to ``out_shape`` as a flat sequence (its own buffer if no-op)."""
    if tuple(t.shape) == tuple(out_shape):
        return t._buf
    return gather(t._buf, out_shape, broadcast_strides(t.shape, out_shape))


def broadcast_index(in_shape, out_shape):
    """For each flat output position, the flat input position under broadcasting
    (``range`` when no broadcasting happens)."""
    if tuple(in_shape) == tuple(out_shape):
        return range(prod(out_shape))
    return _starts(list(zip(out_shape, broadcast_strides(in_shape, out_shape))), 0)


class PythonBackend:
    """``device="python"``: pure Python, ``array.array`` storage."""

    name = "python"
    storage = "array"   # flat array.array buffers, shared as they are with device "wasm"

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
        if dtype is _dt.bool_ and any(v > 1 for v in a):  # bytes other than 0/1 mean True
            a = array("B", [1 if v else 0 for v in a])
        return a

    def to_bytes(self, buf, shape, dtype) -> bytes:
        if dtype is _dt.float16:
            return struct.pack(f"<{len(buf)}e", *buf)
        return buf.tobytes()

    async def to_bytes_async(self, buf, shape, dtype) -> bytes:
        return self.to_bytes(buf, shape, dtype)


# ---- creation --------------------------------------------------------------------------------

def _full(out, *, value, **_):
    return _store([value], out.dtype) * prod(out.shape)


def _arange(out, *, start, step, **_):
    return _store([start + i * step for i in range(out.shape[0])], out.dtype)


# ---- elementwise -----------------------------------------------------------------------------

def _finite_or_self(fn):
    """Rounding functions: integers for finite floats, the value itself for inf/nan; a zero
    result keeps x's sign (ceil(-0.5) and round(-0.0) are -0.0, as numpy and IEEE say)."""
    def f(x):
        if not math.isfinite(x):
            return x
        r = float(fn(x))
        return r if r else math.copysign(0.0, x)
    return f


def _ieee(fn, pole=None):
    """A math-module function with IEEE results where the module raises: a domain error
    gives nan, an overflow +-inf (the sign of the exact result), a pole (atanh(1), log1p(-1))
    ``pole(x)``."""
    def f(x):
        try:
            return fn(x)
        except ValueError:
            if pole is not None:
                r = pole(x)
                if r is not None:
                    return r
            return math.nan
        except OverflowError:
            return _overflow(fn, x)
    return f


def _overflow(fn, x):
    # sinh/expm1/cosh: the sign of the result is that of a small step in the same direction
    try:
        return math.copysign(math.inf, fn(math.copysign(1.0, x)))
    except (ValueError, OverflowError):
        return math.inf


def _logaddexp(a, b):
    if a != a or b != b:
        return math.nan
    if a == b == math.inf:
        return math.inf
    m = a if a >= b else b
    if m == -math.inf:
        return -math.inf
    return m + math.log1p(math.exp(-abs(a - b)))


def _atanh_pole(x):
    return math.copysign(math.inf, x) if abs(x) == 1 else None


def _shift_left(a, b):
    return a << b if 0 <= b < 64 else 0   # wraps in _store; a negative count is undefined: 0


def _shift_right(a, b):
    return a >> b if b >= 0 else 0


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x):
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


def _periodic(fn):
    def f(x):
        return fn(x) if math.isfinite(x) else math.nan
    return f


def _sign(x):
    if x != x:
        return x
    return (x > 0) - (x < 0)


_UNARY = {  # name: (float function, integer function or None = same)
    "negative": (operator.neg, None),
    "abs": (abs, None),
    "exp": (_exp, None),
    "log": (_log, None),
    "sqrt": (_sqrt, None),
    "sin": (_periodic(math.sin), None),
    "cos": (_periodic(math.cos), None),
    "tanh": (math.tanh, None),
    "erf": (math.erf, None),
    "sign": (_sign, None),
    "floor": (_finite_or_self(math.floor), int),
    "ceil": (_finite_or_self(math.ceil), int),
    "round": (_finite_or_self(round), int),  # round() is half-to-even, like numpy
    "isnan": (lambda x: x != x, lambda x: False),
    "logical_not": (operator.not_, None),
    "acos": (_ieee(math.acos), None),
    "acosh": (_ieee(math.acosh), None),
    "asin": (_ieee(math.asin), None),
    "asinh": (_ieee(math.asinh), None),
    "atan": (_ieee(math.atan), None),
    "atanh": (_ieee(math.atanh, _atanh_pole), None),
    "cosh": (_ieee(math.cosh), None),
    "sinh": (_ieee(math.sinh), None),
    "tan": (_ieee(math.tan), None),
    "expm1": (_ieee(math.expm1), None),
    "log1p": (_ieee(math.log1p, lambda x: -math.inf if x == -1 else None), None),
    "log2": (_ieee(math.log2, lambda x: -math.inf if x == 0 else None), None),
    "log10": (_ieee(math.log10, lambda x: -math.inf if x == 0 else None), None),
    "trunc": (_finite_or_self(math.trunc), int),
    "signbit": (lambda x: math.copysign(1.0, x) < 0, lambda x: x < 0),
    "bitwise_invert": (None, lambda x: ~x if not isinstance(x, bool) else not x),
}


def _unary(ffloat, fint):
    def kernel(out, x):
        fn = fint if fint is not None and x.dtype.kind != "f" else ffloat
        return _store(list(map(fn, x._buf)), out.dtype)
    return kernel


def _div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _floordiv_f(a, b):
    if a - a != 0 or b - b != 0:   # an infinity (or NaN): floor(a / b), the standard's preferred
        q = _div(a, b)              # result (inf // 2 = inf, -2 // inf = -0.0; Python gives nan, -1.0)
        return q if q != q or q - q != 0 or q == 0 else float(math.floor(q))
    try:
        return a // b
    except ZeroDivisionError:  # numpy: a / 0
        return _div(float(a), float(b))


def _mod_f(a, b):
    try:
        return a % b
    except ZeroDivisionError:
        return math.nan


def _floordiv_i(a, b):
    return a // b if b else 0  # numpy: integer division by zero gives 0


def _mod_i(a, b):
    return a % b if b else 0


def _pow_f(a, b):
    try:
        return math.pow(a, b)
    except ZeroDivisionError:
        return math.inf
    except ValueError:  # 0 ** negative -> inf; negative ** fraction -> nan
        if a == 0:
            return math.copysign(math.inf, a) if b == int(b) and int(b) % 2 else math.inf
        return math.nan
    except OverflowError:
        neg = a < 0 and b == int(b) and int(b) % 2
        return -math.inf if neg else math.inf


def _pow_i(a, b):
    if b < 0:  # like C integer arithmetic on 1/a**|b|: truncates toward zero
        if a == 1:
            return 1
        if a == -1:
            return -1 if b % 2 else 1
        return 0
    return pow(a, b, 1 << 64)  # modular: wraps like the fixed-width result, never builds huge ints


def _maximum(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


def _minimum(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a <= b else b


_BINARY = {  # name: (function for floats, function for ints/bools or None = same)
    "add": (operator.add, None),
    "subtract": (operator.sub, None),
    "multiply": (operator.mul, None),
    "divide": (_div, None),
    "floor_divide": (_floordiv_f, _floordiv_i),
    "remainder": (_mod_f, _mod_i),
    "pow": (_pow_f, _pow_i),
    "equal": (operator.eq, None),
    "not_equal": (operator.ne, None),
    "less": (operator.lt, None),
    "less_equal": (operator.le, None),
    "logical_and": (lambda a, b: bool(a) and bool(b), None),
    "logical_or": (lambda a, b: bool(a) or bool(b), None),
    "atan2": (math.atan2, None),
    "copysign": (math.copysign, None),
    "hypot": (math.hypot, None),
    "logaddexp": (_logaddexp, None),
    "bitwise_and": (None, operator.and_),
    "bitwise_or": (None, operator.or_),
    "bitwise_xor": (None, operator.xor),
    "bitwise_left_shift": (None, _shift_left),
    "bitwise_right_shift": (None, _shift_right),
}


def _binary(ffloat, fint):
    def kernel(out, a, b):
        floats = a.dtype.kind == "f" or b.dtype.kind == "f"
        fn = ffloat if floats or fint is None else fint
        A = broadcast_buf(a, out.shape)
        B = broadcast_buf(b, out.shape)
        return _store(list(map(fn, A, B)), out.dtype)
    return kernel


def _minmax(pick, nan_safe):
    """maximum/minimum: the builtin (C) max/min, unless a NaN sits in the second operand
    (max(a, nan) keeps a; max(nan, b) already gives nan)."""
    def kernel(out, a, b):
        A = broadcast_buf(a, out.shape)
        B = broadcast_buf(b, out.shape)
        if out.dtype.kind == "f" and any(map(math.isnan, B)):
            return _store(list(map(nan_safe, A, B)), out.dtype)
        return _store(list(map(pick, A, B)), out.dtype)
    return kernel


def _where(out, c, x, y):
    C = broadcast_buf(c, out.shape)
    X = broadcast_buf(x, out.shape)
    Y = broadcast_buf(y, out.shape)
    return _store([a if k else b for k, a, b in zip(C, X, Y)], out.dtype)


def _cast(out, x, *, dtype, **_):
    dt = out.dtype
    src = x.dtype
    buf = x._buf
    if dt is src:
        return buf
    if dt is _dt.bool_:
        return array("B", [1 if v != 0 else 0 for v in buf])  # NaN != 0: True
    if dt.kind == "f":
        return _store([float(v) for v in buf], dt)
    if src.kind == "f":
        # float -> int: truncate toward zero, saturate at the int range, NaN -> 0 (the same on
        # every backend; WGSL's float->int conversion saturates too).
        bits = dt.itemsize * 8
        lo, hi = (0, (1 << bits) - 1) if dt.kind == "u" else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        vals = []
        for v in buf:
            if v != v:
                vals.append(0)
            elif v >= hi:
                vals.append(hi)
            elif v <= lo:
                vals.append(lo)
            else:
                vals.append(int(v))
        return array(dt.typecode, vals)
    return _store(list(buf), dt)  # int -> int wraps (two's complement), like numpy / C


# ---- reductions ------------------------------------------------------------------------------

def _reduce_layout(x, axes):
    """(values with the reduced axes innermost, number of outputs, reduced size)."""
    keep = [a for a in range(len(x.shape)) if a not in axes]
    perm = keep + list(axes)
    r = prod(x.shape[a] for a in axes)
    n_out = prod(x.shape[a] for a in keep)
    if perm == list(range(len(x.shape))):
        return x._buf, n_out, r
    st = contiguous_strides(x.shape)
    return gather(x._buf, [x.shape[a] for a in perm], [st[a] for a in perm]), n_out, r


def _chunks(vals, n_out, r):
    return (vals[i * r:(i + 1) * r] for i in range(n_out))


def _fsum(c):
    try:
        return math.fsum(c)
    except ValueError:  # inf + -inf
        return math.nan
    except OverflowError:  # finite values whose sum overflows
        return sum(c)


def _imul_wrap(c):
    acc = 1
    for v in c:
        acc = (acc * v) & 0xFFFFFFFFFFFFFFFF  # int64 wraps: keep the low 64 bits
    return acc


def _nanmax(fn):
    def f(c):
        m = fn(c)
        if m == m and any(v != v for v in c):
            return math.nan
        return m
    return f


def _argfn(fn):
    def f(c):
        if c.typecode in "fd":
            for i, v in enumerate(c):
                if v != v:
                    return i  # numpy: the first NaN wins
        return c.index(fn(c))
    return f


def _reduce(ffloat, fint):
    def kernel(out, x, *, axes, keepdims=False, dtype=None, **_):
        vals, n_out, r = _reduce_layout(x, axes)
        fn = ffloat if x.dtype.kind == "f" else fint
        return _store([fn(c) for c in _chunks(vals, n_out, r)], out.dtype)
    return kernel


def _argreduce(fn):
    def kernel(out, x, *, axis, keepdims=False, **_):
        vals, n_out, r = _reduce_layout(x, (axis,))
        return array("q", [fn(c) for c in _chunks(vals, n_out, r)])
    return kernel


# ---- matmul ----------------------------------------------------------------------------------

def _matmul(out, a, b):
    """(..., M, K) @ (..., K, N). Per batch: B's columns are cut once as strided slices, then
    every output is one C-level dot product (math.sumprod where available)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = out.shape[:-2]
    ia = broadcast_index(a.shape[:-2], batch)
    ib = broadcast_index(b.shape[:-2], batch)
    A, B = a._buf, b._buf  # mixed int/float inputs mix fine as Python numbers
    res = []
    cols_cache = {}
    mk, kn = M * K, K * N
    for pa, pb in zip(ia, ib):
        cols = cols_cache.get(pb)
        if cols is None:
            base = pb * kn
            # lists, not arrays: their floats are boxed once, not on every one of the M reads
            cols = [B[base + j:base + kn:N].tolist() for j in range(N)] if K else [[]] * N
            cols_cache = {pb: cols}  # keep one batch's columns: batches repeat in runs
        base = pa * mk
        for i in range(M):
            row = A[base + i * K:base + (i + 1) * K].tolist()
            res.extend(map(_dot, repeat(row, N), cols))
    return _store(res, out.dtype)


# ---- movement --------------------------------------------------------------------------------

def _reshape(out, x, **_):
    return x._buf  # row-major order is unchanged; buffers are immutable, so share


def _permute_dims(out, x, *, axes, **_):
    st = contiguous_strides(x.shape)
    return gather(x._buf, out.shape, [st[a] for a in axes])


def _broadcast_to(out, x, **_):
    return gather(x._buf, out.shape, broadcast_strides(x.shape, out.shape))


def _slice(out, x, *, slices, **_):
    st = contiguous_strides(x.shape)
    offset = sum(s[0] * k for s, k in zip(slices, st))
    return gather(x._buf, out.shape, [s[2] * k for s, k in zip(slices, st)], offset)


def _concat(out, *xs, axis, **_):
    outer = prod(out.shape[:axis])
    bufs = []
    for t in xs:
        buf = t._buf if t.dtype is out.dtype else _cast(out, t, dtype=out.dtype)
        bufs.append((buf, prod(t.shape[axis:])))
    res = array(out.dtype.typecode)
    for i in range(outer):
        for buf, inner in bufs:
            res += buf[i * inner:(i + 1) * inner]
    return res


def _check_index(i, n, op, axis):
    if not -n <= i < n:
        raise IndexingError(f"{op}: index {i} is out of range for axis {axis} with size {n}")
    return i + n if i < 0 else i


def _take(out, x, idx, *, axis, **_):
    n = x.shape[axis]
    ids = [_check_index(i, n, "take", axis) for i in idx._buf]
    outer = prod(x.shape[:axis])
    inner = prod(x.shape[axis + 1:])
    buf = x._buf
    if inner == 1:
        return array(buf.typecode, [buf[o * n + i] for o in range(outer) for i in ids])
    res = array(buf.typecode)
    for o in range(outer):
        for i in ids:
            s = (o * n + i) * inner
            res += buf[s:s + inner]
    return res


def _take_along_axis(out, x, idx, *, axis, **_):
    n = x.shape[axis]
    xs = broadcast_strides(x.shape, out.shape)
    xs[axis] = 0
    starts = _starts(list(zip(out.shape, xs)), 0)
    step = contiguous_strides(x.shape)[axis]
    ids = broadcast_buf(idx, out.shape)
    buf = x._buf
    return array(buf.typecode, [buf[b + _check_index(i, n, "take_along_axis", axis) * step]
                                for b, i in zip(starts, ids)])


def _nan_last(v):
    return (v != v, v)   # NaN sorts after everything, like sort


def _searchsorted(out, a, v, *, side, **_):
    import bisect

    floats = a.dtype.kind == "f"
    keys = [_nan_last(x) for x in a._buf] if floats else list(a._buf)
    find = bisect.bisect_left if side == "left" else bisect.bisect_right
    return array("q", [find(keys, _nan_last(x) if floats else x) for x in v._buf])


KERNELS = {
    "searchsorted": _searchsorted,
    "full": _full,
    "arange": _arange,
    "cast": _cast,
    "where": _where,
    "sum": _reduce(_fsum, sum),
    "prod": _reduce(math.prod, _imul_wrap),
    "max": _reduce(_nanmax(max), max),
    "min": _reduce(_nanmax(min), min),
    "argmax": _argreduce(_argfn(max)),
    "argmin": _argreduce(_argfn(min)),
    "matmul": _matmul,
    "reshape": _reshape,
    "permute_dims": _permute_dims,
    "broadcast_to": _broadcast_to,
    "slice": _slice,
    "concat": _concat,
    "take": _take,
    "take_along_axis": _take_along_axis,
}
KERNELS.update({name: _unary(f, g) for name, (f, g) in _UNARY.items()})
KERNELS.update({name: _binary(f, g) for name, (f, g) in _BINARY.items()})
KERNELS.update({"maximum": _minmax(max, _maximum), "minimum": _minmax(min, _minimum)})

from .python_nn import KERNELS as _NN_KERNELS  # noqa: E402

KERNELS.update(_NN_KERNELS)

from .python_llm import KERNELS as _LLM_KERNELS  # noqa: E402  (ember.ops.llm)

KERNELS.update(_LLM_KERNELS)

from .python_grad import KERNELS as _GRAD_KERNELS  # noqa: E402  (backward-only kernels)

KERNELS.update(_GRAD_KERNELS)

from ..linalg_kernels import KERNELS as _LINALG_KERNELS  # noqa: E402  (ember.linalg's factorizations)

KERNELS.update(_LINALG_KERNELS)

from .python_quant import KERNELS as _QUANT_KERNELS  # noqa: E402  (quantized weights, ember.quant)

KERNELS.update(_QUANT_KERNELS)
