"""The native row kernels (core/native/rows.c through core/backends/numpy_rows.py): GELU (erf and
tanh), softmax and layer norm against float64 references with the library on and off; the int8
kernels (DynamicQuantizeLinear's pass, MatMulInteger's uint8 x int8 product) against exact
integer references; a quantized ONNX graph's compiled plan with the library on and off."""
import math
import os
import warnings

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_rows as R

rng = np.random.default_rng(24)
LENGTHS = (1, 3, 17, 1000)


@pytest.fixture
def native():
    if nat.lib() is None:          # (not nat.kernel(name): it caches the first signature it is given)
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")


def _t(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="numpy")


def _both(fn, a):
    """fn's result with the library on and off (numpy_nn through ember's op)."""
    on = fn(_t(a)).numpy()
    with nat.disabled():
        off = fn(_t(a)).numpy()
    return on, off


def _gelu_ref(x, approximate):
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erfc = np.vectorize(math.erfc)
    return x * 0.5 * erfc(-x / math.sqrt(2))


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, -40.0, 40.0, 5.0, -5.0], np.float32)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_against_float64(native, approximate):
    x = np.concatenate([np.linspace(-12, 12, 200001, dtype=np.float32), rng.standard_normal(4099).astype(np.float32)])
    y = R.gelu(x, approximate)
    ref = _gelu_ref(x, approximate)
    err = np.abs(y - ref) / np.maximum(1.0, np.abs(x))
    assert err.max() <= (4e-7 if approximate == "none" else 6e-7), (err.max(), x[np.argmax(err)])
    if approximate == "none":
        # the negative tail relative to the value itself (the numpy path's tanh form is absolute only)
        tail = (x < -1) & (np.abs(ref) > 1e-30)
        assert np.max(np.abs(y[tail] - ref[tail]) / np.abs(ref[tail])) < 1.2e-6
    for n in LENGTHS:     # through the op, library on and off, odd lengths, a strided input
        a = rng.standard_normal((3, 2 * n)).astype(np.float32)[:, ::2] * 3
        on, off = _both(lambda t: ember.gelu(t, approximate=approximate), a)
        r = _gelu_ref(a, approximate)
        np.testing.assert_allclose(on, r, rtol=0, atol=1e-6)
        np.testing.assert_allclose(off, r, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(R.gelu(a, approximate), on)        # the kernel on the strided view


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_special_values_as_numpy_path(native, approximate):
    on, off = _both(lambda t: ember.gelu(t, approximate=approximate), SPECIAL)
    np.testing.assert_array_equal(np.isnan(on), np.isnan(off))
    fin = ~np.isnan(off)
    with np.errstate(all="ignore"):
        ref = _gelu_ref(SPECIAL, approximate)
    # (relative: the numpy path's erf form is accurate in absolute terms only: -5 gives 0.2% off)
    np.testing.assert_allclose(on[fin], np.where(np.isinf(SPECIAL), SPECIAL, ref)[fin], rtol=2e-6, atol=1e-30)
    assert on[1] == np.inf and np.isnan(on[2]) and on[5] == np.float32(1e30) and on[6] == 0.0


def _softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_softmax_against_float64(native):
    for n in LENGTHS:
        for a in (rng.standard_normal((5, n)).astype(np.float32) * 4,
                  rng.standard_normal((2, 3, 2 * n)).astype(np.float32)[..., 1::2],          # strided
                  rng.standard_normal((n + 2, 7)).astype(np.float32).T[:, :max(n, 1)]):      # transposed
            on, off = _both(lambda t: ember.softmax(t, axis=-1), a)
            ref = _softmax_ref(a)
            np.testing.assert_allclose(on, ref, rtol=3e-6, atol=1e-37)
            np.testing.assert_allclose(off, ref, rtol=3e-6, atol=1e-37)
            np.testing.assert_array_equal(R.softmax(a), on)
    # denormal probabilities: within 2 of float32's smallest steps
    a = np.array([[0.0, -95.0, -100.0, -103.0, -104.0, -150.0]], np.float32)
    on = R.softmax(a)
    assert np.max(np.abs(on.astype(np.float64) - _softmax_ref(a))) <= 2 * 1.4013e-45


def test_softmax_bad_rows_as_numpy_path(native):
    rows = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 2.0], [-np.inf] * 3, [-np.inf, 0.0, 1.0], [1e30, 1e30, 0.0],
                     [88.0, 88.0, 88.0], [-100.0, -101.0, -102.0], [np.inf, np.inf, 0.0]], np.float32)
    on, off = _both(lambda t: ember.softmax(t, axis=-1), rows)
    np.testing.assert_array_equal(np.isnan(on), np.isnan(off))
    fin = ~np.isnan(off)
    np.testing.assert_allclose(on[fin], off[fin], rtol=3e-6, atol=0)


def _ln_ref(x, w, b, eps):
    x = x.astype(np.float64)
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def test_layer_norm_against_float64(native):
    for n in LENGTHS[1:]:           # (one value: the numpy path's general branch)
        w = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        for a in (rng.standard_normal((4, 6, n)).astype(np.float32) * 3 + 5,
                  rng.standard_normal((4, 2 * n)).astype(np.float32)[:, ::2]):
            on, off = _both(lambda t: ember.layer_norm(t, (n,), _t(w), _t(b), eps=1e-5), a)
            ref = _ln_ref(a, w, b, 1e-5)
            tol = 4e-6 * (np.abs(w).max() + np.abs(b).max())
            np.testing.assert_allclose(on, ref, rtol=0, atol=tol)
            np.testing.assert_allclose(off, ref, rtol=0, atol=tol)
    # NaN / inf rows: NaN rows, as the numpy path
    a = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 2.0], [1.0, 2.0, 4.0], [5.0, 5.0, 5.0]], np.float32)
    w, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    on, off = _both(lambda t: ember.layer_norm(t, (3,), _t(w), _t(b), eps=1e-5), a)
    np.testing.assert_array_equal(np.isnan(on), np.isnan(off))
    np.testing.assert_allclose(on[2:], off[2:], rtol=0, atol=1e-6)


def test_split_over_threads_changes_no_bits(native, monkeypatch):
    x = rng.standard_normal((67, 1000)).astype(np.float32)
    w, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    calls = [lambda: R.gelu(x, "none"), lambda: R.gelu(x, "tanh"), lambda: R.softmax(x),
             lambda: R.layer_norm(x, w, b, 1e-5)]
    monkeypatch.setattr(R, "threads", lambda: 1)
    one = [f() for f in calls]
    monkeypatch.setattr(R, "threads", lambda: 3)
    monkeypatch.setattr(R, "PARALLEL_ELEMENTS", 1)
    ranges = R._ranges(67, 67000)
    assert len(ranges) == 3 and ranges[0][0] == 0 and ranges[-1][1] == 67
    for f, want in zip(calls, one):
        np.testing.assert_array_equal(f(), want)


def test_numpy_paths_when_disabled():
    with nat.disabled():
        assert R.gelu(np.ones(3, np.float32), "none") is None and R.softmax(np.ones((2, 2), np.float32)) is None
        assert R.QGemm(np.ones((4, 4), np.int32))(np.ones((2, 4), np.uint8), 0) is None
    assert R.gelu(np.ones(3, np.float16), "none") is None          # float32 only (the caller widens)


# ---- int8 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generic", [False, True])
def test_qgemm_exact(native, generic):
    if not generic and not R.qgemm_available():
        pytest.skip("the library's integer product is not vectorised on this CPU (BLAS is used)")
    for m, k, n in [(1, 1, 1), (3, 5, 7), (5, 3, 65), (4, 128, 64), (9, 130, 129), (256, 128, 384), (2, 1000, 17)]:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        w = rng.integers(-128, 128, (k, n)).astype(np.int32)
        w[0, 0], w[-1, -1] = -128, 127
        for za in (0, 255, int(rng.integers(0, 256))):
            ref = (a.astype(np.int64) - za) @ w.astype(np.int64)
            q = R.QGemm(w, generic=generic)
            got = q(a, np.uint8(za))
            assert got.dtype == np.int32 and np.array_equal(got, ref), (m, k, n, za)
            gf = q(a, np.uint8(za), as_float=True)
            assert gf.dtype == np.float32 and np.array_equal(gf, ref.astype(np.float32))
    # stacked rows, a strided input
    w = rng.integers(-128, 128, (37, 21)).astype(np.int32)
    a = rng.integers(0, 256, (2, 3, 74), dtype=np.uint8)[..., ::2]
    got = R.QGemm(w, generic=generic)(a, np.uint8(7))
    assert got.shape == (2, 3, 21) and np.array_equal(got, (a.astype(np.int64) - 7) @ w)


@pytest.mark.parametrize("generic", [False, True])
def test_qgemm_writes_only_its_rows_and_columns(native, generic):
    """The kernel itself into a wider buffer (ldc > N) full of sentinels: rows [r0, r1) and N
    columns written, nothing else (column tails of 1..15 past a vector, row tails of 1..3)."""
    import ctypes
    if not generic and not R.qgemm_available():
        pytest.skip("not vectorised on this CPU")
    P, I = ctypes.c_void_p, ctypes.c_int64
    fn = nat.kernel("ember_qgemm_generic" if generic else "ember_qgemm", None, I, I, I, I, P, I, ctypes.c_int32,
                    P, P, P, P, I)
    for m, k, n in [(7, 9, 31), (6, 5, 79), (5, 4, 15), (3, 130, 64)]:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        w = rng.integers(-128, 128, (k, n)).astype(np.int32)
        packed, colsum = R.pack_weight(w)
        ref = (a.astype(np.int64) - 9) @ w
        for as_float in (False, True):
            c = np.full((m + 1, n + 3), -7, np.float32 if as_float else np.int32)
            p = c.ctypes.data
            fn(1, m - 1, k, n, a.ctypes.data, k, 9, packed.ctypes.data, colsum.ctypes.data,
               None if as_float else p, p if as_float else None, n + 3)
            np.testing.assert_array_equal(c[1:m - 1, :n], ref[1:m - 1])
            c[1:m - 1, :n] = -7
            assert (c == -7).all(), (m, k, n, as_float)


def test_qgemm_declines_what_it_cannot_do_exactly():
    assert R.pack_weight(np.full((4, 4), 128, np.int32)) is None          # not int8 values
    assert R.pack_weight(np.full((4, 4), -129, np.int32)) is None
    assert R.pack_weight(np.zeros((R._QGEMM_MAX_K + 1, 1), np.int32)) is None   # int32 sums could overflow
    assert R.pack_weight(np.zeros((0, 3), np.int32)) is None
    assert R.pack_weight(np.ones((4, 4), np.float32)) is None
    q = R.QGemm(np.ones((4, 3), np.int32))
    assert q(np.ones((2, 5), np.uint8), 0) is None and q(np.ones((2, 4), np.int8), 0) is None


# DynamicQuantizeLinear's constants as ember.onnx.quant writes them: lo0, hi0, n255, zero, one,
# zlo, zhi, ylo, yhi
DQ = np.array([0, 0, 255, 0, 1, 0, 255, 0, 255], np.float32)


def _dq_numpy(x, c=DQ):
    """numpy_plan's float32 steps for finite x: (uint8 y, scale, zp)."""
    lo = np.minimum(x.min(), c[0])
    hi = np.maximum(x.max(), c[1])
    scale = np.true_divide(np.subtract(hi, lo), c[2])
    scale = c[4] if scale == c[3] else scale
    zf = np.clip(np.rint(np.negative(np.true_divide(lo, scale))), c[5], c[6])
    y = np.rint(np.true_divide(x, scale)) + zf
    return np.clip(y, c[7], c[8]).astype(np.uint8), np.float32(scale), np.uint8(zf)


def test_dynamic_quantize_exact(native):
    # scale 0.25: 0.625 / 0.25 = 2.5 -> 2, 0.875 / 0.25 = 3.5 -> 4 (half to even); zp = rint(127.5) = 128
    x = np.array([-31.875, 31.875, 0.625, 0.875, -0.625, 0.0, -0.0, 0.124, 0.126], np.float32)
    y, s, z = R.dynamic_quantize(x, DQ, centered=False)
    assert float(s) == 0.25 and int(z) == 128 and y[2:5].tolist() == [130, 132, 126]
    x2 = np.array([0.0, 63.75, 0.625, 0.875], np.float32)
    assert R.dynamic_quantize(x2, DQ, centered=False)[0].tolist() == [0, 255, 2, 4]
    cases = [x, x2, np.zeros(5, np.float32), np.full(3, 7.0, np.float32), np.full(3, -7.0, np.float32),
             np.array([1e30, -1e30], np.float32), np.array([3e-39, -1e-45], np.float32)]
    for n in LENGTHS + (100003,):
        cases.append((rng.standard_normal((2, 2 * n)) * 3).astype(np.float32)[:, ::2])      # strided
        cases.append(np.abs(rng.standard_normal(n)).astype(np.float32) + 1)                  # lo = lo0 = 0
    for a in cases:
        want = _dq_numpy(a)
        y, s, z = R.dynamic_quantize(a, DQ, centered=False)
        assert y.dtype == np.uint8 and s.dtype == np.float32 and z.dtype == np.uint8
        np.testing.assert_array_equal(y, want[0])
        assert (float(s), int(z)) == (float(want[1]), int(want[2]))
        yc = R.dynamic_quantize(a, DQ, centered=True)[0]
        assert yc.dtype == np.float32
        np.testing.assert_array_equal(yc, want[0].astype(np.float32) - np.float32(want[2]))
    for bad in (np.array([1.0, np.nan], np.float32), np.array([np.inf, 0.0], np.float32),
                np.array([-np.inf], np.float32), np.array([3e38, -3e38], np.float32)):     # (scale overflows)
        assert R.dynamic_quantize(bad, DQ, centered=False) is None
    assert R.dynamic_quantize(np.zeros(0, np.float32), DQ, centered=False) is None


def _quantized_matmul_model(tmp_path, k=37, n1=70, n2=5):
    """x (B, k) -> x @ W1, x @ W2 (one shared DynamicQuantizeLinear), quantized by onnxruntime."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    w1 = rng.standard_normal((k, n1)).astype(np.float32)
    w2 = rng.standard_normal((k, n2)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["y1"]), helper.make_node("MatMul", ["x", "w2"], ["y2"])],
        "mm", [helper.make_tensor_value_info("x", T.FLOAT, ["B", k])],
        [helper.make_tensor_value_info("y1", T.FLOAT, ["B", n1]), helper.make_tensor_value_info("y2", T.FLOAT, ["B", n2])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    src, dst = str(tmp_path / "mm.onnx"), str(tmp_path / "mm_int8.onnx")
    onnx.save(model, src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
    return dst


def test_quantized_plan_native_on_and_off(native, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    import ember.onnx
    path = _quantized_matmul_model(tmp_path)
    with open(path, "rb") as f:
        raw = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ember.onnx.load(raw, device="numpy", compile=True)
    calls = []
    real = R.QGemm.__call__

    def spy(self, *a, **k):
        y = real(self, *a, **k)
        calls.append(y is not None)
        return y
    monkeypatch.setattr(R.QGemm, "__call__", spy)
    sess = ort.InferenceSession(raw, providers=["CPUExecutionProvider"])
    for x in (rng.standard_normal((6, 37)).astype(np.float32), rng.standard_normal((1, 37)).astype(np.float32) * 50,
              np.zeros((3, 37), np.float32)):
        m(_t(x))                                          # (the first call of a shape traces the plan)
        calls.clear()
        on = [t.numpy() for t in m(_t(x))]
        # (the native integer product where it is vectorised, VNNI; else float32 BLAS: no call, or
        # calls that decline)
        assert (calls and all(calls)) if R.qgemm_available() else not any(calls)
        with nat.disabled():
            off = [t.numpy() for t in m(_t(x))]
        ref = sess.run(None, {"x": x})
        for a, b, r in zip(on, off, ref):
            np.testing.assert_array_equal(a, b)          # exact integers, the same float32 steps after
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5 * np.abs(r).max())
    # NaN in x: the numpy path's recorded steps (NaN -> 0 casts) either way
    x = rng.standard_normal((2, 37)).astype(np.float32)
    x[0, 3] = np.nan
    m(_t(x))
    on = [t.numpy() for t in m(_t(x))]
    with nat.disabled():
        off = [t.numpy() for t in m(_t(x))]
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)

