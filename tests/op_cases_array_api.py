"""Op cases for the array API functions added in issue 13 (elementwise math, bitwise ops,
manipulation, searching, set and statistical functions, ``ember.linalg``), checked against
numpy like every case in ``op_cases``; ``op_cases.all_cases()`` includes them, so they run
eager on every backend (``tests/test_ops_array_api.py``) and compiled (``tests/test_compile.py``).
A few cases per op: the standard's own suite (``../shared/tools/run-array-api-tests``) is the
broad yardstick, these are the regression tests CI can see. Standard library only at import.
"""
from __future__ import annotations

from op_cases import OpCase, S

F, I32, I64, U8, B = "float32", "int32", "int64", "uint8", "bool"
CASES: list = []
add = CASES.append

# ---- elementwise math (float32; one case inside the domain, one with nan/inf/+-0) --------------
_UNARY = {  # name: (numpy name, domain)
    "acos": ("arccos", (-1.0, 1.0)), "acosh": ("arccosh", (1.0, 5.0)), "asin": ("arcsin", (-1.0, 1.0)),
    "asinh": ("arcsinh", (-3.0, 3.0)), "atan": ("arctan", (-3.0, 3.0)), "atanh": ("arctanh", (-0.99, 0.99)),
    "cosh": ("cosh", (-3.0, 3.0)), "sinh": ("sinh", (-3.0, 3.0)), "tan": ("tan", (-1.5, 1.5)),
    "expm1": ("expm1", (-3.0, 3.0)), "log1p": ("log1p", (-0.9, 3.0)), "log2": ("log2", (0.1, 5.0)),
    "log10": ("log10", (0.1, 5.0)), "trunc": ("trunc", (-3.0, 3.0)),
}
for _name, (_npn, (_lo, _hi)) in _UNARY.items():
    _e = (lambda n: lambda e, x: getattr(e, n)(x))(_name)
    _n = (lambda n: lambda np, x: getattr(np, n)(x))(_npn)
    add(OpCase(f"{_name}/f32/2x3", _e, _n, [S((2, 3), F, _lo, _hi)], 2e-6))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((12,), F, -3.0, 3.0, special=True)], 2e-6))
add(OpCase("signbit/f32/special", lambda e, x: e.signbit(x), lambda np, x: np.signbit(x),
           [S((12,), F, special=True)]))
# rounding keeps the sign of a zero result (the python backend used to give +0.0)
for _name in ("floor", "ceil", "round", "trunc"):
    add(OpCase(f"{_name}/f32/signed_zero", (lambda n: lambda e, x: e.signbit(getattr(e, n)(x)))(_name),
               (lambda n: lambda np, x: np.signbit(getattr(np, {"round": "rint"}.get(n, n))(x)))(_name),
               [S((6,), F, values=[-0.0, 0.0, -0.4, 0.4, -0.6, 0.6])]))

_BINARY = {"atan2": "arctan2", "copysign": "copysign", "hypot": "hypot", "logaddexp": "logaddexp"}
for _name, _npn in _BINARY.items():
    _e = (lambda n: lambda e, a, b: getattr(e, n)(a, b))(_name)
    _n = (lambda n: lambda np, a, b: getattr(np, n)(a, b))(_npn)
    add(OpCase(f"{_name}/f32/bcast", _e, _n, [S((2, 3), F), S((3,), F)], 2e-6))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((10,), F, special=True), S((10,), F, special=True)], 2e-6))

# ---- bitwise (functions and the operators) ----------------------------------------------------
for _dt, (_lo, _hi) in ((I32, (-100, 100)), (I64, (-100, 100)), (U8, (0, 255))):
    add(OpCase(f"bitwise_and/{_dt}", lambda e, a, b: a & b, lambda np, a, b: a & b,
               [S((2, 3), _dt, _lo, _hi), S((3,), _dt, _lo, _hi)]))
    add(OpCase(f"bitwise_or/{_dt}", lambda e, a, b: e.bitwise_or(a, b), lambda np, a, b: a | b,
               [S((5,), _dt, _lo, _hi), S((5,), _dt, _lo, _hi)]))
    add(OpCase(f"bitwise_xor/{_dt}", lambda e, a, b: a ^ b, lambda np, a, b: a ^ b,
               [S((5,), _dt, _lo, _hi), S((5,), _dt, _lo, _hi)]))
    add(OpCase(f"bitwise_invert/{_dt}", lambda e, a: ~a, lambda np, a: ~a, [S((5,), _dt, _lo, _hi)]))
    add(OpCase(f"bitwise_left_shift/{_dt}", lambda e, a, b: a << b, lambda np, a, b: a << b,
               [S((6,), _dt, _lo, _hi), S((6,), _dt, 0, 6)]))
    add(OpCase(f"bitwise_right_shift/{_dt}", lambda e, a, b: e.bitwise_right_shift(a, b),
               lambda np, a, b: a >> b, [S((6,), _dt, _lo, _hi), S((6,), _dt, 0, 6)]))
add(OpCase("bitwise_and/bool", lambda e, a, b: e.bitwise_and(a, b), lambda np, a, b: a & b, [S((4,), B), S((4,), B)]))
add(OpCase("bitwise_and/f32/refused", lambda e, a, b: e.bitwise_and(a, b), None, [S((2,), F), S((2,), F)],
           raises="DTypeError", match=("bitwise_and", "float32")))
add(OpCase("bitwise_left_shift/bool/refused", lambda e, a, b: a << b, None, [S((2,), B), S((2,), B)],
           raises="DTypeError", match=("bitwise_left_shift", "bool")))

# ---- manipulation / creation -----------------------------------------------------------------
add(OpCase("roll/i64/axis", lambda e, x: e.roll(x, 2, axis=1), lambda np, x: np.roll(x, 2, axis=1),
           [S((2, 5), I64)]))
add(OpCase("roll/f32/flat", lambda e, x: e.roll(x, -4), lambda np, x: np.roll(x, -4), [S((2, 3), F)]))
add(OpCase("roll/f32/axes", lambda e, x: e.roll(x, (1, -1), axis=(0, 1)),
           lambda np, x: np.roll(x, (1, -1), axis=(0, 1)), [S((3, 4), F)]))
add(OpCase("repeat/f32/axis", lambda e, x: e.repeat(x, 2, axis=0), lambda np, x: np.repeat(x, 2, axis=0),
           [S((2, 3), F)]))
add(OpCase("repeat/i32/counts", lambda e, x: e.repeat(x, [0, 2, 1]), lambda np, x: np.repeat(x, [0, 2, 1]),
           [S((3,), I32)]))
add(OpCase("tril/f32", lambda e, x: e.tril(x), lambda np, x: np.tril(x), [S((3, 4), F)]))
add(OpCase("tril/i64/k", lambda e, x: e.tril(x, k=-1), lambda np, x: np.tril(x, k=-1), [S((2, 3, 3), I64)]))
add(OpCase("triu/f32/k", lambda e, x: e.triu(x, k=1), lambda np, x: np.triu(x, k=1), [S((4, 3), F)]))
add(OpCase("meshgrid/xy", lambda e, a, b: e.meshgrid(a, b), lambda np, a, b: list(np.meshgrid(a, b)),
           [S((3,), F), S((2,), F)]))
add(OpCase("meshgrid/ij", lambda e, a, b: e.meshgrid(a, b, indexing="ij"),
           lambda np, a, b: list(np.meshgrid(a, b, indexing="ij")), [S((3,), I64), S((2,), I64)]))
add(OpCase("broadcast_arrays/f32", lambda e, a, b: e.broadcast_arrays(a, b),
           lambda np, a, b: list(np.broadcast_arrays(a, b)), [S((2, 1), F), S((3,), F)]))
add(OpCase("unstack/f32/axis1", lambda e, x: e.unstack(x, axis=1), lambda np, x: [x[:, i] for i in range(3)],
           [S((2, 3), F)]))
add(OpCase("empty_like/i32", lambda e, x: e.empty_like(x).shape == x.shape and e.zeros_like(x),
           lambda np, x: np.zeros_like(x), [S((2, 2), I32)]))
add(OpCase("mask/f32/greater", lambda e, x: x[x > 0], lambda np, x: x[x > 0], [S((3, 4), F)]))
add(OpCase("mask/f32/leading", lambda e, x, m: x[m], lambda np, x, m: x[m], [S((3, 2), F), S((3,), B)]))
add(OpCase("mask/f32/0d", lambda e, x, m: x[m], lambda np, x, m: x[m], [S((2,), F), S((), B, values=[True])]))

# ---- linear algebra ------------------------------------------------------------------------------
add(OpCase("tensordot/f32/axes2", lambda e, a, b: e.tensordot(a, b), lambda np, a, b: np.tensordot(a, b).astype(np.float32),
           [S((2, 3, 4), F), S((3, 4, 2), F)], 1e-5))
add(OpCase("tensordot/i64/pairs", lambda e, a, b: e.tensordot(a, b, axes=([0], [1])),
           lambda np, a, b: np.tensordot(a, b, axes=([0], [1])), [S((3, 2), I64), S((4, 3), I64)]))
add(OpCase("vecdot/f32/bcast", lambda e, a, b: e.vecdot(a, b), lambda np, a, b: np.sum(a * b, axis=-1),
           [S((2, 3), F), S((3,), F)], 1e-5))
add(OpCase("vecdot/u8", lambda e, a, b: e.linalg.vecdot(a, b), lambda np, a, b: np.sum(a * b, axis=-1, dtype=np.uint8),
           [S((2, 4), U8, 0, 5), S((2, 4), U8, 0, 5)]))
_SPD = [4.0, 1.0, 0.5, 1.0, 3.0, 0.2, 0.5, 0.2, 2.0]
add(OpCase("linalg.det/f32", lambda e, x: e.linalg.det(x), lambda np, x: np.linalg.det(x), [S((2, 3, 3), F)], 1e-4, 1e-5))
add(OpCase("linalg.slogdet/f32", lambda e, x: list(e.linalg.slogdet(x)), lambda np, x: list(np.linalg.slogdet(x)),
           [S((2, 3, 3), F)], 1e-4, 1e-5))
add(OpCase("linalg.inv/f32", lambda e, x: e.linalg.inv(x), lambda np, x: np.linalg.inv(x),
           [S((3, 3), F, values=_SPD)], 1e-4, 1e-5))
add(OpCase("linalg.solve/f32/vector", lambda e, a, b: e.linalg.solve(a, b), lambda np, a, b: np.linalg.solve(a, b[:, None])[:, 0],
           [S((3, 3), F, values=_SPD), S((3,), F)], 1e-4, 1e-5))
add(OpCase("linalg.cholesky/f32/upper", lambda e, x: e.linalg.cholesky(x, upper=True),
           lambda np, x: np.linalg.cholesky(x).T, [S((3, 3), F, values=_SPD)], 1e-5, 1e-6))
add(OpCase("linalg.eigvalsh/f32", lambda e, x: e.linalg.eigvalsh(x), lambda np, x: np.linalg.eigvalsh(x),
           [S((3, 3), F, values=_SPD)], 1e-5, 1e-6))
add(OpCase("linalg.svdvals/f32", lambda e, x: e.linalg.svdvals(x), lambda np, x: np.linalg.svd(x, compute_uv=False),
           [S((2, 4, 3), F)], 1e-4, 1e-5))
add(OpCase("linalg.qr/f32/reconstruct", lambda e, x: e.matmul(*e.linalg.qr(x)), lambda np, x: x,
           [S((4, 3), F)], 1e-4, 1e-5))
add(OpCase("linalg.svd/f32/reconstruct", lambda e, x: (lambda r: e.matmul(r.U * e.expand_dims(r.S, -2), r.Vh))(
    e.linalg.svd(x, full_matrices=False)), lambda np, x: x, [S((3, 4), F)], 1e-4, 1e-5))
add(OpCase("linalg.pinv/f32", lambda e, x: e.linalg.pinv(x), lambda np, x: np.linalg.pinv(x), [S((4, 3), F)], 1e-3, 1e-4))
add(OpCase("linalg.matrix_rank/f32", lambda e, x: e.linalg.matrix_rank(x), lambda np, x: np.linalg.matrix_rank(x),
           [S((3, 3), F, values=[1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 0.0, 1.0, 1.0])]))
add(OpCase("linalg.matrix_power/f32", lambda e, x: e.linalg.matrix_power(x, 3),
           lambda np, x: np.linalg.matrix_power(x, 3), [S((2, 2, 2), F)], 1e-5, 1e-5))
add(OpCase("linalg.matrix_norm/f32/fro", lambda e, x: e.linalg.matrix_norm(x), lambda np, x: np.linalg.norm(x, axis=(-2, -1)),
           [S((2, 3, 4), F)], 1e-5))
add(OpCase("linalg.matrix_norm/f32/inf", lambda e, x: e.linalg.matrix_norm(x, ord=float("inf"), keepdims=True),
           lambda np, x: np.linalg.norm(x, ord=np.inf, axis=(-2, -1), keepdims=True), [S((2, 3, 4), F)], 1e-5))
add(OpCase("linalg.vector_norm/f32/axis", lambda e, x: e.linalg.vector_norm(x, axis=1),
           lambda np, x: np.linalg.norm(x, axis=1), [S((3, 4), F)], 1e-5))
add(OpCase("linalg.vector_norm/f32/ord1", lambda e, x: e.linalg.vector_norm(x, ord=1),
           lambda np, x: np.linalg.norm(x.ravel(), ord=1), [S((3, 4), F)], 1e-5))
add(OpCase("linalg.trace/i64/offset", lambda e, x: e.linalg.trace(x, offset=1),
           lambda np, x: np.trace(x, offset=1, axis1=-2, axis2=-1), [S((2, 3, 4), I64)]))
add(OpCase("linalg.diagonal/f32/neg", lambda e, x: e.linalg.diagonal(x, offset=-1),
           lambda np, x: np.diagonal(x, offset=-1, axis1=-2, axis2=-1), [S((2, 3, 3), F)]))
add(OpCase("linalg.cross/f32", lambda e, a, b: e.linalg.cross(a, b), lambda np, a, b: np.cross(a, b),
           [S((2, 3), F), S((3,), F)], 1e-5, 1e-6))
add(OpCase("linalg.outer/f32", lambda e, a, b: e.linalg.outer(a, b), lambda np, a, b: np.outer(a, b),
           [S((3,), F), S((2,), F)]))
add(OpCase("linalg.det/i64/refused", lambda e, x: e.linalg.det(x), None, [S((2, 2), I64)],
           raises="DTypeError", match=("linalg.det", "int64")))
add(OpCase("linalg.inv/f32/not_square", lambda e, x: e.linalg.inv(x), None, [S((2, 3), F)],
           raises="ShapeError", match=("linalg.inv", "square")))

# ---- searching, sets, statistics -----------------------------------------------------------------
add(OpCase("searchsorted/f32/left", lambda e, a, v: e.searchsorted(e.sort(a), v),
           lambda np, a, v: np.searchsorted(np.sort(a), v), [S((6,), F), S((2, 3), F)]))
add(OpCase("searchsorted/i64/right", lambda e, a, v: e.searchsorted(e.sort(a), v, side="right"),
           lambda np, a, v: np.searchsorted(np.sort(a), v, side="right"), [S((6,), I64), S((5,), I64)]))
add(OpCase("nonzero/i32", lambda e, x: list(e.nonzero(x)), lambda np, x: list(np.nonzero(x)), [S((3, 4), I32, -1, 1)]))
add(OpCase("unique_values/f32", lambda e, x: e.unique_values(x), lambda np, x: np.unique(x),
           [S((8,), F, values=[3.0, 1.0, 3.0, -2.0, 1.0, 0.5, 3.0, -2.0])]))
add(OpCase("unique_counts/i64", lambda e, x: list(e.unique_counts(x)), lambda np, x: list(np.unique(x, return_counts=True)),
           [S((10,), I64, 0, 3)]))
add(OpCase("unique_inverse/i32", lambda e, x: list(e.unique_inverse(x)),
           lambda np, x: [np.unique(x), np.unique(x, return_inverse=True)[1].reshape(x.shape)], [S((2, 4), I32, 0, 3)]))
add(OpCase("cumulative_sum/f32/axis", lambda e, x: e.cumulative_sum(x, axis=1), lambda np, x: np.cumsum(x, axis=1),
           [S((2, 4), F)], 1e-5, 1e-6))
add(OpCase("cumulative_sum/i32/initial", lambda e, x: e.cumulative_sum(x, include_initial=True),
           lambda np, x: np.concatenate([[0], np.cumsum(x)]).astype(np.int64), [S((5,), I32)]))
_NO_U64 = "holds no uint64: unsigned sums accumulate in int64 there"
add(OpCase("sum/u8/unsigned", lambda e, x: e.sum(x, axis=0), lambda np, x: np.sum(x, axis=0, dtype=np.uint64),
           [S((3, 2), U8, 0, 255)], skip={"webgpu": _NO_U64, "wasm": _NO_U64}))

# floor_divide with an infinite operand: floor(x1 / x2), the standard's preferred result (numpy and
# Python give nan for inf // 2 and -1.0 for -2 // inf)
_INF = float("inf")
add(OpCase("floor_divide/f32/infinities", lambda e, a, b: a // b,
           lambda np, a, b: np.where(np.isinf(a) | np.isinf(b), np.floor(a / b), np.floor_divide(a, b)),
           [S((8,), F, values=[_INF, _INF, -_INF, -_INF, 2.0, -2.0, 2.0, -2.0]),
            S((8,), F, values=[2.0, -2.0, 2.0, -2.0, _INF, _INF, -_INF, -_INF])],
           skip={"webgpu": "the WGSL floordiv_f32 gives Python's nan / -1.0 (allowed by the standard's notes)"}))
