"""Ops of decoder-only language models: RMSNorm, rotary position embeddings and attention over
a preallocated key/value cache.

- ``rms_norm(x, w, eps=1e-5)``: ``x / sqrt(mean(x*x, -1) + eps) * w`` (composite).
- ``rope(x, cos, sin, mode="pairs")``: rotates the last axis of ``x`` (``(T, H, D)``) by the
  angles of ``cos``/``sin`` (``(T, D // 2)``, one row per token). ``"pairs"`` rotates
  ``(x[2i], x[2i+1])``: llama GGUF files, whose converter reordered the Q/K rows into that
  layout; ``"halves"`` rotates ``(x[i], x[i + D/2])``: the Hugging Face / NeoX layout
  (Qwen2 GGUFs keep it). Composite.
- ``attention_cached(q, k, v, k_cache, v_cache, pos, scale=..., window=0, softcap=0.0)``:
  **writes** ``k``/``v`` (``(T, Hkv, D)``) into the caches (``(C, Hkv, D)``) in place at rows
  ``pos .. pos+T-1``, then runs causal grouped-query attention of ``q`` (``(T, Hq, D)``) over
  cache rows ``0 .. pos+t`` for query ``t`` (``window > 0``: rows ``pos+t-window+1 .. pos+t``
  only, a sliding window; ``softcap > 0``: scores ``softcap * tanh(s / softcap)``, Gemma 2). ``pos`` is an int32 tensor of shape ``(1,)``, read by the kernel when it
  runs, so a compiled decoding step replays unchanged for every position. A primitive: each
  backend has a kernel (the python one below is the specification).
- ``qlinear_rms(x, norm_weight, w, eps=, qtype=, n=, k=)``: ``qlinear(rms_norm(x, norm_weight), w)``;
  ``qlinear_residual(x, w, residual, glu=, qtype=, n=, k=)``: ``qlinear(x', w) + residual``
  with ``x' = silu(x[..., :k]) * x[..., k:]`` when ``glu`` (a gated MLP's gate and up halves,
  from one product with their rows stacked), else ``x``. Composites: a decode step's norm, MLP
  gate and residual add folded into the quantized products around them (the webgpu backend runs
  each as ONE matrix-vector dispatch; elsewhere they decompose into exactly those ops).
  ``qlinear_rms_rope(x, norm_weight, w, cos, sin, pos, eps=, rope_rows=, head_dim=, ...)``:
  ``qlinear_rms`` whose first ``rope_rows`` outputs (stacked q and k heads) are then rotated
  (``"pairs"`` mode) at positions ``pos .. pos+T-1`` of the tables ``cos``/``sin``.
- ``greedy_tokens(logits)``: ``argmax(logits, axis=-1)`` of ``(rows, vocab)`` logits, the
  greedy step's token (a composite: webgpu splits the vocabulary over many workgroups, where a
  general argmax gives each output row one).

>>> import ember
>>> x = ember.tensor([[[1.0, 0.0]]])                 # T=1, H=1, D=2
>>> c, s = ember.tensor([[0.0]]), ember.tensor([[1.0]])   # a quarter turn
>>> ember.rope(x, c, s).tolist()
[[[0.0, 1.0]]]
>>> [round(v, 4) for v in ember.rms_norm(ember.tensor([3.0, 4.0]), ember.ones((2,))).tolist()]
[0.8485, 1.1314]
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError
from ..registry import apply, op
from ..tensor import Tensor

__all__ = ["rms_norm", "rope", "attention_cached", "qlinear_rms", "qlinear_residual", "qlinear_rms_rope",
           "attention_proj", "greedy_tokens"]


def _ops():
    from .. import ops
    return ops


def _float(name):
    def rule(*dts, **_):
        for d in dts[:1]:
            if d.kind != "f":
                raise DTypeError(f"{name}: needs a float input, got {d.name}")
        return _dt.float32 if dts[0] is _dt.float64 else dts[0]
    return rule


# ---- rms_norm ----------------------------------------------------------------------------------

def _rms_shape(xs, ws, *, eps):
    if not xs or tuple(ws) != (xs[-1],):
        raise ShapeError(f"rms_norm: weight {tuple(ws)} must be ({xs[-1] if xs else '?'},) for input {tuple(xs)}")
    return tuple(xs)


def _rms_decompose(x, w, *, eps):
    o = _ops()
    ms = o.mean(x * x, axis=-1, keepdims=True)
    return x / o.sqrt(ms + eps) * w


op("rms_norm", kind="composite", shape=_rms_shape, dtype=_float("rms_norm"), decompose=_rms_decompose,
   doc="Root-mean-square normalisation over the last axis, times a weight")


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` (RMSNorm, as in llama).

    >>> import ember
    >>> ember.rms_norm(ember.tensor([[2.0, 2.0]]), ember.tensor([1.0, 0.5])).tolist()
    [[0.9999987483024597, 0.49999937415122986]]
    """
    return apply("rms_norm", x, weight, eps=float(eps))


# ---- rope --------------------------------------------------------------------------------------

MODES = ("pairs", "halves")


def _rope_shape(xs, cs, ss, *, mode):
    if mode not in MODES:
        raise ShapeError(f"rope: mode must be one of {MODES}, got {mode!r}")
    if len(xs) != 3 or xs[-1] % 2:
        raise ShapeError(f"rope: x must be (T, H, D) with an even D, got {tuple(xs)}")
    want = (xs[0], xs[2] // 2)
    if tuple(cs) != want or tuple(ss) != want:
        raise ShapeError(f"rope: cos and sin must be {want} for x {tuple(xs)}, got {tuple(cs)} and {tuple(ss)}")
    return tuple(xs)


def _rope_decompose(x, cos, sin, *, mode):
    o = _ops()
    T, H, D = x.shape
    c = o.expand_dims(cos, axis=1)                     # (T, 1, D/2)
    s = o.expand_dims(sin, axis=1)
    if mode == "pairs":
        xp = o.reshape(x, (T, H, D // 2, 2))
        x0, x1 = xp[..., 0], xp[..., 1]                # (T, H, D/2) each
        y = o.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
        return o.reshape(y, (T, H, D))
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return o.concat([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


op("rope", kind="composite", shape=_rope_shape, dtype=_float("rope"), decompose=_rope_decompose,
   doc="Rotary position embedding of (T, H, D) by per-token cos/sin tables (T, D/2)")


def rope(x: Tensor, cos: Tensor, sin: Tensor, mode: str = "pairs") -> Tensor:
    """Rotate pairs of features of ``x`` (``(T, H, D)``) by the angles whose cosines and sines
    are ``cos``/``sin`` (``(T, D // 2)``). See the module docstring for ``mode``.

    >>> import ember
    >>> x = ember.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    >>> one, zero = ember.ones((1, 2)), ember.zeros((1, 2))
    >>> ember.rope(x, one, zero, mode="halves").tolist()      # angle 0: unchanged
    [[[1.0, 2.0, 3.0, 4.0]]]
    """
    return apply("rope", x, cos, sin, mode=mode)


def rope_tables(positions: int, dim: int, base: float = 10000.0, device: str | None = None, *,
                scale: float = 1.0, factors=None):
    """``(cos, sin)`` float32 tensors of shape ``(positions, dim // 2)``: angle
    ``(p / scale) * base ** (-2i / dim) / factors[i]`` for position ``p`` and pair ``i``
    (computed in float64). ``scale``: linear RoPE scaling (GGUF ``rope.scaling.type`` "linear",
    positions divided by ``rope.scaling.factor``); ``factors``: per-pair frequency divisors
    (``dim // 2`` positive numbers: the ``rope_freqs.weight`` of Llama 3.1+ files, whose long
    wavelengths turn ``factor`` times slower), None for all ones.

    >>> import ember
    >>> c, s = ember.ops.llm.rope_tables(3, 4)
    >>> c.shape, round(s.tolist()[1][0], 6)
    ((3, 2), 0.841471)
    >>> c, s = ember.ops.llm.rope_tables(3, 4, scale=2.0, factors=[1.0, 4.0])
    >>> round(s.tolist()[2][0], 6), round(s.tolist()[2][1], 6)   # angles 1 and 0.01 / 4
    (0.841471, 0.0025)
    """
    from array import array

    from ..tensor import from_bytes

    half = dim // 2
    if factors is None:
        factors = [1.0] * half
    factors = [float(f) for f in factors]
    if len(factors) != half or not all(0.0 < f < math.inf for f in factors):
        raise ShapeError(f"rope_tables: factors must be {half} positive finite numbers "
                         f"(one per rotated pair of {dim} features), got {len(factors)}")
    if not 0.0 < float(scale) < math.inf:
        raise ShapeError(f"rope_tables: scale must be a positive finite number, got {scale!r}")
    inv = [base ** (-2.0 * i / dim) / f / float(scale) for i, f in zip(range(half), factors)]
    angles = [p * f for p in range(positions) for f in inv]
    shape = (positions, half)
    # flat float32 bytes, not nested lists: a 2048-position table loads in milliseconds
    return (from_bytes(array("f", map(math.cos, angles)).tobytes(), shape, "float32", device=device),
            from_bytes(array("f", map(math.sin, angles)).tobytes(), shape, "float32", device=device))


# ---- attention over a KV cache -----------------------------------------------------------------

def _attn_shape(qs, ks, vs, kcs, vcs, ps, *, scale, window=0, softcap=0.0):
    name = "attention_cached"
    if not (isinstance(window, int) and window >= 0) or not 0.0 <= softcap < math.inf:
        raise ShapeError(f"{name}: window must be an int >= 0 and softcap a finite number >= 0 "
                         f"(0: none), got {window!r} and {softcap!r}")
    if len(qs) != 3 or len(ks) != 3 or tuple(vs) != tuple(ks):
        raise ShapeError(f"{name}: q must be (T, Hq, D) and k, v (T, Hkv, D); got {tuple(qs)}, {tuple(ks)}, {tuple(vs)}")
    T, hq, d = qs
    if ks[0] != T or ks[2] != d:
        raise ShapeError(f"{name}: k {tuple(ks)} does not match q {tuple(qs)} (T and D must agree)")
    hkv = ks[1]
    if hkv < 1 or hq % hkv:
        raise ShapeError(f"{name}: {hq} query heads are not a multiple of {hkv} key/value heads")
    if len(kcs) != 3 or tuple(kcs) != tuple(vcs) or kcs[1] != hkv or kcs[2] != d:
        raise ShapeError(f"{name}: caches must both be (C, {hkv}, {d}); got {tuple(kcs)} and {tuple(vcs)}")
    if T > kcs[0]:
        raise ShapeError(f"{name}: {T} new tokens do not fit a cache of {kcs[0]} positions")
    if tuple(ps) != (1,):
        raise ShapeError(f"{name}: pos must be an int32 tensor of shape (1,), got shape {tuple(ps)}")
    return tuple(qs)


def _attn_dtype(qt, kt, vt, kct, vct, pt, **_):
    for what, d in (("q", qt), ("k", kt), ("v", vt), ("k_cache", kct), ("v_cache", vct)):
        if d is not _dt.float32:
            raise DTypeError(f"attention_cached: {what} must be float32, got {d.name}")
    if pt is not _dt.int32:
        raise DTypeError(f"attention_cached: pos must be int32, got {pt.name}")
    return _dt.float32


op("attention_cached", kind="other", shape=_attn_shape, dtype=_attn_dtype,
   doc="Write k/v into a KV cache at pos (in place), then causal grouped-query attention")


def attention_cached(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor,
                     scale: float | None = None, *, window: int = 0, softcap: float = 0.0) -> Tensor:
    """Causal grouped-query attention of the ``T`` new tokens over a key/value cache.

    Writes ``k`` and ``v`` into ``k_cache``/``v_cache`` at rows ``pos .. pos+T-1`` (in place:
    the caches are state, owned by the caller), then returns ``(T, Hq, D)``: query ``t`` of
    head ``h`` attends to cache rows ``0 .. pos+t`` of key/value head ``h // (Hq // Hkv)``.
    ``window > 0`` (a sliding window, Gemma 2/3's local layers): only the rows
    ``max(0, pos+t-window+1) .. pos+t``. ``softcap > 0`` (Gemma 2): each score ``s`` (already
    times ``scale``) becomes ``softcap * tanh(s / softcap)`` before the softmax. The defaults
    (0) are plain causal attention, and pass no attribute to the kernels.

    >>> import ember
    >>> kc, vc = ember.zeros((4, 1, 2)), ember.zeros((4, 1, 2))
    >>> q = ember.ones((1, 2, 2)); k = ember.ones((1, 1, 2)); v = ember.tensor([[[1.0, 2.0]]])
    >>> attention_cached(q, k, v, kc, vc, ember.tensor([0], dtype="int32")).tolist()
    [[[1.0, 2.0], [1.0, 2.0]]]
    >>> vc.tolist()[0]
    [[1.0, 2.0]]
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    extra = {}
    if window:
        extra["window"] = window
    if softcap:
        extra["softcap"] = float(softcap)
    return apply("attention_cached", q, k, v, k_cache, v_cache, pos, scale=float(scale), **extra)


# ---- quantized products with their neighbours folded in (decode) ---------------------------------

def _qshape(name, xs, ws, k_in, *, qtype, n, k):
    from .quant import _check_weight

    _check_weight(name, ws, qtype=qtype, n=n, k=k)
    if not xs or xs[-1] != k_in:
        raise ShapeError(f"{name}: x {tuple(xs)} must end in {k_in} features for a {qtype} weight (n={n}, k={k})")
    return tuple(xs[:-1]) + (n,)


def _unparted(name, xs, parts):
    """The shape of x summed over its parts axis (``parts``: x is (R, ..., k), its rows' sum over
    axis 0 the input)."""
    if not parts:
        return tuple(xs)
    if len(xs) < 2 or not xs[0]:
        raise ShapeError(f"{name}: x in parts must be (R, ..., k) with R >= 1, got {tuple(xs)}")
    return tuple(xs[1:])


def _qrms_shape(xs, nws, ws, *, eps, qtype, n, k, parts=False):
    if tuple(nws) != (k,):
        raise ShapeError(f"qlinear_rms: norm weight {tuple(nws)} must be ({k},)")
    return _qshape("qlinear_rms", _unparted("qlinear_rms", xs, parts), ws, k, qtype=qtype, n=n, k=k)


def _qrms_dtype(xt, nwt, wt, **_):
    if xt is not _dt.float32 or nwt is not _dt.float32:
        raise DTypeError(f"qlinear_rms: x and the norm weight must be float32, got {xt.name}, {nwt.name}")
    return _dt.float32


def _qrms_decompose(x, nw, w, *, eps, qtype, n, k, parts=False):
    if parts:
        x = _ops().sum(x, axis=0)
    return apply("qlinear", apply("rms_norm", x, nw, eps=eps), w, qtype=qtype, n=n, k=k)


op("qlinear_rms", kind="composite", shape=_qrms_shape, dtype=_qrms_dtype, decompose=_qrms_decompose,
   doc="qlinear(rms_norm(x, norm_weight), w): a pre-norm folded into the quantized product")


def _qres_shape(xs, ws, rs, *, glu, qtype, n, k, parts=False):
    out = _qshape("qlinear_residual", xs, ws, 2 * k if glu else k, qtype=qtype, n=n, k=k)
    if _unparted("qlinear_residual", rs, parts) != out:
        raise ShapeError(f"qlinear_residual: residual {tuple(rs)} must be the product's shape {out}")
    return out


def _qres_dtype(xt, wt, rt, **_):
    if xt is not _dt.float32 or rt is not _dt.float32:
        raise DTypeError(f"qlinear_residual: x and the residual must be float32, got {xt.name}, {rt.name}")
    return _dt.float32


def _qres_decompose(x, w, r, *, glu, qtype, n, k, parts=False):
    o = _ops()
    if parts:
        r = o.sum(r, axis=0)
    if glu:
        x = o.silu(x[..., :k]) * x[..., k:]
    return apply("qlinear", x, w, qtype=qtype, n=n, k=k) + r


op("qlinear_residual", kind="composite", shape=_qres_shape, dtype=_qres_dtype, decompose=_qres_decompose,
   doc="qlinear(x, w) + residual, x optionally silu(gate) * up from one stacked product")


def _qrr_shape(xs, nws, ws, cs, ss, ps, *, eps, rope_rows, head_dim, qtype, n, k, parts=False):
    out = _qrms_shape(xs, nws, ws, eps=eps, qtype=qtype, n=n, k=k, parts=parts)
    xs = _unparted("qlinear_rms_rope", xs, parts)
    if len(xs) != 2 or head_dim % 2 or rope_rows % head_dim or rope_rows > n:
        raise ShapeError(f"qlinear_rms_rope: x must be (T, k) and rope_rows ({rope_rows}) whole heads of an even "
                         f"head_dim ({head_dim}) within n={n}; got x {tuple(xs)}")
    if len(cs) != 2 or cs[1] != head_dim // 2 or tuple(ss) != tuple(cs) or tuple(ps) != (1,):
        raise ShapeError(f"qlinear_rms_rope: cos/sin must be (positions, {head_dim // 2}) and pos (1,); got "
                         f"{tuple(cs)}, {tuple(ss)}, {tuple(ps)}")
    return out


def _qrr_dtype(xt, nwt, wt, ct, st, pt, **_):
    if pt is not _dt.int32:
        raise DTypeError(f"qlinear_rms_rope: pos must be int32, got {pt.name}")
    return _qrms_dtype(xt, nwt, wt)


def _qrr_decompose(x, nw, w, cos, sin, pos, *, eps, rope_rows, head_dim, qtype, n, k, parts=False):
    o = _ops()
    if parts:
        x = o.sum(x, axis=0)
    y = apply("qlinear_rms", x, nw, w, eps=eps, qtype=qtype, n=n, k=k)
    T = x.shape[0]
    p = pos if T == 1 else pos + o.arange(T, dtype="int32", device=x.device)
    c, s = o.take(cos, p, axis=0), o.take(sin, p, axis=0)                     # (T, head_dim/2)
    r = apply("rope", o.reshape(y[:, :rope_rows], (T, rope_rows // head_dim, head_dim)), c, s, mode="pairs")
    return o.concat([o.reshape(r, (T, rope_rows)), y[:, rope_rows:]], axis=-1)


op("qlinear_rms_rope", kind="composite", shape=_qrr_shape, dtype=_qrr_dtype, decompose=_qrr_decompose,
   doc="qlinear_rms whose first rope_rows outputs are rotated (rope, pairs) at positions pos..")


def qlinear_rms_rope(x: Tensor, norm_weight: Tensor, w, cos: Tensor, sin: Tensor, pos: Tensor, *,
                     rope_rows: int, head_dim: int, eps: float = 1e-5, parts: bool = False) -> Tensor:
    """``qlinear_rms(x, norm_weight, w)`` (x ``(T, k)``) with its first ``rope_rows`` outputs,
    heads of ``head_dim``, rotated in ``"pairs"`` mode by the rows ``pos .. pos+T-1`` of the
    tables ``cos``/``sin`` (``(positions, head_dim // 2)``, ``rope_tables``): llama's q and k
    projections stacked, normalised, multiplied and turned at once.

    >>> import ember
    >>> from ember.quant import QTensor
    >>> w = QTensor.quantize(ember.ones((4, 32)), "q8_0")
    >>> c, s = ember.ops.llm.rope_tables(8, 2)
    >>> y = qlinear_rms_rope(ember.ones((1, 32)), ember.ones((32,)), w, c, s, ember.tensor([0], dtype="int32"),
    ...                      rope_rows=2, head_dim=2)
    >>> [round(v, 2) for v in y.tolist()[0]]          # position 0: no turn
    [32.0, 32.0, 32.0, 32.0]
    """
    return apply("qlinear_rms_rope", x, norm_weight, w.data, cos, sin, pos, eps=float(eps), rope_rows=int(rope_rows),
                 head_dim=int(head_dim), qtype=w.qtype, n=w.n, k=w.k, parts=bool(parts))


def qlinear_rms(x: Tensor, norm_weight: Tensor, w, *, eps: float = 1e-5, parts: bool = False) -> Tensor:
    """``qlinear(rms_norm(x, norm_weight, eps), w)`` for a ``QTensor`` ``w`` (n, k). With
    ``parts`` x is a residual stream in parts, ``(R, T, k)``: the input is its sum over axis 0
    (``attention_proj``'s output; webgpu sums it in the product's prologue).

    >>> import ember
    >>> from ember.quant import QTensor
    >>> w = QTensor.quantize(ember.ones((2, 32)), "q8_0")
    >>> [round(v, 2) for v in ember.ops.llm.qlinear_rms(ember.full((1, 32), 3.0), ember.ones((32,)), w).tolist()[0]]
    [32.0, 32.0]
    """
    return apply("qlinear_rms", x, norm_weight, w.data, eps=float(eps), qtype=w.qtype, n=w.n, k=w.k,
                 parts=bool(parts))


def qlinear_residual(x: Tensor, w, residual: Tensor, *, glu: bool = False, parts: bool = False) -> Tensor:
    """``qlinear(x, w) + residual``; with ``glu`` x holds ``2k`` features, gate then up, and the
    product is of ``silu(gate) * up`` (a SiLU-gated MLP's down projection). With ``parts`` the
    residual is a stream in parts ``(R, T, n)`` (``attention_proj``'s), summed over axis 0.

    >>> import ember
    >>> from ember.quant import QTensor
    >>> w = QTensor.quantize(ember.ones((1, 32)), "q8_0")
    >>> round(ember.ops.llm.qlinear_residual(ember.ones((1, 32)), w, ember.ones((1, 1))).tolist()[0][0], 2)
    33.0
    """
    return apply("qlinear_residual", x, w.data, residual, glu=bool(glu), qtype=w.qtype, n=w.n, k=w.k,
                 parts=bool(parts))


# ---- a decode layer in four dispatches: the residual stream in parts ------------------------------
#
# ``attention_proj`` gives the hidden state after attention as rows that sum to it: the residual
# (the state before it), then each query head's share of the output projection (the o-proj
# rows times that head's slice of the attention output). ``qlinear_rms(..., parts=True)`` (the
# MLP's gate and up) sums such rows in its prologue, ``qlinear_residual(..., parts=True)`` (the
# down projection) in its epilogue. On webgpu each is one dispatch and no sum over the heads ever
# needs a pass of its own, so a llama layer is four (the per-dispatch cost, not the weights,
# bounds a small model's decoding there).

def _aproj_shape(qs, ks, vs, kcs, vcs, ps, ws, rs, *, scale, qtype, n, k):
    from .quant import _check_weight

    T, hq, d = _attn_shape(qs, ks, vs, kcs, vcs, ps, scale=scale)
    _check_weight("attention_proj", ws, qtype=qtype, n=n, k=k)
    if k != hq * d:
        raise ShapeError(f"attention_proj: the output weight has k={k}, the heads give {hq} x {d} = {hq * d}")
    if tuple(rs) != (T, n):
        raise ShapeError(f"attention_proj: the residual {tuple(rs)} must be ({T}, {n})")
    return (1 + hq, T, n)


def _aproj_dtype(qt, kt, vt, kct, vct, pt, wt, rt, **_):
    from .quant import _check_words_dtype

    _check_words_dtype("attention_proj", wt)
    if rt is not _dt.float32:
        raise DTypeError(f"attention_proj: the residual must be float32, got {rt.name}")
    return _attn_dtype(qt, kt, vt, kct, vct, pt)


def _aproj_decompose(q, kn, vn, kc, vc, pos, w, r, *, scale, qtype, n, k):
    o = _ops()
    T, hq, d = q.shape
    a = apply("attention_cached", q, kn, vn, kc, vc, pos, scale=scale)                # (T, Hq, d)
    wo = o.reshape(apply("dequantize", w, qtype=qtype, n=n, k=k), (n, hq, d))          # (n, Hq, d)
    shares = o.matmul(o.permute_dims(a, (1, 0, 2)), o.permute_dims(wo, (1, 2, 0)))   # (Hq, T, n)
    return o.concat([o.reshape(r, (1, T, n)), shares], axis=0)


op("attention_proj", kind="composite", shape=_aproj_shape, dtype=_aproj_dtype, decompose=_aproj_decompose,
   doc="attention_cached then its output projection added to a residual, as rows that sum to it: "
       "(1 + Hq, T, n), the residual then each head's share")


def attention_proj(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, w,
                   residual: Tensor, *, scale: float | None = None) -> Tensor:
    """``attention_cached`` (which writes ``k``/``v`` into the caches), its output projection
    ``w`` (a ``QTensor`` ``(n, Hq * D)``) and the residual ``(T, n)`` added, as a residual stream
    in parts: ``(1 + Hq, T, n)``, the residual then each head's share of the projection; its sum
    over axis 0 is ``residual + attention(...).reshape(T, Hq * D) @ dequantize(w).T``.

    >>> import ember
    >>> from ember.quant import QTensor
    >>> kc, vc = ember.zeros((4, 1, 32)), ember.zeros((4, 1, 32))
    >>> q, kv = ember.ones((1, 2, 32)), ember.ones((1, 1, 32))
    >>> w = QTensor.quantize(ember.ones((3, 64)), "q8_0")
    >>> y = attention_proj(q, kv, kv, kc, vc, ember.tensor([0], dtype="int32"), w, ember.ones((1, 3)))
    >>> y.shape, [round(v, 2) for v in ember.sum(y, axis=0).tolist()[0]]
    ((3, 1, 3), [65.0, 65.0, 65.0])
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return apply("attention_proj", q, k, v, k_cache, v_cache, pos, w.data, residual, scale=float(scale),
                 qtype=w.qtype, n=w.n, k=w.k)


def _greedy_shape(xs):
    if len(xs) != 2 or not xs[1]:
        raise ShapeError(f"greedy_tokens: logits must be (rows, vocab) with a vocabulary, got {tuple(xs)}")
    return (xs[0],)


def _greedy_dtype(xt, **_):
    if xt.kind != "f":
        raise DTypeError(f"greedy_tokens: logits must be floating point, got {xt.name}")
    return _dt.int64


op("greedy_tokens", kind="composite", shape=_greedy_shape, dtype=_greedy_dtype,
   decompose=lambda x: _ops().argmax(x, axis=-1),
   doc="argmax over the vocabulary of (rows, vocab) logits: a greedy decoding step's tokens")


def greedy_tokens(logits: Tensor) -> Tensor:
    """The index (int64) of the first largest logit of each row of ``logits`` ``(rows, vocab)``:
    ``argmax(logits, axis=-1)``, as a greedy decoding step picks its token.

    >>> import ember
    >>> greedy_tokens(ember.tensor([[0.5, 2.0, 2.0], [3.0, -1.0, 0.0]])).tolist()
    [1, 0]
    """
    return apply("greedy_tokens", logits)


def check_pos(pos: int, T: int, C: int) -> None:
    """The bounds every kernel checks: ``0 <= pos`` and ``pos + T <= C``."""
    if pos < 0 or pos + T > C:
        raise ShapeError(f"attention_cached: {T} tokens at position {pos} do not fit a cache of {C} "
                         f"positions (the context is full: start a new sequence or load with a longer context)")
