"""WebGPU kernels of the LLM ops (``ember.webgpu.quant``: ``kernels/quant.wgsl``,
``kernels/llm.wgsl``): qlinear (matrix-vector and tiled), dequantize, qembedding for every
format, attention_cached (in-place cache write, GQA, replayed plans), rms_norm, rope. References:
the ``gguf`` package's dequantization + numpy, and the pure-Python device (the specification).
Small shapes: lavapipe is slow. Skipped where no adapter exists."""
import numpy as np
import pytest

import ember
from ember.errors import IndexingError, ShapeError

from conftest import webgpu_only

_REASON, pytestmark = webgpu_only()   # skips every test here where no adapter exists
gguf = pytest.importorskip("gguf")

if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import quant as wq

from gguf import GGMLQuantizationType as G  # noqa: E402
from gguf.quants import dequantize as g_dequantize, quantize as g_quantize  # noqa: E402

GT = {"q8_0": G.Q8_0, "q4_0": G.Q4_0, "q4_1": G.Q4_1, "q5_0": G.Q5_0, "q5_1": G.Q5_1, "iq4_nl": G.IQ4_NL,
      "q4_k": G.Q4_K, "q5_k": G.Q5_K, "q6_k": G.Q6_K, "q3_k": G.Q3_K, "q2_k": G.Q2_K, "iq4_xs": G.IQ4_XS,
      "f16": G.F16, "bf16": G.BF16, "f32": G.F32}
# the half-precision scale fields (byte offsets in a block) of the formats gguf cannot quantize
K_HALVES = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,),
            "iq4_xs": (0,)}
QTYPES = list(GT)
# k per format: 3 blocks of 32 (rows of 54/60/66/102 bytes: not word aligned for q4_0, q5_0,
# q8_0), 2 super-blocks of 256, 40 plain values (the tiled kernel's last k slice is partial)
K_OF = {"q8_0": 96, "q4_0": 96, "q4_1": 96, "q5_0": 96, "q5_1": 96, "q4_k": 512, "q5_k": 512, "q6_k": 512,
        "q3_k": 512, "q2_k": 512, "iq4_nl": 96, "iq4_xs": 512, "f16": 40, "bf16": 40, "f32": 40}


def make_weight(qtype, n, k, seed=0):
    """(int32 words, float32 reference (n, k)) of a random ``qtype`` weight. gguf quantizes the
    32-blocks and bf16; K-quants and iq4_* (gguf only dequantizes them) are random bytes with
    small f16 scales. The reference is gguf's dequantization."""
    rng = np.random.default_rng(seed)
    block, nbytes = wq.BLOCKS[qtype]
    if qtype in K_HALVES:
        raw = rng.integers(0, 256, size=(n, k // block, nbytes), dtype=np.uint8)
        for p in K_HALVES[qtype]:
            halves = rng.uniform(-0.05, 0.05, size=raw.shape[:2]).astype(np.float16)
            raw[:, :, p:p + 2] = halves.view(np.uint8).reshape(*raw.shape[:2], 2)
        raw = raw.reshape(n, -1)
    elif qtype == "f16":
        raw = rng.standard_normal((n, k)).astype(np.float16).view(np.uint8)
    elif qtype == "f32":
        raw = rng.standard_normal((n, k)).astype(np.float32).view(np.uint8)
    else:
        raw = g_quantize(rng.standard_normal((n, k)).astype(np.float32), GT[qtype])
    ref = g_dequantize(raw, GT[qtype]).reshape(n, k).astype(np.float32)
    b = raw.tobytes()
    b += bytes(-len(b) % 4)
    return np.frombuffer(b, "<i4").copy(), ref


def gpu(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="webgpu")


def close(got, want, tol=2e-6):
    want = np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1.0)
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


# ---- qlinear, dequantize, qembedding ------------------------------------------------------------

@pytest.mark.parametrize("qtype", QTYPES)
def test_qlinear_every_format(qtype):
    """M = 1 and 3 run the matrix-vector kernel, M = 37 the tiled one; odd n; against gguf +
    numpy, and M = 1 against the python device."""
    n, k = 19, K_OF[qtype]
    words, ref = make_weight(qtype, n, k)
    w = gpu(words)
    rng = np.random.default_rng(1)
    for M in (1, 3, 37):
        x = rng.standard_normal((M, k)).astype(np.float32)
        got = ember.qlinear(gpu(x), w, qtype=qtype, n=n, k=k).numpy()
        assert got.shape == (M, n)
        close(got, x.astype(np.float64) @ ref.T.astype(np.float64))
        if M == 1:
            py = ember.qlinear(ember.from_numpy(x, device="python"), ember.from_numpy(words, device="python"),
                               qtype=qtype, n=n, k=k).numpy()
            close(got, py)


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_and_qembedding(qtype):
    n, k = 5, K_OF[qtype]
    words, ref = make_weight(qtype, n, k, seed=2)
    w = gpu(words)
    close(ember.dequantize(w, qtype=qtype, n=n, k=k).numpy(), ref, tol=1e-6)
    ids = np.array([[4, 0], [2, 4]], np.int32)
    got = ember.qembedding(gpu(ids), w, qtype=qtype, n=n, k=k).numpy()
    assert got.shape == (2, 2, k)
    close(got, ref[ids], tol=1e-6)


def test_qembedding_ids_checked_without_a_read():
    words, ref = make_weight("q8_0", 7, 32)
    w = gpu(words)
    got = ember.qembedding(gpu(np.array([6, 1], np.int64)), w, qtype="q8_0", n=7, k=32).numpy()
    close(got, ref[[6, 1]], tol=1e-6)
    for bad in (7, -1):
        with pytest.raises(IndexingError, match="out of range"):
            ember.qembedding(gpu(np.array([0, bad], np.int32)), w, qtype="q8_0", n=7, k=32)
    # ids shifted by a constant keep a known range (integer add/subtract track it): still checked
    wg.reset_stats()
    with pytest.raises(IndexingError, match="out of range"):
        ember.qembedding(gpu(np.array([3, 6], np.int32)) + 1, w, qtype="q8_0", n=7, k=32)
    assert wg.stats()["reads"] == 0
    # ids computed on the GPU otherwise have no known range: no readback, out-of-range rows are zeros
    ids = gpu(np.array([3, 7], np.int32)) * 1
    wg.reset_stats()
    out = ember.qembedding(ids, w, qtype="q8_0", n=7, k=32)
    wg.evaluate(out)
    assert wg.stats()["reads"] == 0
    got = out.numpy()
    close(got[0], ref[3], tol=1e-6)
    assert not got[1].any()


@pytest.mark.parametrize("env", [{"EMBER_QLINEAR_XSH": "1"},
                                 {"EMBER_QLINEAR_RB": "2", "EMBER_QLINEAR_LANES": "8", "EMBER_QLINEAR_U": "1"},
                                 {"EMBER_QLINEAR_RB": "4", "EMBER_QLINEAR_LANES": "32", "EMBER_QLINEAR_XSH": "1",
                                  "EMBER_QLINEAR_U": "2"},
                                 {"EMBER_QLINEAR_RB": "2", "EMBER_QLINEAR_LANES": "8", "EMBER_QLINEAR_U": "4",
                                  "EMBER_QLINEAR_IL": "1", "EMBER_QLINEAR_WG": "64"},
                                 {"EMBER_QLINEAR_RB": "1", "EMBER_QLINEAR_LANES": "4", "EMBER_QLINEAR_U": "4",
                                  "EMBER_QLINEAR_IL": "1", "EMBER_QLINEAR_WG": "32", "EMBER_QLINEAR_XSH": "1"},
                                 {"EMBER_QLINEAR_PROMPT": "tiled"}, {"EMBER_QLINEAR_PROMPT": "dequant"}])
def test_qlinear_variants(monkeypatch, env):
    """The matrix-vector kernel's layouts (x staged in workgroup memory; several rows per
    thread group; few lanes; runs of 1, 2 or 4 items; 4 items interleaved across the lanes; workgroups of
    32 or 64 threads) and the prompt paths (the scalar tiled
    kernel of adapters with little workgroup memory; dequantize + matmul) give the same
    products, for rows of a ragged number of groups and tiles."""
    for k_, v in env.items():
        monkeypatch.setenv(k_, v)
    rng = np.random.default_rng(3)
    for qtype, n, k in (("q5_0", 13, 96), ("q4_k", 11, 512)):
        words, ref = make_weight(qtype, n, k, seed=4)
        for M in ((1, 5) if "EMBER_QLINEAR_PROMPT" not in env else (70,)):
            x = rng.standard_normal((M, k)).astype(np.float32)
            close(ember.qlinear(gpu(x), gpu(words), qtype=qtype, n=n, k=k).numpy(), x.astype(np.float64) @ ref.T)


def test_qlinear_reads_views_in_place():
    """x at an element offset that is not a multiple of 4 (read as scalars) and a weight that is
    a slice of a larger int32 tensor: no copy, one dispatch, same numbers."""
    n, k = 9, 64
    words, ref = make_weight("q4_1", n, k, seed=5)
    big_w = gpu(np.concatenate([np.arange(3, dtype=np.int32), words, np.arange(5, dtype=np.int32)]))
    w = big_w[3:3 + words.size]
    x = np.random.default_rng(6).standard_normal((3, k)).astype(np.float32)
    big_x = gpu(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    xv = big_x[1:].reshape((3, k))
    ember.webgpu.evaluate(w, xv)
    for rows in (xv[:1], xv):
        wg.reset_stats()
        out = ember.qlinear(rows, w, qtype="q4_1", n=n, k=k)
        wg.evaluate(out)
        assert wg.stats()["dispatches"] == 1
        close(out.numpy(), x[:rows.shape[0]].astype(np.float64) @ ref.T)


def test_f16_rows_of_any_length():
    """f16 has one element per "block": k = 7 leaves the last 8-element item partial (x staged
    with zero padding in the matrix-vector kernel, the tiled kernel's slice guarded)."""
    n, k = 5, 7
    words, ref = make_weight("f16", n, k, seed=7)
    rng = np.random.default_rng(8)
    for M in (1, 9):
        x = rng.standard_normal((M, k)).astype(np.float32)
        close(ember.qlinear(gpu(x), gpu(words), qtype="f16", n=n, k=k).numpy(), x.astype(np.float64) @ ref.T)
    close(ember.dequantize(gpu(words), qtype="f16", n=n, k=k).numpy(), ref, tol=0)


def test_qlinear_leading_axes_and_empty():
    words, ref = make_weight("q8_0", 6, 32, seed=9)
    x = np.random.default_rng(10).standard_normal((2, 3, 32)).astype(np.float32)
    got = ember.qlinear(gpu(x), gpu(words), qtype="q8_0", n=6, k=32).numpy()
    assert got.shape == (2, 3, 6)
    close(got, x.astype(np.float64) @ ref.T)
    assert ember.qlinear(gpu(np.zeros((0, 32), np.float32)), gpu(words), qtype="q8_0", n=6, k=32).shape == (0, 6)


# ---- attention_cached -------------------------------------------------------------------------

def ref_attention(q, kc, vc, pos):
    """numpy reference over the cache contents after the write (rows 0..pos+t, clamped)."""
    T, Hq, D = q.shape
    C, Hkv, _ = kc.shape
    out = np.zeros((T, Hq, D))
    for t in range(T):
        S = min(pos + t + 1, C)
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s = kc[:S, g].astype(np.float64) @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vc[:S, g]
    return out


def _qkv(rng, T, Hq, Hkv, D):
    return (rng.standard_normal((T, Hq, D)).astype(np.float32), rng.standard_normal((T, Hkv, D)).astype(np.float32),
            rng.standard_normal((T, Hkv, D)).astype(np.float32))


def test_attention_cached_gqa_consecutive_calls():
    """GQA 9/3, D = 72 (two head dims per thread), a prompt of 5 then single tokens, then 5
    tokens at pos 62 (67 rows: two chunks of the online softmax); the caches keep every write;
    the python device runs the same calls on its own caches."""
    C, Hq, Hkv, D = 70, 9, 3, 72
    rng = np.random.default_rng(11)
    kc, vc = ember.zeros((C, Hkv, D), device="webgpu"), ember.zeros((C, Hkv, D), device="webgpu")
    pkc, pvc = ember.zeros((C, Hkv, D), device="python"), ember.zeros((C, Hkv, D), device="python")
    kc_np, vc_np = np.zeros((C, Hkv, D), np.float32), np.zeros((C, Hkv, D), np.float32)
    for T, pos in ((5, 0), (1, 5), (1, 6), (5, 62)):
        q, k, v = _qkv(rng, T, Hq, Hkv, D)
        kc_np[pos:pos + T], vc_np[pos:pos + T] = k, v
        p = np.array([pos], np.int32)
        got = ember.attention_cached(gpu(q), gpu(k), gpu(v), kc, vc, gpu(p)).numpy()
        close(got, ref_attention(q, kc_np, vc_np, pos), tol=2e-5)
        if pos < 6:   # the pure-Python kernel on the same calls (the long one is slow there)
            py = ember.attention_cached(*[ember.from_numpy(a, device="python") for a in (q, k, v)], pkc, pvc,
                                        ember.from_numpy(p, device="python")).numpy()
            close(got, py, tol=2e-5)
        np.testing.assert_array_equal(kc.numpy(), kc_np)
        np.testing.assert_array_equal(vc.numpy(), vc_np)


@pytest.mark.parametrize("D", [8, 6])
def test_attention_cached_bounds(D):
    """A host pos past the cache raises ShapeError before any write; a pos computed on the GPU
    (its value unknown to Python: nothing is read back) writes only rows inside the cache and
    attends to rows 0..C-1: the rows after the cache in its buffer keep their values. (D = 6:
    key rows read as floats, not vec4.)"""
    C, Hq, Hkv = 6, 4, 2
    rng = np.random.default_rng(12)
    big_k = gpu(np.full((C + 3, Hkv, D), 7.0, np.float32))
    big_v = gpu(np.full((C + 3, Hkv, D), -7.0, np.float32))
    kc, vc = big_k[:C], big_v[:C]
    q, k, v = _qkv(rng, 3, Hq, Hkv, D)
    for bad in (C - 2, -1):
        with pytest.raises(ShapeError, match="do not fit"):
            ember.attention_cached(gpu(q), gpu(k), gpu(v), kc, vc, gpu(np.array([bad], np.int32)))
    assert (big_k.numpy() == 7.0).all()
    pos = gpu(np.array([C - 2], np.int32)) * 1          # lazy: no known range (add keeps one)
    wg.reset_stats()
    out = ember.attention_cached(gpu(q), gpu(k), gpu(v), kc, vc, pos)
    wg.evaluate(out)
    assert wg.stats()["reads"] == 0
    kc_np = np.full((C, Hkv, D), 7.0, np.float32)
    vc_np = np.full((C, Hkv, D), -7.0, np.float32)
    kc_np[C - 2:], vc_np[C - 2:] = k[:2], v[:2]
    close(out.numpy(), ref_attention(q, kc_np, vc_np, C - 2), tol=2e-5)
    np.testing.assert_array_equal(big_k.numpy()[:C], kc_np)
    assert (big_k.numpy()[C:] == 7.0).all() and (big_v.numpy()[C:] == -7.0).all()


def test_attention_cached_cache_must_be_writable_in_place():
    C, Hkv, D = 4, 2, 8
    rng = np.random.default_rng(13)
    q, k, v = _qkv(rng, 1, 2, Hkv, D)
    strided = ember.zeros((Hkv, C, D), device="webgpu").permute_dims((1, 0, 2))
    vc = ember.zeros((C, Hkv, D), device="webgpu")
    with pytest.raises(ShapeError, match="contiguous"):
        ember.attention_cached(gpu(q), gpu(k), gpu(v), strided, vc, gpu(np.array([0], np.int32)))
    # k read from the cache it is written into (one buffer bound read-only and writable):
    # copied first, the result as if k had been a separate tensor
    kc_np = rng.standard_normal((C, Hkv, D)).astype(np.float32)
    kc = gpu(kc_np)
    out = ember.attention_cached(gpu(q), kc[2:3], gpu(v), kc, vc, gpu(np.array([0], np.int32))).numpy()
    kc_np[0] = kc_np[2]
    vc_np = np.zeros((C, Hkv, D), np.float32)
    vc_np[0] = v[0]
    np.testing.assert_array_equal(kc.numpy(), kc_np)
    close(out, ref_attention(q, kc_np, vc_np, 0), tol=2e-5)


def test_attention_cached_one_buffer_for_both_caches():
    """k_cache and v_cache as two views of one (2, C, Hkv, D) tensor (the buffer bound writable
    twice), q at an offset inside the same buffer as k: one dispatch, the same results."""
    C, Hq, Hkv, D = 5, 6, 2, 8
    rng = np.random.default_rng(17)
    kv = ember.zeros((2, C, Hkv, D), device="webgpu")
    wg.evaluate(kv)    # (a slice of a lazy constant is another constant, not a view of its buffer)
    kc, vc = kv[0], kv[1]
    kc_np, vc_np = np.zeros((C, Hkv, D), np.float32), np.zeros((C, Hkv, D), np.float32)
    for T, pos in ((2, 0), (1, 2)):
        q, k, v = _qkv(rng, T, Hq, Hkv, D)
        qk = gpu(np.concatenate([q.reshape(T, -1), k.reshape(T, -1)], axis=1))   # (T, (Hq + Hkv) D)
        tq, tk = qk[:, :Hq * D].reshape((T, Hq, D)), qk[:, Hq * D:].reshape((T, Hkv, D))
        kc_np[pos:pos + T], vc_np[pos:pos + T] = k, v
        p, tv = gpu(np.array([pos], np.int32)), gpu(v)
        wg.evaluate(tq, tk, p, tv)
        wg.reset_stats()
        out = ember.attention_cached(tq, tk, tv, kc, vc, p)
        wg.evaluate(out)
        assert wg.stats()["dispatches"] <= 3     # attn, and q and k made contiguous on the first call
        close(out.numpy(), ref_attention(q, kc_np, vc_np, pos), tol=2e-5)
    np.testing.assert_array_equal(kv.numpy(), np.stack([kc_np, vc_np]))


def test_attention_cached_replayed_plan():
    """An ember.compile plan of a decode step (one token, pos an input) replays the dispatch
    with each new pos: the caches grow in place, outputs match the reference."""
    C, Hq, Hkv, D = 8, 9, 3, 16
    rng = np.random.default_rng(14)
    kc, vc = ember.zeros((C, Hkv, D), device="webgpu"), ember.zeros((C, Hkv, D), device="webgpu")
    kc_np, vc_np = np.zeros((C, Hkv, D), np.float32), np.zeros((C, Hkv, D), np.float32)
    step = ember.compile(lambda q, k, v, pos: ember.attention_cached(q, k, v, kc, vc, pos) * 1.0)
    for pos in range(5):
        q, k, v = _qkv(rng, 1, Hq, Hkv, D)
        kc_np[pos], vc_np[pos] = k[0], v[0]
        ins = [gpu(q), gpu(k), gpu(v), gpu(np.array([pos], np.int32))]
        ember.webgpu.evaluate(*ins)
        wg.reset_stats()
        out = step(*ins)
        wg.evaluate(out)
        if pos >= 2:   # attention_cached and the fused "* 1.0": two dispatches, no read
            assert wg.stats()["dispatches"] == 2 and wg.stats()["reads"] == 0
        close(out.numpy(), ref_attention(q, kc_np, vc_np, pos), tol=2e-5)
    assert step.stats()["replays"] >= 3
    np.testing.assert_array_equal(kc.numpy(), kc_np)


# ---- rms_norm, rope -----------------------------------------------------------------------------

def test_rms_norm_one_dispatch():
    rng = np.random.default_rng(15)
    for shape in ((3, 576), (2, 2, 40)):
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        wg.reset_stats()
        out = ember.rms_norm(gpu(x), gpu(w), eps=1e-5)
        wg.evaluate(out)
        assert wg.stats()["dispatches"] == 1
        want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
        close(out.numpy(), want)
        py = ember.rms_norm(ember.from_numpy(x, device="python"), ember.from_numpy(w, device="python"), eps=1e-5)
        close(out.numpy(), py.numpy())


@pytest.mark.parametrize("mode", ["pairs", "halves"])
def test_rope(mode):
    T, H, D = 3, 5, 16
    rng = np.random.default_rng(16)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    cos, sin = ember.ops.llm.rope_tables(T, D, base=100000.0)
    wg.reset_stats()
    out = ember.rope(gpu(x), cos.to("webgpu"), sin.to("webgpu"), mode=mode)
    wg.evaluate(out)
    assert wg.stats()["dispatches"] == 1
    want = ember.rope(ember.from_numpy(x, device="python"), cos, sin, mode=mode).numpy()
    close(out.numpy(), want)


# ---- the same kernels in the page (Chromium's WebGPU on SwiftShader, its own WGSL compiler) -----

PAGE_CODE = r'''
import json, random
import ember
import ember.webgpu as wg
from ember import quant

await wg.init()
rng = random.Random(5)
out = {"limits": wg.info()["limits"]}

def weight(qtype, n, k):
    """int32 words of a random weight: quantized values for the 32-blocks, random blocks with
    small f16 scales for the K-quants, plain values for f16/bf16/f32."""
    fmt = quant.FORMATS[qtype]
    if qtype in ("q4_k", "q5_k", "q6_k"):
        raw = bytearray(rng.randrange(256) for _ in range(n * k // fmt.block * fmt.nbytes))
        for b in range(n * k // fmt.block):
            for p in {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}[qtype]:
                raw[b * fmt.nbytes + p:b * fmt.nbytes + p + 2] = quant._to_half(rng.uniform(-0.05, 0.05))
        raw = bytes(raw)
    else:
        raw = quant.quantize([rng.gauss(0, 1) for _ in range(n * k)], qtype)
    return quant.QTensor.from_bytes(raw, qtype, (n, k)).data.tolist()

def both(fn, *data, dtypes=()):
    res = {}
    for dev in ("python", "webgpu"):
        ts = [ember.tensor(d, device=dev, dtype=(dtypes[i] if i < len(dtypes) else None)) for i, d in enumerate(data)]
        res[dev] = fn(*ts).tolist()
    return res

# Every pipeline compiles all the format decoders (the prelude): these formats cover the template
# branches (whole-word blocks and x read as vec4: q4_1; 2-byte aligned fields: q5_0, q6_k; a
# partial last item, x staged and read as scalars: f16 with k = 13) at M = 1 (gemv), two of them
# at M = 9 (tiled); dequantize and qembedding once each.
for qt, k in (("q4_1", 64), ("q5_0", 64), ("q6_k", 256), ("f16", 13)):
    n = 5
    w = weight(qt, n, k)
    for M in ((1, 9) if qt in ("q5_0", "f16") else (1,)):
        x = [[rng.gauss(0, 1) for _ in range(k)] for _ in range(M)]
        out[f"qlinear_{qt}_{M}"] = both(lambda x_, w_: ember.qlinear(x_, w_, qtype=qt, n=n, k=k), x, w,
                                        dtypes=("float32", "int32"))
    if qt == "q5_0":
        out["qembedding"] = both(lambda i_, w_: ember.qembedding(i_, w_, qtype=qt, n=n, k=k), [4, 0, 2], w,
                                 dtypes=("int32", "int32"))
        out["dequantize"] = both(lambda w_: ember.dequantize(w_, qtype=qt, n=n, k=k), w, dtypes=("int32",))

C, Hq, Hkv, D = 6, 4, 2, 8
res = {}
for dev in ("python", "webgpu"):
    kc, vc = ember.zeros((C, Hkv, D), device=dev), ember.zeros((C, Hkv, D), device=dev)
    r2 = random.Random(9)
    outs = []
    for T, pos in ((3, 0), (1, 3)):
        q, k_, v = ([[[r2.gauss(0, 1) for _ in range(D)] for _ in range(h)] for _ in range(T)] for h in (Hq, Hkv, Hkv))
        t = [ember.tensor(a, device=dev) for a in (q, k_, v)]
        outs.append(ember.attention_cached(*t, kc, vc, ember.tensor([pos], dtype="int32", device=dev)).tolist())
    res[dev] = [outs, kc.tolist(), vc.tolist()]
out["attention_cached"] = res
X = [[rng.gauss(0, 1) for _ in range(40)] for _ in range(3)]
out["rms_norm"] = both(lambda x_, w_: ember.rms_norm(x_, w_), X, [rng.gauss(0, 1) for _ in range(40)])
c, s = ember.ops.llm.rope_tables(3, 8)
for mode in ("pairs", "halves"):
    out["rope_" + mode] = both(lambda x_, c_, s_: ember.rope(x_, c_, s_, mode=mode),
                               [[[rng.gauss(0, 1) for _ in range(8)] for _ in range(2)] for _ in range(3)], c.tolist(), s.tolist())
json.dumps(out)
'''


def _flat(x):
    if isinstance(x, list):
        return [v for item in x for v in _flat(item)]
    return [x]


def test_llm_kernels_in_the_page(tmp_path):
    from browser_page import SKIPS, run_page

    for mark in SKIPS:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    res = run_page(tmp_path, PAGE_CODE, webgpu=True, timeout_ms=300_000)
    names = [n for n in res if n != "limits"]
    assert len(names) == 12     # 6 qlinear, qembedding, dequantize, attention, rms_norm, 2 rope
    for name in names:
        a, b = np.array(_flat(res[name]["webgpu"]), np.float64), np.array(_flat(res[name]["python"]), np.float64)
        assert a.shape == b.shape and np.isfinite(b).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(b).max())), err_msg=name)
