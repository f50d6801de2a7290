"""``device="meta"``: tensors with a shape and a dtype but no data. Every op runs its shape and
dtype rules and no kernel, so a whole model can be traced for shapes without computing anything
(the ONNX loader checks graphs this way at load time). Reading a meta tensor raises NeedsData.

>>> import ember
>>> x = ember.ones((2, 3)).to("meta")
>>> (x @ ember.ones((3, 4)).to("meta")).shape
(2, 4)
"""
from __future__ import annotations

from ..registry import Meta


class NeedsData(Exception):
    """The values of a meta tensor were asked for; they only exist at run time."""


def _meta_kernel(out, *inputs, **attrs):
    return None if isinstance(out, Meta) else tuple(None for _ in out)


class _AnyKernel(dict):
    def get(self, name, default=None):
        return _meta_kernel

    def __contains__(self, name):
        return True


class MetaBackend:
    """Shapes and dtypes only; not listed by ``ember.devices()``."""

    name = "meta"
    kernels = _AnyKernel()

    @staticmethod
    def available():
        return True, "shapes only"

    def from_bytes(self, data, shape, dtype):
        return None

    def to_bytes(self, buf, shape, dtype):
        raise NeedsData("meta tensors have no data")

    async def to_bytes_async(self, buf, shape, dtype):
        raise NeedsData("meta tensors have no data")
