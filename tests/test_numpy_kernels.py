"""The numpy backend's fast paths against the pure-Python backend (the living specification) and,
for erf, against ``math.erf``: every branch of conv2d (1x1 as one GEMM, strided 1x1, grouped,
depthwise with and without a channel multiplier: im2col, kernel rows over kernel-column copies,
channels last; im2col), pooling by kernel taps, the in-place
softmax / log_softmax / layer_norm (inputs are never written) and attention as two stacked
matmuls (masked rows, causal, float and bool masks)."""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import ember
import ember.native

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def both(fn, *arrays):
    """fn on the numpy backend and on the python backend, as numpy arrays."""
    out = {}
    for dev in ("numpy", "python"):
        out[dev] = fn(*[ember.from_numpy(a, device=dev) for a in arrays]).numpy()
    return out["numpy"], out["python"]


CONVS = [
    # (x shape, w shape, kwargs)
    ((1, 8, 5, 5), (6, 8, 1, 1), {}),                                       # 1x1: one GEMM
    ((3, 8, 5, 5), (6, 8, 1, 1), {}),                                       # 1x1, batched
    ((2, 8, 7, 6), (6, 8, 1, 1), {"stride": 2}),                            # 1x1 strided
    ((2, 8, 5, 5), (6, 4, 1, 1), {"groups": 2}),                            # 1x1 grouped
    ((1, 8, 5, 5), (6, 8, 1, 1), {"padding": 1}),                           # 1x1 padded: im2col
    ((2, 6, 9, 8), (6, 1, 3, 3), {"groups": 6, "padding": 1}),              # depthwise
    ((1, 6, 9, 8), (6, 1, 3, 3), {"groups": 6, "padding": 1, "stride": 2}),
    ((1, 4, 9, 9), (8, 1, 3, 3), {"groups": 4, "padding": 2, "dilation": 2}),   # multiplier 2
    ((1, 4, 6, 6), (4, 1, 5, 3), {"groups": 4, "padding": ((2, 1), (0, 2))}),
    ((2, 6, 8, 8), (4, 3, 3, 3), {"groups": 2, "stride": (2, 1), "padding": 1}),  # grouped
    ((2, 3, 8, 7), (5, 3, 3, 2), {"padding": ((1, 0), (2, 1)), "dilation": (1, 2)}),
    ((1, 1, 28, 28), (16, 1, 3, 3), {"padding": 1}),
    ((1, 208, 5, 6), (208, 1, 5, 5), {"groups": 208, "padding": 2}),                # depthwise, channels last
    ((2, 200, 7, 7), (200, 1, 5, 5), {"groups": 200, "padding": ((2, 1), (0, 2)), "stride": 2, "dilation": (1, 2)}),
    ((1, 200, 9, 11), (200, 1, 7, 5), {"groups": 200, "padding": ((3, 2), (1, 3)), "stride": (1, 2), "dilation": (2, 1)}),
    ((1, 64, 5, 6), (64, 1, 5, 5), {"groups": 64, "padding": 2}),                   # depthwise, kernel rows
    ((2, 8, 15, 11), (8, 1, 7, 5), {"groups": 8, "padding": ((3, 2), (1, 3)), "stride": (1, 2), "dilation": (2, 1)}),
    ((1, 5, 9, 12), (10, 1, 3, 3), {"groups": 5, "padding": ((2, 1), (1, 2)), "stride": (1, 2), "dilation": (2, 1)}),
    ((1, 96, 14, 14), (96, 1, 5, 5), {"groups": 96, "padding": 2, "stride": 2}),      # kernel rows, 2 phases
    ((1, 6, 20, 9), (6, 1, 5, 3), {"groups": 6, "padding": ((2, 2), (1, 1)), "stride": (3, 1), "dilation": (2, 1)}),
    ((1, 4, 6, 7), (4, 1, 1, 3), {"groups": 4, "padding": ((0, 0), (1, 1))}),        # depthwise, im2col
    ((1, 3, 10, 11), (3, 1, 2, 4), {"groups": 3, "padding": ((1, 0), (2, 1)), "stride": (3, 2)}),
    ((1, 400, 5, 6), (400, 1, 5, 5), {"groups": 400, "padding": 2}),                # stride 1, channels last
    ((1, 2, 72, 72), (2, 1, 3, 3), {"groups": 2, "padding": 1}),                    # stride 1, large: kernel rows
    ((2, 8, 15, 11), (8, 1, 7, 5), {"groups": 8, "padding": ((3, 2), (1, 3)), "dilation": (2, 1)}),   # flat
]
# which depthwise path each depthwise case above takes (test_depthwise_paths_taken), by (x, w) shapes
DEPTHWISE_PATHS = {
    ((2, 6, 9, 8), (6, 1, 3, 3)): "flat", ((1, 6, 9, 8), (6, 1, 3, 3)): "rows", ((1, 4, 9, 9), (8, 1, 3, 3)): "flat",
    ((1, 4, 6, 6), (4, 1, 5, 3)): "flat", ((1, 208, 5, 6), (208, 1, 5, 5)): "flat",
    ((2, 200, 7, 7), (200, 1, 5, 5)): "taps", ((1, 200, 9, 11), (200, 1, 7, 5)): "taps",
    ((1, 64, 5, 6), (64, 1, 5, 5)): "flat", ((2, 8, 15, 11), (8, 1, 7, 5)): None,     # (two cases: rows, flat)
    ((1, 5, 9, 12), (10, 1, 3, 3)): "rows", ((1, 96, 14, 14), (96, 1, 5, 5)): "rows",
    ((1, 6, 20, 9), (6, 1, 5, 3)): "rows", ((1, 4, 6, 7), (4, 1, 1, 3)): "flat",
    ((1, 3, 10, 11), (3, 1, 2, 4)): "im2col", ((1, 400, 5, 6), (400, 1, 5, 5)): "taps",
    ((1, 2, 72, 72), (2, 1, 3, 3)): "rows"}


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CONVS, ids=[f"{x}-{w}-{k}" for x, w, k in CONVS])
def test_conv2d_paths(xs, ws, kw, bias, native):
    """With the native kernels (depthwise: core/native/conv.c, where loaded) and without (the
    numpy paths)."""
    arrays = [f32(*xs), f32(*ws)] + ([f32(ws[0])] if bias else [])
    with contextlib.nullcontext() if native else ember.native.disabled():
        got, want = both(lambda *t: ember.conv2d(*t, **kw), *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("taps_bytes", [64, 10000])
@pytest.mark.parametrize("xs,ws,kw", CONVS, ids=[f"{x}-{w}-{k}" for x, w, k in CONVS])
def test_conv2d_paths_in_cache_sized_slices(xs, ws, kw, taps_bytes, monkeypatch):
    """Columns over numpy_nn._COLS_BYTES are made and multiplied a slice at a time (bands of
    output rows; depthwise: a few channels; channels-last depthwise: bands of output rows per
    _TAPS_BYTES): with tiny limits every case takes that path."""
    from ember.backends import numpy_nn
    monkeypatch.setattr(numpy_nn, "_COLS_BYTES", 64)
    monkeypatch.setattr(numpy_nn, "_TAPS_BYTES", taps_bytes)  # channels-last depthwise: 1 row a band, or more
    arrays = [f32(*xs), f32(*ws), f32(ws[0])]
    with ember.native.disabled():               # (the numpy paths' slices)
        got, want = both(lambda *t: ember.conv2d(*t, **kw), *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_depthwise_paths_taken(monkeypatch):
    """The CONVS depthwise cases reach each depthwise path (so the tests above cover all four)
    when the native kernels are off (where they are loaded, depthwise runs core/native/conv.c:
    tests/test_native_conv.py)."""
    from ember.backends import numpy_nn
    seen = []
    for name in ("_conv_depthwise_taps", "_conv_depthwise_rows", "_conv_depthwise_flat"):
        real = getattr(numpy_nn, name)
        monkeypatch.setattr(numpy_nn, name, lambda *a, _r=real, _n=name[16:]: seen.append(_n) or _r(*a))
    paths = []
    for xs, ws, kw in CONVS:
        if kw.get("groups", 1) != xs[1] or ws[1] != 1 or xs[1] == 1:
            continue
        seen.clear()
        with ember.native.disabled():
            ember.conv2d(ember.from_numpy(f32(*xs), device="numpy"), ember.from_numpy(f32(*ws), device="numpy"),
                         **kw)
        want = DEPTHWISE_PATHS[(xs, ws)] or ("flat" if kw.get("stride", 1) == 1 else "rows")
        assert seen == ([] if want == "im2col" else [want]), (xs, ws, kw, seen)
        paths.append(want)
    assert set(paths) == {"taps", "rows", "flat", "im2col"}


@pytest.mark.parametrize("xs,ws,pad,dil", [((1, 24, 14, 14), (24, 1, 5, 5), ((2, 2), (2, 2)), (1, 1)),
                                           ((2, 6, 11, 9), (12, 1, 3, 5), ((1, 2), (3, 0)), (2, 1)),
                                           ((1, 5, 7, 30), (5, 1, 2, 3), ((0, 1), (1, 1)), (1, 3)),
                                           ((1, 23, 34, 41), (23, 1, 5, 4), ((0, 2), (1, 1)), (2, 2))])
def test_depthwise_flat_against_row_path_and_float64(xs, ws, pad, dil):
    """The flat path makes the row path's products and sums (over wider rows): equal to it up to
    the last bit (OpenBLAS's matrix-vector tails), and within float32 rounding of float64."""
    from ember.backends import numpy_nn
    x, w = f32(*xs), f32(*ws)
    mult, (kh, kw) = ws[0] // xs[1], ws[2:]
    oh = xs[2] + sum(pad[0]) - (kh - 1) * dil[0]
    ow = xs[3] + sum(pad[1]) - (kw - 1) * dil[1]
    flat = numpy_nn._conv_depthwise_flat(x, w, mult, oh, ow, kh, kw, pad, dil)
    rows = numpy_nn._conv_depthwise_rows(numpy_nn._padded(x, pad), w, mult, oh, ow, kh, kw, (1, 1), dil,
                                         numpy_nn._row_phases(oh, kh, 1, dil[0]) or {0: oh + (kh - 1) * dil[0]})
    assert flat.shape == rows.shape == (xs[0], ws[0], oh, ow)
    ref = numpy_nn._conv_depthwise_rows(numpy_nn._padded(x.astype(np.float64), pad), w.astype(np.float64), mult,
                                        oh, ow, kh, kw, (1, 1), dil, numpy_nn._row_phases(oh, kh, 1, dil[0]) or
                                        {0: oh + (kh - 1) * dil[0]})
    scale = np.abs(x).max() * np.abs(w).max() * kh * kw
    np.testing.assert_allclose(flat, rows, rtol=0, atol=2 * np.finfo(np.float32).eps * scale)
    np.testing.assert_allclose(flat, ref, rtol=0, atol=kh * kw * np.finfo(np.float32).eps * scale)


POOLS = [
    ("max", (2, 3, 8, 8), dict(kernel_size=2)),
    ("max", (1, 2, 9, 7), dict(kernel_size=3, stride=2, padding=1)),
    ("max", (1, 2, 9, 7), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("max", (1, 2, 9, 9), dict(kernel_size=(2, 3), stride=1, dilation=2)),
    ("avg", (2, 3, 8, 8), dict(kernel_size=2)),
    ("avg", (1, 2, 9, 7), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg", (1, 2, 9, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
]


@pytest.mark.parametrize("kind,xs,kw", POOLS, ids=[f"{k}-{x}-{w}" for k, x, w in POOLS])
def test_pool_paths(kind, xs, kw):
    fn = ember.max_pool2d if kind == "max" else ember.avg_pool2d
    got, want = both(lambda t: fn(t, **kw), f32(*xs))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_max_pool_int_and_nan():
    x = rng.integers(-50, 50, (1, 2, 6, 6)).astype(np.int64)
    got, want = both(lambda t: ember.max_pool2d(t, 3, stride=2, padding=1), x)
    np.testing.assert_array_equal(got, want)
    y = f32(1, 1, 4, 4)
    y[0, 0, 1, 2] = np.nan
    got, _ = both(lambda t: ember.max_pool2d(t, 2), y)
    assert np.isnan(got[0, 0, 0, 1]) and not np.isnan(got[0, 0, 1, 1])


@pytest.mark.parametrize("fn", [lambda t: ember.softmax(t, axis=1), lambda t: ember.log_softmax(t, axis=-1),
                                lambda t: ember.layer_norm(t, (5,)), lambda t: ember.layer_norm(t, (4, 5)),
                                lambda t: ember.gelu(t), lambda t: ember.gelu(t, approximate="tanh")],
                         ids=["softmax", "log_softmax", "layer_norm", "layer_norm2", "gelu", "gelu_tanh"])
def test_in_place_kernels_leave_inputs_alone(fn):
    a = f32(3, 4, 5)
    x = ember.from_numpy(a.copy(), device="numpy")
    got = fn(x).numpy()
    np.testing.assert_array_equal(x.numpy(), a)
    want = fn(ember.from_numpy(a, device="python")).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_erf_within_one_ulp():
    xs = np.concatenate([np.linspace(-6, 6, 400001), [0.0, -0.0, 1e-30, -1e-38, 3.9, 3.95, 1e30]]).astype(np.float32)
    got = ember.erf(ember.from_numpy(xs, device="numpy")).numpy()
    ref = np.array([math.erf(float(v)) for v in xs])
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert (np.abs(got - ref) / ulp).max() <= 1.0
    special = ember.erf(ember.from_numpy(np.array([np.inf, -np.inf, np.nan], np.float32), device="numpy")).numpy()
    assert special[0] == 1 and special[1] == -1 and np.isnan(special[2])


def test_gelu_accuracy():
    xs = np.linspace(-8, 8, 100001).astype(np.float32)
    got = ember.gelu(ember.from_numpy(xs, device="numpy")).numpy().astype(np.float64)
    x64 = xs.astype(np.float64)
    ref = x64 * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x64]))
    # float32 throughout (a tanh form): <= ~1.1 ulp near x = 5; onnxruntime's own Gelu is 4.5e-7 off on
    # this grid, PyTorch's 1.1e-6
    assert np.abs(got - ref).max() < 6e-7


def test_gelu_special_values_and_chunks():
    # NaN, infinities, huge and tiny magnitudes, signed zeros (as x * Phi(x) gives them), and an
    # input longer than one chunk of the float32 kernel, against the pure-Python backend
    xs = np.array([np.nan, np.inf, -np.inf, -1e30, 1e30, 1e-30, -1e-30, 0.0, -0.0, -5.0, 5.0, -12.0], np.float32)
    got = ember.gelu(ember.from_numpy(xs, device="numpy")).numpy()
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2])
    assert got[3] == 0 and got[4] == 1e30 and got[5] == np.float32(5e-31) and got[6] == np.float32(-5e-31)
    assert got[7] == 0 and got[8] == 0 and abs(got[11]) < 1e-30       # (-12 Phi(-12) = -2e-32)
    long = np.linspace(-7, 7, 70007).astype(np.float32).reshape(7, 10001)
    got = ember.gelu(ember.from_numpy(long, device="numpy")).numpy()
    want = ember.gelu(ember.from_numpy(long[:, ::97].copy(), device="python")).numpy()
    np.testing.assert_allclose(got[:, ::97], want, rtol=0, atol=5e-7)


def test_gelu_large_magnitudes_without_a_cap():
    # x^2 goes into the polynomial uncapped: beyond x^2 = 36 g / 2 stays >= 12.5 (tanh +-1 in
    # float32) up to the overflow, so GELU is x for large positive x and 0 for large negative x,
    # exactly, as it was with x^2 capped at 49; every float32 in [6.9, 8] and a sweep to the largest
    step = np.arange(np.float32(6.9).view(np.int32), np.float32(8.0).view(np.int32), 7, dtype=np.int32)
    mags = np.concatenate([step.view(np.float32), np.geomspace(8, 3.4e38, 20001).astype(np.float32)])
    xs = np.concatenate([mags, -mags])
    with ember.native.disabled():       # (the numpy path's tanh form; core/native/rows.c's erf gives
        got = ember.gelu(ember.from_numpy(xs, device="numpy")).numpy()     # -7.5 Phi(-7.5) = -2e-13)
    big = np.abs(xs) >= 7.5
    np.testing.assert_array_equal(got[big], np.where(xs[big] > 0, xs[big], np.float32(0)))
    x64 = xs[~big].astype(np.float64)
    ref = x64 * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x64]))
    assert np.abs(got[~big] - ref).max() < 6e-7
    from ember.backends import numpy_nn
    t = np.geomspace(36, 3.4e38, 4001).astype(np.float32)          # g / 2 itself, in float32
    h = t * numpy_nn._GH[6]
    with np.errstate(over="ignore", invalid="ignore"):
        for c in numpy_nn._GH[5:0:-1]:
            h += c
            h *= t
        h += numpy_nn._GH[0]
        h *= np.sqrt(t)
    assert (h >= 12.5).all()


@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "causal", "dead_rows", "broadcast"])
def test_attention(case):
    q, k, v = f32(2, 3, 4, 8), f32(2, 3, 6, 8), f32(2, 3, 6, 5)
    arrays, kw = [q, k, v], {}
    if case == "bool_mask":
        arrays.append(rng.random((2, 1, 1, 6)) < 0.7)
    elif case == "float_mask":
        arrays.append(f32(1, 3, 4, 6))
    elif case == "causal":
        kw["is_causal"] = True
    elif case == "dead_rows":
        m = rng.random((2, 3, 4, 6)) < 0.5
        m[0, 1, 2] = False          # a query that sees no key: zeros, not NaN
        arrays.append(m)
    elif case == "broadcast":
        arrays = [q, f32(1, 3, 6, 8), f32(1, 3, 6, 5)]
    got, want = both(lambda *t: ember.scaled_dot_product_attention(*t, **kw), *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if case == "dead_rows":
        assert not np.isnan(got).any() and (got[0, 1, 2] == 0).all()


@pytest.mark.parametrize("dtype,lo,hi", [("float32", 0.0, 6.0), ("float32", None, 0.5), ("float16", 0.1, 1.0),
                                         ("int64", -2, 4), ("int64", 0.5, 3.5), ("int32", None, 3)])
def test_clip_kernel(dtype, lo, hi):
    a = (rng.standard_normal((4, 5)) * 5).astype(dtype)
    if dtype == "float32":
        a[0, 0] = np.nan
    got, want = both(lambda t: ember.clip(t, lo, hi), a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# ---- the numpy device's compiled plan replay (core/backends/numpy_plan.py) -----------------------

def _mobile_block(x, w1, b1, wd, bd, ws1, bs1, ws2, bs2):
    """1x1 conv + hard swish, depthwise conv + hard swish, squeeze-excite (mean, 1x1 conv, relu,
    1x1 conv, hard sigmoid, multiply), residual add: the chains the replay fuses and runs in place."""
    from ember.onnx import functional as F
    y = F.hard_swish(ember.conv2d(x, w1, b1))
    y = F.hard_swish(ember.conv2d(y, wd, bd, padding=1, groups=y.shape[1]))
    s = ember.mean(y, axis=(2, 3), keepdims=True)
    s = F.hard_sigmoid(ember.conv2d(ember.relu(ember.conv2d(s, ws1, bs1)), ws2, bs2), 1.0 / 6.0, 0.5)
    return ember.add(ember.conv2d(ember.multiply(y, s), ember.permute_dims(w1, (1, 0, 2, 3))), x)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("side", [6, 16])
def test_plan_replay_fuses_and_runs_in_place_bit_exact(native, side):
    """The activations fused into the convolutions (numpy_plan._conv_act: at 16x16 the 1x1 ones in
    dense.c's epilogue where the library runs, else one pass after) give the eager steps' bits."""
    import contextlib
    import ember.native as nat
    c = 4 if side == 6 else 16
    arrays = [f32(1, c, side, side), f32(2 * c, c, 1, 1), f32(2 * c), f32(2 * c, 1, 3, 3), f32(2 * c), f32(c, 2 * c, 1, 1),
              f32(c), f32(2 * c, c, 1, 1), f32(2 * c)]
    with contextlib.nullcontext() if native else nat.disabled():
        _plan_replay_bit_exact(arrays)


def _plan_replay_bit_exact(arrays):
    ts = [ember.from_numpy(a.copy(), device="numpy") for a in arrays]
    eager = _mobile_block(*ts).numpy()
    f = ember.compile(_mobile_block)
    f(*ts)
    got = [f(*ts).numpy() for _ in range(2)]                 # replays (the first builds the replay)
    fast = f.plan_for(*ts).fast
    assert fast.fused == 3 and fast.conv_act == 4 and fast.in_place >= 2, \
        [(o.name, o.inplace, o.act) for o in fast.ops]
    for g in got:
        np.testing.assert_array_equal(g, eager)             # same float32 operations, same order
    for t, a in zip(ts, arrays):
        np.testing.assert_array_equal(t.numpy(), a)         # inputs and weights never written
    want = _mobile_block(*[ember.from_numpy(a, device="python") for a in arrays]).numpy()
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_plan_replay_never_writes_memory_a_live_value_shares():
    w = ember.from_numpy(f32(3, 2, 1, 1), device="numpy")

    def fn(x):
        y = ember.conv2d(x, w)
        v = ember.reshape(y, (3, -1))               # a view of y's array, read after relu(y)
        z = ember.relu(y)                           # y's last reader: in place only if v were dead
        return ember.add(v, 1.0), z, ember.clip(ember.multiply(x, 2.0), 0.0, 1.0)

    x = ember.from_numpy(f32(1, 2, 4, 4), device="numpy")
    want = [t.numpy() for t in fn(x)]
    f = ember.compile(fn)
    f(x)
    for _ in range(2):
        for g, e in zip(f(x), want):
            np.testing.assert_array_equal(g.numpy(), e)


def _quantized_linear_model(k=16, n=8, w_zp=0, expose_q=False):
    """DynamicQuantizeLinear -> MatMulInteger (int8 weight, a zero point) -> Cast -> Mul -> Add:
    onnxruntime's quantize_dynamic layout of a linear layer, built by hand (``expose_q``: the
    quantized activations are a graph output too)."""
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper
    w = rng.integers(-64, 64, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(w_zp, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "w_scale"),
             numpy_helper.from_array(f32(n), "b")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "w_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    g = helper.make_graph(nodes, "qlinear", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3, n])]
                          + ([helper.make_tensor_value_info("xq", T.UINT8, [2, 3, k])] if expose_q else []), inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), w.astype(np.float64) - w_zp


@pytest.mark.parametrize("w_zp,expose_q", [(0, False), (3, False), (3, True)])
def test_plan_replay_int8_linear_fused_and_exact(w_zp, expose_q):
    """The replay runs DynamicQuantizeLinear as one op and MatMulInteger + Cast on float32 BLAS
    (a float32 copy of the weight made once): equal bit for bit to the step-by-step replay, and
    to the exact integer arithmetic. When only the matmul reads the quantized activations, they
    are handed over as ``q - zp`` in float32 ("centered"); as a graph output they stay uint8."""
    import ember.onnx
    raw, wc = _quantized_linear_model(w_zp=w_zp, expose_q=expose_q)
    m = ember.onnx.load(raw, device="numpy")
    for scale in (1.0, 3.0, 0.0, np.nan, np.inf, 1e-30, "tie"):    # all zeros: scale 1, zero point 0
        if scale == "tie":
            # range [-153.5, 101.5]: scale 1, zero point rint(153.5) = 154, and 101.5 rounds to 102:
            # 102 + 154 = 256, so the upper clip to 255 takes effect
            a = rng.uniform(-153.5, 101.5, (2, 3, 16)).astype(np.float32)
            a[0, 0, :4] = [-153.5, 101.5, 101.5, 99.5]
            scale = 1.0
        else:
            a = f32(2, 3, 16) * np.float32(1.0 if not np.isfinite(scale) else scale)
        if np.isnan(scale):
            a[0, 1, 2] = np.nan                            # NaN: the recorded casts' NaN -> 0
        if np.isinf(scale):
            a[1, 0, 3], a[0, 2, 5] = np.inf, -np.inf      # infinite range: scale inf, NaN quotients
        x = ember.from_numpy(a, device="numpy")
        outs = [m(x) for _ in range(3)][-1]
        want_all = m._execute(x)
        if expose_q:
            outs, q_got = outs
            np.testing.assert_array_equal(q_got.numpy(), want_all["xq"].numpy())
            assert q_got.numpy().dtype == np.uint8
        got = outs.numpy()
        np.testing.assert_array_equal(got, want_all["y"].numpy())
        if not np.isfinite(scale):
            continue
        lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
        s = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255)) or np.float32(1)
        zp = np.clip(np.rint(-(np.float32(lo) / s)), 0, 255)
        q = np.clip(np.rint(a / s) + zp, 0, 255)
        want = ((q - zp) @ wc).astype(np.float32) * (s * np.float32(0.02))
        np.testing.assert_allclose(got - m._consts["b"].numpy(), want, rtol=1e-5, atol=1e-5)
    ops = m._compiled.plan_for(x).fast.ops
    names = [op.name for op in ops]
    assert names[:3] == ["dynamic_quantize_linear", "multiply", "matmul_integer"] and len(names) == 5, names
    assert [ops[0].mode, ops[2].mode] == ([None, "float32"] if expose_q else ["centered", "centered"])


def test_conv_scale_shift_folded_like_onnxruntime():
    """Conv whose weight and bias are Constant nodes (Paddle2ONNX's way), then Mul by a scalar
    and Add of a per-channel shift (PP-LCNetV3's learnable affine): ember.onnx.fuse hoists the
    constants and folds both into the convolution, as onnxruntime does; results match it."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    import ember.onnx

    def const(name, a):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a, name + "_v"))

    nodes = [const("w", f32(6, 3, 3, 3)), const("b", f32(6)), const("s", np.array([1.7], np.float32)),
             const("t", f32(1, 6, 1, 1)),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 6, 8, 8])])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    x = f32(1, 3, 8, 8)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = ember.onnx.load(raw, device="numpy")
    assert [n.op_type for n in m._plan] == ["Conv", "Relu"]
    np.testing.assert_allclose(m(ember.from_numpy(x, device="numpy")).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(8, 4, 32, 32), (300, 7), (2, 3, 5), (1, 40, 700)])
def test_softmax_short_rows(shape):
    # short last axes take the transposed-max / matrix-vector-sum route: against float64
    a = (f32(*shape) * 5).astype(np.float32)
    if len(shape) == 4:
        a[0, 0, 0, 3] = np.nan                     # a NaN row stays NaN
        a[0, 1, 2, :] = -np.inf                    # a row of -inf: NaN, as max-shifting gives
    got = ember.softmax(ember.from_numpy(a, device="numpy"), axis=-1).numpy()
    with np.errstate(invalid="ignore"):
        e = np.exp(a.astype(np.float64) - a.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.isnan(got).sum() == np.isnan(want).sum()


def _conv_ref(x, w, stride, pad, groups):
    """float64 convolution by shifted views (an independent route), for the larger cases below."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, cg, kh, kw = w.shape
    n, c, h, wd = x.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                v = xs[:, :, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride]
                y[:, g * og:(g + 1) * og] += np.einsum("ncyx,oc->noyx", v, w[g * og:(g + 1) * og, :, i, j])
    return y


@pytest.mark.parametrize("case", ["tiled", "tiled_stride2", "depthwise_chunked", "pointwise_split"])
def test_conv_band_and_chunk_loops(case):
    # convolutions large enough for the im2col band loop (tiled), the depthwise channel-chunk loop
    # and a large 1x1 GEMM, against an independent float64 route
    c, o, k, s, g, hw = {"tiled": (16, 24, 3, 1, 1, 64), "tiled_stride2": (8, 16, 3, 2, 1, 96),
                         "depthwise_chunked": (64, 64, 3, 1, 64, 64), "pointwise_split": (96, 128, 1, 1, 1, 48)}[case]
    x = f32(1, c, hw, hw)
    w = f32(o, c // g, k, k)
    with ember.native.disabled():               # (the numpy depthwise path's chunks)
        got = ember.conv2d(ember.from_numpy(x, device="numpy"), ember.from_numpy(w, device="numpy"),
                           stride=s, padding=k // 2, groups=g).numpy()
    np.testing.assert_allclose(got, _conv_ref(x, w, s, k // 2, g), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.parametrize("k", [(2, 2), (3, 3), (2, 3), (1, 2), (2, 1), (4, 2)])
def test_max_pool_tiled_windows_exact(k, dtype):
    """Windows that tile the input (kernel == stride): the flat row maxima read back through
    reshaped views equal a plain reduction over each window, NaN included, bit for bit."""
    kh, kw = k
    n, c, oh, ow = 2, 3, 4, 5
    x = rng.standard_normal((n, c, oh * kh, ow * kw)) * 100
    if dtype != "int64":
        x[0, 1, 2, 3] = np.nan
        x[1, 2, 0, 0] = -np.inf
        x[1, 0, 1, :] = -0.0
    x = x.astype(dtype)
    want = x.reshape(n, c, oh, kh, ow, kw).max(axis=(3, 5))
    got = ember.max_pool2d(ember.from_numpy(x, device="numpy"), k).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_strided_view_is_read_only_and_matches_as_strided():
    from numpy.lib.stride_tricks import as_strided

    from ember.backends.numpy_nn import strided_view
    a = f32(2, 3, 6, 6)
    for src in (a, a[:, :, 1:5, ::2]):           # C-contiguous (ndarray constructor) and a strided view
        s0, s1, s2, s3 = src.strides
        shape, strides = src.shape[:2] + (2, 2, src.shape[2] - 1, src.shape[3] - 1), (s0, s1, s2, s3, s2, s3)
        v = strided_view(src, shape, strides)
        np.testing.assert_array_equal(v, as_strided(src, shape, strides))
        assert not v.flags.writeable and np.shares_memory(v, src)


def test_plan_replay_steps_quiet_and_exact():
    """Replayed steps call the kernels without their own errstate (the replay holds one): no
    floating-point warning escapes, and an MNIST-style CNN replays bit for bit like eager code."""
    import warnings
    w1, b1, w2, b2, fw, fb = (ember.from_numpy(a, device="numpy") for a in
                              (f32(8, 1, 3, 3), f32(8), f32(16, 8, 3, 3), f32(16), f32(10, 16 * 7 * 7), f32(10)))

    def net(x):
        y = ember.max_pool2d(ember.relu(ember.conv2d(ember.divide(ember.subtract(x, 0.1), 0.3), w1, b1, padding=1)), 2)
        y = ember.max_pool2d(ember.relu(ember.conv2d(y, w2, b2, padding=1)), 2)
        z = ember.linear(ember.reshape(y, (1, -1)), fw, fb)
        return z, ember.sqrt(ember.subtract(z, 1e30)), ember.divide(z, ember.multiply(z, 0.0))

    x = ember.from_numpy(f32(1, 1, 28, 28), device="numpy")
    with np.errstate(all="ignore"):
        want = [t.numpy() for t in net(x)]
    f = ember.compile(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            got = [t.numpy() for t in f(x)]
            for g, e in zip(got, want):
                np.testing.assert_array_equal(g, e)
    assert np.isnan(got[1]).all() and np.isinf(got[2]).all()      # (invalid, divide by zero: no warning)
    assert f.plan_for(x).fast is not None


@pytest.mark.parametrize("shape,offset", [((8, 32, 128), 0.0), ((8, 32, 128), 1e3), ((3, 384), 50.0), ((5, 2), 0.0),
                                          ((4, 1), 0.0), ((0, 16), 0.0), ((6, 7, 33), -20.0)])
def test_layer_norm_last_axis_against_float64(shape, offset):
    """One normalized axis: row sums by BLAS, squared deviations by vecdot; rows far from zero
    (offset, small spread) and a transposed (non-contiguous) input against float64."""
    n = shape[-1]
    x = (rng.standard_normal(shape) * 0.5 + offset).astype(np.float32)
    w, b = f32(n), f32(n)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w + b
    t = lambda a: ember.from_numpy(a, device="numpy")   # noqa: E731
    got = ember.layer_norm(t(x), (n,), t(w), t(b), eps=1e-5).numpy()
    # float32 rounds the mean at |offset| (an ulp there, over the spread 0.5, times the weight)
    tol = 1e-5 + 4 * abs(offset) * 2 ** -23 / 0.5 * float(np.abs(w).max())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol)
    if len(shape) == 3:
        xt = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)       # same values, strided
        got_t = ember.layer_norm(t(xt), (n,), t(w), t(b), eps=1e-5).numpy()
        np.testing.assert_allclose(got_t, want, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_clip_ufunc_equals_np_clip(dtype):
    """numpy_nn.clip (the ufunc np.clip runs, without its argument checks): the same bits as
    np.clip for NaN, signed zeros, infinities and ordinary values, with and without out=."""
    from ember.backends.numpy_nn import clip
    x = np.array([np.nan, -np.nan, -0.0, 0.0, -np.inf, np.inf, -1.5, 0.25, 7.0, 1e-30], dtype)
    for lo, hi in ((0, np.inf), (0, 1), (-np.inf, 6), (-1, -1)):
        lo, hi = x.dtype.type(lo), x.dtype.type(hi)
        want = np.clip(x, lo, hi)
        got = clip(x, lo, hi)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        buf = x.copy()
        assert clip(buf, lo, hi, out=buf) is buf and buf.tobytes() == want.tobytes()


@pytest.mark.parametrize("shape,axes,keepdims", [((1, 576, 7, 7), (2, 3), True), ((1, 240, 14, 14), (-1, -2), False),
                                                 ((64, 30), (1,), False), ((4, 8, 5), (1, 2), True),
                                                 ((16, 2000), (1,), False), ((8, 30), (1,), False)])
def test_sum_trailing_axes_as_row_products(shape, axes, keepdims):
    """ember.sum over trailing axes (a BLAS matrix-vector product for many short float32 rows)
    against float64 sums: NaN and infinite rows, keepdims, negative axes, float16 input, and the
    shapes that keep numpy's own sum (long rows, few rows, a Fortran-ordered array)."""
    from ember.backends import numpy_backend
    a = f32(*shape) * np.float32(100)
    flat = a.reshape(-1, int(np.prod([shape[ax] for ax in axes])))
    flat[0, 0] = np.nan
    flat[1, :2] = np.inf
    flat[2, :2] = [np.inf, -np.inf]
    flat[3] = -0.0
    taken = []
    real = numpy_backend._row_sums
    assert numpy_backend._row_sums(np.asfortranarray(a), axes, keepdims) is None      # not C-contiguous
    for dtype, arr in (("float32", a), ("float16", a.astype(np.float16))):
        taken.clear()
        def spy(*args, _r=real):
            y = _r(*args)
            taken.append(y is not None)
            return y
        numpy_backend._row_sums = spy
        try:
            got = ember.sum(ember.from_numpy(arr, device="numpy"), axis=axes, keepdims=keepdims).numpy()
        finally:
            numpy_backend._row_sums = real
        with np.errstate(invalid="ignore"):
            want = np.sum(arr.astype(np.float64), axis=axes, keepdims=keepdims)
        assert got.shape == want.shape
        tol = np.sum(np.abs(arr.astype(np.float64)), axis=axes, keepdims=keepdims) * 2e-7 \
            if dtype != "float16" else np.abs(want) * 1e-3 + 1e-2
        fin = np.isfinite(want)
        assert np.all(np.abs(got[fin] - want[fin]) <= tol[fin] + 1e-30)
        np.testing.assert_array_equal(got[~fin], want[~fin].astype(got.dtype))
        expect_row_path = flat.shape[1] <= 1024 and flat.shape[0] >= 16
        assert taken == [bool(expect_row_path)], (dtype, taken)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("r", [2, 4, 8, 3])
def test_take_repeating_last_axis_bit_exact(dtype, r):
    """take along the last axis with indices 0,..,0, 1,..,1, ... (r each: a nearest-neighbour
    upsampling) equals np.take bit for bit: NaN payloads, -0.0, infinities; also the reversed
    order (np.take's own path) and negative indices (the same pattern once normalized)."""
    from ember.backends import numpy_backend
    a = (rng.standard_normal((2, 3, 64, 50)) * 1000).astype(dtype)
    if dtype in (np.float32, np.float16):
        bits = a.view(np.uint32 if dtype == np.float32 else np.uint16)
        bits[0, 0, 0, :3] = [0x7FC01234 if dtype == np.float32 else 0x7E12, 0x80000000 if dtype == np.float32 else 0x8000,
                             0xFF800000 if dtype == np.float32 else 0xFC00]
    x = ember.from_numpy(a, device="numpy")
    calls = []
    real = numpy_backend._repeat_last
    numpy_backend._repeat_last = lambda *args: calls.append(1) or real(*args)
    try:
        for ids in (np.repeat(np.arange(50), r), np.repeat(np.arange(50), r)[::-1].copy(), np.repeat(np.arange(50) - 50, r)):
            got = ember.take(x, ember.from_numpy(ids, device="numpy"), axis=-1).numpy()
            want = np.take(a, ids, axis=-1)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    finally:
        numpy_backend._repeat_last = real
    # (the path is tried for every large enough last-axis take; it applies to the first ids only)
    assert len(calls) == 3
    fast = real(a, np.repeat(np.arange(50), r))
    assert (fast is not None) == (r in (2, 4, 8) and a.itemsize in (2, 4))


CONV_TRANSPOSES = [
    # (x shape, w shape (c, og, kh, kw), kwargs): the GEMM with (og, tap) rows and its scatter:
    ((1, 6, 5, 7), (6, 4, 2, 2), {"stride": 2}),                                   # taps tile the output
    ((1, 4, 3, 3), (4, 3, 2, 2), {"stride": 2, "groups": 2}),
    ((1, 3, 4, 5), (3, 2, 2, 2), {"stride": 3}),                                   # apart, gaps stay 0
    ((1, 3, 4, 5), (3, 2, 2, 2), {"stride": 2, "output_padding": 1}),              # apart, an extra row/col
    ((2, 3, 4, 5), (3, 2, 2, 2), {"stride": 2, "padding": ((1, 0), (0, 1))}),     # apart, trimmed
    ((1, 3, 4, 5), (3, 2, 1, 1), {"stride": 2, "dilation": 2}),
    ((2, 3, 4, 5), (3, 2, 1, 1), {"stride": 2, "dilation": 2, "output_padding": 1}),    # apart, every other row 0
    ((1, 3, 4, 5), (3, 2, 2, 2), {"stride": 2, "dilation": 2}),                    # overlapping: summed
    ((1, 3, 4, 5), (3, 2, 3, 3), {"stride": (2, 1), "padding": 1}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_TRANSPOSES, ids=[f"{x}-{w}-{k}" for x, w, k in CONV_TRANSPOSES])
def test_conv_transpose2d_paths(xs, ws, kw):
    arrays = [f32(*xs), f32(*ws), f32(ws[1] * kw.get("groups", 1))]
    got, want = both(lambda x, w, b: ember.conv_transpose2d(x, w, b, **kw), *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got, want = both(lambda x, w: ember.conv_transpose2d(x, w, **kw), *arrays[:2])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _matmul_add_model(k, n, rows_shape, bias=True):
    """MatMul by a constant (k, n) weight [+ Add of a constant bias]: a linear layer in ONNX."""
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(f32(k, n), "w"), numpy_helper.from_array(f32(n), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m" if bias else "y"])]
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["y"]))
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", T.FLOAT, list(rows_shape) + [k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, list(rows_shape) + [n])], inits[:1 + bias])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("k,n,rows,bias,limit", [(120, 360, (2, 20), True, None), (120, 6625, (1, 40), True, None),
                                                  (64, 48, (1, 1), True, None), (128, 384, (256,), True, None),
                                                  (120, 360, (2, 20), True, 1000), (128, 384, (3,), True, None),
                                                  (64, 360, (40,), True, None), (512, 128, (15,), True, None),
                                                  (128, 1000, (7,), True, None), (128, 1000, (9,), True, None)])
def test_plan_replay_linear_with_constant_weight(k, n, rows, bias, limit, monkeypatch):
    """A linear layer with a constant weight replays on a row-major copy of the transposed weight
    made once (several rows, over 2**20 multiply-adds), else as recorded (one row, a small product,
    or over the copy budget): equal bit for bit to the step-by-step run, and to float64 within
    float32 rounding. (The small products here gave other bits through the copy with OpenBLAS's
    SkylakeX kernels: 3 x 128 @ 128 x 384 by 2.7e-5.)"""
    import ember.onnx
    from ember.backends import numpy_plan
    if limit is not None:
        monkeypatch.setattr(numpy_plan, "_LINEAR_COPY_BYTES", limit)
    products = []
    real = numpy_plan.matmul
    monkeypatch.setattr(numpy_plan, "matmul", lambda a, b, out=None: products.append(b.shape) or real(a, b, out=out))
    m = ember.onnx.load(_matmul_add_model(k, n, rows, bias), device="numpy")
    a = f32(*rows, k)
    x = ember.from_numpy(a, device="numpy")
    got = [m(x).numpy() for _ in range(3)][-1]
    big = int(np.prod(rows)) > 1 and int(np.prod(rows)) * k * n > numpy_plan._LINEAR_COPY_MIN_MACS
    if big and limit is None:                                      # the copy: only for big products
        assert products and set(products) == {(k, n)}
    else:
        assert products == []
    np.testing.assert_array_equal(got, m._execute(x)["y"].numpy())
    w = m._consts["w"].numpy().astype(np.float64) if "w" in m._consts else None
    if w is not None:
        want = a.astype(np.float64) @ (w if w.shape == (k, n) else w.T)
        if bias:
            want += m._consts["b"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ops = m._compiled.plan_for(x).fast.ops
    lin = [op for op in ops if op.name == "linear"]
    assert len(lin) == 1
    copied = "_linear_const" in lin[0].run.__qualname__
    assert copied == (limit is None)


def test_plan_replay_linear_copy_follows_weight_updates():
    """A compiled no-grad forward of an nn.Linear replayed after the optimizer updated the weight
    (Tensor._set_ swaps in a new buffer) uses the new weight, like eager code."""
    from ember import nn
    ember.manual_seed(0)
    lin = nn.Linear(16, 8).to("numpy")
    opt = ember.optim.SGD(lin.parameters(), lr=0.5)

    @ember.compile
    def fwd(x):
        with ember.no_grad():
            return lin(x)
    x = ember.from_numpy(f32(5, 16), device="numpy")
    for _ in range(3):
        fwd(x)
    for _ in range(2):
        before = fwd(x).numpy()
        loss = (lin(x) * lin(x)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with ember.no_grad():
            want = lin(x).numpy()
        got = fwd(x).numpy()
        assert not np.array_equal(got, before)
        np.testing.assert_array_equal(got, want)
