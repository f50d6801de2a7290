"""Layers with PyTorch's constructor signatures, parameter names and shapes.

Parameters require grad and are initialised as PyTorch does (``reset_parameters`` with
``ember.nn.init``: ``kaiming_uniform_(a=sqrt(5))`` weights and +-1/sqrt(fan_in) biases for Linear
and convolutions, N(0, 1) for Embedding, ones and zeros for the norms) from one seeded generator
(``ember.manual_seed``).

>>> import ember
>>> from ember import nn
>>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
>>> net
Sequential(
  (0): Linear(in_features=4, out_features=3, bias=True)
  (1): ReLU()
  (2): Linear(in_features=3, out_features=2, bias=True)
)
>>> [k for k in net.state_dict()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> net(ember.ones((5, 4))).shape
(5, 2)
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from math import prod

import ember

from .. import dtypes as _dt
from .. import random as _random
from ..backends import default_device
from ..errors import ShapeError, UnsupportedOp
from ..tensor import Tensor
from . import init
from .module import Module, Parameter

__all__ = ["manual_seed", "Identity", "Linear", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "Embedding", "Dropout", "ReLU", "ReLU6", "Hardtanh", "GELU", "SiLU",
           "Sigmoid", "Tanh", "Softmax", "Flatten", "Sequential", "ModuleList"]

# ---- initialisation -------------------------------------------------------------------------------

def manual_seed(seed: int) -> None:
    """Reseed ember's generator (the one ``ember.manual_seed`` reseeds), which initialises new
    layers' parameters.

    >>> from ember import nn
    >>> nn.manual_seed(3); a = nn.Linear(2, 2).weight.tolist()
    >>> nn.manual_seed(3); a == nn.Linear(2, 2).weight.tolist()
    True
    """
    _random.manual_seed(seed)


def _param(shape: tuple, device, dtype, fill: float = 0.0) -> Tensor:
    """A trainable parameter of ``shape`` (filled with ``fill``; reset_parameters draws it)."""
    return Parameter(ember.full(shape, fill, dtype=dtype, device=device))


def _full(shape: tuple, value, device, dtype) -> Tensor:
    return ember.full(shape, value, dtype=dtype, device=device)


def _float_dtype(dtype):
    dt = _dt.get(dtype) if dtype is not None else _dt.default_float
    if dt.kind != "f":
        raise TypeError(f"layer parameters must be a floating-point dtype, not {dt.name}")
    return dt


def _pair(v, name: str) -> tuple:
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
    return v


# ---- layers with parameters ---------------------------------------------------------------------

def _reset_fan_in(weight, bias) -> None:
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = init._calculate_fan_in_and_fan_out(weight)[0] if weight.ndim >= 2 else 0
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        init.uniform_(bias, -bound, bound)


class Identity(Module):
    """Returns its input (a placeholder layer, as in PyTorch)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    """``y = x @ weight.T + bias``; ``weight`` is ``(out_features, in_features)``.

    >>> import ember
    >>> from ember import nn
    >>> fc = nn.Linear(3, 2)
    >>> fc.weight.shape, fc.bias.shape, fc(ember.ones((4, 3))).shape
    ((2, 3), (2,), (4, 2))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: str | None = None,
                 dtype=None) -> None:
        super().__init__()
        dt, dev = _float_dtype(dtype), device or default_device()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param((out_features, in_features), dev, dt)
        if bias:
            self.bias = _param((out_features,), dev, dt)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming_uniform_(a=sqrt(5)) weight, bias uniform in +-1/sqrt(fan_in)."""
        _reset_fan_in(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return ember.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


_PAD_MODES = {"zeros": None, "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


class _ConvNd(Module):
    def _check(self, name, in_channels, out_channels, groups, padding_mode):
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                             f"divisible by groups ({groups})")
        if padding_mode not in _PAD_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {', '.join(_PAD_MODES)}, got {padding_mode!r}")

    def _init(self, wshape, fan_in, bias, device, dtype):
        dt, dev = _float_dtype(dtype), device or default_device()
        self.weight = _param(wshape, dev, dt)
        if bias:
            self.bias = _param((self.out_channels,), dev, dt)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming_uniform_(a=sqrt(5)) weight, bias uniform in +-1/sqrt(fan_in)."""
        _reset_fan_in(self.weight, self.bias)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if getattr(self, "output_padding", (0, 0)) != (0, 0):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv2d(_ConvNd):
    """2-D convolution of NCHW input; ``weight`` is ``(out_channels, in_channels // groups, kh, kw)``.

    ``padding`` is an int, a pair, ``"valid"`` or ``"same"``; ``padding_mode`` ``"zeros"``,
    ``"reflect"``, ``"replicate"`` or ``"circular"`` as in PyTorch.

    >>> import ember
    >>> from ember import nn
    >>> conv = nn.Conv2d(3, 8, 3, padding=1)
    >>> conv.weight.shape, conv(ember.ones((1, 3, 5, 5))).shape
    ((8, 3, 3, 3), (1, 8, 5, 5))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device: str | None = None,
                 dtype=None) -> None:
        super().__init__()
        self._check("Conv2d", in_channels, out_channels, groups, padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Conv2d: padding must be 'same', 'valid', an int or a pair, got {padding!r}")
            if padding == "same" and self.stride != (1, 1):
                raise ValueError("Conv2d: padding='same' needs stride 1 (as in PyTorch)")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding")
        self.padding_mode = padding_mode
        kh, kw = self.kernel_size
        self._init((out_channels, in_channels // groups, kh, kw), in_channels // groups * kh * kw, bias, device, dtype)

    def _explicit_padding(self):
        """((top, bottom), (left, right)) for the non-zero padding modes."""
        if self.padding == "valid":
            return ((0, 0), (0, 0))
        if self.padding == "same":
            out = []
            for k, d in zip(self.kernel_size, self.dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return tuple(out)
        return tuple((p, p) for p in self.padding)

    def forward(self, x: Tensor) -> Tensor:
        mode = _PAD_MODES[self.padding_mode]
        if mode is None:
            return ember.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                                dilation=self.dilation, groups=self.groups)
        pads = self._explicit_padding()
        x = ember.pad(x, ((0, 0),) * (x.ndim - 2) + pads, mode=mode)
        return ember.conv2d(x, self.weight, self.bias, stride=self.stride, padding=0,
                            dilation=self.dilation, groups=self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-D convolution; ``weight`` is ``(in_channels, out_channels // groups, kh, kw)``.

    >>> import ember
    >>> from ember import nn
    >>> up = nn.ConvTranspose2d(4, 2, 2, stride=2)
    >>> up.weight.shape, up(ember.ones((1, 4, 3, 3))).shape
    ((4, 2, 2, 2), (1, 2, 6, 6))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros",
                 device: str | None = None, dtype=None) -> None:
        super().__init__()
        self._check("ConvTranspose2d", in_channels, out_channels, groups, padding_mode)
        if padding_mode != "zeros":
            raise ValueError('ConvTranspose2d: only padding_mode="zeros" is supported (as in PyTorch)')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.output_padding = _pair(output_padding, "output_padding")
        self.dilation = _pair(dilation, "dilation")
        self.padding_mode = padding_mode
        kh, kw = self.kernel_size
        # PyTorch computes fan_in from weight.shape[1]: out_channels // groups * kh * kw
        self._init((in_channels, out_channels // groups, kh, kw), out_channels // groups * kh * kw, bias,
                   device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ember.conv_transpose2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                                      output_padding=self.output_padding, groups=self.groups,
                                      dilation=self.dilation)


class BatchNorm2d(Module):
    """Batch normalisation of NCHW input. In training mode it normalises with the batch's
    statistics and updates the buffers ``running_mean`` / ``running_var`` (unbiased) with
    ``momentum`` (None: a cumulative average) and ``num_batches_tracked`` (int64, 0-d), as
    PyTorch; in eval mode it uses the running statistics. With ``track_running_stats=False``
    the batch's own statistics are always used. ``bias`` (keyword-only) is PyTorch 2.13's switch
    for the affine shift.

    >>> import ember
    >>> from ember import nn
    >>> bn = nn.BatchNorm2d(3)
    >>> list(bn.state_dict())
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: str | None = None, dtype=None, *,
                 bias: bool = True) -> None:
        super().__init__()
        dt, dev = _float_dtype(dtype), device or default_device()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = _param((num_features,), dev, dt, 1.0)
            if bias:
                self.bias = _param((num_features,), dev, dt, 0.0)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _full((num_features,), 0.0, dev, dt))
            self.register_buffer("running_var", _full((num_features,), 1.0, dev, dt))
            self.register_buffer("num_batches_tracked", _full((), 0, dev, _dt.int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    _NDIM = (4,)

    def forward(self, x: Tensor) -> Tensor:
        name = type(self).__name__
        if x.ndim not in self._NDIM:
            raise ShapeError(f"{name}: expected a {' or '.join(f'{n}-D' for n in self._NDIM)} input "
                             f"(N, C, ...), got shape {x.shape}")
        if x.shape[1] != self.num_features:
            raise ShapeError(f"{name}({self.num_features}): input has {x.shape[1]} channels (shape {x.shape})")
        if self.training or self.running_mean is None:
            # batch statistics (biased variance for normalising, as PyTorch), one fused gradient
            y, mean, var = ember.batch_norm_train(x, self.weight, self.bias, eps=self.eps)
            if self.training and self.running_mean is not None:
                self._update_running(mean, var, x.size // x.shape[1])
            return y
        return ember.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, eps=self.eps)

    def _update_running(self, mean, var, n):
        # in place (``_set_``), as PyTorch: a compiled training step replays the updates, and
        # whoever holds these buffers (a state_dict) sees the new statistics
        with ember.no_grad():
            self.num_batches_tracked._set_(self.num_batches_tracked + 1)
            m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked.item())
            unbiased = var * (n / (n - 1)) if n > 1 else var
            self.running_mean._set_((self.running_mean * (1.0 - m) + mean.detach() * m).astype(self.running_mean.dtype))
            self.running_var._set_((self.running_var * (1.0 - m) + unbiased.detach() * m).astype(self.running_var.dtype))

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(BatchNorm2d):
    """Batch normalisation of (N, C) or (N, C, L) input (see BatchNorm2d)."""

    _NDIM = (2, 3)


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` axes.

    >>> import ember
    >>> from ember import nn
    >>> ln = nn.LayerNorm(4)
    >>> [round(v, 4) for v in ln(ember.tensor([1.0, 2.0, 3.0, 4.0])).tolist()]
    [-1.3416, -0.4472, 0.4472, 1.3416]
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device: str | None = None, dtype=None) -> None:
        super().__init__()
        dt, dev = _float_dtype(dtype), device or default_device()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        if elementwise_affine:
            self.weight = _param(shape, dev, dt, 1.0)
            if bias:
                self.bias = _param(shape, dev, dt, 0.0)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        return ember.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices -> rows of ``weight`` ``(num_embeddings, embedding_dim)``.
    ``padding_idx``'s row starts at zero (as in PyTorch); ``max_norm`` is not supported.

    >>> import ember
    >>> from ember import nn
    >>> emb = nn.Embedding(10, 4, padding_idx=0)
    >>> emb(ember.tensor([[0, 3]])).shape, emb(ember.tensor([0])).tolist()
    ((1, 2, 4), [[0.0, 0.0, 0.0, 0.0]])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Tensor | None = None, _freeze: bool = False,
                 device: str | None = None, dtype=None) -> None:
        super().__init__()
        if max_norm is not None:
            raise UnsupportedOp("Embedding: max_norm (renormalising rows on lookup) is not supported")
        dt, dev = _float_dtype(dtype), device or default_device()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for {num_embeddings} rows")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        if _weight is not None:
            if _weight.shape != (num_embeddings, embedding_dim):
                raise ShapeError(f"Embedding: _weight has shape {_weight.shape}, expected "
                                 f"{(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)
            return
        self.weight = _param((num_embeddings, embedding_dim), dev, dt)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: N(0, 1), the padding_idx row zero."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with ember.no_grad():
                keep = ember.tensor([[i != self.padding_idx] for i in range(self.num_embeddings)],
                                    device=self.weight.device)
                self.weight._set_(ember.where(keep, self.weight, 0.0).astype(self.weight.dtype))

    def forward(self, indices: Tensor) -> Tensor:
        return ember.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


# ---- parameter-free layers ----------------------------------------------------------------------

class MaxPool2d(Module):
    """2-D max pooling (``stride`` defaults to ``kernel_size``); ``return_indices`` is not supported."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise UnsupportedOp("MaxPool2d: return_indices=True is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return ember.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, ceil_mode=self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """2-D average pooling (``stride`` defaults to ``kernel_size``); ``divisor_override`` is not supported."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        if divisor_override is not None:
            raise UnsupportedOp("AvgPool2d: divisor_override is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return ember.avg_pool2d(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
                                count_include_pad=self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average pooling to a fixed ``output_size`` (an int, or a pair whose ``None`` entries keep
    the input's size)."""

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        size = self.output_size
        if not isinstance(size, int):
            size = tuple(x.shape[-2 + i] if s is None else s for i, s in enumerate(size))
        return ember.adaptive_avg_pool2d(x, size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Dropout(Module):
    """In training mode, zero each element with probability ``p`` and scale the others by
    ``1 / (1 - p)`` (masks from ``ember.manual_seed``'s generator); the identity in eval mode."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be between 0 and 1, got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        from .functional import dropout
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class _Activation(Module):
    """An activation taking PyTorch's ``inplace`` flag (ignored: ember tensors are values)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Activation):
    """``max(x, 0)``."""

    def forward(self, x: Tensor) -> Tensor:
        return ember.relu(x)


class Hardtanh(_Activation):
    """``clip(x, min_val, max_val)`` (PyTorch's ``Hardtanh``; NaN stays NaN).

    >>> import ember
    >>> from ember import nn
    >>> nn.Hardtanh()(ember.tensor([-2.0, 0.5, 3.0])).tolist()
    [-1.0, 0.5, 1.0]
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        if not min_val <= max_val:
            raise ValueError(f"{type(self).__name__}: min_val ({min_val}) must not exceed max_val ({max_val})")
        self.min_val, self.max_val = float(min_val), float(max_val)

    def forward(self, x: Tensor) -> Tensor:
        return ember.clip(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        s = f"min_val={self.min_val}, max_val={self.max_val}"
        return s + (", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)``: MobileNet's and EfficientNet-Lite's activation.

    >>> import ember
    >>> from ember import nn
    >>> nn.ReLU6()(ember.tensor([-1.0, 3.0, 7.5])).tolist()
    [0.0, 3.0, 6.0]
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """GELU, exact (``approximate="none"``) or the tanh approximation (``"tanh"``)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return ember.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(_Activation):
    """``x * sigmoid(x)``."""

    def forward(self, x: Tensor) -> Tensor:
        return ember.silu(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))``."""

    def forward(self, x: Tensor) -> Tensor:
        return ember.sigmoid(x)


class Tanh(Module):
    """Hyperbolic tangent."""

    def forward(self, x: Tensor) -> Tensor:
        return ember.tanh(x)


class Softmax(Module):
    """Softmax along ``dim``. ``dim=None`` follows PyTorch's legacy rule (axis 0 for 0-, 1- and
    3-d input, else axis 1); pass ``dim`` explicitly."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        dim = self.dim if self.dim is not None else (0 if x.ndim in (0, 1, 3) else 1)
        return ember.softmax(x, axis=dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Flatten(Module):
    """Merge axes ``start_dim``..``end_dim`` into one (by default all but the batch axis)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return ember.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


# ---- containers -------------------------------------------------------------------------------------

class _Container(Module):
    """What Sequential and ModuleList share: children in order, len, iteration, item access."""

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def _name_at(self, idx: int) -> str:
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"{type(self).__name__}: index {idx} is out of range for {n} modules")
        return list(self._modules)[idx % n]

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self._slice(list(self._modules.items())[idx])
        return self._modules[self._name_at(idx)]

    def __setitem__(self, idx: int, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__}: can only hold Modules, not {type(module).__name__}")
        self._modules[self._name_at(idx)] = module  # in place: keeps the order

    def append(self, module: Module):
        self.add_module(str(len(self)), module)
        return self


class Sequential(_Container):
    """Modules applied in order. Children are named ``"0"``, ``"1"``... (or by the keys of an
    OrderedDict), so their parameters are ``0.weight``, ``1.bias``... as in PyTorch. Indexing
    gives a module; slicing gives a Sequential (keeping the names).

    >>> from ember import nn
    >>> seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> len(seq), type(seq[-1]).__name__, len(seq[:1])
    (2, 'ReLU', 1)
    """

    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (dict, OrderedDict)):
            for name, m in args[0].items():
                self.add_module(str(name), m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def _slice(self, items):
        return Sequential(OrderedDict(items))

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Container):
    """A list of modules, registered as children ``"0"``, ``"1"``... (no forward of its own).

    >>> from ember import nn
    >>> blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    >>> len(blocks), [k for k in blocks.state_dict()][:2]
    (3, ['0.weight', '0.bias'])
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _slice(self, items):
        return ModuleList(m for _, m in items)

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        self.extend(mods)
