"""Data-driven op cases: one list that pytest runs on every backend here, and that runs unchanged
inside Pyodide (no numpy, pytest or hypothesis there) with expected values computed by numpy on
the host.

This module imports with the standard library only. numpy is touched only inside ``numpy_fn``,
which ``expected(np, case)`` calls with the numpy module it is given.

A case::

    OpCase("add/f32/bcast", lambda e, a, b: e.add(a, b), lambda np, a, b: np.add(a, b),
           [S((2, 3)), S((3,))])

- ``ember_fn(ember, *tensors)`` returns a Tensor or a list/tuple of Tensors.
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
``CASES`` in ``tests/op_cases_nn.py``; ``all_cases()`` returns both, and
``tests/test_ops_core.py`` / ``tests/test_ops_nn.py`` parametrize over them with the ``device``
fixture through ``helpers.check(case, device)``. Ids are ``op/what`` and must stay stable (the
Pyodide runner keys expected values by id).

Running a case without pytest or numpy (Pyodide)::

    results = run_case(ember, case, "python")        # [{"shape", "dtype", "value"}] or [{"error", "message"}]
    ok, msg = check_results(case, results, expected_results)   # expected from expected(np, case) on the host
"""
from __future__ import annotations

import math
import random
import struct
import zlib

__all__ = ["S", "OpCase", "CASES", "all_cases", "generate_inputs", "run_case", "expected",
           "compare", "check_results", "nest", "flatten", "TOLERANCES"]

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
    try:
        result = case.ember_fn(ember, *tensors)
        outs = _as_list(result)
        return [{"shape": tuple(t.shape), "dtype": t.dtype.name, "value": t.tolist()} for t in outs]
    except errors.EmberError as e:
        return [{"error": type(e).__name__, "message": str(e)}]


_NP_TO_EMBER = {"float64": "float32", "float32": "float32", "float16": "float16", "int32": "int32",
                "int64": "int64", "uint8": "uint8", "bool": "bool"}


def expected(np, case: OpCase) -> list:
    """The numpy side: ``[{"shape", "dtype", "value"}]`` (float64 reported as float32, or the
    case's ``dtype``). Needs numpy, given as ``np``. Error cases give ``[{"error", "match"}]``."""
    if case.raises:
        return [{"error": case.raises, "match": list(case.match)}]
    arrays = [np.array(flat, dtype=dt).reshape(shape) for flat, shape, dt in generate_inputs(case)]
    with np.errstate(all="ignore"):
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

for _sh in SHAPES:
    add(OpCase(f"exp/f32/{_shape_id(_sh)}", lambda e, x: e.exp(x), lambda np, x: np.exp(x), [S(_sh, F)]))
    for _name in ("add", "multiply"):
        add(OpCase(f"{_name}/f32/{_shape_id(_sh)}", lambda e, a, b, n=_name: getattr(e, n)(a, b),
                   lambda np, a, b, n=_name: getattr(np, n)(a, b), [S(_sh, F), S(_sh, F)]))
for _a, _b in BCAST:
    add(OpCase(f"add/bcast/{_shape_id(_a)}+{_shape_id(_b)}", lambda e, a, b: a + b,
               lambda np, a, b: a + b, [S(_a, F), S(_b, F)]))
add(OpCase("add/err/bcast", lambda e, a, b: a + b, None, [S((2, 3)), S((4,))], raises="ShapeError",
           match=("add", "(2, 3)", "(4,)")))

# CASES-END


def all_cases() -> list:
    """Every op case: the core ones here plus, when present, ``op_cases_nn.CASES``."""
    import importlib.util

    cases = list(CASES)
    if importlib.util.find_spec("op_cases_nn") is not None:
        import op_cases_nn

        cases += list(op_cases_nn.CASES)
    seen = set()
    for c in cases:
        if c.id in seen:
            raise ValueError(f"duplicate op case id {c.id!r}")
        seen.add(c.id)
    return cases
