"""The Python half of the MNIST page: runs inside Pyodide, called from demo.js.

demo.js writes this file and ``model.py`` into Pyodide's file system, imports this module, hands
it the downloaded weights with ``load(bytes)`` and then calls ``await predict(pixels, backend)``
for every drawing. Everything here is plain ember: the same calls work in CPython (the test
suite imports this module to check it).

>>> import os
>>> here = os.path.dirname(os.path.abspath(__file__))
>>> info = load(open(os.path.join(here, "mnist.safetensors"), "rb").read())
>>> sorted(info["backends"])
['cpu']
"""
from __future__ import annotations

from array import array

import model as mnist

# The page's names for the two backends -> ember device names.
DEVICES = {"cpu": "python", "webgpu": "webgpu"}

_weights: bytes | None = None
_nets: dict = {}


def _as_bytes(data) -> bytes:
    # A JS Uint8Array arrives as a JsProxy (copy it across once with to_bytes); CPython callers
    # pass bytes.
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def load(weights) -> dict:
    """Parse the safetensors weights and build the CPU model (the WebGPU one on first use)."""
    global _weights
    _weights = _as_bytes(weights)
    _nets.clear()
    net("cpu")
    return {"backends": list(_nets), "bytes": len(_weights)}


def net(backend: str) -> mnist.MnistNet:
    """The model on ``backend`` ("cpu" or "webgpu"), created from the loaded weights once."""
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu' or 'webgpu'")
    if _weights is None:
        raise RuntimeError("the MNIST weights are not loaded yet: call load(weights) first")
    if backend not in _nets:
        _nets[backend] = mnist.load_model(_weights, DEVICES[backend])
    return _nets[backend]


def _pixels(pixels) -> array:
    # From the page: a Float32Array (one bridge copy); from Python: any sequence of 784 floats.
    if hasattr(pixels, "to_bytes"):
        px = array("f", pixels.to_bytes())
    else:
        px = array("f", [float(v) for v in pixels])
    if len(px) != mnist.PIXELS:
        raise ValueError(f"predict: got {len(px)} pixels, expected {mnist.PIXELS} (28x28 row major)")
    return px


async def predict(pixels, backend: str = "cpu") -> dict:
    """``{"digit", "probs", "backend"}`` for one 28x28 image of [0, 1] pixels."""
    probs = await mnist.predict_async(net(backend), _pixels(pixels), DEVICES[backend])
    return {"digit": mnist.argmax(probs), "probs": probs, "backend": backend}
