"""The numpy backend's Winograd F(2x2, 3x3) convolution (numpy_nn._conv_winograd) against the
pure-Python backend and a float64 reference, with an error bound derived from the transforms;
which convolutions take it; its cache of transformed weights."""
from __future__ import annotations

import numpy as np
import pytest

import ember
import ember.native
from ember.backends import numpy_nn

rng = np.random.default_rng(11)
EPS32 = float(np.finfo(np.float32).eps)
_B = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)      # B^T
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
_A = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)                                    # A^T


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _pads(padding):
    return ((padding, padding), (padding, padding)) if isinstance(padding, int) else padding


def reference(x, w, padding):
    """float64 convolution by shifted views (independent of any transform)."""
    (pt, pb), (pl, pr) = _pads(padding)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.float64))
    return y


def winograd_bound(x, w, padding):
    """Per output, a bound on F(2x2, 3x3)'s float32 rounding error: the algorithm run on |d|,
    |g| with |B|, |G|, |A| (in float64) bounds every intermediate's magnitude, M_abs; each output
    passes through at most 2 roundings in B^T d B, 1 in G g G^T (rounded once from float64), 1
    product, C - 1 in the channel sum (any order) and 4 in A^T M A, so |error| <= (C + 8) *
    eps32 * M_abs (to first order)."""
    (pt, pb), (pl, pr) = _pads(padding)
    n, c, h, wd = x.shape
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    xp = np.zeros((n, c, 2 * th + 2, 2 * tw + 2))
    xp[:, :, pt:pt + h, pl:pl + wd] = np.abs(x)
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (4, 4), axis=(2, 3))[:, :, ::2, ::2]   # (n, c, th, tw, 4, 4)
    v = np.einsum("ia,nctuab,jb->nctuij", np.abs(_B), tiles, np.abs(_B))
    u = np.einsum("ia,ocab,jb->ocij", np.abs(_G), np.abs(w.astype(np.float64)), np.abs(_G))
    m = np.einsum("ocij,nctuij->notuij", u, v)
    y = np.einsum("ai,notuij,bj->notaub", np.abs(_A), m, np.abs(_A)).reshape(n, w.shape[0], 2 * th, 2 * tw)
    return (c + 8) * EPS32 * y[:, :, :oh, :ow]


@pytest.fixture
def everywhere(monkeypatch):
    """Every 3x3 stride-1 float32 groups-1 convolution takes the Winograd path (the native rows
    kernel, which takes such convolutions first where the library is loaded, left out)."""
    monkeypatch.setattr(numpy_nn, "_NATIVE_ROWS_MIN_PIXELS", 1 << 62)
    monkeypatch.setattr(numpy_nn, "_WINO_MIN_CHANNELS", 1)
    monkeypatch.setattr(numpy_nn, "_WINO_MAX_OUT_PER_IN", 1000)
    monkeypatch.setattr(numpy_nn, "_WINO_MIN_PIXELS", 1)
    monkeypatch.setattr(numpy_nn, "_WINO_MIN_VALUES", 1)
    seen = []
    real = numpy_nn._conv_winograd
    monkeypatch.setattr(numpy_nn, "_conv_winograd", lambda *a: seen.append(a[0].shape) or real(*a))
    return seen


CASES = [
    # (x shape, w shape, padding, tile rows per band: None = the default rule)
    ((1, 5, 8, 8), (3, 5), 1, None),
    ((2, 4, 7, 9), (6, 4), 1, None),                           # odd output: one extra row / column cropped
    ((1, 3, 9, 6), (2, 3), ((2, 0), (1, 3)), None),            # asymmetric padding
    ((1, 3, 6, 7), (4, 3), 0, None),                           # no padding
    ((1, 2, 3, 3), (2, 2), 0, None),                           # one output
    ((2, 3, 1, 5), (2, 3), 1, None),                           # one input row
    ((1, 4, 12, 10), (3, 4), ((0, 2), (2, 0)), 1),             # a band per tile row
    ((2, 3, 11, 7), (5, 3), 1, None),                          # bands of 4 tile rows, the last short, 2 images
    ((1, 96, 30, 40), (24, 96), 1, None),                      # PP-OCR det's shape
    ((1, 64, 22, 18), (16, 64), 1, 3),                         # bands of 3 tile rows, the last short
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,padding,band", CASES, ids=[f"{x}-{w}-{p}-{b}" for x, w, p, b in CASES])
def test_winograd_against_python_and_float64(xs, ws, padding, band, bias, everywhere, monkeypatch):
    if band is not None:
        monkeypatch.setattr(numpy_nn, "_WINO_BAND_MIN_ROWS", band)
        monkeypatch.setattr(numpy_nn, "_WINO_BAND_BYTES", 0)
    x, w = f32(*xs), f32(*ws, 3, 3)
    b = f32(ws[0]) if bias else None
    args = [x, w] + ([b] if bias else [])
    out = {}
    for dev in ("numpy", "python"):
        out[dev] = ember.conv2d(*[ember.from_numpy(a, device=dev) for a in args], padding=padding).numpy()
    assert everywhere == [xs]                                   # (the numpy run took the path)
    want = reference(x, w, padding) + (b.reshape(1, -1, 1, 1) if bias else 0)
    assert out["numpy"].shape == want.shape
    err = np.abs(out["numpy"] - want)
    bound = winograd_bound(x, w, padding) + (EPS32 * np.abs(want) if bias else 0)
    assert (err <= bound).all(), float((err / bound).max())
    np.testing.assert_allclose(out["numpy"], out["python"], rtol=1e-5, atol=1e-6 * max(1.0, np.abs(want).max()))


def test_winograd_error_like_im2col_on_a_large_sum():
    """On PP-OCR det's 96 -> 24 shape the transform's error relative to the largest output
    stays at float32 rounding, no worse than twice im2col's (measured: smaller)."""
    x = rng.random((1, 96, 30, 40), dtype=np.float32)
    w = (rng.standard_normal((24, 96, 3, 3)) * 0.1).astype(np.float32)
    want = reference(x, w, 1)
    scale = np.abs(want).max()
    got = numpy_nn._conv_winograd(x, w, ((1, 1), (1, 1)))
    ap = numpy_nn._padded(x, ((1, 1), (1, 1)))
    im2col = numpy_nn._conv_tiled(ap, w.reshape(24, -1), 30, 40, 3, 3, (1, 1), (1, 1))
    e_wino = np.abs(got - want).max() / scale
    e_cols = np.abs(im2col - want).max() / scale
    assert e_wino < 4e-6 and e_wino <= 2 * e_cols, (e_wino, e_cols)


@pytest.mark.parametrize("xs,ws,kw,taken", [
    ((1, 96, 120, 160), (24, 96, 3, 3), {"padding": 1}, True),       # PP-OCR det
    ((1, 96, 15, 20), (24, 96, 3, 3), {"padding": 1}, True),
    ((1, 128, 12, 12), (64, 128, 3, 3), {"padding": 1}, True),
    ((1, 64, 14, 14), (64, 64, 3, 3), {"padding": 1}, False),        # too few values
    ((1, 256, 7, 7), (256, 256, 3, 3), {"padding": 1}, False),       # too few pixels
    ((1, 64, 28, 28), (128, 64, 3, 3), {"padding": 1}, True),
    ((1, 64, 28, 28), (192, 64, 3, 3), {"padding": 1}, False),       # over twice as many outputs
    ((1, 32, 56, 56), (32, 32, 3, 3), {"padding": 1}, False),        # few channels
    ((1, 96, 30, 40), (24, 96, 3, 3), {"padding": 1, "stride": 2}, False),
    ((1, 96, 30, 40), (24, 96, 3, 3), {"padding": 2, "dilation": 2}, False),
    ((1, 96, 30, 40), (24, 48, 3, 3), {"padding": 1, "groups": 2}, False),
    ((1, 96, 30, 40), (24, 96, 5, 5), {"padding": 2}, False),
])
def test_winograd_taken_where_it_measured_faster(xs, ws, kw, taken, monkeypatch):
    monkeypatch.setattr(numpy_nn, "_NATIVE_ROWS_MIN_PIXELS", 1 << 62)   # (the numpy paths' choice)
    seen = []
    real = numpy_nn._conv_winograd
    monkeypatch.setattr(numpy_nn, "_conv_winograd", lambda *a: seen.append(1) or real(*a))
    x = ember.from_numpy(f32(*xs), device="numpy")
    ember.conv2d(x, ember.from_numpy(f32(*ws), device="numpy"), **kw)
    assert bool(seen) == taken
    if taken:                                                   # float16 keeps im2col
        seen.clear()
        ember.conv2d(x.to(dtype="float16"), ember.from_numpy(f32(*ws), device="numpy").to(dtype="float16"), **kw)
        assert not seen


def test_transformed_weights_follow_the_weight_buffer(everywhere, monkeypatch):
    """The cache of transformed weights is keyed by the weight's buffer object: a new weight
    (also one whose buffer reuses a dead one's id), an optimizer step (which swaps in a new
    buffer) and a full cache all give the current weight's result."""
    x = f32(1, 4, 6, 6)
    xt = ember.from_numpy(x, device="numpy")
    for _ in range(3):
        w = f32(3, 4, 3, 3)
        wt = ember.from_numpy(w, device="numpy")
        for _ in range(2):
            got = ember.conv2d(xt, wt, padding=1).numpy()
            np.testing.assert_allclose(got, reference(x, w, 1), rtol=1e-5, atol=1e-5)
        del wt
    monkeypatch.setattr(numpy_nn, "_DERIVED_BYTES", 16 * 3 * 4 * 4 + 1)   # room for one weight
    ws = [f32(3, 4, 3, 3) for _ in range(3)]
    wts = [ember.from_numpy(w, device="numpy") for w in ws]
    for w, wt in zip(ws * 2, wts * 2):
        np.testing.assert_allclose(ember.conv2d(xt, wt, padding=1).numpy(), reference(x, w, 1), rtol=1e-5, atol=1e-5)
    assert len(numpy_nn._DERIVED) == 1
    monkeypatch.setattr(numpy_nn, "_DERIVED_BYTES", 1 << 20)
    keep = wts[0]
    del ws, wts, wt
    ember.conv2d(xt, keep, padding=1)
    import gc
    gc.collect()
    for _ in range(5):                                          # weights that die after one use
        ember.conv2d(xt, ember.from_numpy(f32(3, 4, 3, 3), device="numpy"), padding=1)
        gc.collect()
    assert len(numpy_nn._DERIVED) == 2 and (id(keep._buf), "winograd") in numpy_nn._DERIVED   # (dead entries gone)

    from ember import nn
    ember.manual_seed(0)
    conv = nn.Conv2d(4, 4, 3, padding=1).to("numpy")
    opt = ember.optim.SGD(conv.parameters(), lr=0.01)

    @ember.compile
    def fwd(t):
        with ember.no_grad():
            return conv(t)
    for _ in range(3):
        fwd(xt)
    for _ in range(2):
        before = fwd(xt).numpy()
        loss = (conv(xt) * conv(xt)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        w, b = conv.weight.numpy(), conv.bias.numpy()
        got = fwd(xt).numpy()
        assert not np.array_equal(got, before)
        want = reference(x, w, 1) + b.reshape(1, -1, 1, 1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_non_finite_inputs_propagate_like_a_direct_sum(everywhere, monkeypatch):
    """A NaN or infinity in the input reaches only the outputs whose windows read it (Winograd's
    transforms would spread it over whole tiles as NaN: the result is then made by im2col), and
    transforms that overflow fall back too: NaN / inf positions equal the python backend's."""
    x = f32(1, 4, 9, 10)
    x[0, 1, 4, 5] = np.nan
    x[0, 2, 0, 0] = np.inf
    x[0, 3, 8, 9] = -np.inf
    w = f32(3, 4, 3, 3)
    got, want = (ember.conv2d(ember.from_numpy(x, device=d), ember.from_numpy(w, device=d), padding=1).numpy()
                 for d in ("numpy", "python"))
    assert everywhere                                           # (Winograd was tried)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want))
    assert np.isfinite(got).sum() > got.size // 2
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-5)
    # finite inputs whose tile transforms overflow float32 while every direct sum stays finite
    big = np.zeros((1, 1, 4, 4), np.float32)
    big[0, 0, :, 0] = 3e38
    wb = np.zeros((1, 1, 3, 3), np.float32)
    wb[0, 0, 1, 1] = 0.5
    got = ember.conv2d(ember.from_numpy(big, device="numpy"), ember.from_numpy(wb, device="numpy")).numpy()
    np.testing.assert_array_equal(got, big[:, :, 1:3, 1:3] * np.float32(0.5))


def test_depthwise_taps_weights_follow_the_weight_buffer():
    """The channels-last depthwise path keeps its tiled weights per weight buffer too (_derived):
    each new weight, also one that reuses a dead buffer's id, gives its own result. (The numpy
    path: the native depthwise kernel, where it is loaded, takes this case first.)"""
    x = f32(1, 416, 6, 7)
    xt = {d: ember.from_numpy(x, device=d) for d in ("numpy", "python")}
    for _ in range(3):
        w = f32(416, 1, 5, 5)
        with ember.native.disabled():
            got, want = (ember.conv2d(xt[d], ember.from_numpy(w, device=d), padding=2, groups=416).numpy()
                         for d in ("numpy", "python"))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert any(k[1][0] == "taps" for k in numpy_nn._DERIVED)


def test_derived_weights_never_outlive_their_buffer():
    """numpy_nn._derived hands back a kept array only for the very buffer object it was made
    from: arrays made one after the other (CPython often gives the new one the dead one's id)
    each get their own."""
    ids = set()
    for i in range(20):
        a = np.full(4, float(i), np.float32)
        ids.add(id(a))
        np.testing.assert_array_equal(numpy_nn._derived(a, "test", lambda w: w * 2), np.full(4, 2.0 * i))
        np.testing.assert_array_equal(numpy_nn._derived(a, "test", lambda w: w * 3), np.full(4, 2.0 * i))  # kept
        del a
    assert len(ids) < 20                                        # (an id was reused: the case above)
