"""``ember.nn.utils``: gradient clipping, parameters as one vector.

>>> import ember
>>> from ember import nn
>>> w = ember.tensor([3.0, 4.0], requires_grad=True)
>>> (w * 1.0).sum().backward()
>>> round(nn.utils.clip_grad_norm_([w], 1.0).item(), 4), [round(v, 4) for v in w.grad.tolist()]
(1.4142, [0.7071, 0.7071])
"""
from __future__ import annotations

import math

import ember

from ..tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "parameters_to_vector",
           "vector_to_parameters"]


def _params(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False):
    """The ``norm_type`` norm of all ``tensors`` together (a 0-d tensor)."""
    tensors = [t for t in _params(tensors) if t is not None]
    if not tensors:
        return ember.tensor(0.0)
    with ember.no_grad():
        if norm_type == math.inf:
            norms = [ember.abs(t).max().astype("float32") for t in tensors]
            total = norms[0]
            for n in norms[1:]:
                total = ember.maximum(total, n.to(total.device))
        else:
            p = float(norm_type)
            parts = [(ember.abs(t).astype("float32") ** p).sum() for t in tensors]
            total = parts[0]
            for n in parts[1:]:
                total = total + n.to(total.device)
            total = total ** (1.0 / p)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite; pass "
                           f"error_if_nonfinite=False to clip anyway")
    return total


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    """Scale the gradients of ``parameters`` so that their joint norm is at most ``max_norm``
    (PyTorch's rule: factor ``min(1, max_norm / (norm + 1e-6))``); returns the norm before
    clipping. The gradients are replaced by new tensors (tensors are immutable)."""
    params = [p for p in _params(parameters) if p.grad is not None]
    total = get_total_norm([p.grad for p in params], norm_type, error_if_nonfinite)
    if not params:
        return total
    with ember.no_grad():
        coef = ember.clip(max_norm / (total + 1e-6), None, 1.0)
        for p in params:
            p.grad = p.grad * coef.to(p.grad.device).astype(p.grad.dtype)
    return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient to [-clip_value, clip_value]."""
    with ember.no_grad():
        for p in _params(parameters):
            if p.grad is not None:
                p.grad = ember.clip(p.grad, -clip_value, clip_value)


def parameters_to_vector(parameters):
    """All parameters flattened into one 1-D tensor."""
    return ember.concat([p.reshape(-1) for p in _params(parameters)])


def vector_to_parameters(vec, parameters) -> None:
    """Copy the slices of ``vec`` into ``parameters`` (in place)."""
    start = 0
    with ember.no_grad():
        for p in _params(parameters):
            n = p.size
            p.copy_(vec[start:start + n].reshape(p.shape))
            start += n
