"""Tokenizers for GGUF language models and their chat templates, in pure Python (they run in
Pyodide as in CPython: the standard library and, for chat templates, jinja2).

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
from .bpe import BPETokenizer, StreamDecoder, bytes_to_unicode
from .chat import apply_chat_template, MAX_RENDER_CHARS, MAX_LOOP_STEPS, RENDER_TIMEOUT_S
from .pretokenize import PRE_TOKENIZERS, pre_tokenize
from ..errors import TokenizerError, ChatTemplateError

__all__ = ["BPETokenizer", "StreamDecoder", "bytes_to_unicode", "apply_chat_template",
           "PRE_TOKENIZERS", "pre_tokenize", "TokenizerError", "ChatTemplateError",
           "MAX_RENDER_CHARS", "MAX_LOOP_STEPS", "RENDER_TIMEOUT_S"]
