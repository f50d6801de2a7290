"""GGUF architectures beside llama, end to end against the float64 reference forward of
tests/llm_fixtures.py on every backend: Qwen2 (q/k/v biases, the rotation over halves of a head)
and Qwen3 (no biases, q and k heads RMS-normalised before the rotation)."""
import numpy as np
import pytest

import ember
import ember.llm
from ember.errors import WeightsError
from llm_fixtures import reference_logits, write_tiny_gguf

CASES = {"qwen2": dict(arch="qwen2", qkv_bias=True), "qwen3": dict(arch="qwen3", qk_norm=True)}
TOL = {"wasm": 2e-2, "webgpu": 1e-3}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_logits_and_incremental_decoding_match_the_reference(device, tmp_path, arch):
    cfg = CASES[arch]
    path = tmp_path / "m.gguf"
    ref = write_tiny_gguf(path, cfg=cfg)
    m = ember.llm.load(str(path), device=device, context=32)
    assert m.model.cfg.arch == arch and m.model.cfg.rope_mode == "halves"
    ids = m.tokenizer.encode("the theater in a tent")
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
