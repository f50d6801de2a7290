"""Quantized-weight kernels of the numpy backend: ``dequantize``, ``qlinear`` and ``qembedding``
(``ember.ops.quant``), vectorised over all blocks through numpy views of the weight's bytes.

``qlinear`` never keeps a float copy of the weight: it decodes a few MB of rows at a time into
a scratch and multiplies them with BLAS. Results equal the reference (``ember.quant.FORMATS``):
every dequantized value is one float32 rounding of the exact value, as in ggml.
"""
from __future__ import annotations

import numpy as np

from ..errors import IndexingError
from ..quant import FORMATS, row_bytes

_F32 = np.float32


def _half(B, off: int):
    """The float16 at byte ``off`` of every block of ``B`` (blocks, nbytes) as (blocks, 1) float32."""
    return B[:, off:off + 2].view(np.float16).astype(_F32)


def _nibbles(qs):
    """(blocks, 16) bytes -> (blocks, 32) uint8: the low nibbles, then the high nibbles."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _d_f32(B):
    return B.view("<f4").astype(_F32, copy=False)


def _d_f16(B):
    return B.view("<f2").astype(_F32)


def _d_bf16(B):
    return (B.view("<u2").astype(np.uint32) << 16).view(_F32)


def _d_q8_0(B):
    return B[:, 2:].view(np.int8).astype(_F32) * _half(B, 0)


def _d_q4_0(B):
    q = _nibbles(B[:, 2:18]).view(np.int8) - np.int8(8)
    return q.astype(_F32) * _half(B, 0)


def _d_q4_1(B):
    return _nibbles(B[:, 4:20]).astype(_F32) * _half(B, 0) + _half(B, 2)


_BIT32 = np.arange(32, dtype=np.uint32)


def _d_q5_0(B):
    qh = np.ascontiguousarray(B[:, 2:6]).view("<u4")                    # (blocks, 1)
    high = ((qh >> _BIT32) & 1).astype(np.uint8) << 4                  # bit j -> element j
    q = (_nibbles(B[:, 6:22]) | high).view(np.int8) - np.int8(16)
    return q.astype(_F32) * _half(B, 0)


def _scales_mins_k4(s):
    """(blocks, 12) packed bytes -> (blocks, 8) 6-bit scales and (blocks, 8) 6-bit mins."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _k_nibbles(qs):
    """(blocks, 128) bytes -> (blocks, 8, 32): sub-block 2c is the low nibbles of bytes
    32c..32c+31, sub-block 2c+1 their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 8, 32)


def _k_out(B, q):
    d, dmin = _half(B, 0), _half(B, 2)
    sc, mn = _scales_mins_k4(B[:, 4:16])
    y = (d * sc)[:, :, None] * q.astype(_F32) - (dmin * mn)[:, :, None]
    return y.reshape(-1, 256)


def _d_q4_k(B):
    return _k_out(B, _k_nibbles(B[:, 16:144]))


_BIT8 = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)


def _d_q5_k(B):
    high = ((B[:, None, 16:48] >> _BIT8) & 1) << 4                      # bit s of qh[l] -> sub-block s
    return _k_out(B, _k_nibbles(B[:, 48:176]) | high)


_SHIFT6 = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)


def _d_q6_k(B):
    nb = B.shape[0]
    ql = B[:, :128].reshape(nb, 2, 1, 64)
    lo, hi = ql[..., :32], ql[..., 32:]
    nib = np.concatenate([lo & 15, hi & 15, lo >> 4, hi >> 4], axis=2)     # (nb, 2 halves, 4, 32)
    top = (B[:, 128:192].reshape(nb, 2, 1, 32) >> _SHIFT6) & 3
    q = ((nib | (top << 4)).view(np.int8) - np.int8(32)).astype(_F32)
    sc = B[:, 192:208].view(np.int8).astype(_F32).reshape(nb, 2, 4, 2, 1)    # 16 elements each
    y = (_half(B, 208).reshape(nb, 1, 1, 1, 1) * sc) * q.reshape(nb, 2, 4, 2, 16)
    return y.reshape(nb, 256)


DEQUANT = {"f32": _d_f32, "f16": _d_f16, "bf16": _d_bf16, "q8_0": _d_q8_0, "q4_0": _d_q4_0,
           "q4_1": _d_q4_1, "q5_0": _d_q5_0, "q4_k": _d_q4_k, "q5_k": _d_q5_k, "q6_k": _d_q6_k}


def _bytes(w):
    return w._buf.view(np.uint8)


def dequantize_rows(raw, qtype: str, rows: int, k: int):
    """(rows * row_bytes,) uint8 -> (rows, k) float32."""
    fmt = FORMATS[qtype]
    if rows == 0 or k == 0:
        return np.zeros((rows, k), _F32)
    return DEQUANT[qtype](raw.reshape(-1, fmt.nbytes)).reshape(rows, k)


def _dequantize(out, w, *, qtype, n, k, **_):
    return dequantize_rows(_bytes(w)[:n * row_bytes(qtype, k)], qtype, n, k)


CHUNK_BYTES = 1 << 21   # float32 rows decoded per step of qlinear (stays in cache)


def _qlinear(out, x, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    xb = x._buf
    x2 = xb.reshape(-1, k).astype(_F32, copy=False)
    y = np.empty((x2.shape[0], n), _F32)
    if n == 0 or y.size == 0:
        return y.reshape(out.shape)
    raw = _bytes(w)
    step = max(1, CHUNK_BYTES // (4 * max(k, 1)))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        W = dequantize_rows(raw[r0 * rb:r1 * rb], qtype, r1 - r0, k)
        np.matmul(x2, W.T, out=y[:, r0:r1])
    return y.reshape(out.shape)


def _qembedding(out, ids, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    flat = ids._buf.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n):
        bad = flat[(flat < 0) | (flat >= n)][0]
        raise IndexingError(f"qembedding: id {int(bad)} is out of range for a {qtype} weight of {n} rows "
                            f"(ids must be in [0, {n}))")
    rows = _bytes(w)[:n * rb].reshape(n, rb)[flat]
    return dequantize_rows(rows.reshape(-1), qtype, flat.size, k).reshape(out.shape)


KERNELS = {
    "dequantize": _dequantize,
    "qlinear": _qlinear,
    "qembedding": _qembedding,
}
