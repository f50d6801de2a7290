"""ember: deep-learning inference in Python, the same model code in CPython and in the browser.

>>> import ember
>>> x = ember.tensor([1.0, 2.0, 3.0])
>>> (x * x).tolist()
[1.0, 4.0, 9.0]
"""
__version__ = "0.1.0"
__array_api_version__ = "2023.12"   # ember is an array API namespace; README: deliberate differences

from . import dtypes, errors  # noqa: F401
from .backends import default_device, devices, get_backend, set_default_device  # noqa: F401
from .dtypes import bool_, float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64  # noqa: F401
from .tensor import Tensor, from_bytes, from_numpy, tensor  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops.array_api import __array_namespace_info__  # noqa: F401,E402
# the array API's linalg extension (core/linalg.py); the star import above bound the name to the
# op family ember.ops.linalg, which is not that extension
linalg = __import__("importlib").import_module("ember.linalg")
# likewise ember.quant is the quantized-weights module (core/quant.py), not the op family ember.ops.quant
quant = __import__("importlib").import_module("ember.quant")
# and ember.llm (text generation, imported on first use) is not the op family ember.ops.llm
del llm  # noqa: F821
from . import autograd  # noqa: F401,E402  (installs the recording hook at registry.apply)
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401,E402
from .random import manual_seed, rand, randint, randn, randperm  # noqa: F401,E402



def _env_default_device():
    """``EMBER_DEFAULT_DEVICE=numpy`` (or webgpu, wasm...) picks the default device at import,
    so outside code (a test suite, a script) runs on any backend unchanged."""
    import os

    name = os.environ.get("EMBER_DEFAULT_DEVICE", "").strip()
    if not name:
        return
    try:
        set_default_device(name)
    except errors.DeviceError as e:
        raise errors.DeviceError(f"EMBER_DEFAULT_DEVICE={name!r}: {e}") from None


_env_default_device()

bool = bool_  # noqa: A001  (ember.bool, like numpy/torch; Python's bool stays builtins.bool)

# Submodules and functions imported on first use, so `import ember` stays fast in Pyodide and
# never imports numpy, wgpu or the ONNX reader unless asked.
_LAZY = {
    "nn": ("ember.nn", None),
    "optim": ("ember.optim", None),
    "train": ("ember.train", None),
    "io": ("ember.io", None),
    "onnx": ("ember.onnx", None),
    "webgpu": ("ember.webgpu", None),
    "wasm": ("ember.wasm", None),
    "plan": ("ember.plan", None),
    "compile": ("ember.plan", "compile"),
    "load_safetensors": ("ember.io.safetensors", "load_safetensors"),
    "save_safetensors": ("ember.io.safetensors", "save_safetensors"),
    "load_torch": ("ember.io.torch", "load_torch"),
    "load_gguf": ("ember.io.gguf", "load_gguf"),
    "llm": ("ember.llm", None),
    "tokenizers": ("ember.tokenizers", None),
    "vision": ("ember.vision", None),
    "records": ("ember.records", None),
    "save": ("ember.records", "save"),
    "load": ("ember.records", "load"),
    "router": ("ember.router", None),          # callable: ember.router("webgpu", "numpy")
    "router_stats": ("ember.router", "router_stats"),
}


def __getattr__(name):
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'ember' has no attribute {name!r}")
    mod, attr = _LAZY[name]
    m = importlib.import_module(mod)
    value = m if attr is None else getattr(m, attr)
    globals()[name] = value
    return value
