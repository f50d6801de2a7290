"""Creation ops: full, zeros, ones, arange, eye, linspace, *_like.

Primitives: ``full`` and ``arange``; the rest are built from them.

>>> import ember
>>> ember.arange(5).tolist()
[0, 1, 2, 3, 4]
>>> ember.eye(2, 3, k=1).tolist()
[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..backends import default_device
from .. import limits as _limits
from ..errors import DTypeError, ShapeError
from ..limits import max_tensor_bytes, set_max_tensor_bytes
from ..registry import apply, op

__all__ = ["full", "zeros", "ones", "full_like", "zeros_like", "ones_like", "arange", "eye", "linspace",
           "empty", "empty_like", "set_max_tensor_bytes", "max_tensor_bytes"]


def _shape_rule(*, shape, **_):
    return tuple(shape)


op("full", kind="create", shape=_shape_rule, dtype=lambda *, dtype, **_: dtype,
   doc="A tensor of ``shape`` filled with ``value`` (already converted to ``dtype``'s Python type).")
op("arange", kind="create", shape=lambda *, num, **_: (num,), dtype=lambda *, dtype, **_: dtype,
   doc="``num`` values ``start + i * step`` (computed in float64 / exact ints, then stored).")


def _shape(shape, op: str = "full") -> tuple:
    """A shape as a tuple of Python ints: integers only (numpy ints too; not 2.5, "3" or True),
    none negative, at most ``limits.MAX_NDIM`` axes; ShapeError otherwise."""
    return _limits.check_shape(op, shape)


def _value(value, dt, op):
    """The fill value as ``dt``'s Python type (so every backend stores the same thing). An int
    outside an integer dtype's range, or a float that no int of it holds, is a DTypeError."""
    if not isinstance(value, (int, float)):  # numpy scalars, 0-d tensors
        value = value.item() if hasattr(value, "item") else value
        if not isinstance(value, (int, float)):
            raise DTypeError(f"{op}: the fill value must be a number, not {type(value).__name__}")
    if dt is _dt.bool_:
        return bool(value)
    if dt.kind == "f":
        try:
            return float(value)
        except OverflowError:
            raise DTypeError(f"{op}: the int {value} is too large for {dt.name}") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DTypeError(f"{op}: cannot fill an {dt.name} tensor with {value}")
        value = int(value)  # truncates toward zero, like a cast
    lo, hi = _range(dt)
    if not lo <= value <= hi:
        raise DTypeError(f"{op}: {value} does not fit {dt.name} (range {lo}..{hi})")
    return int(value)


_range = _dt.int_range


def full(shape, fill_value, *, dtype=None, device: str | None = None, requires_grad: bool = False):
    """A tensor of ``shape`` filled with ``fill_value`` (dtype from the value unless given:
    bool, int64 or float32); ``requires_grad=True`` makes it a leaf that collects ``.grad``.

    >>> import ember
    >>> ember.full((2,), 7).tolist()
    [7, 7]
    """
    dt = _dt.get(dtype) if dtype is not None else _dt.scalar_dtype(fill_value)
    device = device or default_device()
    _dt.check_device(dt, device)
    t = apply("full", shape=_shape(shape), value=_value(fill_value, dt, "full"), dtype=dt, device=device)
    return t.requires_grad_() if requires_grad else t


def zeros(shape, *, dtype=None, device: str | None = None, requires_grad: bool = False):
    """A tensor of zeros (float32 unless ``dtype`` says otherwise).

    >>> import ember
    >>> ember.zeros((2, 2), dtype="int32").tolist()
    [[0, 0], [0, 0]]
    """
    return full(shape, 0, dtype=dtype or _dt.default_float, device=device, requires_grad=requires_grad)


def ones(shape, *, dtype=None, device: str | None = None, requires_grad: bool = False):
    """A tensor of ones (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 1, dtype=dtype or _dt.default_float, device=device, requires_grad=requires_grad)


def empty(shape, *, dtype=None, device: str | None = None):
    """An uninitialised tensor in the array API; ember's tensors are immutable, so zeros."""
    return zeros(shape, dtype=dtype, device=device)


def empty_like(x, *, dtype=None, device: str | None = None):
    """``empty`` shaped like ``x`` (zeros, same dtype and device unless given)."""
    return full_like(x, 0, dtype=dtype, device=device)


def full_like(x, fill_value, *, dtype=None, device: str | None = None):
    """A tensor shaped like ``x`` (same dtype and device unless given) filled with ``fill_value``.

    >>> import ember
    >>> ember.full_like(ember.tensor([1, 2]), 5).tolist()
    [5, 5]
    """
    return full(x.shape, fill_value, dtype=dtype or x.dtype, device=device or x.device)


def zeros_like(x, *, dtype=None, device: str | None = None):
    """Zeros shaped like ``x`` (same dtype and device unless given)."""
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, *, dtype=None, device: str | None = None):
    """Ones shaped like ``x`` (same dtype and device unless given)."""
    return full_like(x, 1, dtype=dtype, device=device)


def _number(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if hasattr(v, "item") and not isinstance(v, bool):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DTypeError(f"{name}: expected a Python number, got {type(v).__name__}")
    return v


def arange(start, stop=None, step=1, *, dtype=None, device: str | None = None):
    """Evenly spaced values in [start, stop): ``ceil((stop - start) / step)`` of them. int64 when
    start, stop and step are all ints, else float32 (unless ``dtype`` is given).

    >>> import ember
    >>> ember.arange(1, 2, 0.25).tolist()
    [1.0, 1.25, 1.5, 1.75]
    """
    if stop is None:
        start, stop = 0, start
    start, stop, step = (_number(v, "arange") for v in (start, stop, step))
    if step == 0:
        raise ShapeError("arange: step must not be 0")
    ints = all(isinstance(v, int) for v in (start, stop, step))
    dt = _dt.get(dtype) if dtype is not None else (_dt.default_int if ints else _dt.default_float)
    if ints:
        num = max(0, -((start - stop) // step))  # exact ceil for ints
    else:
        span = (stop - start) / step
        if not math.isfinite(span):
            raise ShapeError(f"arange: start={start}, stop={stop}, step={step} give no finite length")
        num = max(0, math.ceil(span))
    _limits.check_alloc("arange", (num,), dt)
    if dt.kind != "f":
        start, step = int(start), int(step)
        if num and dt is not _dt.bool_:
            lo, hi = _range(dt)
            last = start + (num - 1) * step
            if not (lo <= start <= hi and lo <= last <= hi):
                raise DTypeError(f"arange: values {start}..{last} do not fit {dt.name} (range {lo}..{hi})")
    device = device or default_device()
    _dt.check_device(dt, device)
    return apply("arange", start=start, step=step, num=num, dtype=dt, device=device)


def linspace(start, stop, num: int, *, dtype=None, device: str | None = None, endpoint: bool = True):
    """``num`` evenly spaced values from ``start`` to ``stop`` (included when ``endpoint``),
    computed in float64 and rounded once (float32 unless ``dtype`` is given).

    >>> import ember
    >>> ember.linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    from .movement import concat

    start, stop = float(_number(start, "linspace")), float(_number(stop, "linspace"))
    (num,) = _shape((num,), "linspace")
    dt = _dt.get(dtype) if dtype is not None else _dt.default_float
    _limits.check_alloc("linspace", (num,), dt)
    device = device or default_device()
    fdt = dt if dt.kind == "f" else _dt.default_float
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else 0.0
    if endpoint and num > 1:  # the last value is exactly stop, like numpy
        y = concat([apply("arange", start=start, step=step, num=num - 1, dtype=fdt, device=device),
                    full((1,), stop, dtype=fdt, device=device)])
    else:
        y = apply("arange", start=start, step=step, num=num, dtype=fdt, device=device)
    return y if fdt is dt else y.astype(dt)


def eye(n_rows: int, n_cols: int | None = None, *, k: int = 0, dtype=None, device: str | None = None):
    """A 2-D tensor with ones on diagonal ``k`` (float32 unless ``dtype`` is given).

    >>> import ember
    >>> ember.eye(2).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    n_cols = n_rows if n_cols is None else n_cols
    n_rows, n_cols = _shape((n_rows, n_cols), "eye")
    if isinstance(k, bool) or not isinstance(k, int):
        raise ShapeError(f"eye: k must be an int, not {type(k).__name__}")
    dt = _dt.get(dtype) if dtype is not None else _dt.default_float
    _limits.check_alloc("eye", (n_rows, n_cols), dt)
    k = max(-n_rows, min(k, n_cols))   # a diagonal beyond the matrix: all zeros (any huge k)
    device = device or default_device()
    rows = arange(k, n_rows + k, device=device).reshape((n_rows, 1))
    cols = arange(n_cols, device=device).reshape((1, n_cols))
    return (rows == cols).astype(dt)
