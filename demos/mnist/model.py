"""The MNIST demo network in ember: the same code runs in CPython and in the page (Pyodide).

Pure Python (no numpy): the page's "CPU" backend is ember's pure-Python backend. The layer
names are PyTorch's ``state_dict`` names (``conv1.weight``, ``bn1.running_mean``...): ``train.py``
trains this very class with ember, and the shipped ``mnist.safetensors`` loads with
``strict=True`` and no renaming (into an equivalent ``torch.nn`` module too).

Input: pixels in [0, 1], white digit on black, 28x28 row major (what MNIST looks like after
dividing by 255). The page does the MNIST-style preprocessing of a drawing (crop, scale the
larger side to 20 px, centre by centre of mass) before calling ``predict``.

>>> import os, ember
>>> here = os.path.dirname(os.path.abspath(__file__))
>>> net = load_model(os.path.join(here, "mnist.safetensors"), device="python")
>>> probs = predict(net, [0.0] * 784, device="python")
>>> len(probs), round(sum(probs), 4)
(10, 1.0)
"""
from __future__ import annotations

from array import array

import ember
from ember import nn

# The normalisation the network was trained with (train.py); applied inside forward so that
# callers always pass plain [0, 1] pixels.
MEAN, STD = 0.1307, 0.3081
SIDE = 28
PIXELS = SIDE * SIDE


class MnistNet(nn.Module):
    """conv(1->16)+BN+ReLU+pool2 -> conv(16->32)+BN+ReLU+pool2 -> fc(1568->64)+ReLU -> fc(64->10).

    About 1.1 M multiply-adds and 106 k parameters per image.
    """

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)
        # Parameter-free layers: no state_dict entries (torch.nn.functional calls in PyTorch).
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()

    def forward(self, x):
        x = (x - MEAN) / STD                                   # (N, 1, 28, 28)
        x = self.pool(self.relu(self.bn1(self.conv1(x))))      # (N, 16, 14, 14)
        x = self.pool(self.relu(self.bn2(self.conv2(x))))      # (N, 32, 7, 7)
        x = self.relu(self.fc1(self.flatten(x)))               # (N, 64)
        return self.fc2(x)                                     # (N, 10) logits


def load_model(weights, device: str = "python") -> MnistNet:
    """``MnistNet`` in eval mode with the weights from a safetensors path or bytes, on ``device``."""
    net = nn.utils.skip_init(MnistNet)   # no random weights: all of them are loaded next
    # assign=True keeps the tensors where load_safetensors put them: one copy onto the device.
    net.load_state_dict(ember.load_safetensors(weights, device=device), strict=True, assign=True)
    return net.eval()


def images_tensor(images, device: str = "python"):
    """(N, 1, 28, 28) float32 tensor from N images.

    Each image is 784 floats in [0, 1] or 784 bytes (0..255, MNIST's raw pixels)."""
    flat = array("f")
    for i, img in enumerate(images):
        if len(img) != PIXELS:
            raise ValueError(f"image {i}: {len(img)} pixels, expected {PIXELS} (28x28 row major)")
        if isinstance(img, (bytes, bytearray)):
            flat.extend(b / 255.0 for b in img)
        else:
            flat.extend(float(v) for v in img)
    n = len(flat) // PIXELS
    return ember.from_bytes(flat.tobytes(), (n, 1, SIDE, SIDE), "float32", device=device)


def logits(net: MnistNet, images, device: str = "python") -> list[list[float]]:
    """Raw network outputs, one list of 10 per image."""
    return net(images_tensor(images, device)).tolist()


def _probs_tensor(net, images, device):
    return ember.softmax(net(images_tensor(images, device)), axis=-1)


def predict_batch(net: MnistNet, images, device: str = "python") -> list[list[float]]:
    """Class probabilities (softmax), one list of 10 per image."""
    return _probs_tensor(net, images, device).tolist()


def predict(net: MnistNet, pixels, device: str = "python") -> list[float]:
    """The 10 class probabilities of one image (784 values in [0, 1] or 784 bytes)."""
    return predict_batch(net, [pixels], device)[0]


async def predict_async(net: MnistNet, pixels, device: str = "python") -> list[float]:
    """``predict`` without blocking on the GPU readback (for code entered synchronously in the
    browser, where JSPI cannot suspend)."""
    return (await _probs_tensor(net, [pixels], device).data_async())[0]


def argmax(values) -> int:
    """Index of the largest value (the first one on ties)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best
