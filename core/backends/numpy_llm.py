"""numpy kernels of the language-model ops (``ember.ops.llm``), tested against the python ones.

``attention_cached`` writes the new keys/values into the caches in place (they are state the
caller owns) and attends over the filled rows only, one key/value head group at a time: one
``(T * group, D) @ (D, n)`` product per group instead of a masked pass over the whole cache."""
from __future__ import annotations

import numpy as np

from ..ops.llm import check_pos
from .numpy_blas import matmul


def _f32(t):
    a = t._buf
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _rms_norm(out, x, w, *, eps):
    a = _f32(x)
    ms = np.einsum("...i,...i->...", a, a)[..., None]
    ms /= np.float32(a.shape[-1])
    ms += np.float32(eps)
    return (a / np.sqrt(ms)) * _f32(w)


def _rope(out, x, cos, sin, *, mode):
    a = _f32(x)
    T, H, D = a.shape
    c = _f32(cos)[:, None, :]
    s = _f32(sin)[:, None, :]
    y = np.empty_like(a)
    if mode == "pairs":
        x0, x1 = a[..., 0::2], a[..., 1::2]
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
    else:
        h = D // 2
        x0, x1 = a[..., :h], a[..., h:]
        y[..., :h] = x0 * c - x1 * s
        y[..., h:] = x0 * s + x1 * c
    return y


def _attention_cached(out, q, k, v, kc, vc, pos, *, scale, window=0, softcap=0.0):
    T, hq, d = q.shape
    C, hkv, _ = kc.shape
    p0 = int(pos._buf.reshape(-1)[0])
    check_pos(p0, T, C)
    kb, vb = kc._buf, vc._buf
    kb[p0:p0 + T] = k._buf
    vb[p0:p0 + T] = v._buf
    n = p0 + T
    group = hq // hkv
    qa = _f32(q).reshape(T, hkv, group, d)
    res = np.empty((T, hkv, group, d), dtype=np.float32)
    # causal: query t sees rows 0..p0+t
    # a sliding window: query t sees rows p0+t-window+1..p0+t (the rows before the first query's
    # window are never read)
    lo = max(0, p0 + 1 - window) if window else 0
    mask = None
    if T > 1:
        j = np.arange(lo, n)[None, :]
        last = (p0 + np.arange(T))[:, None]
        mask = j > last                                                   # (T, n - lo)
        if window:
            mask |= j <= last - window
        mask = np.repeat(mask, group, axis=0)                              # (T*group, n) in t-major order
    for g in range(hkv):
        qg = qa[:, g].reshape(T * group, d)                                # rows (t, head in group)
        s = matmul(qg, kb[lo:n, g, :].T)
        s *= np.float32(scale)
        if softcap:
            s = np.tanh(s / np.float32(softcap)) * np.float32(softcap)
        if mask is not None:
            s[mask] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        res[:, g] = matmul(s, vb[lo:n, g, :]).reshape(T, group, d)
    return res.reshape(T, hq, d)


KERNELS = {
    "rms_norm": _rms_norm,
    "rope": _rope,
    "attention_cached": _attention_cached,
}
