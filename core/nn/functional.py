"""``ember.nn.functional``: PyTorch's functional names over ember's ops, plus dropout and the
losses. Every loss takes ``reduction='mean' | 'sum' | 'none'`` and PyTorch's other arguments.

>>> import ember
>>> import ember.nn.functional as F
>>> x = ember.tensor([[1.0, 2.0], [0.5, -1.0]], requires_grad=True)
>>> loss = F.cross_entropy(x, ember.tensor([1, 0]))
>>> loss.backward()
>>> [round(v, 4) for v in x.grad[0].tolist()]
[0.1345, -0.1345]
"""
from __future__ import annotations

import ember

from .. import random as _random
from ..errors import ShapeError
from ..ops import (adaptive_avg_pool2d, avg_pool2d, conv2d, conv_transpose2d, cross_entropy, embedding,  # noqa: F401
                   gelu, leaky_relu, linear, max_pool2d, relu, scaled_dot_product_attention, sigmoid, silu, tanh)
from ..ops.losses import REDUCTIONS
from ..tensor import Tensor

__all__ = ["relu", "relu6", "hardtanh", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "linear", "conv2d",
           "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "embedding", "layer_norm",
           "batch_norm", "scaled_dot_product_attention", "pad", "dropout", "one_hot", "cross_entropy", "nll_loss",
           "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div"]


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    """``clip(input, min_val, max_val)`` (``inplace`` is accepted and ignored: tensors are values)."""
    if not min_val <= max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return ember.clip(input, float(min_val), float(max_val))


def relu6(input, inplace: bool = False):
    """``min(max(input, 0), 6)``."""
    return ember.clip(input, 0.0, 6.0)


def softmax(input, dim: int = -1, axis: int | None = None):
    """Softmax along ``dim`` (PyTorch's name; ``axis`` works too)."""
    return ember.softmax(input, axis=dim if axis is None else axis)


def log_softmax(input, dim: int = -1, axis: int | None = None):
    """Log-softmax along ``dim`` (PyTorch's name; ``axis`` works too)."""
    return ember.log_softmax(input, axis=dim if axis is None else axis)


def pad(input, pad, mode: str = "constant", value: float = 0.0):
    """PyTorch's ``F.pad``: ``pad`` lists (before, after) pairs from the LAST axis backwards;
    modes constant, reflect, replicate, circular."""
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ShapeError(f"pad: {pad!r} must hold pairs for at most {input.ndim} axes")
    widths = [(0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        widths[input.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise ValueError(f"pad: mode must be one of {', '.join(modes)}, got {mode!r}")
    return ember.pad(input, widths, mode=modes[mode], value=value)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    return ember.layer_norm(input, normalized_shape, weight, bias, eps)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    """PyTorch's ``F.batch_norm``: with ``training`` the batch's statistics normalise ``input``
    (running statistics, when given, are not updated here: tensors are immutable; use
    ``nn.BatchNorm2d``)."""
    if training or running_mean is None:
        return ember.batch_norm_train(input, weight, bias, eps=eps)[0]
    return ember.batch_norm(input, running_mean, running_var, weight, bias, eps=eps)


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):
    """Zero elements with probability ``p`` and scale the rest by ``1 / (1 - p)`` when
    ``training`` (masks from ``ember.manual_seed``'s generator); the identity otherwise."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    keep = _random.bernoulli_mask(input.shape, 1.0 - p, input.device)
    return ember.where(keep, input * (1.0 / (1.0 - p)), 0.0)


def one_hot(tensor, num_classes: int = -1):
    """int64 one-hot rows of ``num_classes`` (default: max + 1) for an integer tensor."""
    if num_classes < 0:
        num_classes = int(tensor.max().item()) + 1
    classes = ember.arange(num_classes, device=tensor.device)
    return ember.equal(ember.expand_dims(tensor, -1), classes).astype(ember.int64)


def _reduce(loss, reduction, name):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_same(input, target, name):
    if not isinstance(target, Tensor):
        target = ember.tensor(target, dtype=input.dtype, device=input.device)
    if target.shape != input.shape:
        raise ShapeError(f"{name}: target shape {target.shape} differs from input shape {input.shape}")
    return target


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log likelihood of log-probabilities ``input`` (N, C, ...) at class ``target``;
    'mean' divides by the summed weights of the counted targets, as PyTorch."""
    if input.ndim == 1:
        input, target = ember.expand_dims(input, 0), ember.expand_dims(target, 0)
        squeeze = True
    else:
        squeeze = False
    valid = target != ignore_index
    safe = ember.where(valid, target, 0)
    picked = ember.squeeze(ember.take_along_axis(input, ember.expand_dims(safe, 1), axis=1), 1)
    w = valid.astype(input.dtype)
    if weight is not None:
        w = w * ember.take(weight, safe, axis=0)
    loss = -(picked * w)
    if reduction == "none":
        return ember.squeeze(loss, 0) if squeeze else loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / w.sum()
    raise ValueError(f"nll_loss: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def mse_loss(input, target, reduction: str = "mean"):
    """Mean squared error."""
    d = input - _check_same(input, target, "mse_loss")
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(input, target, reduction: str = "mean"):
    """Mean absolute error."""
    return _reduce(ember.abs(input - _check_same(input, target, "l1_loss")), reduction, "l1_loss")


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta."""
    d = ember.abs(input - _check_same(input, target, "smooth_l1_loss"))
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    loss = ember.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce(loss, reduction, "smooth_l1_loss")


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    d = ember.abs(input - _check_same(input, target, "huber_loss"))
    loss = ember.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta)
    return _reduce(loss, reduction, "huber_loss")


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean"):
    """BCE of probabilities ``input``; each log is clamped at -100, as PyTorch."""
    target = _check_same(input, target, "binary_cross_entropy")
    log_p = ember.clip(ember.log(input), -100.0, None)
    log_q = ember.clip(ember.log(1.0 - input), -100.0, None)
    loss = -(target * log_p + (1.0 - target) * log_q)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean", pos_weight=None):
    """BCE of ``sigmoid(input)`` computed stably from the logits:
    ``(1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0))``."""
    target = _check_same(input, target, "binary_cross_entropy_with_logits")
    softplus_neg = ember.log(ember.exp(-ember.abs(input)) + 1.0) + ember.relu(-input)   # log(1 + exp(-x))
    if pos_weight is not None:
        loss = (1.0 - target) * input + (1.0 + (pos_weight - 1.0) * target) * softplus_neg
    else:
        loss = (1.0 - target) * input + softplus_neg
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def kl_div(input, target, reduction: str = "mean", log_target: bool = False):
    """KL divergence with ``input`` as log-probabilities (PyTorch's argument order);
    ``reduction='batchmean'`` divides the sum by the batch size."""
    target = _check_same(input, target, "kl_div")
    if log_target:
        loss = ember.exp(target) * (target - input)
    else:
        loss = ember.where(target > 0, target * (ember.log(ember.where(target > 0, target, 1.0)) - input), 0.0)
    if reduction == "batchmean":
        return loss.sum() / (input.shape[0] if input.ndim else 1)
    return _reduce(loss, reduction, "kl_div")
