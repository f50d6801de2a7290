"""EfficientNet-Lite (Tan & Le 2019; the "Lite" variants of TensorFlow's model zoo) in one
readable file, with the PyTorch state_dict names of the common PyTorch port (``_conv_stem``,
``_bn0``, ``_blocks.N._depthwise_conv``..., ``_conv_head``, ``_bn1``, ``_fc``), so a checkpoint
of that port loads as it is::

    model = efficientnet_lite0()
    model.load_state_dict(ember.load_torch("efficientnet-lite0-57934424.pth"))

Lite differs from EfficientNet-B0 in what runs well on phones: ReLU6 instead of swish, no
squeeze-and-excitation, stem and head widths fixed. The weights come from TensorFlow, so every
convolution pads like TensorFlow's "SAME" (``Conv2dSame``: the odd pixel of padding goes
bottom/right) and BatchNorm's eps is TensorFlow's 1e-3.

Shapes for a 224x224 input: stem (B, 32, 112, 112) -> 16 MBConv blocks -> (B, 320, 7, 7) ->
head (B, 1280, 7, 7) -> average (B, 1280) -> logits (B, num_classes).

>>> import ember
>>> from ember.nn.efficientnet import MBConvBlock, EfficientNetLite
>>> block = MBConvBlock(8, 16, kernel=5, stride=2, expand=6).eval()
>>> [k for k in block.state_dict() if k.endswith("weight")]
['_expand_conv.weight', '_bn0.weight', '_depthwise_conv.weight', '_bn1.weight', '_project_conv.weight', '_bn2.weight']
>>> block(ember.zeros((1, 8, 9, 9))).shape
(1, 16, 5, 5)
>>> tiny = EfficientNetLite([(1, 3, 1, 1, 32, 16), (1, 3, 2, 6, 16, 24)], num_classes=5, head_channels=64)
>>> tiny.eval()(ember.zeros((2, 3, 32, 32))).shape
(2, 5)
"""
from __future__ import annotations

import math

import ember

from ..errors import ShapeError
from ..tensor import Tensor
from .layers import BatchNorm2d, Conv2d, Dropout, Identity, Linear, ModuleList, ReLU6
from .module import Module
from .utils import fuse_conv_bn_eval

__all__ = ["Conv2dSame", "MBConvBlock", "EfficientNetLite", "efficientnet_lite0", "LITE0_STAGES"]

# The seven stages of EfficientNet-B0 / Lite0: (repeats, kernel, stride, expand ratio, in, out).
# The first block of a stage has the stride and the channel change; the others keep both.
LITE0_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
                (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
TF_BN_EPS = 1e-3


class Conv2dSame(Conv2d):
    """``Conv2d`` padded like TensorFlow's ``padding="SAME"``: the output has ``ceil(size /
    stride)`` pixels and, when the padding is odd, the extra row/column goes bottom/right
    (PyTorch's ``padding="same"`` is symmetric and refuses strides). Any input size works; the
    padding is worked out per call. State-dict keys are Conv2d's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, groups: int = 1,
                 bias: bool = True, device: str | None = None, dtype=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0, groups=groups,
                         bias=bias, device=device, dtype=dtype)

    def pads(self, height: int, width: int) -> tuple:
        """``((top, bottom), (left, right))`` for an input of ``height`` x ``width``."""
        out = []
        for size, k, s, d in zip((height, width), self.kernel_size, self.stride, self.dilation):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            out.append((total // 2, total - total // 2))
        return tuple(out)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ShapeError(f"Conv2dSame: expected a 4-D input (N, C, H, W), got shape {x.shape}")
        return ember.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.pads(*x.shape[2:]),
                            dilation=self.dilation, groups=self.groups)


class MBConvBlock(Module):
    """Mobile inverted bottleneck (MobileNetV2): 1x1 expansion to ``in * expand`` channels
    (absent when ``expand == 1``), a depthwise ``kernel`` x ``kernel`` convolution with the
    block's stride, a linear 1x1 projection to ``out`` channels; BatchNorm after each, ReLU6
    after the first two; the input is added back when the shape is unchanged."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expand: int,
                 eps: float = TF_BN_EPS) -> None:
        super().__init__()
        mid = in_channels * expand
        if expand != 1:
            self._expand_conv = Conv2d(in_channels, mid, 1, bias=False)
            self._bn0 = BatchNorm2d(mid, eps=eps)
        self._depthwise_conv = Conv2dSame(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = BatchNorm2d(mid, eps=eps)
        self._project_conv = Conv2d(mid, out_channels, 1, bias=False)
        self._bn2 = BatchNorm2d(out_channels, eps=eps)
        self._act = ReLU6()
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        h = x
        if "_expand_conv" in self._modules:
            h = self._act(self._bn0(self._expand_conv(h)))        # (B, mid, H, W)
        h = self._act(self._bn1(self._depthwise_conv(h)))         # (B, mid, H/s, W/s)
        h = self._bn2(self._project_conv(h))                      # (B, out, H/s, W/s)
        return h + x if self.residual else h


class EfficientNetLite(Module):
    """Stem (3x3 stride-2 convolution to 32 channels), the MBConv ``stages``, a 1x1 head to
    ``head_channels``, global average pooling, dropout, a linear classifier. ``forward`` takes
    (B, 3, H, W) images normalised as at training time and returns (B, num_classes) logits."""

    def __init__(self, stages=LITE0_STAGES, num_classes: int = 1000, stem_channels: int = 32,
                 head_channels: int = 1280, dropout: float = 0.2, eps: float = TF_BN_EPS) -> None:
        super().__init__()
        self._conv_stem = Conv2dSame(3, stem_channels, 3, 2, bias=False)
        self._bn0 = BatchNorm2d(stem_channels, eps=eps)
        blocks = []
        for repeats, kernel, stride, expand, cin, cout in stages:
            for i in range(repeats):
                blocks.append(MBConvBlock(cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand, eps))
        self._blocks = ModuleList(blocks)
        self._conv_head = Conv2d(stages[-1][5], head_channels, 1, bias=False)
        self._bn1 = BatchNorm2d(head_channels, eps=eps)
        self._dropout = Dropout(dropout)
        self._fc = Linear(head_channels, num_classes)
        self._act = ReLU6()

    def features(self, x: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, head_channels, H/32, W/32): everything before the pooling."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ShapeError(f"EfficientNetLite: expected images of shape (B, 3, H, W), got {x.shape}")
        x = self._act(self._bn0(self._conv_stem(x)))              # (B, 32, H/2, W/2)
        for block in self._blocks:
            x = block(x)                                          # ... (B, 320, H/32, W/32)
        return self._act(self._bn1(self._conv_head(x)))           # (B, 1280, H/32, W/32)

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x).mean(axis=(2, 3))                    # (B, 1280)
        return self._fc(self._dropout(h))                         # (B, num_classes)

    def fuse_batchnorm(self) -> "EfficientNetLite":
        """For inference: fold every BatchNorm into the convolution before it
        (``nn.utils.fuse_conv_bn_eval``) and put an Identity in its place: the same outputs (to
        float32 rounding) with a pass over each activation less. Call it after loading the
        weights; the state_dict then has the folded convolutions' weights and biases instead of
        the BatchNorm keys. Returns self, in eval mode."""
        self.eval()
        pairs = [(self, "_conv_stem", "_bn0"), (self, "_conv_head", "_bn1")]
        for b in self._blocks:
            pairs += [(b, "_expand_conv", "_bn0"), (b, "_depthwise_conv", "_bn1"), (b, "_project_conv", "_bn2")]
        for owner, conv, bn in pairs:
            if conv in owner._modules and isinstance(owner._modules[bn], BatchNorm2d):
                setattr(owner, conv, fuse_conv_bn_eval(owner._modules[conv], owner._modules[bn]))
                setattr(owner, bn, Identity())
        return self


def efficientnet_lite0(num_classes: int = 1000, dropout: float = 0.2) -> EfficientNetLite:
    """EfficientNet-Lite0 (4.65 M parameters at 1,000 classes; trained at 224x224)."""
    return EfficientNetLite(LITE0_STAGES, num_classes=num_classes, dropout=dropout)
