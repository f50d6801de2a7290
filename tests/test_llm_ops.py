"""ember.ops.llm (rms_norm, rope, attention_cached) on every backend against a float64 numpy
reference written here independently of the kernels, including ember.compile replays whose
only changing input is the cache position."""
import math

import numpy as np
import pytest

import ember
from ember.backends.numpy_quant import native_qlinear
from ember.errors import DTypeError, ShapeError


def _t(a, device, dtype="float32"):
    return ember.tensor(np.asarray(a).tolist(), dtype=dtype, device=device)


def _np(t):
    return np.asarray(t.tolist(), dtype=np.float64)


def ref_attention(q, kc, vc, pos, window=0, softcap=0.0, scale=None):
    """q (T, Hq, D) over filled cache rows; float64 softmax. ``window``: query t sees only the
    last ``window`` rows up to pos+t; ``softcap``: scores cap * tanh(s / cap)."""
    T, hq, d = q.shape
    hkv = kc.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(T):
        n = pos + t + 1
        lo = max(0, n - window) if window else 0
        for h in range(hq):
            g = h // (hq // hkv)
            s = kc[lo:n, g, :] @ q[t, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ vc[lo:n, g, :]
    return out


def test_rms_norm(device):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    y = _np(ember.rms_norm(_t(x, device), _t(w, device), eps=1e-5))
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["pairs", "halves"])
def test_rope(device, mode):
    rng = np.random.default_rng(1)
    T, H, D = 4, 3, 8
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    pos = np.arange(5, 5 + T)[:, None] * (100000.0 ** (-np.arange(D // 2) * 2 / D))[None, :]
    c, s = np.cos(pos), np.sin(pos)
    y = _np(ember.rope(_t(x, device), _t(c, device), _t(s, device), mode=mode))
    if mode == "pairs":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :D // 2], x[..., D // 2:]
    ra = a * c[:, None] - b * s[:, None]
    rb = a * s[:, None] + b * c[:, None]
    ref = np.empty_like(x, dtype=np.float64)
    if mode == "pairs":
        ref[..., 0::2], ref[..., 1::2] = ra, rb
    else:
        ref[..., :D // 2], ref[..., D // 2:] = ra, rb
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_rope_tables_match_numpy():
    c, s = ember.ops.llm.rope_tables(7, 8, base=100000.0)
    ang = np.arange(7)[:, None] * (100000.0 ** (-np.arange(4) * 2 / 8))[None, :]
    np.testing.assert_allclose(_np(c), np.cos(ang), atol=1e-7)
    np.testing.assert_allclose(_np(s), np.sin(ang), atol=1e-7)


@pytest.mark.parametrize("T,pos", [(5, 0), (1, 6), (3, 4)])
def test_attention_cached(device, T, pos):
    rng = np.random.default_rng(T * 10 + pos)
    C, hq, hkv, d = 9, 6, 2, 8
    kc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    vc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    q = rng.standard_normal((T, hq, d)).astype(np.float32)
    k = rng.standard_normal((T, hkv, d)).astype(np.float32)
    v = rng.standard_normal((T, hkv, d)).astype(np.float32)
    kc, vc = _t(kc0, device), _t(vc0, device)
    y = ember.attention_cached(_t(q, device), _t(k, device), _t(v, device), kc, vc,
                               _t([pos], device, "int32"))
    rk, rv = kc0.copy(), vc0.copy()
    rk[pos:pos + T], rv[pos:pos + T] = k, v
    np.testing.assert_allclose(_np(y), ref_attention(q.astype(np.float64), rk, rv, pos), rtol=2e-5, atol=2e-5)
    # the caches were written in place, the rows after pos+T untouched
    np.testing.assert_array_equal(_np(kc), rk)
    np.testing.assert_array_equal(_np(vc), rv)


@pytest.mark.parametrize("d,T,pos", [(64, 1, 520), (64, 2, 300), (260, 1, 40)])
def test_attention_cached_long(device, d, T, pos):
    """Past one chunk of cache rows (webgpu: 256 per pass, value rows split in slices, loads 8 at
    a time) and a head wider than a workgroup's slices."""
    rng = np.random.default_rng(d + pos)
    C, hq, hkv = pos + T + 3, 2, 1
    kc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    vc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    q, k, v = (rng.standard_normal((T, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    y = ember.attention_cached(_t(q, device), _t(k, device), _t(v, device), _t(kc0, device), _t(vc0, device),
                               _t([pos], device, "int32"))
    rk, rv = kc0.copy(), vc0.copy()
    rk[pos:pos + T], rv[pos:pos + T] = k, v
    np.testing.assert_allclose(_np(y), ref_attention(q.astype(np.float64), rk, rv, pos), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d,T,pos,window,softcap", [(8, 5, 0, 3, 0.0), (8, 1, 6, 4, 0.0), (8, 3, 4, 2, 0.0),
                                                    (8, 4, 3, 0, 1.5), (8, 1, 7, 3, 2.0), (12, 6, 1, 4, 1.0),
                                                    (64, 1, 520, 300, 0.0), (64, 2, 300, 40, 3.0)])
def test_attention_cached_window_and_softcap(device, d, T, pos, window, softcap):
    """Gemma's sliding window (the last ``window`` rows up to each query's own) and soft-capped
    scores, against the float64 reference; each also moves the result (not ignored)."""
    rng = np.random.default_rng(d * 7 + T + pos)
    C, hq, hkv = pos + T + 2, 6 if d < 64 else 2, 2 if d < 64 else 1
    kc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    vc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    q = (3.0 * rng.standard_normal((T, hq, d))).astype(np.float32)     # (scores large enough to cap)
    k, v = (rng.standard_normal((T, hkv, d)).astype(np.float32) for _ in range(2))
    y = ember.attention_cached(_t(q, device), _t(k, device), _t(v, device), _t(kc0, device), _t(vc0, device),
                               _t([pos], device, "int32"), window=window, softcap=softcap)
    rk, rv = kc0.copy(), vc0.copy()
    rk[pos:pos + T], rv[pos:pos + T] = k, v
    want = ref_attention(q.astype(np.float64), rk, rv, pos, window, softcap)
    tol = 1e-4 if d >= 64 else 2e-5
    np.testing.assert_allclose(_np(y), want, rtol=tol, atol=tol)
    assert np.abs(want - ref_attention(q.astype(np.float64), rk, rv, pos)).max() > 1e-2


def test_attention_cached_window_rules():
    kc = ember.zeros((4, 1, 2))
    one = ember.ones((1, 1, 2))
    for bad in (dict(window=-1), dict(softcap=-1.0), dict(softcap=math.inf)):
        with pytest.raises(ShapeError, match="window"):
            ember.attention_cached(one, one, one, kc, kc, ember.tensor([0], dtype="int32"), **bad)


def test_attention_cached_full_context_raises(device):
    C, h, d = 4, 1, 2
    kc, vc = ember.zeros((C, h, d), device=device), ember.zeros((C, h, d), device=device)
    q = ember.ones((2, h, d), device=device)
    with pytest.raises(ShapeError, match="do not fit"):
        ember.attention_cached(q, q, q, kc, vc, ember.tensor([3], dtype="int32", device=device)).tolist()


def test_attention_cached_rules():
    kc = ember.zeros((4, 1, 2))
    with pytest.raises(ShapeError, match="multiple"):
        ember.attention_cached(ember.ones((1, 3, 2)), ember.ones((1, 2, 2)), ember.ones((1, 2, 2)),
                               ember.zeros((4, 2, 2)), ember.zeros((4, 2, 2)), ember.tensor([0], dtype="int32"))
    with pytest.raises(DTypeError, match="pos must be int32"):
        ember.attention_cached(ember.ones((1, 1, 2)), ember.ones((1, 1, 2)), ember.ones((1, 1, 2)), kc, kc,
                               ember.tensor([0.0]))
    with pytest.raises(ShapeError, match="caches"):
        ember.attention_cached(ember.ones((1, 1, 2)), ember.ones((1, 1, 2)), ember.ones((1, 1, 2)), kc,
                               ember.zeros((5, 1, 2)), ember.tensor([0], dtype="int32"))


def test_attention_cached_replays_with_new_positions(device):
    """A compiled one-token step: the cache grows through replays of one plan, pos as input."""
    rng = np.random.default_rng(7)
    C, hq, hkv, d = 6, 4, 2, 4
    kc, vc = ember.zeros((C, hkv, d), device=device), ember.zeros((C, hkv, d), device=device)

    @ember.compile
    def step(q, k, v, pos):
        return ember.attention_cached(q, k, v, kc, vc, pos) * 1.0

    rk, rv = np.zeros((C, hkv, d)), np.zeros((C, hkv, d))
    for p in range(C):
        q, k, v = (rng.standard_normal((1, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
        y = step(_t(q, device), _t(k, device), _t(v, device), _t([p], device, "int32"))
        rk[p], rv[p] = k[0], v[0]
        np.testing.assert_allclose(_np(y), ref_attention(q.astype(np.float64), rk, rv, p), rtol=2e-5, atol=2e-5)
    assert step.stats()["plans"] == 1 and step.stats()["replays"] == C - 1


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q5_1"])
def test_qlinear_rms_and_residual(device, qtype):
    """The folded decode products (RMSNorm before, silu(gate) * up and a residual add around a
    quantized product) against float64 numpy over the dequantized weight; rows 1 and 3 run the
    webgpu matrix-vector kernel's prologues/epilogue, 9 the decomposition."""
    from ember.ops.llm import qlinear_residual, qlinear_rms
    from ember.quant import QTensor

    rng = np.random.default_rng(1)
    n, k = 24, 64
    w = QTensor.quantize(_t(rng.standard_normal((n, k)), "python"), qtype)
    wd = np.asarray(w.dequantize().tolist(), dtype=np.float64)
    wv = w.to(device)
    nw = rng.standard_normal(k)
    # (wasm, and numpy running quant.c natively: int16 activations per block)
    tol = 5e-2 if device == "wasm" or (device == "numpy" and native_qlinear()) else 1e-3
    for M in (1, 3, 9):
        x = rng.standard_normal((M, k))
        r = rng.standard_normal((M, n))
        gu = rng.standard_normal((M, 2 * k))
        xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * nw
        got = qlinear_rms(_t(x, device), _t(nw, device), wv, eps=1e-5)
        np.testing.assert_allclose(_np(got), xn @ wd.T, rtol=tol, atol=tol)
        got = qlinear_residual(_t(x, device), wv, _t(r, device))
        np.testing.assert_allclose(_np(got), x @ wd.T + r, rtol=tol, atol=tol)
        g, u = gu[:, :k], gu[:, k:]
        got = qlinear_residual(_t(gu, device), wv, _t(r, device), glu=True)
        np.testing.assert_allclose(_np(got), (g / (1 + np.exp(-g)) * u) @ wd.T + r, rtol=tol, atol=tol)
    with pytest.raises(ShapeError, match="residual"):
        qlinear_residual(_t(np.ones((1, k)), device), wv, _t(np.ones((1, 3)), device))


def test_qlinear_rms_rope(device):
    """Stacked q/k/v rows normalised, multiplied and the q/k heads turned at positions pos..:
    against float64 numpy (1 and 3 rows: webgpu's one-dispatch epilogue; 9: the decomposition)."""
    from ember.ops.llm import qlinear_rms_rope, rope_tables
    from ember.quant import QTensor

    rng = np.random.default_rng(2)
    hd, heads, n, k, pos = 8, 3, 32, 64, 2           # rows 0..23: 3 heads turned, 24..31 not
    w = QTensor.quantize(_t(rng.standard_normal((n, k)), "python"), "q8_0")
    wd = np.asarray(w.dequantize().tolist(), dtype=np.float64)
    nw = rng.standard_normal(k)
    cos, sin = rope_tables(16, hd, 10000.0, device=device)
    cn, sn = _np(cos), _np(sin)
    tol = 5e-2 if device == "wasm" else 1e-3
    for M in (1, 3, 9):
        x = rng.standard_normal((M, k))
        y = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * nw) @ wd.T
        want = y.copy()
        for t in range(M):
            c, s = cn[pos + t], sn[pos + t]
            q = y[t, :heads * hd].reshape(heads, hd // 2, 2)
            want[t, :heads * hd] = np.stack([q[..., 0] * c - q[..., 1] * s, q[..., 0] * s + q[..., 1] * c],
                                            -1).reshape(-1)
        got = qlinear_rms_rope(_t(x, device), _t(nw, device), w.to(device), cos, sin,
                               _t([pos], device, "int32"), rope_rows=heads * hd, head_dim=hd)
        np.testing.assert_allclose(_np(got), want, rtol=tol, atol=tol)


def test_greedy_tokens(device):
    """argmax over a vocabulary split in parts (webgpu: 1024 logits per workgroup), first index
    of ties, NaN winning, as ember.argmax does."""
    from ember.ops.llm import greedy_tokens

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2500)).astype(np.float32)
    x[1, 1500] = x[1, 2100] = 9.0                        # a tie across parts: the first wins
    x[2, 7] = np.nan
    got = greedy_tokens(_t(x, device))
    assert got.tolist() == [int(np.argmax(x[0])), 1500, 7] == ember.argmax(_t(x, device), axis=-1).tolist()
    assert got.dtype == ember.int64


def test_webgpu_reductions_with_and_without_subgroups(monkeypatch):
    """The webgpu decode kernels (gemv with its RMS prologue and rope epilogue, attn) sum and
    take maxima by subgroup shuffles where the adapter has subgroups and by trees in workgroup
    memory elsewhere: both ways against the float64 references above."""
    from ember.webgpu.runtime import get_runtime

    try:
        rt = get_runtime()
    except Exception as e:   # pragma: no cover - CI has lavapipe
        pytest.skip(f"no WebGPU adapter on this machine: {e}")
    ways = ["0", "1"] if "subgroups" in rt.features else ["0"]
    for way in ways:
        monkeypatch.setenv("EMBER_WEBGPU_SUBGROUPS", way)
        test_qlinear_rms_and_residual("webgpu", "q4_1")
        test_qlinear_rms_rope("webgpu")
        test_attention_cached_long("webgpu", 64, 1, 520)
        test_attention_cached("webgpu", 3, 4)


# ---- a decode layer as three ops: the residual stream in parts ---------------------------------

def _qweight(rng, n, k, qtype, scale=0.3):
    """A random quantized weight (python-side quantization) and its float64 dequantization."""
    from ember.quant import QTensor

    a = rng.standard_normal((n, k)) * scale
    if qtype not in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):   # (ember quantizes these only)
        from llm_fixtures import quantize

        raw = quantize(a.astype(np.float32), qtype.upper())[0]
        w = QTensor.from_bytes(raw.tobytes(), qtype, (n, k), device="python")
    else:
        w = QTensor.quantize(_t(a, "python"), qtype)
    return w, np.asarray(w.dequantize().tolist(), dtype=np.float64).reshape(n, k)


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0"])
def test_qlinear_rms_parts(device, qtype):
    """x given as parts (rows summing to it: R, T, k): the same as qlinear_rms / qlinear_rms_rope
    of the sum (T = 1: webgpu sums the parts in the gemv prologue; T = 2: the composite), and a
    residual in parts for qlinear_residual (webgpu: summed in the epilogue)."""
    from ember.ops.llm import qlinear_residual, qlinear_rms, qlinear_rms_rope, rope_tables

    rng = np.random.default_rng(11)
    hd, n, k, pos = 8, 32, 64, 3
    w, wd = _qweight(rng, n, k, qtype)
    nw = rng.standard_normal(k)
    cos, sin = rope_tables(16, hd, 10000.0, device=device)
    tol = 5e-2 if device == "wasm" else 1e-3
    for R, T in ((1, 1), (5, 1), (3, 2)):
        parts = rng.standard_normal((R, T, k))
        x = parts.sum(0)
        y = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * nw) @ wd.T
        got = qlinear_rms(_t(parts, device), _t(nw, device), w.to(device), parts=True)
        assert got.shape == (T, n)
        np.testing.assert_allclose(_np(got), y, rtol=tol, atol=tol)
        want = y.copy()
        for t in range(T):
            c, s = _np(cos)[pos + t], _np(sin)[pos + t]
            q = y[t, :2 * hd].reshape(2, hd // 2, 2)
            want[t, :2 * hd] = np.stack([q[..., 0] * c - q[..., 1] * s, q[..., 0] * s + q[..., 1] * c], -1).reshape(-1)
        got = qlinear_rms_rope(_t(parts, device), _t(nw, device), w.to(device), cos, sin,
                               _t([pos], device, "int32"), rope_rows=2 * hd, head_dim=hd, parts=True)
        np.testing.assert_allclose(_np(got), want, rtol=tol, atol=tol)
        rp = rng.standard_normal((R, T, n))
        gu = rng.standard_normal((T, 2 * k))
        g, u = gu[:, :k], gu[:, k:]
        got = qlinear_residual(_t(gu, device), w.to(device), _t(rp, device), glu=True, parts=True)
        np.testing.assert_allclose(_np(got), (g / (1 + np.exp(-g)) * u) @ wd.T + rp.sum(0), rtol=tol, atol=tol)
    with pytest.raises(ShapeError, match="parts"):
        qlinear_rms(_t(np.ones(k), device), _t(nw, device), w.to(device), parts=True)


@pytest.mark.parametrize("qtype,d", [("q8_0", 32), ("q4_1", 64), ("q4_k", 64), ("q8_0", 16), ("q3_k", 64),
                                     ("q2_k", 64), ("q5_1", 32), ("iq4_nl", 32), ("iq4_xs", 64)])
def test_attention_proj(device, qtype, d):
    """attention_cached then the residual and each head's share of the output projection
    (1 + Hq, T, n): against float64 numpy; the caches are written as attention_cached writes
    them. webgpu runs the projection inside the attention's dispatch where a head is whole items
    (d = 32 in a 32-element block format, 64 in any), the composite otherwise (d = 16)."""
    from ember.ops.llm import attention_proj

    rng = np.random.default_rng(12)
    hq, hkv, C, pos, n = 4, 2, 8, 3, 40
    w, wd = _qweight(rng, n, hq * d, qtype)
    kc0 = rng.standard_normal((C, hkv, d)) * 0.5
    vc0 = rng.standard_normal((C, hkv, d))
    q = rng.standard_normal((1, hq, d))
    k = rng.standard_normal((1, hkv, d)) * 0.5
    v = rng.standard_normal((1, hkv, d))
    kc, vc = _t(kc0, device), _t(vc0, device)
    res = rng.standard_normal((1, n))
    got = attention_proj(_t(q, device), _t(k, device), _t(v, device), kc, vc, _t([pos], device, "int32"),
                         w.to(device), _t(res, device))
    kr, vr = kc0.copy(), vc0.copy()
    kr[pos], vr[pos] = k[0], v[0]
    a = ref_attention(q, kr, vr, pos)                                    # (1, Hq, d)
    want = np.stack([res] + [a[:, h] @ wd[:, h * d:(h + 1) * d].T for h in range(hq)])   # (1 + Hq, 1, n)
    tol = 5e-2 if device == "wasm" else 2e-3
    assert got.shape == (1 + hq, 1, n)
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(kc)[pos], k[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="k="):
        attention_proj(_t(q, device), _t(k, device), _t(v, device), kc, vc, _t([pos], device, "int32"),
                       _qweight(rng, n, 2 * hq * d, qtype)[0].to(device), _t(res, device))
    with pytest.raises(ShapeError, match="residual"):
        attention_proj(_t(q, device), _t(k, device), _t(v, device), kc, vc, _t([pos], device, "int32"),
                       w.to(device), _t(np.ones((1, n + 1)), device))
