"""Data-driven op cases: one list that pytest runs on every backend here, and that runs unchanged
inside Pyodide (no numpy, pytest or hypothesis there) with expected values computed by numpy on
the host.

This module imports with the standard library only. numpy is touched only inside ``numpy_fn``,
which ``expected(np, case)`` calls with the numpy module it is given.

A case::

    OpCase("add/f32/bcast", lambda e, a, b: e.add(a, b), lambda np, a, b: np.add(a, b),
           [S((2, 3)), S((3,))])

- ``ember_fn(ember, *tensors)`` returns a Tensor or a list/tuple of Tensors; while it runs the
  default device is the case's device, so ``ember.arange(3)`` inside it lands there too.
- ``numpy_fn(np, *arrays)`` returns the reference ndarray (or list of them), with the dtype ember
  must give. numpy's float64 counts as float32 (ember has no float64); where numpy's dtype rule
  differs from ember's (int / int, int + float...), cast in ``numpy_fn`` or pass ``dtype=``.
- ``inputs``: ``S(shape, dtype, low, high, values=..., special=...)`` specs. ``generate_inputs``
  turns them into values with ``random.Random`` seeded by the case id, so every run and every
  machine (CPython, Pyodide) sees the same numbers.
- ``rtol``/``atol``: tolerances for float outputs (defaults by output dtype, ``TOLERANCES``);
  integer and bool outputs are compared exactly. NaN equals NaN, infinities must match.
- ``raises="ShapeError"`` (a class name in ``ember.errors``) plus ``match=("substr", ...)``: an
  error case; the message must contain every substring. ``numpy_fn`` is then None.
- ``skip={"webgpu": "why"}``: a device that cannot run the case, with the reason.

Adding cases: append ``OpCase``s to ``CASES`` here (core ops) or, for the nn family, to
``CASES`` in ``tests/op_cases_nn.py`` (the array API additions: ``tests/op_cases_array_api.py``,
run by ``tests/test_ops_array_api.py``); ``all_cases()`` returns them all, and
``tests/test_ops_core.py`` / ``tests/test_ops_nn.py`` parametrize over them with the ``device``
fixture through ``helpers.check(case, device)``. Ids are ``op/what`` and must stay stable (the
Pyodide runner keys expected values by id).

Running a case without pytest or numpy (Pyodide)::

    results = run_case(ember, case, "python")        # [{"shape", "dtype", "value"}] or [{"error", "message"}]
    ok, msg = check_results(case, results, expected_results)   # expected from expected(np, case) on the host

Across a JSON boundary use ``to_json_safe`` / ``from_json_safe`` (NaN and infinities as strings).
"""
from __future__ import annotations

import math
import random
import struct
import zlib

__all__ = ["S", "OpCase", "CASES", "all_cases", "generate_inputs", "make_tensors", "run_case", "expected",
           "compare", "check_results", "tolerances", "to_json_safe", "from_json_safe", "nest", "flatten",
           "TOLERANCES"]

# Default tolerances per output dtype (rtol, atol). The python backend computes in float64 and
# rounds each result to the dtype; numpy computes float32 ops in float32 (and float16 ops in
# float32, then rounds): a few ulps apart, more after long reductions.
TOLERANCES = {"float32": (1e-5, 1e-6), "float16": (2e-3, 1e-3)}

_RANGES = {"float32": (-3.0, 3.0), "float16": (-3.0, 3.0), "int32": (-10, 10), "int64": (-10, 10),
           "uint8": (0, 20), "bool": (0, 1)}


class S:
    """Input spec: ``shape``, ``dtype`` name, value range [``low``, ``high``] (ints inclusive),
    explicit flat ``values``, or ``special=True`` to mix NaN, +-inf, 0.0 and -0.0 into floats.
    ``nonzero=True`` keeps values away from 0 (divisors)."""

    __slots__ = ("shape", "dtype", "low", "high", "values", "special", "nonzero")

    def __init__(self, shape=(), dtype="float32", low=None, high=None, *, values=None,
                 special=False, nonzero=False):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype = dtype
        lo, hi = _RANGES[dtype]
        self.low = lo if low is None else low
        self.high = hi if high is None else high
        self.values = None if values is None else list(values)
        self.special = special
        self.nonzero = nonzero
        if self.values is not None and len(self.values) != _prod(self.shape):
            raise ValueError(f"S: {len(self.values)} values for shape {self.shape}")

    def __repr__(self):
        return f"S({self.shape}, {self.dtype!r})"


class OpCase:
    """One reference comparison (or one expected error); see the module docstring."""

    __slots__ = ("id", "ember_fn", "numpy_fn", "inputs", "rtol", "atol", "dtype", "raises", "match",
                 "skip")

    def __init__(self, id, ember_fn, numpy_fn, inputs, rtol=None, atol=None, *, dtype=None,
                 raises=None, match=(), skip=None):
        self.id = id
        self.ember_fn = ember_fn
        self.numpy_fn = numpy_fn
        self.inputs = list(inputs)
        self.rtol = rtol
        self.atol = atol
        self.dtype = dtype
        self.raises = raises
        self.match = (match,) if isinstance(match, str) else tuple(match)
        self.skip = dict(skip or {})

    def __repr__(self):
        return f"OpCase({self.id!r})"


# ---- pure-Python helpers ---------------------------------------------------------------------

def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def nest(flat, shape):
    """Flat list -> nested lists of ``shape`` (a scalar for shape ())."""
    shape = tuple(shape)
    if not shape:
        return flat[0]
    if 0 in shape:
        def empty(s):
            return [] if s[0] == 0 else [empty(s[1:]) for _ in range(s[0])]
        return empty(shape)
    for n in reversed(shape[1:]):
        flat = [flat[i:i + n] for i in range(0, len(flat), n)]
    return list(flat)


def flatten(nested):
    """Nested lists (or a scalar) -> flat list."""
    if not isinstance(nested, (list, tuple)):
        return [nested]
    out = []
    stack = [iter(nested)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, (list, tuple)):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def _seed(case_id: str, k: int) -> int:
    # crc32, not hash(): str hashes are salted per process.
    return zlib.crc32(f"{case_id}#{k}".encode())


_SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0)


def _values(spec: S, rng: random.Random) -> list:
    n = _prod(spec.shape)
    if spec.values is not None:
        return list(spec.values)
    if spec.dtype == "bool":
        return [rng.random() < 0.5 for _ in range(n)]
    if spec.dtype in ("float32", "float16"):
        out = []
        for _ in range(n):
            v = rng.uniform(spec.low, spec.high)
            if spec.nonzero and abs(v) < 0.25:
                v = 0.25 if v >= 0 else -0.25
            out.append(v)
        if spec.special:
            for i in range(min(n, len(_SPECIALS))):
                out[rng.randrange(n)] = _SPECIALS[i]
        if spec.dtype == "float16":  # round here so ember and numpy see the same halves
            out = [struct.unpack("<e", struct.pack("<e", v))[0] for v in out]
        else:
            out = [struct.unpack("<f", struct.pack("<f", v))[0] for v in out]
        return out
    out = []
    for _ in range(n):
        v = rng.randint(int(spec.low), int(spec.high))
        if spec.nonzero and v == 0:
            v = 1
        out.append(v)
    return out


def generate_inputs(case: OpCase) -> list:
    """The case's inputs as ``(flat_values, shape, dtype_name)``, deterministic per case id."""
    out = []
    for k, spec in enumerate(case.inputs):
        rng = random.Random(_seed(case.id, k))
        out.append((_values(spec, rng), spec.shape, spec.dtype))
    return out


def _pack(flat, dtype_name):
    fmt = {"float32": "f", "float16": "e", "int32": "i", "int64": "q", "uint8": "B", "bool": "?"}[dtype_name]
    return struct.pack(f"<{len(flat)}{fmt}", *flat)


def make_tensors(ember, case: OpCase, device: str) -> list:
    """The case's inputs as ember Tensors on ``device`` (built from bytes, so no op runs)."""
    return [ember.from_bytes(_pack(flat, dt), shape, dt, device=device)
            for flat, shape, dt in generate_inputs(case)]


def _as_list(r):
    return list(r) if isinstance(r, (list, tuple)) else [r]


def run_case(ember, case: OpCase, device: str) -> list:
    """Run the ember side. Returns ``[{"shape", "dtype", "value"}, ...]`` (one per output; value
    is nested lists) or, if ember raised an ember error, ``[{"error": class name, "message"}]``.
    Errors that are not ``EmberError`` propagate (they are bugs)."""
    errors = ember.errors
    tensors = make_tensors(ember, case, device)
    before = ember.default_device()
    ember.set_default_device(device)  # creation cases (ember.arange...) land on the device too
    try:
        result = case.ember_fn(ember, *tensors)
        outs = _as_list(result)
        return [{"shape": tuple(t.shape), "dtype": t.dtype.name, "value": t.tolist()} for t in outs]
    except errors.EmberError as e:
        return [{"error": type(e).__name__, "message": str(e)}]
    finally:
        ember.set_default_device(before)


def run_case_compiled(ember, case: OpCase, device: str) -> list:
    """``run_case`` through ``ember.compile``: the first call records a plan, a second call on
    fresh input tensors of the same signature replays it; returns the replay's results (the
    recording call's results must be the same, else a mismatch is reported as an error)."""
    errors = ember.errors
    before = ember.default_device()
    ember.set_default_device(device)
    try:
        fn = ember.compile(lambda *ts: case.ember_fn(ember, *ts))
        try:
            first = _as_list(fn(*make_tensors(ember, case, device)))
            first = [{"shape": tuple(t.shape), "dtype": t.dtype.name, "value": t.tolist()} for t in first]
            outs = _as_list(fn(*make_tensors(ember, case, device)))
            res = [{"shape": tuple(t.shape), "dtype": t.dtype.name, "value": t.tolist()} for t in outs]
        except errors.EmberError as e:
            return [{"error": type(e).__name__, "message": str(e)}]
        if repr(first) != repr(res):
            return [{"error": "PlanMismatch", "message": f"replay {res!r} != recording {first!r}"}]
        st = fn.stats()
        if st["replays"] + st["eager_calls"] != 1:
            return [{"error": "PlanNotUsed", "message": f"second call neither replayed nor ran eagerly: {st}"}]
        return res
    finally:
        ember.set_default_device(before)


_NP_TO_EMBER = {"float64": "float32", "float32": "float32", "float16": "float16", "int32": "int32",
                "int64": "int64", "uint8": "uint8", "bool": "bool", "uint64": "uint64", "int8": "int8",
                "int16": "int16", "uint16": "uint16", "uint32": "uint32"}


def expected(np, case: OpCase) -> list:
    """The numpy side: ``[{"shape", "dtype", "value"}]`` (float64 reported as float32, or the
    case's ``dtype``). Needs numpy, given as ``np``. Error cases give ``[{"error", "match"}]``."""
    if case.raises:
        return [{"error": case.raises, "match": list(case.match)}]
    arrays = [np.array(flat, dtype=dt).reshape(shape) for flat, shape, dt in generate_inputs(case)]
    import warnings

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # empty means, ddof >= n: expected nan/inf
        outs = _as_list(case.numpy_fn(np, *arrays))
    want = _as_list(case.dtype) if case.dtype is not None else [None] * len(outs)
    res = []
    for a, w in zip(outs, want):
        a = np.asarray(a)
        name = w or _NP_TO_EMBER.get(a.dtype.name)
        if name is None:
            raise TypeError(f"{case.id}: numpy result dtype {a.dtype} has no ember dtype; cast in numpy_fn")
        if a.dtype.name == "float64":
            a = a.astype(np.float32)
        res.append({"shape": tuple(a.shape), "dtype": name, "value": a.tolist()})
    return res


def _close(a, b, rtol, atol) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or (isinstance(a, int) and isinstance(b, int)):
        return a == b
    a = float(a)
    b = float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def compare(actual_nested, expected_nested, rtol: float, atol: float):
    """Compare nested values elementwise (NaN-aware, ints/bools exact). Returns ``(ok, message)``;
    the message lists the first mismatching flat positions and the largest error."""
    a = flatten(actual_nested)
    b = flatten(expected_nested)
    if len(a) != len(b):
        return False, f"size mismatch: got {len(a)} values, expected {len(b)}"
    bad = []
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        if not _close(x, y, rtol, atol):
            bad.append(i)
            try:
                worst = max(worst, abs(float(x) - float(y)))
            except (TypeError, ValueError, OverflowError):
                pass
    if not bad:
        return True, ""
    shown = ", ".join(f"[{i}] got {a[i]!r} expected {b[i]!r}" for i in bad[:5])
    return False, (f"{len(bad)}/{len(a)} values differ (rtol={rtol}, atol={atol}, max abs err {worst:.3g}): "
                   f"{shown}{' ...' if len(bad) > 5 else ''}")


def tolerances(case: OpCase, dtype_name: str):
    """(rtol, atol) for an output of ``dtype_name``: the case's own, else ``TOLERANCES``."""
    rtol, atol = TOLERANCES.get(dtype_name, (0.0, 0.0))
    if dtype_name in TOLERANCES:
        if case.rtol is not None:
            rtol = max(rtol, case.rtol)
        if case.atol is not None:
            atol = max(atol, case.atol)
    return rtol, atol


def check_results(case: OpCase, actual: list, want: list):
    """Compare ``run_case`` output with ``expected`` output: count, dtype, shape, values (or the
    error class and message). Returns ``(ok, message)``."""
    if case.raises:
        if len(actual) != 1 or "error" not in actual[0]:
            return False, f"{case.id}: expected {case.raises}, but no error was raised"
        got = actual[0]
        if got["error"] != case.raises:
            return False, f"{case.id}: expected {case.raises}, got {got['error']}: {got['message']}"
        missing = [m for m in case.match if m not in got["message"]]
        if missing:
            return False, f"{case.id}: {got['error']} message {got['message']!r} lacks {missing}"
        return True, ""
    if actual and "error" in actual[0]:
        return False, f"{case.id}: raised {actual[0]['error']}: {actual[0]['message']}"
    if len(actual) != len(want):
        return False, f"{case.id}: {len(actual)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(actual, want)):
        where = f"{case.id}: output {k}" if len(want) > 1 else case.id
        if tuple(g["shape"]) != tuple(w["shape"]):
            return False, f"{where}: shape {tuple(g['shape'])}, expected {tuple(w['shape'])}"
        if g["dtype"] != w["dtype"]:
            return False, f"{where}: dtype {g['dtype']}, expected {w['dtype']}"
        rtol, atol = tolerances(case, w["dtype"])
        ok, msg = compare(g["value"], w["value"], rtol, atol)
        if not ok:
            return False, f"{where} (shape {tuple(w['shape'])}, {w['dtype']}): {msg}"
    return True, ""


def _map_values(results, fn):
    def walk(v):
        if isinstance(v, list):
            return [walk(x) for x in v]
        return fn(v)
    return [dict(r, value=walk(r["value"])) if "value" in r else dict(r) for r in results]


def to_json_safe(results: list) -> list:
    """``run_case``/``expected`` results with NaN/+-inf as the strings "nan"/"inf"/"-inf"
    (strict JSON, e.g. ``JSON.parse`` in JavaScript, has no NaN); ``from_json_safe`` undoes it."""
    def enc(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if v != v else ("inf" if v > 0 else "-inf")
        return v
    return _map_values(results, enc)


def from_json_safe(results: list) -> list:
    """Inverse of ``to_json_safe`` (shapes come back as lists; ``check_results`` accepts that)."""
    def dec(v):
        return float(v) if isinstance(v, str) else v
    return _map_values(results, dec)


# ---- the cases -------------------------------------------------------------------------------

CASES: list = []


def add(*cases) -> None:
    CASES.extend(cases)


F, H, I32, I64, U8, B = "float32", "float16", "int32", "int64", "uint8", "bool"

# Shapes for elementwise cases: scalar, size-0, size-1, vectors, matrices, rank 3/4.
SHAPES = [(), (0,), (1,), (5,), (2, 3), (2, 0, 3), (3, 1, 4), (2, 3, 2, 2)]
# Pairs that broadcast (numpy rules), including against scalars and size-0 axes.
BCAST = [((), (3,)), ((2, 3), (3,)), ((2, 1), (1, 4)), ((4, 1, 3), (2, 1)), ((1,), (0,)),
         ((2, 0, 1), (1, 5)), ((3, 1, 2, 1), (4, 1, 1)), ((1, 1), ())]


def _shape_id(shape) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


# CASES-BEGIN (core op cases; generated by the small loops below)

# Array-API promotion, written out independently of ember.dtypes as the spec the cases check:
# same kind -> the wider; bool + x -> x; int + float -> the float; f16 + f32 -> f32.
_ORDER = {"bool": 0, "uint8": 1, "int32": 2, "int64": 3, "float16": 10, "float32": 11}


def promote(*names):
    r = names[0]
    for n in names[1:]:
        if (_ORDER[r] >= 10) != (_ORDER[n] >= 10) and "bool" not in (r, n):
            r = r if _ORDER[r] >= 10 else n
        else:
            r = r if _ORDER[r] >= _ORDER[n] else n
    return r


def _fl(name):
    return name if name in (F, H) else F


def _npcast(np, a, name):
    return a.astype({"bool": np.bool_}.get(name, name))


# ---- elementwise unary -------------------------------------------------------------------------

_FLOAT_UNARY = {  # name: (numpy function name, input range for the main cases)
    "exp": ("exp", (-4, 4)), "log": ("log", (0.01, 6)), "sqrt": ("sqrt", (0, 9)),
    "sin": ("sin", (-7, 7)), "cos": ("cos", (-7, 7)), "tanh": ("tanh", (-4, 4)), "erf": (None, (-3, 3)),
}


def _np_unary(np, name, x):
    if name == "erf":
        import math
        f = np.vectorize(math.erf, otypes=[np.float64])
        return f(x.astype(np.float64)).astype(x.dtype) if x.size else x.astype(np.float64).astype(x.dtype)
    return getattr(np, _FLOAT_UNARY[name][0])(x)


for _name, (_npn, (_lo, _hi)) in _FLOAT_UNARY.items():
    _e = (lambda n: lambda e, x: getattr(e, n)(x))(_name)
    _n = (lambda n: lambda np, x: _np_unary(np, n, x))(_name)
    _nf = (lambda n: lambda np, x: _np_unary(np, n, x.astype(np.float32)))(_name)
    for _sh in SHAPES:
        add(OpCase(f"{_name}/f32/{_shape_id(_sh)}", _e, _n, [S(_sh, F, _lo, _hi)]))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((12,), F, _lo, _hi, special=True)]))
    add(OpCase(f"{_name}/f16/2x3", _e, _n, [S((2, 3), H, _lo, _hi)]))
    add(OpCase(f"{_name}/f16/special", _e, _n, [S((8,), H, _lo, _hi, special=True)]))
    for _dt in (I32, I64, U8):
        add(OpCase(f"{_name}/{_dt}", _e, _nf, [S((7,), _dt, max(0, _lo) if _dt == U8 else int(_lo),
                                                  min(_hi, 5))], 2e-6))
    add(OpCase(f"{_name}/bool", _e, _nf, [S((2, 3), B)]))
add(OpCase("log/f32/negative_zero", lambda e, x: e.log(x), lambda np, x: np.log(x),
           [S((4,), F, values=[-1.0, 0.0, -0.0, 1.0])]))
add(OpCase("sqrt/f32/negative", lambda e, x: e.sqrt(x), lambda np, x: np.sqrt(x),
           [S((4,), F, values=[-1.0, -0.0, 4.0, 2.0])]))
add(OpCase("exp/f32/overflow", lambda e, x: e.exp(x), lambda np, x: np.exp(x),
           [S((4,), F, values=[100.0, -200.0, 88.0, 89.0])]))
add(OpCase("exp/f16/overflow", lambda e, x: e.exp(x), lambda np, x: np.exp(x), [S((3,), H, values=[12.0, -20.0, 11.0])]))

_NUM_UNARY = {  # ops that keep the dtype; bool is an error
    "negative": lambda np, x: np.negative(x), "sign": lambda np, x: np.sign(x),
    "floor": lambda np, x: np.floor(x) if x.dtype.kind == "f" else x.copy(),
    "ceil": lambda np, x: np.ceil(x) if x.dtype.kind == "f" else x.copy(),
    "round": lambda np, x: np.round(x) if x.dtype.kind == "f" else x.copy(),
    "square": lambda np, x: np.square(x),
}
for _name, _n in _NUM_UNARY.items():
    _e = (lambda n: lambda e, x: getattr(e, n)(x))(_name)
    for _sh in SHAPES:
        add(OpCase(f"{_name}/f32/{_shape_id(_sh)}", _e, _n, [S(_sh, F)]))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((10,), F, special=True)]))
    for _dt in (H, I32, I64, U8):
        add(OpCase(f"{_name}/{_dt}", _e, _n, [S((2, 4), _dt)]))
    add(OpCase(f"{_name}/err/bool", _e, None, [S((3,), B)], raises="DTypeError", match=(_name, "bool")))
add(OpCase("round/f32/halves", lambda e, x: e.round(x), lambda np, x: np.round(x),
           [S((10,), F, values=[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -3.5, 1e20])]))
add(OpCase("round/f16/halves", lambda e, x: e.round(x), lambda np, x: np.round(x),
           [S((6,), H, values=[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])]))
add(OpCase("floor/f32/edges", lambda e, x: e.floor(x), lambda np, x: np.floor(x),
           [S((6,), F, values=[-0.5, -0.0, 0.0, 2.0, -2.0, -1e-30])]))
add(OpCase("negative/u8/wrap", lambda e, x: -x, lambda np, x: -x, [S((4,), U8, values=[0, 1, 128, 255])]))
add(OpCase("negative/i32/min", lambda e, x: -x, lambda np, x: -x, [S((2,), I32, values=[-(2 ** 31), 5])]))

for _dt in (F, H, I32, I64, U8, B):
    add(OpCase(f"abs/{_dt}", lambda e, x: e.abs(x), lambda np, x: np.abs(x), [S((2, 3), _dt)]))
    add(OpCase(f"isnan/{_dt}", lambda e, x: e.isnan(x), lambda np, x: np.isnan(x), [S((7,), _dt, special=_dt in (F, H))]))
    add(OpCase(f"isinf/{_dt}", lambda e, x: e.isinf(x), lambda np, x: np.isinf(x), [S((7,), _dt, special=_dt in (F, H))]))
    add(OpCase(f"isfinite/{_dt}", lambda e, x: e.isfinite(x), lambda np, x: np.isfinite(x),
               [S((7,), _dt, special=_dt in (F, H))]))
for _sh in SHAPES:
    add(OpCase(f"abs/f32/{_shape_id(_sh)}", lambda e, x: abs(x), lambda np, x: np.abs(x), [S(_sh, F, special=True)]))
    add(OpCase(f"logical_not/{_shape_id(_sh)}", lambda e, x: e.logical_not(x), lambda np, x: np.logical_not(x),
               [S(_sh, B)]))
    add(OpCase(f"invert/bool/{_shape_id(_sh)}", lambda e, x: ~x, lambda np, x: ~x, [S(_sh, B)]))
add(OpCase("abs/f32/signed_zero", lambda e, x: e.abs(x), lambda np, x: np.abs(x), [S((2,), F, values=[-0.0, -3.0])]))
add(OpCase("logical_not/err/f32", lambda e, x: e.logical_not(x), None, [S((3,))], raises="DTypeError",
           match=("logical_not", "float32")))
add(OpCase("invert/err/f32", lambda e, x: ~x, None, [S((3,), F)], raises="DTypeError", match=("bitwise_invert", "float32")))
for _dt in (F, H, I32, I64, U8, B):
    add(OpCase(f"reciprocal/{_dt}", lambda e, x: e.reciprocal(x),
               lambda np, x, d=_dt: np.reciprocal(x.astype(_fl(d))), [S((5,), _dt, nonzero=True)], 2e-6))
    add(OpCase(f"rsqrt/{_dt}", lambda e, x: e.rsqrt(x),
               lambda np, x, d=_dt: 1 / np.sqrt(x.astype(_fl(d))),
               [S((5,), _dt, 0.1 if _dt in (F, H) else 0, 9)], 2e-6))
add(OpCase("positive/f32", lambda e, x: +x, lambda np, x: +x, [S((2, 2))]))

# ---- cast --------------------------------------------------------------------------------------

_CAST_RANGE = {F: (-100, 100), H: (-100, 100), I32: (-100, 100), I64: (-100, 100), U8: (0, 255), B: (0, 1)}


def _np_astype(np, x, name):
    """The documented float -> int rule: truncate toward zero, saturate, NaN -> 0."""
    if name in (I32, I64, U8) and x.dtype.kind == "f":
        info = np.iinfo(name)
        r = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf)
        hi = r >= float(info.max)
        lo = r <= float(info.min)
        out = np.trunc(np.where(hi | lo, 0.0, r)).astype(name)
        out[hi] = info.max
        out[lo] = info.min
        return out
    return _npcast(np, x, name)


for _src in (F, H, I32, I64, U8, B):
    for _dst in (F, H, I32, I64, U8, B):
        _lo, _hi = _CAST_RANGE[_src]
        if _dst == U8 and _src in (F, H):
            _lo = 0  # negative floats saturate to 0 (numpy: undefined); negative ints wrap
        if _dst == U8 and _src in (I32, I64):
            _lo, _hi = -300, 300
        add(OpCase(f"astype/{_src}->{_dst}", lambda e, x, d=_dst: x.astype(d),
                   lambda np, x, d=_dst: _np_astype(np, x, d), [S((3, 4), _src, _lo, _hi)]))
_GPU_I64 = {"webgpu": "int64 is stored as int32 on the GPU (WGSL has no 64-bit integers); values beyond 32 bits cannot exist there"}
for _dst in (I32, I64, U8, B, H):
    add(OpCase(f"astype/f32->{_dst}/special", lambda e, x, d=_dst: e.astype(x, d),
               lambda np, x, d=_dst: _np_astype(np, x, d),
               [S((10,), F, values=[float("nan"), float("inf"), -float("inf"), -1.7, 1.7, -0.5, 3e9, -3e9, 1e20,
                                    70000.0])], skip=_GPU_I64 if _dst == I64 else None))
add(OpCase("astype/i64->i32/wrap", lambda e, x: x.astype("int32"), lambda np, x: x.astype(np.int32),
           [S((3,), I64, values=[2 ** 31, -(2 ** 31) - 1, 2 ** 40 + 5])], skip=_GPU_I64))
add(OpCase("astype/f32->f32/scalar", lambda e, x: x.astype("float32"), lambda np, x: x, [S((), F)]))

# ---- elementwise binary ------------------------------------------------------------------------

_ARITH = {
    "add": (lambda e, a, b: a + b, lambda np, a, b: a + b),
    "subtract": (lambda e, a, b: a - b, lambda np, a, b: a - b),
    "multiply": (lambda e, a, b: a * b, lambda np, a, b: a * b),
    "maximum": (lambda e, a, b: e.maximum(a, b), lambda np, a, b: np.maximum(a, b)),
    "minimum": (lambda e, a, b: e.minimum(a, b), lambda np, a, b: np.minimum(a, b)),
}
_COMPARE = {
    "equal": (lambda e, a, b: a == b, lambda np, a, b: a == b),
    "not_equal": (lambda e, a, b: a != b, lambda np, a, b: a != b),
    "less": (lambda e, a, b: a < b, lambda np, a, b: a < b),
    "less_equal": (lambda e, a, b: a <= b, lambda np, a, b: a <= b),
    "greater": (lambda e, a, b: a > b, lambda np, a, b: a > b),
    "greater_equal": (lambda e, a, b: a >= b, lambda np, a, b: a >= b),
}
_PAIRS = [(I32, I32), (I64, I32), (U8, I32), (U8, U8), (I64, I64), (H, H), (H, F), (I32, F), (U8, H), (B, I64),
          (B, F), (I64, H)]


def _in_common(np, fn, a, b, out):
    """numpy on both inputs cast to the array-API result dtype ``out``."""
    return fn(np, _npcast(np, a, out), _npcast(np, b, out))


for _name, (_e, _n) in list(_ARITH.items()) + list(_COMPARE.items()):
    for _sh in SHAPES:
        add(OpCase(f"{_name}/f32/{_shape_id(_sh)}", _e, _n, [S(_sh, F), S(_sh, F)]))
    for _a, _b in BCAST:
        add(OpCase(f"{_name}/bcast/{_shape_id(_a)}+{_shape_id(_b)}", _e, _n, [S(_a, F), S(_b, F)]))
    for _a, _b in _PAIRS:
        _p = promote(_a, _b)
        add(OpCase(f"{_name}/{_a}+{_b}", _e, (lambda n, p: lambda np, a, b: _in_common(np, n, a, b, p))(_n, _p),
                   [S((2, 3), _a), S((3,), _b)], dtype=_p if _name in _ARITH else B))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((10,), F, special=True), S((10,), F, special=True)],
               skip={"webgpu": _WGSL_FLOORDIV} if _name == "floor_divide" else None))
    add(OpCase(f"{_name}/f32+pyfloat", lambda e, a, f=_e: f(e, a, 1.5), lambda np, a, f=_n: f(np, a, np.float32(1.5)),
               [S((2, 2), F)]))
    add(OpCase(f"{_name}/pyint+i32", lambda e, a, f=_e: f(e, 2, a), lambda np, a, f=_n: f(np, np.int32(2), a),
               [S((4,), I32)]))
for _name in _COMPARE:
    add(OpCase(f"{_name}/bool+bool", _COMPARE[_name][0], _COMPARE[_name][1], [S((6,), B), S((6,), B)]))
    add(OpCase(f"{_name}/f16/equal_values", _COMPARE[_name][0], _COMPARE[_name][1],
               [S((4,), H, values=[1.0, 2.0, 0.1, -0.0]), S((4,), H, values=[1.0, 3.0, 0.1, 0.0])]))
for _name in ("maximum", "minimum"):
    add(OpCase(f"{_name}/bool", _ARITH[_name][0], _ARITH[_name][1], [S((6,), B), S((6,), B)]))
    add(OpCase(f"{_name}/nan", _ARITH[_name][0], _ARITH[_name][1],
               [S((4,), F, values=[float("nan"), 1.0, float("nan"), -float("inf")]),
                S((4,), F, values=[1.0, float("nan"), float("nan"), 2.0])]))
for _name in ("add", "subtract", "multiply"):
    add(OpCase(f"{_name}/err/bool+bool", _ARITH[_name][0], None, [S((2,), B), S((2,), B)], raises="DTypeError",
               match=(_name, "bool")))
add(OpCase("add/i32/wrap", lambda e, a, b: a + b, lambda np, a, b: a + b,
           [S((2,), I32, values=[2 ** 31 - 1, -(2 ** 31)]), S((2,), I32, values=[1, -1])]))
add(OpCase("add/u8/wrap", lambda e, a, b: a + b, lambda np, a, b: a + b,
           [S((2,), U8, values=[250, 3]), S((2,), U8, values=[10, 1])]))
add(OpCase("multiply/f16/overflow", lambda e, a, b: a * b, lambda np, a, b: a * b,
           [S((2,), H, values=[300.0, -300.0]), S((2,), H, values=[300.0, 300.0])]))
add(OpCase("add/f16+pyfloat_stays_f16", lambda e, a: a + 2.0, lambda np, a: a + np.float16(2.0), [S((3,), H)]))
add(OpCase("multiply/i32*pyfloat_is_f32", lambda e, a: a * 1.5, lambda np, a: a.astype(np.float32) * np.float32(1.5),
           [S((3,), I32)]))
add(OpCase("add/bool+pyint", lambda e, a: a + 1, lambda np, a: a.astype(np.int64) + 1, [S((3,), B)]))
add(OpCase("add/u8+pyint", lambda e, a: a + 7, lambda np, a: a + np.uint8(7), [S((3,), U8)]))
add(OpCase("add/err/u8+300", lambda e, a: a + 300, None, [S((3,), U8)], raises="DTypeError", match=("300", "uint8")))
add(OpCase("add/err/bcast", lambda e, a, b: a + b, None, [S((2, 3)), S((4,))], raises="ShapeError",
           match=("add", "(2, 3)", "(4,)")))
add(OpCase("less/err/bcast", lambda e, a, b: a < b, None, [S((2, 3)), S((2,))], raises="ShapeError",
           match=("less", "(2, 3)", "(2,)")))
add(OpCase("greater/err/bcast", lambda e, a, b: a > b, None, [S((5,)), S((2,))], raises="ShapeError",
           match=("(5,)", "(2,)")))

# divide and friends
_WGSL_FLOORDIV = ("the WGSL floordiv_f32 gives Python's nan / -1.0 for an infinite operand (the standard "
                  "allows it; python and numpy give its preferred floor(a / b))")


def _np_floor_divide(np, a, b):
    # the array API's preferred floor(a / b) where an operand is infinite (numpy: nan, -1.0)
    with np.errstate(all="ignore"):
        r = np.floor_divide(a, b)
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            r = np.where(np.isinf(a) | np.isinf(b), np.floor(a / b), r).astype(r.dtype)
    return r


_DIV = {
    "divide": (lambda e, a, b: a / b, lambda np, a, b: np.true_divide(a, b)),
    "floor_divide": (lambda e, a, b: a // b, _np_floor_divide),
    "remainder": (lambda e, a, b: a % b, lambda np, a, b: np.remainder(a, b)),
}
for _name, (_e, _n) in _DIV.items():
    for _sh in SHAPES:
        add(OpCase(f"{_name}/f32/{_shape_id(_sh)}", _e, _n, [S(_sh, F, -10, 10), S(_sh, F, nonzero=True)], 1e-5, 1e-5))
    for _a, _b in BCAST[:4]:
        add(OpCase(f"{_name}/bcast/{_shape_id(_a)}+{_shape_id(_b)}", _e, _n, [S(_a, F), S(_b, F, nonzero=True)]))
    for _a, _b in [(I32, I32), (I64, I64), (I64, I32), (U8, U8), (H, H), (I32, F), (B, I32)]:
        _p = promote(_a, _b)
        _out = _fl(_p) if _name == "divide" else _p
        add(OpCase(f"{_name}/{_a}+{_b}", _e, (lambda n, p: lambda np, a, b: _in_common(np, n, a, b, p))(_n, _out),
                   [S((3, 4), _a, -20 if _a != U8 else 0, 20), S((4,), _b, 1 if _b in (U8, B) else -5,
                                                                 5, nonzero=_b != B)],
                   dtype=_out))
    add(OpCase(f"{_name}/f32/special", _e, _n, [S((10,), F, special=True), S((10,), F, special=True)],
               skip={"webgpu": _WGSL_FLOORDIV} if _name == "floor_divide" else None))
    add(OpCase(f"{_name}/f32/by_zero", _e, _n, [S((4,), F, values=[1.0, -1.0, 0.0, 2.5]), S((4,), F, values=[0.0, 0.0, 0.0, -0.0])]))
add(OpCase("divide/i32/by_zero", lambda e, a, b: a / b, lambda np, a, b: (a / b).astype(np.float32),
           [S((3,), I32, values=[1, -1, 0]), S((3,), I32, values=[0, 0, 0])]))
for _name in ("floor_divide", "remainder"):
    add(OpCase(f"{_name}/i64/by_zero", _DIV[_name][0], _DIV[_name][1],
               [S((3,), I64, values=[7, -7, 0]), S((3,), I64, values=[0, 0, 0])]))
    add(OpCase(f"{_name}/i32/signs", _DIV[_name][0], _DIV[_name][1],
               [S((4,), I32, values=[7, -7, 7, -7]), S((4,), I32, values=[3, 3, -3, -3])]))
    add(OpCase(f"{_name}/f32/signs", _DIV[_name][0], _DIV[_name][1],
               [S((4,), F, values=[7.5, -7.5, 7.5, -7.5]), S((4,), F, values=[2.0, 2.0, -2.0, -2.0])]))
    add(OpCase(f"{_name}/err/bool", _DIV[_name][0], None, [S((2,), B), S((2,), B)], raises="DTypeError",
               match=(_name, "bool")))
add(OpCase("divide/bool+bool", lambda e, a, b: a / b, lambda np, a, b: (a / b).astype(np.float32),
           [S((4,), B, values=[True, False, True, False]), S((4,), B, values=[True, True, False, False])]))

# pow
add(OpCase("pow/f32/positive_base", lambda e, a, b: a ** b, lambda np, a, b: a ** b, [S((3, 4), F, 0.1, 3), S((4,), F)], 2e-5))
add(OpCase("pow/f32/negative_base_int_exp", lambda e, a, b: e.pow(a, b), lambda np, a, b: np.power(a, b),
           [S((6,), F, values=[-2.0, -2.0, -1.5, -3.0, -0.5, -2.0]),
            S((6,), F, values=[2.0, 3.0, -2.0, 0.0, -3.0, 0.5])]))
add(OpCase("pow/f32/special", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((10,), F, special=True), S((10,), F, special=True)]))
add(OpCase("pow/f32/zero_base", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((4,), F, values=[0.0, -0.0, 0.0, -0.0]), S((4,), F, values=[-1.0, -1.0, -2.0, 3.0])]))
add(OpCase("pow/f32/overflow", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((3,), F, values=[10.0, -10.0, -10.0]), S((3,), F, values=[50.0, 51.0, 50.0])]))
for _a, _b in [(I32, I32), (I64, I64), (U8, U8), (I32, I64)]:
    add(OpCase(f"pow/{_a}+{_b}", lambda e, a, b: a ** b, lambda np, a, b, p=promote(_a, _b): np.power(a.astype(p), b.astype(p)),
               [S((2, 3), _a, -4 if _a != U8 else 0, 4), S((3,), _b, 0, 5)], dtype=promote(_a, _b)))
add(OpCase("pow/i64/wrap", lambda e, a, b: a ** b, lambda np, a, b: np.power(a, b),
           [S((2,), I64, values=[3, -7]), S((2,), I64, values=[50, 41])], skip=_GPU_I64))
add(OpCase("pow/i32/negative_exp", lambda e, a, b: a ** b,
           lambda np, a, b: np.array([1, -1, 1, 0, 0], dtype=np.int32),
           [S((5,), I32, values=[1, -1, -1, 2, -3]), S((5,), I32, values=[-3, -3, -2, -1, -2])]))
add(OpCase("pow/f16", lambda e, a, b: a ** b, lambda np, a, b: a ** b, [S((5,), H, 0.5, 2), S((5,), H, -2, 2)]))
add(OpCase("pow/i32**pyfloat", lambda e, a: a ** 0.5, lambda np, a: np.sqrt(a.astype(np.float32)), [S((4,), I32, 0, 9)]))
add(OpCase("pow/pyfloat**f32", lambda e, a: 2.0 ** a, lambda np, a: np.float32(2.0) ** a, [S((4,), F)]))

# logical
_LOGICAL = {
    "logical_and": (lambda e, a, b: e.logical_and(a, b), lambda np, a, b: np.logical_and(a, b)),
    "logical_or": (lambda e, a, b: e.logical_or(a, b), lambda np, a, b: np.logical_or(a, b)),
    "logical_xor": (lambda e, a, b: e.logical_xor(a, b), lambda np, a, b: np.logical_xor(a, b)),
    "and_op": (lambda e, a, b: a & b, lambda np, a, b: a & b),
    "or_op": (lambda e, a, b: a | b, lambda np, a, b: a | b),
    "xor_op": (lambda e, a, b: a ^ b, lambda np, a, b: a ^ b),
}
for _name, (_e, _n) in _LOGICAL.items():
    for _sh in SHAPES[:5]:
        add(OpCase(f"{_name}/{_shape_id(_sh)}", _e, _n, [S(_sh, B), S(_sh, B)]))
    add(OpCase(f"{_name}/bcast", _e, _n, [S((3, 1), B), S((4,), B)]))
    add(OpCase(f"{_name}/pybool", lambda e, a, f=_e: f(e, a, True), lambda np, a, f=_n: f(np, a, np.bool_(True)),
               [S((4,), B)]))
    add(OpCase(f"{_name}/err/float", _e, None, [S((3,), F), S((3,), B)], raises="DTypeError", match=("float32",)))
    if not _name.endswith("_op"):   # & | ^ on ints are the bitwise ops (op_cases_array_api)
        add(OpCase(f"{_name}/err/int", _e, None, [S((3,), I32), S((3,), I32)], raises="DTypeError", match=("int32",)))

# where / clip
for _c, _a, _b in [((4,), (4,), (4,)), ((2, 3), (3,), ()), ((3, 1), (1, 4), (3, 4)), ((), (2,), (2,)),
                   ((0,), (0,), (1,)), ((2, 1, 3), (2, 3), (1, 1, 1))]:
    add(OpCase(f"where/f32/{_shape_id(_c)}|{_shape_id(_a)}|{_shape_id(_b)}", lambda e, c, a, b: e.where(c, a, b),
               lambda np, c, a, b: np.where(c, a, b), [S(_c, B), S(_a, F), S(_b, F)]))
for _a, _b in [(I32, I32), (I32, F), (H, H), (B, B), (U8, I64), (H, F)]:
    add(OpCase(f"where/{_a}+{_b}", lambda e, c, a, b: e.where(c, a, b),
               lambda np, c, a, b, p=promote(_a, _b): np.where(c, _npcast(np, a, p), _npcast(np, b, p)),
               [S((5,), B), S((5,), _a), S((5,), _b)], dtype=promote(_a, _b)))
add(OpCase("where/scalars", lambda e, c: e.where(c, 1.0, 0.0), lambda np, c: np.where(c, 1.0, 0.0).astype(np.float32),
           [S((2, 3), B)]))
add(OpCase("where/f16+pyfloat", lambda e, c, a: e.where(c, a, -1.0), lambda np, c, a: np.where(c, a, np.float16(-1)),
           [S((4,), B), S((4,), H)]))
add(OpCase("where/err/cond_float", lambda e, c, a, b: e.where(c, a, b), None, [S((3,)), S((3,)), S((3,))],
           raises="DTypeError", match=("where", "float32")))
add(OpCase("where/err/bcast", lambda e, c, a, b: e.where(c, a, b), None, [S((3,), B), S((2,)), S((3,))],
           raises="ShapeError", match=("where",)))
for _lo, _hi in [(-1.0, 1.0), (None, 0.5), (0.0, None), (2.0, -2.0)]:
    add(OpCase(f"clip/f32/{_lo}:{_hi}", lambda e, x, lo=_lo, hi=_hi: e.clip(x, lo, hi),
               lambda np, x, lo=_lo, hi=_hi: np.minimum(np.maximum(x, lo) if lo is not None else x, hi) if hi is not None
               else np.maximum(x, lo), [S((3, 4), F, special=True)]))
add(OpCase("clip/i32", lambda e, x: e.clip(x, -3, 4), lambda np, x: np.clip(x, -3, 4), [S((10,), I32)]))
add(OpCase("clip/u8", lambda e, x: x.clip(2, 9), lambda np, x: np.clip(x, 2, 9), [S((10,), U8)]))
add(OpCase("clip/f16", lambda e, x: e.clip(x, -1.0, 1.0), lambda np, x: np.clip(x, np.float16(-1), np.float16(1)), [S((6,), H)]))
add(OpCase("clip/f32/tensor_bounds", lambda e, x, lo, hi: e.clip(x, lo, hi), lambda np, x, lo, hi: np.minimum(np.maximum(x, lo), hi),
           [S((3, 4)), S((4,), F, -2, 0), S((3, 1), F, 0, 2)]))

# ---- creation ----------------------------------------------------------------------------------

for _args in [(5,), (0,), (2, 9), (10, 2, -3), (3, 3), (-2, 4, 2)]:
    add(OpCase(f"arange/int/{_args}", lambda e, a=_args: e.arange(*a), lambda np, a=_args: np.arange(*a).astype(np.int64), []))
for _args in [(0.0, 1.0, 0.1), (1, 2, 0.25), (5.0,), (2.0, -1.0, -0.5), (0, 1, 0.3)]:
    add(OpCase(f"arange/float/{_args}", lambda e, a=_args: e.arange(*a),
               lambda np, a=_args: np.arange(*a, dtype=np.float64).astype(np.float32), []))
add(OpCase("arange/dtype_f16", lambda e: e.arange(4, dtype="float16"), lambda np: np.arange(4, dtype=np.float16), []))
add(OpCase("arange/dtype_i32", lambda e: e.arange(1, 7, 2, dtype="int32"), lambda np: np.arange(1, 7, 2, dtype=np.int32), []))
add(OpCase("arange/err/step0", lambda e: e.arange(0, 3, 0), None, [], raises="ShapeError", match=("arange", "step")))
for _args, _kw in [((0, 1, 5), {}), ((-2.0, 3.0, 7), {}), ((1, 0, 4), {}), ((0, 1, 1), {}), ((0, 1, 0), {}),
                   ((0, 1, 4), {"endpoint": False}), ((0, 10, 5), {"dtype": "float16"})]:
    add(OpCase(f"linspace/{_args}{_kw}", lambda e, a=_args, k=_kw: e.linspace(*a, **k),
               lambda np, a=_args, k=_kw: np.linspace(*a, **{n: v for n, v in k.items() if n != "dtype"}).astype(
                   k.get("dtype", np.float32)), []))
for _args, _kw in [((3,), {}), ((2, 4), {}), ((4, 3), {"k": 1}), ((3, 3), {"k": -2}), ((3,), {"dtype": "int32"}),
                   ((0,), {}), ((2, 2), {"k": 5}), ((3,), {"dtype": "bool"})]:
    add(OpCase(f"eye/{_args}{_kw}", lambda e, a=_args, k=_kw: e.eye(*a, **k),
               lambda np, a=_args, k=_kw: np.eye(*a, k=k.get("k", 0), dtype=k.get("dtype", np.float32)), []))
for _shape, _val, _dt in [((2, 3), 1.5, None), ((), 7, None), ((0, 2), 1.0, None), ((3,), True, None),
                          ((2, 2), 3, "float16"), ((4,), 2.9, "int32"), ((2,), 255, "uint8"), ((3,), 0.0, "bool")]:
    add(OpCase(f"full/{_shape_id(_shape)}/{_val}/{_dt}", lambda e, s=_shape, v=_val, d=_dt: e.full(s, v, dtype=d),
               lambda np, s=_shape, v=_val, d=_dt: np.full(s, v, dtype=d or type(v)).astype(
                   d or {bool: "bool", int: "int64", float: "float32"}[type(v)]),
               []))
# an int outside the dtype's range is refused (like numpy >= 2), not wrapped
for _val, _dt in [(-1, "uint8"), (256, "uint8"), (2 ** 31, "int32"), (2 ** 63, "int64")]:
    add(OpCase(f"full/err/{_val}/{_dt}", lambda e, v=_val, d=_dt: e.full((2,), v, dtype=d), None, [],
               raises="DTypeError", match=("full", str(_val), _dt)))
add(OpCase("zeros/2x3", lambda e: e.zeros((2, 3)), lambda np: np.zeros((2, 3), np.float32), []))
add(OpCase("ones/i64", lambda e: e.ones(4, dtype="int64"), lambda np: np.ones(4, np.int64), []))
add(OpCase("zeros_like/i32", lambda e, x: e.zeros_like(x), lambda np, x: np.zeros_like(x), [S((2, 2), I32)]))
add(OpCase("ones_like/f16", lambda e, x: e.ones_like(x), lambda np, x: np.ones_like(x), [S((3,), H)]))
add(OpCase("full_like/bool->f32", lambda e, x: e.full_like(x, 2.5, dtype="float32"),
           lambda np, x: np.full_like(x, 2.5, dtype=np.float32), [S((2, 1), B)]))
add(OpCase("full/err/negative", lambda e: e.full((2, -1), 0.0), None, [], raises="ShapeError", match=("full", "-1")))

# ---- reductions --------------------------------------------------------------------------------

_RED_SHAPES = [((), None), ((5,), None), ((5,), 0), ((2, 3), None), ((2, 3), 0), ((2, 3), 1), ((2, 3), -1),
               ((2, 3, 4), (0, 2)), ((2, 3, 4), (-1, -2)), ((3, 1, 2), 1), ((2, 0, 3), 0), ((2, 0, 3), (0, 2)),
               ((2, 0, 3), None), ((0,), None), ((1, 1), None), ((4, 5, 2, 3), (1, 3))]


def _has_empty(shape, axis):
    if axis is None:
        return 0 in shape
    axes = (axis,) if isinstance(axis, int) else axis
    return any(shape[a] == 0 for a in axes)


def _np_sum(np, fn, x, axis, keepdims):
    dt = np.int64 if x.dtype.kind in "biu" else None
    return fn(x, axis=axis, keepdims=keepdims, dtype=dt)


def _as_i64(x):
    # uint8 sums default to uint64 where a device holds it (op_cases_array_api); these cases
    # check the values on every device, in int64
    return {"dtype": "int64"} if x.dtype.name == "uint8" else {}


for _sh, _ax in _RED_SHAPES:
    for _kd in (False, True):
        _sid = f"{_shape_id(_sh)}/ax{_ax}{'/kd' if _kd else ''}"
        _tol = (1e-5, 1e-5)
        add(OpCase(f"sum/f32/{_sid}", lambda e, x, a=_ax, k=_kd: e.sum(x, axis=a, keepdims=k),
                   lambda np, x, a=_ax, k=_kd: np.sum(x, axis=a, keepdims=k), [S(_sh)], *_tol))
        add(OpCase(f"prod/f32/{_sid}", lambda e, x, a=_ax, k=_kd: e.prod(x, axis=a, keepdims=k),
                   lambda np, x, a=_ax, k=_kd: np.prod(x, axis=a, keepdims=k), [S(_sh, F, 0.5, 1.5)], *_tol))
        add(OpCase(f"mean/f32/{_sid}", lambda e, x, a=_ax, k=_kd: e.mean(x, axis=a, keepdims=k),
                   lambda np, x, a=_ax, k=_kd: np.mean(x, axis=a, keepdims=k), [S(_sh)], *_tol))
        for _name in ("max", "min"):
            if _has_empty(_sh, _ax):
                add(OpCase(f"{_name}/err/{_sid}", lambda e, x, a=_ax, k=_kd, n=_name: getattr(e, n)(x, axis=a, keepdims=k),
                           None, [S(_sh)], raises="ShapeError", match=(_name, "size-0", str(_sh))))
            else:
                add(OpCase(f"{_name}/f32/{_sid}", lambda e, x, a=_ax, k=_kd, n=_name: getattr(e, n)(x, axis=a, keepdims=k),
                           lambda np, x, a=_ax, k=_kd, n=_name: getattr(np, n)(x, axis=a, keepdims=k), [S(_sh)]))
        if not _has_empty(_sh, _ax) and _sh:
            for _c in (0, 1):
                add(OpCase(f"var/c{_c}/{_sid}", lambda e, x, a=_ax, k=_kd, c=_c: e.var(x, axis=a, correction=c, keepdims=k),
                           lambda np, x, a=_ax, k=_kd, c=_c: np.var(x, axis=a, ddof=c, keepdims=k), [S(_sh)], 1e-5, 1e-5))
                add(OpCase(f"std/c{_c}/{_sid}", lambda e, x, a=_ax, k=_kd, c=_c: e.std(x, axis=a, correction=c, keepdims=k),
                           lambda np, x, a=_ax, k=_kd, c=_c: np.std(x, axis=a, ddof=c, keepdims=k), [S(_sh)], 1e-5, 1e-5))
        for _name in ("any", "all"):
            add(OpCase(f"{_name}/{_sid}", lambda e, x, a=_ax, k=_kd, n=_name: getattr(e, n)(x, axis=a, keepdims=k),
                       lambda np, x, a=_ax, k=_kd, n=_name: getattr(np, n)(x, axis=a, keepdims=k), [S(_sh, B)]))

for _dt in (F, H, I32, I64, U8, B):
    for _ax in (None, 1):
        add(OpCase(f"sum/{_dt}/ax{_ax}", lambda e, x, a=_ax: e.sum(x, axis=a, **_as_i64(x)),
                   lambda np, x, a=_ax: _np_sum(np, np.sum, x, a, False) if x.dtype != np.float16
                   else np.sum(x.astype(np.float32), axis=a).astype(np.float16), [S((3, 4), _dt)], 1e-5, 1e-5))
        add(OpCase(f"prod/{_dt}/ax{_ax}", lambda e, x, a=_ax: e.prod(x, axis=a, **_as_i64(x)),
                   lambda np, x, a=_ax: _np_sum(np, np.prod, x, a, False) if x.dtype != np.float16
                   else np.prod(x.astype(np.float32), axis=a).astype(np.float16), [S((3, 4), _dt, 0 if _dt in (U8, B) else -3, 3)]))
        for _name in ("max", "min", "argmax", "argmin"):
            add(OpCase(f"{_name}/{_dt}/ax{_ax}", lambda e, x, a=_ax, n=_name: getattr(e, n)(x, axis=a),
                       lambda np, x, a=_ax, n=_name: getattr(np, n)(x, axis=a), [S((3, 4), _dt)]))
        if _dt != B:
            add(OpCase(f"mean/{_dt}/ax{_ax}", lambda e, x, a=_ax: e.mean(x, axis=a),
                       lambda np, x, a=_ax: np.mean(x, axis=a, dtype=np.float32).astype(
                           np.float16 if x.dtype == np.float16 else np.float32), [S((3, 4), _dt)], 1e-5, 1e-5))
            add(OpCase(f"var/{_dt}/ax{_ax}", lambda e, x, a=_ax: e.var(x, axis=a),
                       lambda np, x, a=_ax: np.var(x.astype(np.float64), axis=a).astype(
                           np.float16 if x.dtype == np.float16 else np.float32), [S((3, 4), _dt)], 1e-5, 1e-5))
    add(OpCase(f"any/{_dt}", lambda e, x: e.any(x, axis=0), lambda np, x: np.any(x, axis=0), [S((3, 4), _dt, special=_dt == F)]))
    add(OpCase(f"all/{_dt}", lambda e, x: e.all(x, axis=1), lambda np, x: np.all(x, axis=1), [S((3, 4), _dt, special=_dt == F)]))
add(OpCase("mean/err/bool", lambda e, x: e.mean(x), None, [S((3,), B)], raises="DTypeError", match=("mean", "bool")))
add(OpCase("sum/i64/wrap", lambda e, x: e.sum(x), lambda np, x: np.sum(x), [S((3,), I64, values=[2 ** 62, 2 ** 62, 2 ** 62])], skip=_GPU_I64))
add(OpCase("sum/u8/no_wrap", lambda e, x: x.sum(dtype="int64"), lambda np, x: np.sum(x, dtype=np.int64), [S((4,), U8, values=[200, 200, 255, 1])]))
add(OpCase("sum/dtype_f32", lambda e, x: e.sum(x, axis=0, dtype="float32"), lambda np, x: np.sum(x, axis=0, dtype=np.float32),
           [S((3, 2), I32)]))
add(OpCase("sum/f32/special", lambda e, x: e.sum(x, axis=1), lambda np, x: np.sum(x, axis=1), [S((4, 5), F, special=True)]))
add(OpCase("sum/f32/inf-inf", lambda e, x: e.sum(x), lambda np, x: np.sum(x), [S((2,), F, values=[float("inf"), -float("inf")])]))
add(OpCase("sum/f32/long", lambda e, x: e.sum(x, axis=-1), lambda np, x: np.sum(x.astype(np.float64), axis=-1),
           [S((3, 2000), F, 0, 1)], 1e-5))
for _name in ("max", "min", "argmax", "argmin"):
    add(OpCase(f"{_name}/f32/nan", lambda e, x, n=_name: getattr(e, n)(x, axis=1), lambda np, x, n=_name: getattr(np, n)(x, axis=1),
               [S((3, 4), F, values=[1, float("nan"), 3, float("nan"), 2, 2, 1, 0, float("inf"), -1, float("nan"), 5])]))
    add(OpCase(f"{_name}/f32/ties", lambda e, x, n=_name: getattr(e, n)(x, axis=0), lambda np, x, n=_name: getattr(np, n)(x, axis=0),
               [S((3, 2), F, values=[1, 5, 1, 5, 0, 5])]))
for _ax, _kd in [(None, False), (None, True), (0, False), (-1, True), (1, True)]:
    for _name in ("argmax", "argmin"):
        add(OpCase(f"{_name}/f32/2x3x4/ax{_ax}{'/kd' if _kd else ''}", lambda e, x, a=_ax, k=_kd, n=_name: getattr(e, n)(x, axis=a, keepdims=k),
                   lambda np, x, a=_ax, k=_kd, n=_name: getattr(np, n)(x, axis=a, keepdims=k), [S((2, 3, 4))]))
add(OpCase("argmax/scalar", lambda e, x: e.argmax(x), lambda np, x: np.argmax(x), [S(())]))
add(OpCase("argmax/err/empty", lambda e, x: e.argmax(x, axis=1), None, [S((2, 0))], raises="ShapeError",
           match=("argmax", "size-0")))
add(OpCase("argmin/err/empty_flat", lambda e, x: e.argmin(x), None, [S((0,))], raises="ShapeError", match=("argmin",)))
add(OpCase("sum/err/axis", lambda e, x: e.sum(x, axis=2), None, [S((2, 3))], raises="ShapeError", match=("sum", "axis 2")))
add(OpCase("sum/err/repeated_axis", lambda e, x: e.sum(x, axis=(0, -2)), None, [S((2, 3))], raises="ShapeError",
           match=("sum", "repeated")))
add(OpCase("mean/f16/large", lambda e, x: e.mean(x), lambda np, x: np.mean(x), [S((40, 50), H, 0, 60)], 2e-3, 2e-3))

# ---- matmul ------------------------------------------------------------------------------------

_MM = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((1, 1), (1, 1)), ((5, 7), (7, 2)),
       ((2, 2, 3), (3, 4)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4, 2, 3), (3,)), ((3,), (2, 3, 4)),
       ((0, 3), (3, 4)), ((2, 0), (0, 3)), ((2, 3), (3, 0)), ((3, 0, 2), (2, 4)), ((16, 33), (33, 17))]
for _a, _b in _MM:
    add(OpCase(f"matmul/f32/{_shape_id(_a)}@{_shape_id(_b)}", lambda e, a, b: a @ b, lambda np, a, b: a @ b,
               [S(_a), S(_b)], 1e-5, 1e-5))
for _a, _b in [(I32, I32), (I64, I64), (I32, I64), (U8, U8), (H, H), (I32, F), (H, F), (B, B), (B, I32)]:
    _p = promote(_a, _b)
    add(OpCase(f"matmul/{_a}@{_b}", lambda e, a, b: e.matmul(a, b),
               lambda np, a, b, p=_p: np.matmul(_npcast(np, a, p), _npcast(np, b, p)) if p != H else
               np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16),
               [S((3, 4), _a), S((4, 2), _b)], 1e-5, 1e-5, dtype=_p))
add(OpCase("matmul/u8/wrap", lambda e, a, b: a @ b, lambda np, a, b: a @ b, [S((2, 4), U8, 100, 200), S((4, 3), U8, 100, 200)]))
add(OpCase("matmul/f32/special", lambda e, a, b: a @ b, lambda np, a, b: a @ b, [S((3, 4), F, special=True), S((4, 2))]))
add(OpCase("matmul/err/inner", lambda e, a, b: a @ b, None, [S((2, 3)), S((4, 5))], raises="ShapeError",
           match=("matmul", "(2, 3)", "(4, 5)", "3", "4")))
add(OpCase("matmul/err/vec", lambda e, a, b: e.matmul(a, b), None, [S((3,)), S((4,))], raises="ShapeError",
           match=("matmul", "(3,)", "(4,)")))
add(OpCase("matmul/err/batch", lambda e, a, b: a @ b, None, [S((2, 2, 3)), S((3, 3, 4))], raises="ShapeError",
           match=("matmul", "(2, 2, 3)", "(3, 3, 4)")))
add(OpCase("matmul/err/scalar", lambda e, a, b: a @ b, None, [S(()), S((3,))], raises="ShapeError", match=("matmul",)))

# ---- movement ----------------------------------------------------------------------------------

for _sh, _new in [((2, 3), (3, 2)), ((2, 3), (-1,)), ((6,), (1, 2, 1, 3)), ((2, 3, 4), (4, -1)), ((), (1, 1)),
                  ((1,), ()), ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((2, 3), (2, 3))]:
    add(OpCase(f"reshape/{_shape_id(_sh)}->{_new}", lambda e, x, s=_new: e.reshape(x, s), lambda np, x, s=_new: np.reshape(x, s),
               [S(_sh, I32)]))
add(OpCase("reshape/method_varargs", lambda e, x: x.reshape(3, -1), lambda np, x: x.reshape(3, -1), [S((2, 3, 2))]))
add(OpCase("reshape/f16", lambda e, x: x.reshape((4,)), lambda np, x: x.reshape(4), [S((2, 2), H)]))
add(OpCase("reshape/err/size", lambda e, x: x.reshape((4, 2)), None, [S((2, 3))], raises="ShapeError",
           match=("reshape", "(2, 3)", "(4, 2)")))
add(OpCase("reshape/err/two_minus1", lambda e, x: x.reshape((-1, -1)), None, [S((2, 3))], raises="ShapeError",
           match=("reshape",)))
add(OpCase("reshape/err/zero_minus1", lambda e, x: x.reshape((0, -1)), None, [S((0, 3))], raises="ShapeError",
           match=("reshape",)))
for _sh, _axes in [((2, 3), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (0, 2, 1)), ((2, 1, 3, 2), (3, 1, 0, 2)),
                   ((), ()), ((0, 2), (1, 0)), ((2, 3, 4), (-1, 0, 1)), ((5,), (0,))]:
    for _dt in (F, B) if _sh == (2, 3) else (F,):
        add(OpCase(f"permute_dims/{_dt}/{_shape_id(_sh)}/{_axes}", lambda e, x, a=_axes: e.permute_dims(x, a),
                   lambda np, x, a=_axes: np.transpose(x, a), [S(_sh, _dt)]))
add(OpCase("permute/method", lambda e, x: x.permute(2, 0, 1), lambda np, x: np.transpose(x, (2, 0, 1)), [S((2, 3, 4), I64)]))
add(OpCase("permute_dims/err/not_perm", lambda e, x: e.permute_dims(x, (0, 0)), None, [S((2, 3))], raises="ShapeError",
           match=("permute_dims",)))
add(OpCase("permute_dims/err/rank", lambda e, x: e.permute_dims(x, (0,)), None, [S((2, 3))], raises="ShapeError",
           match=("permute_dims",)))
add(OpCase("permute_dims/err/range", lambda e, x: e.permute_dims(x, (0, 2)), None, [S((2, 3))], raises="ShapeError",
           match=("permute_dims", "axis 2")))
for _sh, _a0, _a1 in [((2, 3), -2, -1), ((2, 3, 4), 1, 2), ((2, 3, 4), 0, 2), ((2, 3, 4), 1, 1)]:
    add(OpCase(f"transpose/{_shape_id(_sh)}/{_a0},{_a1}", lambda e, x, a=_a0, b=_a1: e.transpose(x, a, b),
               lambda np, x, a=_a0, b=_a1: np.swapaxes(x, a, b), [S(_sh)]))
for _sh in [(2, 3), (4, 2, 3), (1, 2, 2, 3)]:
    add(OpCase(f"matrix_transpose/{_shape_id(_sh)}", lambda e, x: e.matrix_transpose(x), lambda np, x: np.swapaxes(x, -1, -2), [S(_sh)]))
    add(OpCase(f"mT/{_shape_id(_sh)}", lambda e, x: x.mT, lambda np, x: np.swapaxes(x, -1, -2), [S(_sh, I32)]))
for _sh in [(2, 3), (4,), ()]:
    add(OpCase(f"T/{_shape_id(_sh)}", lambda e, x: x.T, lambda np, x: x.T, [S(_sh)]))
add(OpCase("T/err/3d", lambda e, x: x.T, None, [S((2, 3, 4))], raises="ShapeError", match=("(2, 3, 4)",)))
add(OpCase("matrix_transpose/err/1d", lambda e, x: e.matrix_transpose(x), None, [S((3,))], raises="ShapeError",
           match=("matrix_transpose", "(3,)")))
for _sh, _ax in [((2, 3), 0), ((2, 3), 1), ((2, 3), 2), ((2, 3), -1), ((), 0), ((3,), (0, 2)), ((2, 3), (-1, 0))]:
    add(OpCase(f"expand_dims/{_shape_id(_sh)}/{_ax}", lambda e, x, a=_ax: e.expand_dims(x, a),
               lambda np, x, a=_ax: np.expand_dims(x, a), [S(_sh)]))
add(OpCase("expand_dims/err/axis", lambda e, x: e.expand_dims(x, 3), None, [S((2, 3))], raises="IndexingError",
           match=("expand_dims", "axis 3")))
for _sh, _ax in [((1, 3, 1), None), ((1, 3, 1), 0), ((1, 3, 1), -1), ((1, 3, 1), (0, 2)), ((1,), None), ((2, 3), None),
                 ((1, 1), None)]:
    add(OpCase(f"squeeze/{_shape_id(_sh)}/{_ax}", lambda e, x, a=_ax: e.squeeze(x, a), lambda np, x, a=_ax: np.squeeze(x, a),
               [S(_sh)]))
add(OpCase("squeeze/err/not_one", lambda e, x: e.squeeze(x, 1), None, [S((1, 3))], raises="ShapeError",
           match=("squeeze", "axis 1", "(1, 3)")))
for _sh, _s, _e in [((2, 3, 4), 0, -1), ((2, 3, 4), 1, -1), ((2, 3, 4), 0, 1), ((2, 3, 4, 5), 1, 2), ((), 0, -1),
                    ((3,), 0, 0), ((2, 0, 3), 1, 2)]:
    _nsh = (1,) if not _sh else _sh[:_s] + (-1 if 0 not in _sh else 0,) + _sh[(_e % len(_sh)) + 1:]
    add(OpCase(f"flatten/{_shape_id(_sh)}/{_s},{_e}", lambda e, x, s=_s, t=_e: e.flatten(x, s, t),
               lambda np, x, n=_nsh: x.reshape(n), [S(_sh)]))
add(OpCase("flatten/err/order", lambda e, x: e.flatten(x, 2, 0), None, [S((2, 3, 4))], raises="ShapeError",
           match=("flatten",)))
for _sh, _to in [((3,), (2, 3)), ((2, 1), (2, 4)), ((), (2, 2)), ((1, 3), (2, 0, 3)), ((2, 1, 3), (4, 2, 5, 3)),
                 ((2, 3), (2, 3)), ((1,), (0,))]:
    for _dt in (F, B) if _sh == (2, 1) else (F,):
        add(OpCase(f"broadcast_to/{_dt}/{_shape_id(_sh)}->{_shape_id(_to)}", lambda e, x, t=_to: e.broadcast_to(x, t),
                   lambda np, x, t=_to: np.broadcast_to(x, t), [S(_sh, _dt)]))
add(OpCase("broadcast_to/err", lambda e, x: e.broadcast_to(x, (2, 4)), None, [S((3,))], raises="ShapeError",
           match=("broadcast_to", "(3,)", "(2, 4)")))
add(OpCase("broadcast_to/err/fewer_dims", lambda e, x: e.broadcast_to(x, (3,)), None, [S((2, 3))], raises="ShapeError",
           match=("broadcast_to",)))
for _shapes, _ax in [(((2, 3), (4, 3)), 0), (((2, 3), (2, 1), (2, 2)), 1), (((2, 3), (2, 3)), -1), (((3,), (0,), (2,)), 0),
                     (((2, 3, 4), (2, 1, 4)), 1), (((2, 2), (3,)), None), (((0, 2), (0, 2)), 1)]:
    add(OpCase(f"concat/{'+'.join(_shape_id(s) for s in _shapes)}/ax{_ax}", lambda e, *xs, a=_ax: e.concat(xs, axis=a),
               lambda np, *xs, a=_ax: np.concatenate(xs, axis=a), [S(s) for s in _shapes]))
for _a, _b in [(I32, F), (U8, I64), (B, I32), (H, F), (H, H), (B, B)]:
    add(OpCase(f"concat/{_a}+{_b}", lambda e, a, b: e.concat([a, b], axis=0),
               lambda np, a, b, p=promote(_a, _b): np.concatenate([_npcast(np, a, p), _npcast(np, b, p)]),
               [S((2,), _a), S((3,), _b)], dtype=promote(_a, _b)))
add(OpCase("concat/err/shape", lambda e, a, b: e.concat([a, b], axis=0), None, [S((2, 3)), S((2, 4))], raises="ShapeError",
           match=("concat", "(2, 3)", "(2, 4)")))
add(OpCase("concat/err/rank", lambda e, a, b: e.concat([a, b]), None, [S((2, 3)), S((3,))], raises="ShapeError",
           match=("concat", "(2, 3)", "(3,)")))
add(OpCase("concat/err/scalar", lambda e, a, b: e.concat([a, b]), None, [S(()), S(())], raises="ShapeError", match=("concat",)))
for _shapes, _ax in [(((2, 3), (2, 3)), 0), (((2, 3), (2, 3), (2, 3)), 2), (((), ()), 0), (((3,),), -1), (((0, 2), (0, 2)), 1)]:
    add(OpCase(f"stack/{len(_shapes)}x{_shape_id(_shapes[0])}/ax{_ax}", lambda e, *xs, a=_ax: e.stack(xs, axis=a),
               lambda np, *xs, a=_ax: np.stack(xs, axis=a), [S(s, I64) for s in _shapes]))
add(OpCase("stack/err/shapes", lambda e, a, b: e.stack([a, b]), None, [S((2,)), S((3,))], raises="ShapeError",
           match=("stack", "(2,)", "(3,)")))
for _sh, _ios, _ax in [((6,), 3, 0), ((6,), [2, 4], 0), ((4, 6), 2, 1), ((4, 6), [1, 3], 0), ((5, 2), [0, 2, 2, 9], 0),
                       ((3, 4), [-1], 1), ((2, 4), 1, -1), ((0, 3), 3, 1)]:
    add(OpCase(f"split/{_shape_id(_sh)}/{_ios}/ax{_ax}", lambda e, x, i=_ios, a=_ax: e.split(x, i, a),
               lambda np, x, i=_ios, a=_ax: np.split(x, i, a), [S(_sh)]))
add(OpCase("split/err/uneven", lambda e, x: e.split(x, 4), None, [S((6,))], raises="ShapeError", match=("split", "4")))
for _sh, _reps in [((2,), 3), ((2,), (2, 2)), ((2, 3), (2, 1)), ((2, 3), 2), ((), (2, 3)), ((1, 2, 2), (2, 1, 3)),
                   ((2, 3), (0, 2)), ((3,), (1,))]:
    add(OpCase(f"tile/{_shape_id(_sh)}/{_reps}", lambda e, x, r=_reps: e.tile(x, r), lambda np, x, r=_reps: np.tile(x, r),
               [S(_sh, I32)]))
for _sh, _ax in [((5,), None), ((2, 3), 0), ((2, 3), 1), ((2, 3, 4), (0, 2)), ((2, 3), -1), ((), None), ((0, 3), 1),
                 ((3, 4), None)]:
    add(OpCase(f"flip/{_shape_id(_sh)}/{_ax}", lambda e, x, a=_ax: e.flip(x, axis=a), lambda np, x, a=_ax: np.flip(x, axis=a),
               [S(_sh)]))
add(OpCase("flip/f16", lambda e, x: e.flip(x), lambda np, x: np.flip(x), [S((2, 3), H)]))
for _sh, _src, _dst in [((2, 3, 4), 0, -1), ((2, 3, 4), -1, 0), ((2, 3, 4, 5), (0, 1), (-1, -2))]:
    add(OpCase(f"moveaxis/{_shape_id(_sh)}/{_src}->{_dst}", lambda e, x, s=_src, d=_dst: e.moveaxis(x, s, d),
               lambda np, x, s=_src, d=_dst: np.moveaxis(x, s, d), [S(_sh)]))

# take / take_along_axis
for _sh, _ish, _ax in [((5,), (3,), 0), ((3, 4), (2,), 0), ((3, 4), (2, 3), 1), ((3, 4), (5,), None), ((2, 3, 4), (2,), -1),
                       ((2, 3, 4), (), 1), ((3, 4), (0,), 0), ((3, 4), (4, 1), 0), ((0, 4), (2,), 1)]:
    _n = (_sh[_ax] if _ax is not None else _prod(_sh))
    for _idt in (I64, I32) if _sh == (3, 4) and _ax == 0 else (I64,):
        add(OpCase(f"take/{_shape_id(_sh)}/{_idt}{_shape_id(_ish)}/ax{_ax}", lambda e, x, i, a=_ax: e.take(x, i, axis=a),
                   lambda np, x, i, a=_ax: np.take(x, i, axis=a), [S(_sh), S(_ish, _idt, -_n, _n - 1)]))
add(OpCase("take/u8_indices", lambda e, x, i: e.take(x, i, axis=0), lambda np, x, i: np.take(x, i, axis=0),
           [S((4, 2), B), S((3,), U8, 0, 3)]))
add(OpCase("take/pylist", lambda e, x: e.take(x, [2, -1, 0], axis=1), lambda np, x: np.take(x, [2, -1, 0], axis=1), [S((2, 3), F)]))
add(OpCase("take/err/range", lambda e, x, i: e.take(x, i, axis=0), None, [S((3, 2)), S((2,), I64, values=[1, 3])],
           raises="IndexingError", match=("take", "3", "size 3")))
add(OpCase("take/err/range_neg", lambda e, x, i: e.take(x, i, axis=1), None, [S((3, 2)), S((1,), I64, values=[-3])],
           raises="IndexingError", match=("take", "-3", "size 2")))
add(OpCase("take/err/float_idx", lambda e, x, i: e.take(x, i), None, [S((3,)), S((1,), F)], raises="DTypeError",
           match=("take", "float32")))
for _sh, _ish, _ax in [((3, 4), (3, 2), 1), ((3, 4), (2, 4), 0), ((2, 3, 4), (2, 3, 1), -1), ((3, 4), (1, 5), 1),
                       ((3, 1), (3, 4), 0), ((4,), (6,), 0), ((2, 3), (2, 0), 1)]:
    add(OpCase(f"take_along_axis/{_shape_id(_sh)}/{_shape_id(_ish)}/ax{_ax}",
               lambda e, x, i, a=_ax: e.take_along_axis(x, i, axis=a),
               lambda np, x, i, a=_ax: np.take_along_axis(x, i, axis=a), [S(_sh), S(_ish, I64, -_sh[_ax], _sh[_ax] - 1)]))
add(OpCase("take_along_axis/err/range", lambda e, x, i: e.take_along_axis(x, i, 1), None, [S((2, 3)), S((2, 1), I64, values=[0, 3])],
           raises="IndexingError", match=("take_along_axis", "3")))
add(OpCase("take_along_axis/err/rank", lambda e, x, i: e.take_along_axis(x, i, 1), None, [S((2, 3)), S((2,), I64, 0, 1)],
           raises="ShapeError", match=("take_along_axis", "(2, 3)", "(2,)")))

# ---- indexing ----------------------------------------------------------------------------------

_IDX = {  # id: (ember key builder, numpy key); the key is applied to an input of the given shape
    "int": ((3, 4), lambda: 1), "neg_int": ((3, 4), lambda: -1), "int_int": ((3, 4), lambda: (2, 3)),
    "slice": ((5, 4), lambda: slice(1, 4)), "slice_step": ((7,), lambda: slice(None, None, 3)),
    "slice_neg_step": ((7,), lambda: slice(None, None, -2)), "slice_neg_bounds": ((7,), lambda: slice(-2, 1, -1)),
    "slice_empty": ((5,), lambda: slice(3, 1)), "slice_clamp": ((5,), lambda: slice(-100, 100)),
    "slices_2d": ((4, 5), lambda: (slice(None, None, -1), slice(1, None, 2))),
    "ellipsis": ((2, 3, 4), lambda: (Ellipsis, 1)), "ellipsis_mid": ((2, 3, 4), lambda: (0, Ellipsis, slice(1, 3))),
    "none": ((3, 4), lambda: (None, slice(None), None)), "none_ellipsis": ((3,), lambda: (Ellipsis, None)),
    "scalar_none": ((), lambda: None), "scalar_ellipsis": ((), lambda: Ellipsis), "empty_tuple": ((2, 2), lambda: ()),
    "list": ((5, 3), lambda: [4, 0, -1, 0]), "list_axis1": ((3, 5), lambda: (slice(None), [1, 3])),
    "list_with_int": ((3, 4, 5), lambda: (1, [0, 2])), "list_with_int_split": ((3, 4, 5), lambda: ([0, 2], slice(None), 1)),
    "int_slice_int_list": ((3, 4, 5, 6), lambda: (slice(None), 0, slice(1, 3), [1, 2, 5])),
    "list_none": ((3, 4), lambda: (None, [2, 1])), "list_2d": ((5,), lambda: ([[0, 1], [4, 3]],)),
    "int_on_1d": ((6,), lambda: 4), "size0": ((0, 3), lambda: (slice(None), 1)),
}
for _kid, (_sh, _k) in _IDX.items():
    add(OpCase(f"getitem/{_kid}", lambda e, x, k=_k: x[k()], lambda np, x, k=_k: np.asarray(x[k()]), [S(_sh, I32, -50, 50)]))
add(OpCase("getitem/int_tensor_index", lambda e, x, i: x[i], lambda np, x, i: x[i], [S((4, 2)), S((3,), I64, -4, 3)]))
add(OpCase("getitem/int_tensor_index_axis1", lambda e, x, i: x[:, i], lambda np, x, i: x[:, i], [S((4, 3)), S((2, 2), I32, -3, 2)]))
add(OpCase("getitem/scalar_tensor_index", lambda e, x, i: x[i], lambda np, x, i: x[int(i)], [S((4, 2)), S((), I64, 0, 3)]))
add(OpCase("getitem/f16", lambda e, x: x[1:, ::-1], lambda np, x: x[1:, ::-1], [S((3, 3), H)]))
add(OpCase("getitem/bool", lambda e, x: x[::2], lambda np, x: x[::2], [S((5,), B)]))
add(OpCase("getitem/err/range", lambda e, x: x[3], None, [S((3, 2))], raises="IndexingError", match=("index 3", "size 3")))
add(OpCase("getitem/err/range_neg", lambda e, x: x[:, -3], None, [S((3, 2))], raises="IndexingError",
           match=("index -3", "axis 1", "size 2")))
add(OpCase("getitem/err/too_many", lambda e, x: x[0, 0, 0], None, [S((3, 2))], raises="IndexingError", match=("too many",)))
add(OpCase("getitem/err/two_ellipsis", lambda e, x: x[..., 0, ...], None, [S((3, 2))], raises="IndexingError",
           match=("ellipsis",)))
add(OpCase("getitem/err/bool_mask", lambda e, x, m: x[m, 0], None, [S((3, 2)), S((3,), B)], raises="IndexingError",
           match=("boolean",)))
add(OpCase("getitem/err/two_arrays", lambda e, x: x[[0, 1], [1, 0]], None, [S((3, 2))], raises="IndexingError",
           match=("one integer-array",)))
add(OpCase("getitem/err/float", lambda e, x: x[1.5], None, [S((3,))], raises="IndexingError", match=("1.5",)))
add(OpCase("getitem/err/step0", lambda e, x: x[::0], None, [S((3,))], raises="IndexingError", match=("step",)))
add(OpCase("getitem/err/list_range", lambda e, x: x[[0, 5]], None, [S((3,))], raises="IndexingError", match=("5", "size 3")))

# ---- wasm elementwise/reduction kernel edges ----------------------------------------------------
# Sizes around the SIMD widths (4 lanes, 16 bools per store), tails, broadcast patterns that the
# kernels special-case (bias along the last axis, channel on an inner axis, scalars, outer
# products, non-mergeable rank 6 and rank 7), special values at the math functions' branch points,
# and reductions over inner/outer/non-adjacent axes. They hold on every backend.

for _n in (1, 3, 4, 7, 17, 33):
    for _name, (_npn, (_lo, _hi)) in _FLOAT_UNARY.items():
        add(OpCase(f"{_name}/f32/n{_n}", lambda e, x, n=_name: getattr(e, n)(x),
                   lambda np, x, n=_name: _np_unary(np, n, x), [S((_n,), F, _lo, _hi)]))
_EDGE_VALUES = {
    "exp": [-104.0, -103.9, -88.8, -87.5, -20.0, 88.7, 88.72, 88.73, 1e-8, -1e-8, 0.34657359, -0.34657359, 0.0,
            -0.0, 1e-38, 50.0],
    "log": [1.1754944e-38, 3.4e38, 0.70710677, 0.7071068, 1.4142135, 1.4142137, 1.0000001, 0.99999994, 2.0, 0.5,
            1e-10, 1e10, 1.0],
    "tanh": [0.625, 0.62499994, -0.625, -0.62500006, 9.0, 9.1, 20.0, -20.0, 1e-20, -1e-3, 0.3, -0.0, 4.0, -5.5,
             100.0, 1e-40],
    "erf": [-4.0, -3.9, -0.875, 0.875, 0.87499994, -0.87500006, 5.0, 10.0, -10.0, 1e-30, -1e-30, 2.0, -1.5,
            0.5, 3.0, -0.0],
    "sin": [1e5, -1e5, 1048575.0, 1048576.0, 3e6, -1e7, 1e-30, 0.78539819, -0.78539819, 1.5707964, 3.1415927,
            6.2831855, 355.0, 103993.0],
    "cos": [1e5, -1e5, 1048575.0, 1048576.0, 3e6, -1e7, 1e-30, 0.78539819, -0.78539819, 1.5707964, 3.1415927,
            6.2831855, 355.0, 103993.0],
}
_GPU_MATH = {"webgpu": "WGSL's log may flush subnormal inputs and its sin/cos lose huge arguments"}
add(OpCase("log/f32/subnormal", lambda e, x: e.log(x), lambda np, x: np.log(x),
           [S((5,), F, values=[1e-45, 1e-40, 1.1754942e-38, 5e-39, -1e-45])], skip=_GPU_MATH))
for _name in ("sin", "cos"):
    add(OpCase(f"{_name}/f32/huge", lambda e, x, n=_name: getattr(e, n)(x), lambda np, x, n=_name: getattr(np, n)(x),
               [S((6,), F, values=[1e30, -3.4e38, 3.4e38, 1.5e10, -7e20, 123456789.0])], skip=_GPU_MATH))
for _name, _vals in _EDGE_VALUES.items():
    add(OpCase(f"{_name}/f32/edges", lambda e, x, n=_name: getattr(e, n)(x),
               lambda np, x, n=_name: _np_unary(np, n, x), [S((len(_vals),), F, values=_vals)]))
add(OpCase("sqrt/f32/n19", lambda e, x: e.sqrt(x), lambda np, x: np.sqrt(x), [S((19,), F, -1, 9, special=True)]))
for _name in ("negative", "abs", "sign", "floor", "ceil", "round"):
    add(OpCase(f"{_name}/f32/n37", lambda e, x, n=_name: getattr(e, n)(x),
               lambda np, x, n=_name: getattr(np, n)(x), [S((37,), F, -5, 5, special=True)]))
    add(OpCase(f"{_name}/f16/n9", lambda e, x, n=_name: getattr(e, n)(x),
               lambda np, x, n=_name: getattr(np, n)(x), [S((9,), H, -5, 5, special=True)]))
add(OpCase("isnan/f32/n37", lambda e, x: e.isnan(x), lambda np, x: np.isnan(x), [S((37,), F, special=True)]))

_BCAST_EDGE = [((8, 5), (5,)), ((5,), (8, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((4, 1), (1, 6)), ((2, 3, 4), (2, 1, 4)),
               ((7, 9), (7, 1)), ((37,), ()), ((), (37,)), ((3, 1, 5), (1, 1)), ((2, 1, 2, 1, 2, 3), (1, 2, 1, 2, 1, 3)),
               ((2, 1, 2, 1, 2, 1, 2), (1, 2, 1, 2, 1, 2, 1)), ((1, 19), (6, 1)), ((33,), (33,))]
for _name in ("add", "subtract", "multiply", "maximum", "minimum", "less", "less_equal", "equal", "not_equal"):
    _e, _n = (_ARITH.get(_name) or _COMPARE[_name])
    for _a, _b in _BCAST_EDGE:
        add(OpCase(f"{_name}/f32/edge/{_shape_id(_a)}+{_shape_id(_b)}", _e, _n, [S(_a, F), S(_b, F)]))
    add(OpCase(f"{_name}/f32/n37/special", _e, _n, [S((37,), F, special=True), S((37,), F, special=True)]))
for _a, _b in _BCAST_EDGE[:6]:
    add(OpCase(f"divide/f32/edge/{_shape_id(_a)}+{_shape_id(_b)}", lambda e, a, b: a / b, lambda np, a, b: a / b,
               [S(_a, F), S(_b, F, nonzero=True)]))
for _name in ("equal", "less_equal"):   # ties: equal values compare equal in every path
    add(OpCase(f"{_name}/f32/ties/n21", _COMPARE[_name][0], _COMPARE[_name][1],
               [S((21,), F, values=[float(i % 3) for i in range(21)]), S((), F, values=[1.0])]))
add(OpCase("pow/f32/grid", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((9, 1), F, values=[0.0, 1e-3, 0.1, 0.5, 0.999, 1.0, 2.0, 10.0, 1e4]),
            S((13,), F, values=[-40.0, -7.5, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 7.25, 40.0])], 1e-5))
add(OpCase("pow/f32/negative_base/n17", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((17,), F, -4, -0.25), S((17,), F, values=[float(i - 8) for i in range(17)])]))
for _p in (2.0, 3.0, 0.5, -1.0, 2.5):
    # np.power with a full array: `a ** scalar` takes numpy's sqrt/square fast paths (sqrt(-inf) = nan, C's pow: inf)
    add(OpCase(f"pow/f32/scalar_exp_{_p}", lambda e, a, p=_p: a ** p,
               lambda np, a, p=_p: np.power(a, np.full(a.shape, p, np.float32)),
               [S((3, 7), F, -3, 3)]))
add(OpCase("pow/f32/neg_inf_base", lambda e, a, b: a ** b, lambda np, a, b: np.power(a, b),
           [S((4,), F, values=[-float("inf")] * 4), S((4,), F, values=[0.5, 2.5, -0.5, 3.0])],
           skip={"webgpu": "WGSL's pow is undefined for a negative base",
                 "numpy": "the numpy backend's ** takes numpy's sqrt fast path for 0.5 (sqrt(-inf) = nan)"}))
add(OpCase("pow/f32/inf_nan_one", lambda e, a, b: a ** b, lambda np, a, b: a ** b,
           [S((8,), F, values=[1.0, 1.0, -1.0, -1.0, 0.5, 2.0, float("nan"), -float("inf")]),
            S((8,), F, values=[float("nan"), float("inf"), float("inf"), -float("inf"), -float("inf"), float("inf"), 0.0, 3.0])]))
for _c, _a, _b in [((37,), (37,), ()), ((4, 1, 9), (3, 9), (1,)), ((9,), (), (9,)), ((2, 17), (2, 17), (2, 17))]:
    add(OpCase(f"where/f32/edge/{_shape_id(_c)}|{_shape_id(_a)}|{_shape_id(_b)}", lambda e, c, a, b: e.where(c, a, b),
               lambda np, c, a, b: np.where(c, a, b), [S(_c, B), S(_a, F), S(_b, F)]))
add(OpCase("clip/f32/edge/n37", lambda e, x: e.clip(x, 0, 6), lambda np, x: np.minimum(np.maximum(x, 0), 6).astype(x.dtype),
           [S((37,), F, -3, 9, special=True)]))
add(OpCase("clip/f32/edge/one_sided", lambda e, x: [x.clip(max=0.25), x.clip(min=-0.1)],
           lambda np, x: [np.minimum(x, np.float32(0.25)), np.maximum(x, np.float32(-0.1))], [S((2, 9), F, special=True)]))
add(OpCase("where/i32/edge/bcast", lambda e, c, a, b: e.where(c, a, b), lambda np, c, a, b: np.where(c, a, b),
           [S((3, 11), B), S((11,), I32), S((3, 1), I32)]))

for _sh, _ax in [((3, 1000), 0), ((3, 1000), 1), ((1000, 3), 0), ((5, 7, 9), (0, 2)), ((5, 7, 9), 1),
                 ((4, 1, 6, 1, 3), (1, 2, 3)), ((2, 3, 4, 5), (1, 3)), ((2, 3, 4, 5), (0, 1, 2)), ((20000,), None),
                 ((6, 33), -1), ((3, 5, 7), (0, 1, 2))]:
    for _name in ("sum", "max", "min", "mean"):
        add(OpCase(f"{_name}/f32/edge/{_shape_id(_sh)}/ax{_ax}", lambda e, x, a=_ax, n=_name: getattr(e, n)(x, axis=a),
                   lambda np, x, a=_ax, n=_name: getattr(np, n)(x.astype(np.float64), axis=a), [S(_sh, F, -1, 2)],
                   1e-5, 1e-5))
    add(OpCase(f"prod/f32/edge/{_shape_id(_sh)}/ax{_ax}", lambda e, x, a=_ax: e.prod(x, axis=a),
               lambda np, x, a=_ax: np.prod(x.astype(np.float64), axis=a), [S(_sh, F, 0.999, 1.001)], 1e-5, 1e-5))
for _sh, _ax in [((3, 9, 5), 1), ((1000,), 0), ((4, 37), 1), ((37, 4), 0), ((2, 3, 4), 0)]:
    for _name in ("argmax", "argmin"):
        add(OpCase(f"{_name}/f32/edge/{_shape_id(_sh)}/ax{_ax}", lambda e, x, a=_ax, n=_name: getattr(e, n)(x, axis=a),
                   lambda np, x, a=_ax, n=_name: getattr(np, n)(x, axis=a), [S(_sh, F, -3, 3)]))
        add(OpCase(f"{_name}/f32/edge/{_shape_id(_sh)}/ax{_ax}/ties", lambda e, x, a=_ax, n=_name: getattr(e, n)(x, axis=a),
                   lambda np, x, a=_ax, n=_name: getattr(np, n)(x, axis=a), [S(_sh, I32, -2, 2)]))
for _name in ("argmax", "argmin", "max", "min"):
    add(OpCase(f"{_name}/f32/edge/nan_late", lambda e, x, n=_name: getattr(e, n)(x, axis=-1),
               lambda np, x, n=_name: getattr(np, n)(x, axis=-1),
               [S((2, 9), F, values=[0.0] * 7 + [float("nan"), 5.0] + [1.0, float("inf")] + [0.0] * 6 + [float("nan")])]))
    add(OpCase(f"{_name}/f16/edge/ax0", lambda e, x, n=_name: getattr(e, n)(x, axis=0),
               lambda np, x, n=_name: getattr(np, n)(x, axis=0), [S((5, 3), H)]))

# CASES-END


def all_cases() -> list:
    """Every op case: the core ones here plus, when present, ``op_cases_nn.CASES``."""
    import importlib.util

    cases = list(CASES)
    if importlib.util.find_spec("op_cases_nn") is not None:
        import op_cases_nn

        cases += list(op_cases_nn.CASES)
    if importlib.util.find_spec("op_cases_array_api") is not None:
        import op_cases_array_api

        cases += list(op_cases_array_api.CASES)
    seen = set()
    for c in cases:
        if c.id in seen:
            raise ValueError(f"duplicate op case id {c.id!r}")
        seen.add(c.id)
    return cases
