"""ember.tokenizers.SPMTokenizer (SentencePiece "llama" vocabularies) against SentencePiece's own
ids and decoded text (tests/golden/spm_tokenizer.json, made by tests/golden/make_spm_golden.py:
no sentencepiece needed here); llama.cpp's rules for special tokens, BOS and the prefix space;
the streaming decoder; errors; ember.tokenizers.from_gguf; and ember.llm end to end on a tiny
llama GGUF with that vocabulary and a chat template."""
import json
from pathlib import Path

import pytest

import ember.llm
from ember.errors import IndexingError, TokenizerError
from ember.tokenizers import BPETokenizer, SPMTokenizer, from_gguf

GOLDEN = json.loads((Path(__file__).resolve().parent / "golden" / "spm_tokenizer.json").read_text(encoding="utf-8"))
MD = GOLDEN["metadata"]
CASES = GOLDEN["cases"]
# a TinyLlama-like (Zephyr) chat template and a Llama-2-like one (it writes BOS itself)
ZEPHYR = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
LLAMA2 = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}"
          "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def tok():
    return SPMTokenizer.from_gguf(MD)


def _ids(case):
    return pytest.param(case, id=repr(case["text"])[:40])


@pytest.mark.parametrize("case", [_ids(c) for c in CASES])
def test_ids_and_decode_match_sentencepiece(tok, case):
    # sentencepiece reads "<s>" in text as text and adds no BOS
    assert tok.encode(case["text"], add_special=False, parse_special=False) == case["ids"]
    if "<s>" not in case["text"] and "</s>" not in case["text"] and "<unk>" not in case["text"]:
        assert tok.encode(case["text"], add_special=False) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.encode(case["text"], parse_special=False) == [1] + case["ids"]     # add_bos_token defaults to true


def test_golden_covers_bytes_and_ties():
    # the golden texts reach the byte fallback and runs of one repeated character (equal scores)
    ids = [i for c in CASES for i in c["ids"]]
    types = MD["tokenizer.ggml.token_type"]
    assert sum(types[i] == 6 for i in ids) > 20
    assert {t for t in MD["tokenizer.ggml.tokens"] if set(t) == {"\u2581"}} >= {"\u2581\u2581", "\u2581\u2581\u2581\u2581"}


def test_stream_joins_to_decode(tok):
    for case in CASES:
        for ids, skip in ((case["ids"], False), ([1] + case["ids"] + [2], False), ([1] + case["ids"] + [2], True)):
            s = tok.stream(skip)
            pieces = [s.put(i) for i in ids] + [s.flush()]
            assert "".join(pieces) == tok.decode(ids, skip_special=skip), case["text"]
    # an emoji split over four byte tokens comes out whole, once its last byte arrived
    emoji = next(c for c in CASES if c["text"] == "😀")
    s = tok.stream()
    pieces = [s.put(i) for i in emoji["ids"]]
    assert [tok.token_type(i) for i in emoji["ids"][-4:]] == [6] * 4
    assert pieces[-4:] == ["", "", "", "😀"] and s.flush() == ""
    # only the stream's first space goes; flush starts a new stream; lstrip=False keeps it
    hw = tok.encode("Hello world", add_special=False)
    s = tok.stream()
    assert "".join(s.put(i) for i in hw + hw) == "Hello world Hello world"
    s.flush()
    assert "".join(s.put(i) for i in hw) == "Hello world"
    s2 = tok.stream(lstrip=False)
    assert "".join(s2.put(i) for i in hw) + s2.flush() == " Hello world"


def test_decode_strips_one_leading_space(tok):
    a, b = tok.token_to_id("\u2581import"), tok.token_to_id("\u2581tensor")
    assert tok.decode([a, b]) == "import tensor"
    assert tok.decode([tok.token_to_id("\u2581\u2581"), a]) == "  import"          # one of three
    ids = [1] + tok.encode("Hello world", add_special=False) + [2]
    assert tok.decode(ids) == "<s> Hello world</s>"
    assert tok.decode(ids, skip_special=True) == "Hello world"


def test_special_tokens_in_text(tok):
    def plain(t):
        return tok.encode(t, add_special=False, parse_special=False)

    # parsed: their ids, and the run after one gets its own leading space (llama.cpp)
    assert tok.encode("<s>Hi there</s>world", add_special=False) == [1] + plain("Hi there") + [2] + plain("world")
    assert tok.encode("</s>", add_special=False) == [2] and tok.encode("") == [1]
    assert tok.encode("", add_special=False) == []
    assert tok.encode("a<unk>b", add_special=False) == plain("a") + [0] + plain("b")
    # not parsed: text
    assert 1 not in plain("<s>x") and 2 not in plain("x</s>")
    # add_eos_token; add_bos_token false
    t2 = SPMTokenizer.from_gguf({**MD, "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.add_bos_token": False})
    assert t2.encode("x") == plain("x") + [2] and t2.add_bos is False


def test_add_space_prefix_false(tok):
    t2 = SPMTokenizer.from_gguf({**MD, "tokenizer.ggml.add_space_prefix": False})
    for text in ("Hello world", "x = 1", "日本語"):
        assert t2.encode(" " + text, add_special=False) == tok.encode(text, add_special=False)
    ids = t2.encode("Hello", add_special=False)
    assert t2.decode(ids) == "Hello" and t2.id_to_token(ids[0])[0] != "\u2581"
    assert t2.decode(tok.encode("Hello", add_special=False)) == " Hello"      # no space dropped


def test_hand_made_vocabulary():
    # user-defined tokens are matched even unparsed; an unused token is cut back into its parts;
    # a missing byte token becomes <unk>; ties go to the leftmost pair
    tokens = ["<unk>", "<s>", "</s>", "<0xC3>", "\u2581", "a", "b", "ab", "aa", "<tool>", "\u2581a", "x"]
    scores = [0, 0, 0, 0, -1, -2, -3, -1.5, -4, 0, -0.5, -6]
    types = [2, 3, 3, 6, 1, 1, 1, 5, 1, 4, 1, 1]
    t = SPMTokenizer(tokens, scores, token_types=types, bos_id=1, eos_id=2, unk_id=0)
    names = lambda ids: [t.id_to_token(i) for i in ids]  # noqa: E731
    assert names(t.encode("ab", add_special=False)) == ["\u2581a", "b"]
    assert names(t.encode("xab", add_special=False)) == ["\u2581", "x", "a", "b"]    # "ab" unused: a, b
    assert names(t.encode("x<tool>aaa", add_special=False, parse_special=False)) == \
        ["\u2581", "x", "<tool>", "\u2581a", "aa"]
    assert names(t.encode("xaaa", add_special=False)) == ["\u2581", "x", "aa", "a"]   # leftmost of equal pairs
    assert names(t.encode("xé", add_special=False)) == ["\u2581", "x", "<0xC3>", "<unk>"]   # é = C3 A9
    assert t.decode(t.encode("x<tool>a", add_special=False)) == "x<tool> a"
    assert t.token_bytes(7) == b"" and t.token_bytes(3) == b"\xc3" and t.is_special(0)
    assert repr(t).startswith("SPMTokenizer(vocab_size=12")


def test_errors(tok):
    def build(**changes):
        return SPMTokenizer.from_gguf({**MD, **changes})

    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores"):
        build(**{"tokenizer.ggml.scores": MD["tokenizer.ggml.scores"][:-1]})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores"):
        SPMTokenizer.from_gguf({k: v for k, v in MD.items() if k != "tokenizer.ggml.scores"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores"):
        build(**{"tokenizer.ggml.scores": ["x"] * len(MD["tokenizer.ggml.tokens"])})
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.tokens\[3\]"):
        build(**{"tokenizer.ggml.tokens": MD["tokenizer.ggml.tokens"][:3] + [3] + MD["tokenizer.ggml.tokens"][4:]})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens"):
        SPMTokenizer.from_gguf({k: v for k, v in MD.items() if k != "tokenizer.ggml.tokens"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.token_type"):
        build(**{"tokenizer.ggml.token_type": [1, 2]})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.bos_token_id"):
        build(**{"tokenizer.ggml.bos_token_id": 10 ** 6})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.eos_token_id"):
        build(**{"tokenizer.ggml.eos_token_id": "2"})
    with pytest.raises(TokenizerError, match="'gpt2'"):
        build(**{"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(TokenizerError, match="str"):
        tok.encode(b"bytes")
    for bad in (-1, tok.vocab_size, "1", 1.0, None):
        with pytest.raises(IndexingError, match="vocabulary"):
            tok.decode([bad])
        with pytest.raises(IndexingError):
            tok.id_to_token(bad)
    s = tok.stream()
    with pytest.raises(IndexingError):
        s.put(tok.vocab_size)


def test_factory_dispatch():
    assert isinstance(from_gguf(MD), SPMTokenizer)
    bpe = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    assert isinstance(from_gguf(bpe), BPETokenizer)
    for model in ("bert", "t5", "ugm", "rwkv", None, 3):
        with pytest.raises(TokenizerError, match=repr(model)):
            from_gguf({**MD, "tokenizer.ggml.model": model})


# ---- ember.llm end to end -------------------------------------------------------------------------

SPM_CFG = dict(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, ffn_dim=32, ctx=64)


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory):
    from llm_fixtures import write_tiny_gguf

    path = tmp_path_factory.mktemp("llm_spm") / "tiny_spm.gguf"
    ref = write_tiny_gguf(path, seed=1, qtypes=("Q8_0", "Q8_0"), cfg=SPM_CFG,
                          tokenizer={**MD, "tokenizer.chat_template": ZEPHYR})
    return path.read_bytes(), ref


@pytest.mark.parametrize("device", ["numpy", "python"])
def test_llm_with_spm_vocabulary(tiny_spm, device):
    from llm_fixtures import reference_logits

    data, ref = tiny_spm
    m = ember.llm.load(data, device=device)
    tok = m.tokenizer
    assert isinstance(tok, SPMTokenizer) and tok.add_bos and m.eog == {2}
    prompt = "Once upon a time"
    text = m.generate(prompt, max_tokens=5, temperature=0)
    assert isinstance(text, str) and m.stats["prompt_tokens"] == len(tok.encode(prompt))
    assert "".join(m.generate(prompt, max_tokens=5, stream=True)) == text
    # the reference's greedy ids, decoded as a continuation (its first space kept)
    ids = tok.encode(prompt)
    for _ in range(m.stats["tokens"]):
        ids.append(int(reference_logits(ref, ids, SPM_CFG)[-1].argmax()))
    new = ids[len(tok.encode(prompt)):]
    s = tok.stream(lstrip=False)
    assert 2 not in new and text == "".join(map(s.put, new)) + s.flush()
    assert tok.decode(new) == (text[1:] if text[:1] == " " else text)
    msgs = [{"role": "user", "content": "Hi, who are you?"}]
    reply = m.chat(msgs, max_tokens=5)
    assert isinstance(reply, str) and "".join(m.chat(msgs, max_tokens=5, stream=True)) == reply
    ids = tok.encode(tok.chat(msgs))
    assert ids[0] == 1 and ids[1] != 1 and m.stats["prompt_tokens"] == len(ids)
    assert 2 in ids                                          # the template's </s>, parsed


def test_llm_chat_template_writing_bos(tiny_spm):
    m = ember.llm.load(tiny_spm[0], device="numpy")
    m.tokenizer.chat_template = LLAMA2
    msgs = [{"role": "user", "content": "Hi"}]
    ids = m.tokenizer.encode(m.tokenizer.chat(msgs))
    assert ids[:2] == [1, 1]
    assert isinstance(m.chat(msgs, max_tokens=3), str) and m.stats["prompt_tokens"] == len(ids) - 1   # one BOS


# ---- inside Pyodide ---------------------------------------------------------------------------------

PYODIDE_DRIVER = '''
import json
from ember.tokenizers import from_gguf
golden = json.load(open("/golden/spm_tokenizer.json", encoding="utf-8"))
tok = from_gguf(golden["metadata"])
out = {"ids": [], "decoded": [], "stream": []}
for case in golden["cases"]:
    out["ids"].append(tok.encode(case["text"], add_special=False, parse_special=False))
    out["decoded"].append(tok.decode(case["ids"]))
    s = tok.stream()
    out["stream"].append("".join(s.put(i) for i in case["ids"]) + s.flush())
out["chat"] = tok.encode("<s>Hi</s>", add_special=False)
json.dump(out, open("/io/out.json", "w"))
'''


def test_in_pyodide(tmp_path_factory):
    """The same ids, decodes and streams in Pyodide (no C extensions, standard library only)."""
    import test_pyodide as tp

    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("spm-pyodide")
    proc = tp.run_driver(node, wheel, io, PYODIDE_DRIVER, {io: "/io", Path(__file__).resolve().parent / "golden": "/golden"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((io / "out.json").read_text(encoding="utf-8"))
    assert out["ids"] == [c["ids"] for c in CASES]
    assert out["decoded"] == out["stream"] == [c["decoded"] for c in CASES]
    assert out["chat"] == SPMTokenizer.from_gguf(MD).encode("<s>Hi</s>", add_special=False)
