"""The native dense convolution (core/native/dense.c, numpy_nn._conv_dense_native): a packed-weight
product by the input (1x1) or its im2col columns, the bias and an activation in the epilogue,
against float64 references, with the library on and off (``ember.native.disabled()``): column
tails of every length, row panels past O, batches, non-contiguous inputs, the activations (NaN
kept), the same bits on any number of column ranges, the cases left to numpy, and the C entry
point's refusals."""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_nn

rng = np.random.default_rng(7)
P, I64 = ctypes.c_void_p, ctypes.c_int64


def native_or_skip():
    if nat.lib() is None:
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")


def reference(x, w, b, stride, pad):
    """The convolution as a float64 product of the zero-padded input's windows."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), ((pt, pb), (pl, pr)) = stride, pad
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x64
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("oc,nchw->nohw", w64[:, :, i, j], xp[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw])
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def tolerance(x, w, b):
    k = w[0].size
    scale = np.abs(x).max() * np.abs(w).max() * k + (0 if b is None else np.abs(b).max())
    return 4 * np.finfo(np.float32).eps * (k + 1) * scale


def conv(x, w, b, stride, pad):
    t = lambda a: ember.from_numpy(a, device="numpy")   # noqa: E731
    (pt, pb), (pl, pr) = pad
    return ember.conv2d(t(x), t(w), None if b is None else t(b), stride=stride,
                        padding=((pt, pb), (pl, pr))).numpy()


CASES = [  # (n, c, h, w, o, k, stride, pad)
    (1, 16, 56, 56, 72, 1, (1, 1), ((0, 0), (0, 0))),        # MobileNet's 1x1, 3136 columns
    (1, 48, 14, 14, 288, 1, (1, 1), ((0, 0), (0, 0))),       # 196 columns: a 4-column tail
    (1, 20, 13, 17, 9, 1, (1, 1), ((0, 0), (0, 0))),         # 221 columns, 9 rows (a panel of 1)
    (2, 17, 15, 11, 13, 1, (1, 1), ((0, 0), (0, 0))),        # batch 2
    (1, 3, 64, 64, 16, 3, (2, 2), ((1, 1), (1, 1))),         # a first conv: im2col, K = 27
    (1, 4, 40, 33, 20, 3, (1, 1), ((1, 0), (2, 1))),         # asymmetric padding, K = 36
    (2, 2, 36, 36, 5, 5, (1, 2), ((2, 2), (2, 2))),          # 5x5, stride (1, 2)
    (1, 3, 75, 81, 16, 3, (2, 2), ((1, 1), (1, 1))),         # odd sizes, stride 2 (vector deinterleave + edges)
    (1, 3, 70, 70, 8, 3, (3, 3), ((0, 2), (1, 0))),          # stride 3 (scalar gather)
    (1, 1, 64, 64, 16, 3, (1, 1), ((4, 4), (4, 4))),         # padding larger than the kernel
    (1, 40, 40, 33, 12, 3, (1, 1), ((1, 1), (1, 1))),        # K = 360, stride 1: ember_conv_rows (33: a 1-lane tail)
    (2, 64, 36, 40, 24, 3, (1, 1), ((1, 1), (1, 1))),        # Winograd's kind of case, batch 2: rows too
    (1, 12, 40, 50, 9, 5, (1, 1), ((2, 1), (0, 3))),         # 5x5, asymmetric padding: rows
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("native", [True, False])
def test_conv2d_on_and_off(case, bias, native):
    n, c, h, wd, o, k, stride, pad = case
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if bias else None
    if native:
        native_or_skip()
        y = conv(x, w, b, stride, pad)
    else:
        with nat.disabled():
            y = conv(x, w, b, stride, pad)
    ref = reference(x, w, b, stride, pad)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.abs(y - ref).max() <= tolerance(x, w, b)


def test_native_taken_where_it_applies(monkeypatch):
    native_or_skip()
    calls = []
    real = numpy_nn._conv_dense_native

    def spy(*a, **kw):
        y = real(*a, **kw)
        calls.append(y is not None)
        return y
    monkeypatch.setattr(numpy_nn, "_conv_dense_native", spy)
    x = rng.standard_normal((1, 16, 56, 56)).astype(np.float32)
    conv(x, rng.standard_normal((8, 16, 1, 1)).astype(np.float32), None, (1, 1), ((0, 0), (0, 0)))
    conv(x[:, :, :2, :2], rng.standard_normal((8, 16, 1, 1)).astype(np.float32), None, (1, 1), ((0, 0), (0, 0)))
    with nat.disabled():
        conv(x, rng.standard_normal((8, 16, 1, 1)).astype(np.float32), None, (1, 1), ((0, 0), (0, 0)))
    assert calls == [True, False, False]     # (4 columns: the BLAS path; disabled: None)


def direct(x, w, b, act=None, args=(0, 0, 0, 0), k=1, stride=(1, 1), pad=((0, 0), (0, 0))):
    n, c, h, wd = x.shape
    oh, ow = (h + sum(pad[0]) - k) // stride[0] + 1, (wd + sum(pad[1]) - k) // stride[1] + 1
    return numpy_nn._conv_dense_native(x, w, b, oh, ow, k, k, stride, pad, (1, 1), act, args)


@pytest.mark.parametrize("cols", [9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 200])
@pytest.mark.parametrize("o", [1, 7, 8, 9, 16, 17])
def test_column_tails_and_row_panels(cols, o):
    """1x1 (ember_conv_gemm) and 3x3 (ember_conv_direct: blocks across output rows) at every tail."""
    native_or_skip()
    old, old3 = numpy_nn._NATIVE_DENSE_MIN_PIXELS, numpy_nn._NATIVE_DIRECT_MIN_PIXELS
    numpy_nn._NATIVE_DENSE_MIN_PIXELS = 1
    try:
        x = rng.standard_normal((1, 19, 1, cols)).astype(np.float32)
        w = rng.standard_normal((o, 19, 1, 1)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        y = direct(x, w, b)
        numpy_nn._NATIVE_DIRECT_MIN_PIXELS = 1
        x3 = rng.standard_normal((1, 3, 3, cols)).astype(np.float32)       # 3 output rows of cols
        w3 = rng.standard_normal((o, 3, 3, 3)).astype(np.float32)
        y3 = direct(x3, w3, b, k=3, pad=((1, 1), (1, 1)))
    finally:
        numpy_nn._NATIVE_DENSE_MIN_PIXELS = old
        numpy_nn._NATIVE_DIRECT_MIN_PIXELS = old3
    ref = reference(x, w, b, (1, 1), ((0, 0), (0, 0)))
    assert np.abs(y - ref).max() <= tolerance(x, w, b)
    ref3 = reference(x3, w3, b, (1, 1), ((1, 1), (1, 1)))
    assert np.abs(y3 - ref3).max() <= tolerance(x3, w3, b)


def acts(v, act, a, b_, lo, hi):
    if act == "relu":
        return np.where(v < 0, 0, v)
    if act == "clip":
        return np.where(v < lo, lo, np.where(v > hi, hi, v))
    t = np.clip(v * a + b_, 0, 1)
    return t if act == "hard_sigmoid" else v * t


@pytest.mark.parametrize("act", ["relu", "clip", "hard_sigmoid", "hard_swish"])
def test_activation_epilogue(act):
    native_or_skip()
    x = rng.standard_normal((1, 24, 20, 20)).astype(np.float32)
    tol = 2 * tolerance(x, w := rng.standard_normal((20, 24, 1, 1)).astype(np.float32), b := rng.standard_normal(20).astype(np.float32))
    x[0, :, 3, 4] = np.nan                        # (one column NaN: NaN out, whatever the activation)
    args = (1 / 6, 0.5, -0.75, 1.5)
    y = direct(x, w, b, act, args)
    ref = acts(reference(x, w, b, (1, 1), ((0, 0), (0, 0))), act, *args)
    assert np.isnan(y[0, :, 3, 4]).all()
    ok = ~np.isnan(ref)
    assert np.isnan(y[~ok]).all()
    assert np.abs(y[ok] - ref[ok]).max() <= tol


def test_same_bits_on_any_ranges():
    native_or_skip()
    x = rng.standard_normal((1, 32, 40, 41)).astype(np.float32)
    w = rng.standard_normal((40, 32, 1, 1)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    old = numpy_nn._NATIVE_DENSE_PARALLEL_MACS, numpy_nn._NATIVE_DENSE_RANGES_PER_THREAD
    try:
        numpy_nn._NATIVE_DENSE_PARALLEL_MACS = 1 << 40
        one = direct(x, w, b)
        for ranges in (1, 3, 50):
            numpy_nn._NATIVE_DENSE_PARALLEL_MACS, numpy_nn._NATIVE_DENSE_RANGES_PER_THREAD = 1, ranges
            assert np.array_equal(direct(x, w, b), one)
    finally:
        numpy_nn._NATIVE_DENSE_PARALLEL_MACS, numpy_nn._NATIVE_DENSE_RANGES_PER_THREAD = old


def test_non_contiguous_input():
    native_or_skip()
    base = rng.standard_normal((1, 40, 30, 30)).astype(np.float32)
    x = base[:, ::2]                               # every other channel
    w = rng.standard_normal((24, 20, 1, 1)).astype(np.float32)
    y = direct(x, w, None)
    assert np.abs(y - reference(x, w, None, (1, 1), ((0, 0), (0, 0)))).max() <= tolerance(x, w, None)
    xt = np.ascontiguousarray(base[:, :20].transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    y = direct(xt, w, None)
    assert np.abs(y - reference(xt, w, None, (1, 1), ((0, 0), (0, 0)))).max() <= tolerance(xt, w, None)


def test_cases_left_to_numpy():
    native_or_skip()
    x = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    assert direct(x.astype(np.float64), rng.standard_normal((8, 64, 1, 1)), None) is None       # float64
    assert direct(x, rng.standard_normal((8, 64, 1, 1)).astype(np.float32), None, stride=(2, 2)) is None \
        or True   # (strided 1x1 goes through im2col: taken or not by size)
    w3 = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    x3 = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    assert direct(x3, w3, None, k=3, pad=((1, 1), (1, 1))) is None                              # 400 pixels
    assert direct(x3, w3, None, k=3, stride=(2, 2), pad=((1, 1), (1, 1))) is None   # K = 576, stride 2: im2col
    small = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
    assert direct(small, rng.standard_normal((8, 8, 1, 1)).astype(np.float32), None) is None    # K < 16


def test_c_refusals():
    native_or_skip()
    fn = nat.kernel("ember_conv_gemm", I64, P, P, P, P, P, P, I64, I64)
    wp = np.zeros((1, 4, 8), np.float32)
    x = np.ones((4, 10), np.float32)
    y = np.full((3, 10), 7.0, np.float32)
    ap = np.zeros(4, np.float32)
    for geom, n0, n1 in [([0, 4, 10, 10, 10, 0], 0, 10), ([3, 4, 10, 9, 10, 0], 0, 10),
                         ([3, 4, 10, 10, 10, 5], 0, 10), ([3, 4, 10, 10, 10, 0], 0, 11),
                         ([3, 4, 10, 10, 10, 0], 6, 5), ([3, 4, 10, 10, 10, -1], 0, 10)]:
        g = np.array(geom, np.int64)
        assert fn(wp.ctypes.data, x.ctypes.data, None, y.ctypes.data, g.ctypes.data, ap.ctypes.data, n0, n1) == -1
        assert (y == 7).all()


@pytest.mark.parametrize("view", ["channels", "transposed", "reversed"])
def test_direct_strided_inputs(view):
    """ember_conv_direct reads the input through its strides (column stride != 1: the scalar gather)."""
    native_or_skip()
    base = rng.standard_normal((1, 6, 70, 70)).astype(np.float32)
    x = {"channels": base[:, ::2], "transposed": base[:, :3].transpose(0, 1, 3, 2),
         "reversed": base[:, :3, ::-1, ::-1]}[view]
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    for stride in ((1, 1), (2, 2)):
        y = direct(x, w, b, k=3, stride=stride, pad=((1, 1), (1, 1)))
        assert y is not None
        ref = reference(x, w, b, stride, ((1, 1), (1, 1)))
        assert np.abs(y - ref).max() <= tolerance(x, w, b)


@pytest.mark.parametrize("act, args", [("relu", (0, 0, 0, np.inf)), ("clip", (0, 0, -0.5, 6.0)),
                                       ("clip", (0, 0, -np.inf, 0.25)), ("hard_sigmoid", (1 / 6, 0.5, 0, 1)),
                                       ("hard_swish", (1 / 6, 0.5, 0, 1)), ("hard_sigmoid", (0.2, 0.5, 0, 1))])
@pytest.mark.parametrize("size", [1, 15, 16, 17, 1000])
@pytest.mark.filterwarnings("ignore:invalid value")
def test_activation_pass_same_bits_as_numpy_steps(act, args, size):
    """numpy_nn.activation_ (dense.c's ember_activation where loaded) gives the bits of the plan's
    separate numpy steps: clip / multiply, add, clip, multiply, each rounded (no fused multiply-add),
    NaN, infinities and -0 as numpy's clip treats them."""
    v = (rng.standard_normal(size) * 8).astype(np.float32)
    v[: min(size, 6)] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0000002], np.float32)[: min(size, 6)]
    a, b, lo, hi = (np.float32(t) for t in args)
    want = v.copy()
    if act in ("relu", "clip"):
        want = numpy_nn.clip(want, lo, hi)
    else:
        t = want * a
        t += b
        numpy_nn.clip(t, np.float32(0), np.float32(1), out=t)
        want = want * t if act == "hard_swish" else t
    got = numpy_nn.activation_(v.copy(), act, args)
    with nat.disabled():
        off = numpy_nn.activation_(v.copy(), act, args)
    for y in (got, off):
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y.view(np.int32), want.view(np.int32))   # (bits: -0 and NaN too)


def test_repeated_calls_reuse_the_packing_and_follow_new_buffers():
    """A 1x1 convolution seen before runs from the kept packing and addresses (numpy_nn._DENSE_CALLS):
    the same bits; another weight or bias buffer, or the library disabled, is not served from it."""
    native_or_skip()
    x = rng.standard_normal((1, 24, 15, 15)).astype(np.float32)
    w = rng.standard_normal((40, 24, 1, 1)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    first = direct(x, w, b, "relu", (0, 0, 0, np.inf))
    assert any(k[0] == id(w) for k in numpy_nn._DENSE_CALLS)
    again = direct(x, w, b, "relu", (0, 0, 0, np.inf))
    assert np.array_equal(first, again)
    ref = np.maximum(reference(x, w, b, (1, 1), ((0, 0), (0, 0))), 0)
    assert np.abs(again - ref).max() <= tolerance(x, w, b)
    w2 = -w                                              # another buffer (the key's id may be reused)
    b2 = b + 1
    y2 = direct(x, w2, b2, "relu", (0, 0, 0, np.inf))
    assert np.abs(y2 - np.maximum(reference(x, w2, b2, (1, 1), ((0, 0), (0, 0))), 0)).max() <= tolerance(x, w2, b2)
    with nat.disabled():
        assert direct(x, w, b, "relu", (0, 0, 0, np.inf)) is None


def test_rows_kernel_dilation_and_refusals():
    """ember_conv_rows with dilation (reference: the dilated kernel as a zero-filled dense one), and
    the C entry point's refusals (a padded input too small for the taps)."""
    native_or_skip()
    x = rng.standard_normal((1, 30, 40, 44)).astype(np.float32)
    w = rng.standard_normal((10, 30, 3, 3)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    pad = ((2, 2), (2, 2))
    y = numpy_nn._conv_dense_native(x, w, b, 40, 44, 3, 3, (1, 1), pad, (2, 2))
    wd = np.zeros((10, 30, 5, 5), np.float32)
    wd[:, :, ::2, ::2] = w
    ref = reference(x, wd, b, (1, 1), pad)
    assert y is not None and np.abs(y - ref).max() <= tolerance(x, w, b)
    fn = nat.kernel("ember_conv_rows", I64, P, P, P, P, P, P, I64, I64)
    wp = np.zeros((1, 27, 8), np.float32)
    xp = np.ones((3, 10, 10), np.float32)
    out = np.full((2, 8, 8), 7.0, np.float32)
    ap = np.zeros(4, np.float32)
    for geom, r0, r1 in [([3, 10, 10, 2, 9, 8, 3, 3, 1, 1, 0], 0, 9), ([3, 10, 10, 2, 8, 8, 3, 3, 2, 1, 0], 0, 8),
                         ([3, 10, 10, 2, 8, 8, 3, 3, 1, 1, 0], 0, 9), ([3, 10, 10, 2, 8, 8, 3, 3, 1, 1, 7], 0, 8)]:
        g = np.array(geom, np.int64)
        assert fn(wp.ctypes.data, xp.ctypes.data, None, out.ctypes.data, g.ctypes.data, ap.ctypes.data, r0, r1) == -1
        assert (out == 7).all()


# ---- ember_gemv: 1x1 convolutions at one pixel (squeeze-excite) and one-row linears ---------------

GEMV_SHAPES = [(1, 1), (5, 3), (15, 4), (16, 8), (17, 9), (33, 5), (96, 24), (144, 576), (576, 144), (1024, 1000)]


@pytest.mark.parametrize("c,o", GEMV_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("native", [True, False])
def test_gemv_conv_and_linear_on_and_off(c, o, bias, native):
    """A 1x1 convolution at one pixel and a linear of one row, against float64, library on and off;
    with the library on, the kernel really runs (every K tail 1..16 and row remainder 0..3 above)."""
    if native:
        native_or_skip()
    t = lambda a: ember.from_numpy(a, device="numpy")   # noqa: E731
    x = rng.standard_normal((1, c)).astype(np.float32)
    w = rng.standard_normal((o, c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if bias else None
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b.astype(np.float64))
    tol = tolerance(x, w, b)
    with contextlib.nullcontext() if native else nat.disabled():
        for _ in range(2):                                 # (the second conv call: from _DENSE_CALLS)
            yc = conv(x.reshape(1, c, 1, 1), w.reshape(o, c, 1, 1), b, (1, 1), ((0, 0), (0, 0)))
            assert yc.shape == (1, o, 1, 1) and yc.dtype == np.float32
            assert np.abs(yc.reshape(1, o) - ref).max() <= tol
        yl = ember.linear(t(x), t(w), None if b is None else t(b)).numpy()
        assert yl.shape == (1, o) and np.abs(yl - ref).max() <= tol
        taken = numpy_nn._gemv_native(w, x[0], b)
        assert (taken is not None) == native
    if native:
        assert np.array_equal(taken, yl[0])


@pytest.mark.parametrize("act", ["relu", "clip", "hard_sigmoid", "hard_swish"])
@pytest.mark.parametrize("o", [1, 15, 16, 17, 144])
def test_gemv_activation_epilogue_same_bits_as_the_pass(act, o):
    """The epilogue (+ bias, then the activation) rounds as numpy's separate steps: the same bits as
    the product without it, + bias in numpy, then the activation pass; NaN rows stay NaN."""
    native_or_skip()
    c = 37
    x = rng.standard_normal(c).astype(np.float32)
    w = rng.standard_normal((o, c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    tol = 2 * tolerance(x[None], w, b)
    if o > 1:
        w[o // 2, 3] = np.nan                         # (one row NaN: NaN out, whatever the activation)
    args = (1 / 6, 0.5, -0.75, 1.5)
    y = numpy_nn._gemv_native(w, x, b, act, args)
    plain = numpy_nn._gemv_native(w, x, None)
    plain += b
    with nat.disabled():
        want = numpy_nn.activation_(plain, act, args)
    np.testing.assert_array_equal(y, want)
    assert o == 1 or np.isnan(y[o // 2])
    ref = acts(w.astype(np.float64) @ x.astype(np.float64) + b, act, *args)
    ok = ~np.isnan(ref)
    assert np.abs(y[ok] - ref[ok]).max() <= tol


def test_gemv_same_bits_on_any_row_range_and_refusals():
    native_or_skip()
    fn = nat.kernel("ember_gemv", I64, P, P, P, P, P, P, I64, I64)
    m, k = 23, 45
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    ap = np.array((1 / 6, 0.5, 0, 1), np.float32)
    g = np.array([m, k, 1, 1, 1, 4], np.int64)
    whole = np.empty(m, np.float32)
    assert fn(w.ctypes.data, x.ctypes.data, b.ctypes.data, whole.ctypes.data, g.ctypes.data, ap.ctypes.data, 0, m) == 0
    parts = np.full(m, np.nan, np.float32)
    for o0, o1 in ((0, 1), (1, 6), (6, 6), (6, 19), (19, 23)):
        assert fn(w.ctypes.data, x.ctypes.data, b.ctypes.data, parts.ctypes.data, g.ctypes.data, ap.ctypes.data,
                  o0, o1) == 0
    np.testing.assert_array_equal(parts, whole)
    y = np.full(m, 7.0, np.float32)
    for geom, o0, o1 in [([0, k, 1, 1, 1, 0], 0, 0), ([m, 0, 1, 1, 1, 0], 0, m), ([m, k, 2, 1, 1, 0], 0, m),
                         ([m, k, 1, 1, 1, 5], 0, m), ([m, k, 1, 1, 1, -1], 0, m), ([m, k, 1, 1, 1, 0], 0, m + 1),
                         ([m, k, 1, 1, 1, 0], 5, 4), ([m, k, 1, 1, 1, 0], -1, 3)]:
        gg = np.array(geom, np.int64)
        assert fn(w.ctypes.data, x.ctypes.data, None, y.ctypes.data, gg.ctypes.data, ap.ctypes.data, o0, o1) == -1
    assert (y == 7).all()
    # left to numpy / BLAS: other dtypes, mismatched shapes, products above _NATIVE_GEMV_MAX_MACS
    assert numpy_nn._gemv_native(w.astype(np.float64), x, None) is None
    assert numpy_nn._gemv_native(w, x[:-1], None) is None
    assert numpy_nn._gemv_native(w, x, b[:-1]) is None
    old = numpy_nn._NATIVE_GEMV_MAX_MACS
    try:
        numpy_nn._NATIVE_GEMV_MAX_MACS = m * k - 1
        assert numpy_nn._gemv_native(w, x, None) is None
    finally:
        numpy_nn._NATIVE_GEMV_MAX_MACS = old


def test_gemv_strided_operands():
    """A transposed weight (the linear's w.T view of another matrix) and a strided row are copied."""
    native_or_skip()
    w = np.ascontiguousarray(rng.standard_normal((40, 30)).astype(np.float32).T)[:, ::2]   # (30, 20) strided
    x = rng.standard_normal((2, 20)).astype(np.float32)[:, ::1][0]
    xs = rng.standard_normal(40).astype(np.float32)[::2]
    for xx in (x, xs):
        y = numpy_nn._gemv_native(w, xx, None)
        assert np.abs(y - w.astype(np.float64) @ xx.astype(np.float64)).max() <= tolerance(xx[None], w, None)
