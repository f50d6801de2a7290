"""The decode attention of the numpy backend's attention_cached (one new token) on attn.c over
team.c's two threads (job 9: units of a key/value head and 64 cache rows, then a merge of their
partial softmaxes): against a float64 reference written here (grouped-query ratios 1, 3, 4 and
more than a pass's 4 heads, odd head counts, head sizes that are and are not whole vectors, cache
lengths 1, 17, 64, 65, 300, a window, a softcap, NaN), the same bits on one thread or two (any
item count), close to llm.c's one-thread kernel, the caches written in place, and the A/B switch
(EMBER_LLM_NATIVE_ATTN=0 / NATIVE_ATTN_DECODE)."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_llm as nl

F64 = np.float64


def _kernel():
    return nl._native_fn("ember_attn_decode") is not None


pytestmark = pytest.mark.skipif(not _kernel(), reason=f"ember.native not in use: {nat.info()['reason']}")


def ref_attention(q, kc, vc, pos, scale, window=0, softcap=0.0):
    """float64: query head h (one row) over cache rows lo .. pos of kv head h // (Hq / Hkv)."""
    _, hq, d = q.shape
    hkv = kc.shape[1]
    out = np.empty((1, hq, d))
    lo = max(0, pos - window + 1) if window else 0
    for h in range(hq):
        g = h // (hq // hkv)
        sc = kc[lo:pos + 1, g].astype(F64) @ q[0, h].astype(F64) * scale
        if softcap:
            sc = softcap * np.tanh(sc / softcap)
        e = np.exp(sc - sc.max())
        out[0, h] = e @ vc[lo:pos + 1, g].astype(F64) / e.sum()
    return out


def _t(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="numpy")


def _case(seed, hq, hkv, d, C):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    return f(1, hq, d), f(1, hkv, d), f(1, hkv, d), f(C, hkv, d), f(C, hkv, d)


def _attend(q, k, v, kc, vc, pos, **attrs):
    """attention_cached (one token) on the numpy device: (out, k cache, v cache) as numpy."""
    tk, tv = _t(kc), _t(vc)
    y = ember.attention_cached(_t(q), _t(k), _t(v), tk, tv, ember.tensor([pos], dtype="int32", device="numpy"),
                               **attrs)
    return y.numpy(), tk.numpy(), tv.numpy()


@pytest.fixture
def calls(monkeypatch):
    """How many calls attn.c answered, and how many of them ran on the team."""
    counts = {"decode": 0, "team": 0}
    real, real_team = nl._native_attn_decode, nl._team

    def spy(*a, **k):
        y = real(*a, **k)
        counts["decode"] += y is not None
        return y

    def team():
        tm = real_team()
        if tm is None:
            return None

        def run(*a):
            rc = tm(*a)
            counts["team"] += rc is not None and a[0] == nl._J_ATTN_DECODE
            return rc
        return run

    monkeypatch.setattr(nl, "_native_attn_decode", spy)
    monkeypatch.setattr(nl, "_team", team)
    return counts


HEADS = [   # Hq, Hkv, D
    (9, 3, 64),     # SmolLM2 (groups of 3)
    (5, 5, 64),     # no grouping, odd
    (8, 2, 128),    # groups of 4 (one pass of the kernel's 4 heads), two vectors of values a pass... twice
    (12, 2, 20),    # groups of 6 (passes of 4 + 2); a head size that is not whole vectors
    (7, 1, 8),      # one kv head of seven (4 + 3)
    (3, 1, 136),    # head size past a pass's 4 vectors, with a tail
    (15, 5, 4),
]


@pytest.mark.parametrize("hq,hkv,d", HEADS)
@pytest.mark.parametrize("L", [1, 17, 64, 65, 300])
def test_decode_against_float64(calls, hq, hkv, d, L):
    """One query row over L cache rows (position L - 1): float64's result within float32
    roundings; the cache's row L - 1 is k, v bit for bit, every other row as it was."""
    C = L + 3
    q, k, v, kc, vc = _case(hq * 1000 + L * 7 + d, hq, hkv, d, C)
    pos = L - 1
    y, kc2, vc2 = _attend(q, k, v, kc, vc, pos, scale=1 / math.sqrt(d))
    want_k, want_v = kc.copy(), vc.copy()
    want_k[pos], want_v[pos] = k[0], v[0]
    assert np.array_equal(kc2, want_k) and np.array_equal(vc2, want_v)
    np.testing.assert_allclose(y, ref_attention(q, want_k, want_v, pos, 1 / math.sqrt(d)), rtol=1e-5, atol=2e-6)
    assert calls["decode"] == 1


@pytest.mark.parametrize("window,softcap", [(3, 0.0), (1, 0.0), (64, 0.0), (100, 0.0), (0, 0.7), (70, 30.0),
                                            (5000, 0.0)])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 2, 12)])
def test_decode_window_and_softcap(calls, hq, hkv, d, window, softcap):
    q, k, v, kc, vc = _case(window + d, hq, hkv, d, 400)
    for pos in (0, 2, 63, 64, 299):
        y, kc2, vc2 = _attend(q, k, v, kc, vc, pos, window=window, softcap=softcap)
        want = ref_attention(q, kc2, vc2, pos, 1 / math.sqrt(d), window, softcap)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-6)
    assert calls["decode"] == 5


@pytest.mark.parametrize("hq,hkv,d,L", [(9, 3, 64, 300), (8, 2, 128, 200), (12, 2, 20, 130), (5, 5, 64, 1000)])
def test_same_bits_on_one_thread_or_two(calls, monkeypatch, hq, hkv, d, L):
    """The team (1, 2, 3 or 5 items) and one thread give the same bits; the team is used when
    the keys reach NATIVE_ATTN_TEAM_FLOATS (forced here) and never below it."""
    q, k, v, kc, vc = _case(L + hq, hq, hkv, d, L + 1)
    monkeypatch.setattr(nl, "NATIVE_ATTN_TEAM_FLOATS", 1 << 62)
    alone = _attend(q, k, v, kc, vc, L - 1)
    assert calls["team"] == 0
    monkeypatch.setattr(nl, "NATIVE_ATTN_TEAM_FLOATS", 0)
    used = 0
    for items in (1, 2, 3, 5):
        monkeypatch.setattr(nl, "NATIVE_ATTN_TEAM_ITEMS", items)
        got = _attend(q, k, v, kc, vc, L - 1)
        used += 1
        for a, b in zip(alone, got):
            assert np.array_equal(a, b)
    if nl._team() is not None:
        assert calls["team"] == used
    np.testing.assert_allclose(alone[0], ref_attention(q, alone[1], alone[2], L - 1, 1 / math.sqrt(d)),
                               rtol=1e-5, atol=2e-6)


def test_close_to_llm_c_and_the_numpy_path(monkeypatch):
    """The same call through attn.c, llm.c (NATIVE_ATTN_DECODE off) and numpy: within float32
    roundings of each other, the caches the same bits."""
    q, k, v, kc, vc = _case(6, 9, 3, 64, 400)
    new = _attend(q, k, v, kc, vc, 299, window=200, softcap=20.0)
    monkeypatch.setattr(nl, "NATIVE_ATTN_DECODE", False)
    old = _attend(q, k, v, kc, vc, 299, window=200, softcap=20.0)
    with nat.disabled():
        plain = _attend(q, k, v, kc, vc, 299, window=200, softcap=20.0)
    for other in (old, plain):
        np.testing.assert_allclose(new[0], other[0], rtol=1e-5, atol=1e-6)
        assert np.array_equal(new[1], other[1]) and np.array_equal(new[2], other[2])


def test_switch_off_runs_llm_c(calls, monkeypatch):
    q, k, v, kc, vc = _case(7, 9, 3, 64, 40)
    monkeypatch.setattr(nl, "NATIVE_ATTN_DECODE", False)
    _attend(q, k, v, kc, vc, 20)
    assert calls["decode"] == 0


def test_env_switch():
    """EMBER_LLM_NATIVE_ATTN=0 at import turns the kernel off; unset, it is on."""
    code = "from ember.backends import numpy_llm as nl; print(nl.NATIVE_ATTN_DECODE)"
    for val, want in (("0", "False"), ("1", "True")):
        env = dict(os.environ, EMBER_LLM_NATIVE_ATTN=val)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_prompt_chunks_are_not_its_own(calls):
    """T > 1 (a prompt chunk) stays on llm.c / numpy."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 9, 64)).astype(np.float32)
    k = rng.standard_normal((3, 3, 64)).astype(np.float32)
    kc = rng.standard_normal((40, 3, 64)).astype(np.float32)
    ember.attention_cached(_t(q), _t(k), _t(k), _t(kc), _t(kc.copy()), ember.tensor([5], dtype="int32", device="numpy"))
    assert calls["decode"] == 0


def test_nan_stays_in_its_head(calls):
    q, k, v, kc, vc = _case(4, 6, 2, 8, 200)
    q[0, 4, 3] = np.nan                  # head 4 (kv head 1, with heads 3 and 5)
    y, kc2, vc2 = _attend(q, k, v, kc, vc, 150)
    assert np.isnan(y[0, 4]).all()
    ok = [h for h in range(6) if h != 4]
    np.testing.assert_allclose(y[0, ok], ref_attention(q, kc2, vc2, 150, 1 / math.sqrt(8))[0, ok], rtol=1e-5,
                               atol=2e-6)
    vc3 = vc.copy()
    vc3[90, 0, 2] = np.nan               # a value row of kv head 0 in the second chunk: heads 0-2 only
    y, _, _ = _attend(q, k, v, kc, vc3, 150)
    assert np.isnan(y[0, :3, 2]).all() and not np.isnan(y[0, 3]).any() and not np.isnan(y[0, 5]).any()


def test_scores_far_apart():
    """Scores whose exp underflows in most rows (and across chunks: a chunk's maximum far below
    another's), scales that are not 1 / sqrt(D)."""
    q, k, v, kc, vc = _case(8, 6, 2, 16, 300)
    q *= 30
    kc[100:160] *= 3                      # the second and third chunks dominate
    for scale in (1.0, 0.01):
        y, kc2, vc2 = _attend(q, k, v, kc, vc, 250, scale=scale)
        smax = np.abs(np.einsum("thd,cgd->thgc", q.astype(F64), kc2[:251].astype(F64))).max() * scale
        atol = 2e-6 + 4e-7 * smax * np.abs(vc2).max()
        np.testing.assert_allclose(y, ref_attention(q, kc2, vc2, 250, scale), rtol=1e-5, atol=atol)


def test_a_decode_sequence_through_one_cache(calls):
    """A prompt of 5 (llm.c / numpy) then 70 decoded tokens (attn.c), the position crossing a
    chunk: every step against float64 over the rows written so far."""
    hq, hkv, d, C = 9, 3, 64, 80
    rng = np.random.default_rng(11)
    tk, tv = _t(np.zeros((C, hkv, d), np.float32)), _t(np.zeros((C, hkv, d), np.float32))
    ks, vs = np.zeros((C, hkv, d), np.float32), np.zeros((C, hkv, d), np.float32)
    pos = 0
    for T in [5] + [1] * 70:
        q = rng.standard_normal((T, hq, d)).astype(np.float32)
        k = rng.standard_normal((T, hkv, d)).astype(np.float32)
        v = rng.standard_normal((T, hkv, d)).astype(np.float32)
        y = ember.attention_cached(_t(q), _t(k), _t(v), tk, tv,
                                   ember.tensor([pos], dtype="int32", device="numpy")).numpy()
        ks[pos:pos + T], vs[pos:pos + T] = k, v
        if T == 1:
            np.testing.assert_allclose(y, ref_attention(q, ks, vs, pos, 1 / 8), rtol=1e-5, atol=2e-6)
        pos += T
    assert np.array_equal(tk.numpy(), ks) and np.array_equal(tv.numpy(), vs)
    assert calls["decode"] == 70
