"""webgpu's int8-activation matrix-vector kernel (``gemv8``: one x row, a large weight of a
32-element block format or a K-quant (q4_k q5_k q6_k q3_k, a 32-element sub-block at a time); x
rounded to int8 per block of 32, block products by dot4I8Packed) against a float64 numpy model
of exactly that rounding (tight) and against the float product (loose: the rounding's own error,
~0.5% of the outputs' spread), for the plain product and the folded decode ops (RMSNorm before,
silu(gate) * up before, residual after, rope after); and the same products with
``EMBER_QLINEAR_I8=0`` (the float kernel) against the float product."""
import sys
from pathlib import Path

import numpy as np
import pytest

import ember

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as G  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_fixtures import quantize as fixtures_quantize  # noqa: E402

FORMATS = {"q8_0": G.Q8_0, "q4_0": G.Q4_0, "q4_1": G.Q4_1, "q5_0": G.Q5_0, "q5_1": G.Q5_1,
           "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K, "q3_k": G.Q3_K}
KQUANTS = ("q4_k", "q5_k", "q6_k", "q3_k")
N, K = 1040, 4096          # n * k just over the 4M elements from which products take gemv8


def small_shape(qtype):
    """(n, k) of the offset and layout tests: n * k just over 4M, k an odd number of blocks (33
    blocks of 32; 5 super-blocks of 256 for the K-quants) so that rows shift the blocks'
    alignments (q6_k's 210 and q3_k's 110 bytes: every other row starts 2 bytes into a word)."""
    return (3300, 1280) if qtype in KQUANTS else (4100, 1056)


def weight(qtype, a):
    """(raw blocks (n, row bytes) uint8, float64 dequantization) of float32 ``a`` in ``qtype``:
    gguf's quantizer, or (K-quants, which gguf does not quantize) the numpy ones of
    tests/llm_fixtures.py; q5_k (none there) is q4_k's blocks with random 5th bits inserted."""
    n, k = a.shape
    if qtype in ("q4_k", "q6_k", "q3_k"):
        raw = fixtures_quantize(a, qtype.upper())[0]
    elif qtype == "q5_k":
        q4 = fixtures_quantize(a, "Q4_K")[0].reshape(n, k // 256, 144)
        qh = np.random.default_rng(n + k).integers(0, 256, (n, k // 256, 32), dtype=np.uint8)
        raw = np.concatenate([q4[:, :, :16], qh, q4[:, :, 16:]], axis=2).reshape(n, -1)
    else:
        raw = quantize(a, FORMATS[qtype])
    return raw, dequantize(raw, FORMATS[qtype]).reshape(n, k).astype(np.float64)


def block_mins(qtype, raw, n, k):
    """(n, k // 32) float64: the minimum of each 32-element (sub-)block, the term gemv8 meets
    with x's exact float block sum (zeros for the formats without one)."""
    if qtype in ("q4_1", "q5_1"):
        blk = raw.reshape(n, k // 32, -1)
        return blk[:, :, 2:4].copy().view(np.float16).astype(np.float64)[..., 0]
    if qtype in ("q4_k", "q5_k"):
        blk = raw.reshape(n, k // 256, -1)
        dmin = blk[:, :, 2:4].copy().view(np.float16).astype(np.float64)[..., 0]
        sc = blk[:, :, 4:16].astype(np.int64)
        m = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], axis=2)
        return (-dmin[..., None] * m).reshape(n, k // 32)       # value d * sc * q - dmin * m
    return np.zeros((n, k // 32))


def _t(a, dtype="float32"):
    return ember.tensor(np.asarray(a).tolist(), dtype=dtype, device="webgpu")


def _np(t):
    return np.asarray(t.tolist(), dtype=np.float64)


def x_int8(x):
    """x (k,) as gemv8 rounds it: per block of 32, scale max|x| / 127, round half to even."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    mx = np.abs(b).max(1, keepdims=True)
    inv = np.where(mx == 0, np.float32(0), np.float32(127) / np.where(mx == 0, 1, mx)).astype(np.float32)
    return (np.round(b * inv).astype(np.float64) * (mx.astype(np.float64) / 127.0)).reshape(-1)


def model(qtype, raw, wd, x, n=N, k=K):
    """gemv8's product in float64: the minimum terms (q4_1's / q5_1's m, q4_k's / q5_k's
    -dmin * m_j) meet the exact float sum of each x block, every other term the rounded x."""
    xr = x_int8(x)
    m = block_mins(qtype, raw, n, k)
    xs = np.asarray(x, np.float32).astype(np.float64).reshape(-1, 32)
    return (wd - np.repeat(m, 32, 1)) @ xr + m @ xs.sum(1)


def check(got, want_model, want_float):
    spread = np.abs(want_float).max()
    np.testing.assert_allclose(got, want_model, atol=2e-3 * spread + 1e-4, rtol=0)
    assert np.std(got - want_float) < 0.012 * np.std(want_float)


@pytest.mark.parametrize("qtype", list(FORMATS))
def test_gemv8_products(rt, qtype, monkeypatch):
    from ember.ops.llm import qlinear_residual, qlinear_rms, qlinear_rms_rope, rope_tables
    from ember.webgpu.quant import _use_gemv8

    if not _use_gemv8(rt, qtype, N, K, 64, 4):
        pytest.skip("this adapter's WGSL has no packed 4x8 dot product (the float kernel runs)")
    rng = np.random.default_rng(7)
    raw, wd = weight(qtype, rng.standard_normal((N, K)).astype(np.float32))
    from ember.quant import QTensor

    w = QTensor(_t(np.frombuffer(raw.tobytes(), "<i4"), "int32"), qtype, (N, K))
    x = rng.standard_normal(K).astype(np.float32) * np.repeat(rng.uniform(0.1, 3, K // 32), 32).astype(np.float32)
    x[:32] = 0                                   # a block of zeros (scale 0)
    r = rng.standard_normal(N).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    gu = rng.standard_normal(2 * K).astype(np.float32)
    for i8 in ("1", "0"):
        monkeypatch.setenv("EMBER_QLINEAR_I8", i8)
        exact = i8 == "0"
        got = _np(ember.qlinear(_t(x[None]), w.data, qtype=qtype, n=N, k=K))[0]
        want = wd @ x.astype(np.float64)
        if exact:
            np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)
        else:
            check(got, model(qtype, raw, wd, x), want)
        # RMSNorm before: x * weight quantized, 1/rms (a scalar) after
        rms = 1 / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-5)
        got = _np(qlinear_rms(_t(x[None]), _t(nw), w, eps=1e-5))[0]
        xn = (x * nw).astype(np.float32)
        want = rms * (wd @ xn.astype(np.float64))
        # the same x as a residual stream in parts (rows summed in the prologue: the output head
        # of a decode step whose layers run as three dispatches)
        parts = np.stack([x * 0.5, x * 0.25, x * 0.25])[:, None, :]
        got_p = _np(qlinear_rms(_t(parts), _t(nw), w, eps=1e-5, parts=True))[0]
        for g in (got, got_p):
            if exact:
                np.testing.assert_allclose(g, want, atol=1e-3, rtol=1e-4)
            else:
                check(g, rms * model(qtype, raw, wd, xn), want)
        # silu(gate) * up before, a residual after
        g, u = gu[:K].astype(np.float64), gu[K:].astype(np.float64)
        xg = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        got = _np(qlinear_residual(_t(gu[None]), w, _t(r[None]), glu=True))[0]
        want = wd @ xg.astype(np.float64) + r
        if exact:
            np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)
        else:
            check(got, model(qtype, raw, wd, xg) + r, want)
    # rope after (rows 0..511 turned as 8 heads of 64 at position 3)
    monkeypatch.setenv("EMBER_QLINEAR_I8", "1")
    hd, pos = 64, 3
    cos, sin = rope_tables(8, hd, 10000.0, device="webgpu")
    got = _np(qlinear_rms_rope(_t(x[None]), _t(nw), w, cos, sin, _t([pos], "int32"), rope_rows=8 * hd,
                               head_dim=hd))[0]

    def turn(y):
        y = y.copy()
        c, s = _np(cos)[pos], _np(sin)[pos]
        q = y[:8 * hd].reshape(8, hd // 2, 2)
        y[:8 * hd] = np.stack([q[..., 0] * c - q[..., 1] * s, q[..., 0] * s + q[..., 1] * c], -1).reshape(-1)
        return y
    check(got, turn(rms * model(qtype, raw, wd, xn)), turn(rms * (wd @ xn.astype(np.float64))))


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1", "q4_k", "q6_k", "q3_k"])
@pytest.mark.parametrize("lead", [0, 1, 2, 3, 5])
def test_gemv8_weight_at_an_offset(rt, qtype, lead):
    """A weight that starts ``lead`` words into its buffer (a view, as a GGUF's tensors in one
    upload can be): its blocks at every alignment give the modelled product, near float."""
    from ember.quant import QTensor
    from ember.webgpu.quant import _use_gemv8

    n, k = small_shape(qtype)
    if not _use_gemv8(rt, qtype, n, k, 64, 4):
        pytest.skip("this adapter's WGSL has no packed 4x8 dot product (the float kernel runs)")
    rng = np.random.default_rng(lead)
    raw, wd = weight(qtype, rng.standard_normal((n, k)).astype(np.float32))
    words = np.concatenate([np.arange(lead, dtype="<i4"), np.frombuffer(raw.tobytes(), "<i4")])
    w = QTensor(_t(words, "int32")[lead:], qtype, (n, k))
    x = rng.standard_normal(k).astype(np.float32)
    got = _np(ember.qlinear(_t(x[None]), w.data, qtype=qtype, n=n, k=k))[0]
    check(got, model(qtype, raw, wd, x, n, k), wd @ x.astype(np.float64))



@pytest.mark.parametrize("qtype", list(FORMATS))
@pytest.mark.parametrize("layout", [(16, 1, 64), (8, 2, 256), (64, 1, 256), (4, 4, 64)])
def test_gemv8_layouts(rt, qtype, layout, monkeypatch):
    """``gemv8`` with other groups (``lanes`` threads of ``rb`` rows) and workgroups of ``wg``
    threads (x's 264 / 320 vec4s over 64 threads: five rounds): the modelled product, for rows
    and blocks at every alignment (``small_shape``)."""
    from ember.quant import QTensor
    from ember.webgpu.quant import _use_gemv8

    lanes, rb, wg = layout
    n, k = small_shape(qtype)
    if not _use_gemv8(rt, qtype, n, k, 64, 4):
        pytest.skip("this adapter's WGSL has no packed 4x8 dot product (the float kernel runs)")
    monkeypatch.setenv("EMBER_QLINEAR_LANES", str(lanes))
    monkeypatch.setenv("EMBER_QLINEAR_RB", str(rb))
    monkeypatch.setenv("EMBER_QLINEAR_WG", str(wg))
    rng = np.random.default_rng(wg + lanes)
    raw, wd = weight(qtype, rng.standard_normal((n, k)).astype(np.float32))
    w = QTensor(_t(np.frombuffer(raw.tobytes(), "<i4"), "int32"), qtype, (n, k))
    x = rng.standard_normal(k).astype(np.float32) + 0.5          # a mean: q4_1's minimum term counts
    got = _np(ember.qlinear(_t(x[None]), w.data, qtype=qtype, n=n, k=k))[0]
    check(got, model(qtype, raw, wd, x, n, k), wd @ x.astype(np.float64))


def test_q5_k_blocks_are_ember_s():
    """The q5_k blocks ``weight`` makes dequantize (gguf's) as ember.quant's reference does."""
    from ember.quant import FORMATS as EF

    a = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    raw, wd = weight("q5_k", a)
    ref = np.frombuffer(EF["q5_k"].dequantize(raw.tobytes()), np.float32).reshape(2, 512)
    np.testing.assert_array_equal(ref, wd.astype(np.float32))
