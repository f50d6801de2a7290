"""The Python half of the OCR page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker fetch this file, the pipeline's modules, the three ONNX models and
``config.yaml`` into one folder of Pyodide's file system, calls ``load(folder)``, then
``await read(width, height, rgba, backend)`` for every image (the browser decodes PNG / JPEG;
RGBA pixels come over). In the background ``await start_webgpu()`` loads the models on the
GPU and runs them once on a small image. Everything here is plain ember: the same calls work in
CPython (the tests import this module; ``read_file`` takes encoded bytes there).

Backends are the page's names: "cpu" is ember's WebAssembly SIMD backend ("wasm") where it
exists, else pure Python; "webgpu" the GPU; "python" pure Python (for comparison).
"""
from __future__ import annotations

import gc
import os
import time
import warnings

import ember
import images
import pipeline

DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu", "python": "python"}

# Execution plans off: a recorded plan for each new input size kept the detector's full-size
# intermediates alive, and the recogniser then ran out of Pyodide's memory (MemoryError) on a
# 560x420 image; eager runs free each value after its last use. The per-op saving of a replay
# is small next to these models' convolutions.
COMPILE = False

_folder: str | None = None
_ocrs: dict = {}


def load(folder: str, backends=("cpu",)) -> dict:
    """Load the models in ``folder`` for the page's ``backends`` (the others on first use)."""
    global _folder
    _folder = folder
    _ocrs.clear()
    t0 = time.perf_counter()
    for b in backends:
        ocr(b)
    o = _ocrs[backends[0]] if backends else None
    return {"devices": dict(DEVICES), "load_ms": (time.perf_counter() - t0) * 1000,
            "characters": len(o.characters) if o else 0,
            "bytes": {f: os.path.getsize(os.path.join(folder, f))
                      for f in (pipeline.DET_FILE, pipeline.CLS_FILE, pipeline.REC_FILE)}}


def ocr(backend: str) -> pipeline.OCR:
    """The pipeline on ``backend`` ("cpu", "webgpu" or "python"), created once."""
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu', 'webgpu' or 'python'")
    if _folder is None:
        raise RuntimeError("the OCR models are not loaded yet: call load(folder) first")
    if backend not in _ocrs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # notes about symbolic input sizes
            _ocrs[backend] = pipeline.OCR.from_folder(_folder, device=DEVICES[backend], compile=COMPILE)
    return _ocrs[backend]


def _bytes(data) -> bytes:
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def _result(img, backend: str, t0: float) -> dict:
    try:
        r = ocr(backend).read(img)
    finally:
        gc.collect()
    r["timings"]["decode"] = round((t0[1] - t0[0]) * 1000, 2)
    r["backend"], r["device"] = backend, DEVICES[backend]
    return r


async def read(width: int, height: int, rgba, backend: str = "cpu") -> dict:
    """``{"lines": [{"text", "score", "box"}], "timings": {stage: ms}, "backend", "device",
    "width", "height"}`` for RGBA pixels (what the page's canvas gave)."""
    t = time.perf_counter()
    img = images.from_rgba(int(width), int(height), _bytes(rgba))
    return _result(img, backend, (t, time.perf_counter()))


async def read_file(data, backend: str = "cpu") -> dict:
    """``read`` for PNG / JPEG bytes (decoded here: PNG in pure Python without Pillow)."""
    t = time.perf_counter()
    img = images.decode(_bytes(data))
    return _result(img, backend, (t, time.perf_counter()))


def warm_image() -> images.Image:
    """A small image with two dark bars: enough for every stage to run once."""
    w, h = 96, 48
    px = bytearray(b"\xff" * (3 * w * h))
    for y0, y1, x1 in ((10, 20, 80), (28, 38, 60)):
        for y in range(y0, y1):
            px[3 * (y * w + 8):3 * (y * w + x1)] = b"\x20" * (3 * (x1 - 8))
    return images.Image(w, h, bytes(px))


async def start_webgpu() -> dict:
    """Load the models on WebGPU (after ``await ember.webgpu.init()``) and run the pipeline once
    on a small image, so that its pipelines are compiled before the page switches to it."""
    import ember.webgpu
    from ember.webgpu import autotune

    autotune.set_enabled(False)       # benchmarking every matmul variant first takes minutes here
    t0 = time.perf_counter()
    o = ocr("webgpu")
    # Each model once on a small input: its kernels compile without the detector's full-size
    # run (the pipeline sizes the detector's input to 736 px and more, minutes on a software
    # adapter). The Python runs synchronously: a page call waits for this to finish.
    for model, shape in ((o.det, (1, 3, 64, 64)), (o.cls, (1, 3, 48, 192)), (o.rec, (1, 3, 48, 320))):
        await model(ember.zeros(shape, device="webgpu")).data_async()
    return {"ms": (time.perf_counter() - t0) * 1000, "pipelines": ember.webgpu.stats()["pipelines_compiled"],
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}
