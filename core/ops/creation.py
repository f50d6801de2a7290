"""Creation ops: full, zeros, ones, arange, eye, *_like."""
from __future__ import annotations

from .. import dtypes as _dt
from ..backends import default_device
from ..registry import apply, op

__all__ = ["full", "zeros", "ones"]

op("full", kind="create", shape=lambda *, shape, value, dtype, **_: tuple(shape),
   dtype=lambda *, shape, value, dtype, **_: dtype,
   doc="A tensor of ``shape`` filled with ``value``.")


def _shape(shape) -> tuple:
    return (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)


def full(shape, fill_value, *, dtype=None, device: str | None = None):
    """A tensor of ``shape`` filled with ``fill_value``.

    >>> import ember
    >>> ember.full((2,), 7).tolist()
    [7, 7]
    """
    dt = _dt.get(dtype) if dtype is not None else _dt.scalar_dtype(fill_value)
    return apply("full", shape=_shape(shape), value=fill_value, dtype=dt, device=device or default_device())


def zeros(shape, *, dtype=None, device: str | None = None):
    """A tensor of zeros (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 0, dtype=dtype or _dt.default_float, device=device)


def ones(shape, *, dtype=None, device: str | None = None):
    """A tensor of ones (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 1, dtype=dtype or _dt.default_float, device=device)
