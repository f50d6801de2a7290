"""BERT's WordPiece tokenizer (uncased) in pure Python, for all-MiniLM-L6-v2.

It reproduces what the model's ``tokenizer.json`` describes (HuggingFace ``tokenizers``:
BertNormalizer, BertPreTokenizer, WordPiece, the ``[CLS] A [SEP]`` template), checked token for
token against that library's output in ``golden_tokens.json``:

1. clean: drop NUL, U+FFFD and control / format / unassigned characters (tab, CR and LF are
   whitespace, not control); every whitespace character becomes a plain space;
2. put spaces around CJK ideographs, so each becomes a word of its own;
3. strip accents (NFD, then drop the non-spacing marks), then lowercase character by character
   (``"Σ"`` is always ``"σ"``, no final-sigma rule, as in the reference);
4. split on whitespace, and split every punctuation character off as a word of its own (ASCII
   punctuation such as ``$+<=>^`|~`` counts, like the Unicode ``P*`` categories);
5. WordPiece each word: longest vocabulary prefix first, continuations spelled ``##piece``; a word
   that cannot be covered, or is longer than 100 characters, becomes ``[UNK]``;
6. ``[CLS] pieces [SEP]``, cut to ``max_length`` ids (pieces are dropped from the end).

Only the standard library (``unicodedata``) is used, so it runs in Pyodide.

>>> import os
>>> tok = Tokenizer.from_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab.txt"))
>>> tok.tokenize("Héllo, WORLD! Unbelievable")
['hello', ',', 'world', '!', 'unbelievable']
>>> tok.tokenize("tokenizers")
['token', '##izer', '##s']
>>> batch = tok(["a cat", "hi"])
>>> batch["input_ids"], batch["attention_mask"]
([[101, 1037, 4937, 102], [101, 7632, 102, 0]], [[1, 1, 1, 1], [1, 1, 1, 0]])
"""
from __future__ import annotations

import unicodedata

__all__ = ["Tokenizer"]

# sentence-transformers' max_seq_length for all-MiniLM-L6-v2 (sentence_bert_config.json); the
# position table has 512 rows.
MAX_LENGTH = 256
MAX_WORD_CHARS = 100

# The CJK Unified Ideographs blocks BERT treats as words of their own (not Hangul or kana).
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_OTHER = ("Cc", "Cf", "Cs", "Co", "Cn")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class Tokenizer:
    """WordPiece tokenizer over a BERT ``vocab.txt`` (one token per line; the line number is
    the id). Call it on a list of strings for padded ``input_ids`` / ``attention_mask``."""

    def __init__(self, vocab: list[str], max_length: int = MAX_LENGTH) -> None:
        if not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"Tokenizer: max_length must be an int >= 2 (room for [CLS] and [SEP]), "
                             f"got {max_length!r}")
        self.vocab = {tok: i for i, tok in enumerate(vocab)}
        for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]"):
            if special not in self.vocab:
                raise ValueError(f"Tokenizer: the vocabulary has no {special} token; is this a BERT vocab.txt?")
        self.pad_id, self.unk_id = self.vocab["[PAD]"], self.vocab["[UNK]"]
        self.cls_id, self.sep_id = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.max_length = max_length
        self._cache: dict = {}

    @classmethod
    def from_text(cls, text: str, **kw) -> "Tokenizer":
        """From the contents of a ``vocab.txt``."""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls([ln.rstrip("\r") for ln in lines], **kw)

    @classmethod
    def from_file(cls, path, **kw) -> "Tokenizer":
        with open(path, encoding="utf-8") as f:
            return cls.from_text(f.read(), **kw)

    # ---- the pipeline ------------------------------------------------------------------------
    @staticmethod
    def normalize(text: str) -> str:
        """Steps 1-3: clean, space out CJK ideographs, strip accents, lowercase."""
        out = []
        for ch in text:
            cp = ord(ch)
            if ch in "\t\n\r":
                out.append(" ")
            elif cp == 0 or cp == 0xFFFD or unicodedata.category(ch) in _OTHER:
                continue
            elif ch.isspace():
                out.append(" ")
            elif _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = unicodedata.normalize("NFD", "".join(out))
        return "".join(ch.lower() for ch in text if unicodedata.category(ch) != "Mn")

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        """Step 4: words and single punctuation characters."""
        words = []
        for chunk in text.split():
            start = 0
            for i, ch in enumerate(chunk):
                if _is_punct(ch):
                    if i > start:
                        words.append(chunk[start:i])
                    words.append(ch)
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def wordpiece(self, word: str) -> list[str]:
        """Step 5: the pieces of one word (``["[UNK]"]`` when it cannot be covered)."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if len(word) > MAX_WORD_CHARS:
            pieces = ["[UNK]"]
        else:
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    sub = word[start:end] if start == 0 else "##" + word[start:end]
                    if sub in self.vocab:
                        break
                    end -= 1
                else:  # no prefix of the rest is in the vocabulary: the whole word is unknown
                    pieces = ["[UNK]"]
                    break
                pieces.append(sub)
                start = end
        if len(self._cache) < 50_000:
            self._cache[word] = pieces
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of ``text`` (no special tokens, no truncation)."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer: expected a str, got {type(text).__name__}")
        return [p for w in self.pre_tokenize(self.normalize(text)) for p in self.wordpiece(w)]

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """``[CLS] ids [SEP]`` for one text, at most ``max_length`` ids (default: the tokenizer's)."""
        n = self.max_length if max_length is None else max_length
        if not isinstance(n, int) or n < 2:
            raise ValueError(f"Tokenizer.encode: max_length must be an int >= 2, got {n!r}")
        ids = [self.vocab.get(p, self.unk_id) for p in self.tokenize(text)][: n - 2]
        return [self.cls_id] + ids + [self.sep_id]

    def __call__(self, texts: list[str], max_length: int | None = None) -> dict:
        """``{"input_ids", "attention_mask"}``: lists of rows padded with ``[PAD]`` (mask 0) to
        the longest text of the batch."""
        if isinstance(texts, str):
            raise TypeError("Tokenizer: pass a list of strings (got one str; wrap it in a list)")
        rows = []
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"Tokenizer: text {i} is a {type(t).__name__}, not a str")
            rows.append(self.encode(t, max_length))
        width = max((len(r) for r in rows), default=0)
        return {"input_ids": [r + [self.pad_id] * (width - len(r)) for r in rows],
                "attention_mask": [[1] * len(r) + [0] * (width - len(r)) for r in rows]}
