"""all-MiniLM-L6-v2 in ember: a BERT encoder + mean pooling + L2 normalisation.

The same code runs in CPython on every ember backend and in the page (Pyodide, WebGPU or the
pure-Python CPU backend). Pure Python, no numpy.

The module tree mirrors HuggingFace's ``BertModel``, so the parameter names are the safetensors
names (``embeddings.word_embeddings.weight``, ``encoder.layer.0.attention.self.query.weight``,
``pooler.dense.weight`` ...) and the file loads with ``strict=True``: the shipped checkpoint
holds the pooler (unused by sentence embeddings, kept so that the names match exactly) and the
``embeddings.position_ids`` buffer.

Embedding = mean of the last hidden states over the real (non-padding) tokens, divided by its
L2 norm: sentence-transformers' Transformer -> Pooling(mean) -> Normalize.

>>> net = MiniLM()          # placeholders (zeros) until load_state_dict / load_model
>>> sd = net.state_dict()
>>> len(sd), sd["encoder.layer.5.intermediate.dense.weight"].shape, sd["embeddings.position_ids"].dtype
(104, (1536, 384), ember.int64)

With the weights (``prepare.py`` writes them) and ``tokenizer.Tokenizer``::

    net = load_model("minilm-l6-v2.f16.safetensors", device="webgpu")
    vectors = embed(net, Tokenizer.from_file("vocab.txt"), ["A cat sits.", "A dog runs."], "webgpu")
    cosine(*vectors)   # ~0.3; the vectors have unit length
"""
from __future__ import annotations

import math

import ember
from ember import nn


class Config:
    """The hyper-parameters of all-MiniLM-L6-v2 (its ``config.json``)."""

    vocab_size = 30522
    hidden = 384
    layers = 6
    heads = 12
    intermediate = 1536
    max_positions = 512
    type_vocab = 2
    eps = 1e-12


def _linear(n_in: int, n_out: int) -> nn.Linear:
    # nn.Linear draws random initial weights; for this model that is ~11 M pure-Python random
    # values (seconds in Pyodide) that load_state_dict replaces at once. Zeros cost nothing.
    lin = nn.Linear(0, 0)
    lin.in_features, lin.out_features = n_in, n_out
    lin.weight = ember.zeros((n_out, n_in))
    lin.bias = ember.zeros((n_out,))
    return lin


def _embedding(n: int, dim: int) -> nn.Embedding:
    return nn.Embedding(n, dim, _weight=ember.zeros((n, dim)))


class Embeddings(nn.Module):
    """word + absolute position + token type embeddings, then LayerNorm."""

    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.word_embeddings = _embedding(c.vocab_size, c.hidden)
        self.position_embeddings = _embedding(c.max_positions, c.hidden)
        self.token_type_embeddings = _embedding(c.type_vocab, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.register_buffer("position_ids", ember.arange(c.max_positions, dtype=ember.int64).reshape(1, -1))

    def forward(self, input_ids, token_type_ids):
        b, n = input_ids.shape
        x = (self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids[:, :n])
             + self.token_type_embeddings(token_type_ids))
        # Tokens as rows from here on: (B*L, hidden). Every Linear is then one plain matmul with
        # B*L rows, instead of B batched matmuls of L rows (several times slower on WebGPU).
        return self.LayerNorm(x.reshape(b * n, -1))


class SelfAttention(nn.Module):
    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.heads, self.head_dim = c.heads, c.hidden // c.heads
        self.query = _linear(c.hidden, c.hidden)
        self.key = _linear(c.hidden, c.hidden)
        self.value = _linear(c.hidden, c.hidden)

    def _split(self, x, b):
        n = x.shape[0] // b                                       # (B*L, H*D) -> (B, H, L, D)
        return x.reshape(b, n, self.heads, self.head_dim).permute_dims((0, 2, 1, 3))

    def forward(self, x, mask):
        """``x``: (B*L, hidden) token rows; ``mask``: (B, 1, 1, L) bool, True for real tokens."""
        b = mask.shape[0]
        ctx = ember.scaled_dot_product_attention(self._split(self.query(x), b), self._split(self.key(x), b),
                                                 self._split(self.value(x), b), attn_mask=mask,
                                                 scale=1.0 / math.sqrt(self.head_dim))
        return ctx.permute_dims((0, 2, 1, 3)).reshape(x.shape)


class DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)`` (BERT's "output" blocks)."""

    def __init__(self, n_in: int, c: type[Config]) -> None:
        super().__init__()
        self.dense = _linear(n_in, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c.hidden, c)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.dense = _linear(c.hidden, c.intermediate)
        self.act = nn.GELU()                                      # exact (erf) GELU, as in BERT

    def forward(self, x):
        return self.act(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c.intermediate, c)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.layer = nn.ModuleList([Layer(c) for _ in range(c.layers)])

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Pooler(nn.Module):
    """``tanh(dense(first token))``: BERT's pooled output (not part of the sentence embedding)."""

    def __init__(self, c: type[Config]) -> None:
        super().__init__()
        self.dense = _linear(c.hidden, c.hidden)
        self.activation = nn.Tanh()

    def forward(self, hidden):
        """``hidden``: (B, L, hidden) -> (B, hidden)."""
        return self.activation(self.dense(hidden[:, 0]))


class MiniLM(nn.Module):
    """The BERT encoder of all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, 22.7 M parameters).

    ``forward(input_ids, attention_mask)`` -> last hidden states ``(B, L, 384)``;
    ``sentence_embedding(...)`` -> ``(B, 384)`` unit vectors.
    """

    def __init__(self, c: type[Config] = Config) -> None:
        super().__init__()
        self.config = c
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c)

    def forward(self, input_ids, attention_mask):
        b, n = input_ids.shape
        keep = attention_mask.astype(ember.bool_).reshape(b, 1, 1, n)   # every query sees the real keys
        x = self.embeddings(input_ids, ember.zeros_like(input_ids))
        return self.encoder(x, keep).reshape(b, n, -1)

    def sentence_embedding(self, input_ids, attention_mask):
        hidden = self.forward(input_ids, attention_mask)
        m = attention_mask.astype(hidden.dtype).reshape(attention_mask.shape[0], -1, 1)
        mean = (hidden * m).sum(axis=1) / ember.clip(m.sum(axis=1), 1e-9, None)
        norm = ember.sqrt((mean * mean).sum(axis=-1, keepdims=True))
        return mean / ember.clip(norm, 1e-12, None)


def load_model(weights, device: str = "python") -> MiniLM:
    """``MiniLM`` with the weights of a safetensors path or bytes (float32 or float16 tensors;
    the model keeps float32) on ``device``, in eval mode."""
    sd = ember.load_safetensors(weights, device=device)
    # assign=True keeps each tensor where it was loaded (no copy of the placeholders onto the
    # device first); float16 tensors are widened there.
    sd = {k: sd[k].astype(ember.float32) if sd.info(k)[0] == "F16" else sd[k] for k in sd}
    net = MiniLM()
    net.load_state_dict(sd, strict=True, assign=True)
    return net.eval()


def batch_tensors(batch: dict, device: str = "python"):
    """(input_ids, attention_mask) int64 tensors from a tokenizer batch."""
    return (ember.tensor(batch["input_ids"], dtype=ember.int64, device=device),
            ember.tensor(batch["attention_mask"], dtype=ember.int64, device=device))


def _embedding_tensor(net: MiniLM, tok, sentences, device, batch_size):
    # Padding costs compute: sort by length so each batch holds texts of similar lengths.
    lengths = [len(tok.encode(s)) for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: lengths[i])
    for k in range(0, len(order), batch_size):
        idx = order[k:k + batch_size]
        batch = tok([sentences[i] for i in idx])
        yield idx, net.sentence_embedding(*batch_tensors(batch, device))


def embed(net: MiniLM, tok, sentences: list[str], device: str = "python", batch_size: int = 16) -> list[list[float]]:
    """Unit-length 384-float embeddings of ``sentences`` (in their order)."""
    out = [None] * len(sentences)
    for idx, e in _embedding_tensor(net, tok, sentences, device, batch_size):
        for i, row in zip(idx, e.tolist()):
            out[i] = row
    return out


async def embed_async(net: MiniLM, tok, sentences: list[str], device: str = "python",
                      batch_size: int = 16) -> list[list[float]]:
    """``embed`` that awaits the GPU readback (for code the browser enters synchronously)."""
    out = [None] * len(sentences)
    for idx, e in _embedding_tensor(net, tok, sentences, device, batch_size):
        for i, row in zip(idx, await e.data_async()):
            out[i] = row
    return out


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors."""
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
