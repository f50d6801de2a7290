"""The numpy backend's language-model ops on the wasm backend's ``llm.c`` compiled natively
(ember.native with SIMDe, core/native/wasm_llm.c): rms_norm, rope and attention_cached against
float64 numpy references written here (window, softcap, grouped-query heads, cache positions,
head sizes the kernel takes and those it leaves to numpy), with the native kernels on and off
(``ember.native.disabled()``); the caches written in place; calls from two threads at once; the
build's names and source hash."""
import math
import shutil
import threading

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_llm as nl
from ember.errors import ShapeError

F64 = np.float64


@pytest.fixture(params=["native", "numpy"])
def mode(request, monkeypatch):
    """Each test once with llm.c natively (skipped where it is not built) and once without; in
    native mode every call must reach the kernel (the counts are checked by ``ran``)."""
    if request.param == "native":
        if not nl.native_llm():
            pytest.skip(f"wasm kernels not in ember.native: {nat.info()['wasm_kernels']}")
        yield "native"
    else:
        monkeypatch.setattr(nl, "_native_fn", lambda name: None)
        yield "numpy"


@pytest.fixture
def ran(monkeypatch):
    """How many calls each native wrapper answered (not None), by op."""
    counts = {"rms_norm": 0, "rope": 0, "attention": 0}
    for name in counts:
        real = getattr(nl, "_native_" + name)

        def spy(*a, _real=real, _name=name, **k):
            y = _real(*a, **k)
            counts[_name] += y is not None
            return y

        monkeypatch.setattr(nl, "_native_" + name, spy)
    return counts


def _t(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="numpy")


# ---- rms_norm -------------------------------------------------------------------------------------

def ref_rms_norm(x, w, eps):
    x = x.astype(F64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(F64)


@pytest.mark.parametrize("shape", [(1, 576), (5, 21), (2, 3, 7), (4, 1), (3,), (1, 2, 1030)])
def test_rms_norm_against_float64(mode, ran, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    for eps in (1e-5, 1e-6, 0.5):
        y = ember.rms_norm(_t(x), _t(w), eps=eps).numpy()
        assert y.shape == x.shape and y.dtype == np.float32
        ref = ref_rms_norm(x, w, eps)
        # native: float64 inside, one rounding (within an ulp of float64); numpy: float32 steps
        tol = 1.2e-7 if mode == "native" else 2e-6
        np.testing.assert_allclose(y, ref, rtol=tol, atol=1e-30)
    assert ran["rms_norm"] == (3 if mode == "native" else 0)


def test_rms_norm_native_range_and_other_dtypes(mode):
    """Values whose squares overflow float32 (1e20) stay exact natively (float64, as the python
    specification); float16 input gives float16 output either way."""
    w = np.ones(4, np.float32)
    x = np.array([[1e20, -1e20, 1e20, 1e20], [3.0, 4.0, 0.0, 0.0]], np.float32)
    y = ember.rms_norm(_t(x), _t(w)).numpy()
    if mode == "native":
        np.testing.assert_allclose(y, ref_rms_norm(x, w, 1e-5), rtol=1.2e-7)
    else:
        np.testing.assert_allclose(y[1], ref_rms_norm(x, w, 1e-5)[1], rtol=2e-6)
    h = ember.rms_norm(_t(x[1:].astype(np.float16)), _t(w.astype(np.float16)))
    assert h.dtype == ember.float16
    np.testing.assert_allclose(h.numpy().astype(F64), ref_rms_norm(x[1:], w, 1e-5), rtol=1e-3)


# ---- rope -----------------------------------------------------------------------------------------

def ref_rope(x, c, s, mode):
    """float64 from the float32 inputs, rounded once (the products are exact in float64)."""
    x, c, s = x.astype(F64), c.astype(F64)[:, None, :], s.astype(F64)[:, None, :]
    D = x.shape[-1]
    if mode == "pairs":
        x0, x1 = x[..., 0::2], x[..., 1::2]
    else:
        x0, x1 = x[..., :D // 2], x[..., D // 2:]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = np.empty_like(x)
    if mode == "pairs":
        y[..., 0::2], y[..., 1::2] = y0, y1
    else:
        y[..., :D // 2], y[..., D // 2:] = y0, y1
    return y


@pytest.mark.parametrize("rmode", ["pairs", "halves"])
@pytest.mark.parametrize("T,H,D", [(1, 12, 64), (3, 5, 6), (2, 1, 2), (4, 3, 10), (1, 9, 130)])
def test_rope_against_float64(mode, ran, rmode, T, H, D):
    rng = np.random.default_rng(T * 100 + H * 10 + D)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    ang = (np.arange(7, 7 + T)[:, None] * 10000.0 ** (-np.arange(D // 2) * 2 / D)[None, :])
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    y = ember.rope(_t(x), _t(c), _t(s), mode=rmode).numpy()
    ref = ref_rope(x, c, s, rmode)
    if mode == "native":   # the specification's bits
        assert np.array_equal(y, ref.astype(np.float32))
        assert ran["rope"] == 1
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
        assert ran["rope"] == 0


def test_rope_in_the_fused_projection(mode, ran):
    """qlinear_rms_rope decomposes into rms_norm, qlinear and rope on the numpy device (the rope
    input a slice of the product): the first rope_rows outputs turned at pos."""
    from ember.quant import QTensor

    rng = np.random.default_rng(3)
    hd, heads, k = 8, 3, 64
    wf = rng.standard_normal((heads * hd + 5, k)).astype(np.float32)
    w = QTensor.quantize(_t(wf), "q8_0")
    x = rng.standard_normal((2, k)).astype(np.float32)
    nw = rng.standard_normal(k).astype(np.float32)
    c, s = ember.ops.llm.rope_tables(16, hd)
    pos = ember.tensor([4], dtype="int32", device="numpy")
    y = ember.ops.llm.qlinear_rms_rope(_t(x), _t(nw), w, c.to("numpy"), s.to("numpy"), pos,
                                       rope_rows=heads * hd, head_dim=hd).numpy()
    lin = ref_rms_norm(x, nw, 1e-5) @ ember.dequantize(w.data, qtype="q8_0", n=w.n, k=w.k).numpy().astype(F64).T
    cn, sn = c.numpy()[4:6], s.numpy()[4:6]
    ref = np.concatenate([ref_rope(lin[:, :heads * hd].reshape(2, heads, hd), cn, sn, "pairs").reshape(2, -1),
                          lin[:, heads * hd:]], axis=1)
    np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-2 * np.abs(lin).max())
    if mode == "native":
        assert ran["rope"] == 1 and ran["rms_norm"] == 1


# ---- attention_cached -----------------------------------------------------------------------------

def ref_attention(q, kc, vc, pos, scale, window=0, softcap=0.0):
    """float64: query t of head h over cache rows lo .. pos+t of kv head h // (Hq / Hkv)."""
    T, hq, d = q.shape
    hkv = kc.shape[1]
    out = np.empty((T, hq, d))
    for t in range(T):
        last = pos + t
        lo = max(0, last - window + 1) if window else 0
        for h in range(hq):
            g = h // (hq // hkv)
            sc = kc[lo:last + 1, g].astype(F64) @ q[t, h].astype(F64) * scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            e = np.exp(sc - sc.max())
            out[t, h] = e @ vc[lo:last + 1, g].astype(F64) / e.sum()
    return out


def _attend(q, k, v, kc, vc, pos, **attrs):
    """attention_cached on the numpy device; returns (out, k cache, v cache) as numpy."""
    tk, tv = _t(kc), _t(vc)
    y = ember.attention_cached(_t(q), _t(k), _t(v), tk, tv, ember.tensor([pos], dtype="int32", device="numpy"),
                               **attrs)
    return y.numpy(), tk.numpy(), tv.numpy()


def _case(seed, T, hq, hkv, d, C, qscale=1.0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    return f(T, hq, d) * np.float32(qscale), f(T, hkv, d), f(T, hkv, d), f(C, hkv, d), f(C, hkv, d)


CASES = [   # T, Hq, Hkv, D, C, pos
    (1, 9, 3, 64, 40, 17),     # SmolLM2's heads, a decode step
    (1, 4, 4, 8, 9, 0),        # one row, no grouping
    (3, 8, 2, 12, 20, 5),      # a prompt chunk, groups of 4 (3 + 1 per value pass)
    (7, 5, 1, 4, 7, 0),        # the whole cache, one kv head of five
    (2, 6, 3, 20, 33, 31),     # the last rows
    (5, 2, 1, 68, 64, 11),
    (1, 3, 1, 6, 10, 4),       # D = 6, 7, 5: numpy paths (the kernel's vectors need D % 4 == 0)
    (2, 4, 2, 7, 12, 3),
    (3, 1, 1, 5, 8, 2),
]


@pytest.mark.parametrize("T,hq,hkv,d,C,pos", CASES)
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (3, 0.0), (1, 0.0), (0, 0.7), (4, 30.0), (1000, 0.0)])
def test_attention_against_float64(mode, ran, T, hq, hkv, d, C, pos, window, softcap):
    q, k, v, kc, vc = _case(T * 1000 + d * 10 + pos, T, hq, hkv, d, C)
    scale = 1 / math.sqrt(d)
    attrs = {"window": window, "softcap": softcap} if window or softcap else {}
    y, kc2, vc2 = _attend(q, k, v, kc, vc, pos, **attrs)
    # the caches: rows pos .. pos+T-1 are k and v bit for bit, every other row as it was
    want_k, want_v = kc.copy(), vc.copy()
    want_k[pos:pos + T], want_v[pos:pos + T] = k, v
    assert np.array_equal(kc2, want_k) and np.array_equal(vc2, want_v)
    ref = ref_attention(q, want_k, want_v, pos, scale, window, softcap)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-6)
    assert ran["attention"] == (1 if mode == "native" and d % 4 == 0 else 0)


@pytest.mark.parametrize("T,pos,native", [(54, 256, False), (40, 30, False), (40, 30, True), (1, 1900, True)])
def test_attention_prompt_chunks(mode, ran, monkeypatch, T, pos, native):
    """Prompt chunks past NATIVE_ATTENTION_WORK run the numpy path (a decode step never does);
    forced native, the kernel's many-row case against float64."""
    if native:
        monkeypatch.setattr(nl, "NATIVE_ATTENTION_WORK", 1 << 30)
    q, k, v, kc, vc = _case(7 + T, T, 9, 3, 64, 2048)
    y, kc2, vc2 = _attend(q, k, v, kc, vc, pos, window=500)
    np.testing.assert_allclose(y, ref_attention(q, kc2, vc2, pos, 1 / 8, 500), rtol=1e-5, atol=2e-6)
    assert ran["attention"] == (1 if mode == "native" and native else 0)


def test_attention_scale_and_underflow(mode):
    """Scores far apart (exp below float32's range for most rows: the kernel's 0 there) and a
    scale that is not 1/sqrt(D). A score's float32 rounding (~6e-8 |s|) moves its weight by as
    much relatively: the bound grows with the largest score."""
    q, k, v, kc, vc = _case(8, 4, 6, 2, 16, 50, qscale=30.0)
    for scale in (1.0, 0.01):
        y, kc2, vc2 = _attend(q, k, v, kc, vc, 20, scale=scale)
        smax = np.abs(np.einsum("thd,cgd->thgc", q.astype(F64), kc2.astype(F64))).max() * scale
        atol = 2e-6 + 4e-7 * smax * np.abs(vc2).max()
        np.testing.assert_allclose(y, ref_attention(q, kc2, vc2, 20, scale), rtol=1e-5, atol=atol)


def test_attention_decode_sequence(mode, ran):
    """A prompt of 5 then 12 decoded tokens through one pair of caches (the position advancing,
    a window of 6): each step against float64 over the rows written so far."""
    T0, hq, hkv, d, C = 5, 6, 2, 16, 24
    rng = np.random.default_rng(11)
    tk, tv = _t(np.zeros((C, hkv, d), np.float32)), _t(np.zeros((C, hkv, d), np.float32))
    ks, vs = np.zeros((C, hkv, d), np.float32), np.zeros((C, hkv, d), np.float32)
    pos = 0
    for step, T in enumerate([T0] + [1] * 12):
        q = rng.standard_normal((T, hq, d)).astype(np.float32)
        k = rng.standard_normal((T, hkv, d)).astype(np.float32)
        v = rng.standard_normal((T, hkv, d)).astype(np.float32)
        y = ember.attention_cached(_t(q), _t(k), _t(v), tk, tv, ember.tensor([pos], dtype="int32", device="numpy"),
                                   window=6, softcap=5.0).numpy()
        ks[pos:pos + T], vs[pos:pos + T] = k, v
        np.testing.assert_allclose(y, ref_attention(q, ks, vs, pos, 1 / math.sqrt(d), 6, 5.0), rtol=1e-5, atol=2e-6)
        pos += T
    assert np.array_equal(tk.numpy(), ks) and np.array_equal(tv.numpy(), vs)
    assert ran["attention"] == (13 if mode == "native" else 0)


def test_attention_bad_position_writes_nothing(mode):
    q, k, v, kc, vc = _case(2, 2, 4, 2, 8, 6)
    for pos in (5, -1, 6):
        tk, tv = _t(kc), _t(vc)
        with pytest.raises(ShapeError, match="do not fit a cache of 6"):
            ember.attention_cached(_t(q), _t(k), _t(v), tk, tv, ember.tensor([pos], dtype="int32", device="numpy"))
        assert np.array_equal(tk.numpy(), kc) and np.array_equal(tv.numpy(), vc)


def test_attention_read_only_cache_is_not_written(mode):
    """A read-only cache: the numpy path's error, and the kernel never writes into it."""
    q, k, v, kc, vc = _case(3, 1, 4, 2, 8, 6)
    tk, tv = _t(kc), _t(vc)
    tk._buf.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ember.attention_cached(_t(q), _t(k), _t(v), tk, tv, ember.tensor([2], dtype="int32", device="numpy"))
    assert np.array_equal(tk.numpy(), kc)


def test_attention_nan_stays_in_its_head(mode):
    q, k, v, kc, vc = _case(4, 1, 6, 2, 8, 10)
    q[0, 4, 3] = np.nan                  # head 4 (kv head 1, with heads 3 and 5)
    y, kc2, vc2 = _attend(q, k, v, kc, vc, 3)
    assert np.isnan(y[0, 4]).all()
    ok = [h for h in range(6) if h != 4]
    np.testing.assert_allclose(y[0, ok], ref_attention(q, kc2, vc2, 3, 1 / math.sqrt(8))[0, ok], rtol=1e-5, atol=2e-6)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_softcap_beyond_float32_runs_the_numpy_rule():
    """A softcap that is 0 or inf in float32 (the kernel's parameter) goes to the numpy path."""
    q, k, v, kc, vc = _case(5, 1, 2, 1, 8, 4)
    with nat.disabled():
        want = _attend(q, k, v, kc, vc, 1, softcap=1e39)[0]
    got = _attend(q, k, v, kc, vc, 1, softcap=1e39)[0]
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.allclose(got, want, equal_nan=True)


def test_native_and_numpy_paths_agree():
    """The same call native and numpy (within float32 roundings of each other)."""
    if not nl.native_llm():
        pytest.skip(nat.info()["wasm_kernels"])
    q, k, v, kc, vc = _case(6, 4, 9, 3, 64, 100)
    on = _attend(q, k, v, kc, vc, 60, window=32, softcap=20.0)
    with nat.disabled():
        off = _attend(q, k, v, kc, vc, 60, window=32, softcap=20.0)
    np.testing.assert_allclose(on[0], off[0], rtol=1e-5, atol=1e-6)
    assert np.array_equal(on[1], off[1]) and np.array_equal(on[2], off[2])


def test_two_threads_at_once_same_bits():
    """Each thread has its own scratch: concurrent calls give the bits of one at a time."""
    if not nl.native_llm():
        pytest.skip(nat.info()["wasm_kernels"])
    cases = [_case(20 + i, 2, 9, 3, 64, 300) for i in range(2)]

    def run(i, out):
        for _ in range(20):
            out.append(_attend(*cases[i], 200 + i, window=100)[0])

    alone = [_attend(*c, 200 + i, window=100)[0] for i, c in enumerate(cases)]
    outs = [[], []]
    ts = [threading.Thread(target=run, args=(i, outs[i])) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(2):
        assert len(outs[i]) == 20 and all(np.array_equal(o, alone[i]) for o in outs[i])


# ---- the build --------------------------------------------------------------------------------------

def test_library_names_and_source_hash(tmp_path, monkeypatch):
    """llm.c's entry points carry the ember_wasm_ prefix (never a bare wasm name); the hash covers
    llm.c and mathf.h."""
    if nat.find_compiler() is None or nat.simde_dir() is None:
        pytest.skip("no C compiler or no SIMDe here")
    dll = nat.lib()
    if dll is None:
        pytest.skip(nat.info()["reason"])
    for name in ("rms_norm_f32", "rope_f32", "attention_cached_f32"):
        assert getattr(dll, "ember_wasm_" + name, None) is not None and getattr(dll, name, None) is None, name
    assert getattr(dll, "attention_cached_f32_team", None) is None   # renamed, and not exported
    h = nat.source_hash()
    kdir = tmp_path / "wasm" / "kernels"
    shutil.copytree(nat.wasm_kernels_dir(), kdir)
    monkeypatch.setattr(nat, "wasm_kernels_dir", lambda: str(kdir))
    assert nat.source_hash() == h
    for name in ("llm.c", "mathf.h"):
        with open(kdir / name, "a") as f:
            f.write("\n/* changed */\n")
        assert nat.source_hash() != h, name
        h = nat.source_hash()
