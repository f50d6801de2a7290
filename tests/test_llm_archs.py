"""GGUF architectures beside llama, end to end against the float64 reference forward of
tests/llm_fixtures.py on every backend: Qwen2 (q/k/v biases, the rotation over halves of a head),
Qwen3 (no biases, q and k heads RMS-normalised before the rotation), and Gemma 1/2/3 (scaled
embeddings, GELU gate, heads wider than dim / n_heads; 2/3: post-norms and a sliding window of 8
positions on local layers, which a 13-token prompt exceeds; 2: soft-capped scores and logits;
3: q/k norms, a global layer (the sixth) with its own RoPE base and linear scaling)."""
import numpy as np
import pytest

import ember
import ember.llm
from ember.backends.numpy_quant import native_qlinear
from ember.errors import WeightsError
from llm_fixtures import reference_logits, write_tiny_gguf

CASES = {"qwen2": dict(arch="qwen2", qkv_bias=True), "qwen3": dict(arch="qwen3", qk_norm=True),
         "gemma": dict(arch="gemma", head_dim=24, eps=1e-6),
         "gemma2": dict(arch="gemma2", head_dim=24, eps=1e-6, n_layers=3, sliding_window=8,
                        attn_logit_softcapping=3.0, final_logit_softcapping=5.0),
         "gemma3": dict(arch="gemma3", qk_norm=True, eps=1e-6, n_layers=6, sliding_window=8, base=1e6,
                        rope_scaling=("linear", 2.0))}
PROMPT = "the theater in a tent, then another in the rain"
TOL = {"numpy": 2e-2 if native_qlinear() else 1e-4, "wasm": 2e-2, "webgpu": 1e-3}   # (numpy: see test_llm.py)


@pytest.mark.parametrize("arch", sorted(CASES))
def test_logits_and_incremental_decoding_match_the_reference(device, tmp_path, arch):
    cfg = CASES[arch]
    path = tmp_path / "m.gguf"
    ref = write_tiny_gguf(path, cfg=cfg)
    m = ember.llm.load(str(path), device=device, context=32)
    assert m.model.cfg.arch == arch and m.model.cfg.rope_mode == "halves"
    ids = m.tokenizer.encode(PROMPT if arch.startswith("gemma") else "the theater in a tent")
    if cfg.get("sliding_window"):
        assert len(ids) > cfg["sliding_window"] + 2
    want = reference_logits(ref, ids, cfg)
    tol = TOL.get(device, 1e-4)
    full = m.model.forward(ember.tensor(ids, dtype="int32", device=device),
                           ember.tensor([0], dtype="int32", device=device), all_logits=True)
    np.testing.assert_allclose(np.asarray(full.tolist()), want, atol=tol * 10, rtol=tol)
    # one token at a time through the KV cache (webgpu: the decode's stacked products)
    m2 = ember.llm.load(path.read_bytes(), device=device, context=32)
    for i, t in enumerate(ids):
        lg = m2.model.forward(ember.tensor([t], dtype="int32", device=device),
                              ember.tensor([i], dtype="int32", device=device))
        np.testing.assert_allclose(np.asarray(lg.tolist()[0]), want[i], atol=tol * 10, rtol=tol)


def test_reference_sees_what_each_feature_changes(tmp_path):
    """(The reference is not blind to the features: dropping any of them moves the logits.)"""
    ref = write_tiny_gguf(tmp_path / "a.gguf", cfg=CASES["qwen3"])
    ids = [5, 9, 40, 3, 77, 12]
    a = reference_logits(ref, ids, CASES["qwen3"])
    assert np.abs(a - reference_logits(ref, ids, dict(CASES["qwen3"], arch="llama"))).max() > 1e-2
    plain = {k: v for k, v in ref.items() if "attn_q_norm" not in k and "attn_k_norm" not in k}
    assert np.abs(a - reference_logits(plain, ids, CASES["qwen3"])).max() > 1e-2
    ref2 = write_tiny_gguf(tmp_path / "b.gguf", cfg=CASES["qwen2"])
    b = reference_logits(ref2, ids, CASES["qwen2"])
    nob = {k: v for k, v in ref2.items() if not k.endswith(".bias")}
    assert np.abs(b - reference_logits(nob, ids, CASES["qwen2"])).max() > 1e-2


def test_reference_sees_each_gemma_feature(tmp_path):
    """Each Gemma switch of the reference moves its logits, so the tests above cannot pass with
    ember ignoring one: embedding scale, GELU (vs llama's SiLU), post norms, the sliding window,
    both soft caps, the local layers' RoPE base."""
    ids = list(range(5, 70, 5))
    ref2 = write_tiny_gguf(tmp_path / "g2.gguf", cfg=CASES["gemma2"])
    ref3 = write_tiny_gguf(tmp_path / "g3.gguf", cfg=CASES["gemma3"])
    for ref, cfg, changes in (
            (ref2, CASES["gemma2"], [dict(embed_scale=False), dict(sliding_window=0),
                                     dict(attn_logit_softcapping=0), dict(final_logit_softcapping=0)]),
            (ref3, CASES["gemma3"], [dict(sliding_window=0), dict(base_local=1e6)])):
        a = reference_logits(ref, ids, cfg)
        for ch in changes:
            assert np.abs(a - reference_logits(ref, ids, dict(cfg, **ch))).max() > 1e-2, ch
        nopost = {k: v for k, v in ref.items() if "post_" not in k}
        assert np.abs(a - reference_logits(nopost, ids, cfg)).max() > 1e-2
    g1 = dict(CASES["gemma"])
    ref1 = write_tiny_gguf(tmp_path / "g1.gguf", cfg=g1)
    a = reference_logits(ref1, ids, g1)
    assert np.abs(a - reference_logits(ref1, ids, dict(g1, arch="qwen2"))).max() > 1e-2   # (SiLU, no scale)


def test_gemma_config_from_metadata(tmp_path):
    """The switches read from a file: layer pattern, window, caps, query scale, RoPE bases."""
    from ember.nn.llama import LlamaConfig

    write_tiny_gguf(tmp_path / "g3.gguf", cfg=CASES["gemma3"])
    c = LlamaConfig.from_gguf(ember.load_gguf(str(tmp_path / "g3.gguf")).metadata)
    assert (c.act, c.post_norms, c.sliding_window, c.rope_base_local, c.rope_base, c.rope_scale) == (
        "gelu_tanh", True, 8, 10000.0, 1e6, 2.0)
    assert [c.local(i) for i in range(6)] == [True] * 5 + [False] and c.embed_scale == 8.0
    write_tiny_gguf(tmp_path / "g2.gguf", cfg=CASES["gemma2"])
    c = LlamaConfig.from_gguf(ember.load_gguf(str(tmp_path / "g2.gguf")).metadata)
    assert [c.local(i) for i in range(3)] == [True, False, True] and c.head_dim == 24
    assert (c.attn_softcap, c.final_softcap, c.query_scale, c.rope_base_local) == (3.0, 5.0, 0.0, 0.0)
    write_tiny_gguf(tmp_path / "g1.gguf", cfg=CASES["gemma"])
    c = LlamaConfig.from_gguf(ember.load_gguf(str(tmp_path / "g1.gguf")).metadata)
    assert (c.post_norms, c.sliding_window, c.attn_softcap) == (False, 0, 0.0) and not c.local(0)


def test_gemma_missing_post_norm(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, cfg=CASES["gemma2"])
    g = ember.load_gguf(str(path))
    from ember.nn.llama import Llama
    w = {n: g.tensor(n, device="numpy") for n in g.tensors}
    del w["blk.2.post_ffw_norm.weight"]
    with pytest.raises(WeightsError, match="post_ffw_norm"):
        Llama(Llama.from_gguf(g, device="numpy").cfg, w, device="numpy")


def test_bad_qk_norm_weight(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, cfg=CASES["qwen3"])
    g = ember.load_gguf(str(path))
    assert g.tensors["blk.1.attn_k_norm.weight"].shape == (16,)
    from ember.nn.llama import Llama
    w = {n: g.tensor(n, device="numpy") for n in g.tensors}
    w["blk.1.attn_k_norm.weight"] = ember.ones((8,), device="numpy")
    with pytest.raises(WeightsError, match="attn_k_norm"):
        Llama(Llama.from_gguf(g, device="numpy").cfg, w, device="numpy")


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_greedy_generation_matches_the_reference(device, tmp_path, arch):
    """ember.llm's generation (its compiled one-token step, replayed per position) past the
    sliding window: the greedy tokens of the float64 reference."""
    cfg = CASES[arch]
    path = tmp_path / "m.gguf"
    ref = write_tiny_gguf(path, cfg=cfg)
    m = ember.llm.load(str(path), device=device, context=64)
    prompt = m.tokenizer.encode("on the tin in a tent")
    ids, want = list(prompt), []
    for _ in range(10):
        want.append(int(np.argmax(reference_logits(ref, ids, cfg)[-1])))
        ids.append(want[-1])
    stops = m.eog
    cut = next((i for i, t in enumerate(want) if t in stops), len(want))
    assert m.generate(prompt, max_tokens=10) == m.tokenizer.decode(want[:cut])


def test_onnx_export_refuses_a_windowed_attention(tmp_path):
    """The ONNX exporter writes plain causal attention: a Gemma-style layer (sliding window,
    soft-capped scores) is refused by name instead of exported wrong."""
    from ember.errors import UnsupportedOp
    from ember.nn.llama import Llama, LlamaConfig

    cfg = LlamaConfig(n_layers=1, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=48, sliding_window=4,
                      swa_pattern=2, attn_softcap=5.0)
    m = Llama.random(cfg, seed=1, context=16, device="numpy")
    ids = ember.tensor([3, 1, 4], dtype="int32", device="numpy")
    pos = ember.tensor([0], dtype="int32", device="numpy")
    with pytest.raises(UnsupportedOp, match="sliding window"):
        ember.onnx.export(lambda i, p: m.forward(i, p, all_logits=True), (ids, pos), tmp_path / "g.onnx")
