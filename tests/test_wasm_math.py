"""Dense sweeps of the wasm backend's float32 math (wasm/kernels/mathf.h) against float64
references rounded to float32: ~300k points per function (uniform over the interesting ranges,
random bit patterns over every float, the subnormals, +-inf, NaN, +-0). Each test prints its
max error in ulps (``pytest -s`` shows the table) and bounds it.

Errors are in ulps of the float32 reference for normal results; results in the subnormal range
are measured in units of the smallest subnormal (2^-149), where a float32 computation cannot keep
relative accuracy. NaN must match NaN and infinities must match exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.errors import DeviceError

try:
    ember.get_backend("wasm")
except DeviceError as e:   # no wasmtime / kernel module here
    pytest.skip(f"wasm backend unavailable: {e}", allow_module_level=True)

TINY = np.float32(2.0 ** -126)
rng = np.random.default_rng(1234)
ALL_FLOATS = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
SUBNORMALS = (rng.integers(1, 2 ** 23, 2_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
              * np.where(rng.random(2_000) < 0.5, -1, 1).astype(np.float32))
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 2.0 ** -126, -(2.0 ** -126),
                     3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, -0.5], np.float32)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
_C = math.sqrt(2.0 / math.pi)

# name: (ember function, float64 reference, numpy float32 function or None, ranges, max ulp)
FUNCS = {
    "exp": (ember.exp, np.exp, np.exp, [(-104, 89), (-1, 1)], 1.0),
    "log": (ember.log, np.log, np.log, [(0, 10), (0, 1e-30), (0, 3e38), (0.7, 1.5)], 1.0),
    "tanh": (ember.tanh, np.tanh, np.tanh, [(-10, 10), (-1, 1)], 1.5),
    "erf": (ember.erf, _erf, None, [(-5, 5), (-1, 1)], 3.0),
    "sin": (ember.sin, np.sin, np.sin, [(-10, 10), (-1e5, 1e5), (-3e6, 3e6)], 2.0),
    "cos": (ember.cos, np.cos, np.cos, [(-10, 10), (-1e5, 1e5), (-3e6, 3e6)], 2.0),
    "sigmoid": (ember.sigmoid, _sigmoid, None, [(-100, 40), (-10, 10)], 2.5),
    "silu": (ember.silu, lambda x: x * _sigmoid(x), None, [(-80, 40), (-10, 10)], 3.0),
    # gelu = x Phi(x) through erfc (1 + erf cancels in float64 too far out)
    "gelu": (ember.gelu, lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)), None, [(-14, 10), (-5, 5)], 6.0),
    # 0.5 x (1 + tanh u) = x sigmoid(2u)
    "gelu_tanh": (lambda x: ember.gelu(x, approximate="tanh"),
                  lambda x: x * _sigmoid(2 * _C * (x + 0.044715 * x ** 3)), None, [(-14, 10), (-5, 5)], 3.0),
}


def _points(ranges):
    parts = [rng.uniform(lo, hi, 100_000).astype(np.float32) for lo, hi in ranges]
    return np.concatenate(parts + [ALL_FLOATS, SUBNORMALS, SPECIALS])


def _ulps(got, want64):
    """Error of float32 results against float64 truth: in ulps of the rounded truth for normal
    results, in units of 2^-149 for subnormal ones."""
    want = want64.astype(np.float32)
    err = np.abs(got.astype(np.float64) - want64)
    normal = np.isfinite(want) & (np.abs(want) >= TINY)
    sub = np.isfinite(want) & (np.abs(want) < TINY)
    ulp = np.spacing(np.abs(want)).astype(np.float64)
    return np.where(normal, err / np.where(normal, ulp, 1.0), 0.0), np.where(sub, err / 2.0 ** -149, 0.0)


@pytest.mark.parametrize("name", list(FUNCS))
def test_math_sweep(name):
    fn, ref, np32, ranges, bound = FUNCS[name]
    x = _points(ranges)
    got = fn(ember.from_bytes(x.tobytes(), x.shape, "float32", device="wasm")).numpy()
    with np.errstate(all="ignore"):
        want64 = ref(x.astype(np.float64))
        want = want64.astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want)), \
            f"{name}: NaN where numpy has none or vice versa at x={x[np.isnan(got) != np.isnan(want)][:5]}"
        inf = np.isinf(want)
        assert np.array_equal(got[inf], want[inf]), f"{name}: infinities differ at x={x[inf][got[inf] != want[inf]][:5]}"
        ulp, sub = _ulps(got, want64)
        i = int(np.argmax(ulp))
        line = (f"{name:10s} {len(x):7d} points  max {ulp[i]:5.2f} ulp (x={x[i]!r})  mean {ulp.mean():.3f}  "
                f"subnormal results: max {sub.max():.1f} x 2^-149")
        if np32 is not None:   # numpy's own float32 function, for comparison
            u32, _ = _ulps(np32(x), want64)
            line += f"  [numpy float32: max {u32.max():.2f} ulp]"
    print("\n" + line)
    assert ulp[i] <= bound, line
    assert sub.max() <= 8, line
