"""Fused optimizer steps on the numpy backend: one parameter's whole update in a few numpy calls.

``ember.optim`` calls ``sgd_step`` / ``adam_step`` for a numpy parameter (outside plan capture)
instead of its reference ``_update``, which runs a dozen registry ops per parameter and creates
a tensor for every Python scalar: on a small model that per-op overhead is most of the
optimizer's time. The arithmetic here is the reference rule of ``core/optim/optimizer.py`` op
for op, in the parameter's dtype, with the hyperparameters rounded to that dtype as the ops do
(``x * 0.9`` multiplies by ``float32(0.9)``), so the results are bit-identical to the
reference ops (IEEE +, -, *, / and sqrt are correctly rounded; a + b == b + a).

Tensors keep their value semantics: nothing that existed before the call is written to. The
new parameter value and the new state tensors are new arrays; the in-place ufuncs below only
ever write into arrays created in the same function. The functions return None (the caller
then runs the reference ops) where this does not apply: float16 (which the reference computes
op by op in float32 and rounds back after each op), a gradient of another dtype or shape, state
on another device or of another dtype (loaded from elsewhere), a partial state.
"""
from __future__ import annotations

import math

import numpy as np

_DTYPES = {"float32": np.float32, "float64": np.float64}


def _arrays(p, g):
    """(parameter array, gradient array, numpy scalar type), or None when not fused."""
    if p.device != "numpy" or g.device != "numpy" or p.dtype is not g.dtype or g.shape != p.shape:
        return None
    t = _DTYPES.get(p.dtype.name)
    if t is None:
        return None
    P, G = p._buf, g._buf
    if P.dtype != t or G.dtype != t:
        return None
    # 1-D views: ufuncs on 0-d arrays return scalars, not arrays
    return P.reshape(-1), G.reshape(-1), t


def _state_array(v, p, t):
    """The array of state tensor ``v`` when it is a numpy tensor like ``p``, else None."""
    from ..tensor import Tensor

    if not isinstance(v, Tensor) or v.device != "numpy" or v.dtype is not p.dtype or v.shape != p.shape:
        return None
    a = v._buf
    return a.reshape(-1) if a.dtype == t else None


def _wrap(a, like):
    from ..tensor import Tensor

    return Tensor._wrap(a.reshape(like.shape), like.shape, like.dtype, "numpy")


def sgd_step(p, g, state: dict, group: dict):
    """The reference SGD update of ``p`` (momentum, dampening, Nesterov, coupled weight decay,
    maximize) in numpy; updates ``state``; the new parameter value, or None (not fused)."""
    got = _arrays(p, g)
    if got is None:
        return None
    P, G, t = got
    mom = group["momentum"]
    buf = state.get("momentum_buffer") if mom else None
    B = None
    if buf is not None:
        B = _state_array(buf, p, t)
        if B is None:
            return None
    with np.errstate(all="ignore"):
        if group["maximize"]:
            G = np.negative(G)
        wd = group["weight_decay"]
        if wd:
            gw = np.multiply(P, t(wd))
            gw += G                                          # g + p * wd
            G = gw
        if mom:
            if B is None:
                B = G                                        # buf = g (the reference's first step)
            else:
                nb = np.multiply(G, t(1.0 - group["dampening"]))
                B2 = np.multiply(B, t(mom))
                B2 += nb                                     # buf * mom + g * (1 - dampening)
                B = B2
            state["momentum_buffer"] = _wrap(B, p)
            if group["nesterov"]:
                d = np.multiply(B, t(mom))
                d += G                                       # g + buf * mom
                G = d
            else:
                G = B
        d = np.multiply(G, t(group["lr"]))
        np.subtract(P, d, out=d)                             # p - g * lr
    return _wrap(d, p)


def adam_step(p, g, state: dict, group: dict):
    """The reference Adam / AdamW update of ``p`` (amsgrad, coupled or decoupled weight decay,
    maximize) in numpy; updates ``state`` (``"step"`` included); the new parameter value, or
    None (not fused)."""
    got = _arrays(p, g)
    if got is None:
        return None
    P, G, t = got
    ams = bool(group["amsgrad"])
    keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if ams else ())
    if state:
        if not isinstance(state.get("step"), (int, float)) or not all(k in state for k in keys):
            return None          # (a step count held as a tensor: the reference ops handle it)
        M, V = (_state_array(state[k], p, t) for k in keys[:2])
        MX = _state_array(state["max_exp_avg_sq"], p, t) if ams else None
        if M is None or V is None or (ams and MX is None):
            return None
    else:
        M = V = np.zeros(P.shape, t)
        MX = V if ams else None
        state["step"] = 0.0
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    with np.errstate(all="ignore"):
        if group["maximize"]:
            G = np.negative(G)
        if wd:
            if group["decoupled_weight_decay"]:
                P = np.multiply(P, t(1.0 - lr * wd))
            else:
                gw = np.multiply(P, t(wd))
                gw += G                                      # g + p * wd
                G = gw
        m = np.subtract(G, M)
        m *= t(1.0 - b1)
        m += M                                               # m + (g - m) * (1 - b1): torch's lerp_
        v = np.multiply(G, G)
        v *= t(1.0 - b2)
        vb = np.multiply(V, t(b2))
        v += vb                                              # v * b2 + g * g * (1 - b2)
        state["exp_avg"], state["exp_avg_sq"] = _wrap(m, p), _wrap(v, p)
        state["step"] += 1.0
        n = state["step"]
        step_size = lr / (1.0 - b1 ** n)
        bc2_sqrt = math.sqrt(1.0 - b2 ** n)
        if ams:
            v = np.maximum(MX, v)
            state["max_exp_avg_sq"] = _wrap(v, p)
        den = np.sqrt(v)
        den /= t(bc2_sqrt)
        den += t(eps)                                        # sqrt(v) / sqrt(1 - b2**t) + eps
        np.divide(m, den, out=den)
        den *= t(step_size)
        np.subtract(P, den, out=den)                         # p - m / denom * step_size
    return _wrap(den, p)
