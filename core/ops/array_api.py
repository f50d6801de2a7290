"""The array API standard's namespace functions that are not ops: ``asarray``, dtype
inspection (``finfo``, ``iinfo``, ``isdtype``, ``can_cast``, ``result_type``), the inspection
namespace (``__array_namespace_info__``) and the constants. ``ember`` itself is the namespace
(``x.__array_namespace__()`` returns it); measured with the standard's own test suite.

>>> import ember
>>> ember.asarray([1, 2], dtype=ember.int16).dtype
ember.int16
>>> ember.iinfo(ember.uint8).max, ember.finfo(ember.float32).bits
(255, 32)
>>> ember.result_type(ember.int8, ember.uint8).name
'int16'
"""
from __future__ import annotations

import math
import struct

from .. import dtypes as _dt
from ..backends import default_device, devices
from ..errors import DTypeError
from ..tensor import Tensor, tensor

__all__ = ["asarray", "finfo", "iinfo", "isdtype", "can_cast", "result_type", "e", "pi", "inf", "nan",
           "newaxis", "from_dlpack", "real", "imag", "conj"]

e = math.e
pi = math.pi
inf = math.inf
nan = math.nan
newaxis = None


def asarray(obj, /, *, dtype=None, device=None, copy=None) -> Tensor:
    """``obj`` (a Tensor, Python scalar, nested sequence or numpy array) as a tensor. Tensors
    are immutable, so ``copy`` never matters for correctness: ``copy=False`` is honoured (no
    copy is made when none is needed, and a needed one raises ValueError as the standard says).

    >>> import ember
    >>> ember.asarray(2.5).shape, ember.asarray([[1, 2]]).dtype
    ((), ember.int64)
    """
    dt = None if dtype is None else _dt.get(dtype)
    if isinstance(obj, Tensor):
        needs = (dt is not None and dt is not obj.dtype) or (device is not None and device != obj.device)
        if copy is False and needs:
            raise ValueError("asarray: copy=False but a copy is needed (another dtype or device)")
        out = obj.to(device, dt if dt is not obj.dtype else None)
        if copy and out is obj:
            out = Tensor._wrap(obj._buf, obj.shape, obj.dtype, obj.device)  # immutable: a new handle suffices
        return out
    if copy is False:
        raise ValueError(f"asarray: copy=False cannot wrap a {type(obj).__name__} without copying")
    if hasattr(obj, "__array_interface__") and hasattr(obj, "dtype"):
        from ..tensor import from_numpy

        name = "bool" if obj.dtype.name == "bool" else obj.dtype.name
        return from_numpy(obj, device=device, dtype=dt if dt is not None else name)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        raise DTypeError("asarray: buffers need a dtype and shape; use ember.from_bytes(data, shape, dtype)")
    return tensor(obj, dtype=dt, device=device)


def from_dlpack(x, /, *, device=None, copy=None) -> Tensor:
    """A tensor from any DLPack-exporting array (numpy, torch, ember...): a copy (needs numpy)."""
    import numpy as np

    if isinstance(x, Tensor):   # immutable: sharing is a valid copy=False, and copy=True unobservable
        return x.to(device) if device is not None else x
    if copy is False:
        raise ValueError("from_dlpack: ember copies foreign arrays into its own buffers; copy=False is refused")
    a = np.from_dlpack(x)
    return asarray(a, device=device)


def real(x: Tensor, /) -> Tensor:
    """The real part: ember has no complex dtypes, so ``x`` itself."""
    return x


def imag(x: Tensor, /) -> Tensor:
    """The imaginary part: ember has no complex dtypes, so zeros like ``x``."""
    from .creation import zeros_like

    return zeros_like(x)


def conj(x: Tensor, /) -> Tensor:
    """The complex conjugate: ember has no complex dtypes, so ``x`` itself."""
    return x


class finfo_object:
    """Machine limits of a floating-point dtype (``ember.finfo``)."""

    __slots__ = ("bits", "eps", "max", "min", "smallest_normal", "dtype")

    def __init__(self, dtype):
        self.dtype = dtype
        self.bits = dtype.itemsize * 8
        if dtype is _dt.float64:
            self.eps, self.max, self.smallest_normal = 2.0 ** -52, 1.7976931348623157e308, 2.0 ** -1022
        elif dtype is _dt.float32:
            self.eps, self.max, self.smallest_normal = 2.0 ** -23, struct.unpack("<f", b"\xff\xff\x7f\x7f")[0], 2.0 ** -126
        else:
            self.eps, self.max, self.smallest_normal = 2.0 ** -10, 65504.0, 2.0 ** -14
        self.min = -self.max

    def __repr__(self) -> str:
        return f"finfo(dtype={self.dtype.name}, bits={self.bits}, eps={self.eps}, max={self.max})"


class iinfo_object:
    """Limits of an integer dtype (``ember.iinfo``)."""

    __slots__ = ("bits", "max", "min", "dtype")

    def __init__(self, dtype):
        self.dtype = dtype
        self.bits = dtype.itemsize * 8
        self.min, self.max = _dt.int_range(dtype)

    def __repr__(self) -> str:
        return f"iinfo(dtype={self.dtype.name}, min={self.min}, max={self.max})"


def _dtype_of(x):
    return x.dtype if isinstance(x, Tensor) else _dt.get(x)


def finfo(type, /) -> finfo_object:  # noqa: A002
    """Limits of a float dtype (or of a float tensor's dtype)."""
    dt = _dtype_of(type)
    if dt.kind != "f":
        raise DTypeError(f"finfo: {dt.name} is not a floating-point dtype (use iinfo)")
    return finfo_object(dt)


def iinfo(type, /) -> iinfo_object:  # noqa: A002
    """Limits of an integer dtype (or of an integer tensor's dtype)."""
    dt = _dtype_of(type)
    if dt.kind not in "iu":
        raise DTypeError(f"iinfo: {dt.name} is not an integer dtype (use finfo)")
    return iinfo_object(dt)


_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "complex floating": "", "numeric": "iuf"}


def isdtype(dtype, kind) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, a kind name ('bool', 'signed integer',
    'unsigned integer', 'integral', 'real floating', 'complex floating', 'numeric') or a tuple
    of those."""
    dtype = _dt.get(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; one of {', '.join(_KINDS)}")
        return dtype.kind in _KINDS[kind]
    return dtype is _dt.get(kind)


def can_cast(from_, to, /) -> bool:
    """Whether ``from_`` (a dtype or tensor) converts to ``to`` without losing values under the
    promotion rules (bool to anything, int to a wider int or to any float, float to a wider
    float)."""
    a, b = _dtype_of(from_), _dt.get(to)
    if a is b or a is _dt.bool_:
        return True
    if b is _dt.bool_ or (a.kind == "f" and b.kind != "f"):
        return False
    if b.kind == "f":
        return a.kind != "f" or b.itemsize >= a.itemsize
    try:
        return _dt.result_type(a, b) is b
    except DTypeError:
        return False


def result_type(*arrays_and_dtypes):
    """The dtype that promoting the given tensors, dtypes and Python scalars gives."""
    dts = [x.dtype if isinstance(x, Tensor) else x for x in arrays_and_dtypes]
    typed = [_dt.get(d) for d in dts if not isinstance(d, (bool, int, float, complex))]
    if not typed:
        if not dts:
            raise ValueError("result_type: needs at least one tensor or dtype")
        typed = [_dt.scalar_dtype(dts[0])]
    r = typed[0]
    for d in typed[1:]:
        r = _dt.result_type(r, d)
    for s in dts:
        if isinstance(s, (bool, int, float)):
            r = _dt.result_type(r, _dt.scalar_dtype(s, r))
    return r


class _Info:
    """``ember.__array_namespace_info__()``: what this namespace supports, per device."""

    def capabilities(self):
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return default_device()

    def devices(self):
        return devices()

    def default_dtypes(self, *, device=None):
        return {"real floating": _dt.default_float, "integral": _dt.default_int, "indexing": _dt.int64}

    def dtypes(self, *, device=None, kind=None):
        device = device or default_device()
        ok = [d for d in _dt.ALL if d is not _dt.float16 and (d not in _dt.WIDE or device in _dt.FULL_DEVICES)]
        if kind is not None:
            ok = [d for d in ok if isdtype(d, kind)]
        return {d.name: d for d in ok}


def __array_namespace_info__():
    return _Info()
