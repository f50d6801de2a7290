"""Loss ops with a fused gradient: ``cross_entropy`` (log_softmax + negative log likelihood,
with class weights, ``ignore_index`` and label smoothing, as PyTorch's ``F.cross_entropy``).

The gradient rule does not go back through log_softmax: d loss / d logits is
``(softmax(x) * sum(q) - q) / denominator`` with ``q`` the per-class target weights, one pass.
The other losses (``ember.nn.functional``) are short compositions of differentiable ops.

>>> import ember
>>> x = ember.tensor([[2.0, 0.0, -1.0]])
>>> round(ember.cross_entropy(x, ember.tensor([0])).item(), 4)
0.1698
"""
from __future__ import annotations

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError
from ..registry import apply, op

__all__ = ["cross_entropy"]

REDUCTIONS = ("mean", "sum", "none")


def _o():
    from .. import ops
    return ops


def _ce_shape(xs, ts, ws=None, *, reduction, probs, **_):
    if len(xs) < 1:
        raise ShapeError("cross_entropy: input must have a class axis")
    c = xs[1] if len(xs) > 1 else xs[0]
    want = tuple(xs) if probs else ((tuple(xs[:1]) + tuple(xs[2:])) if len(xs) > 1 else ())
    if tuple(ts) != want:
        what = "probabilities of the input's shape" if probs else "class indices"
        raise ShapeError(f"cross_entropy: target {tuple(ts)} does not match input {tuple(xs)} (expected {what} "
                         f"of shape {want})")
    if ws is not None and tuple(ws) != (c,):
        raise ShapeError(f"cross_entropy: weight must have shape ({c},), got {tuple(ws)}")
    if reduction == "none":
        return want if not probs else ((tuple(xs[:1]) + tuple(xs[2:])) if len(xs) > 1 else ())
    return ()


def _ce_dtype(xt, tt, wt=None, *, probs, **_):
    if xt.kind != "f":
        raise DTypeError(f"cross_entropy: input must be floating point, got {xt.name}")
    if probs and tt.kind != "f":
        raise DTypeError(f"cross_entropy: probability targets must be floating point, got {tt.name}")
    if not probs and tt.kind not in "iu":
        raise DTypeError(f"cross_entropy: class targets must be integers, got {tt.name}")
    return xt


def _classes_last(x):
    """(N, C, d1...) -> (M, C) with the class axis last; 1-D (C,) -> (1, C)."""
    o = _o()
    if x.ndim == 1:
        return o.reshape(x, (1, x.shape[0]))
    if x.ndim > 2:
        x = o.permute_dims(x, (0,) + tuple(range(2, x.ndim)) + (1,))
    return o.reshape(x, (-1, x.shape[-1]))


def _targets(x2, t, w, ignore_index, label_smoothing, probs):
    """The per-class coefficients q (M, C) with loss_i = -sum_c q_ic log p_ic, and the
    denominator of reduction='mean' (a 0-d tensor)."""
    o = _o()
    m, c = x2.shape
    eps = label_smoothing
    if probs:
        q = _classes_last(t).astype(x2.dtype)
        if eps:
            q = o.add(o.multiply(q, 1.0 - eps), eps / c)
        if w is not None:
            q = o.multiply(q, o.reshape(w, (1, c)))
        return q, o.full((), float(m), dtype=x2.dtype, device=x2.device)
    t1 = o.reshape(t, (m,))
    valid = o.not_equal(t1, ignore_index)
    ts = o.where(valid, t1, 0)
    onehot = o.equal(o.reshape(ts, (m, 1)), o.reshape(o.arange(c, device=x2.device), (1, c))).astype(x2.dtype)
    vw = valid.astype(x2.dtype)                                          # (M,)
    if w is not None:
        vw = o.multiply(vw, o.take(w, ts, axis=0))
    q = o.multiply(onehot, o.reshape(vw, (m, 1)))
    if eps:
        smooth = valid.astype(x2.dtype)
        smooth = o.reshape(smooth, (m, 1))
        if w is not None:
            smooth = o.multiply(smooth, o.reshape(w, (1, c)))
        q = o.add(o.multiply(q, 1.0 - eps), o.multiply(smooth, eps / c))
    return q, o.sum(vw)


def _per_sample_shape(x):
    return (tuple(x.shape[:1]) + tuple(x.shape[2:])) if x.ndim > 1 else ()


def _dec_ce(x, t, w=None, *, reduction, ignore_index, label_smoothing, probs):
    o = _o()
    x2 = _classes_last(x)
    q, denom = _targets(x2, t, w, ignore_index, label_smoothing, probs)
    loss = o.negative(o.sum(o.multiply(q, o.log_softmax(x2, axis=1)), axis=1))     # (M,)
    if reduction == "none":
        return o.reshape(loss, _per_sample_shape(x))
    total = o.sum(loss)
    return total if reduction == "sum" else o.divide(total, denom)


def _ce_grad(g, y, x, t, w=None, *, need, reduction, ignore_index, label_smoothing, probs):
    if not need[0]:
        return (None,) * (2 if w is None else 3)
    inputs = (g, x, t) if w is None else (g, x, t, w)
    gx = apply("cross_entropy_backward", *inputs, reduction=reduction, ignore_index=ignore_index,
               label_smoothing=label_smoothing, probs=probs)
    return (gx, None) if w is None else (gx, None, None)


def _dec_ce_backward(g, x, t, w=None, *, reduction, ignore_index, label_smoothing, probs):
    """d loss / d logits as ops (the decomposition of ``cross_entropy_backward``; the numpy
    backend has one kernel for it)."""
    o = _o()
    x2 = _classes_last(x)
    q, denom = _targets(x2, t, w, ignore_index, label_smoothing, probs)
    d = o.subtract(o.multiply(o.softmax(x2, axis=1), o.sum(q, axis=1, keepdims=True)), q)   # (M, C)
    if reduction == "none":
        gs = o.reshape(g, (x2.shape[0], 1))
    elif reduction == "sum":
        gs = g
    else:
        gs = o.divide(g, denom)
    gx = o.multiply(d, gs)
    if x.ndim == 1:
        gx = o.reshape(gx, x.shape)
    elif x.ndim > 2:
        n, c = x.shape[0], x.shape[1]
        gx = o.reshape(gx, (n,) + tuple(x.shape[2:]) + (c,))
        gx = o.permute_dims(gx, (0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))
    return gx


op("cross_entropy", kind="composite", shape=_ce_shape, dtype=_ce_dtype, decompose=_dec_ce, grad=_ce_grad,
   doc="softmax cross entropy over axis 1 with class indices or probabilities (PyTorch F.cross_entropy)")
op("cross_entropy_backward", kind="composite", shape=lambda gs, xs, ts, ws=None, **_: tuple(xs),
   dtype=lambda gt, xt, tt, wt=None, **_: xt, decompose=_dec_ce_backward,
   doc="the gradient of cross_entropy with respect to the logits (inputs: output gradient, input, target, "
       "[weight])")


def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    """Cross entropy between logits ``input`` (``(N, C)``, ``(N, C, d1, ...)`` or ``(C,)``) and
    ``target``: class indices (``(N,)`` / ``(N, d1, ...)``, ints; ``ignore_index`` entries count
    for nothing) or class probabilities (the input's shape, floats). ``weight`` rescales each
    class; ``label_smoothing`` mixes the target with the uniform distribution; ``reduction``
    'mean' (divided by the summed weights of the counted targets, as PyTorch), 'sum' or 'none'.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    from ..tensor import Tensor, tensor
    if not isinstance(target, Tensor):
        target = tensor(target, device=input.device)
    probs = target.dtype.kind == "f"
    if target.dtype is _dt.bool_:
        raise DTypeError("cross_entropy: target must hold class indices (ints) or probabilities (floats)")
    inputs = (input, target) if weight is None else (input, target, weight)
    return apply("cross_entropy", *inputs, reduction=reduction, ignore_index=int(ignore_index),
                 label_smoothing=float(label_smoothing), probs=probs)
