"""The backend protocol and the backend registry.

A backend is an object with:

- ``name``: the device string (``"python"``, ``"numpy"``, ``"webgpu"``)
- ``kernels``: ``dict[str, callable]`` from op name (see ``ember.registry.OPS``) to kernel;
  calling convention in ``ember.registry``. Ops missing here run through their decomposition.
- ``from_bytes(data, shape, dtype) -> buf``: little-endian bytes in the dtype's layout
  (``DType.fmt``; float16 as IEEE half, bool as one byte 0/1) to a backend buffer.
- ``to_bytes(buf, shape, dtype) -> bytes``: the inverse (synchronous; in the browser this
  blocks through JSPI where it can). It may return a ``bytearray`` that nobody else holds
  (``Tensor.numpy`` then wraps it without a second copy), never the backend's own storage.
- ``async to_bytes_async(buf, shape, dtype) -> bytes``: the same without blocking.
- ``available() -> (bool, reason)``: classmethod/staticmethod; whether it can run here.

Backends register lazily by name so importing ember never imports numpy or wgpu.

>>> import ember
>>> "python" in ember.devices()
True
"""
from __future__ import annotations

import importlib

from ..errors import DeviceError

# name -> "module:factory"; a factory returns the backend instance (called once).
_FACTORIES = {
    "python": "ember.backends.python:PythonBackend",
    "numpy": "ember.backends.numpy_grad:create_backend",   # numpy_backend + backward kernels
    "webgpu": "ember.webgpu.backend:create_backend",
    "wasm": "ember.wasm.backend:create_backend",
    "meta": "ember.backends.meta:MetaBackend",
}
_HIDDEN = {"meta"}  # devices that exist for tooling (shape tracing) and are not listed
_INSTANCES: dict = {}
_UNAVAILABLE: dict = {}


def register_backend(name: str, factory: str) -> None:
    """Register a backend factory (``"module:callable"``) under a device name."""
    _FACTORIES[name] = factory
    reset_backend(name)


def reset_backend(name: str) -> None:
    """Forget the backend instance for ``name`` and any earlier failure to create it, so the
    next use creates it afresh (``ember.webgpu.init()`` does this once the GPU is open)."""
    _INSTANCES.pop(name, None)
    _UNAVAILABLE.pop(name, None)


def get_backend(name: str):
    """Return the backend for device ``name``, creating it on first use.

    Raises DeviceError naming the device and why it cannot run here."""
    b = _INSTANCES.get(name)
    if b is not None:
        return b
    if name not in _FACTORIES:
        if name == "auto" or name.startswith("router:"):   # a router over member devices (ember.router)
            from ..router import create_backend

            b = _INSTANCES[name] = create_backend(name)
            return b
        raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(_FACTORIES)}")
    if name in _UNAVAILABLE:
        raise DeviceError(f"device {name!r} is not available here: {_UNAVAILABLE[name]}")
    mod, _, attr = _FACTORIES[name].partition(":")
    try:
        b = getattr(importlib.import_module(mod), attr)()
    except DeviceError as e:
        _UNAVAILABLE[name] = str(e)
        raise
    except ImportError as e:
        _UNAVAILABLE[name] = f"{e} (install the optional dependency)"
        raise DeviceError(f"device {name!r} is not available here: {_UNAVAILABLE[name]}") from e
    _INSTANCES[name] = b
    return b


def devices() -> list:
    """Names of the devices that can run on this machine, the default first."""
    out = []
    for name in _FACTORIES:
        if name in _HIDDEN:
            continue
        try:
            get_backend(name)
        except DeviceError:
            continue
        out.append(name)
    return out


_default = ["python"]


def default_device() -> str:
    """The device new tensors go to when none is given (``"python"`` unless changed)."""
    return _default[0]


def set_default_device(name: str) -> None:
    """Make ``name`` the device new tensors go to when none is given."""
    get_backend(name)
    _default[0] = name
