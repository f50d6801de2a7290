"""The Python half of the MNIST page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker fetch this file, ``model.py`` and the weights into Pyodide's file system,
calls ``load(path)``, then ``predict(pixels, backend)`` for every drawing (a coroutine, awaited,
on WebGPU only); in the background ``await start_webgpu()`` puts the network on the GPU and
runs it once. Everything here is plain ember: the same calls work in CPython (the test suite
imports this module).

Backends are the page's names: "cpu" runs on ember's WebAssembly SIMD backend ("wasm") where
it exists (in Pyodide, once ``ember.wasm.init()`` ran; the loader does that), else on the
pure-Python one; "python" is always pure Python (for comparison); "webgpu" the GPU.

>>> import os
>>> here = os.path.dirname(os.path.abspath(__file__))
>>> info = load(open(os.path.join(here, "mnist.safetensors"), "rb").read())
>>> sorted(info["backends"])
['cpu']
"""
from __future__ import annotations

import json
import struct
import time
from array import array

import ember
import model as mnist

# The page's names for the backends -> ember device names.
DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu", "python": "python"}

_weights: bytes | None = None
_nets: dict = {}


def _as_bytes(data) -> bytes:
    # A path (the worker wrote the file), a JS Uint8Array (a JsProxy: one copy with to_bytes),
    # or bytes / a memoryview.
    if isinstance(data, str):
        with open(data, "rb") as f:
            return f.read()
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def load(weights) -> dict:
    """Parse the safetensors weights (bytes or a file path) and build the CPU model (the others
    on first use)."""
    global _weights
    _weights = _as_bytes(weights)
    _nets.clear()
    net("cpu")
    return {"backends": list(_nets), "bytes": len(_weights), "devices": dict(DEVICES),
            "metadata": _metadata(_weights)}


def _metadata(raw: bytes) -> dict:
    """The safetensors header's ``__metadata__`` (training accuracy, date...), for the page."""
    (n,) = struct.unpack_from("<Q", raw, 0)
    if not 0 < n <= len(raw) - 8:
        return {}
    return json.loads(raw[8:8 + n]).get("__metadata__", {})


def net(backend: str):
    """The model on ``backend`` ("cpu", "webgpu" or "python"), created from the loaded weights
    once and wrapped in ``ember.compile``: the first drawing records the kernel calls, every
    later one replays them without the per-op Python work (about half the time per digit on
    the wasm CPU backend)."""
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu', 'webgpu' or 'python'")
    if _weights is None:
        raise RuntimeError("the MNIST weights are not loaded yet: call load(weights) first")
    if backend not in _nets:
        _nets[backend] = ember.compile(mnist.load_model(_weights, DEVICES[backend]))
    return _nets[backend]


def _pixels(pixels) -> array:
    # From the worker: a Float32Array arrives as a memoryview of format "f"; a JsProxy of one
    # (pyodide on the page's thread) has to_bytes; from Python: any sequence of 784 floats.
    if isinstance(pixels, memoryview) and pixels.format == "f":
        px = array("f", pixels.cast("B").tobytes())
    elif hasattr(pixels, "to_bytes"):
        px = array("f", pixels.to_bytes())
    else:
        px = array("f", [float(v) for v in pixels])
    if len(px) != mnist.PIXELS:
        raise ValueError(f"predict: got {len(px)} pixels, expected {mnist.PIXELS} (28x28 row major)")
    return px


def predict(pixels, backend: str = "cpu"):
    """``{"digit", "probs", "backend", "device", "inference_ms"}`` for one 28x28 image of [0, 1]
    pixels. On the CPU backends the answer is returned directly (the output is read
    synchronously); on "webgpu" this returns a coroutine (the GPU readback is awaited), which
    the worker awaits. A plain def matters: a JS call of an ``async def`` runs as a task on
    Pyodide's event loop, a macrotask round per answer (0.05-0.5 ms, more than the MNIST
    forward on the wasm backend)."""
    px = _pixels(pixels)
    model = net(backend)
    device = DEVICES[backend]
    if device == "webgpu":
        return _predict_async(model, px, backend)
    t0 = time.perf_counter()
    probs = mnist.predict(model, px, device)
    return _answer(probs, backend, t0)


async def _predict_async(model, px, backend: str) -> dict:
    t0 = time.perf_counter()
    probs = await mnist.predict_async(model, px, DEVICES[backend])
    return _answer(probs, backend, t0)


def _answer(probs: list, backend: str, t0: float) -> dict:
    return {"digit": mnist.argmax(probs), "probs": probs, "backend": backend, "device": DEVICES[backend],
            "inference_ms": (time.perf_counter() - t0) * 1000}


async def start_webgpu() -> dict:
    """Put the network on WebGPU (after ``await ember.webgpu.init()``) and run it once, so that
    its pipelines are compiled before the page switches to it: exactly the kernels this model
    uses, nothing else. ``{"ms", "pipelines", "fallback_adapter"}`` (fallback: a software
    adapter, e.g. SwiftShader, often slower than the CPU backend)."""
    import ember.webgpu
    from ember.webgpu import autotune

    # Autotune would benchmark every matmul variant first: measured in this headless Chromium
    # (SwiftShader), the first WebGPU prediction took 15.6 s with it (15 pipelines, 2
    # benchmarks) and 0.59 s without (9 pipelines); the default variants serve batch 1 well.
    autotune.set_enabled(False)
    t0 = time.perf_counter()
    net("webgpu")
    await predict(array("f", bytes(4 * mnist.PIXELS)), "webgpu")
    return {"ms": (time.perf_counter() - t0) * 1000, "pipelines": ember.webgpu.stats()["pipelines_compiled"],
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}
