#!/usr/bin/env python3
"""Produce tests/golden/spm_tokenizer.json: a small SentencePiece BPE vocabulary shaped like
Llama's, as a GGUF file's tokenizer metadata, and what SentencePiece itself gives for held-out
texts (ids and decoded text). tests/test_tokenizers_spm.py checks ember's ``SPMTokenizer``
against it; the tests need neither sentencepiece nor the network.

    pip install --target /tmp/sp sentencepiece==0.2.2
    PYTHONPATH=/tmp/sp python tests/golden/make_spm_golden.py

The model is trained once (deterministically: one thread, no sampling) on this repository's own
text at a fixed commit (README.md, the demos' READMEs and the Python sources under core/,
Apache-2.0; needs the git history) with Llama's
settings: model_type=bpe, byte_fallback, split_digits, identity normalization, no removal of
extra whitespace, the dummy prefix, unk=0 "<unk>", bos=1 "<s>", eos=2 "</s>", then the 256
"<0xXX>" byte pieces, then the merges. The metadata is what llama.cpp's converter writes for
such a model: ``tokens``, ``scores`` (float32) and ``token_type`` (2 unknown, 3 control, 6 byte,
5 unused, 1 normal). SentencePiece adds no BOS, and its dummy prefix is GGUF's
``add_space_prefix``; it reads "<s>" in text as text (ember: ``parse_special=False``).
The TEXTS below were written for this file and are not in the training text.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT = HERE / "spm_tokenizer.json"
VOCAB = 3000
TRAIN_COMMIT = "b89811dba903c7611326d376d6ba8cb6fed5c847"   # the training text's revision

TEXTS = [
    "", " ", "  ", "Hello world", "Hello, world!", " leading space", "trailing space ",
    "  two  spaces  between  ", "a    b     c", "\n", "line one\nline two\n\nline four",
    "\ttabs\tand\t\tmore tabs", "mixed \t \n whitespace \r\n CRLF",
    "Café crème brûlée, naïve façade, Ångström, Øresund, Łódź", "Straße ß ẞ ĳ ﬁ",
    "日本語のテキストと漢字", "中文分词测试：你好，世界！", "한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷", "😀", " 🙂 ",
    "العربية من اليمين إلى اليسار", "עברית: שלום עולם", "Ελληνικά και Русский текст",
    "def greet(name: str) -> str:\n    return f\"Hi, {name}!\"\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "x = {'key': [1, 2, 3], \"other\": None}  # comment",
    "12345 3.14159 -42 1e10 0x1F 1,000,000", "2026-12-07T04:03:12Z", "phone +44 20 7946 0958",
    "<s>not special</s> and <unk> as text", "User: hi</s><s>Assistant:",
    "Pneumonoultramicroscopicsilicovolcanoconiosis", "supercalifragilisticexpialidocious" * 3,
    "aaaaaaaaaaaaaaaaaaaaaaa", "eeeeeee ttttt", "▁already▁escaped▁", "The quick brown fox jumps over the lazy dog.",
    "Tokenization of GGUF vocabularies with scores, merged highest score first.",
    "ends with newline\n", "\u00a0non\u2003breaking\u3000spaces", "e\u0301 combining and \u200b zero width",
]


def corpus() -> str:
    """This repository's own text at commit TRAIN_COMMIT (fixed, so the model is the same
    whoever trains it): README.md, the demos' READMEs and core/'s Python sources."""
    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                              text=True, encoding="utf-8").stdout

    names = [p for p in git("ls-tree", "-r", "--name-only", TRAIN_COMMIT).splitlines()
             if p == "README.md" or (p.startswith("demos/") and p.count("/") == 2 and p.endswith("/README.md"))
             or (p.startswith("core/") and p.endswith(".py"))]
    return "\n".join(git("show", f"{TRAIN_COMMIT}:{p}") for p in names)


def train(model_prefix: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        for line in corpus().splitlines():
            if line.strip():
                f.write(line + "\n")
        path = f.name
    spm.SentencePieceTrainer.train(
        input=path, model_prefix=model_prefix, model_type="bpe", vocab_size=VOCAB,
        character_coverage=0.99995, byte_fallback=True, split_digits=True,
        allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=1 << 16, minloglevel=2)


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        train(d + "/m")
        sp = spm.SentencePieceProcessor(model_file=d + "/m.model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(f32(sp.get_score(i)))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                     else 6 if sp.is_byte(i) else 1)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    cases = []
    for text in TEXTS:
        ids = sp.encode(text, out_type=int)
        cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0}
    out = {"sentencepiece": spm.__version__, "vocab_size": len(tokens), "metadata": metadata, "cases": cases}
    OUT.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(tokens)} tokens, {len(cases)} texts)", file=sys.stderr)


if __name__ == "__main__":
    main()
