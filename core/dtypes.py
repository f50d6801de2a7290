"""dtypes and array-API type promotion.

>>> from ember import dtypes
>>> dtypes.result_type(dtypes.uint8, dtypes.int32).name
'int32'
>>> dtypes.result_type(dtypes.float16, dtypes.float32).name
'float32'
"""
from __future__ import annotations

import math
import struct

from .errors import DTypeError


class DType:
    """A tensor element type.

    ``kind`` is ``'f'`` (float), ``'i'`` (signed int), ``'u'`` (unsigned int) or ``'b'`` (bool).
    ``typecode`` is the ``array.array`` code the pure-Python backend stores it with, ``fmt`` the
    ``struct`` code of its little-endian bytes (the layout of safetensors and of every backend's
    ``to_bytes``).
    """

    __slots__ = ("name", "itemsize", "kind", "typecode", "fmt", "safetensors")

    def __init__(self, name: str, itemsize: int, kind: str, typecode: str, fmt: str, st: str):
        self.name = name
        self.itemsize = itemsize
        self.kind = kind
        self.typecode = typecode
        self.fmt = fmt
        self.safetensors = st

    @property
    def is_floating(self) -> bool:
        return self.kind == "f"

    @property
    def is_integer(self) -> bool:
        return self.kind in "iu"

    def __repr__(self) -> str:
        return f"ember.{self.name}"

    def __reduce__(self):
        return (get, (self.name,))


# float16 is stored as 16-bit bytes (numpy backend, weights files); the pure-Python backend keeps
# its values in array('f') rounded to half precision after every op, and computes in float32.
float32 = DType("float32", 4, "f", "f", "f", "F32")
float16 = DType("float16", 2, "f", "f", "e", "F16")
int32 = DType("int32", 4, "i", "i", "i", "I32")
int64 = DType("int64", 8, "i", "q", "q", "I64")
uint8 = DType("uint8", 1, "u", "B", "B", "U8")
bool_ = DType("bool", 1, "b", "B", "?", "BOOL")
# the rest of the array API's real dtypes: held by the python and numpy backends only (WGSL has
# 4-byte elements and no f64; see WIDE / check_device)
float64 = DType("float64", 8, "f", "d", "d", "F64")
int8 = DType("int8", 1, "i", "b", "b", "I8")
int16 = DType("int16", 2, "i", "h", "h", "I16")
uint16 = DType("uint16", 2, "u", "H", "H", "U16")
uint32 = DType("uint32", 4, "u", "I", "I", "U32")
uint64 = DType("uint64", 8, "u", "Q", "Q", "U64")

ALL = (float32, float16, int32, int64, uint8, bool_, float64, int8, int16, uint16, uint32, uint64)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool_": bool_, "float": float32, "int": int64, "half": float16, "long": int64,
                 "double": float64, "short": int16})

# dtypes only the python and numpy backends hold; other devices refuse them (check_device)
WIDE = frozenset((float64, int8, int16, uint16, uint32, uint64))
FULL_DEVICES = {"python", "numpy", "meta"}   # a set: ember.remote.connect adds a remote device whose server holds them


def check_device(dtype: "DType", device: str) -> None:
    """DTypeError when ``device`` cannot hold ``dtype`` (the seam every tensor creation and
    device move passes: ``tensor``, ``from_bytes``, ``full``/``arange``, ``cast``, ``to``)."""
    if dtype in WIDE and device not in FULL_DEVICES:
        raise DTypeError(f"{dtype.name} tensors are not supported on device {device!r} (it holds "
                         f"{', '.join(d.name for d in ALL if d not in WIDE)}); keep them on device='python' "
                         f"or 'numpy', or cast with .astype(...) first")


def int_range(dtype: "DType") -> tuple:
    """(min, max) of an integer dtype."""
    bits = dtype.itemsize * 8
    if dtype.kind == "u":
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1

default_float = float32
default_int = int64


def get(dtype) -> DType:
    """Accept a DType, its name, a numpy dtype or a Python type and return the ember DType."""
    if dtype.__class__ is str:   # (the usual case after a DType: a name, e.g. from_bytes(..., "float32"))
        d = _BY_NAME.get(dtype)
        if d is not None:
            return d
    elif isinstance(dtype, DType):
        return dtype
    if dtype is float:
        return default_float
    if dtype is int:
        return default_int
    if dtype is bool:
        return bool_
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):  # numpy scalar types (np.float32) have a descriptor there
        name = dtype.__name__ if isinstance(dtype, type) else str(dtype)
    if name == "bool8":
        name = "bool"
    d = _BY_NAME.get(name)
    if d is None:
        raise DTypeError(f"unknown dtype {dtype!r}; ember supports {', '.join(x.name for x in ALL)}")
    return d


_SIGNED = (int8, int16, int32, int64)
_UNSIGNED = (uint8, uint16, uint32, uint64)
_FLOATS = (float16, float32, float64)


def result_type(a: DType, b: DType) -> DType:
    """Array-API promotion of two dtypes (mixed int/float gives the float type, like PyTorch;
    bool with a number gives the number's type). uint64 with a signed int has no common
    integer type: DTypeError, cast one side first."""
    if a is b:
        return a
    if a is bool_:
        return b
    if b is bool_:
        return a
    if a.kind == "f" and b.kind == "f":
        return a if a.itemsize >= b.itemsize else b
    if a.kind == "f":
        return a
    if b.kind == "f":
        return b
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    u, i = (a, b) if a.kind == "u" else (b, a)
    if i.itemsize > u.itemsize:
        return i
    for s in _SIGNED:
        if s.itemsize > u.itemsize:
            return s
    raise DTypeError(f"no integer dtype holds both {a.name} and {b.name} values; cast one of them "
                     f"(e.g. .astype(ember.float64)) first")


def scalar_dtype(value, other: DType | None = None) -> DType:
    """dtype a Python scalar takes next to a tensor of dtype ``other`` (weak scalar typing:
    ``x_f16 * 2.0`` stays float16, ``x_int + 1.5`` becomes float32)."""
    if isinstance(value, bool):
        return other if other is not None else bool_
    if isinstance(value, int):
        if other is not None and other is not bool_:
            return other
        return default_int
    if isinstance(value, float):
        if other is not None and other.kind == "f":
            return other
        return default_float
    raise DTypeError(f"cannot make a tensor from a scalar of type {type(value).__name__}")


def round_half(values) -> list:
    """Python floats -> the nearest float16 values, as Python floats (ties to even; overflow ->
    +-inf, like a real cast). The python backend keeps float16 tensors this way in array('f')."""
    values = values if isinstance(values, list) else list(values)
    n = len(values)
    try:
        return list(struct.unpack(f"<{n}e", struct.pack(f"<{n}e", *values)))
    except (OverflowError, struct.error):
        pass
    out = []
    pack = struct.Struct("<e").pack
    unpack = struct.Struct("<e").unpack
    for v in values:
        try:
            out.append(unpack(pack(v))[0])
        except (OverflowError, struct.error):
            out.append(math.copysign(math.inf, v))
    return out
