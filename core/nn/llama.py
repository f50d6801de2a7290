"""A llama-architecture decoder (llama, SmolLM, Mistral-style, Qwen2, Qwen3, Gemma, Gemma 2,
Gemma 3) in one readable file.

Weights come from a GGUF file (``ember.load_gguf``) and stay in the file's block format:
each matrix is an ``ember.quant.QTensor`` (Q4_1, Q8_0, Q4_K... blocks) multiplied by the
``qlinear`` op without being expanded, or a plain float tensor for float files. The key/value
cache is preallocated (``context`` positions per layer) and written in place by
``attention_cached`` at the position given as a tensor, so one captured plan of the one-token
step (``ember.compile``) serves every position of a generation.

**Memory** (issue 18: a loaded model holds <= 1.3x its file). The cache holds ``capacity`` rows,
not ``context``: ``reserve(n)`` (``ember.llm`` calls it with the prompt + the new tokens a reply
may make) allocates or grows it in chunks (``KV_CHUNK`` rows, at least doubling, never past
``context``); a forward without a reservation allocates the whole context as before. SmolLM2
at the chat page's 2048 positions: 94 MB of float32 rows at full size, 2.9 MB for the first 64.
On device "wasm" with the thread team running (``ember.wasm.team``), the quantized weights are
read from the file straight into the team's shared memory and the cache made there
(``Team.moved``): Python holds ``Moved`` arrays without elements, so the weights exist once
(they used to be in Pyodide's heap and again in the shared memory).

**Gemma** files differ from llama in a few switches of ``LlamaConfig`` (llama.cpp's
``build_gemma*``): embeddings times ``sqrt(dim)``, a GELU (tanh) gate, the rotation over halves,
``head_dim`` from the file (``attention.key_length``), a tied head; Gemma 2 and 3 add an RMSNorm
on each block's output before its residual add (``post_attention_norm``, ``post_ffw_norm``) and
a sliding window on their local layers (every other layer for Gemma 2, five of six for Gemma 3,
whose local layers turn with RoPE base 10000 unscaled); Gemma 2 soft-caps attention scores and
the final logits (``c * tanh(s / c)``); Gemma 3 RMS-normalises each head of q and k (as Qwen3).
The converter stored Gemma's RMSNorm weights with the +1 already added, so they are used as is.
On webgpu a Gemma layer keeps the stacked Q/K/V and gate/up products with the norm folded in
(``qlinear_rms``), but not the folded residual adds (a post-norm sits between product and add)
nor the folded SiLU gate (GELU here) nor the folded rotation (halves): those run as plain ops.

Shapes: T tokens in, D = ``dim``, Hq/Hkv query/key-value heads of ``head_dim`` features.

>>> import ember
>>> from ember.nn.llama import Llama, LlamaConfig
>>> cfg = LlamaConfig(n_layers=1, dim=8, n_heads=2, n_kv_heads=1, ffn_dim=16, vocab_size=11)
>>> m = Llama.random(cfg, seed=0, context=16)
>>> m.forward(ember.tensor([1, 2, 3], dtype="int32"), ember.tensor([0], dtype="int32")).shape
(1, 11)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from .. import ops as F
from ..errors import UnsupportedOp, WeightsError
from ..tensor import Tensor, tensor

# GGUF architectures this file runs, and the RoPE layout their converters leave in the file:
# llama.cpp's convert script permutes llama's Q/K rows so that rotated pairs are adjacent
# ("pairs"); Qwen2 files keep the Hugging Face layout ("halves") and add Q/K/V biases.
# key/value rows a reservation allocates at least (and grows by, at least doubling)
# (64 SmolLM2 rows, 2.9 MB, fit the heap a load leaves; 256 made Pyodide's heap grow by a step
# of 28 MB on one thread)
KV_CHUNK = 64

# Qwen3 adds an RMSNorm over each head of q and k before the rotation (attn_q_norm, attn_k_norm).
# (not "granite": its files scale embeddings, residuals, attention and logits by factors of their
# own, which this forward does not apply; it is refused rather than run wrong)
# Gemma, Gemma 2, Gemma 3: see the module docstring (the switches are set in LlamaConfig.from_gguf).
ARCHS = {"llama": "pairs", "mistral": "pairs", "smollm": "pairs", "qwen2": "halves", "qwen3": "halves",
         "gemma": "halves", "gemma2": "halves", "gemma3": "halves"}
# the sliding-window layer pattern of each architecture with one (llama.cpp's swa pattern n:
# layer i is local when i % n < n - 1)
SWA_PATTERN = {"gemma2": 2, "gemma3": 6}


@dataclass
class LlamaConfig:
    """Hyper-parameters (GGUF's ``{arch}.*`` metadata keys)."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    head_dim: int = 0                 # 0: dim // n_heads
    rope_base: float = 10000.0
    rope_mode: str = "pairs"
    rope_dim: int = 0                 # 0: head_dim (features rotated per head)
    rope_scale: float = 1.0           # linear RoPE scaling: positions divided by this factor
    rms_eps: float = 1e-5
    context_length: int = 2048        # what the model was trained for
    arch: str = "llama"
    # Gemma's switches (defaults: llama's behaviour)
    act: str = "silu"                 # the MLP gate: "silu" or "gelu_tanh"
    embed_scale: float = 1.0          # embeddings multiplied by this (Gemma: sqrt(dim))
    post_norms: bool = False          # RMSNorm of each block's output before its residual add
    query_scale: float = 0.0          # attention scores' scale (0: 1 / sqrt(head_dim))
    attn_softcap: float = 0.0         # scores c * tanh(s / c) before the softmax (0: none)
    final_softcap: float = 0.0        # logits c * tanh(l / c) (0: none)
    sliding_window: int = 0           # local layers attend to the last this many positions (0: none)
    swa_pattern: int = 0              # layer i is local when i % swa_pattern < swa_pattern - 1
    rope_base_local: float = 0.0      # local layers' RoPE base, unscaled (0: as the global layers)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.head_dim:
            self.head_dim = self.dim // self.n_heads
        if not self.rope_dim:
            self.rope_dim = self.head_dim
        if self.n_heads % self.n_kv_heads:
            raise WeightsError(f"llama: {self.n_heads} query heads are not a multiple of "
                               f"{self.n_kv_heads} key/value heads")
        if self.act not in ("silu", "gelu_tanh"):
            raise UnsupportedOp(f"llama: MLP activation {self.act!r} is not supported (silu, gelu_tanh)")
        if self.sliding_window < 0 or self.swa_pattern < 0:
            raise WeightsError(f"llama: sliding window {self.sliding_window} and its layer pattern "
                               f"{self.swa_pattern} must be >= 0")

    def local(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window (Gemma 2/3's local layers)."""
        n = self.swa_pattern
        return self.sliding_window > 0 and n > 0 and i % n < n - 1

    @classmethod
    def from_gguf(cls, md: dict) -> "LlamaConfig":
        """From GGUF metadata; WeightsError names a missing key, UnsupportedOp an architecture."""
        arch = md.get("general.architecture")
        if arch not in ARCHS:
            raise UnsupportedOp(f"llama: GGUF architecture {arch!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHS))})")

        def get(key, default=None):
            v = md.get(f"{arch}.{key}", default)
            if v is None:
                raise WeightsError(f"llama: GGUF metadata key '{arch}.{key}' is missing")
            return v

        if int(md.get(f"{arch}.expert_count", 0) or 0) > 0:       # (Mixtral files are arch "llama")
            raise UnsupportedOp(f"llama: a mixture of experts ('{arch}.expert_count' = "
                                f"{md.get(f'{arch}.expert_count')}) is not supported")
        n_heads = int(get("attention.head_count"))
        dim = int(get("embedding_length"))
        head_dim = int(md.get(f"{arch}.attention.key_length", dim // n_heads))
        # RoPE scaling: "linear" divides positions by the factor (also the older key
        # rope.scale_linear); Llama 3.1+'s per-frequency factors come as the tensor
        # rope_freqs.weight (read by Llama); YaRN and LongRoPE change more than the angles
        kind = str(md.get(f"{arch}.rope.scaling.type", "none")).lower()
        factor = md.get(f"{arch}.rope.scaling.factor", md.get(f"{arch}.rope.scale_linear", 1.0))
        if kind not in ("none", "linear"):
            raise UnsupportedOp(f"llama: RoPE scaling {kind!r} ('{arch}.rope.scaling.type') is not supported "
                                f"(supported: none, linear, and Llama 3's rope_freqs.weight)")
        if kind == "none" and f"{arch}.rope.scale_linear" not in md:
            factor = 1.0
        try:
            factor = float(factor)
        except (TypeError, ValueError):
            factor = math.nan
        if not 0.0 < factor < math.inf:
            raise WeightsError(f"llama: RoPE scaling factor {md.get(f'{arch}.rope.scaling.factor')!r} "
                               f"('{arch}.rope.scaling.factor') must be a positive number")
        gemma = {}
        if arch.startswith("gemma"):        # (the facts: the module docstring)
            n_layers = int(get("block_count"))
            gemma = dict(act="gelu_tanh", embed_scale=math.sqrt(dim), post_norms=arch != "gemma")
            # query scale 1/sqrt(head_dim), but 1/sqrt(dim / heads) for the 27B models (llama.cpp
            # tells them by their layer count)
            if (arch, n_layers) in (("gemma2", 46), ("gemma3", 62)):
                gemma["query_scale"] = 1.0 / math.sqrt(dim // n_heads)
            if arch == "gemma2":
                gemma.update(attn_softcap=float(md.get(f"{arch}.attn_logit_softcapping", 50.0) or 0.0),
                             final_softcap=float(md.get(f"{arch}.final_logit_softcapping", 30.0) or 0.0))
            if arch == "gemma3":
                gemma.update(final_softcap=float(md.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
                             rope_base_local=10000.0)
            if arch in SWA_PATTERN:
                # (gemma2: 4096 where the file has no key, as llama.cpp; gemma3 without one: no window)
                window = int(md.get(f"{arch}.attention.sliding_window", 4096 if arch == "gemma2" else 0) or 0)
                gemma.update(sliding_window=window, swa_pattern=SWA_PATTERN[arch])
        vocab = md.get(f"{arch}.vocab_size")
        if vocab is None:
            tokens = md.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else 0
        return cls(n_layers=int(get("block_count")), dim=dim, n_heads=n_heads,
                   n_kv_heads=int(get("attention.head_count_kv", n_heads)),
                   ffn_dim=int(get("feed_forward_length")), vocab_size=int(vocab), head_dim=head_dim,
                   rope_base=float(get("rope.freq_base", 10000.0)), rope_mode=ARCHS[arch],
                   rope_dim=int(md.get(f"{arch}.rope.dimension_count", head_dim)),
                   rope_scale=factor,
                   rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
                   context_length=int(get("context_length", 2048)), arch=arch, **gemma)


def _linear(x: Tensor, w, b=None) -> Tensor:
    """``x @ w.T (+ b)`` for a float weight or a quantized one (never expanded)."""
    if isinstance(w, Tensor):
        y = F.linear(x, w)
    else:
        from ..quant import linear as qlinear
        y = qlinear(x, w)
    return y if b is None else y + b


def _quantized(w) -> bool:
    return not isinstance(w, Tensor)


def _team(device):
    """The wasm thread team when ``device`` is "wasm" and the team runs (else None)."""
    if device != "wasm":
        return None
    from ..wasm.team import team

    return team()


def _shared_tensor(gguf, name: str, team, device: str):
    """GGUF tensor ``name`` with its quantized blocks read from the file straight into the
    team's shared memory (``Team.moved``: 1 MB at a time through one buffer of Pyodide's heap);
    float tensors (norms: small) stay in Python."""
    from .. import dtypes
    from ..quant import QTensor

    info = gguf.tensors.get(name)
    if (info is None or not info.supported or info.nbytes is None or info.qtype == "f32"
            or (info.qtype in ("f16", "bf16") and len(info.shape) <= 1)):
        return gguf.tensor(name, device=device)     # (its errors, its float tensors)
    n, src = info.nbytes, gguf._src

    def fill(at, view):
        k = max(0, min(view.nbytes, n - at))
        if k:
            src.read_into(info.offset + at, view[:k])
        if k < view.nbytes:
            view[k:] = bytes(view.nbytes - k)       # the last word's padding

    nw = -(-n // 4)
    words = team.moved("i", nw, fill)
    return QTensor(Tensor._wrap(words, (nw,), dtypes.int32, device), info.qtype, info.shape or (1,))


def _check_norms(weights: dict, n_layers: int, parts, size: int, what: str) -> None:
    """WeightsError unless every layer has each ``blk.N.<part>.weight`` as a float (size,) weight."""
    for i in range(n_layers):
        for part in parts:
            t = weights.get(f"blk.{i}.{part}.weight")
            if t is None or _quantized(t) or tuple(t.shape) != (size,):
                raise WeightsError(f"llama: 'blk.{i}.{part}.weight' must be a float ({size},) weight{what}, "
                                   f"got {None if t is None else tuple(t.shape)}")


def _embedding(ids: Tensor, w) -> Tensor:
    if isinstance(w, Tensor):
        return F.take(w, ids, axis=0)
    from ..quant import embedding as qembedding
    return qembedding(ids, w)


class Llama:
    """The decoder. ``weights`` maps GGUF tensor names (``token_embd.weight``,
    ``blk.N.attn_q.weight``...) to Tensors / QTensors on one device."""

    def __init__(self, cfg: LlamaConfig, weights: dict, *, context: int | None = None, device: str | None = None):
        self.cfg = cfg
        self.w = weights
        self.device = device or next(iter(weights.values())).device
        self.context = int(context or cfg.context_length)
        if "token_embd.weight" not in weights:
            raise WeightsError("llama: the weights have no 'token_embd.weight'")
        for i in range(cfg.n_layers):
            for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                         "ffn_gate", "ffn_up", "ffn_down"):
                if f"blk.{i}.{part}.weight" not in weights:
                    raise WeightsError(f"llama: the weights have no 'blk.{i}.{part}.weight'")
        # Qwen3: every layer's q and k heads RMS-normalised (a (head_dim,) weight each) before RoPE
        self._qk_norm = "blk.0.attn_q_norm.weight" in weights
        if self._qk_norm:
            _check_norms(weights, cfg.n_layers, ("attn_q_norm", "attn_k_norm"), cfg.head_dim, " (q/k normalised per head)")
        if cfg.arch == "gemma3" and not self._qk_norm:
            raise WeightsError("llama: a gemma3 file needs 'blk.N.attn_q_norm.weight' / 'attn_k_norm.weight'")
        # Gemma 2/3: each block's attention and MLP output RMS-normalised before the residual add
        if cfg.post_norms:
            _check_norms(weights, cfg.n_layers, ("post_attention_norm", "post_ffw_norm"), cfg.dim, "")
        # tied embeddings: no output.weight, the head is the embedding matrix
        self.head = weights.get("output.weight", weights["token_embd.weight"])
        half = cfg.rope_dim // 2
        self.cos, self.sin = F.llm.rope_tables(self.context, 2 * half, cfg.rope_base, device=self.device,
                                               scale=cfg.rope_scale, factors=self._rope_factors(half))
        # Gemma 3's local layers: their own base, no scaling
        self.cos_local = self.sin_local = None
        if cfg.rope_base_local and any(cfg.local(i) for i in range(cfg.n_layers)):
            self.cos_local, self.sin_local = F.llm.rope_tables(self.context, 2 * half, cfg.rope_base_local,
                                                               device=self.device)
        self.k_cache = self.v_cache = None
        self.capacity = 0                     # key/value rows allocated (reserve)
        self._arange = {}
        # webgpu: Q/K/V and gate/up stacked into one weight each, norms, the q/k rotation and the
        # residual adds folded into the products (``_fuse``): a decode layer is 5 dispatches, not 15
        self._stacked: dict = {}
        # numpy: q/k/v and gate/up each one product (numpy_quant.stack_rows: no copy of the
        # weights), the norms, rope and residual adds their own ops as without it: the same bits,
        # one call and one hand-off to the kernels' second thread instead of three and two
        # (notes/native-decode-handoffs.md has the figures); EMBER_LLM_STACK=0 turns it off
        self._stacked_plain: dict = {}
        if self.device == "webgpu":
            self._fuse()
        elif self.device == "numpy" and os.environ.get("EMBER_LLM_STACK", "1") != "0":
            self._stack_rows()

    def _rope_factors(self, half: int):
        """Llama 3.1+'s per-frequency RoPE divisors (GGUF tensor ``rope_freqs.weight``, float,
        one per rotated pair), or None."""
        f = self.w.get("rope_freqs.weight")
        if f is None:
            return None
        if _quantized(f) or f.shape != (half,):
            raise WeightsError(f"llama: 'rope_freqs.weight' must be {half} float values (one per rotated "
                               f"pair of {2 * half} features), got {getattr(f, 'qtype', f.dtype)} {tuple(f.shape)}")
        vals = [float(v) for v in f.tolist()]
        if not all(0.0 < v < math.inf for v in vals):
            raise WeightsError("llama: 'rope_freqs.weight' holds a value that is not a positive finite number")
        return vals

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, gguf, *, device: str | None = None, context: int | None = None) -> "Llama":
        """From an ``ember.load_gguf`` file: weights stay quantized on ``device``."""
        cfg = LlamaConfig.from_gguf(gguf.metadata)
        ctx = min(int(context), cfg.context_length) if context else min(cfg.context_length, 4096)
        team = _team(device)
        if team is not None:     # straight into the thread team's shared memory (module doc)
            weights = {name: _shared_tensor(gguf, name, team, device) for name in gguf.tensors}
        else:
            weights = {name: gguf.tensor(name, device=device) for name in gguf.tensors}
        return cls(cfg, weights, context=ctx, device=device)

    @classmethod
    def random(cls, cfg: LlamaConfig, *, seed: int = 0, context: int = 64, device: str | None = None,
               scale: float = 0.2) -> "Llama":
        """Float weights drawn at random (tests, shape checks)."""
        import random

        rng = random.Random(seed)

        def mat(*shape):
            n = math.prod(shape)
            return tensor([rng.gauss(0.0, scale) for _ in range(n)], dtype="float32", device=device).reshape(shape)

        def ones(n):
            return tensor([1.0 + rng.gauss(0.0, 0.05) for _ in range(n)], dtype="float32", device=device)

        d, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_dim
        w = {"token_embd.weight": mat(cfg.vocab_size, d), "output_norm.weight": ones(d)}
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            w.update({p + "attn_norm.weight": ones(d), p + "ffn_norm.weight": ones(d),
                      p + "attn_q.weight": mat(cfg.n_heads * hd, d), p + "attn_k.weight": mat(cfg.n_kv_heads * hd, d),
                      p + "attn_v.weight": mat(cfg.n_kv_heads * hd, d), p + "attn_output.weight": mat(d, cfg.n_heads * hd),
                      p + "ffn_gate.weight": mat(f, d), p + "ffn_up.weight": mat(f, d), p + "ffn_down.weight": mat(d, f)})
        return cls(cfg, w, context=context, device=device)

    def _stack_rows(self) -> None:
        """numpy: each layer's Q, K, V (and gate, up) quantized weights as one weight of their
        rows (``numpy_quant.stack_rows``: a view, or the parts multiplied in one call) where they
        share a format and row length and have no bias, in ``_stacked_plain``; ``self.w`` as it was."""
        from ..backends.numpy_quant import stack_rows

        w = self.w
        for i in range(self.cfg.n_layers):
            b = f"blk.{i}."
            for name, parts in (("qkv", ("attn_q", "attn_k", "attn_v")), ("gate_up", ("ffn_gate", "ffn_up"))):
                ws = [w[b + p + ".weight"] for p in parts]
                if any(b + p + ".bias" in w for p in parts) or not all(_quantized(t) and t.ndim == 2 for t in ws):
                    continue
                st = stack_rows(ws)
                if st is not None:
                    self._stacked_plain[b + name] = st

    def _fuse(self) -> None:
        """Stack each layer's Q, K, V (and gate, up) quantized weights into one (their raw rows
        back to back: one product instead of three) where they share a format and whole words,
        and no bias. ``self.w`` keeps each part as a view of the stacked words (no second copy
        on a backend whose slices are views, as webgpu's are)."""
        from ..quant import QTensor

        w = self.w

        def plain(t, p):
            return isinstance(t, QTensor) and t.ndim == 2 and t.nbytes % 4 == 0 and b + p + ".bias" not in w
        for i in range(self.cfg.n_layers):
            b = f"blk.{i}."
            for name, parts in (("qkv", ("attn_q", "attn_k", "attn_v")), ("gate_up", ("ffn_gate", "ffn_up"))):
                ws = [w[b + p + ".weight"] for p in parts]
                if (not all(plain(t, p) for t, p in zip(ws, parts)) or len({t.qtype for t in ws}) != 1
                        or len({t.k for t in ws}) != 1):
                    continue
                data = F.concat([t.data for t in ws], axis=0)
                at = 0
                for p, t in zip(parts, ws):
                    nw = t.data.shape[0]
                    w[b + p + ".weight"] = QTensor(data[at:at + nw], t.qtype, t.shape)
                    at += nw
                self._stacked[b + name] = QTensor(data, ws[0].qtype, (sum(t.n for t in ws), ws[0].k))

    # ---- state ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Allocate (first use, without a ``reserve``) the key/value cache: ``context`` rows per
        layer. Rows past the current position are never read, so a new sequence needs no
        clearing."""
        if self.k_cache is None:
            self._allocate(self.context)

    def reserve(self, positions: int) -> bool:
        """Make the key/value cache hold at least ``positions`` rows (capped at ``context``):
        allocated on first use, else grown to ``max(positions, 2 x capacity)`` rounded up to
        ``KV_CHUNK`` rows. A grown cache starts empty: call it before a sequence's first forward
        (positions 0..) only. Returns True when the cache's tensors were replaced (a compiled
        step that holds the old ones must be given the new ones, ``ember.llm``'s ``_reserve``, or
        made again)."""
        want = min(max(1, int(positions)), self.context)
        if self.k_cache is not None and want <= self.capacity:
            return False
        if self.k_cache is not None:
            want = max(want, 2 * self.capacity)
        rows = min(-(-want // KV_CHUNK) * KV_CHUNK, self.context)
        self.k_cache = self.v_cache = None   # (the old rows go before the new ones are made)
        self._allocate(rows)
        return True

    def _allocate(self, rows: int) -> None:
        c = self.cfg
        shape = (rows, c.n_kv_heads, c.head_dim)
        # (the wasm attention kernel takes head_dim % 4 == 0; other heads run a Python kernel,
        # which needs the rows in Python)
        team = _team(self.device) if c.head_dim % 4 == 0 else None
        if team is not None:     # in the team's shared memory only (module doc)
            from .. import dtypes

            n = math.prod(shape)
            make = lambda: Tensor._wrap(team.moved("f", n), shape, dtypes.float32, self.device)  # noqa: E731
        else:
            make = lambda: F.zeros(shape, dtype="float32", device=self.device)  # noqa: E731
        self.k_cache = [make() for _ in range(c.n_layers)]
        self.v_cache = [make() for _ in range(c.n_layers)]
        self.capacity = rows

    def _positions(self, pos: Tensor, T: int) -> Tensor:
        if T == 1:
            return pos          # one token (the decode step): no integer add in the replayed plan
        ar = self._arange.get(T)
        if ar is None:
            ar = self._arange[T] = F.arange(T, dtype="int32", device=self.device)
        return pos + ar                                                  # (T,) absolute positions

    # ---- the forward pass -----------------------------------------------------------------------

    def forward(self, ids: Tensor, pos: Tensor, *, all_logits: bool = False) -> Tensor:
        """Logits of the last token ``(1, vocab)`` (or of all ``T``) for token ids ``ids``
        (``(T,)`` int32) placed at positions ``pos .. pos+T-1`` (``pos``: int32 ``(1,)``);
        their keys and values are written into the cache there."""
        c, w = self.cfg, self.w
        self.reset()
        T = ids.shape[0]
        if T == 1 and self._parts_ok():
            return self._decode_parts(ids, pos)
        hq, hkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        fold = bool(self._stacked)           # (webgpu: norms, rope and residual adds folded in)
        # the q/k rotation folded into the stacked product reads the tables at pos itself (not
        # where each head of q and k is normalised before it turns: Qwen3)
        turn = c.rope_mode == "pairs" and c.rope_dim == hd and not self._qk_norm
        if not fold or not turn or len(self._stacked) < 2 * c.n_layers:
            p = self._positions(pos, T)
            cos = F.take(self.cos, p, axis=0)                            # (T, rope_dim/2)
            sin = F.take(self.sin, p, axis=0)
            if self.cos_local is not None:
                cos_g, sin_g = cos, sin
                cos_l, sin_l = F.take(self.cos_local, p, axis=0), F.take(self.sin_local, p, axis=0)
        x = _embedding(ids, w["token_embd.weight"])                      # (T, D)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        nqk = (hq + hkv) * hd
        for i in range(c.n_layers):
            b = f"blk.{i}."
            local = c.local(i)
            if self.cos_local is not None:
                cos, sin = (cos_l, sin_l) if local else (cos_g, sin_g)
            qkv = self._stacked.get(b + "qkv")
            if qkv is not None:
                if turn:
                    y = F.llm.qlinear_rms_rope(x, w[b + "attn_norm.weight"], qkv, self.cos, self.sin, pos,
                                               rope_rows=nqk, head_dim=hd, eps=c.rms_eps)  # (T, (Hq+2Hkv)*hd)
                    qk = y[:, :nqk].reshape((T, hq + hkv, hd))
                else:
                    y = F.llm.qlinear_rms(x, w[b + "attn_norm.weight"], qkv, eps=c.rms_eps)
                    qk = y[:, :nqk].reshape((T, hq + hkv, hd))
                    if self._qk_norm:
                        qk = F.concat([F.rms_norm(qk[:, :hq], w[b + "attn_q_norm.weight"], eps=c.rms_eps),
                                       F.rms_norm(qk[:, hq:], w[b + "attn_k_norm.weight"], eps=c.rms_eps)], axis=1)
                    qk = self._rope(qk, cos, sin)                               # q and k: one rope
                q, k = qk[:, :hq], qk[:, hq:]
                v = y[:, nqk:].reshape((T, hkv, hd))
            elif b + "qkv" in self._stacked_plain:      # (numpy: one product, then the plain ops)
                h = F.rms_norm(x, w[b + "attn_norm.weight"], eps=c.rms_eps)
                y = _linear(h, self._stacked_plain[b + "qkv"]).reshape((T, hq + 2 * hkv, hd))
                qk, v = y[:, :hq + hkv], y[:, hq + hkv:]
                if self._qk_norm:
                    qk = F.concat([F.rms_norm(qk[:, :hq], w[b + "attn_q_norm.weight"], eps=c.rms_eps),
                                   F.rms_norm(qk[:, hq:], w[b + "attn_k_norm.weight"], eps=c.rms_eps)], axis=1)
                qk = self._rope(qk, cos, sin)                                   # q and k: one rope
                q, k = qk[:, :hq], qk[:, hq:]
            else:
                h = F.rms_norm(x, w[b + "attn_norm.weight"], eps=c.rms_eps)
                q = _linear(h, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")).reshape((T, hq, hd))
                k = _linear(h, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")).reshape((T, hkv, hd))
                v = _linear(h, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")).reshape((T, hkv, hd))
                if self._qk_norm:
                    q = F.rms_norm(q, w[b + "attn_q_norm.weight"], eps=c.rms_eps)
                    k = F.rms_norm(k, w[b + "attn_k_norm.weight"], eps=c.rms_eps)
                q = self._rope(q, cos, sin)
                k = self._rope(k, cos, sin)
            a = F.attention_cached(q, k, v, self.k_cache[i], self.v_cache[i], pos, c.query_scale or None,
                                   window=c.sliding_window if local else 0, softcap=c.attn_softcap)  # (T, Hq, hd)
            x = self._residual(a.reshape((T, hq * hd)), w[b + "attn_output.weight"], x, fold,
                               w.get(b + "post_attention_norm.weight"), c.rms_eps)
            gu = self._stacked.get(b + "gate_up")
            if gu is not None:
                y = F.llm.qlinear_rms(x, w[b + "ffn_norm.weight"], gu, eps=c.rms_eps)    # (T, 2 * ffn)
                wd = w[b + "ffn_down.weight"]
                if _quantized(wd) and c.act == "silu" and not c.post_norms:
                    x = F.llm.qlinear_residual(y, wd, x, glu=True)
                    continue
                f = c.ffn_dim
                g, u = y[:, :f], y[:, f:]
            elif b + "gate_up" in self._stacked_plain:
                h = F.rms_norm(x, w[b + "ffn_norm.weight"], eps=c.rms_eps)
                y = _linear(h, self._stacked_plain[b + "gate_up"])             # (T, 2 * ffn)
                f = c.ffn_dim
                g, u = y[:, :f], y[:, f:]
            else:
                h = F.rms_norm(x, w[b + "ffn_norm.weight"], eps=c.rms_eps)
                g = _linear(h, w[b + "ffn_gate.weight"])                     # (T, ffn)
                u = _linear(h, w[b + "ffn_up.weight"])
            h = F.silu(g) * u if c.act == "silu" else F.gelu(g, approximate="tanh") * u
            x = self._residual(h, w[b + "ffn_down.weight"], x, fold, w.get(b + "post_ffw_norm.weight"), c.rms_eps)
        if not all_logits and T > 1:
            x = x[T - 1:]                                                # (1, D): only the next token
        if fold and _quantized(self.head):
            logits = F.llm.qlinear_rms(x, w["output_norm.weight"], self.head, eps=c.rms_eps)
        else:
            logits = _linear(F.rms_norm(x, w["output_norm.weight"], eps=c.rms_eps), self.head)  # (1 or T, vocab)
        if c.final_softcap:
            logits = F.tanh(logits * (1.0 / c.final_softcap)) * c.final_softcap
        return logits

    def _parts_ok(self) -> bool:
        """Whether a one-token step can run as four ops a layer (webgpu: every layer's q/k/v and
        gate/up stacked and quantized, llama's rope layout, heads a whole number of the output
        projection's ``slice_granule``); opt-in, ``EMBER_LLM_PARTS=1``: on an H100 (wgpu-py, Vulkan) it
        measured slower than five a layer (GPU 1.43-1.47 vs 1.28 ms a token for SmolLM2's shape:
        summing the ten rows of parts costs gate/up and down more than the dispatch saved), and
        the three-op form 2x slower; kept for adapters where a dispatch costs more than on it."""
        got = self.__dict__.get("_parts")
        if got is not None:
            return got
        c, w, st = self.cfg, self.w, self._stacked
        ok = (os.environ.get("EMBER_LLM_PARTS", "0") == "1" and c.rope_mode == "pairs" and c.rope_dim == c.head_dim
              and not self._qk_norm and c.act == "silu" and not c.post_norms and c.embed_scale == 1.0
              and not (c.sliding_window or c.attn_softcap or c.final_softcap)
              and c.n_layers > 0 and all(
                  f"blk.{i}.qkv" in st and f"blk.{i}.gate_up" in st and _quantized(w[f"blk.{i}.attn_output.weight"])
                  and _quantized(w[f"blk.{i}.ffn_down.weight"]) for i in range(c.n_layers)))
        if ok:
            from ..quant import slice_granule

            ok = c.head_dim % slice_granule(w["blk.0.attn_output.weight"].qtype) == 0
        self._parts = ok
        return ok

    def _decode_parts(self, ids: Tensor, pos: Tensor) -> Tensor:
        """The one-token forward as four ops a layer: the attention's output projection split by
        head and kept as rows that sum to the hidden state (with the residual), summed by the
        MLP's gate/up product in its prologue and by its down product in its epilogue
        (``ember.ops.llm``: ``attention_proj``, ``qlinear_rms(parts=True)``,
        ``qlinear_residual(parts=True)``): no pass over the heads' sum of its own."""
        c, w = self.cfg, self.w
        hq, hkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        nqk = (hq + hkv) * hd
        x = _embedding(ids, w["token_embd.weight"])                      # (1, D)
        for i in range(c.n_layers):
            b = f"blk.{i}."
            y = F.llm.qlinear_rms_rope(x, w[b + "attn_norm.weight"], self._stacked[b + "qkv"], self.cos, self.sin,
                                       pos, rope_rows=nqk, head_dim=hd, eps=c.rms_eps)
            qk = y[:, :nqk].reshape((1, hq + hkv, hd))
            v = y[:, nqk:].reshape((1, hkv, hd))
            xs = F.llm.attention_proj(qk[:, :hq], qk[:, hq:], v, self.k_cache[i], self.v_cache[i], pos,
                                      w[b + "attn_output.weight"], x)                 # (1 + Hq, 1, D)
            g = F.llm.qlinear_rms(xs, w[b + "ffn_norm.weight"], self._stacked[b + "gate_up"], eps=c.rms_eps,
                                  parts=True)                                       # (1, 2 * ffn)
            x = F.llm.qlinear_residual(g, w[b + "ffn_down.weight"], xs, glu=True, parts=True)
        return F.llm.qlinear_rms(x, w["output_norm.weight"], self.head, eps=c.rms_eps)

    @staticmethod
    def _residual(x: Tensor, wt, r: Tensor, fold: bool, post=None, eps: float = 1e-5) -> Tensor:
        """``r + x @ wt.T``: one folded product where ``fold`` and the weight is quantized;
        with ``post`` (Gemma 2/3's post-norm weight) ``r + rms_norm(x @ wt.T, post)``."""
        if post is not None:
            return r + F.rms_norm(_linear(x, wt), post, eps=eps)
        if fold and _quantized(wt):
            return F.llm.qlinear_residual(x, wt, r)
        return r + _linear(x, wt)

    __call__ = forward

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        rd, hd = self.cfg.rope_dim, self.cfg.head_dim
        if rd == hd:
            return F.rope(x, cos, sin, mode=self.cfg.rope_mode)
        # partial rotary: only the first rope_dim features of each head turn
        return F.concat([F.rope(x[..., :rd], cos, sin, mode=self.cfg.rope_mode), x[..., rd:]], axis=-1)

    def to(self, device: str) -> "Llama":
        """The same model with its weights (still quantized) on ``device``."""
        moved = {k: v.to(device) for k, v in self.w.items()}
        return Llama(self.cfg, moved, context=self.context, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes held by the weights (quantized ones at their block size)."""
        return sum(v.nbytes for v in self.w.values())
