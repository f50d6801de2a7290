"""Tokenizers for GGUF language models and their chat templates, in pure Python (they run in
Pyodide as in CPython: the standard library and, for chat templates, jinja2).
``from_gguf(metadata)`` builds the one the file's ``tokenizer.ggml.model`` names: byte-level
BPE (``"gpt2"``, :class:`BPETokenizer`) or SentencePiece BPE (``"llama"``, :class:`SPMTokenizer`).

>>> from ember.tokenizers import BPETokenizer
>>> md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
...       "tokenizer.ggml.tokens": ["<|im_end|>", "h", "i", "hi", "Ġ", "Ġhi"],
...       "tokenizer.ggml.merges": ["h i", "Ġ hi"], "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1],
...       "tokenizer.ggml.eos_token_id": 0}
>>> tok = BPETokenizer.from_gguf(md)
>>> ids = tok.encode("hi hi<|im_end|>")
>>> ids, tok.decode(ids)
([3, 5, 0], 'hi hi<|im_end|>')

Chat templates render in jinja2's immutable sandbox, with limits:

>>> from ember.tokenizers import apply_chat_template
>>> apply_chat_template("{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}",
...                     [{"role": "user", "content": "hi"}])
'<user>hi\\n'
"""
from typing import Mapping

from .bpe import BPETokenizer, StreamDecoder, bytes_to_unicode
from .spm import SPMTokenizer
from .chat import apply_chat_template, MAX_RENDER_CHARS, MAX_LOOP_STEPS, RENDER_TIMEOUT_S
from .pretokenize import PRE_TOKENIZERS, pre_tokenize
from ..errors import TokenizerError, ChatTemplateError

__all__ = ["from_gguf", "BPETokenizer", "SPMTokenizer", "StreamDecoder", "bytes_to_unicode", "apply_chat_template",
           "PRE_TOKENIZERS", "pre_tokenize", "TokenizerError", "ChatTemplateError",
           "MAX_RENDER_CHARS", "MAX_LOOP_STEPS", "RENDER_TIMEOUT_S"]


_MODELS = {"gpt2": BPETokenizer, "llama": SPMTokenizer}


def from_gguf(metadata: Mapping[str, object]) -> "BPETokenizer | SPMTokenizer":
    """The tokenizer of a GGUF file's metadata, by ``tokenizer.ggml.model``; TokenizerError
    naming the model for vocabularies ember does not read (``"bert"``, ``"t5"``, ``"rwkv"``...).

    >>> try:
    ...     from_gguf({"tokenizer.ggml.model": "bert"})
    ... except TokenizerError as e:
    ...     print(e)
    tokenizer.ggml.model is 'bert': ember reads 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE) vocabularies
    """
    model = metadata.get("tokenizer.ggml.model")
    cls = _MODELS.get(model) if isinstance(model, str) else None
    if cls is None:
        raise TokenizerError(f"tokenizer.ggml.model is {model!r}: ember reads 'gpt2' (byte-level BPE) "
                             "and 'llama' (SentencePiece BPE) vocabularies")
    return cls.from_gguf(metadata)
