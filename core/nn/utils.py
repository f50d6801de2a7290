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
           "vector_to_parameters", "fuse_conv_bn_eval", "skip_init"]


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


def fuse_conv_bn_eval(conv, bn):
    """A copy of ``conv`` (a Conv2d, or a subclass such as ``Conv2dSame``) that computes
    ``bn(conv(x))`` with ``bn`` in eval mode, as ``torch.nn.utils.fusion.fuse_conv_bn_eval``:
    per output channel ``s = gamma / sqrt(running_var + eps)``, weight ``w * s``, bias
    ``(b - running_mean) * s + beta``. One pass over the output instead of two at inference.
    ``conv`` and ``bn`` are left as they are.

    >>> import ember
    >>> from ember import nn
    >>> conv, bn = nn.Conv2d(2, 3, 3, bias=False), nn.BatchNorm2d(3).eval()
    >>> fused = nn.utils.fuse_conv_bn_eval(conv, bn)
    >>> x = ember.ones((1, 2, 5, 5))
    >>> fused.bias is not None, abs(fused(x) - bn(conv(x))).max().item() < 1e-5
    (True, True)
    """
    from collections import OrderedDict

    from .module import Parameter

    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fuse_conv_bn_eval: the BatchNorm has no running statistics "
                         "(track_running_stats=False normalises with each batch's own)")
    o = conv.weight.shape[0]
    if bn.num_features != o:
        raise ValueError(f"fuse_conv_bn_eval: the convolution has {o} output channels, the BatchNorm "
                         f"{bn.num_features}")
    fused = object.__new__(type(conv))
    fused.__dict__.update(conv.__dict__)
    for slot in ("_parameters", "_buffers", "_modules"):
        fused.__dict__[slot] = OrderedDict(conv.__dict__[slot])
    with ember.no_grad():
        scale = (bn.running_var + bn.eps).sqrt()
        scale = bn.weight / scale if bn.weight is not None else 1.0 / scale                 # (O,)
        shift = bn.bias if bn.bias is not None else ember.zeros_like(scale)
        bias = conv.bias if conv.bias is not None else ember.zeros_like(scale)
        weight = conv.weight * scale.reshape((o,) + (1,) * (conv.weight.ndim - 1))         # (O, C/g, kh, kw)
        bias = (bias - bn.running_mean) * scale + shift                                   # (O,)
    fused.register_parameter("weight", Parameter(weight.astype(conv.weight.dtype), conv.weight.requires_grad))
    fused.register_parameter("bias", Parameter(bias.astype(conv.weight.dtype), conv.weight.requires_grad))
    return fused


def skip_init(module_cls, *args, **kwargs):
    """``module_cls(*args, **kwargs)`` without drawing its random initial weights, as
    ``torch.nn.utils.skip_init``: for a model whose weights are loaded right after (building
    EfficientNet-Lite0 takes seconds of pure-Python random numbers otherwise). Parameters keep
    their constructor's fill (zeros; ones for norm weights) until loaded.

    >>> from ember import nn
    >>> nn.utils.skip_init(nn.Linear, 3, 2).weight.tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    from . import init

    saved, init._SKIP[0] = init._SKIP[0], True
    try:
        return module_cls(*args, **kwargs)
    finally:
        init._SKIP[0] = saved
