"""attention_cached / attention_proj on webgpu split over positions (``EMBER_ATTN_SPLIT``,
``ember.webgpu.quant.attn_splits``: S workgroups per (query, head), each over one run of the
rows, then ``attn_comb`` merges the runs): against a float64 numpy reference written here and
against the unsplit kernel (``EMBER_ATTN_SPLIT=0``), at positions where runs are empty, one row,
exactly full or past one 256-row chunk; T = 1 and 2, grouped-query heads, sliding windows and
soft caps, S forced to 1, 2 and 7; the cache writes; replayed plans (an ember.compile'd step and
a tiny llama's greedy decoding through ember.llm, split and not: the same tokens). Skipped where
no adapter exists (lavapipe here)."""
import math

import numpy as np
import pytest

import ember
from conftest import webgpu_only

_REASON, pytestmark = webgpu_only()   # skips every test here where no adapter exists

if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import quant as wq


def gpu(a, dtype=None):
    a = np.ascontiguousarray(a if dtype is None else np.asarray(a, dtype))
    return ember.from_numpy(a, device="webgpu")


def close(got, want, tol):
    """max |got - want| relative to max(|want|, 1)."""
    want = np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1.0)
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def ref_attention(q, kc, vc, pos, window=0, softcap=0.0):
    """float64: query t (T, Hq, D) over cache rows lo..pos+t (clamped to the cache; a window
    keeps the last ``window``), scores scaled by 1/sqrt(D), soft-capped when ``softcap``."""
    T, Hq, D = q.shape
    C, Hkv, _ = kc.shape
    out = np.zeros((T, Hq, D))
    for t in range(T):
        n = min(pos + t + 1, C)
        lo = max(0, pos + t + 1 - window) if window else 0
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s = kc[lo:n, g].astype(np.float64) @ q[t, h].astype(np.float64) / math.sqrt(D)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vc[lo:n, g].astype(np.float64)
    return out


def _case(rng, C, T, Hq, Hkv, D, qscale=1.0):
    kc = rng.standard_normal((C, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((C, Hkv, D)).astype(np.float32)
    q = (qscale * rng.standard_normal((T, Hq, D))).astype(np.float32)
    k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    return kc, vc, q, k, v


def _run(monkeypatch, split, kc0, vc0, q, k, v, pos, **kw):
    """attention_cached on fresh caches with EMBER_ATTN_SPLIT=split: (out, k cache, v cache,
    dispatches of the call)."""
    monkeypatch.setenv("EMBER_ATTN_SPLIT", str(split))
    kc, vc = gpu(kc0), gpu(vc0)
    ins = [gpu(q), gpu(k), gpu(v), gpu([pos], np.int32)]
    wg.evaluate(kc, vc, *ins)
    wg.reset_stats()
    out = ember.attention_cached(*ins[:3], kc, vc, ins[3], **kw)
    wg.evaluate(out)
    n = wg.stats()["dispatches"]
    return out.numpy(), kc.numpy(), vc.numpy(), n


# positions for C = 40 and S = 7 runs (rows = pos + t + 1, runs of ceil(rows / 7)): one row
# (six empty runs), two, fewer rows than runs, exactly one row a run, one run left empty,
# exactly two a run, runs of 3 with the last short / empty, the cache's last rows
POSITIONS = (0, 1, 5, 6, 7, 13, 14, 20, 38, 39)


@pytest.mark.parametrize("S", [1, 2, 7])
@pytest.mark.parametrize("T", [1, 2])
def test_split_matches_reference_and_unsplit(monkeypatch, S, T):
    """GQA 6/2, D = 16 (keys as vec4): every position of POSITIONS (that fits T rows), split
    and unsplit against the float64 reference and each other; the caches written alike."""
    C, Hq, Hkv, D = 40, 6, 2, 16
    rng = np.random.default_rng(100 * S + T)
    for pos in POSITIONS:
        if pos + T > C:
            continue
        kc0, vc0, q, k, v = _case(rng, C, T, Hq, Hkv, D)
        got, gk, gv, n = _run(monkeypatch, S, kc0, vc0, q, k, v, pos)
        base, bk, bv, n0 = _run(monkeypatch, 0, kc0, vc0, q, k, v, pos)
        assert (n, n0) == (2, 1), (pos, n, n0)        # attn + attn_comb / attn alone
        rk, rv = kc0.copy(), vc0.copy()
        rk[pos:pos + T], rv[pos:pos + T] = k, v
        close(got, ref_attention(q, rk, rv, pos), 2e-5)
        close(got, base, 2e-5)
        np.testing.assert_array_equal(gk, rk)
        np.testing.assert_array_equal(gv, rv)
        np.testing.assert_array_equal(bk, rk)


@pytest.mark.parametrize("S", [2, 7])
def test_split_float_keys_and_wide_heads(monkeypatch, S):
    """D = 6 (keys read as floats, not vec4), 8 heads on one kv head; D = 72 (two head dims
    per thread of attn_comb's 64); MHA (Hq = Hkv)."""
    rng = np.random.default_rng(7 + S)
    for C, T, Hq, Hkv, D, pos in ((12, 2, 8, 1, 6, 9), (12, 1, 8, 1, 6, 0), (30, 1, 9, 3, 72, 23),
                                  (30, 2, 3, 3, 72, 4)):
        kc0, vc0, q, k, v = _case(rng, C, T, Hq, Hkv, D)
        got = _run(monkeypatch, S, kc0, vc0, q, k, v, pos)[0]
        rk, rv = kc0.copy(), vc0.copy()
        rk[pos:pos + T], rv[pos:pos + T] = k, v
        close(got, ref_attention(q, rk, rv, pos), 2e-5)


@pytest.mark.parametrize("S,T,pos", [(2, 1, 600), (7, 2, 650), (1, 1, 520), (3, 1, 300)])
def test_split_long_runs(monkeypatch, S, T, pos):
    """Runs longer than attn's 256-row chunk (S = 2 at 601 rows: two chunks per run; S = 1: the
    whole attention as one run and a merge of one), D = 64 (value rows in 4 slices)."""
    C, Hq, Hkv, D = pos + T + 3, 2, 1, 64
    rng = np.random.default_rng(pos + S)
    kc0, vc0, q, k, v = _case(rng, C, T, Hq, Hkv, D)
    got = _run(monkeypatch, S, kc0, vc0, q, k, v, pos)[0]
    base = _run(monkeypatch, 0, kc0, vc0, q, k, v, pos)[0]
    rk, rv = kc0.copy(), vc0.copy()
    rk[pos:pos + T], rv[pos:pos + T] = k, v
    close(got, ref_attention(q, rk, rv, pos), 1e-4)
    close(got, base, 1e-4)


@pytest.mark.parametrize("S", [2, 7])
@pytest.mark.parametrize("D,T,pos,window,softcap", [(8, 1, 6, 4, 0.0), (8, 2, 4, 2, 0.0), (8, 1, 7, 3, 2.0),
                                                    (8, 2, 3, 0, 1.5), (8, 1, 0, 3, 1.0),
                                                    (64, 1, 520, 300, 0.0), (64, 2, 300, 40, 3.0)])
def test_split_window_and_softcap(monkeypatch, S, D, T, pos, window, softcap):
    """Gemma's sliding window (the runs split the window's rows only) and soft-capped scores:
    the reference, the unsplit kernel; each setting moves the result."""
    C, Hq, Hkv = pos + T + 2, 6 if D < 64 else 2, 2 if D < 64 else 1
    rng = np.random.default_rng(D * 7 + T + pos + S)
    kc0, vc0, q, k, v = _case(rng, C, T, Hq, Hkv, D, qscale=3.0)
    got = _run(monkeypatch, S, kc0, vc0, q, k, v, pos, window=window, softcap=softcap)[0]
    base = _run(monkeypatch, 0, kc0, vc0, q, k, v, pos, window=window, softcap=softcap)[0]
    rk, rv = kc0.copy(), vc0.copy()
    rk[pos:pos + T], rv[pos:pos + T] = k, v
    want = ref_attention(q, rk, rv, pos, window, softcap)
    tol = 1e-4 if D >= 64 else 2e-5
    close(got, want, tol)
    close(got, base, tol)
    if pos + T > 1:
        assert np.abs(want - ref_attention(q, rk, rv, pos)).max() > 1e-2


def test_split_gpu_position_past_the_cache(monkeypatch):
    """A pos computed on the GPU (no range known, nothing read back) at C - 2 with T = 3: the
    split kernel writes only rows inside the cache and attends to rows up to C - 1."""
    monkeypatch.setenv("EMBER_ATTN_SPLIT", "3")
    C, Hq, Hkv, D = 9, 4, 2, 8
    rng = np.random.default_rng(21)
    big_k = gpu(np.full((C + 3, Hkv, D), 7.0, np.float32))
    big_v = gpu(np.full((C + 3, Hkv, D), -7.0, np.float32))
    kc, vc = big_k[:C], big_v[:C]
    _, _, q, k, v = _case(rng, C, 3, Hq, Hkv, D)
    pos = gpu([C - 2], np.int32) * 1                  # lazy: no known range
    wg.reset_stats()
    out = ember.attention_cached(gpu(q), gpu(k), gpu(v), kc, vc, pos)
    wg.evaluate(out)
    assert wg.stats()["reads"] == 0
    rk, rv = np.full((C, Hkv, D), 7.0, np.float32), np.full((C, Hkv, D), -7.0, np.float32)
    rk[C - 2:], rv[C - 2:] = k[:2], v[:2]
    close(out.numpy(), ref_attention(q, rk, rv, C - 2), 2e-5)
    np.testing.assert_array_equal(big_k.numpy()[:C], rk)
    assert (big_k.numpy()[C:] == 7.0).all() and (big_v.numpy()[C:] == -7.0).all()


def _qweight(rng, n, k, qtype):
    from ember.quant import QTensor

    a = rng.standard_normal((n, k)) * 0.3
    w = QTensor.quantize(ember.from_numpy(a.astype(np.float32), device="python"), qtype)
    return w.to("webgpu"), np.asarray(w.dequantize().tolist(), dtype=np.float64).reshape(n, k)


@pytest.mark.parametrize("qtype,d", [("q8_0", 32), ("q4_1", 64)])
@pytest.mark.parametrize("S", [1, 2, 7])
def test_split_attention_proj(monkeypatch, qtype, d, S):
    """attention_proj split: attn's runs, then attn_comb merging them and multiplying the head's
    output by its slice of the output weight, n = 150 rows in blocks of 64 (the last partial):
    (1 + Hq, 1, n) against float64 numpy and the unsplit dispatch; the caches written."""
    from ember.ops.llm import attention_proj

    hq, hkv, C, n = 4, 2, 24, 150
    rng = np.random.default_rng(40 + S + d)
    w, wd = _qweight(rng, n, hq * d, qtype)
    for pos in (0, 1, 6, 7, 13, 23):
        kc0 = (rng.standard_normal((C, hkv, d)) * 0.5).astype(np.float32)
        vc0 = rng.standard_normal((C, hkv, d)).astype(np.float32)
        q = rng.standard_normal((1, hq, d)).astype(np.float32)
        k = (rng.standard_normal((1, hkv, d)) * 0.5).astype(np.float32)
        v = rng.standard_normal((1, hkv, d)).astype(np.float32)
        res = rng.standard_normal((1, n)).astype(np.float32)
        outs = {}
        for split in (S, 0):
            monkeypatch.setenv("EMBER_ATTN_SPLIT", str(split))
            kc, vc = gpu(kc0), gpu(vc0)
            ins = [gpu(q), gpu(k), gpu(v), gpu([pos], np.int32), gpu(res)]
            wg.evaluate(kc, vc, *ins)
            wg.reset_stats()
            got = attention_proj(*ins[:3], kc, vc, ins[3], w, ins[4])
            wg.evaluate(got)
            assert wg.stats()["dispatches"] == (2 if split else 1)
            assert got.shape == (1 + hq, 1, n)
            outs[split] = got.numpy()
            kr, vr = kc0.copy(), vc0.copy()
            kr[pos], vr[pos] = k[0], v[0]
            np.testing.assert_array_equal(kc.numpy(), kr)
            np.testing.assert_array_equal(vc.numpy(), vr)
        a = ref_attention(q, kr, vr, pos)                                    # (1, Hq, d)
        want = np.stack([res.astype(np.float64)] + [a[:, h] @ wd[:, h * d:(h + 1) * d].T for h in range(hq)])
        close(outs[S], want, 2e-3)
        close(outs[S], outs[0], 1e-5)


def test_split_rule(monkeypatch):
    """The automatic rule: off on CPU adapters, for prompts (T > 4) and for caches (or windows)
    of one 256-row chunk or less; else ~256 workgroups, runs of >= 32 rows at a full cache,
    2..64 runs. EMBER_ATTN_SPLIT forces S (0 off), on any adapter; other values raise."""
    monkeypatch.delenv("EMBER_ATTN_SPLIT", raising=False)
    assert wq.attn_splits(1, 9, 1024, cpu=True) == 0
    assert wq.attn_splits(1, 9, 1024) == 28             # SmolLM2 decoding: 252 workgroups
    assert wq.attn_splits(2, 9, 1024) == 14
    assert wq.attn_splits(1, 32, 4096) == 8
    assert wq.attn_splits(1, 2, 4096) == 64
    assert wq.attn_splits(1, 4, 320) == 10              # runs of 32 rows at the full cache
    assert wq.attn_splits(1, 64, 2048) == 4 and wq.attn_splits(1, 200, 2048) == 2
    assert wq.attn_splits(1, 9, 256) == 0 and wq.attn_splits(5, 9, 1024) == 0
    assert wq.attn_splits(1, 9, 8192, window=256) == 0 and wq.attn_splits(1, 9, 8192, window=1024) == 28
    for env, want in (("0", 0), ("1", 1), (" 7 ", 7), ("256", 256)):
        monkeypatch.setenv("EMBER_ATTN_SPLIT", env)
        assert wq.attn_splits(1, 9, 64) == want and wq.attn_splits(100, 9, 64, cpu=True) == want
    for bad in ("-1", "257", "two", "1.5"):
        monkeypatch.setenv("EMBER_ATTN_SPLIT", bad)
        with pytest.raises(ValueError, match="EMBER_ATTN_SPLIT"):
            wq.attn_splits(1, 9, 1024)


def test_cpu_adapters():
    """Which adapters count as CPUs for the rule (from the driver's info)."""
    class Rt:
        def __init__(self, **info):
            self.driver = type("D", (), {"info": info})()

    assert wq._cpu_adapter(Rt(adapter_type="CPU", device="llvmpipe (LLVM 15.0.6, 256 bits)"))
    assert wq._cpu_adapter(Rt(adapter_type="", device="", architecture="swiftshader"))
    assert wq._cpu_adapter(Rt(adapter_type="fallback", backend="browser"))
    assert not wq._cpu_adapter(Rt(adapter_type="DiscreteGPU", device="NVIDIA H100 80GB HBM3"))
    assert not wq._cpu_adapter(Rt(adapter_type="", backend="browser"))


def test_split_off_on_cpu_adapters(monkeypatch):
    """EMBER_ATTN_SPLIT unset: this adapter's kind decides (lavapipe: a CPU, one dispatch)."""
    monkeypatch.delenv("EMBER_ATTN_SPLIT", raising=False)
    C, T, Hq, Hkv, D = 1024, 1, 9, 3, 8
    kc0, vc0, q, k, v = _case(np.random.default_rng(5), C, T, Hq, Hkv, D)
    kc, vc = gpu(kc0), gpu(vc0)
    ins = [gpu(q), gpu(k), gpu(v), gpu([700], np.int32)]
    wg.evaluate(kc, vc, *ins)
    wg.reset_stats()
    wg.evaluate(ember.attention_cached(*ins[:3], kc, vc, ins[3]))
    cpu = wq._cpu_adapter(wg.get_runtime())
    assert wg.stats()["dispatches"] == (1 if cpu else 2)


def _auto_as_on_a_gpu(monkeypatch):
    """EMBER_ATTN_SPLIT unset and the adapter taken for a GPU: the rule a GPU gets."""
    monkeypatch.delenv("EMBER_ATTN_SPLIT", raising=False)
    monkeypatch.setattr(wq, "_cpu_adapter", lambda rt: False)


@pytest.mark.parametrize("split", ["auto", "7"])
def test_split_replayed_plan(monkeypatch, split):
    """An ember.compile'd decode step (one token, pos an input) on a 300-row cache, which the
    automatic rule (a GPU's) splits in 9 runs, and S = 7: three dispatches per replay (attn,
    attn_comb, the fused "* 1.0"), no read; positions 0..4 (the rule's runs hold 32 rows or more:
    one run works, eight return at once), then 250..253 (eight runs of 32 rows, the ninth empty)."""
    if split == "auto":
        _auto_as_on_a_gpu(monkeypatch)
    else:
        monkeypatch.setenv("EMBER_ATTN_SPLIT", split)
    C, Hq, Hkv, D = 300, 9, 3, 16
    assert split != "auto" or wq.attn_splits(1, Hq, C) == 9
    rng = np.random.default_rng(31)
    kc0 = rng.standard_normal((C, Hkv, D)).astype(np.float32)
    vc0 = rng.standard_normal((C, Hkv, D)).astype(np.float32)
    kc, vc = gpu(kc0), gpu(vc0)
    step = ember.compile(lambda q, k, v, pos: ember.attention_cached(q, k, v, kc, vc, pos) * 1.0)
    for i, pos in enumerate((0, 1, 2, 3, 4, 250, 251, 252, 253)):
        q = rng.standard_normal((1, Hq, D)).astype(np.float32)
        k = rng.standard_normal((1, Hkv, D)).astype(np.float32)
        v = rng.standard_normal((1, Hkv, D)).astype(np.float32)
        kc0[pos], vc0[pos] = k[0], v[0]
        ins = [gpu(q), gpu(k), gpu(v), gpu([pos], np.int32)]
        wg.evaluate(*ins)
        wg.reset_stats()
        out = step(*ins)
        wg.evaluate(out)
        if i >= 2:
            assert wg.stats()["dispatches"] == 3 and wg.stats()["reads"] == 0
        close(out.numpy(), ref_attention(q, kc0, vc0, pos), 2e-5)
    assert step.stats()["replays"] >= 5
    np.testing.assert_array_equal(kc.numpy(), kc0)
    np.testing.assert_array_equal(vc.numpy(), vc0)


def _greedy_ref(ref, ids, n, cfg):
    from llm_fixtures import reference_logits

    ids, out = list(ids), []
    for _ in range(n):
        out.append(int(np.argmax(reference_logits(ref, ids, cfg)[-1])))
        ids.append(out[-1])
    return out


@pytest.mark.parametrize("parts", ["0", "1"])
def test_split_tiny_llama_greedy(tmp_path, monkeypatch, parts):
    """A tiny llama (heads of 32 features, GQA 4/2) decoding greedily through ember.llm with a
    512-row cache, split by the automatic rule (a GPU's: 16 runs) and with EMBER_ATTN_SPLIT=0:
    the same tokens, the float64 reference's; the replayed step has one more dispatch a layer
    when split. parts "1": the layers as attention_proj (attn_comb with the output projection)."""
    from llm_fixtures import write_tiny_gguf

    monkeypatch.setenv("EMBER_LLM_PARTS", parts)
    path = tmp_path / "tiny512.gguf"
    cfg = dict(dim=128, n_heads=4, n_kv_heads=2, ffn_dim=96, ctx=512)
    ref = write_tiny_gguf(path, cfg=cfg)
    per_layer = 4 if parts == "1" else 5
    texts = {}
    for split in ("0", None):
        if split is None:
            _auto_as_on_a_gpu(monkeypatch)
            assert wq.attn_splits(1, 4, 512) == 16
            monkeypatch.setattr(wq, "ATTN_SPLIT_FROM", 0)   # (every position on the split step)
        else:
            monkeypatch.setenv("EMBER_ATTN_SPLIT", split)
        m = ember.llm.load(str(path), device="webgpu", context=512)
        m.model.reserve(512)                  # (ember.llm would reserve the reply's rows only)
        assert m.model.capacity == 512 and (m.model._parts_ok() == (parts == "1"))
        prompt = m.tokenizer.encode("the theater in a tent")
        texts[split] = m.generate(prompt, max_tokens=10)
        _, step = m._steps()
        plan = step.plan_for(ember.tensor([1], dtype="int64", device="webgpu"),
                             ember.tensor([0], dtype="int32", device="webgpu"))
        extra = 1 if split is None else 0
        assert plan.fast.describe()["dispatches"] == (per_layer + extra) * m.model.cfg.n_layers + 4
    assert texts[None] == texts["0"] == m.tokenizer.decode(_greedy_ref(ref, prompt, 10, cfg))



def test_decode_switches_to_the_split_step(tmp_path, monkeypatch):
    """ember.llm on a GPU's rule keeps two decode steps: the one recorded unsplit below
    ``ATTN_SPLIT_FROM`` (here 20, inside the reply), the split one from there; the tokens equal
    the float64 reference's and each step's plan has its own dispatch count. Where the rule
    never splits (EMBER_ATTN_SPLIT set, a CPU adapter) there is one step."""
    from llm_fixtures import write_tiny_gguf

    path = tmp_path / "tiny512.gguf"
    cfg = dict(dim=128, n_heads=4, n_kv_heads=2, ffn_dim=96, ctx=512)
    ref = write_tiny_gguf(path, cfg=cfg)
    _auto_as_on_a_gpu(monkeypatch)
    monkeypatch.setattr(wq, "ATTN_SPLIT_FROM", 20)
    m = ember.llm.load(str(path), device="webgpu", context=512)
    m.model.reserve(512)
    prompt = m.tokenizer.encode("the theater in a tent")
    assert len(prompt) < 20
    got = m.generate(prompt, max_tokens=14)
    assert got == m.tokenizer.decode(_greedy_ref(ref, prompt, 14, cfg))
    assert m._split_from == 20
    args = (ember.tensor([1], dtype="int64", device="webgpu"), ember.tensor([0], dtype="int32", device="webgpu"))
    short, long_ = m._steps(19)[1], m._steps(20)[1]
    assert short is not long_ and m._steps(None)[1] is long_
    n_short = short.plan_for(*args).fast.describe()["dispatches"]
    n_long = long_.plan_for(*args).fast.describe()["dispatches"]
    assert n_long == n_short + m.model.cfg.n_layers          # attn_comb a layer
    # sampling (logits read back) goes through the same two steps
    assert m.generate(prompt, max_tokens=14, temperature=0.7, seed=3) == \
        m.generate(prompt, max_tokens=14, temperature=0.7, seed=3)
    for env in ("0", "5"):
        monkeypatch.setenv("EMBER_ATTN_SPLIT", env)
        assert wq.decode_split_from(4, 512) is None
    monkeypatch.delenv("EMBER_ATTN_SPLIT")
    assert wq.decode_split_from(4, 256) is None              # one chunk: never split
    monkeypatch.setattr(wq, "_cpu_adapter", lambda rt: True)
    assert wq.decode_split_from(4, 512) is None

# ---- the same kernels in the page (Chromium's WebGPU on SwiftShader: its own WGSL compiler) ------

PAGE_CODE = r'''
import json, os, random
import ember
import ember.webgpu as wg
from ember.ops.llm import attention_proj
from ember.quant import QTensor

await wg.init()
rng = random.Random(3)

def rows(*shape):
    if len(shape) == 1:
        return [rng.gauss(0, 1) for _ in range(shape[0])]
    return [rows(*shape[1:]) for _ in range(shape[0])]

C, Hq, Hkv, D, n = 20, 4, 2, 32, 70
kc0, vc0 = rows(C, Hkv, D), rows(C, Hkv, D)
calls = [(T, pos, rows(T, Hq, D), rows(T, Hkv, D), rows(T, Hkv, D)) for T, pos in ((2, 0), (1, 2), (1, 9), (2, 17))]
W = QTensor.quantize(ember.tensor(rows(n, Hq * D), device="python"), "q8_0")
res = rows(1, n)
out = {}
for split in ("3", "0", "python"):
    dev = "python" if split == "python" else "webgpu"
    os.environ["EMBER_ATTN_SPLIT"] = "0" if split == "python" else split
    kc, vc = ember.tensor(kc0, device=dev), ember.tensor(vc0, device=dev)
    got = []
    for T, pos, q, k, v in calls:
        t = [ember.tensor(a, device=dev) for a in (q, k, v)]
        p = ember.tensor([pos], dtype="int32", device=dev)
        if dev == "webgpu":
            wg.evaluate(*t, p)
            wg.reset_stats()
        a = ember.attention_cached(*t, kc, vc, p)
        if dev == "webgpu":
            wg.evaluate(a)
            out.setdefault("dispatches_" + split, []).append(wg.stats()["dispatches"])
        got.append(a.tolist())
        if T == 1:
            got.append(attention_proj(*t, kc, vc, p, W.to(dev), ember.tensor(res, device=dev)).tolist())
    out[split] = [got, kc.tolist(), vc.tolist()]
os.environ.pop("EMBER_ATTN_SPLIT")
json.dumps(out)
'''


def _flat(x):
    if isinstance(x, list):
        return [v for e in x for v in _flat(e)]
    return [x]


def test_split_in_the_page(tmp_path):
    """attention_cached (T = 1 and 2, GQA) and attention_proj (q8_0, heads of 32) split in 3
    runs, and unsplit, under Chromium's compiler: the pure-Python device's results."""
    from browser_page import SKIPS, run_page

    for mark in SKIPS:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    res = run_page(tmp_path, PAGE_CODE, webgpu=True, timeout_ms=300_000)
    assert res["dispatches_3"] == [2] * 4 and res["dispatches_0"] == [1] * 4      # attn (+ attn_comb)
    want = np.array(_flat(res["python"]), np.float64)
    assert np.isfinite(want).all()
    for split in ("3", "0"):
        got = np.array(_flat(res[split]), np.float64)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())),
                                   err_msg=split)


# value rows read as vec4s (D a multiple of 4, NS > 1: ``quant.ATTN_V4``) or as floats (D = 6, 90;
# D = 300: one slice, NS = 1), unsplit and split, at a position inside the second 256-row chunk
@pytest.mark.parametrize("D", [6, 64, 90, 128, 300])
@pytest.mark.parametrize("v4", [True, False])
@pytest.mark.parametrize("split", [0, 3])
def test_value_rows_vec4_or_floats(monkeypatch, D, v4, split):
    monkeypatch.setattr(wq, "ATTN_V4", v4)
    rng = np.random.default_rng(D)
    C, pos, T = 300, 280, 2
    kc0, vc0, q, k, v = _case(rng, C, T, 4, 2, D)
    out, kc, vc, _ = _run(monkeypatch, split, kc0, vc0, q, k, v, pos, scale=1 / math.sqrt(D))
    kw, vw = kc0.copy(), vc0.copy()
    kw[pos:pos + T], vw[pos:pos + T] = k, v
    close(out, ref_attention(q, kw, vw, pos), 2e-5)
    assert np.array_equal(vc, vw) and np.array_equal(kc, kw)
