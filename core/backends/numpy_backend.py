"""The numpy backend (optional): buffers are C-contiguous numpy arrays of the tensor's shape.
float16 stays float16 in memory; arithmetic on it runs in float32 and rounds back."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64,
             "uint8": np.uint8, "bool": np.bool_}


def np_dtype(dtype):
    return NP_DTYPES[dtype.name]


class NumpyBackend:
    """``device="numpy"``: numpy arrays, vectorised kernels."""

    name = "numpy"

    def __init__(self):
        self.kernels = dict(KERNELS)

    @staticmethod
    def available():
        return True, f"numpy {np.__version__}"

    def from_bytes(self, data, shape, dtype):
        return np.frombuffer(bytes(data), dtype=np.dtype(np_dtype(dtype)).newbyteorder("<")).astype(
            np_dtype(dtype), copy=True).reshape(shape)

    def to_bytes(self, buf, shape, dtype) -> bytes:
        return np.ascontiguousarray(buf, dtype=np.dtype(np_dtype(dtype)).newbyteorder("<")).tobytes()

    async def to_bytes_async(self, buf, shape, dtype) -> bytes:
        return self.to_bytes(buf, shape, dtype)


def _full(out, *, shape, value, dtype, **_):
    return np.full(out.shape, value, dtype=np_dtype(out.dtype))


KERNELS = {
    "full": _full,
    "add": lambda out, a, b: np.add(a._buf, b._buf).astype(np_dtype(out.dtype), copy=False),
    "multiply": lambda out, a, b: np.multiply(a._buf, b._buf).astype(np_dtype(out.dtype), copy=False),
    "exp": lambda out, x: np.exp(x._buf).astype(np_dtype(out.dtype), copy=False),
}

from .numpy_nn import KERNELS as _NN_KERNELS  # noqa: E402

KERNELS.update(_NN_KERNELS)
