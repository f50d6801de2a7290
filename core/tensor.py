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
import sys
from array import array
from math import prod

from . import dtypes as _dt
from .backends import default_device, get_backend
from .errors import DTypeError, ShapeError
from .registry import CAPTURE as _CAPTURE
from .registry import GRAD as _GRAD


class Tensor:
    """An n-dimensional array on a device. Create with ``ember.tensor``, ``ember.zeros``..."""

    # _ag: autodiff state, None unless the tensor requires grad (see ember.autograd): a Leaf
    # (holds .grad) for a tensor the user marked, a Node (its grad_fn) for an op's result.
    __slots__ = ("_buf", "shape", "dtype", "device", "_ag", "__weakref__")
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
        t._ag = None
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
        grad = "" if self._ag is None else ", requires_grad=True"
        return f"tensor({body}, shape={self.shape}, dtype={self.dtype.name}, device={self.device!r}{grad})"

    # ---- autodiff (ember.autograd) ---------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        """Whether ops on this tensor are recorded for ``backward``. Settable on leaves
        (tensors no recorded op produced); only floating-point tensors can require grad."""
        return self._ag is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set ``requires_grad`` in place on a leaf; returns self.

        >>> import ember
        >>> ember.ones((2,)).requires_grad_().requires_grad
        True
        """
        from . import autograd

        ag = self._ag
        if ag is not None and not isinstance(ag, autograd.Leaf):
            if requires_grad:
                return self
            raise autograd.AutogradError("requires_grad: only leaf tensors can change it; use .detach() to get a "
                                         "tensor that does not require grad")
        if requires_grad:
            if self.dtype.kind != "f":
                raise autograd.AutogradError(f"requires_grad: only floating-point tensors can require grad, not "
                                             f"{self.dtype.name}")
            if ag is None:
                self._ag = autograd.Leaf()
                autograd._arm()
        else:
            self._ag = None
        return self

    @property
    def is_leaf(self) -> bool:
        """True unless a recorded op produced this tensor."""
        from .autograd import Leaf

        return self._ag is None or isinstance(self._ag, Leaf)

    @property
    def grad_fn(self):
        """The graph node that produced this tensor (None for leaves and untracked tensors)."""
        return None if self.is_leaf else self._ag

    @property
    def grad(self):
        """The gradient accumulated by ``backward`` (an ember Tensor on this tensor's device, of
        its shape and dtype), or None. Only leaves keep one, unless ``retain_grad()`` was
        called."""
        ag = self._ag
        if ag is None:
            return None
        if hasattr(ag, "grad"):
            return ag.grad
        return ag.retained[0] if ag.retained is not None else None

    @grad.setter
    def grad(self, value) -> None:
        from .autograd import AutogradError, Leaf

        ag = self._ag
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad: expected a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise ShapeError(f"grad: shape {value.shape} does not match the tensor's {self.shape}")
            value = value.detach()
        if ag is None:
            if value is None:
                return
            raise AutogradError("grad: the tensor does not require grad; call requires_grad_() first")
        if _CAPTURE[0] is not None:
            _CAPTURE[0].on_grad_set(self, value)
        if isinstance(ag, Leaf):
            ag.grad = value
        else:
            ag.retained = None if value is None else [value]

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in ``.grad`` during ``backward``."""
        from .autograd import AutogradError

        if self._ag is None:
            raise AutogradError("retain_grad: the tensor does not require grad")
        if not self.is_leaf and self._ag.retained is None:
            self._ag.retained = [None]

    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False, inputs=None) -> None:
        """Accumulate the gradient of this tensor with respect to every leaf that requires grad
        into the leaves' ``.grad``. ``gradient`` (the upstream gradient) is needed unless the
        tensor holds one value. The graph is freed unless ``retain_graph=True``.

        >>> import ember
        >>> x = ember.tensor([1.0, 2.0], requires_grad=True)
        >>> (x * 3.0).backward(ember.tensor([1.0, 0.5]))
        >>> x.grad.tolist()
        [3.0, 1.5]
        """
        from .autograd import backward

        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)

    def detach(self) -> "Tensor":
        """The same values (the same buffer, no copy) as a tensor that does not require grad."""
        t = Tensor._wrap(self._buf, self.shape, self.dtype, self.device)
        if _CAPTURE[0] is not None:
            _CAPTURE[0].alias(self, t)
        return t

    def _set_(self, new: "Tensor") -> "Tensor":
        """Make this tensor object hold ``new``'s values (same shape, dtype and device): the one
        in-place update, used by optimizers, ``nn.init`` and ``copy_``. The buffer reference is
        swapped, never written: tensors that shared the old buffer keep their values."""
        if new.shape != self.shape or new.dtype is not self.dtype or new.device != self.device:
            raise ShapeError(f"in-place update: {new.dtype.name}{list(new.shape)} on {new.device!r} does not match "
                             f"{self.dtype.name}{list(self.shape)} on {self.device!r}")
        if _CAPTURE[0] is not None:
            _CAPTURE[0].on_set(self, new)
        self._buf = new._buf
        return self

    def copy_(self, src) -> "Tensor":
        """Replace this tensor's values by ``src``'s (broadcast, cast and moved to this tensor's
        shape, dtype and device); returns self. Not recorded by autodiff (PyTorch users call it
        under ``no_grad`` on parameters).

        >>> import ember
        >>> w = ember.zeros((2,))
        >>> w.copy_(ember.tensor([1.0, 2.0])).tolist()
        [1.0, 2.0]
        """
        from .autograd import no_grad

        with no_grad():
            if not isinstance(src, Tensor):
                from .ops import full
                src = full(self.shape, src, dtype=self.dtype, device=self.device)
            src = src.to(self.device, self.dtype if src.dtype is not self.dtype else None)
            if src.shape != self.shape:
                src = src.broadcast_to(self.shape)
            return self._set_(src)

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

        raw = self._bytes()
        a = np.frombuffer(raw, dtype=_NP_NAMES[self.dtype.name]).reshape(self.shape)
        # a bytearray from to_bytes is the caller's own (the backend protocol): no second copy
        return a if isinstance(raw, bytearray) else a.copy()

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

    def __complex__(self):
        return complex(self.item())

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export (through a numpy copy: ember's buffers are not DLPack memory). Needs
        numpy."""
        kw = {} if max_version is None else {"max_version": max_version}
        if dl_device is not None and tuple(dl_device) != (1, 0):
            raise BufferError(f"__dlpack__: ember exports to the CPU (1, 0) only, not {dl_device}")
        return self.numpy().__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return (1, 0)   # kDLCPU: the export above is a host copy on every device

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, not {self.dtype.name}")
        return int(self.item())

    def to(self, device: str | None = None, dtype=None) -> "Tensor":
        """Move to another device and/or cast to another dtype."""
        t = self
        if device is not None and device != t.device:
            _dt.check_device(t.dtype, device)
            dst = get_backend(device)
            if getattr(dst, "storage", None) == "array" and getattr(t.backend, "storage", None) == "array":
                # python <-> wasm: the same immutable array.array buffers; share, don't copy
                moved = Tensor._wrap(t._buf, t.shape, t.dtype, device)
                if _GRAD[0] and t._ag is not None:
                    from .autograd import record_move
                    moved = record_move(t, moved)
                return moved if dtype is None else moved.astype(dtype)
            src = t
            t = Tensor._wrap(_transfer(None, src, device=device), t.shape, t.dtype, device)
            if _CAPTURE[0] is not None:   # a device move is a step of the plan, not a read
                from .registry import Meta
                _CAPTURE[0].record("to", _transfer, (src,), Meta(t.shape, t.dtype),
                                   {"device": device}, (t,), False)
            if _GRAD[0] and src._ag is not None:
                from .autograd import record_move
                t = record_move(src, t)
        if dtype is not None:
            t = t.astype(dtype)
        return t

    def to_device(self, device: str, /, *, stream=None) -> "Tensor":
        """The array API's name for ``to(device)``."""
        if stream is not None:
            raise ValueError("to_device: ember has no streams; pass stream=None")
        return self.to(device)

    def __array_namespace__(self, *, api_version=None):
        """The array API namespace of this tensor: the ``ember`` module."""
        if api_version is not None and api_version not in ("2021.12", "2022.12", "2023.12"):
            raise ValueError(f"__array_namespace__: ember implements array API 2023.12, not {api_version!r}")
        import ember

        return ember

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

_NP_NAMES = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8", "uint8": "u1", "bool": "?",
             "float64": "<f8", "int8": "i1", "int16": "<i2", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}


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
    """Python values -> little-endian bytes of ``dtype``. Floats convert like a cast (rounding,
    overflow -> inf); an int that the dtype cannot hold raises DTypeError (tensor data is never
    wrapped silently: ``tensor([300], dtype="uint8")`` is a mistake, ``astype`` wraps)."""
    if dtype.kind == "f":
        try:
            vals = [float(v) for v in flat]
        except OverflowError:
            big = next(v for v in flat if not isinstance(v, float) and abs(v) > 1e308)
            raise DTypeError(f"tensor: the Python int {big} is too large for {dtype.name}") from None
        if dtype is _dt.float16:
            vals = _dt.round_half(vals)
            return struct.pack(f"<{len(vals)}e", *vals)
        return array(dtype.typecode, vals).tobytes()
    if dtype is _dt.bool_:
        return bytes(1 if v else 0 for v in flat)
    lo, hi = _dt.int_range(dtype)
    vals = []
    for v in flat:
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise DTypeError(f"tensor: {v} cannot be stored in {dtype.name}")
            v = int(v)  # truncates toward zero, like a cast
        if not lo <= v <= hi:
            raise DTypeError(f"tensor: the value {v} is out of range for {dtype.name} ({lo}..{hi}); "
                             f"pick a wider dtype, or wrap explicitly with .astype(...)")
        vals.append(int(v))
    return array(dtype.typecode, vals).tobytes()


# dtypes whose little-endian bytes ``array(typecode)`` reads as they are (array's native order is
# little-endian here): decoded by ``array.tolist``, several times faster than ``struct.unpack``
# for small tensors. float16 ('e') and bool (any nonzero byte is True) go through struct.
_ARRAY_DECODE = {d: d.typecode for d in _dt.ALL
                 if sys.byteorder == "little" and d is not _dt.bool_ and d.fmt == d.typecode
                 and array(d.typecode).itemsize == d.itemsize}


def _decode(raw: bytes, dtype: _dt.DType) -> list:
    tc = _ARRAY_DECODE.get(dtype)
    if tc is not None:
        a = array(tc)
        a.frombytes(raw)
        return a.tolist()
    n = len(raw) // dtype.itemsize
    if dtype is _dt.bool_:
        return [b != 0 for b in raw]
    return list(struct.unpack(f"<{n}{dtype.fmt}", raw))


def _nest(flat, shape):
    if len(shape) == 1:   # (the common small reads: a vector, a row of logits)
        return flat
    if len(shape) == 2 and shape[0] == 1:
        return [flat]
    if not shape:
        return flat[0]
    if 0 in shape:
        def empty(s):
            return [] if s[0] == 0 else [empty(s[1:]) for _ in range(s[0])]
        return empty(shape)
    for n in reversed(shape[1:]):
        flat = [flat[i:i + n] for i in range(0, len(flat), n)]
    return flat


def tensor(data, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """Create a tensor from nested lists, a scalar, a numpy array, bytes-like with a dtype,
    or another Tensor (copied to ``device``/``dtype``). ``requires_grad=True`` makes it a leaf
    whose gradient ``backward`` accumulates in ``.grad``.

    >>> import ember
    >>> ember.tensor([[1, 2], [3, 4]]).dtype
    ember.int64
    >>> ember.tensor(3.5).shape
    ()
    """
    if requires_grad:
        t = tensor(data, dtype, device)
        if isinstance(data, Tensor):
            t = t.detach()   # a new leaf, like torch.tensor(t)
        return t.requires_grad_(True)
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
    _dt.check_device(dt, device)
    return Tensor._wrap(get_backend(device).from_bytes(_encode(flat, dt), tuple(shape), dt), shape, dt, device)


def from_numpy(a, device: str | None = None, dtype=None) -> Tensor:
    """Copy a numpy array into a tensor (float64 becomes float32, like ``ember.tensor``)."""
    import numpy as np

    device = device or default_device()
    a = np.asarray(a)
    if dtype is not None:
        dt = _dt.get(dtype)
    else:
        name = a.dtype.name
        dt = _dt.float32 if name == "float64" else _dt.get(name)
    _dt.check_device(dt, device)
    a = np.ascontiguousarray(a, dtype=_NP_NAMES[dt.name]).reshape(a.shape)  # ascontiguousarray makes 0-d 1-d
    backend = get_backend(device)
    if backend.__class__.__dict__.get("from_array") is not None:   # (the numpy backend: one copy)
        return Tensor._wrap(backend.from_array(a, dt), a.shape, dt, device)
    return Tensor._wrap(backend.from_bytes(a.tobytes(), a.shape, dt), a.shape, dt, device)


def from_bytes(data, shape, dtype, device: str | None = None) -> Tensor:
    """A tensor from little-endian bytes in ``dtype``'s layout (what ``to_bytes`` gives back)."""
    dt = _dt.get(dtype)
    shape = tuple(map(int, shape))
    if len(data) != prod(shape) * dt.itemsize:
        raise ShapeError(f"from_bytes: {len(data)} bytes do not hold shape {shape} of {dt.name} "
                         f"({prod(shape) * dt.itemsize} bytes)")
    device = device or default_device()
    _dt.check_device(dt, device)
    if data.__class__ is not bytes:   # (bytes are immutable: no copy needed)
        data = bytes(data)
    return Tensor._wrap(get_backend(device).from_bytes(data, shape, dt), shape, dt, device)
