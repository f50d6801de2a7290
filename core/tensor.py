"""The Tensor: shape, dtype, device and a backend buffer. Every computation goes through the op
registry (``ember.registry.apply``); Tensor methods and operators are thin wrappers over the
functions in ``ember.ops``.

>>> import ember
>>> x = ember.tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (x * 2 + 1).tolist()
[[3.0, 5.0], [7.0, 9.0]]
>>> x.sum(axis=0).tolist()
[4.0, 6.0]
"""
from __future__ import annotations

import struct
from array import array
from math import prod

from . import dtypes as _dt
from .backends import default_device, get_backend
from .errors import DTypeError, ShapeError
from .registry import CAPTURE as _CAPTURE


class Tensor:
    """An n-dimensional array on a device. Create with ``ember.tensor``, ``ember.zeros``..."""

    __slots__ = ("_buf", "shape", "dtype", "device", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators
    __array_ufunc__ = None  # ndarray + tensor -> Tensor.__radd__, never an object array

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with ember.tensor(data), ember.zeros(shape), ...")

    @classmethod
    def _wrap(cls, buf, shape, dtype, device) -> "Tensor":
        t = object.__new__(cls)
        t._buf = buf
        t.shape = tuple(shape)
        t.dtype = dtype
        t.device = device
        return t

    # ---- basic properties ------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def backend(self):
        return get_backend(self.device)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        if self.size <= 64:
            body = repr(self.tolist())
        else:
            body = f"<{self.size} values>"
        return f"tensor({body}, shape={self.shape}, dtype={self.dtype.name}, device={self.device!r})"

    # ---- reading data ------------------------------------------------------------------------
    def _bytes(self) -> bytes:
        if _CAPTURE[0] is not None:
            _CAPTURE[0].on_read(self)
        return self.backend.to_bytes(self._buf, self.shape, self.dtype)

    def tolist(self):
        """Nested Python lists (a Python scalar for a 0-d tensor)."""
        return _nest(_decode(self._bytes(), self.dtype), self.shape)

    async def data_async(self):
        """Like ``tolist()`` but never blocks: awaits the GPU readback in the browser."""
        if _CAPTURE[0] is not None:
            _CAPTURE[0].on_read(self)
        raw = await self.backend.to_bytes_async(self._buf, self.shape, self.dtype)
        return _nest(_decode(raw, self.dtype), self.shape)

    def item(self):
        """The single value of a one-element tensor as a Python scalar."""
        if self.size != 1:
            raise ShapeError(f"item: tensor of shape {self.shape} has {self.size} elements, not 1")
        return _decode(self._bytes(), self.dtype)[0]

    def numpy(self):
        """A numpy array copy (needs numpy)."""
        import numpy as np

        return np.frombuffer(self._bytes(), dtype=_NP_NAMES[self.dtype.name]).reshape(self.shape).copy()

    def __array__(self, dtype=None, copy=None):
        # np.asarray(t) / np.testing work on tensors (a copy; needs numpy)
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, not {self.dtype.name}")
        return int(self.item())

    def to(self, device: str | None = None, dtype=None) -> "Tensor":
        """Move to another device and/or cast to another dtype."""
        t = self
        if device is not None and device != t.device:
            dst = get_backend(device)
            if getattr(dst, "storage", None) == "array" and getattr(t.backend, "storage", None) == "array":
                # python <-> wasm: the same immutable array.array buffers; share, don't copy
                return Tensor._wrap(t._buf, t.shape, t.dtype, device) if dtype is None else \
                    Tensor._wrap(t._buf, t.shape, t.dtype, device).astype(dtype)
            src = t
            t = Tensor._wrap(_transfer(None, src, device=device), t.shape, t.dtype, device)
            if _CAPTURE[0] is not None:   # a device move is a step of the plan, not a read
                from .registry import Meta
                _CAPTURE[0].record("to", _transfer, (src,), Meta(t.shape, t.dtype),
                                   {"device": device}, (t,), False)
        if dtype is not None:
            t = t.astype(dtype)
        return t

    def __getattr__(self, name):
        # Tensor methods are the public functions of ember.ops taking the tensor first
        # (x.exp(), x.sum(axis=1), x.reshape(2, 3) ...).
        from . import ops

        fn = ops.METHODS.get(name)
        if fn is None:
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        return fn.__get__(self)

    def __dir__(self):
        from . import ops

        return sorted(set(object.__dir__(self)) | set(ops.METHODS))


# ---- creation ---------------------------------------------------------------------------------

_NP_NAMES = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8", "uint8": "u1", "bool": "?"}


def _transfer(meta, t, *, device):
    """Kernel-shaped device move (``Tensor.to``): t's buffer on ``device``."""
    raw = t.backend.to_bytes(t._buf, t.shape, t.dtype)
    return get_backend(device).from_bytes(raw, t.shape, t.dtype)


def _flatten(data, shape, out, depth=0):
    if not isinstance(data, (list, tuple, int, float)) and hasattr(data, "tolist"):
        data = data.tolist()  # numpy scalars/arrays and Tensors nested in lists
    if isinstance(data, (list, tuple)):
        n = len(data)
        if depth == len(shape):
            shape.append(n)
        elif shape[depth] != n:
            raise ShapeError(f"tensor: ragged nested sequence (length {n} at depth {depth}, expected {shape[depth]})")
        for x in data:
            _flatten(x, shape, out, depth + 1)
    else:
        if depth != len(shape):
            raise ShapeError(f"tensor: ragged nested sequence (a scalar at depth {depth})")
        out.append(data)


def _infer_dtype(flat) -> _dt.DType:
    if flat and all(isinstance(v, bool) for v in flat):
        return _dt.bool_
    if all(isinstance(v, int) for v in flat) and flat:
        return _dt.default_int
    return _dt.default_float


_round_half = _dt.round_half  # kept for callers outside core (webgpu/fusion.py)


def _encode(flat, dtype: _dt.DType) -> bytes:
    """Python values -> little-endian bytes of ``dtype`` (values converted like a cast)."""
    if dtype.kind == "f":
        vals = [float(v) for v in flat]
        if dtype is _dt.float16:
            vals = _dt.round_half(vals)
            return struct.pack(f"<{len(vals)}e", *vals)
        return array("f", vals).tobytes()
    if dtype is _dt.bool_:
        return bytes(1 if v else 0 for v in flat)
    vals = [int(v) for v in flat]
    if dtype is _dt.uint8:
        return bytes(v & 0xFF for v in vals)
    if dtype is _dt.int32:
        vals = [((v + 2**31) % 2**32) - 2**31 for v in vals]
    a = array(dtype.typecode, vals)
    return a.tobytes()


def _decode(raw: bytes, dtype: _dt.DType) -> list:
    n = len(raw) // dtype.itemsize
    if dtype is _dt.bool_:
        return [b != 0 for b in raw]
    return list(struct.unpack(f"<{n}{dtype.fmt}", raw))


def _nest(flat, shape):
    if not shape:
        return flat[0]
    if 0 in shape:
        def empty(s):
            return [] if s[0] == 0 else [empty(s[1:]) for _ in range(s[0])]
        return empty(shape)
    for n in reversed(shape[1:]):
        flat = [flat[i:i + n] for i in range(0, len(flat), n)]
    return flat


def tensor(data, dtype=None, device: str | None = None) -> Tensor:
    """Create a tensor from nested lists, a scalar, a numpy array, bytes-like with a dtype,
    or another Tensor (copied to ``device``/``dtype``).

    >>> import ember
    >>> ember.tensor([[1, 2], [3, 4]]).dtype
    ember.int64
    >>> ember.tensor(3.5).shape
    ()
    """
    device = device or default_device()
    if isinstance(data, Tensor):
        return data.to(device, dtype)
    if hasattr(data, "__array_interface__") and hasattr(data, "dtype") and hasattr(data, "tobytes"):
        return from_numpy(data, device=device, dtype=dtype)
    shape: list = []
    flat: list = []
    _flatten(data, shape, flat)
    dt = _dt.get(dtype) if dtype is not None else _infer_dtype(flat)
    for v in flat:
        if not isinstance(v, (int, float, bool)):
            raise DTypeError(f"tensor: cannot convert element of type {type(v).__name__} to {dt.name}")
    return Tensor._wrap(get_backend(device).from_bytes(_encode(flat, dt), tuple(shape), dt), shape, dt, device)


def from_numpy(a, device: str | None = None, dtype=None) -> Tensor:
    """Copy a numpy array into a tensor (float64 becomes float32, like ``ember.tensor``)."""
    import numpy as np

    device = device or default_device()
    a = np.asarray(a)
    name = {"float64": "float32", "bool": "bool"}.get(a.dtype.name, a.dtype.name)
    dt = _dt.get(dtype if dtype is not None else name)
    a = np.ascontiguousarray(a, dtype=_NP_NAMES[dt.name]).reshape(a.shape)  # ascontiguousarray makes 0-d 1-d
    return Tensor._wrap(get_backend(device).from_bytes(a.tobytes(), a.shape, dt), a.shape, dt, device)


def from_bytes(data, shape, dtype, device: str | None = None) -> Tensor:
    """A tensor from little-endian bytes in ``dtype``'s layout (what ``to_bytes`` gives back)."""
    dt = _dt.get(dtype)
    shape = tuple(int(s) for s in shape)
    if len(data) != prod(shape) * dt.itemsize:
        raise ShapeError(f"from_bytes: {len(data)} bytes do not hold shape {shape} of {dt.name} "
                         f"({prod(shape) * dt.itemsize} bytes)")
    device = device or default_device()
    return Tensor._wrap(get_backend(device).from_bytes(bytes(data), shape, dt), shape, dt, device)
