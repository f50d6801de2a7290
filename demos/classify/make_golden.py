#!/usr/bin/env python3
"""Produce the classify demo's samples and golden logits once, with PyTorch (never at test time).

    /work/refvenv/bin/python demos/classify/make_golden.py [path/to/efficientnet-lite0-57934424.pth]

- ``samples/*.jpg``: three photographs bundled with scikit-image (``skimage.data``), saved as
  JPEG (quality 85): ``chelsea`` (a cat; CC0, Stefan van der Walt), ``coffee`` (a cup of coffee;
  CC0, Rachel Michetti), ``rocket`` (DSCOVR's launch on a Falcon 9; SpaceX, public domain). See
  samples/README.md. (``astronaut`` was tried: no ImageNet class fits it, top-1 3%.)
- ``golden.json``: for each sample, the image decoded by Pillow, preprocessed as torchvision
  users do (shorter side resized to 256 with antialiased bilinear filtering, ``F.interpolate(...,
  antialias=True)`` on float pixels; centre crop 224; ImageNet mean/std), a strided sample of
  that input tensor, and the logits of the PyTorch network written below on the
  EfficientNet-Lite0 checkpoint (weights loaded with ``torch.load(weights_only=True)``).

The network here is written from the architecture's description (MBConv blocks without
squeeze-excite, ReLU6, TensorFlow "same" padding, BatchNorm eps 1e-3), independently of
ember.nn.efficientnet, so that the two implementations check each other. torch 2.13 CPU made
the committed files.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from PIL import Image
from skimage import data as skdata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SAMPLES = {"chelsea": skdata.chelsea, "coffee": skdata.coffee, "rocket": skdata.rocket}
STRIDE = 97          # every 97th value of the (3, 224, 224) input goes into the golden file
# (repeats, kernel, stride, expand ratio, in, out) of the seven stages
STAGES = [(1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320)]
EPS = 1e-3


def same_pad(x, k, s):
    """TensorFlow's SAME padding: output ceil(size / s), the extra pixel at the bottom/right."""
    h, w = x.shape[-2:]
    ph = max((math.ceil(h / s) - 1) * s + k - h, 0)
    pw = max((math.ceil(w / s) - 1) * s + k - w, 0)
    return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])


class Block(torch.nn.Module):
    def __init__(self, k, s, e, cin, cout):
        super().__init__()
        mid = cin * e
        self.k, self.s, self.skip = k, s, s == 1 and cin == cout
        if e != 1:
            self._expand_conv = torch.nn.Conv2d(cin, mid, 1, bias=False)
            self._bn0 = torch.nn.BatchNorm2d(mid, eps=EPS)
        self._depthwise_conv = torch.nn.Conv2d(mid, mid, k, s, groups=mid, bias=False)
        self._bn1 = torch.nn.BatchNorm2d(mid, eps=EPS)
        self._project_conv = torch.nn.Conv2d(mid, cout, 1, bias=False)
        self._bn2 = torch.nn.BatchNorm2d(cout, eps=EPS)

    def forward(self, x):
        h = x
        if hasattr(self, "_expand_conv"):
            h = F.relu6(self._bn0(self._expand_conv(h)))
        h = F.relu6(self._bn1(self._depthwise_conv(same_pad(h, self.k, self.s))))
        h = self._bn2(self._project_conv(h))
        return h + x if self.skip else h


class Lite0(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._conv_stem = torch.nn.Conv2d(3, 32, 3, 2, bias=False)
        self._bn0 = torch.nn.BatchNorm2d(32, eps=EPS)
        blocks = []
        for r, k, s, e, cin, cout in STAGES:
            for i in range(r):
                blocks.append(Block(k, s if i == 0 else 1, e, cin if i == 0 else cout, cout))
        self._blocks = torch.nn.ModuleList(blocks)
        self._conv_head = torch.nn.Conv2d(320, 1280, 1, bias=False)
        self._bn1 = torch.nn.BatchNorm2d(1280, eps=EPS)
        self._fc = torch.nn.Linear(1280, 1000)

    def forward(self, x):
        x = F.relu6(self._bn0(self._conv_stem(same_pad(x, 3, 2))))
        for b in self._blocks:
            x = b(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(x.mean((2, 3)))


def preprocess(rgb: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    """(H, W, 3) uint8 -> (1, 3, 224, 224) float: torchvision's Resize(256) + CenterCrop(224) +
    ToTensor + Normalize, on a float image (antialiased bilinear)."""
    h, w = rgb.shape[:2]
    if w <= h:
        nw, nh = 256, int(256 * h / w)
    else:
        nh, nw = 256, int(256 * w / h)
    x = rgb.permute(2, 0, 1)[None].double()
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    x = x[:, :, top:top + 224, left:left + 224] / 255.0
    x = (x - torch.tensor(mean, dtype=x.dtype).view(1, 3, 1, 1)) / torch.tensor(std, dtype=x.dtype).view(1, 3, 1, 1)
    return x.float()


def main(weights: str) -> None:
    classes = open(os.path.join(REPO, "core", "imagenet_classes.txt")).read().splitlines()
    net = Lite0().eval()
    net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    out = {"weights": os.path.basename(weights), "torch": torch.__version__, "stride": STRIDE,
           "mean": MEAN, "std": STD, "images": {}}
    os.makedirs(os.path.join(HERE, "samples"), exist_ok=True)
    for name, fn in SAMPLES.items():
        buf = io.BytesIO()
        Image.fromarray(fn()).convert("RGB").save(buf, "JPEG", quality=85)
        path = os.path.join(HERE, "samples", f"{name}.jpg")
        with open(path, "wb") as f:
            f.write(buf.getvalue())
        rgb = torch.from_numpy(__import__("numpy").asarray(Image.open(path).convert("RGB")).copy())
        x = preprocess(rgb)
        with torch.no_grad():
            logits = net(x)[0]
        top = torch.topk(logits.softmax(-1), 5)
        print(name, f"{len(buf.getvalue()) / 1024:.0f} KB", [(classes[i], round(p, 3)) for p, i in
                                                           zip(top.values.tolist(), top.indices.tolist())])
        flat = x.flatten()
        out["images"][name] = {
            "file": f"samples/{name}.jpg", "width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
            "input_sample": [round(v, 6) for v in flat[::STRIDE].tolist()],
            "input_channel_sums": [round(v, 4) for v in x[0].double().sum((1, 2)).tolist()],
            "logits": [round(v, 5) for v in logits.tolist()],
            "top5": top.indices.tolist(), "top5_labels": [classes[i] for i in top.indices.tolist()],
        }
    with open(os.path.join(HERE, "golden.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "efficientnet-lite0-57934424.pth"))
