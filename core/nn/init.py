"""Parameter initialisation with PyTorch's names and formulas (``torch.nn.init``).

Each function fills ``tensor`` in place (its buffer is replaced; see ``Tensor._set_``) from
ember's seeded generator (``ember.manual_seed``) and returns it. The layers use these in
``reset_parameters``: Linear and Conv2d draw ``kaiming_uniform_(w, a=sqrt(5))`` (uniform in
+-1/sqrt(fan_in)) and a bias uniform in +-1/sqrt(fan_in); Embedding ``normal_(w)``; LayerNorm
and BatchNorm ones and zeros, as PyTorch does.

>>> import ember
>>> from ember import nn
>>> w = ember.zeros((3, 4))
>>> _ = nn.init.kaiming_uniform_(w, a=5 ** 0.5)
>>> float(ember.abs(w).max()) <= 0.5
True
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..autograd import no_grad
from ..random import uniform_bits

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
           "eye_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for ``nonlinearity`` (PyTorch's table)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.ndim < 2:
        raise ValueError(f"fan in and fan out need a tensor of at least 2 dimensions, got shape {tensor.shape}")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


# True inside ``nn.utils.skip_init``: the random fills leave their tensor as it is (drawing
# millions of numbers in pure Python is most of building a large model whose weights are loaded
# next anyway).
_SKIP = [False]


def _fill(tensor, value):
    with no_grad():
        if value.dtype is not tensor.dtype:
            value = value.astype(tensor.dtype)
        if value.device != tensor.device:
            value = value.to(tensor.device)
        return tensor._set_(value)


def _unit(tensor):
    """Uniform [1, 2) float32 of tensor's shape on its device (no recording)."""
    from ..tensor import from_bytes
    return from_bytes(uniform_bits(tensor.shape), tensor.shape, _dt.float32, device=tensor.device)


def uniform_(tensor, a: float = 0.0, b: float = 1.0):
    """Fill with values uniform in [a, b)."""
    if _SKIP[0]:
        return tensor
    with no_grad():
        return _fill(tensor, (_unit(tensor) - 1.5) * (b - a) + (a + b) / 2)


def normal_(tensor, mean: float = 0.0, std: float = 1.0):
    """Fill with values from N(mean, std^2)."""
    if _SKIP[0]:
        return tensor
    from ..random import randn
    with no_grad():
        return _fill(tensor, randn(tensor.shape, device=tensor.device) * std + mean)


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0):
    """Fill with N(mean, std^2) values truncated to [a, b] (inverse-CDF sampling, as PyTorch)."""
    if _SKIP[0]:
        return tensor
    with no_grad():
        def cdf(x):
            return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0
        lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
        u = (_unit(tensor) - 1.0) * (2 * hi - 2 * lo) + (2 * lo - 1)      # uniform in [2lo-1, 2hi-1)
        v = _erfinv(u.clip(-1 + 1e-7, 1 - 1e-7)) * (std * math.sqrt(2.0)) + mean
        return _fill(tensor, v.clip(a, b))


def _erfinv(y):
    # Giles' single-precision approximation, then two Newton steps on erf
    w = -((1.0 - y) * (1.0 + y)).log()
    small = w < 5.0
    ws = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p1 = ws * p1 + c
    wb = w.sqrt() - 3.0
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p2 = wb * p2 + c
    from ..ops import where
    x = where(small, p1, p2) * y
    for _ in range(2):
        x = x - (x.erf() - y) / ((-(x * x)).exp() * (2.0 / math.sqrt(math.pi)))
    return x


def constant_(tensor, val: float):
    """Fill with ``val``."""
    from ..ops import full
    with no_grad():
        return _fill(tensor, full(tensor.shape, val, dtype=tensor.dtype, device=tensor.device))


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    """Fill a 2-D tensor with the identity."""
    from ..ops import eye
    if tensor.ndim != 2:
        raise ValueError(f"eye_: needs a 2-D tensor, got shape {tensor.shape}")
    with no_grad():
        return _fill(tensor, eye(*tensor.shape, dtype=tensor.dtype, device=tensor.device))


def xavier_uniform_(tensor, gain: float = 1.0):
    """Glorot uniform: bound ``gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain: float = 1.0):
    """Glorot normal: std ``gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    """He uniform: bound ``gain * sqrt(3 / fan)``; ``a=sqrt(5)`` with the default leaky_relu
    gives PyTorch's Linear/Conv weight init, +-1/sqrt(fan_in)."""
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    """He normal: std ``gain / sqrt(fan)``."""
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))
