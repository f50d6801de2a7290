"""What the GGUF tokenizers share (``BPETokenizer``, ``SPMTokenizer``): the vocabulary and its
token types, the special tokens matched whole in text, id checks, decoding through each token's
bytes, the streaming decoder and the chat template."""
from __future__ import annotations

import codecs
import heapq
import operator
import re
from typing import Iterable, Iterator, Mapping, Sequence

from ..errors import IndexingError, TokenizerError

__all__ = ["TokenizerBase", "StreamDecoder", "gguf_id", "gguf_vocab", "merge_pairs",
           "UNDEFINED", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

# tokenizer.ggml.token_type values
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6


def gguf_id(metadata: Mapping[str, object], key: str) -> int | None:
    """``tokenizer.ggml.<key>`` as a token id (None when absent or negative); TokenizerError
    naming the key when it is not an integer."""
    v = metadata.get("tokenizer.ggml." + key)
    if v is None:
        return None
    try:
        v = operator.index(v)
    except TypeError:
        raise TokenizerError(f"tokenizer.ggml.{key} must be an integer token id, got {v!r}") from None
    return v if v >= 0 else None


def gguf_vocab(metadata: Mapping[str, object], model: str, kind: str, extra: str) -> tuple[list, list]:
    """``(tokens, tokenizer.ggml.<extra>)`` of a GGUF vocabulary whose ``tokenizer.ggml.model``
    must be ``model`` (``kind`` names it in the error); TokenizerError naming what is missing."""
    found = metadata.get("tokenizer.ggml.model")
    if found != model:
        raise TokenizerError(f"tokenizer.ggml.model is {found!r}: this tokenizer reads {kind} "
                             f"({model!r}) vocabularies only")
    got = []
    for key in ("tokens", extra):
        v = metadata.get("tokenizer.ggml." + key)
        if v is None:
            raise TokenizerError(f"GGUF metadata has no tokenizer.ggml.{key}"
                                 + (f" (needed by a {model!r} vocabulary)" if key == extra else ""))
        got.append(list(v))
    return got[0], got[1]


def merge_pairs(word, priority: Mapping[str, object], sep: str = "", rev: dict | None = None) -> list:
    """The symbols of ``word`` (a str or a list of symbols) after pairwise merges: again and
    again the adjacent pair ``a, b`` of the lowest ``priority[a + sep + b]`` (absent: never
    merged) is replaced by ``a + b``, the leftmost first among equal priorities. A priority
    queue over a linked list of symbols; a queued pair whose sides changed since (its priority
    is no longer the queued one) is skipped. ``rev`` gets ``a + b -> (a, b)`` for each merge.

    >>> merge_pairs("aaab", {"a a": 1, "a b": 2}, " ")
    ['aa', 'ab']
    """
    sym = list(word)
    n = len(sym)
    get = priority.get
    heap = []
    for i in range(n - 1):
        p = get(sym[i] + sep + sym[i + 1])
        if p is not None:
            heap.append((p, i))
    if not heap:
        return sym
    heapq.heapify(heap)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        p, i = pop(heap)
        a = sym[i]
        if a is None:
            continue
        j = nxt[i]
        if j >= n or get(a + sep + sym[j]) != p:
            continue                    # stale: a side was merged since this pair was queued
        b = sym[j]
        m = sym[i] = a + b
        if rev is not None:
            rev[m] = (a, b)
        sym[j] = None
        k = nxt[i] = nxt[j]
        if k < n:
            prv[k] = i
            p = get(m + sep + sym[k])
            if p is not None:
                push(heap, (p, i))
        h = prv[i]
        if h >= 0:
            p = get(sym[h] + sep + m)
            if p is not None:
                push(heap, (p, h))
    return [x for x in sym if x is not None]


def _regex(texts) -> re.Pattern | None:
    texts = sorted(set(texts), key=lambda s: (-len(s), s))
    return re.compile("|".join(map(re.escape, texts))) if texts else None


class TokenizerBase:
    """The vocabulary part of a tokenizer; subclasses encode (``_encode_into``) and give each
    token's bytes (``_bytes_of``).

    Special tokens written in text (control, user-defined and unknown tokens: llama.cpp's set)
    are matched whole, longest first, when ``encode(..., parse_special=True)``; with
    ``parse_special=False`` only user-defined ones, where the subclass sets ``USER_ALWAYS``
    (llama.cpp's rule; the BPE tokenizer matches none, as Hugging Face does).
    """

    USER_ALWAYS = False         # user-defined tokens matched even with parse_special=False
    _strip_space = False        # decode drops one leading space (SentencePiece: add_space_prefix)

    def _init_vocab(self, tokens: Sequence[str], token_types: Sequence[int] | None, *,
                    bos_id, eos_id, pad_id, unk_id, add_bos, add_eos, chat_template) -> None:
        name = type(self).__name__
        n = len(tokens)
        if n == 0:
            raise TokenizerError(f"{name}: empty vocabulary (tokenizer.ggml.tokens)")
        bad = next((i for i, t in enumerate(tokens) if not isinstance(t, str)), None)
        if bad is not None:
            raise TokenizerError(f"{name}: tokenizer.ggml.tokens[{bad}] is {type(tokens[bad]).__name__}, not str")
        if token_types is not None and len(token_types) != n:
            raise TokenizerError(f"{name}: {len(token_types)} token types for {n} tokens "
                                 "(tokenizer.ggml.token_type and tokenizer.ggml.tokens differ)")
        for what, v in (("bos", bos_id), ("eos", eos_id), ("padding", pad_id), ("unknown", unk_id)):
            if v is not None and not 0 <= v < n:
                raise TokenizerError(f"{name}: {what} token id {v} outside the vocabulary "
                                     f"of {n} tokens (tokenizer.ggml.{what}_token_id)")
        self._tokens = list(tokens)
        self._types = list(token_types) if token_types is not None else [NORMAL] * n
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.add_bos, self.add_eos = bool(add_bos), bool(add_eos)
        if self.add_bos and bos_id is None:
            raise TokenizerError(f"{name}: add_bos_token is set but there is no bos_token_id")
        if self.add_eos and eos_id is None:
            raise TokenizerError(f"{name}: add_eos_token is set but there is no eos_token_id")
        self.chat_template = chat_template
        self._bytes: list[bytes | None] = [None] * n

        self._special_ids = frozenset(i for i, ty in enumerate(self._types) if ty in (CONTROL, UNKNOWN))
        special: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            if self._types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and t:
                special.setdefault(t, i)
        self._special = special
        self._special_re = _regex(special)
        self._user_re = _regex(t for t, i in special.items() if self._types[i] == USER_DEFINED) \
            if self.USER_ALWAYS else None

    # ---- vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids are ``0 .. vocab_size - 1``)."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token as the vocabulary spells it, or None."""
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary's spelling of ``token_id``."""
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
        self._encode_into(text, parse_special, ids)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _spans(self, text: str, parse_special: bool) -> Iterator[tuple[int, int, int | None]]:
        """``text`` cut at the special tokens written in it: ``(start, end, None)`` for each
        non-empty plain run, ``(start, end, id)`` for each special token."""
        sre = self._special_re if parse_special else self._user_re
        pos = 0
        if sre is not None:
            special = self._special
            for m in sre.finditer(text):
                s, e = m.span()
                if s > pos:
                    yield pos, s, None
                yield s, e, special[m.group()]
                pos = e
        if pos < len(text):
            yield pos, len(text), None

    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        raise NotImplementedError

    # ---- decoding -------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for in decoded text (see the subclass)."""
        b = self._bytes[token_id] if isinstance(token_id, int) and 0 <= token_id < len(self._tokens) else None
        if b is None:
            self._check_id(token_id)
            b = self._bytes[token_id] = self._bytes_of(token_id)
        return b

    def _bytes_of(self, token_id: int) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD, as Hugging Face does).
        ``skip_special`` leaves out the ids that :meth:`is_special` names."""
        tb = self.token_bytes
        if skip_special:
            parts = [tb(i) for i in ids if not self.is_special(i)]
        else:
            parts = [tb(i) for i in ids]
        text = b"".join(parts).decode("utf-8", "replace")
        return text[1:] if self._strip_space and text[:1] == " " else text

    def stream(self, skip_special: bool = False, *, lstrip: bool | None = None) -> "StreamDecoder":
        """A decoder for one id at a time that never returns half a character (the outputs
        joined are :meth:`decode` of the ids). ``lstrip=False`` keeps the stream's first space
        where decode would drop it (ids that continue a text rather than start one)."""
        return StreamDecoder(self, skip_special, lstrip=lstrip)

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


class StreamDecoder:
    """Incremental detokenizer: :meth:`put` returns the text completed by one more id (a
    character whose bytes are split over several tokens comes out once all of them arrived;
    bytes that can never form a character come out as U+FFFD); :meth:`flush` returns what is
    left (U+FFFD for an unfinished character) and starts over. The concatenation of all outputs
    equals ``tokenizer.decode(ids)`` (for a SentencePiece vocabulary: the first space of the
    stream is dropped, as decode drops the text's leading space)."""

    def __init__(self, tokenizer: TokenizerBase, skip_special: bool = False, *, lstrip: bool | None = None):
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._strip = tokenizer._strip_space if lstrip is None else bool(lstrip)
        self._lead = self._strip        # the stream's first character is still to come

    def put(self, token_id: int) -> str:
        """Text completed by ``token_id`` ('' while a character is still incomplete)."""
        if self._skip and self._tok.is_special(token_id):
            return ""
        out = self._dec.decode(self._tok.token_bytes(token_id))
        if self._lead and out:
            self._lead = False
            if out[0] == " ":
                out = out[1:]
        return out

    def flush(self) -> str:
        """The rest (U+FFFD if the ids ended inside a character); the decoder is then empty."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        if self._lead and out:
            out = out[1:] if out[0] == " " else out
        self._lead = self._strip
        return out
