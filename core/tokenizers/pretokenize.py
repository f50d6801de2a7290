"""Pre-tokenizers: how byte-level BPE vocabularies cut text into words before merging.

Each GGUF names its pre-tokenizer in ``tokenizer.ggml.pre``. The reference definitions are
regular expressions over Unicode classes (``\\p{L}`` letters, ``\\p{N}`` numbers, ``\\s``
white space), which Python's ``re`` cannot spell. ember maps every character of the text to a
*representative* of its class first (one character for one character, so offsets agree), and
runs ordinary ``re`` patterns over that class string:

=============================  =====================================================
character                      representative
=============================  =====================================================
ASCII letter, digit, space,    itself
tab/LF/VT/FF/CR, punctuation
other letter (Lu Ll Lt Lm Lo)  ``a`` (``ſ`` stays itself: it case-folds to ``s``)
other number (Nd Nl No)        ``²``
other white space (Unicode     U+2000
White_Space property)
other punctuation (P*)         ``¡``
other symbol (S*)              ``©``
anything else (marks, format,  U+0000
controls, unassigned, U+001C..
U+001F)
=============================  =====================================================

A pre-tokenizer is a chain of *isolating splits*: each step finds the matches of its pattern
inside every piece the previous step left, and keeps both the matches and the text between
them as pieces (Hugging Face ``Split(behavior="isolated")``, llama.cpp ``regex_exprs``).

>>> from ember.tokenizers.pretokenize import pre_tokenize
>>> pre_tokenize("smollm", "I'm 42 today!!")
['I', "'m", ' ', '4', '2', ' today', '!!']
>>> pre_tokenize("llama3", "I'M 12345\\n\\n  x")
['I', "'M", ' ', '123', '45', '\\n\\n', ' ', ' x']
"""
from __future__ import annotations

import re
import unicodedata

from ..errors import TokenizerError

__all__ = ["PRE_TOKENIZERS", "pre_tokenize", "split_spans", "class_string"]

# Unicode White_Space (what \s means to Oniguruma, Hugging Face tokenizers' regex engine, and to
# llama.cpp), which differs from str.isspace() on U+001C..U+001F.
_WHITE_SPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F,
     0x3000] + list(range(0x2000, 0x200B)))


class _ClassTable(dict):
    """code point -> representative character, filled on first sight (str.translate table)."""

    def __missing__(self, cp: int) -> str:
        if cp < 0x80:
            rep = "\x00" if 0x1C <= cp <= 0x1F else chr(cp)
        elif cp in _WHITE_SPACE:
            rep = "\u2000"
        elif cp == 0x17F:
            rep = "\u017f"
        else:
            cat = unicodedata.category(chr(cp))
            first = cat[0]
            rep = ("a" if first == "L" else "\u00b2" if first == "N" else "\u00a1" if first == "P"
                   else "\u00a9" if first == "S" else "\x00")
        self[cp] = rep
        return rep


_TABLE = _ClassTable()


def class_string(text: str) -> str:
    """The class string of ``text`` (same length), see the module docstring.

    >>> class_string("Zoë 7½!")
    'Zoa 7²!'
    """
    return text.translate(_TABLE)


# Character classes over the class string.
_L = "A-Za-z\u017f"             # \p{L}
_N = "0-9\u00b2"                # \p{N}
_P = "!-#%-*,-/:;?@\\[-\\]_{}\u00a1"   # \p{P} (ASCII punctuation that is category P*, and its rep)

_CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
# Case-insensitive (?i:...) form; Oniguruma folds U+017F LATIN SMALL LETTER LONG S to "s".
_CONTRACTIONS_I = "'[sS\u017f]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

# GPT-2 (Hugging Face ByteLevel(use_regex=True)); llama.cpp drops the final \s+, which only ever
# matches what an isolating split keeps as a piece anyway.
_GPT2 = rf"{_CONTRACTIONS}| ?[{_L}]+| ?[{_N}]+| ?[^\s{_L}{_N}]+|\s+(?!\S)|\s+"


def _llama3_like(digits: str) -> str:
    return (rf"(?:{_CONTRACTIONS_I})|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{digits}"
            rf"| ?[^\s{_L}{_N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


_LLAMA3 = _llama3_like("{1,3}")
_QWEN2 = _llama3_like("")


def _c(p: str) -> "re.Pattern[str]":
    return re.compile(p)


# name -> (patterns of the chain, ignore_merges). ignore_merges: a word that is itself in the
# vocabulary is one token without running the merges (llama.cpp sets it for llama3 and tekken).
_GPT2_CHAIN = (_c(_GPT2),)
_SMOLLM_CHAIN = (_c(f"[{_N}]"), _c(_GPT2))
_DEFAULT_CHAIN = (_c(rf"[{_P}$+<=>^~|]+"), _c(_GPT2), _c(f"[{_N}]+"), _c("[0-9][0-9][0-9]"))
_LLAMA3_CHAIN = (_c(_LLAMA3),)
_QWEN2_CHAIN = (_c(_QWEN2),)

PRE_TOKENIZERS: dict[str, tuple[tuple["re.Pattern[str]", ...], bool]] = {
    # llama.cpp's fallback for a missing tokenizer.ggml.pre
    "default": (_DEFAULT_CHAIN, False),
    "gpt2": (_GPT2_CHAIN, False), "gpt-2": (_GPT2_CHAIN, False), "phi-2": (_GPT2_CHAIN, False),
    "mpt": (_GPT2_CHAIN, False), "olmo": (_GPT2_CHAIN, False), "jais": (_GPT2_CHAIN, False),
    "roberta-bpe": (_GPT2_CHAIN, False),
    # \p{N} one by one, then GPT-2 (SmolLM's tokenizer.json: Digits(individual) + ByteLevel)
    "smollm": (_SMOLLM_CHAIN, False), "starcoder": (_SMOLLM_CHAIN, False),
    "refact": (_SMOLLM_CHAIN, False), "codeshell": (_SMOLLM_CHAIN, False),
    "exaone": (_SMOLLM_CHAIN, False), "minerva-7b": (_SMOLLM_CHAIN, False),
    "command-r": (_SMOLLM_CHAIN, False),
    "llama3": (_LLAMA3_CHAIN, True), "llama-v3": (_LLAMA3_CHAIN, True),
    "llama-bpe": (_LLAMA3_CHAIN, True), "falcon3": (_LLAMA3_CHAIN, True),
    "dbrx": (_LLAMA3_CHAIN, False), "smaug-bpe": (_LLAMA3_CHAIN, False),
    "qwen2": (_QWEN2_CHAIN, False), "deepseek-r1-qwen": (_QWEN2_CHAIN, False),
    "stablelm2": (_QWEN2_CHAIN, False), "megrez": (_QWEN2_CHAIN, False),
}


def lookup(name: str | None) -> tuple[tuple["re.Pattern[str]", ...], bool]:
    """The chain for ``tokenizer.ggml.pre`` = ``name`` (None: llama.cpp's ``"default"``).

    >>> try:
    ...     lookup("nonesuch")
    ... except TokenizerError as e:
    ...     print(str(e)[:64])
    tokenizer.ggml.pre 'nonesuch' is not a pre-tokenizer ember knows
    """
    if name is None:
        name = "default"
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        raise TokenizerError(
            f"tokenizer.ggml.pre {name!r} is not a pre-tokenizer ember knows "
            f"(known: {', '.join(sorted(PRE_TOKENIZERS))}); pass pre=\"default\" to use "
            "llama.cpp's fallback for unknown names") from None


def split_spans(chain, text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Spans ``(begin, end)`` of the pieces of ``text[start:end]`` after the chain of isolating
    splits (offsets into ``text``)."""
    if end is None:
        end = len(text)
    cls = text[start:end].translate(_TABLE)
    spans = [(0, end - start)]
    for pat in chain:
        out = []
        finditer = pat.finditer
        for b, e in spans:
            pos = b
            for m in finditer(cls, b, e):
                s, t = m.span()
                if s == t:
                    continue
                if s > pos:
                    out.append((pos, s))
                out.append((s, t))
                pos = t
            if pos < e:
                out.append((pos, e))
        spans = out
    if start:
        spans = [(b + start, e + start) for b, e in spans]
    return spans


def pre_tokenize(name: str | None, text: str) -> list[str]:
    """The pieces of ``text`` under pre-tokenizer ``name`` (see ``PRE_TOKENIZERS``)."""
    chain, _ = lookup(name)
    return [text[b:e] for b, e in split_spans(chain, text)]
