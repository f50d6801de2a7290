"""onnxruntime's fused transformer operators (domain ``com.microsoft``), as compositions of
public ember ops: what ``onnxruntime.transformers.optimizer`` writes into BERT-like graphs
(SkipLayerNormalization, EmbedLayerNormalization, Attention, FastGelu, BiasGelu, Gelu,
QuickGelu, FusedMatMul, SkipSimplifiedLayerNormalization).

Masks follow onnxruntime's CPU kernels: masked scores get ``mask_filter_value`` (default
-10000) added, not -inf, so a row whose keys are all masked averages them uniformly, as
onnxruntime does.

>>> import ember
>>> from ember.onnx import contrib
>>> x = ember.tensor([[1.0, 2.0, 3.0]])
>>> [round(v, 3) for v in contrib.skip_layer_norm(x, x, ember.ones((3,)), None, None, 1e-12)[0][0].tolist()]
[-1.225, 0.0, 1.225]
"""
from __future__ import annotations

import math

import ember as E

from .. import dtypes as _dt
from ..errors import ShapeError, UnsupportedOp
from ..tensor import Tensor

__all__ = ["skip_layer_norm", "skip_simplified_layer_norm", "embed_layer_norm", "ms_attention", "fast_gelu",
           "bias_gelu", "quick_gelu", "fused_matmul"]


def _ln(x: Tensor, gamma: Tensor, beta: Tensor | None, eps: float) -> Tensor:
    return E.layer_norm(x, (x.shape[-1],), gamma, beta, eps=eps)


def skip_layer_norm(x, skip, gamma, beta=None, bias=None, eps: float = 1e-12, want_sum: bool = False):
    """``LayerNorm(x + skip + bias)`` over the last axis; with ``want_sum`` also the sum."""
    s = E.add(x, skip)
    if bias is not None:
        s = E.add(s, bias)
    y = _ln(s, gamma, beta, eps)
    return (y, s) if want_sum else (y,)


def skip_simplified_layer_norm(x, skip, gamma, bias=None, eps: float = 1e-12, want_sum: bool = False):
    """RMS norm of ``x + skip + bias`` times ``gamma`` (no mean subtraction, no beta)."""
    s = E.add(x, skip)
    if bias is not None:
        s = E.add(s, bias)
    ms = E.mean(E.multiply(s, s), axis=-1, keepdims=True)
    y = E.multiply(E.divide(s, E.sqrt(E.add(ms, eps))), gamma)
    return (y, s) if want_sum else (y,)


def embed_layer_norm(input_ids, segment_ids, word_emb, pos_emb, seg_emb, gamma, beta, mask=None,
                     position_ids=None, eps: float = 1e-12, want_sum: bool = False):
    """Word + position (+ segment) embeddings, layer-normalised; returns ``(output, mask_index)``
    (and the embedding sum with ``want_sum``). ``mask_index`` is the number of real tokens per
    row (int32), 0 when there is no mask."""
    b, n = input_ids.shape
    x = E.take(word_emb, E.reshape(input_ids, (-1,)), axis=0)
    if position_ids is None:
        pos = E.take(pos_emb, E.arange(n, dtype=_dt.int64, device=input_ids.device), axis=0)   # (n, hidden)
        x = E.add(E.reshape(x, (b, n, -1)), pos)
    else:
        p = E.take(pos_emb, E.reshape(E.broadcast_to(position_ids, (b, n)), (-1,)), axis=0)
        x = E.reshape(E.add(x, p), (b, n, -1))
    if segment_ids is not None and seg_emb is not None:
        x = E.add(x, E.reshape(E.take(seg_emb, E.reshape(segment_ids, (-1,)), axis=0), (b, n, -1)))
    y = _ln(x, gamma, beta, eps)
    if mask is None:
        idx = E.zeros((b,), dtype=_dt.int32, device=input_ids.device)
    else:
        idx = E.astype(E.sum(E.astype(E.not_equal(mask, 0), _dt.int32), axis=1), _dt.int32)
    return (y, idx, x) if want_sum else (y, idx)


def _additive_mask(mask, b, s, t, filter_value, device):
    """onnxruntime's mask_index forms -> an additive float mask broadcasting to (b, heads, s, t)."""
    if mask.ndim == 1 and mask.shape[0] in (b, 2 * b):
        ends = E.reshape(E.astype(mask, _dt.int64), (-1, 1))                         # (b or 2b, 1)
        pos = E.reshape(E.arange(t, dtype=_dt.int64, device=device), (1, t))
        keep = E.less(pos, ends[:b])
        if mask.shape[0] == 2 * b:
            keep = E.logical_and(keep, E.greater_equal(pos, ends[b:]))
        return E.reshape(E.where(keep, 0.0, filter_value), (b, 1, 1, t))
    if mask.ndim == 2:
        keep = E.not_equal(mask, 0)
        return E.reshape(E.where(keep, 0.0, filter_value), (b, 1, 1, t))
    if mask.ndim == 3:
        keep = E.not_equal(mask, 0)
        return E.reshape(E.where(keep, 0.0, filter_value), (b, 1, s, t))
    raise UnsupportedOp(f"Attention: mask_index of shape {mask.shape} (ember reads (B), (2B), (B, T) and "
                        f"(B, S, T) masks)")


def ms_attention(x, weights, bias=None, mask_index=None, attention_bias=None, *, num_heads: int,
                 qkv_hidden_sizes=None, unidirectional: bool = False, scale: float = 0.0,
                 mask_filter_value: float = -10000.0) -> Tensor:
    """onnxruntime's Attention: ``x`` (B, S, D) @ ``weights`` (D, Dq+Dk+Dv) + ``bias`` split into
    q, k, v, ``num_heads`` heads, softmax(q k^T * scale + masks) v, heads merged: (B, S, Dv)."""
    b, s, _d = x.shape
    qkv = E.matmul(x, weights)
    if bias is not None:
        qkv = E.add(qkv, bias)
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [weights.shape[1] // 3] * 3
    if sum(sizes) != weights.shape[1] or sizes[0] != sizes[1] or any(z % num_heads for z in sizes):
        raise ShapeError(f"Attention: qkv_hidden_sizes {sizes} do not fit weights {weights.shape} with "
                         f"{num_heads} heads")
    a, c = sizes[0], sizes[0] + sizes[1]
    q, k, v = qkv[:, :, :a], qkv[:, :, a:c], qkv[:, :, c:]

    def heads(t):
        return E.permute_dims(E.reshape(t, (b, s, num_heads, t.shape[-1] // num_heads)), (0, 2, 1, 3))
    hd = sizes[0] // num_heads
    sc = scale if scale else 1.0 / math.sqrt(hd)
    t = s
    m = None
    if mask_index is not None:
        m = _additive_mask(mask_index, b, s, t, float(mask_filter_value), x.device)
    if unidirectional:
        from ..tensor import tensor
        causal = tensor([[0.0 if j <= i else float(mask_filter_value) for j in range(t)] for i in range(s)],
                        dtype=_dt.float32, device=x.device)
        m = causal if m is None else E.add(m, causal)
    if attention_bias is not None:
        m = attention_bias if m is None else E.add(m, attention_bias)
    ctx = E.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=m, scale=sc)   # (b, h, s, hv)
    return E.reshape(E.permute_dims(ctx, (0, 2, 1, 3)), (b, s, sizes[2]))


def fast_gelu(x, bias=None):
    """onnxruntime's FastGelu: the tanh approximation of gelu, of ``x + bias``."""
    if bias is not None:
        x = E.add(x, bias)
    return E.gelu(x, approximate="tanh")


def bias_gelu(x, bias):
    """onnxruntime's BiasGelu: exact gelu of ``x + bias``."""
    return E.gelu(E.add(x, bias))


def quick_gelu(x, alpha: float = 1.702):
    """``x * sigmoid(alpha * x)``."""
    return E.multiply(x, E.sigmoid(E.multiply(x, alpha)))


def fused_matmul(a, b, alpha: float = 1.0, trans_a: bool = False, trans_b: bool = False):
    """onnxruntime's FusedMatMul: ``alpha * op(a) @ op(b)``, op transposing the last two axes."""
    if trans_a:
        a = E.matrix_transpose(a)
    if trans_b:
        b = E.matrix_transpose(b)
    y = E.matmul(a, b)
    return y if alpha == 1.0 else E.multiply(y, alpha)
