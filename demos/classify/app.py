"""The Python half of the classify page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker fetch this file and the EfficientNet-Lite0 checkpoint into Pyodide's file
system, calls ``load(path)``, then ``await classify(width, height, rgba, backend)`` for every
image (the browser decodes PNG / JPEG / WebP into RGBA pixels). ``load_onnx(bytes, name)`` puts
a user's own ImageNet classifier (an ONNX file dropped on the page) in the built-in model's
place until ``use_builtin()``. In the background ``await start_webgpu()`` puts the network on
the GPU and runs it once. Everything here is plain ember: the same calls work in CPython (the
tests import this module).

Backends are the page's names: "cpu" is ember's WebAssembly SIMD backend ("wasm") where it
exists, else pure Python; "webgpu" the GPU; "python" pure Python (for comparison; very slow).
Preprocessing (``ember.vision.imagenet_preprocess``) always runs on the CPU backend; the
(1, 3, 224, 224) input then moves to the model's device.
"""
from __future__ import annotations

import time

import ember
from ember import vision
from ember.nn.efficientnet import efficientnet_lite0

DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu", "python": "python"}
BUILTIN = "EfficientNet-Lite0"

_state: dict = {"weights": None, "onnx": None, "onnx_name": None, "onnx_crop": 224}
_nets: dict = {}        # (model name, backend) -> callable


def load(weights) -> dict:
    """Read the EfficientNet-Lite0 checkpoint (a path or bytes) and build the CPU model (the
    others on first use)."""
    t0 = time.perf_counter()
    data = weights.to_bytes() if hasattr(weights, "to_bytes") else weights
    _state["weights"] = ember.load_torch(data)
    _nets.clear()
    net("cpu")
    return {"devices": dict(DEVICES), "load_ms": (time.perf_counter() - t0) * 1000, "tensors": len(_state["weights"]),
            "classes": len(vision.imagenet_classes())}


def _onnx_crop(model) -> int:
    """The square input size an ONNX classifier declares ((N, 3, S, S)), else 224."""
    vi = model.inputs[0]
    dims = list(getattr(vi, "shape", None) or [])
    if len(dims) != 4 or dims[1] not in (3, "3"):
        raise ValueError(f"this ONNX model's input {vi.name!r} has shape {dims}: an ImageNet classifier "
                         "takes (N, 3, H, W) images")
    h, w = dims[2], dims[3]
    if isinstance(h, int) and isinstance(w, int) and h > 0:
        if h != w:
            raise ValueError(f"this ONNX model takes {h}x{w} images: the page crops squares")
        return h
    return 224


def load_onnx(data, name: str = "model.onnx") -> dict:
    """Use an ONNX ImageNet classifier (its bytes) instead of the built-in network: input (N, 3,
    S, S) normalised with ImageNet's mean and std (the torchvision convention), output (N, 1000)
    logits. Raises ValueError when the file is not an ONNX model or not such a classifier."""
    import ember.onnx as eonnx
    from ember.errors import EmberError

    raw = data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)
    try:
        model = eonnx.load(raw, device=DEVICES["cpu"])
    except EmberError as e:
        raise ValueError(f"{name} is not an ONNX model ember can run: {e}") from None
    crop = _onnx_crop(model)
    _state.update(raw_onnx=raw, onnx=name, onnx_crop=crop)
    for key in [k for k in _nets if k[0] != BUILTIN]:
        del _nets[key]
    _nets[(name, "cpu")] = model
    t0 = time.perf_counter()
    out = model(ember.zeros((1, 3, crop, crop), device=DEVICES["cpu"]))
    if tuple(out.shape) != (1, 1000):
        use_builtin()
        raise ValueError(f"{name} gives an output of shape {tuple(out.shape)}: an ImageNet classifier gives "
                         "(1, 1000) logits")
    return {"name": name, "input": [1, 3, crop, crop], "bytes": len(raw), "first_run_ms": (time.perf_counter() - t0) * 1000}


def use_builtin() -> None:
    """Back to EfficientNet-Lite0 after ``load_onnx``."""
    _state.update(raw_onnx=None, onnx=None, onnx_crop=224)
    for key in [k for k in _nets if k[0] != BUILTIN]:
        del _nets[key]


def current_model() -> str:
    return _state["onnx"] or BUILTIN


def net(backend: str):
    """The current model on ``backend``, created once: EfficientNet-Lite0 in eval mode, its
    BatchNorms folded, wrapped in ``ember.compile`` (the first image records the kernel calls, later ones replay them), or
    the user's ONNX model."""
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu', 'webgpu' or 'python'")
    key = (current_model(), backend)
    if key not in _nets:
        if _state["onnx"]:
            import ember.onnx as eonnx
            _nets[key] = eonnx.load(_state["raw_onnx"], device=DEVICES[backend])
        else:
            if _state["weights"] is None:
                raise RuntimeError("the EfficientNet-Lite0 weights are not loaded yet: call load(weights) first")
            m = ember.nn.utils.skip_init(efficientnet_lite0).eval()     # the weights are loaded next
            m.load_state_dict({k: v.to(DEVICES[backend]) for k, v in _state["weights"].items()}, strict=True)
            # BatchNorm folded into the convolutions: 143 WebGPU dispatches a forward instead of
            # 199, the same logits to 1e-5 (tests/test_classify.py)
            _nets[key] = ember.compile(m.to(DEVICES[backend]).fuse_batchnorm())
    return _nets[key]


async def classify(width: int, height: int, rgba, backend: str = "cpu") -> dict:
    """``{"top5": [{"label", "index", "prob"}], "ms", "backend", "device", "model", "timings":
    {"preprocess", "model"}}`` for RGBA pixels (what the page's canvas gave). ``ms`` is the
    whole call: preprocessing, the network, reading the logits back."""
    t0 = time.perf_counter()
    model = net(backend)
    crop = _state["onnx_crop"]
    x = vision.imagenet_preprocess(rgba, width, height, channels=4, resize=round(crop * 256 / 224), crop=crop,
                                   device=DEVICES["cpu"])
    t1 = time.perf_counter()
    y = model(x.to(DEVICES[backend]))
    logits = await y.data_async()          # the GPU readback is awaited in the page
    t2 = time.perf_counter()
    return {"top5": vision.top_k(logits, 5), "ms": (t2 - t0) * 1000, "backend": backend, "device": DEVICES[backend],
            "model": current_model(), "timings": {"preprocess": (t1 - t0) * 1000, "model": (t2 - t1) * 1000}}


async def start_webgpu() -> dict:
    """Put the network on WebGPU (after ``await ember.webgpu.init()``) and run it once, so that
    its pipelines are compiled before the page switches to it."""
    import ember.webgpu
    from ember.webgpu import autotune

    autotune.set_enabled(False)       # benchmarking every matmul variant first takes minutes here
    t0 = time.perf_counter()
    y = net("webgpu")(ember.zeros((1, 3, 224, 224), device="webgpu"))
    await y.data_async()
    return {"ms": (time.perf_counter() - t0) * 1000, "pipelines": ember.webgpu.stats()["pipelines_compiled"],
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}
