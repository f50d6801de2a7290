"""The webgpu kernel table: one entry per registry op (``ember.registry.OPS``).

Elementwise ops record lazy expressions (``fusion``); everything else dispatches a kernel from
``kernels/*.wgsl`` on realised inputs.
"""
from __future__ import annotations

from . import fusion


def _elementwise(rt, name):
    def kernel(out, *inputs, **attrs):
        return fusion.record(rt, name, out, [t._buf for t in inputs], tuple(sorted(attrs.items())))
    kernel.__name__ = f"webgpu_{name}"
    return kernel


def build_kernels(rt) -> dict:
    """Kernels for every op this backend implements, bound to runtime ``rt``."""
    k = {}
    for name in fusion.OPS_WGSL:
        k[name] = _elementwise(rt, name)
    k["full"] = lambda out, *, value, **_: fusion.const_buf(rt, out.shape, value, out.dtype)
    return k
