"""Byte-level BPE (the GPT-2 family) built from a GGUF file's tokenizer metadata.

Text is cut into special tokens and plain runs; plain runs into words by the pre-tokenizer that
``tokenizer.ggml.pre`` names (see ``ember.tokenizers.pretokenize``); each word's UTF-8 bytes
are spelled in the GPT-2 byte alphabet (every byte a printable character: ``" "`` is ``"Ġ"``,
``"\\n"`` is ``"Ċ"``) and merged pairwise, lowest merge rank first (leftmost first among equal
ranks), into vocabulary tokens.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from ..errors import TokenizerError
from . import pretokenize
from .base import (TokenizerBase, StreamDecoder, gguf_id, gguf_vocab, merge_pairs,  # noqa: F401  (StreamDecoder: re-exported)
                   UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)

__all__ = ["BPETokenizer", "StreamDecoder", "bytes_to_unicode",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

_CACHE_MAX = 65536      # words kept in the encode cache (cleared when full)
# tokenizer.ggml.pre names for which llama.cpp adds BOS when the file has no add_bos_token
_ADD_BOS_BY_DEFAULT = frozenset(["llama3", "llama-v3", "llama-bpe", "falcon3", "tekken", "chameleon"])


def bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte alphabet: byte value -> the printable character that spells it.

    Printable Latin-1 bytes spell themselves; the 68 others (controls, space, soft hyphen...)
    take the characters from U+0100 on, in byte order.

    >>> m = bytes_to_unicode()
    >>> m[ord("A")], m[ord(" ")], m[ord("\\n")], len(set(m.values()))
    ('A', 'Ġ', 'Ċ', 256)
    """
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


_B2U = bytes_to_unicode()
_U2B = {u: b for b, u in _B2U.items()}
# a character outside the byte alphabet (one C-level search per token while the vocabulary loads)
_OUTSIDE = re.compile("[^" + "".join(re.escape(u) for u in sorted(_U2B)) + "]")
# latin-1 decoded bytes -> byte alphabet, for str.translate
_SPELL = {b: u for b, u in _B2U.items()}


def _spell(text: str) -> str:
    """``text``'s UTF-8 bytes in the byte alphabet."""
    return text.encode("utf-8").decode("latin-1").translate(_SPELL)


def _unspell(token: str) -> bytes:
    """The bytes a byte-alphabet token stands for (a character outside the alphabet stands for
    its own UTF-8 bytes)."""
    try:
        return bytes([_U2B[c] for c in token])
    except KeyError:
        return b"".join(bytes([_U2B[c]]) if c in _U2B else c.encode("utf-8") for c in token)


class BPETokenizer(TokenizerBase):
    """A byte-level BPE tokenizer (``tokenizer.ggml.model == "gpt2"``), pure Python.

    Build it with :meth:`from_gguf` from a GGUF key/value dict, or directly from a vocabulary and
    merges (a tiny one here):

    >>> tok = BPETokenizer(["<s>", "a", "b", "Ġ", "ab", "Ġab"], ["a b", "Ġ ab"],
    ...                    token_types=[3, 1, 1, 1, 1, 1], pre="gpt2", bos_id=0, add_bos=True)
    >>> tok.encode("ab ab")
    [0, 4, 5]
    >>> tok.encode("<s>ab", add_special=False)
    [0, 4]
    >>> tok.decode([0, 4, 5]), tok.decode([0, 4, 5], skip_special=True)
    ('<s>ab ab', 'ab ab')

    ``encode(text, add_special=True)`` adds BOS only when the file says ``add_bos_token`` (and
    EOS when ``add_eos_token``), like llama.cpp and Hugging Face; special tokens written in the
    text (control and user-defined tokens, e.g. ``<|im_start|>``) are matched whole, longest
    first, unless ``parse_special=False`` (use that for untrusted user text).

    ``stream()`` decodes one id at a time and never returns half a character:

    >>> tok = BPETokenizer(["\\u00e2\\u0124", "\\u00ac", "Ġ!"], [], pre="gpt2")  # "€" = e2 82 ac
    >>> s = tok.stream()
    >>> [s.put(0), s.put(1), s.put(2), s.flush()]
    ['', '€', ' !', '']
    """

    def __init__(self, tokens: Sequence[str], merges: Iterable[str], *,
                 token_types: Sequence[int] | None = None, pre: str | None = "gpt2",
                 bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None,
                 add_bos: bool = False, add_eos: bool = False,
                 chat_template: str | None = None):
        self._init_vocab(tokens, token_types, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, unk_id=unk_id,
                         add_bos=add_bos, add_eos=add_eos, chat_template=chat_template)
        self.pre = pre
        self._chain, self._ignore_merges = pretokenize.lookup(pre)

        # text -> id. Byte-alphabet spelling is the key BPE looks up; a token written with
        # characters outside the alphabet (a user-defined "<think>" is inside; " x" is not) is
        # also reachable by its spelled form, as transformers' GGUF loader does. First id wins.
        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            vocab.setdefault(t, i)
        outside = _OUTSIDE.search
        for i, t in enumerate(self._tokens):
            if self._types[i] in (NORMAL, USER_DEFINED, UNDEFINED) and outside(t):
                vocab.setdefault(_spell(t), i)
        self._vocab = vocab

        # Keyed by the merge's own string "a b" (the metadata's str objects, shared): a pair is
        # looked up as a + " " + b. Symbols never hold a plain space (the byte alphabet spells it
        # "Ġ"), so the key is unambiguous, and ~50,000 merges cost one dict instead of a tuple
        # and two split strings each (~12 MB less for SmolLM2's vocabulary).
        ranks: dict[str, int] = {}
        for r, m in enumerate(merges):
            if m.find(" ", 1) < 0:
                raise TokenizerError(f"BPETokenizer: merge {r} ({m!r}) has no space between its two parts")
            ranks.setdefault(m, r)
        self._ranks = ranks
        self._cache: dict[str, tuple[int, ...]] = {}

    # ---- construction from GGUF metadata ----------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: Mapping[str, object], *, pre: str | None = None) -> "BPETokenizer":
        """Build the tokenizer from a GGUF key/value dict (``ember.load_gguf(path).metadata`` or
        the ``gguf`` package's fields). ``pre`` overrides ``tokenizer.ggml.pre`` (e.g.
        ``pre="default"`` for llama.cpp's fallback when the file names one ember lacks).

        >>> md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        ...       "tokenizer.ggml.tokens": ["<|endoftext|>", "h", "i", "hi"],
        ...       "tokenizer.ggml.merges": ["h i"], "tokenizer.ggml.token_type": [3, 1, 1, 1],
        ...       "tokenizer.ggml.eos_token_id": 0}
        >>> tok = BPETokenizer.from_gguf(md)
        >>> tok.encode("hi<|endoftext|>"), tok.eos_id, tok.vocab_size
        ([3, 0], 0, 4)
        """
        def get(key, default=None):
            return metadata.get("tokenizer.ggml." + key, default)

        tokens, merges = gguf_vocab(metadata, "gpt2", "byte-level BPE", "merges")

        def opt_id(key):
            return gguf_id(metadata, key)

        pre_name = pre if pre is not None else get("pre")
        add_bos = get("add_bos_token")
        if add_bos is None:     # llama.cpp's default where the file does not say
            add_bos = pre_name in _ADD_BOS_BY_DEFAULT and opt_id("bos_token_id") is not None
        return cls(tokens, merges, token_types=get("token_type"), pre=pre_name,
                   bos_id=opt_id("bos_token_id"), eos_id=opt_id("eos_token_id"),
                   pad_id=opt_id("padding_token_id"), unk_id=opt_id("unknown_token_id"),
                   add_bos=bool(add_bos), add_eos=bool(get("add_eos_token", False)),
                   chat_template=metadata.get("tokenizer.chat_template"))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token as the vocabulary spells it (``"Ġthe"``), or None."""
        return self._vocab.get(token)

    # ---- encoding -------------------------------------------------------------------------------
    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        for s, e, special in self._spans(text, parse_special):
            if special is None:
                self._encode_plain(text, s, e, out)
            else:
                out.append(special)

    def _encode_plain(self, text: str, start: int, end: int, out: list[int]) -> None:
        cache = self._cache
        for b, e in pretokenize.split_spans(self._chain, text, start, end):
            word = text[b:e]
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        spelled = _spell(word)
        vocab = self._vocab
        if self._ignore_merges:
            i = vocab.get(spelled)
            if i is not None:
                return (i,)
        if not all(c in vocab for c in spelled):
            spelled_syms = [c for c in spelled if c in vocab]
            syms = self._merge(spelled_syms) if spelled_syms else []
        else:
            syms = self._merge(spelled)
        # A byte the vocabulary lacks (SmolLM2 has no token for 21 of the 256 bytes: six rare
        # controls and bytes that never occur in UTF-8) is dropped before merging, as Hugging
        # Face does (a BPE model without unk_token); llama.cpp drops it too, after merging. The
        # unknown id of such files is often EOS, so it is not a usable stand-in.
        return tuple(i for i in map(vocab.get, syms) if i is not None)

    def _merge(self, word) -> list[str]:
        """BPE merges of one spelled word (str or list of symbols): lowest rank first, leftmost
        first among equals."""
        return merge_pairs(word, self._ranks, " ") if len(word) > 1 else list(word)

    # ---- decoding -------------------------------------------------------------------------------
    def _bytes_of(self, token_id: int) -> bytes:
        """Normal and byte tokens through the byte alphabet; control, user-defined and unknown
        tokens as their own UTF-8 text.

        >>> BPETokenizer(["Ġhi", "<x>"], [], token_types=[1, 3]).token_bytes(0)
        b' hi'
        """
        t = self._tokens[token_id]
        return t.encode("utf-8") if self._types[token_id] in (CONTROL, USER_DEFINED, UNKNOWN) else _unspell(t)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, add_bos={self.add_bos})")

