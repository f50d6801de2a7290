"""Byte-level BPE (the GPT-2 family) built from a GGUF file's tokenizer metadata.

Text is cut into special tokens and plain runs; plain runs into words by the pre-tokenizer that
``tokenizer.ggml.pre`` names (see ``ember.tokenizers.pretokenize``); each word's UTF-8 bytes
are spelled in the GPT-2 byte alphabet (every byte a printable character: ``" "`` is ``"Ġ"``,
``"\\n"`` is ``"Ċ"``) and merged pairwise, lowest merge rank first (leftmost first among equal
ranks), into vocabulary tokens.
"""
from __future__ import annotations

import codecs
import heapq
import re
from typing import Iterable, Mapping, Sequence

from ..errors import IndexingError, TokenizerError
from . import pretokenize

__all__ = ["BPETokenizer", "StreamDecoder", "bytes_to_unicode",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

# tokenizer.ggml.token_type values
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6

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


class BPETokenizer:
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
    """

    def __init__(self, tokens: Sequence[str], merges: Iterable[str], *,
                 token_types: Sequence[int] | None = None, pre: str | None = "gpt2",
                 bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None,
                 add_bos: bool = False, add_eos: bool = False,
                 chat_template: str | None = None):
        n = len(tokens)
        if n == 0:
            raise TokenizerError("BPETokenizer: empty vocabulary (tokenizer.ggml.tokens)")
        if token_types is not None and len(token_types) != n:
            raise TokenizerError(f"BPETokenizer: {len(token_types)} token types for {n} tokens "
                                 "(tokenizer.ggml.token_type and tokenizer.ggml.tokens differ)")
        for what, v in (("bos", bos_id), ("eos", eos_id), ("padding", pad_id), ("unknown", unk_id)):
            if v is not None and not 0 <= v < n:
                raise TokenizerError(f"BPETokenizer: {what} token id {v} outside the vocabulary "
                                     f"of {n} tokens")
        self._tokens = list(tokens)
        self._types = list(token_types) if token_types is not None else [NORMAL] * n
        self.pre = pre
        self._chain, self._ignore_merges = pretokenize.lookup(pre)
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.add_bos, self.add_eos = bool(add_bos), bool(add_eos)
        if self.add_bos and bos_id is None:
            raise TokenizerError("BPETokenizer: add_bos_token is set but there is no bos_token_id")
        if self.add_eos and eos_id is None:
            raise TokenizerError("BPETokenizer: add_eos_token is set but there is no eos_token_id")
        self.chat_template = chat_template

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
        self._bytes: list[bytes | None] = [None] * n

        # Special tokens matched whole in text: control, user-defined and unknown (llama.cpp's
        # set), longest first.
        self._special_ids = frozenset(i for i, ty in enumerate(self._types) if ty in (CONTROL, UNKNOWN))
        matched = sorted({t for i, t in enumerate(self._tokens)
                          if self._types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and t},
                         key=lambda s: (-len(s), s))
        self._special_re = re.compile("|".join(map(re.escape, matched))) if matched else None

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

        model = get("model")
        if model != "gpt2":
            raise TokenizerError(
                f"tokenizer.ggml.model is {model!r}: BPETokenizer reads byte-level BPE ('gpt2') "
                "vocabularies only")
        tokens = get("tokens")
        if tokens is None:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
        merges = get("merges")
        if merges is None:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.merges (needed by a 'gpt2' vocabulary)")

        def opt_id(key):
            v = get(key)
            return None if v is None or int(v) < 0 else int(v)

        pre_name = pre if pre is not None else get("pre")
        add_bos = get("add_bos_token")
        if add_bos is None:     # llama.cpp's default where the file does not say
            add_bos = pre_name in _ADD_BOS_BY_DEFAULT and opt_id("bos_token_id") is not None
        return cls(list(tokens), list(merges), token_types=get("token_type"), pre=pre_name,
                   bos_id=opt_id("bos_token_id"), eos_id=opt_id("eos_token_id"),
                   pad_id=opt_id("padding_token_id"), unk_id=opt_id("unknown_token_id"),
                   add_bos=bool(add_bos), add_eos=bool(get("add_eos_token", False)),
                   chat_template=metadata.get("tokenizer.chat_template"))

    # ---- vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids are ``0 .. vocab_size - 1``)."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token as the vocabulary spells it (``"Ġthe"``), or None."""
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary's spelling of ``token_id`` (byte alphabet for normal tokens)."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def token_type(self, token_id: int) -> int:
        """``tokenizer.ggml.token_type`` of the id (1 normal, 2 unknown, 3 control, 4 user-defined,
        5 unused, 6 byte)."""
        self._check_id(token_id)
        return self._types[token_id]

    def is_special(self, token_id: int) -> bool:
        """True for control and unknown tokens and for the BOS/EOS/padding/unknown ids: what
        ``decode(..., skip_special=True)`` leaves out."""
        self._check_id(token_id)
        return token_id in self._special_ids or token_id in (self.bos_id, self.eos_id, self.pad_id, self.unk_id)

    def _check_id(self, token_id: int) -> None:
        if not isinstance(token_id, int) or not 0 <= token_id < len(self._tokens):
            raise IndexingError(f"tokenizer: token id {token_id!r} outside the vocabulary "
                                f"[0, {len(self._tokens)})")

    # ---- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, *, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``add_special``: add BOS/EOS where the file's ``add_bos_token``/``add_eos_token`` say so.
        ``parse_special``: match special tokens written in the text; False encodes them as plain
        text (for untrusted input that must not inject ``<|im_start|>``).
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode: text must be str, got {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        sre = self._special_re if parse_special else None
        if sre is None:
            self._encode_plain(text, 0, len(text), ids)
        else:
            pos = 0
            for m in sre.finditer(text):
                s, e = m.span()
                if s > pos:
                    self._encode_plain(text, pos, s, ids)
                ids.append(self._vocab[m.group()])
                pos = e
            if pos < len(text):
                self._encode_plain(text, pos, len(text), ids)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

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
        n = len(word)
        if n <= 1:
            return list(word)
        ranks = self._ranks
        sym: list[str | None] = list(word)
        heap = []
        for i in range(n - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None:
                heap.append((r, i))
        if not heap:
            return sym
        heapq.heapify(heap)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            r, i = pop(heap)
            a = sym[i]
            if a is None:
                continue
            j = nxt[i]
            if j >= n or ranks.get(a + " " + sym[j]) != r:
                continue            # stale: one side was merged since this pair was queued
            a = a + sym[j]
            sym[i] = a
            sym[j] = None
            k = nxt[j]
            nxt[i] = k
            if k < n:
                prv[k] = i
                r2 = ranks.get(a + " " + sym[k])
                if r2 is not None:
                    push(heap, (r2, i))
            p = prv[i]
            if p >= 0:
                r2 = ranks.get(sym[p] + " " + a)
                if r2 is not None:
                    push(heap, (r2, p))
        return [s for s in sym if s is not None]

    # ---- decoding -------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for: normal/byte tokens through the byte alphabet; control,
        user-defined and unknown tokens as their own UTF-8 text.

        >>> BPETokenizer(["Ġhi", "<x>"], [], token_types=[1, 3]).token_bytes(0)
        b' hi'
        """
        b = self._bytes[token_id] if 0 <= token_id < len(self._tokens) else None
        if b is None:
            self._check_id(token_id)
            t = self._tokens[token_id]
            b = t.encode("utf-8") if self._types[token_id] in (CONTROL, USER_DEFINED, UNKNOWN) else _unspell(t)
            self._bytes[token_id] = b
        return b

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD, as Hugging Face does).
        ``skip_special`` leaves out the ids that :meth:`is_special` names."""
        tb = self.token_bytes
        if skip_special:
            parts = [tb(i) for i in ids if not self.is_special(i)]
        else:
            parts = [tb(i) for i in ids]
        return b"".join(parts).decode("utf-8", "replace")

    def stream(self, skip_special: bool = False) -> "StreamDecoder":
        """A decoder for one id at a time that never returns half a character:

        >>> tok = BPETokenizer(["\\u00e2\\u0124", "\\u00ac", "Ġ!"], [], pre="gpt2")  # "€" = e2 82 ac
        >>> s = tok.stream()
        >>> [s.put(0), s.put(1), s.put(2), s.flush()]
        ['', '€', ' !', '']
        """
        return StreamDecoder(self, skip_special)

    # ---- chat -----------------------------------------------------------------------------------
    def chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The file's ``tokenizer.chat_template`` rendered for ``messages`` (see
        :func:`ember.tokenizers.apply_chat_template`; ``bos_token``/``eos_token`` are this
        vocabulary's). Encode the result with ``encode(text, add_special=False)``, as
        transformers' ``apply_chat_template(tokenize=True)`` does.
        """
        from .chat import apply_chat_template
        from ..errors import ChatTemplateError
        if not self.chat_template:
            raise ChatTemplateError("chat: this tokenizer's GGUF has no tokenizer.chat_template; "
                                    "call ember.tokenizers.apply_chat_template with a template")
        tokens = {}
        for name, i in (("bos_token", self.bos_id), ("eos_token", self.eos_id),
                        ("pad_token", self.pad_id), ("unk_token", self.unk_id)):
            if i is not None:
                tokens[name] = self._tokens[i]
        tokens.update(extra)
        return apply_chat_template(self.chat_template, messages,
                                   add_generation_prompt=add_generation_prompt, **tokens)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, add_bos={self.add_bos})")


class StreamDecoder:
    """Incremental detokenizer: :meth:`put` returns the text completed by one more id (a
    character whose bytes are split over several tokens comes out once all of them arrived;
    bytes that can never form a character come out as U+FFFD); :meth:`flush` returns what is
    left (U+FFFD for an unfinished character) and starts over. The concatenation of all outputs
    equals ``tokenizer.decode(ids)``."""

    def __init__(self, tokenizer: BPETokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def put(self, token_id: int) -> str:
        """Text completed by ``token_id`` ('' while a character is still incomplete)."""
        if self._skip and self._tok.is_special(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """The rest (U+FFFD if the ids ended inside a character); the decoder is then empty."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
