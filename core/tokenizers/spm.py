"""SentencePiece BPE vocabularies (``tokenizer.ggml.model == "llama"``: Llama 2, TinyLlama,
Mistral, Vicuna, OpenLLaMA...) built from a GGUF file's tokenizer metadata, encoded the way
llama.cpp does.

Each plain run of text (between special tokens) gets a leading space when it starts the text or
follows a special token (``add_space_prefix``); every space is written ``"▁"`` (U+2581); the run
is cut into characters, then the adjacent pair whose joined text is the vocabulary token of the
highest score is merged, again and again (leftmost first among equal scores). A character the
vocabulary lacks becomes its UTF-8 bytes as the byte tokens ``<0xXX>``. Decoding turns ``"▁"``
back into spaces, byte tokens into their bytes, and drops the text's leading space.

>>> from ember.tokenizers import SPMTokenizer
>>> tokens = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "h", "i", "▁h", "▁hi"]
>>> tok = SPMTokenizer(tokens, [0.0] * 5 + [-1.0, -2.0, -3.0, -4.0, -5.0],
...                    token_types=[2, 3, 3, 6, 6, 1, 1, 1, 1, 1], bos_id=1, eos_id=2, unk_id=0, add_bos=True)
>>> ids = tok.encode("hi hé</s>")
>>> ids, [tok.id_to_token(i) for i in ids]
([1, 9, 8, 3, 4, 2], ['<s>', '▁hi', '▁h', '<0xC3>', '<0xA9>', '</s>'])
>>> tok.decode(ids), tok.decode(ids, skip_special=True)
('<s> hi hé</s>', 'hi hé')
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from ..errors import TokenizerError
from .base import (TokenizerBase, gguf_id, gguf_vocab, merge_pairs,
                   UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)

__all__ = ["SPMTokenizer"]

SPACE = "\u2581"                          # "▁", how SentencePiece writes a space
_HEX = "0123456789ABCDEF"


class SPMTokenizer(TokenizerBase):
    """A SentencePiece BPE tokenizer (``tokenizer.ggml.model == "llama"``), pure Python, with
    the interface of :class:`ember.tokenizers.BPETokenizer`.

    ``scores``: one float per token; a merge's priority is its result's score. Only normal,
    user-defined and unused tokens are merge results (as SentencePiece; an unused one is cut
    back into the two pieces that made it). ``add_space_prefix``: the leading space of each
    plain run of text, dropped again by :meth:`decode` (and by a stream's first output).
    Special tokens in text: see :class:`ember.tokenizers.base.TokenizerBase` (user-defined
    tokens are matched even with ``parse_special=False``, as llama.cpp does).
    """

    USER_ALWAYS = True

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], *,
                 token_types: Sequence[int] | None = None,
                 bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None,
                 add_bos: bool = False, add_eos: bool = False, add_space_prefix: bool = True,
                 chat_template: str | None = None):
        self._init_vocab(tokens, token_types, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, unk_id=unk_id,
                         add_bos=add_bos, add_eos=add_eos, chat_template=chat_template)
        n = len(self._tokens)
        if scores is None or len(scores) != n:
            raise TokenizerError(f"SPMTokenizer: {None if scores is None else len(scores)} scores for {n} tokens "
                                 "(tokenizer.ggml.scores and tokenizer.ggml.tokens differ)")
        try:
            scores = [float(x) for x in scores]
        except (TypeError, ValueError):
            raise TokenizerError("SPMTokenizer: tokenizer.ggml.scores must be numbers") from None
        bad = next((i for i, x in enumerate(scores) if math.isnan(x)), None)
        if bad is not None:
            raise TokenizerError(f"SPMTokenizer: tokenizer.ggml.scores[{bad}] is NaN")
        self._strip_space = self.add_space_prefix = bool(add_space_prefix)

        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            vocab.setdefault(t, i)
        self._vocab = vocab
        # merge results: text -> -score; those that are not emitted as they are (unused) are
        # cut back along the merge that made them
        merge: dict[str, float] = {}
        emit: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            ty = self._types[i]
            if ty in (NORMAL, USER_DEFINED, UNUSED, UNDEFINED) and t not in merge:
                merge[t] = -scores[i]
                if ty != UNUSED:
                    emit[t] = i
        self._neg_score, self._emit = merge, emit
        byte_ids = []
        for b in range(256):
            i = vocab.get(f"<0x{_HEX[b >> 4]}{_HEX[b & 15]}>")
            byte_ids.append(i if i is not None else unk_id)
        self._byte_ids = byte_ids

    # ---- construction from GGUF metadata ----------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: Mapping[str, object]) -> "SPMTokenizer":
        """Build the tokenizer from a GGUF key/value dict (``ember.load_gguf(path).metadata``).
        Where the file does not say, BOS is added (``add_bos_token``), EOS is not, and runs of
        text get their leading space (``add_space_prefix``), as llama.cpp does for "llama"
        vocabularies.

        >>> md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "▁a"],
        ...       "tokenizer.ggml.scores": [0.0, 0.0, -1.0], "tokenizer.ggml.token_type": [2, 3, 1],
        ...       "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.unknown_token_id": 0}
        >>> SPMTokenizer.from_gguf(md).encode("a")
        [1, 2]
        """
        def get(key, default=None):
            return metadata.get("tokenizer.ggml." + key, default)

        tokens, scores = gguf_vocab(metadata, "llama", "SentencePiece", "scores")
        bos = gguf_id(metadata, "bos_token_id")
        add_bos = get("add_bos_token")
        return cls(tokens, scores, token_types=get("token_type"),
                   bos_id=bos, eos_id=gguf_id(metadata, "eos_token_id"),
                   pad_id=gguf_id(metadata, "padding_token_id"), unk_id=gguf_id(metadata, "unknown_token_id"),
                   add_bos=bos is not None if add_bos is None else bool(add_bos),
                   add_eos=bool(get("add_eos_token", False)),
                   add_space_prefix=bool(get("add_space_prefix", True)),
                   chat_template=metadata.get("tokenizer.chat_template"))

    # ---- encoding -------------------------------------------------------------------------------
    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        after_special = True            # the text's start counts as following a special token
        for s, e, special in self._spans(text, parse_special):
            if special is not None:
                out.append(special)
                after_special = True
                continue
            run = text[s:e]
            if self.add_space_prefix and after_special:
                run = " " + run
            after_special = False
            rev: dict[str, tuple[str, str]] = {}
            # highest score first: the lowest of the negated scores
            for sym in merge_pairs(run.replace(" ", SPACE), self._neg_score, "", rev):
                self._emit_symbol(sym, rev, out)

    def _emit_symbol(self, sym: str, rev: dict, out: list[int]) -> None:
        """A merged symbol's id; one that is no token to emit is cut along the merge that made
        it; a character the vocabulary lacks as its byte tokens (the unknown token for a missing
        byte token; dropped when there is none either)."""
        i = self._emit.get(sym)
        if i is not None:
            out.append(i)
            return
        parts = rev.get(sym)
        if parts is not None:
            self._emit_symbol(parts[0], rev, out)
            self._emit_symbol(parts[1], rev, out)
            return
        byte_ids = self._byte_ids
        out.extend(i for i in map(byte_ids.__getitem__, sym.encode("utf-8", "surrogatepass")) if i is not None)

    # ---- decoding -------------------------------------------------------------------------------
    def _bytes_of(self, token_id: int) -> bytes:
        """Normal tokens with ``"▁"`` as a space; byte tokens as their byte; control,
        user-defined and unknown tokens as their own UTF-8 text; unused tokens as nothing (as
        llama.cpp)."""
        t, ty = self._tokens[token_id], self._types[token_id]
        if ty == BYTE and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            try:
                return bytes([int(t[3:5], 16)])
            except ValueError:
                pass
        if ty == UNUSED:
            return b""
        if ty in (CONTROL, USER_DEFINED, UNKNOWN, BYTE):
            return t.encode("utf-8", "surrogatepass")
        return t.replace(SPACE, " ").encode("utf-8", "surrogatepass")

    def __repr__(self) -> str:
        return (f"SPMTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id}, "
                f"add_bos={self.add_bos}, add_space_prefix={self.add_space_prefix})")
