"""The compiled numpy plan's fused native steps (core/native/fused.c through numpy_nn / numpy_plan):
a linear layer with the layer norm before it, its activation and a residual add (ember_linear,
numpy_nn.NativeLinear). Against float64 references, with the library on and off
(``ember.native.disabled()``); bit for bit against the same native kernels run as separate steps
where the plan fuses them (the layer norm, GELU and the add are the same float32 operations)."""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_nn, numpy_rows

rng = np.random.default_rng(5)
P, I64 = ctypes.c_void_p, ctypes.c_int64
ACT_ARGS = {None: (0.0, 0.0, 0.0, 0.0), "relu": (0.0, 0.0, 0.0, np.inf), "clip": (0.0, 0.0, -0.5, 0.75),
            "hard_sigmoid": (1 / 6, 0.5, 0.0, 1.0), "hard_swish": (1 / 6, 0.5, 0.0, 1.0), "gelu": (0.0,) * 4,
            "gelu_tanh": (0.0,) * 4}


def native_or_skip():
    if nat.lib() is None:
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def t_(a):
    return ember.from_numpy(a, device="numpy")


def act64(y, act):
    a, b, lo, hi = ACT_ARGS[act]
    if act == "relu":
        return np.maximum(y, 0)
    if act == "clip":
        return np.clip(y, lo, hi)
    if act == "hard_sigmoid":
        return np.clip(y * a + b, 0, 1)
    if act == "hard_swish":
        return y * np.clip(y * a + b, 0, 1)
    if act == "gelu":
        return y * 0.5 * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def ln64(x, w, b, eps):
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


# ---- ember_linear -------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n", [(256, 128, 384), (2, 3, 5), (17, 33, 65), (9, 512, 128), (40, 120, 1000),
                                   (8, 16, 32), (31, 7, 33)])
@pytest.mark.parametrize("act", list(ACT_ARGS))
def test_linear_against_float64(m, k, n, act):
    """act(x @ w.T + b) + res, with and without the layer norm, bias and residual, every activation,
    shapes with row and column tails: float64 within float32 rounding."""
    native_or_skip()
    x, w, b, res = f32(m, k), f32(n, k, scale=1 / math.sqrt(k)), f32(n), f32(m, n)
    lw, lb = f32(k), f32(k)
    for bias in (b, None):
        for ln in (None, (lw, lb, 1e-5)):
            for r in (None, res):
                lin = numpy_nn.NativeLinear(w, bias, act, ACT_ARGS[act], ln)
                assert lin.ok
                got = lin(x, r)
                xin = ln64(x, lw, lb, 1e-5) if ln else x.astype(np.float64)
                want = act64(xin @ w.T.astype(np.float64) + (0 if bias is None else bias), act)
                if r is not None:
                    want = want + r
                scale = max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale * math.sqrt(k))


def test_linear_epilogue_and_prologue_bits():
    """The fused layer norm, GELU and residual add give the bits of the separate native steps
    (rows.c's layer norm, GELU; numpy's float32 add) around the plain product."""
    native_or_skip()
    m, k, n = 45, 96, 200
    x, w, b, res = f32(m, k), f32(n, k, scale=0.1), f32(n), f32(m, n)
    lw, lb = f32(k), f32(k)
    plain = numpy_nn.NativeLinear(w, b)
    ln = numpy_rows.layer_norm(x, lw, lb, 1e-5)
    for approx, act in (("none", "gelu"), ("tanh", "gelu_tanh")):
        fused = numpy_nn.NativeLinear(w, b, act, ln=(lw, lb, 1e-5))(x, res)
        want = res + numpy_rows.gelu(plain(ln), approx)
        np.testing.assert_array_equal(fused, want)
    hs = numpy_nn.NativeLinear(w, b, "hard_swish", ACT_ARGS["hard_swish"])(x)
    np.testing.assert_array_equal(hs, numpy_nn.activation_(plain(x), "hard_swish", ACT_ARGS["hard_swish"]))


def test_linear_same_bits_on_any_row_ranges(monkeypatch):
    """Split over threads (blocks of 8 rows) or not, the same bits; a stack of rows (..., K) is
    its rows."""
    native_or_skip()
    x, w, b, res = f32(3, 37, 64), f32(48, 64), f32(48), f32(111, 48)
    lin = numpy_nn.NativeLinear(w, b, "gelu", ln=(f32(64), f32(64), 1e-5))
    one = lin(x, res)
    monkeypatch.setattr(numpy_nn, "_LINEAR_PARALLEL_MACS", 1)
    monkeypatch.setattr(numpy_nn, "threads", lambda: 3)
    for per in (1, 2, 5):
        monkeypatch.setattr(numpy_nn, "_LINEAR_RANGES_PER_THREAD", per)
        np.testing.assert_array_equal(lin(x, res), one)
    fn = nat.kernel("ember_linear", I64, P, P, P, P, P, P, P, P, P, P, I64, I64, I64)
    wp, bp, app, lwp, lbp, act = lin.ptrs
    xr = x.reshape(111, 64)
    g = np.array([111, 64, 48, 64, 48, 48, act], np.int64)
    y = np.zeros((111, 48), np.float32)
    sc = np.empty(64 * 8, np.float32)
    for r0, r1 in ((0, 5), (5, 6), (6, 100), (100, 111)):
        assert fn(xr.ctypes.data, lwp, lbp, wp, bp, res.ctypes.data, y.ctypes.data, g.ctypes.data, app,
                  sc.ctypes.data, sc.size, r0, r1) == 0
    np.testing.assert_array_equal(y, one)


def test_linear_refusals_and_fallbacks():
    """Bad geometry: -1 with nothing written; a layer norm without scratch: the size it needs.
    Python: other dtypes, non-contiguous input, the library off: None (the numpy path runs)."""
    native_or_skip()
    w, b = f32(20, 10), f32(20)
    lin = numpy_nn.NativeLinear(w, b, ln=(f32(10), f32(10), 1e-5))
    fn = nat.kernel("ember_linear", I64, P, P, P, P, P, P, P, P, P, P, I64, I64, I64)
    wp, bp, app, lwp, lbp, act = lin.ptrs
    x = f32(4, 10)
    y = np.full((4, 20), 7, np.float32)
    call = lambda g, sc=None, n=0, r=(0, 4): fn(x.ctypes.data, lwp, lbp, wp, bp, None, y.ctypes.data,  # noqa: E731
                                                np.array(g, np.int64).ctypes.data, app,
                                                None if sc is None else sc.ctypes.data, n, *r)
    good = [4, 10, 20, 10, 20, 20, act]
    assert call(good) == 10 * nat.kernel("ember_linear_scratch", I64, I64)(1)   # (K x LR floats)
    for bad in ([0, 10, 20, 10, 20, 20, 0], [4, 10, 20, 9, 20, 20, 0], [4, 10, 20, 10, 19, 20, 0],
                [4, 10, 20, 10, 20, 20, 7], [4, 10, 20, 10, 20, 20, -1]):
        assert call(bad, np.empty(1000, np.float32), 1000) == -1
    assert call(good, np.empty(1000, np.float32), 1000, (3, 5)) == -1
    assert (y == 7).all()
    assert numpy_nn.NativeLinear(w.astype(np.float64), b).ok is False
    assert numpy_nn.NativeLinear(w, b.astype(np.float16)).ok is False
    assert numpy_nn.NativeLinear(w, b, ln=(f32(9), f32(10), 1e-5)).ok is False
    assert lin(x.astype(np.float64)) is None and lin(np.asfortranarray(f32(4, 10))) is None
    assert lin(x, f32(4, 19)) is None
    with nat.disabled():
        assert lin(x) is None and numpy_nn.NativeLinear(w, b).ok is False


# ---- the plan: layer norm + linear + activation + residual as one step ----------------------------

def _block(p):
    """A pre-norm transformer MLP block: x + fc2(gelu(fc1(ln(x)))), then + a relu branch."""
    def fn(x):
        h = ember.layer_norm(x, (p["w1"].shape[1],), p["lw"], p["lb"], eps=1e-5)
        h = ember.gelu(ember.linear(h, p["w1"], p["b1"]))
        x = ember.add(x, ember.linear(h, p["w2"], p["b2"]))
        return ember.add(ember.relu(ember.linear(x, p["w3"], p["b3"])), x)
    return fn


def _params(d=64, ff=160):
    s = 1 / math.sqrt(d)
    return {"lw": f32(d), "lb": f32(d), "w1": f32(ff, d, scale=s), "b1": f32(ff), "w2": f32(d, ff, scale=s / 2),
            "b2": f32(d), "w3": f32(d, d, scale=s), "b3": f32(d)}


@pytest.mark.parametrize("native", [True, False])
def test_plan_fuses_pre_norm_mlp(native):
    """ln + fc1 + gelu, fc2 + residual, fc3 + relu + residual: three steps (library on: the
    separate native steps' results within float32 rounding, float64 within float32 rounding;
    library off: the recorded steps, the eager bits)."""
    import contextlib
    if native:
        native_or_skip()
    arrays = _params()
    x = f32(4, 24, 64)
    with contextlib.nullcontext() if native else nat.disabled():
        p = {k: t_(v) for k, v in arrays.items()}
        fn = _block(p)
        eager = fn(t_(x)).numpy()
        f = ember.compile(fn)
        got = [f(t_(x)).numpy() for _ in range(3)]
        fast = f.plan_for(t_(x)).fast
    names = [(op.name, op.act) for op in fast.ops]
    assert names == [("linear", "gelu"), ("linear", None), ("linear", "relu")], names
    for g in got:
        if native:
            np.testing.assert_allclose(g, eager, rtol=1e-5, atol=1e-5 * float(np.abs(eager).max()))
        else:
            np.testing.assert_array_equal(g, eager)
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    h = act64(ln64(x, a["lw"], a["lb"], 1e-5) @ a["w1"].T + a["b1"], "gelu")
    x1 = x + h @ a["w2"].T + a["b2"]
    want = np.maximum(x1 @ a["w3"].T + a["b3"], 0) + x1
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_plan_fused_linear_falls_back_and_follows_updates():
    """Compiled with the library, run without it: the recorded steps (the eager bits). A weight
    updated by an optimizer step (a new buffer): packed again."""
    native_or_skip()
    from ember import nn
    ember.manual_seed(0)
    ln, lin = nn.LayerNorm(32).to("numpy"), nn.Linear(32, 48).to("numpy")
    opt = ember.optim.SGD(lin.parameters(), lr=0.5)

    @ember.compile
    def fwd(x):
        with ember.no_grad():
            return ember.gelu(lin(ln(x)))
    x = t_(f32(10, 32))
    for _ in range(3):
        fwd(x)
    assert [(op.name, op.act) for op in fwd.plan_for(x).fast.ops] == [("linear", "gelu")]
    for _ in range(2):
        with ember.no_grad():
            want = ember.gelu(lin(ln(x))).numpy()
        np.testing.assert_allclose(fwd(x).numpy(), want, rtol=1e-5, atol=1e-5)
        with nat.disabled(), ember.no_grad():
            np.testing.assert_array_equal(fwd(x).numpy(), ember.gelu(lin(ln(x))).numpy())
        loss = (lin(x) * lin(x)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_plan_linear_fusion_conditions():
    """Not fused: a residual computed after the linear, a layer norm read elsewhere too, a
    broadcast add; a plain linear + bias keeps its own step (numpy_plan._linear_const)."""
    native_or_skip()
    w, b = t_(f32(16, 16, scale=0.25)), t_(f32(16))
    lw, lb = t_(f32(16)), t_(f32(16))

    def late_residual(x):
        y = ember.linear(x, w, b)
        z = ember.relu(x)                       # (computed after the linear)
        return ember.add(y, z)

    def shared_norm(x):
        h = ember.layer_norm(x, (16,), lw, lb)
        return ember.add(ember.linear(h, w, b), h)   # (h read by the add too: the add fuses, not the norm)

    def broadcast_add(x):
        return ember.add(ember.linear(x, w, b), b)

    def plain(x):
        return ember.linear(x, w, b)
    x = t_(f32(6, 16))
    for fn, want in ((late_residual, [("linear", None), ("relu", None), ("add", None)]),
                     (shared_norm, [("layer_norm", None), ("linear", None)]),
                     (broadcast_add, [("linear", None), ("add", None)]),
                     (plain, [("linear", None)])):
        f = ember.compile(fn)
        got = [f(x).numpy() for _ in range(3)]
        ops = f.plan_for(x).fast.ops
        assert [(op.name, op.act) for op in ops] == want, (fn.__name__, [(op.name, op.act) for op in ops])
        np.testing.assert_allclose(got[-1], fn(x).numpy(), rtol=1e-5, atol=1e-5)


# ---- ember_attention -----------------------------------------------------------------------------

def attention64(q, kt, v, scale):
    s = q.astype(np.float64) @ kt.astype(np.float64)
    if scale is not None:
        s = s * scale
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v.astype(np.float64)


@pytest.mark.parametrize("b,h,t,s,d,e", [(8, 4, 32, 32, 32, 32), (2, 3, 5, 7, 9, 11), (1, 1, 40, 40, 64, 64),
                                         (3, 2, 17, 33, 16, 40), (1, 2, 1, 1, 4, 4)])
@pytest.mark.parametrize("scale", [0.17, None])
def test_attention_against_float64(b, h, t, s, d, e, scale):
    """q, k^T, v as views of a fused projection (the heads' slices, k transposed: strides only),
    the result in both layouts; also contiguous and 3-d (one head) operands; rows of large scores
    (the shifted softmax) and of -inf."""
    native_or_skip()
    from ember.backends.numpy_nn import NativeAttention, native_attention
    qkv = f32(b, max(t, s), 3, h, max(d, e), scale=2.0)
    base = qkv.transpose(2, 0, 3, 1, 4)
    q, k, v = base[0][:, :, :t, :d], base[1][:, :, :s, :d], base[2][:, :, :s, :e]
    kt = np.swapaxes(k, -1, -2)
    want = attention64(q, kt, v, scale)
    tol = dict(rtol=1e-5, atol=2e-6 * math.sqrt(s * d))
    np.testing.assert_allclose(native_attention(q, kt, v, scale), want, **tol)
    np.testing.assert_allclose(native_attention(q, kt, v, scale, merge=True), want.transpose(0, 2, 1, 3), **tol)
    qc, ktc, vc = (np.ascontiguousarray(a) for a in (q, kt, v))
    np.testing.assert_array_equal(native_attention(qc, ktc, vc, scale), native_attention(q, kt, v, scale))
    np.testing.assert_allclose(native_attention(q[:, 0], kt[:, 0], v[:, 0], scale), want[:, 0], **tol)
    big = q * 400                                      # (scores past e^88: the shifted form)
    top = float(np.abs(big.astype(np.float64) @ kt).max()) * (1 if scale is None else scale)
    np.testing.assert_allclose(native_attention(big, kt, v, scale), attention64(big, kt, v, scale), rtol=1e-5,
                               atol=1e-6 * math.sqrt(d) * top * float(np.abs(v).max()))   # (float32 scores' rounding)
    assert NativeAttention(q.astype(np.float64), kt, v).ok is False
    assert NativeAttention(q, kt[:, :, :, :1], v).ok is (s == 1)
    with nat.disabled():
        assert native_attention(q, kt, v, scale) is None


def test_attention_same_bits_on_any_unit_ranges():
    """Units (batch, head) in any ranges (threads): the same bits."""
    native_or_skip()
    from ember.backends.numpy_nn import NativeAttention
    q, kt, v = f32(3, 4, 10, 8), f32(3, 4, 8, 12), f32(3, 4, 12, 8)
    att = NativeAttention(q, kt, v, 0.3)
    whole = att(q.ctypes.data, kt.ctypes.data, v.ctypes.data)
    y = np.zeros_like(whole)
    sc = np.empty(1 << 16, np.float32)
    for u0, u1 in ((0, 1), (1, 7), (7, 12)):
        assert att.fn(q.ctypes.data, kt.ctypes.data, v.ctypes.data, y.ctypes.data, att.gp, att.c, sc.ctypes.data,
                      sc.size, u0, u1) == 0
    np.testing.assert_array_equal(y, whole)
    assert att.fn(q.ctypes.data, kt.ctypes.data, v.ctypes.data, y.ctypes.data, att.gp, att.c, sc.ctypes.data,
                  10, 0, 12) > 10                                   # (the scratch it needs; nothing written)
    assert att.fn(q.ctypes.data, kt.ctypes.data, v.ctypes.data, y.ctypes.data, att.gp, att.c, sc.ctypes.data,
                  sc.size, 0, 13) == -1
    np.testing.assert_array_equal(y, whole)


def _encoder_layer(p, b, t, h):
    """A pre-norm encoder layer as PyTorch exports it: qkv = linear(ln(x)), split into heads by
    reshape / permute / indexing, softmax(q k^T * scale) v, heads merged, x + proj(.), then the MLP."""
    d = p["wqkv"].shape[1]
    dh = d // h
    scale = ember.from_numpy(np.asarray(dh ** -0.5, np.float32), device="numpy")

    def fn(x):
        y = ember.linear(ember.layer_norm(x, (d,), p["l1w"], p["l1b"]), p["wqkv"], p["bqkv"])
        y = ember.permute_dims(ember.reshape(y, (b, t, 3, h, dh)), (2, 0, 3, 1, 4))
        q, k, v = y[0], y[1], y[2]
        s = ember.softmax(ember.multiply(ember.matmul(q, ember.permute_dims(k, (0, 1, 3, 2))), scale), axis=-1)
        a = ember.reshape(ember.permute_dims(ember.matmul(s, v), (0, 2, 1, 3)), (b, t, d))
        x = ember.add(x, ember.linear(a, p["wo"], p["bo"]))
        m = ember.gelu(ember.linear(ember.layer_norm(x, (d,), p["l2w"], p["l2b"]), p["w1"], p["b1"]))
        return ember.add(x, ember.linear(m, p["w2"], p["b2"]))
    return fn


def _encoder_params(d=48, ff=96):
    s = 1 / math.sqrt(d)
    return {"l1w": f32(d), "l1b": f32(d), "wqkv": f32(3 * d, d, scale=s), "bqkv": f32(3 * d),
            "wo": f32(d, d, scale=s), "bo": f32(d), "l2w": f32(d), "l2b": f32(d), "w1": f32(ff, d, scale=s),
            "b1": f32(ff), "w2": f32(d, ff, scale=s), "b2": f32(d)}


def _encoder64(a, x, h):
    b, t, d = x.shape
    dh = d // h
    y = ln64(x, a["l1w"], a["l1b"], 1e-5) @ a["wqkv"].T + a["bqkv"]
    q, k, v = y.reshape(b, t, 3, h, dh).transpose(2, 0, 3, 1, 4)
    att = attention64(q, np.swapaxes(k, -1, -2), v, dh ** -0.5).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + att @ a["wo"].T + a["bo"]
    m = act64(ln64(x, a["l2w"], a["l2b"], 1e-5) @ a["w1"].T + a["b1"], "gelu")
    return x + m @ a["w2"].T + a["b2"]


@pytest.mark.parametrize("native", [True, False])
def test_plan_fuses_encoder_layer(native):
    """An exported pre-norm encoder layer (24 steps) runs as 5: ln + qkv, attention (through the
    head split's views), proj + residual, ln + fc1 + gelu, fc2 + residual. Library on: the eager
    results within float32 rounding; off: the eager bits. Float64 within float32 rounding."""
    import contextlib
    if native:
        native_or_skip()
    b, t, h = 3, 10, 4
    arrays = _encoder_params()
    x = f32(b, t, 48)
    with contextlib.nullcontext() if native else nat.disabled():
        fn = _encoder_layer({k: t_(v) for k, v in arrays.items()}, b, t, h)
        eager = fn(t_(x)).numpy()
        f = ember.compile(fn)
        got = [f(t_(x)).numpy() for _ in range(3)]
        fast = f.plan_for(t_(x)).fast
    names = [(op.name, op.act) for op in fast.ops]
    assert names == [("linear", None), ("attention", None), ("linear", None), ("linear", "gelu"),
                     ("linear", None)], names
    for g in got:
        if native:
            np.testing.assert_allclose(g, eager, rtol=1e-5, atol=1e-5 * float(np.abs(eager).max()))
        else:
            np.testing.assert_array_equal(g, eager)
    want = _encoder64({k: v.astype(np.float64) for k, v in arrays.items()}, x.astype(np.float64), h)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    with nat.disabled():                                  # (compiled with the library, run without)
        np.testing.assert_array_equal(f(t_(x)).numpy(), fn(t_(x)).numpy())


def test_plan_attention_views_read_elsewhere_and_unfused_cases():
    """A head split whose views are also read elsewhere (q returned too) keeps those steps and
    reads through the rest; a mask added to the scores or a softmax over another axis is not an
    attention step."""
    native_or_skip()
    b, t, h, d = 2, 6, 2, 8
    w = t_(f32(3 * d, d, scale=0.3))
    mask = t_(f32(t, t))

    def split(x):
        y = ember.permute_dims(ember.reshape(ember.linear(x, w), (b, t, 3, h, d // h)), (2, 0, 3, 1, 4))
        return y[0], ember.permute_dims(y[1], (0, 1, 3, 2)), y[2]

    def with_q(x):
        q, kt, v = split(x)
        return ember.matmul(ember.softmax(ember.matmul(q, kt), axis=-1), v), q

    def masked(x):
        q, kt, v = split(x)
        return ember.matmul(ember.softmax(ember.add(ember.matmul(q, kt), mask), axis=-1), v)

    def other_axis(x):
        q, kt, v = split(x)
        return ember.matmul(ember.softmax(ember.matmul(q, kt), axis=2), v)
    x = t_(f32(b, t, d))
    for fn, fused in ((with_q, True), (masked, False), (other_axis, False)):
        f = ember.compile(fn)
        got = [f(x) for _ in range(3)][-1]
        names = [op.name for op in f.plan_for(x).fast.ops]
        assert ("attention" in names) == fused, (fn.__name__, names)
        got = got if isinstance(got, tuple) else (got,)
        want = fn(x)
        want = want if isinstance(want, tuple) else (want,)
        for g, w_ in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w_.numpy(), rtol=1e-5, atol=1e-5)


# ---- squeeze-excite -------------------------------------------------------------------------------

def _se_params(c=24, c1=8):
    return {"w1": f32(c1, c, 1, 1, scale=0.3), "b1": f32(c1), "w2": f32(c, c1, 1, 1, scale=0.3), "b2": f32(c)}


def _se_block(p, hs=(1 / 6, 0.5)):
    """A MobileNetV3 block's tail as exported: a depthwise convolution + relu, then squeeze-excite:
    the planes' sum / (H W), 1x1 + relu, 1x1 + hard sigmoid (x * a + b, clip 0..1), y * gate."""
    a, b = (ember.from_numpy(np.asarray(v, np.float32), device="numpy") for v in hs)

    def fn(x, dw, hw):
        y = ember.relu(ember.conv2d(x, dw, padding=1, groups=x.shape[1]))
        s = ember.divide(ember.sum(y, axis=(2, 3), keepdims=True), hw)
        z = ember.relu(ember.conv2d(s, p["w1"], p["b1"]))
        g = ember.clip(ember.add(ember.multiply(ember.conv2d(z, p["w2"], p["b2"]), a), b), 0.0, 1.0)
        return ember.multiply(y, g)
    return fn


def _se64(arrays, y):
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    m = y.mean(axis=(2, 3))
    z = np.maximum(m @ a["w1"][:, :, 0, 0].T + a["b1"], 0)
    g = np.clip((z @ a["w2"][:, :, 0, 0].T + a["b2"]) / 6 + 0.5, 0, 1)
    return y * g[:, :, None, None]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("shape", [(1, 24, 7, 7), (2, 24, 5, 9), (1, 24, 1, 1), (1, 24, 14, 14)])
def test_plan_fuses_squeeze_excite(native, shape):
    """sum, divide, two 1x1 convolutions with their activations and the product: one step at batch
    1, in place on the convolution's array; the eager bits, library on and off. Float64 within
    float32 rounding."""
    import contextlib
    if native:
        native_or_skip()
    arrays = _se_params()
    x, dw = f32(*shape), f32(24, 1, 3, 3, scale=0.5)
    hw = np.asarray(shape[2] * shape[3], np.float32)
    with contextlib.nullcontext() if native else nat.disabled():
        fn = _se_block({k: t_(v) for k, v in arrays.items()})
        consts = (t_(dw), t_(hw))
        g = lambda xt: fn(xt, *consts)                                   # noqa: E731
        eager = g(t_(x)).numpy()
        f = ember.compile(g)
        got = [f(t_(x)).numpy() for _ in range(3)]
        fast = f.plan_for(t_(x)).fast
    names = [(op.name, op.act, op.inplace) for op in fast.ops]
    if shape[0] == 1:
        assert names == [("conv2d", "relu", None), ("squeeze_excite", None, 0)], names
    else:                   # (batch 2: BLAS runs the one-pixel convolutions, so do the recorded steps)
        assert "squeeze_excite" not in [nm for nm, _, _ in names], names
    for r in got:
        np.testing.assert_array_equal(r, eager)
    yd = np.maximum(_conv_dw64(x, dw), 0)
    np.testing.assert_allclose(got[0], _se64(arrays, yd), rtol=1e-4, atol=1e-5)
    with nat.disabled():
        np.testing.assert_array_equal(f(t_(x)).numpy(), g(t_(x)).numpy())


def _conv_dw64(x, w):
    n, c, h, wd = x.shape
    xp = np.zeros((n, c, h + 2, wd + 2))
    xp[:, :, 1:-1, 1:-1] = x
    y = np.zeros((n, c, h, wd))
    for i in range(3):
        for j in range(3):
            y += w[None, :, 0, i, j, None, None] * xp[:, :, i:i + h, j:j + wd]
    return y


def test_squeeze_excite_kernel_and_conditions():
    """NativeSqueezeExcite against float64 (in place and not): its products are ember_gemv's bits,
    the product numpy's; refusals. The plan leaves it alone where y is read elsewhere or the gate
    is a sigmoid."""
    native_or_skip()
    arrays = _se_params(40, 12)
    se = numpy_nn.NativeSqueezeExcite(arrays["w1"], arrays["b1"], arrays["w2"], arrays["b2"], "relu",
                                      (0.0, 0.0, 0.0, np.inf), "hard_sigmoid", (1 / 6, 0.5, 0.0, 1.0))
    assert se.ok
    x = f32(2, 40, 5, 7)
    m = x.mean(axis=(2, 3), dtype=np.float32)
    want = _se64(arrays, x.astype(np.float64))
    np.testing.assert_allclose(se(x, m), want, rtol=1e-5, atol=1e-6)
    xi = x.copy()
    assert se(xi, m, xi) is xi
    np.testing.assert_array_equal(xi, se(x, m))
    for i in range(2):
        z = numpy_nn._gemv_native(arrays["w1"].reshape(12, 40), m[i], arrays["b1"], "relu", (0.0, 0.0, 0.0, np.inf))
        gt = numpy_nn._gemv_native(arrays["w2"].reshape(40, 12), z, arrays["b2"], "hard_sigmoid",
                                   (1 / 6, 0.5, 0.0, 1.0))
        np.testing.assert_array_equal(se(x, m)[i], x[i] * gt[:, None, None])
    assert se(x.astype(np.float64), m) is None and se(np.asfortranarray(x), m) is None
    assert se(f32(1, 39, 2, 2), m[:1, :39]) is None and se(x, m[:1]) is None
    assert not numpy_nn.NativeSqueezeExcite(arrays["w1"], arrays["b1"], arrays["w1"], arrays["b2"], None,
                                            (0,) * 4, None, (0,) * 4).ok
    with nat.disabled():
        assert se(x, m) is None
    p = {k: t_(v) for k, v in _se_params().items()}
    hw = t_(np.asarray(49, np.float32))

    def read_twice(x):
        y = ember.relu(x)
        s = ember.divide(ember.sum(y, axis=(2, 3), keepdims=True), hw)
        z = ember.relu(ember.conv2d(ember.relu(ember.conv2d(s, p["w1"], p["b1"])), p["w2"], p["b2"]))
        return ember.multiply(y, z), ember.add(y, y)

    def sigmoid_gate(x):
        y = ember.relu(x)
        s = ember.divide(ember.sum(y, axis=(2, 3), keepdims=True), hw)
        z = ember.sigmoid(ember.conv2d(ember.relu(ember.conv2d(s, p["w1"], p["b1"])), p["w2"], p["b2"]))
        return ember.multiply(y, z)
    xt = t_(f32(1, 24, 7, 7))
    for fn in (read_twice, sigmoid_gate):
        f = ember.compile(fn)
        [f(xt) for _ in range(3)]
        assert "squeeze_excite" not in [op.name for op in f.plan_for(xt).fast.ops], fn.__name__


# ---- global average pool, one-row hard swish, depthwise activation, kept convolution calls -------

@pytest.mark.parametrize("native", [True, False])
def test_plan_classifier_hard_swish(native):
    """After a global average pool: flatten + linear + hard swish (the chain) is one ember_gemv step
    with hard swish in its epilogue; the eager bits, library on and off."""
    import contextlib
    if native:
        native_or_skip()
    w1, b1, w2, b2 = f32(32, 40, scale=0.2), f32(32), f32(10, 32, scale=0.2), f32(10)
    a, b = np.float32(1 / 6), np.float32(0.5)
    x = f32(1, 40, 7, 7)
    with contextlib.nullcontext() if native else nat.disabled():
        p = [t_(v) for v in (w1, b1, w2, b2, np.asarray(49, np.float32), np.asarray(a), np.asarray(b))]

        def fn(x):
            m = ember.reshape(ember.divide(ember.sum(x, axis=(2, 3), keepdims=True), p[4]), (1, 40))
            h = ember.linear(m, p[0], p[1])
            h = ember.multiply(h, ember.clip(ember.add(ember.multiply(h, p[5]), p[6]), 0.0, 1.0))
            return ember.linear(h, p[2], p[3])
        eager = fn(t_(x)).numpy()
        f = ember.compile(fn)
        got = [f(t_(x)).numpy() for _ in range(3)]
        names = [(op.name, op.act) for op in f.plan_for(t_(x)).fast.ops]
    assert names == [("sum", None), ("divide", None), ("linear", "hard_swish"), ("linear", None)], names
    for g in got:
        np.testing.assert_array_equal(g, eager)
    m = x.astype(np.float64).mean(axis=(2, 3))
    h = m @ w1.T.astype(np.float64) + b1
    want = (h * np.clip(h / 6 + 0.5, 0, 1)) @ w2.T.astype(np.float64) + b2
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["relu", "clip", "hard_sigmoid", "hard_swish"])
@pytest.mark.parametrize("stride,k", [(1, 3), (2, 5), (2, 3)])
def test_depthwise_activation_epilogue(act, stride, k):
    """conv.c's depthwise kernel with the activation on each plane while in the cache: the bits of
    the activation pass after it (numpy_nn.activation_), and those of the plan's separate steps."""
    native_or_skip()
    x, w, b = f32(1, 12, 15, 17), f32(12, 1, k, k), f32(12)
    p = k // 2
    oh, ow = (15 + 2 * p - k) // stride + 1, (17 + 2 * p - k) // stride + 1
    geo = ((stride, stride), ((p, p), (p, p)), (1, 1))
    fused = numpy_nn._conv_depthwise_native(x, w, b, 1, oh, ow, k, k, *geo, act, ACT_ARGS[act])
    again = numpy_nn._conv_depthwise_native(x, w, b, 1, oh, ow, k, k, *geo, act, ACT_ARGS[act])   # (kept call)
    plain = numpy_nn._conv_depthwise_native(x, w, b, 1, oh, ow, k, k, *geo)
    want = numpy_nn.activation_(plain.copy(), act, ACT_ARGS[act])
    np.testing.assert_array_equal(fused, want)
    np.testing.assert_array_equal(again, want)


@pytest.mark.parametrize("native", [True, False])
def test_plan_keeps_convolution_calls(native):
    """Depthwise + hard swish and a 1x1 convolution without an activation: each one step, run
    from kept native calls after the first run; the eager bits, library on and off; weights
    updated by an optimizer step (new buffers) are followed."""
    import contextlib
    from ember import nn
    if native:
        native_or_skip()
    ember.manual_seed(0)
    with contextlib.nullcontext() if native else nat.disabled():
        dwc = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16).to("numpy")
        pwc = nn.Conv2d(16, 8, 1).to("numpy")
        opt = ember.optim.SGD(list(dwc.parameters()) + list(pwc.parameters()), lr=0.1)
        hs = [t_(np.asarray(v, np.float32)) for v in (1 / 6, 0.5)]

        def fn(x):
            y = dwc(x)
            y = ember.multiply(y, ember.clip(ember.add(ember.multiply(y, hs[0]), hs[1]), 0.0, 1.0))
            return pwc(y)

        @ember.compile
        def fwd(x):
            with ember.no_grad():
                return fn(x)
        x = t_(f32(1, 16, 14, 14))
        for _ in range(3):
            fwd(x)
        names = [(op.name, op.act) for op in fwd.plan_for(x).fast.ops]
        assert names == [("conv2d", "hard_swish"), ("conv2d", None)], names
        for _ in range(2):
            with ember.no_grad():
                want = fn(x).numpy()
            for _ in range(2):
                np.testing.assert_array_equal(fwd(x).numpy(), want)
            loss = (fn(x) * fn(x)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
