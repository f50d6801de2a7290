"""Pure-Python kernels of the language-model ops (``ember.ops.llm``): the specification the
wasm, numpy and WebGPU kernels are tested against.

``attention_cached`` is the one kernel in this backend that writes into an input: the key/value
caches are state that the caller owns and every decoding step extends (see ``ember.ops.llm``)."""
from __future__ import annotations

import math
from array import array

from ..ops.llm import check_pos

try:
    from math import sumprod as _dot
except ImportError:  # pragma: no cover - Python 3.11
    import operator

    def _dot(a, b, _mul=operator.mul):
        return sum(map(_mul, a, b))


def _rms_norm(out, x, w, *, eps):
    n = x.shape[-1]
    buf, wv = x._buf, w._buf.tolist()
    res = array("f")
    for r in range(len(buf) // n if n else 0):
        row = buf[r * n:(r + 1) * n].tolist()
        inv = 1.0 / math.sqrt(_dot(row, row) / n + eps)
        res.extend([v * inv * g for v, g in zip(row, wv)])
    return res


def _rope(out, x, cos, sin, *, mode):
    T, H, D = x.shape
    half = D // 2
    buf, cb, sb = x._buf, cos._buf, sin._buf
    res = array("f", bytes(4 * len(buf)))
    for t in range(T):
        c = cb[t * half:(t + 1) * half].tolist()
        s = sb[t * half:(t + 1) * half].tolist()
        for h in range(H):
            base = (t * H + h) * D
            for i in range(half):
                if mode == "pairs":
                    a, b = base + 2 * i, base + 2 * i + 1
                else:
                    a, b = base + i, base + i + half
                x0, x1 = buf[a], buf[b]
                res[a] = x0 * c[i] - x1 * s[i]
                res[b] = x0 * s[i] + x1 * c[i]
    return res


def _attention_cached(out, q, k, v, kc, vc, pos, *, scale, window=0, softcap=0.0):
    T, hq, d = q.shape
    C, hkv, _ = kc.shape
    p0 = int(pos._buf[0])
    check_pos(p0, T, C)
    row = hkv * d
    # the write: rows pos .. pos+T-1 of both caches, in place
    kc._buf[p0 * row:(p0 + T) * row] = k._buf[:T * row]
    vc._buf[p0 * row:(p0 + T) * row] = v._buf[:T * row]
    group = hq // hkv
    kb, vb, qb = kc._buf, vc._buf, q._buf
    res = array("f", bytes(4 * len(qb)))
    for t in range(T):
        n = p0 + t + 1
        lo = max(0, n - window) if window else 0          # a sliding window: the last `window` rows
        for h in range(hq):
            g = h // group
            qv = qb[(t * hq + h) * d:(t * hq + h + 1) * d].tolist()
            scores = [_dot(qv, kb[(j * hkv + g) * d:(j * hkv + g + 1) * d].tolist()) * scale for j in range(lo, n)]
            if softcap:
                scores = [softcap * math.tanh(s / softcap) for s in scores]
            m = max(scores)
            e = [math.exp(s - m) for s in scores]
            z = sum(e)
            acc = [0.0] * d
            for j in range(lo, n):
                wj = e[j - lo] / z
                vj = vb[(j * hkv + g) * d:(j * hkv + g + 1) * d]
                acc = [a + wj * b for a, b in zip(acc, vj)]
            res[(t * hq + h) * d:(t * hq + h + 1) * d] = array("f", acc)
    return res


KERNELS = {
    "rms_norm": _rms_norm,
    "rope": _rope,
    "attention_cached": _attention_cached,
}
