"""The native depthwise convolution (core/native/conv.c, numpy_nn._conv_depthwise_native) against a
float64 direct sum, with the library on and off (``ember.native.disabled()``): every stride,
padding (asymmetric too), dilation, multiplier and kernel size, planes smaller than the kernel,
batches, non-contiguous and oddly strided inputs, float16, NaN and infinities; the same bits on
any number of threads; the scratch retry; the cases the kernel refuses; and the typed errors of
bad shapes, which are the numpy backend's either way."""
from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_nn

rng = np.random.default_rng(11)


def native_or_skip():
    if nat.lib() is None:
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")


def out_size(size, k, s, d, pads):
    return (size + pads[0] + pads[1] - (k - 1) * d - 1) // s + 1


def reference(x, w, b, stride, pad, dil):
    """The depthwise convolution as a float64 direct sum over the zero-padded input."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    mult, (kh, kw) = w.shape[0] // c, w.shape[2:]
    (sh, sw), (dh, dw), ((pt, pb), (pl, pr)) = stride, dil, pad
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh, ow = out_size(h, kh, sh, dh, (pt, pb)), out_size(wd, kw, sw, dw, (pl, pr))
    y = np.zeros((n, c * mult, oh, ow))
    with np.errstate(invalid="ignore", over="ignore"):
        for o in range(c * mult):
            for i in range(kh):
                for j in range(kw):
                    y[:, o] += w[o, 0, i, j] * xp[:, o // mult, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                                                  j * dw:j * dw + (ow - 1) * sw + 1:sw]
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def tolerance(x, w, b):
    """float32 rounding of a sum of kh*kw products and the bias, relative to the largest terms."""
    kh, kw = w.shape[2:]
    scale = np.abs(x).max(initial=0) * np.abs(w).max() * kh * kw + (0 if b is None else np.abs(b).max())
    return 4 * np.finfo(np.float32).eps * (kh * kw + 1) * max(scale, 1e-30)


def direct(x, w, b, stride, pad, dil):
    """numpy_nn._conv_depthwise_native on numpy arrays (None where it does not run)."""
    c = x.shape[1]
    kh, kw = w.shape[2:]
    oh = out_size(x.shape[2], kh, stride[0], dil[0], pad[0])
    ow = out_size(x.shape[3], kw, stride[1], dil[1], pad[1])
    return numpy_nn._conv_depthwise_native(x, w, b, w.shape[0] // c, oh, ow, kh, kw, stride, pad, dil)


def through_ember(x, w, b, stride, pad, dil):
    t = [ember.from_numpy(a, device="numpy") for a in (x, w) + (() if b is None else (b,))]
    return ember.conv2d(*t, stride=stride, padding=pad, dilation=dil, groups=x.shape[1]).numpy()


KERNELS = [(1, 1), (1, 3), (3, 1), (2, 4), (3, 3), (5, 5), (7, 5)]
STRIDES = [(1, 1), (2, 2), (2, 1), (1, 3), (3, 2)]
DILATIONS = [(1, 1), (2, 1), (1, 3)]
PADS = [((0, 0), (0, 0)), ((1, 1), (1, 1)), ((2, 0), (0, 3)), ((0, 2), (3, 1)), ((4, 4), (4, 4))]
PLANES = [(1, 1), (2, 3), (5, 7), (7, 7), (9, 17), (14, 14), (13, 40)]


def grid():
    """(x shape, w shape, stride, padding, dilation) over the tables above (output sizes >= 1)."""
    out = []
    for (kh, kw), stride, dil, pad, (h, wd), mult in itertools.product(KERNELS, STRIDES, DILATIONS, PADS, PLANES,
                                                                        (1, 2)):
        if out_size(h, kh, stride[0], dil[0], pad[0]) < 1 or out_size(wd, kw, stride[1], dil[1], pad[1]) < 1:
            continue
        n, c = (2, 3) if mult == 1 else (1, 2)
        out.append(((n, c, h, wd), (c * mult, 1, kh, kw), stride, pad, dil))
    return out


GRID = grid()


@pytest.mark.parametrize("part", range(4))
def test_grid_against_float64(part):
    """Every combination in the tables (a quarter per case), the kernel called directly, with a
    bias on every other case."""
    native_or_skip()
    for k, (xs, ws, stride, pad, dil) in enumerate(GRID[part::4]):
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32) if k % 2 else None
        got = direct(x, w, b, stride, pad, dil)
        want = reference(x, w, b, stride, pad, dil)
        assert got is not None and got.shape == want.shape, (xs, ws, stride, pad, dil)
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance(x, w, b), err_msg=str((xs, ws, stride, pad, dil)))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("case", [
    ((1, 16, 28, 28), (16, 1, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),      # MobileNetV3's shapes
    ((1, 24, 14, 14), (24, 1, 5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    ((1, 40, 7, 7), (40, 1, 5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    ((1, 8, 12, 40), (8, 1, 5, 5), (2, 1), ((2, 2), (2, 2)), (1, 1)),        # PP-OCR rec's (2, 1)
    ((3, 4, 9, 10), (12, 1, 3, 5), (1, 2), ((0, 2), (3, 1)), (2, 1)),       # multiplier 3, batch 3
    ((2, 3, 2, 3), (3, 1, 5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),         # plane smaller than the kernel
    ((1, 5, 20, 33), (10, 1, 7, 5), (3, 2), ((3, 2), (1, 3)), (2, 3)),
])
def test_conv2d_op_native_on_and_off(case, native):
    """ember.conv2d on the numpy backend, with and without the library, against float64."""
    xs, ws, stride, pad, dil = case
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    if native:
        native_or_skip()
        got = through_ember(x, w, b, stride, pad, dil)
    else:
        with nat.disabled():
            got = through_ember(x, w, b, stride, pad, dil)
    np.testing.assert_allclose(got, reference(x, w, b, stride, pad, dil), rtol=0, atol=tolerance(x, w, b))


def test_conv2d_takes_the_native_path_only_when_loaded(monkeypatch):
    native_or_skip()
    calls = []
    real = numpy_nn._conv_depthwise
    monkeypatch.setattr(numpy_nn, "_conv_depthwise", lambda *a: calls.append(1) or real(*a))
    x = rng.standard_normal((1, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    y_native = through_ember(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1))
    assert calls == []
    with nat.disabled():
        y_numpy = through_ember(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1))
    assert calls == [1]
    np.testing.assert_allclose(y_native, y_numpy, rtol=0, atol=tolerance(x, w, None))


def strided_views():
    """Inputs that are not C-contiguous: transposed, every other channel, reversed rows and
    columns, a channel slice of a batch, and byte strides that are not whole float32 steps."""
    base = rng.standard_normal((2, 6, 11, 13)).astype(np.float32)
    raw = np.zeros(2 * 3 * 9 * 10 * 6 + 8, np.uint8)
    odd = np.ndarray((2, 3, 9, 10), np.float32, raw, 2, (3 * 9 * 10 * 6, 9 * 10 * 6, 10 * 6, 6))
    odd[...] = rng.standard_normal(odd.shape)
    return {"transposed": base.transpose(0, 1, 3, 2), "every other channel": base[:, ::2],
            "reversed": base[:, :, ::-1, ::-1], "channel slice": base[1:, 2:5, 1:, :-2],
            "byte strides of 6": odd}


@pytest.mark.parametrize("name", list(strided_views()))
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_non_contiguous_inputs(name, stride):
    native_or_skip()
    x = strided_views()[name]
    c = x.shape[1]
    w = rng.standard_normal((2 * c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(2 * c).astype(np.float32)
    pad = ((1, 2), (0, 1))
    got = direct(x, w, b, stride, pad, (1, 1))
    np.testing.assert_allclose(got, reference(np.array(x), w, b, stride, pad, (1, 1)), rtol=0,
                               atol=tolerance(np.array(x), w, b))


def test_same_bits_on_any_number_of_threads(monkeypatch):
    """Ranges split whole planes: one range or many, on one thread or two, the same bits."""
    native_or_skip()
    x = rng.standard_normal((2, 37, 23, 29)).astype(np.float32)
    w = rng.standard_normal((74, 1, 5, 5)).astype(np.float32)
    b = rng.standard_normal(74).astype(np.float32)
    args = (x, w, b, (2, 1), ((2, 1), (2, 3)), (1, 2))
    no_bias = (x, w, None) + args[3:]
    one, one_nb = direct(*args), direct(*no_bias)
    monkeypatch.setattr(numpy_nn, "_NATIVE_DW_PARALLEL_MACS", 0)
    for per_thread in (1, 3, 16, 100):
        monkeypatch.setattr(numpy_nn, "_NATIVE_DW_RANGES_PER_THREAD", per_thread)
        assert np.array_equal(direct(*args), one) and np.array_equal(direct(*no_bias), one_nb)
    np.testing.assert_allclose(one, reference(*args), rtol=0, atol=tolerance(x, w, b))


def test_scratch_grows_and_large_scratch_is_not_kept(monkeypatch):
    native_or_skip()
    monkeypatch.setattr(numpy_nn._native_scratch, "buf", None, raising=False)
    small = numpy_nn._scratch_for()
    monkeypatch.setattr(numpy_nn._native_scratch, "buf", (small[0][:8], small[1]))   # too small: the kernel asks
    x = rng.standard_normal((1, 3, 70, 90)).astype(np.float32)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    args = (x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1))
    np.testing.assert_allclose(direct(*args), reference(*args), rtol=0, atol=tolerance(x, w, None))
    assert numpy_nn._native_scratch.buf[0].size >= 72 * 90
    monkeypatch.setattr(numpy_nn, "_NATIVE_DW_KEEP", 16)
    monkeypatch.setattr(numpy_nn._native_scratch, "buf", None)
    np.testing.assert_allclose(direct(*args), reference(*args), rtol=0, atol=tolerance(x, w, None))
    assert numpy_nn._native_scratch.buf is None


def test_kernel_refuses_without_writing():
    """The C entry point itself: -1 for a geometry it does not take, the scratch size it needs
    when given too little, and in both cases the output untouched."""
    native_or_skip()
    fn = nat.kernel("ember_conv_depthwise", ctypes.c_int64, *[ctypes.c_void_p] * 6, ctypes.c_int64,
                    ctypes.c_int64, ctypes.c_int64)
    x = np.ones((1, 2, 6, 6), np.float32)
    w = np.ones((2, 1, 3, 3), np.float32)
    y = np.full((1, 2, 6, 6), 7.0, np.float32)
    sc = np.zeros(4096, np.float32)

    def call(geom, scratch_len):
        g = np.array(geom, np.int64)
        return fn(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, g.ctypes.data, sc.ctypes.data, scratch_len, 0, 2)
    good = [1, 2, 6, 6, 72, 36, 6, 1, 1, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1]
    for k, bad in ((11, 0), (13, 0), (15, -1), (14, 17), (2, 0)):          # kh 0, stride 0, dilation -1, sw 17, h 0
        geom = list(good)
        geom[k] = bad
        assert call(geom, sc.size) == -1
    need = call(good, 3)
    assert need > 3
    assert (y == 7.0).all()
    assert call(good, need) == 0
    np.testing.assert_allclose(y, reference(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1)), rtol=1e-6)


def test_cases_it_does_not_take_run_the_numpy_paths():
    """More than 256 taps, a column stride above 16, float64: None, and conv2d still right."""
    native_or_skip()
    x = rng.standard_normal((1, 2, 20, 40)).astype(np.float32)
    big = rng.standard_normal((2, 1, 17, 17)).astype(np.float32)
    assert direct(x, big, None, (1, 1), ((8, 8), (8, 8)), (1, 1)) is None
    np.testing.assert_allclose(through_ember(x, big, None, (1, 1), ((8, 8), (8, 8)), (1, 1)),
                               reference(x, big, None, (1, 1), ((8, 8), (8, 8)), (1, 1)), rtol=0,
                               atol=tolerance(x, big, None))
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    assert direct(x, w, None, (1, 17), ((1, 1), (1, 1)), (1, 1)) is None
    assert direct(x.astype(np.float64), w, None, (1, 1), ((1, 1), (1, 1)), (1, 1)) is None


def test_float16_nan_and_infinity():
    """float16 tensors compute in float32 (as the numpy paths); NaN and infinities reach the outputs
    whose windows hold them, as in the direct sum."""
    native_or_skip()
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 0, 0] = np.inf
    x[0, 2, 8, 8] = -np.inf
    w = np.abs(rng.standard_normal((4, 1, 3, 3))).astype(np.float32)
    pad = ((1, 1), (1, 1))
    got = through_ember(x, w, None, (1, 1), pad, (1, 1))
    want = reference(x, w, None, (1, 1), pad, (1, 1))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    h = rng.standard_normal((2, 3, 8, 8)).astype(np.float16)
    wh = rng.standard_normal((3, 1, 3, 3)).astype(np.float16)
    got = through_ember(h, wh, None, (2, 2), pad, (1, 1))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, reference(h, wh, None, (2, 2), pad, (1, 1)), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("shapes,kw", [
    (((1, 4, 8, 8), (4, 1, 3, 3)), {"groups": 3}),                      # channels not divisible by groups
    (((1, 4, 8, 8), (4, 2, 3, 3)), {"groups": 4}),                      # weight channels != C / groups
    (((1, 4, 8, 8), (6, 1, 3, 3)), {"groups": 4}),                      # outputs not a multiple of groups
    (((1, 4, 2, 2), (4, 1, 5, 5)), {"groups": 4}),                      # kernel larger than the padded input
    (((1, 4, 8, 8), (4, 1, 3)), {"groups": 4}),                         # 3-D weight
    (((1, 4, 8, 8), (4, 1, 3, 3)), {"groups": 4, "stride": 0}),
    (((1, 4, 8, 8), (4, 1, 3, 3)), {"groups": 4, "padding": -1}),
])
def test_bad_shapes_raise_the_same_typed_errors(shapes, kw):
    def err():
        with pytest.raises(Exception) as info:
            ember.conv2d(*[ember.from_numpy(np.ones(s, np.float32), device="numpy") for s in shapes], **kw)
        return type(info.value), str(info.value)
    with nat.disabled():
        off = err()
    on = err()
    assert on == off
    assert issubclass(on[0], ember.errors.EmberError), on


@pytest.mark.parametrize("with_bias", [True, False])
def test_repeated_calls_reuse_the_kept_addresses_and_follow_new_buffers(monkeypatch, with_bias):
    """A one-range depthwise call seen before runs from kept addresses (numpy_nn._DW_CALLS): the
    same bits, also through the scratch retry and on a read-only input; another weight or bias
    buffer, another input shape, or the library disabled is not served from them."""
    native_or_skip()
    x = rng.standard_normal((1, 24, 15, 15)).astype(np.float32)
    w = rng.standard_normal((24, 1, 5, 5)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32) if with_bias else None
    geo = ((2, 2), ((2, 2), (2, 2)), (1, 1))
    first = direct(x, w, b, *geo)
    assert any(k[0] == id(w) and k[1] == id(b) for k in numpy_nn._DW_CALLS)
    np.testing.assert_allclose(first, reference(x, w, b, *geo), rtol=0, atol=tolerance(x, w, b))
    assert np.array_equal(direct(x, w, b, *geo), first)
    ro = x.copy()
    ro.flags.writeable = False
    assert np.array_equal(direct(ro, w, b, *geo), first)
    small = numpy_nn._scratch_for()
    monkeypatch.setattr(numpy_nn._native_scratch, "buf", (small[0][:8], small[1]))   # the kernel asks for more
    assert np.array_equal(direct(x, w, b, *geo), first)
    w2 = -w                                             # another buffer (its id may be the old one's)
    b2 = None if b is None else b + 1
    y2 = direct(x, w2, b2, *geo)
    np.testing.assert_allclose(y2, reference(x, w2, b2, *geo), rtol=0, atol=tolerance(x, w2, b2))
    x3 = rng.standard_normal((1, 24, 17, 13)).astype(np.float32)
    np.testing.assert_allclose(direct(x3, w, b, *geo), reference(x3, w, b, *geo), rtol=0, atol=tolerance(x3, w, b))
    with nat.disabled():
        assert direct(x, w, b, *geo) is None
