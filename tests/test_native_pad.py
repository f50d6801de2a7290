"""Small stride-1 convolutions by dense.c's ember_conv_pad (numpy_nn._conv_pad_native, NativeConvPad):
the kernel's own zero-padded band, two output rows per block, the activation and an optional 2x2
max pooling in its epilogue; and the compiled numpy plan's steps around them (numpy_plan): conv +
activation + max pool as one step, one-row linears on ember_gemv with their relu, scalar chains
such as ``(x - mean) / std``. Against float64 references, with the library on and off
(``ember.native.disabled()``), bit for bit against the separate steps where the plan fuses them."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_nn

rng = np.random.default_rng(11)
P, I64 = ctypes.c_void_p, ctypes.c_int64
RELU = (0.0, 0.0, 0.0, np.inf)
ACTS = {None: (0.0, 0.0, 0.0, 0.0), "relu": RELU, "clip": (0.0, 0.0, -0.5, 0.75),
        "hard_swish": (1 / 6, 0.5, 0.0, 1.0)}


def native_or_skip():
    if nat.lib() is None:
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def t(a):
    return ember.from_numpy(a, device="numpy")


def out_size(x, w, pad, dil):
    (pt, pb), (pl, pr) = pad
    return (x.shape[2] + pt + pb - (w.shape[2] - 1) * dil[0], x.shape[3] + pl + pr - (w.shape[3] - 1) * dil[1])


def reference(x, w, b, pad, dil, act=None, pool=0):
    """The stride-1 convolution in float64 (zero-padded windows), the activation, the floor-mode
    2x2 max pooling."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (pt, pb), (pl, pr) = pad
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh, ow = out_size(x, w, pad, dil)
    y = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("oc,nchw->nohw", w[:, :, i, j].astype(np.float64),
                           xp[:, :, i * dil[0]:i * dil[0] + oh, j * dil[1]:j * dil[1] + ow])
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    a_, b_, lo, hi = ACTS[act]
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "clip":
        y = np.clip(y, lo, hi)
    elif act == "hard_swish":
        y = y * np.clip(y * a_ + b_, 0, 1)
    if pool:
        y = y[:, :, :oh // 2 * 2, :ow // 2 * 2].reshape(n, o, oh // 2, 2, ow // 2, 2).max(axis=(3, 5))
    return y


def tolerance(x, w, b):
    k = w[0].size
    scale = np.abs(x).max() * np.abs(w).max() * k + (0 if b is None else np.abs(b).max())
    return 4 * np.finfo(np.float32).eps * (k + 1) * scale


def conv_act(x, w, b, pad, dil=(1, 1), act=None, pool=0):
    """numpy_nn.conv2d_act as the plan calls it (its result: ember_conv_pad's where the library
    runs, else the numpy paths then the pooling)."""
    oh, ow = out_size(x, w, pad, dil)

    class Meta:
        shape = (x.shape[0], w.shape[0], oh, ow)
        dtype = ember.float32
    return numpy_nn.conv2d_act(Meta, t(x), t(w), None if b is None else t(b), stride=(1, 1), padding=pad,
                               dilation=dil, groups=1, act=act, act_args=ACTS[act], pool=pool)


P1 = ((1, 1), (1, 1))
CASES = [  # (x shape, w shape, padding, dilation)
    ((1, 1, 28, 28), (16, 1, 3, 3), P1, (1, 1)),           # MNIST's first convolution
    ((1, 16, 14, 14), (32, 16, 3, 3), P1, (1, 1)),         # and its second
    ((2, 3, 13, 17), (9, 3, 3, 3), P1, (1, 1)),            # batch 2, odd sizes, a panel of 1 row
    ((1, 5, 9, 40), (12, 5, 5, 3), ((2, 0), (1, 3)), (1, 1)),   # 5x3, asymmetric padding, 40 = 16 + 16 + 8
    ((1, 4, 11, 12), (17, 4, 3, 3), ((2, 2), (2, 2)), (2, 2)),  # dilation 2
    ((1, 6, 1, 40), (7, 6, 1, 3), ((0, 0), (1, 1)), (1, 1)),    # one output row (PP-OCR rec's 1x3 kind)
    ((3, 2, 7, 7), (8, 2, 1, 1), P1, (1, 1)),              # 1x1 with padding, 3 images
    ((1, 2, 5, 33), (3, 2, 3, 3), ((4, 4), (4, 4)), (1, 1)),   # padding larger than the kernel
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", [None, "relu", "clip", "hard_swish"])
@pytest.mark.parametrize("pool", [0, 2])
@pytest.mark.parametrize("native", [True, False])
def test_conv_pad_on_and_off(case, act, pool, native):
    xs, ws, pad, dil = case
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    if native:
        native_or_skip()
        y = numpy_nn._conv_pad_native(x, w, b, *out_size(x, w, pad, dil), ws[2], ws[3], pad, dil, act, ACTS[act],
                                      pool)
        if pool and min(out_size(x, w, pad, dil)) < 2:
            assert y is None                  # (no 2x2 window: the plan never asks for it)
            return
        assert y is not None
    elif pool and min(out_size(x, w, pad, dil)) < 2:
        return
    else:
        with nat.disabled():
            y = conv_act(x, w, b, pad, dil, act, pool)
    ref = reference(x, w, b, pad, dil, act, pool)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.abs(y - ref).max() <= tolerance(x, w, b)


@pytest.mark.parametrize("case", CASES[:4])
@pytest.mark.parametrize("act", [None, "relu", "hard_swish"])
def test_pooled_epilogue_same_bits_as_the_pooling_after(case, act):
    """The 2x2 max pooling in the epilogue gives the bits of the unpooled kernel's result pooled
    by numpy (numpy_nn._max_pool_floor, numpy's maximum); library off, conv2d_act's numpy paths
    give the bits of ember's separate conv2d, activation and max_pool2d calls."""
    native_or_skip()
    xs, ws, pad, dil = case
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    x[0, 0, 1, 2] = np.nan                                         # windows reading it pool to NaN
    oh, ow = out_size(x, w, pad, dil)
    pooled = numpy_nn._conv_pad_native(x, w, b, oh, ow, ws[2], ws[3], pad, dil, act, ACTS[act], 2)
    plain = numpy_nn._conv_pad_native(x, w, b, oh, ow, ws[2], ws[3], pad, dil, act, ACTS[act], 0)
    after = numpy_nn._max_pool_floor(plain)
    np.testing.assert_array_equal(pooled, after)
    clean = np.nan_to_num(x, nan=0.0)
    ref = reference(clean, w, b, pad, dil, act, 2)
    hit = reference(np.isnan(x).astype(np.float32), np.ones_like(w), None, pad, dil, None, 2) > 0
    assert np.isnan(pooled[hit]).all() and not np.isnan(pooled[~hit]).any()
    assert np.abs(pooled[~hit] - ref[~hit]).max() <= tolerance(clean, w, b)
    with nat.disabled():
        got = conv_act(x, w, b, pad, dil, act, 2)
        y = ember.conv2d(t(x), t(w), t(b), padding=pad, dilation=dil)
        if act == "relu":
            y = ember.relu(y)
        elif act == "hard_swish":
            from ember.onnx import functional as F
            y = F.hard_swish(y)
        want = ember.max_pool2d(y, 2, 2).numpy()
    np.testing.assert_array_equal(got, want)


def test_same_bits_on_any_unit_ranges_and_threads(monkeypatch):
    """Outputs do not depend on the range of row pairs a call gets (ranges across images too), nor
    on parallel_for's split (one row left unpaired: 13 rows); and they are ember_conv_rows's bits
    on the same convolution."""
    native_or_skip()
    x, w, b = f32(3, 5, 13, 20), f32(11, 5, 3, 3), f32(11)
    fn = nat.kernel("ember_conv_pad", I64, P, P, P, P, P, P, P, I64, I64, I64)
    wp = numpy_nn._pack_dense(w)
    ap = np.array(RELU, np.float32)
    scratch = np.zeros(1 << 16, np.float32)
    one = {}
    for pool in (0, 2):
        geom = np.array([3, 5, 13, 20, 5 * 260, 260, 20, 1, 11, 13, 20, 3, 3, 1, 1, 1, 1, 1, pool], np.int64)
        units = 3 * (6 if pool else 7)
        outs = []
        for ranges in (1, 2, 5, units):
            y = np.full((3, 11, 6, 10) if pool else (3, 11, 13, 20), 7.0, np.float32)
            for k in range(ranges):
                r = fn(wp.ctypes.data, x.ctypes.data, b.ctypes.data, y.ctypes.data, geom.ctypes.data, ap.ctypes.data,
                       scratch.ctypes.data, scratch.size, units * k // ranges, units * (k + 1) // ranges)
                assert r == 0
            outs.append(y)
        for y in outs[1:]:
            np.testing.assert_array_equal(y, outs[0])
        one[pool] = outs[0]
        with monkeypatch.context() as m:
            m.setattr(numpy_nn, "_NATIVE_DENSE_PARALLEL_MACS", 1)             # parallel_for's ranges
            threaded = numpy_nn._conv_pad_native(x, w, b, 13, 20, 3, 3, P1, (1, 1), "relu", RELU, pool)
        np.testing.assert_array_equal(threaded, outs[0])
    rows = np.empty((3, 11, 13, 20), np.float32)
    numpy_nn._conv_rows_native(x, wp, b, rows, 13, 20, 3, 3, P1, (1, 1), "relu", ap)
    np.testing.assert_array_equal(rows, one[0])
    assert np.abs(one[0] - reference(x, w, b, P1, (1, 1), "relu")).max() <= tolerance(x, w, b)


@pytest.mark.parametrize("view", ["channels", "reversed", "transposed"])
def test_strided_inputs(view):
    """The band is copied through the input's strides (a column stride other than 1: the scalar copy)."""
    native_or_skip()
    base = f32(2, 8, 15, 15)
    x = {"channels": base[:, ::2], "reversed": base[:, :4, ::-1, ::-1],
         "transposed": base[:, :4].transpose(0, 1, 3, 2)}[view]
    w, b = f32(6, 4, 3, 3), f32(6)
    for pool in (0, 2):
        y = numpy_nn._conv_pad_native(x, w, b, 15, 15, 3, 3, P1, (1, 1), "relu", RELU, pool)
        ref = reference(x, w, b, P1, (1, 1), "relu", pool)
        assert np.abs(y - ref).max() <= tolerance(x, w, b)


def test_c_refusals_and_scratch():
    native_or_skip()
    fn = nat.kernel("ember_conv_pad", I64, P, P, P, P, P, P, P, I64, I64, I64)
    wp = np.zeros((1, 18, 8), np.float32)
    x = np.ones((1, 2, 6, 6), np.float32)
    y = np.full((1, 3, 6, 6), 7.0, np.float32)
    ap = np.zeros(4, np.float32)
    good = [1, 2, 6, 6, 72, 36, 6, 1, 3, 6, 6, 3, 3, 1, 1, 1, 1, 0, 0]
    scratch = np.zeros(4096, np.float32)

    def call(geom, u0=0, u1=3, n=scratch.size):
        g = np.array(geom, np.int64)
        return fn(wp.ctypes.data, x.ctypes.data, None, y.ctypes.data, g.ctypes.data, ap.ctypes.data,
                  scratch.ctypes.data, n, u0, u1)
    bad = [(1, 0), (8, 0), (11, 0), (13, 0), (17, 5), (17, -1), (18, 3), (18, 1)]
    for k, v in bad:
        g = list(good)
        g[k] = v
        assert call(g) == -1
    assert call(good, 0, 4) == -1 and call(good, 2, 1) == -1 and call(good, -1, 2) == -1
    pooled_one_row = list(good)
    pooled_one_row[9], pooled_one_row[18] = 1, 2                      # pooling a 1-row output
    assert call(pooled_one_row, 0, 0) == -1
    need = call(good, n=10)
    assert need == 2 * (6 + 2) * 8 + nat.kernel("ember_vector_width", I64)()     # (a vector of slack)
    assert (y == 7).all()                                             # nothing written
    assert call(good, n=need) == 0 and (y == 0).all()                 # zero weights: zeros


def test_kept_calls_follow_new_buffers_and_the_library():
    """One-thread calls are set up once (NativeConvPad in _PAD_CALLS): the same bits again; a new
    weight or bias buffer gets its own; with the library disabled none is handed out."""
    native_or_skip()
    x, w, b = f32(1, 16, 14, 14), f32(32, 16, 3, 3), f32(32)
    first = numpy_nn._conv_pad_native(x, w, b, 14, 14, 3, 3, P1, (1, 1), "relu", RELU, 2)
    call = numpy_nn.conv_pad_call(x, w, b, 14, 14, 3, 3, P1, (1, 1), "relu", RELU, 2)
    # (keyed by id(w): an earlier test's dead weight may have had the same id, its entry still there)
    assert call is not None and any(v[2] is call for k, v in numpy_nn._PAD_CALLS.items() if k[0] == id(w) and v[0]() is w)
    np.testing.assert_array_equal(call(x), first)
    w2, b2 = -w, b + 1
    y2 = numpy_nn._conv_pad_native(x, w2, b2, 14, 14, 3, 3, P1, (1, 1), "relu", RELU, 2)
    assert np.abs(y2 - reference(x, w2, b2, P1, (1, 1), "relu", 2)).max() <= tolerance(x, w2, b2)
    assert call(x[:, :8]) is None                                     # another shape: not this call's
    with nat.disabled():
        assert call(x) is None
        assert numpy_nn.conv_pad_call(x, w, b, 14, 14, 3, 3, P1, (1, 1), "relu", RELU, 2) is None
        assert numpy_nn._conv_pad_native(x, w, b, 14, 14, 3, 3, P1, (1, 1), "relu", RELU, 2) is None


def test_cases_it_takes(monkeypatch):
    """conv2d takes ember_conv_pad for small stride-1 convolutions, not for Winograd's cases,
    stride 2, many pixels, or 1x1 ones without padding (ember_conv_gemm / ember_gemv)."""
    native_or_skip()
    seen = []
    real = numpy_nn._conv_pad_native
    monkeypatch.setattr(numpy_nn, "_conv_pad_native", lambda *a, **k: seen.append(1) or real(*a, **k))
    for xs, ws, kw, taken in [((1, 1, 28, 28), (16, 1, 3, 3), {"padding": 1}, True),
                              ((1, 16, 14, 14), (32, 16, 3, 3), {"padding": 1}, True),
                              ((1, 96, 15, 20), (24, 96, 3, 3), {"padding": 1}, False),      # Winograd's
                              ((1, 16, 14, 14), (32, 16, 3, 3), {"padding": 1, "stride": 2}, False),
                              ((1, 3, 40, 40), (8, 3, 3, 3), {"padding": 1}, False),         # 1600 pixels
                              ((1, 16, 14, 14), (32, 16, 1, 1), {}, False)]:
        seen.clear()
        ember.conv2d(t(f32(*xs)), t(f32(*ws)), **kw)
        assert bool(seen) == taken, (xs, ws, kw)


# ---- the compiled plan (numpy_plan): conv + activation + pool, one-row linear + relu, chains -----

def _small_cnn(p):
    """MNIST's demo CNN (as ember ops): normalization, two conv + relu + 2x2 max pool, flatten,
    linear + relu, linear."""
    def fn(x):
        y = ember.divide(ember.subtract(x, p["mean"]), p["std"])
        for i in (1, 2):
            y = ember.max_pool2d(ember.relu(ember.conv2d(y, p[f"w{i}"], p[f"b{i}"], padding=1)), 2, 2)
        y = ember.relu(ember.linear(ember.reshape(y, (y.shape[0], -1)), p["f1"], p["g1"]))
        return ember.linear(y, p["f2"], p["g2"])
    return fn


def _cnn_params():
    sc = lambda *s: (f32(*s) * (1.0 / np.sqrt(np.prod(s[1:]) if len(s) > 1 else 1))).astype(np.float32)  # noqa: E731
    return {"mean": np.float32(0.1307), "std": np.float32(0.3081), "w1": sc(16, 1, 3, 3), "b1": f32(16) * 0.1,
            "w2": sc(32, 16, 3, 3), "b2": f32(32) * 0.1, "f1": sc(64, 32 * 7 * 7), "g1": f32(64) * 0.1,
            "f2": sc(10, 64), "g2": f32(10) * 0.1}


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("batch", [1, 2])
def test_plan_small_cnn_fused_bit_exact(native, batch):
    """The plan runs the demo CNN at batch 1 in 5 steps (a scalar chain, two conv + relu + pool,
    flatten + linear + relu, linear; batch 2: the reshape, linear and relu as recorded) with the
    eager steps' bits, library on and off; float64 within float32 rounding."""
    import contextlib
    if native:
        native_or_skip()
    arrays = _cnn_params()
    x = rng.random((batch, 1, 28, 28), dtype=np.float32)
    with contextlib.nullcontext() if native else nat.disabled():
        p = {k: ember.from_numpy(np.asarray(v, np.float32), device="numpy") for k, v in arrays.items()}
        fn = _small_cnn(p)
        xt = t(x)
        eager = fn(xt).numpy()
        f = ember.compile(fn)
        got = [f(xt).numpy() for _ in range(3)]
        fast = f.plan_for(xt).fast
    names = [(op.name, op.act, op.pool) for op in fast.ops]
    assert fast.conv_pool == 2 and names[0][0] == "scalar_chain", names
    assert ("linear", "relu", 0) in names if batch == 1 else ("relu", None, 0) in names, names
    assert len(fast.ops) == (5 if batch == 1 else 7), names
    assert ("reshape" in [n for n, _, _ in names]) == (batch > 1)
    for g in got:
        np.testing.assert_array_equal(g, eager)
    py = {k: ember.from_numpy(np.asarray(v, np.float32), device="python") for k, v in arrays.items()}
    want = _small_cnn(py)(ember.from_numpy(x, device="python")).numpy()
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_plan_pool_fusion_only_for_2x2_stride_2_floor():
    """conv (+ activation) + max_pool2d is one step for 2x2 windows of stride 2 without padding
    (odd sizes: floor); 3x3 windows, padding, ceil mode with odd sizes stay separate steps.
    Each gives the eager bits."""
    native_or_skip()
    w, b = t(f32(8, 3, 3, 3)), t(f32(8))
    for xs, pool_kw, fused in [((1, 3, 15, 13), {}, True),
                               ((1, 3, 14, 14), {"padding": 1}, False),
                               ((1, 3, 15, 15), {"ceil_mode": True}, False),
                               ((1, 3, 14, 14), {"ceil_mode": True}, True),
                               ((1, 3, 14, 14), {"kernel_size": 3, "stride": 2}, False)]:
        kw = dict({"kernel_size": 2, "stride": 2}, **pool_kw)
        for act in (True, False):
            def fn(x, _kw=kw, _act=act):
                y = ember.conv2d(x, w, b, padding=1)
                return ember.max_pool2d(ember.relu(y) if _act else y, **_kw)
            x = t(f32(*xs))
            f = ember.compile(fn)
            got = [f(x).numpy() for _ in range(3)]
            fast = f.plan_for(x).fast
            assert fast.conv_pool == int(fused), (xs, kw, act, [(o.name, o.act, o.pool) for o in fast.ops])
            for g in got:
                np.testing.assert_array_equal(g, fn(x).numpy())


def test_plan_scalar_chain():
    """Two or more add / subtract / multiply / divide by scalar constants are one step: a new
    array, then in place (in place on the plan's own array where the input is one); the eager
    bits; a float16 input takes the recorded steps."""
    c1, c2, c3 = (ember.from_numpy(np.asarray(v, np.float32), device="numpy") for v in (0.25, 3.0, 1.5))

    def fn(x):
        y = ember.multiply(ember.divide(c2, ember.subtract(x, c1)), c3)        # 3 / (x - 0.25) * 1.5
        z = ember.add(ember.multiply(ember.relu(y), c3), c1)                    # on relu's own array
        return y, z
    a0 = f32(4, 5)
    x = t(a0.copy())
    f = ember.compile(fn)
    got = [[v.numpy() for v in f(x)] for _ in range(3)]
    fast = f.plan_for(x).fast
    names = [op.name for op in fast.ops]
    assert names.count("scalar_chain") == 2 and len(names) == 3, names
    assert fast.in_place == 1, [(op.name, op.inplace) for op in fast.ops]
    want = [v.numpy() for v in fn(x)]
    for g in got:
        for a, b in zip(g, want):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(x.numpy(), a0)                        # the input never written
    xh = x.to(dtype="float16")
    got16 = [[v.numpy() for v in f(xh)] for _ in range(2)][-1]
    for a, b in zip(got16, [v.numpy() for v in fn(xh)]):
        np.testing.assert_array_equal(a, b)


def test_plan_one_row_linear_relu_follows_weight_updates():
    """A one-row linear + relu is one step (ember_gemv, relu in its epilogue): the eager bits,
    library on and off, and the new weight after an optimizer step (Tensor._set_ swaps its buffer)."""
    from ember import nn
    ember.manual_seed(0)
    lin = nn.Linear(40, 24).to("numpy")
    opt = ember.optim.SGD(lin.parameters(), lr=0.5)

    @ember.compile
    def fwd(x):
        with ember.no_grad():
            return ember.relu(lin(x))
    x = t(f32(1, 40))
    for _ in range(3):
        fwd(x)
    ops = fwd.plan_for(x).fast.ops
    assert [(op.name, op.act) for op in ops] == [("linear", "relu")]
    for _ in range(2):
        with ember.no_grad():
            want = ember.relu(lin(x)).numpy()
        np.testing.assert_array_equal(fwd(x).numpy(), want)
        with nat.disabled(), ember.no_grad():
            np.testing.assert_array_equal(fwd(x).numpy(), ember.relu(lin(x)).numpy())
        loss = (lin(x) * lin(x)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
