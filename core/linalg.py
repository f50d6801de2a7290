"""``ember.linalg``: the array API standard's linear-algebra extension (the functions it names,
over ember's ops; ``ember.ops.linalg`` is the op family that declares ``matmul``).

>>> import ember
>>> ember.linalg.vecdot(ember.tensor([1.0, 2.0]), ember.tensor([3.0, 4.0])).item()
11.0
"""
from __future__ import annotations

from .ops import matmul, matrix_transpose  # noqa: F401
from .ops.extra import tensordot, vecdot  # noqa: F401

__all__ = ["matmul", "matrix_transpose", "tensordot", "vecdot"]
