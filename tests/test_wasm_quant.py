"""The wasm backend's quantized-weight and language-model kernels (wasm/kernels/quant.c, llm.c;
wasm/ops_quant.py), under wasmtime, against the ``gguf`` package, numpy and the python backend's
kernels (the specification).

Tolerances, and why:
- ``dequantize`` / ``qembedding``: bit-equal to ``gguf.quants.dequantize`` (each value is one
  float32 rounding of an exact value, in both).
- ``qlinear`` on the integer formats quantizes each row of x per block of 32 to int16 (dx = amax /
  32767, round half to even) and applies a block's offset term (Q4_1's min, Q4_0's -8 d, the
  K-quant mins) to the float sum of x. ``mixed_reference`` computes exactly that in float64 from
  the gguf dequantization, so the kernel must match it to float32 summation error: 2e-6 of
  sum |x| |w| (measured: up to 2e-7). Against the plain float product the int16 rounding adds at
  most half a step (amax / 32767 of the element's block) per element, times |w| (``int16_bound``;
  typically 1e-5 of sum |x| |w|); the python kernel's product is held to the same bound.
- ``qlinear`` on f32/f16/bf16 is a float32 product: 1e-6 of sum |x| |w|.
- rope computes in float64 from float32 inputs like the python kernel: bit-equal. rms_norm differs
  from it only in the float64 summation order: 1 ulp. attention_cached is float32 with its own
  exp: 2e-6 relative to the largest |v|.
Every kernel is also run in a memory with guard bytes around each buffer: nothing outside the
spans it was handed (and nothing in its read-only inputs) may change.
"""
from __future__ import annotations

from array import array
from math import prod

import numpy as np
import pytest

import ember
from ember import quant
from ember.errors import DeviceError, IndexingError, ShapeError

gguf = pytest.importorskip("gguf")

try:
    ember.get_backend("wasm")
except DeviceError as e:   # no wasmtime / kernel module here
    pytest.skip(f"wasm backend unavailable: {e}", allow_module_level=True)

from ember.wasm import ops_quant  # noqa: E402
from ember.wasm.runtime import R, W, runtime  # noqa: E402

GT = gguf.GGMLQuantizationType
GGUF_TYPE = {"f32": GT.F32, "f16": GT.F16, "bf16": GT.BF16, "q8_0": GT.Q8_0, "q4_0": GT.Q4_0,
             "q4_1": GT.Q4_1, "q5_0": GT.Q5_0, "q4_k": GT.Q4_K, "q5_k": GT.Q5_K, "q6_k": GT.Q6_K,
             "q3_k": GT.Q3_K, "q2_k": GT.Q2_K, "q5_1": GT.Q5_1, "iq4_nl": GT.IQ4_NL, "iq4_xs": GT.IQ4_XS}
INTEGER = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k",
           "iq4_xs")
FLOATS = ("f32", "f16", "bf16")
KQUANTS = ("q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs")
RANDOM = KQUANTS + ("iq4_nl",)   # formats gguf does not quantize: random blocks
# bytes of a K-quant block that hold its half scales (d, and dmin where it has one)
HALF_BYTES = {"q4_k": (0, 4), "q5_k": (0, 4), "q6_k": (208, 210), "q3_k": (108, 110),
              "q2_k": (80, 84), "iq4_nl": (0, 2), "iq4_xs": (0, 2)}
# bytes of a block that are scales (kept by offset_weight; the rest are the quantized values): one
# span, or a tuple of spans
SCALE_BYTES = {"q4_0": (0, 2), "q4_1": (0, 4), "q5_0": (0, 2), "q5_1": (0, 4), "q8_0": (0, 2), "q4_k": (0, 16),
               "q5_k": (0, 16), "q6_k": (192, 210), "q3_k": (96, 110),
               "q2_k": ((0, 16), (80, 84)), "iq4_nl": (0, 0), "iq4_xs": (0, 0)}   # (iq4: no offset)


def block_of(qtype: str) -> int:
    return 256 if qtype in KQUANTS else 32


def make_weight(qtype: str, n: int, k: int, rng) -> np.ndarray:
    """(n, row_bytes) uint8 raw blocks: gguf-quantized normal values for the formats gguf can
    quantize; random bytes with small positive half scales for the K-quants and iq4_*."""
    g = GGUF_TYPE[qtype]
    if qtype not in RANDOM:
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), g).view(np.uint8).reshape(n, -1)
    bs, ts = gguf.GGML_QUANT_SIZES[g]
    raw = rng.integers(0, 256, (n, k // bs, ts), dtype=np.uint8)
    a, b = HALF_BYTES[qtype]
    halves = rng.uniform(0.002, 0.02, raw.shape[:2] + ((b - a) // 2,)).astype(np.float16)
    raw[..., a:b] = halves.view(np.uint8).reshape(raw.shape[:2] + (b - a,))
    return raw.reshape(n, -1)


def words(raw: np.ndarray) -> array:
    b = raw.tobytes()
    return array("i", b + b"\0" * (-len(b) % 4))


def dequant(raw: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, GGUF_TYPE[qtype]).reshape(raw.shape[0], -1).astype(np.float32)


def offset_weight(raw: np.ndarray, qtype: str) -> np.ndarray:
    """The per-element offset of the format (what the weight dequantizes to with every quantized
    value 0: m, -8 d, -16 d, -dmin m, -32 d sc, or 0)."""
    g = GGUF_TYPE[qtype]
    bs, ts = gguf.GGML_QUANT_SIZES[g]
    blocks = raw.reshape(raw.shape[0], -1, ts)
    spans = SCALE_BYTES[qtype]
    z = np.zeros_like(blocks)
    for a, b in (spans,) if isinstance(spans[0], int) else spans:
        z[..., a:b] = blocks[..., a:b]
    return dequant(z.reshape(raw.shape[0], -1), qtype)


def quantize_activation(x: np.ndarray) -> np.ndarray:
    """x as quant.c's int16 activation sees it (float32 arithmetic, as the kernel's)."""
    xb = x.reshape(x.shape[0], -1, 32)
    a = np.abs(xb).max(-1, keepdims=True)
    d = a / np.float32(32767)
    with np.errstate(divide="ignore"):
        inv = np.where(a > 0, np.float32(32767) / a, np.float32(0)).astype(np.float32)
    return (np.rint(xb * inv) * d).astype(np.float32).reshape(x.shape)


def mixed_reference(x: np.ndarray, raw: np.ndarray, qtype: str) -> np.ndarray:
    """float64: the quantized activation times the weight's quantized part, plus the exact x
    times its offset part: what the kernel computes up to float32 summation."""
    w = dequant(raw, qtype).astype(np.float64)
    c = offset_weight(raw, qtype).astype(np.float64)
    return quantize_activation(x).astype(np.float64) @ (w - c).T + x.astype(np.float64) @ c.T


def int16_bound(x, w) -> np.ndarray:
    """The most the int16 rounding of x can move x @ w.T: half a step (amax / 32767 of x's block)
    per element, times |w|."""
    amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1).astype(np.float64)
    return np.repeat(amax / 65534.0, 32, axis=1) @ np.abs(w).astype(np.float64).T


def magnitude(x, w) -> np.ndarray:
    return np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T


def q_linear(qtype, w_words, x, n, k):
    rt = runtime()
    m = x.shape[0]
    y = array("f", bytes(4 * m * n))
    scratch = array("f", bytes(4 * ops_quant.scratch_floats(qtype, m, k)))
    rc = rt.call("q_linear", R(w_words, len(w_words)), R(array("f", x.tobytes()), m * k), W(y, m * n),
                 W(scratch, len(scratch)), R(array("i", [quant.FORMATS[qtype].ggml_type, m, n, k]), 4))
    assert rc == 0
    return np.frombuffer(y, np.float32).reshape(m, n)


def wasm_tensor(a: np.ndarray, dtype="float32"):
    return ember.from_bytes(np.ascontiguousarray(a).tobytes(), a.shape, dtype, device="wasm")


# ---- dequantize ---------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", INTEGER + FLOATS)
def test_dequantize_is_bit_equal_to_gguf(qtype):
    rng = np.random.default_rng(1)
    n, k = 5, 2 * block_of(qtype)
    raw = make_weight(qtype, n, k, rng)
    w = wasm_tensor(np.frombuffer(words(raw), np.int32), "int32")
    got = np.array(ember.dequantize(w, qtype=qtype, n=n, k=k).tolist(), np.float32)
    assert got.view(np.uint32).tolist() == dequant(raw, qtype).view(np.uint32).tolist()


@pytest.mark.parametrize("qtype", ("q8_0", "q4_1", "q6_k", "q3_k", "q2_k", "f16"))
def test_dequantize_special_half_scales(qtype):
    # subnormal, zero, negative, inf and NaN half scales: the exact conversion gguf's numpy does
    rng = np.random.default_rng(2)
    raw = make_weight(qtype, 6, block_of(qtype), rng)
    specials = np.array([1e-7, 0.0, -0.5, np.inf, -np.inf, np.nan], np.float16).view(np.uint8).reshape(6, 2)
    at = {"q6_k": 208, "q3_k": 108, "q2_k": 80, "f16": 0}.get(qtype, 0)
    raw[:, at:at + 2] = specials
    w = wasm_tensor(np.frombuffer(words(raw), np.int32), "int32")
    got = np.array(ember.dequantize(w, qtype=qtype, n=6, k=block_of(qtype)).tolist(), np.float32)
    with np.errstate(invalid="ignore"):   # gguf's inf * 0
        want = dequant(raw, qtype)
    np.testing.assert_array_equal(got, want)   # NaN where gguf has NaN


# ---- qlinear ------------------------------------------------------------------------------------

def _linear_case(qtype, m, k, n, seed):
    rng = np.random.default_rng(seed)
    raw = make_weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, :5] *= 30.0   # one large feature per row: the block scales differ
    return raw, x


@pytest.mark.parametrize("qtype", INTEGER)
@pytest.mark.parametrize("m", (1, 3, 37))
def test_qlinear_integer_formats(qtype, m):
    blk = block_of(qtype)
    for k, n in ((blk, 7), (3 * blk, 13), (2 * blk if blk == 256 else 18 * blk, 5)):
        raw, x = _linear_case(qtype, m, k, n, seed=m * 1000 + k + n)
        y = q_linear(qtype, words(raw), x, n, k).astype(np.float64)
        w = dequant(raw, qtype)
        mag = magnitude(x, w)
        err_mixed = np.max(np.abs(y - mixed_reference(x, raw, qtype)) / mag)
        err_float = np.abs(y - x.astype(np.float64) @ w.T.astype(np.float64))
        assert err_mixed < 2e-6, (qtype, m, k, n, err_mixed)
        assert (err_float <= int16_bound(x, w) + 2e-6 * mag).all(), (qtype, m, k, n)


@pytest.mark.parametrize("qtype", FLOATS)
@pytest.mark.parametrize("m", (1, 3, 37))
def test_qlinear_float_formats(qtype, m):
    for k, n in ((32, 7), (96, 45), (40, 3)):
        raw, x = _linear_case(qtype, m, k, n, seed=k + n + m)
        w = dequant(raw, qtype)
        y = q_linear(qtype, words(raw), x, n, k)
        err = np.max(np.abs(y - x.astype(np.float64) @ w.T.astype(np.float64)) / magnitude(x, w))
        assert err < 1e-6, (qtype, m, k, n, err)


@pytest.mark.parametrize("qtype", INTEGER)
def test_qlinear_row_results_do_not_depend_on_m(qtype):
    # the fused path (one row) and the tiled path (many) give the same bits for a row
    k, n = 2 * block_of(qtype), 11
    raw, x = _linear_case(qtype, 37, k, n, seed=5)
    w = words(raw)
    y37 = q_linear(qtype, w, x, n, k)
    for i in (0, 17, 36):
        assert q_linear(qtype, w, x[i:i + 1], n, k).tobytes() == y37[i:i + 1].tobytes()
    assert q_linear(qtype, w, x[:3], n, k).tobytes() == y37[:3].tobytes()


@pytest.mark.parametrize("qtype", ("q4_1", "q8_0", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "f16"))
def test_qlinear_op_against_the_python_kernel(qtype):
    k, n = 2 * block_of(qtype), 9
    raw, x = _linear_case(qtype, 6, k, n, seed=9)
    xs = x.reshape(2, 3, k)
    wt = np.frombuffer(words(raw), np.int32)
    yw = ember.qlinear(wasm_tensor(xs), wasm_tensor(wt, "int32"), qtype=qtype, n=n, k=k)
    yp = ember.qlinear(wasm_tensor(xs).to("python"), wasm_tensor(wt, "int32").to("python"), qtype=qtype, n=n, k=k)
    assert yw.shape == yp.shape == (2, 3, n) and yw.device == "wasm"
    w = dequant(raw, qtype)
    mag = magnitude(x, w).reshape(2, 3, n)
    bound = 0 if qtype == "f16" else int16_bound(x, w).reshape(2, 3, n)
    err = np.abs(np.array(yw.tolist()) - np.array(yp.tolist()))
    assert (err <= bound + 2e-6 * mag).all()


def test_qlinear_non_finite_activation_gives_nan_where_it_reaches():
    k, n = 64, 6
    raw, x = _linear_case("q4_1", 3, k, n, seed=3)
    x[0, 40] = np.inf     # the second block of row 0
    x[2, 3] = np.nan      # the first block of row 2
    y = q_linear("q4_1", words(raw), x, n, k)
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all() and np.isfinite(y[1]).all()


@pytest.mark.parametrize("qtype", ("q4_1", "q8_0", "q5_0", "q5_1", "iq4_nl"))
def test_qlinear_inf_and_nan_scales(qtype):
    # the fused path converts scales without the inf/NaN case and redoes such a group exactly
    k, n = 96, 11
    raw, x = _linear_case(qtype, 3, k, n, seed=14)
    bs = gguf.GGML_QUANT_SIZES[GGUF_TYPE[qtype]][1]
    bad = raw.copy()
    bad[2, bs:bs + 2] = np.array([np.inf], np.float16).view(np.uint8)        # row 2, block 1: d = inf
    at = 2 if qtype in ("q4_1", "q5_1") else 0                                # row 9: m (or d) = NaN
    bad[9, at:at + 2] = np.array([np.nan], np.float16).view(np.uint8)
    clean = q_linear(qtype, words(raw), x[:1], n, k)[0]
    y1 = q_linear(qtype, words(bad), x[:1], n, k)[0]
    finite = [j for j in range(n) if j not in (2, 9)]
    assert y1[finite].tobytes() == clean[finite].tobytes()
    assert not np.isfinite(y1[[2, 9]]).any()
    np.testing.assert_array_equal(y1, q_linear(qtype, words(bad), x, n, k)[0])   # the tiled path agrees


@pytest.mark.parametrize("qtype", ("q4_1", "q8_0", "q4_0", "q5_1"))
def test_qlinear_every_half_scale(qtype):
    # the fused path (one row of x) converts a block's half scales with a shift trick and finds
    # exponent 31 from the fields' maximum; the tiled path (4 rows) converts each half exactly:
    # every one of the 65536 halves as d (and, reversed, as q4_1's m) gives the same bits
    k, n = 64, 1 << 16
    raw, x = _linear_case(qtype, 4, k, n, seed=21)
    bs = gguf.GGML_QUANT_SIZES[GGUF_TYPE[qtype]][1]
    halves = np.arange(n, dtype=np.uint32).astype(np.uint16)
    rows = raw.reshape(n, 2, bs)
    rows[:, 0, 0:2] = halves.view(np.uint8).reshape(n, 2)               # block 0: d = every half
    rows[:, 1, 0:2] = np.array([0.01], np.float16).view(np.uint8)       # block 1: a finite d
    if qtype in ("q4_1", "q5_1"):
        rows[:, 1, 2:4] = halves[::-1].copy().view(np.uint8).reshape(n, 2)   # block 1: m = every half
    w = words(raw)
    fused = q_linear(qtype, w, x[:1], n, k)[0]
    tiled = q_linear(qtype, w, x, n, k)[0]
    nan = np.isnan(tiled)
    assert nan.any() and (np.isnan(fused) == nan).all()
    assert fused[~nan].tobytes() == tiled[~nan].tobytes()


def test_qlinear_zero_activation_blocks():
    k, n = 96, 5
    raw, x = _linear_case("q4_0", 2, k, n, seed=4)
    x[0, 32:64] = 0.0    # a block of zeros (scale 0) between others
    x[1] = 0.0
    y = q_linear("q4_0", words(raw), x, n, k).astype(np.float64)
    w = dequant(raw, "q4_0")
    assert np.max(np.abs(y - mixed_reference(x, raw, "q4_0")) / (magnitude(x, w) + 1e-30)) < 2e-6
    assert (y[1] == 0).all()


# ---- qembedding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", ("q8_0", "q4_1", "q5_1", "q5_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "bf16"))
@pytest.mark.parametrize("id_dtype", ("int32", "int64"))
def test_qembedding(qtype, id_dtype):
    rng = np.random.default_rng(6)
    n, k = 9, block_of(qtype)
    raw = make_weight(qtype, n, k, rng)
    w = wasm_tensor(np.frombuffer(words(raw), np.int32), "int32")
    ids = np.array([[8, 0, 3], [3, 3, 1]], id_dtype)
    got = ember.qembedding(wasm_tensor(ids, id_dtype), w, qtype=qtype, n=n, k=k)
    assert got.shape == (2, 3, k)
    want = dequant(raw, qtype)[ids]
    assert np.array(got.tolist(), np.float32).view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("bad", (9, -1, 2 ** 40))
def test_qembedding_out_of_range_is_a_typed_error(bad):
    rng = np.random.default_rng(7)
    raw = make_weight("q8_0", 9, 32, rng)
    w = wasm_tensor(np.frombuffer(words(raw), np.int32), "int32")
    ids = wasm_tensor(np.array([1, bad, 2], np.int64), "int64")
    with pytest.raises(IndexingError, match=f"id {bad} is out of range"):
        ember.qembedding(ids, w, qtype="q8_0", n=9, k=32)


# ---- rms_norm, rope -------------------------------------------------------------------------------

def test_rms_norm():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((5, 576)) * 3).astype(np.float32)
    g = rng.standard_normal(576).astype(np.float32)
    yw = ember.rms_norm(wasm_tensor(x), wasm_tensor(g), eps=1e-5)
    yp = ember.rms_norm(wasm_tensor(x).to("python"), wasm_tensor(g).to("python"), eps=1e-5)
    a, b = np.array(yw.tolist(), np.float32), np.array(yp.tolist(), np.float32)
    assert np.max(np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))) <= 1
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(a, ref, rtol=1e-6, atol=1e-6)
    odd = ember.rms_norm(wasm_tensor(x[:, :7]), wasm_tensor(g[:7]), eps=1e-6)   # a tail of 3
    np.testing.assert_allclose(np.array(odd.tolist()),
                               x[:, :7] / np.sqrt((x[:, :7].astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * g[:7],
                               rtol=1e-6)


@pytest.mark.parametrize("mode", ("pairs", "halves"))
def test_rope_is_bit_equal_to_the_python_kernel(mode):
    rng = np.random.default_rng(9)
    T, H, D = 5, 3, 64
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    cos, sin = ember.ops.llm.rope_tables(T + 7, D, base=100000.0)
    c = np.array(cos.tolist(), np.float32)[7:]
    s = np.array(sin.tolist(), np.float32)[7:]
    yw = ember.rope(wasm_tensor(x), wasm_tensor(c), wasm_tensor(s), mode=mode)
    yp = ember.rope(wasm_tensor(x).to("python"), wasm_tensor(c).to("python"), wasm_tensor(s).to("python"), mode=mode)
    a = np.array(yw.tolist(), np.float32)
    assert a.tobytes() == np.array(yp.tolist(), np.float32).tobytes()
    x64 = x.astype(np.float64)
    if mode == "pairs":
        x0, x1 = x64[..., 0::2], x64[..., 1::2]
    else:
        x0, x1 = x64[..., :D // 2], x64[..., D // 2:]
    c64, s64 = c[:, None, :].astype(np.float64), s[:, None, :].astype(np.float64)
    r0, r1 = x0 * c64 - x1 * s64, x0 * s64 + x1 * c64
    ref = np.stack([r0, r1], -1).reshape(T, H, D) if mode == "pairs" else np.concatenate([r0, r1], -1)
    np.testing.assert_array_equal(a, ref.astype(np.float32))


# ---- attention_cached -----------------------------------------------------------------------------

def attention_reference(q, kc, vc, pos, T, scale):
    """numpy float64: query t of head h over cache rows 0..pos+t of kv head h // group."""
    _, hq, d = q.shape
    hkv = kc.shape[1]
    out = np.zeros(q.shape, np.float64)
    for t in range(T):
        n = pos + t + 1
        for h in range(hq):
            g = h // (hq // hkv)
            s = kc[:n, g].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vc[:n, g].astype(np.float64)
    return out


@pytest.mark.parametrize("T,pos,d", [(1, 0, 64), (1, 6, 64), (5, 0, 64), (5, 3, 64), (5, 11, 8), (2, 2, 20)])
def test_attention_cached(T, pos, d):
    rng = np.random.default_rng(T * 100 + pos + d)
    hq, hkv, C = 9, 3, 16
    q = rng.standard_normal((T, hq, d)).astype(np.float32)
    k = rng.standard_normal((T, hkv, d)).astype(np.float32)
    v = rng.standard_normal((T, hkv, d)).astype(np.float32)
    kc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    vc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
    kc, vc = wasm_tensor(kc0), wasm_tensor(vc0)
    p = wasm_tensor(np.array([pos], np.int32), "int32")
    scale = d ** -0.5
    y = ember.attention_cached(wasm_tensor(q), wasm_tensor(k), wasm_tensor(v), kc, vc, p, scale=scale)
    kw, vw = kc0.copy(), vc0.copy()
    kw[pos:pos + T], vw[pos:pos + T] = k, v
    assert np.array(kc.tolist(), np.float32).tobytes() == kw.tobytes()
    assert np.array(vc.tolist(), np.float32).tobytes() == vw.tobytes()
    a = np.array(y.tolist())
    np.testing.assert_allclose(a, attention_reference(q, kw, vw, pos, T, scale), rtol=0, atol=2e-6 * np.abs(v).max())
    # the python kernel (the specification) on copies of the same caches
    kp, vp = wasm_tensor(kc0).to("python"), wasm_tensor(vc0).to("python")
    yp = ember.attention_cached(wasm_tensor(q).to("python"), wasm_tensor(k).to("python"), wasm_tensor(v).to("python"),
                                kp, vp, p.to("python"), scale=scale)
    np.testing.assert_allclose(a, np.array(yp.tolist()), rtol=0, atol=2e-6 * np.abs(v).max())


def test_attention_cached_reads_pos_when_it_runs():
    # the same tensors, pos changed in place between calls (as a replayed decoding step does)
    rng = np.random.default_rng(11)
    hq, hkv, d, C = 9, 3, 64, 8
    kc, vc = wasm_tensor(np.zeros((C, hkv, d), np.float32)), wasm_tensor(np.zeros((C, hkv, d), np.float32))
    p = wasm_tensor(np.array([0], np.int32), "int32")
    ks, vs = [], []
    for step in range(4):
        p._buf[0] = step
        q, k, v = (rng.standard_normal((1, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
        ks.append(k[0])
        vs.append(v[0])
        y = ember.attention_cached(wasm_tensor(q), wasm_tensor(k), wasm_tensor(v), kc, vc, p, scale=0.125)
        ref = attention_reference(q, np.stack(ks), np.stack(vs), step, 1, 0.125)
        np.testing.assert_allclose(np.array(y.tolist()), ref, atol=2e-6 * max(np.abs(x).max() for x in vs))


@pytest.mark.parametrize("pos", (6, 9, -1))
def test_attention_cached_past_the_cache_is_a_typed_error(pos):
    hq, hkv, d, C, T = 9, 3, 8, 8, 3
    kc0 = np.arange(C * hkv * d, dtype=np.float32).reshape(C, hkv, d)
    kc, vc = wasm_tensor(kc0), wasm_tensor(kc0)
    args = [wasm_tensor(np.ones((T, h, d), np.float32)) for h in (hq, hkv, hkv)]
    with pytest.raises(ShapeError, match="do not fit a cache of 8 positions"):
        ember.attention_cached(*args, kc, vc, wasm_tensor(np.array([pos], np.int32), "int32"), scale=1.0)
    assert np.array(kc.tolist(), np.float32).tobytes() == kc0.tobytes()   # nothing written


def test_the_ops_run_in_the_module():
    assert {"qlinear", "dequantize", "qembedding", "rms_norm", "rope", "attention_cached"} <= ember.get_backend("wasm").native


# ---- memory safety: guard bytes around every buffer --------------------------------------------

GUARD = 256


def guarded_call(name, *args):
    """Call export ``name`` in the wasmtime memory with each R/W span surrounded by GUARD bytes of
    0xA5; W spans are copied back. Fails if a guard or a read-only span changed."""
    rt = runtime()
    if rt.kind != "wasmtime":
        pytest.skip("guarded calls need the wasmtime runtime")
    at, spans, conv = 4096, [], []
    for a in args:
        if isinstance(a, R):
            nbytes = a.n * a.buf.itemsize
            at += GUARD
            spans.append((a, at, nbytes))
            conv.append(at)
            at += (nbytes + 15) & ~15
            at += GUARD
        else:
            conv.append(a)
    rt._reserve(at + 64)
    mem, st = rt.memory, rt.store
    mem.write(st, b"\xa5" * at, 0)
    for a, addr, nbytes in spans:
        item = a.buf.itemsize
        mem.write(st, memoryview(a.buf).cast("B")[a.offset * item:a.offset * item + nbytes].tobytes(), addr)
    before = {addr: bytes(mem.read(st, addr, addr + nbytes)) for a, addr, nbytes in spans if not a.writes}
    res = rt.fn(name)(st, *conv)
    for a, addr, nbytes in spans:
        lo = mem.read(st, addr - GUARD, addr)
        hi = mem.read(st, addr + nbytes, addr + ((nbytes + 15) & ~15) + GUARD)
        assert set(lo) <= {0xA5} and set(hi) <= {0xA5}, f"{name} wrote outside a span"
        if a.writes:
            item = a.buf.itemsize
            memoryview(a.buf).cast("B")[a.offset * item:a.offset * item + nbytes] = mem.read(st, addr, addr + nbytes)
        else:
            assert bytes(mem.read(st, addr, addr + nbytes)) == before[addr], f"{name} wrote into an input"
    return res


@pytest.mark.parametrize("qtype,m", [("q4_1", 1), ("q8_0", 1), ("q5_0", 1), ("q4_0", 2), ("q6_k", 1), ("q4_k", 3),
                                     ("q4_k", 5), ("q8_0", 5), ("q5_k", 1), ("f16", 17), ("bf16", 2), ("f32", 1)])
def test_kernels_stay_inside_their_spans(qtype, m):
    rng = np.random.default_rng(12)
    blk = block_of(qtype)
    k, n = 2 * blk if blk == 256 else 3 * blk, 7
    raw, x = _linear_case(qtype, m, k, n, seed=12)
    w = words(raw)
    code = quant.FORMATS[qtype].ggml_type
    y = array("f", bytes(4 * m * n))
    scratch = array("f", bytes(4 * ops_quant.scratch_floats(qtype, m, k)))
    assert guarded_call("q_linear", R(w, len(w)), R(array("f", x.tobytes()), m * k), W(y, m * n),
                        W(scratch, len(scratch)), R(array("i", [code, m, n, k]), 4)) == 0
    np.testing.assert_allclose(np.array(y).reshape(m, n), q_linear(qtype, w, x, n, k), rtol=0, atol=0)
    d = array("f", bytes(4 * n * k))
    assert guarded_call("q_dequantize", R(w, len(w)), W(d, n * k), R(array("i", [code, n, k]), 3)) == 0
    ids = array("q", [n - 1, 0])
    e = array("f", bytes(4 * 2 * k))
    assert guarded_call("q_embedding", R(w, len(w)), R(ids, 2), W(e, 2 * k), R(array("i", [code, 2, n, k, 8]), 5)) == 0
    del rng


def test_llm_kernels_stay_inside_their_spans():
    rng = np.random.default_rng(13)
    T, hq, hkv, d, C, pos = 3, 9, 3, 64, 8, 4
    f = lambda *s: array("f", rng.standard_normal(s).astype(np.float32).tobytes())   # noqa: E731
    q, k, v, kc, vc = f(T, hq, d), f(T, hkv, d), f(T, hkv, d), f(C, hkv, d), f(C, hkv, d)
    out, scratch = array("f", bytes(4 * T * hq * d)), array("f", bytes(4 * (hq // hkv) * (C + 1)))
    assert guarded_call("attention_cached_f32", R(q, len(q)), R(k, len(k)), R(v, len(v)), W(kc, len(kc)),
                        W(vc, len(vc)), R(array("i", [pos]), 1), W(out, len(out)), W(scratch, len(scratch)),
                        R(array("i", [T, hq, hkv, d, C]), 5), 0.125) == 0
    assert guarded_call("attention_cached_f32", R(q, len(q)), R(k, len(k)), R(v, len(v)), W(kc, len(kc)),
                        W(vc, len(vc)), R(array("i", [C - 2]), 1), W(out, len(out)), W(scratch, len(scratch)),
                        R(array("i", [T, hq, hkv, d, C]), 5), 0.125) == ops_quant.AC_ERR_POS
    y = array("f", bytes(4 * T * hq * d))
    guarded_call("rope_f32", R(q, len(q)), R(f(T, d // 2), T * d // 2), R(f(T, d // 2), T * d // 2), W(y, len(y)),
                 T, hq, d, 1)
    x, g = f(5, 21), f(21)
    y = array("f", bytes(4 * 5 * 21))
    guarded_call("rms_norm_f32", R(x, len(x)), R(g, 21), W(y, len(y)), 5, 21, 1e-5)
    assert prod((5, 21)) == len(y)


def test_a_compiled_step_reads_pos_when_it_replays():
    # qlinear + attention_cached captured once by ember.compile and replayed (on wasm: as one
    # command table run inside the module): every replay must use that step's pos, and a pos past
    # the cache must still raise
    rng = np.random.default_rng(15)
    hq, hkv, d, C, k = 9, 3, 64, 8, 64
    kc, vc = wasm_tensor(np.zeros((C, hkv, d), np.float32)), wasm_tensor(np.zeros((C, hkv, d), np.float32))
    wq = quant.QTensor.quantize(ember.tensor(rng.standard_normal((hq * d, k)).astype(np.float32).tolist()), "q4_1",
                                device="wasm")

    def step(x, kk, vv, pos):
        q = ember.reshape(quant.linear(x, wq), (1, hq, d))
        return ember.attention_cached(q, kk, vv, kc, vc, pos, scale=0.125)

    f = ember.compile(step)
    ks, vs = [], []
    for s in range(5):
        x = rng.standard_normal((1, k)).astype(np.float32)
        kk, vv = (rng.standard_normal((1, hkv, d)).astype(np.float32) for _ in range(2))
        ks.append(kk[0])
        vs.append(vv[0])
        y = f(wasm_tensor(x), wasm_tensor(kk), wasm_tensor(vv), wasm_tensor(np.array([s], np.int32), "int32"))
        q = np.array(quant.linear(wasm_tensor(x), wq).tolist(), np.float32).reshape(1, hq, d)
        ref = attention_reference(q, np.stack(ks), np.stack(vs), s, 1, 0.125)
        np.testing.assert_allclose(np.array(y.tolist()), ref, atol=2e-6 * max(np.abs(v).max() for v in vs))
    with pytest.raises(ShapeError, match="do not fit a cache of 8 positions"):
        f(wasm_tensor(x), wasm_tensor(kk), wasm_tensor(vv), wasm_tensor(np.array([C], np.int32), "int32"))
