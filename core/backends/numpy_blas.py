"""The numpy backend's matrix products, each on the number of BLAS threads its size pays for.

OpenBLAS (numpy's BLAS in its wheels) splits every GEMM above ~2**18 multiply-adds across all
its threads. A split GEMM waits for its slowest thread: on a loaded machine (two cores shared
with other processes) that thread is often not scheduled for milliseconds, so a network of
mid-sized products (a CNN's convolutions at batch 1, a small transformer's linears) ran 5-25x
slower on two threads than on one. ``matmul`` runs products below ``PARALLEL_MACS``
multiply-adds (a few milliseconds on one core) on one thread and restores the count after; the
large ones keep the threads they were given (``OPENBLAS_NUM_THREADS``, threadpoolctl...).

OpenBLAS's thread count is reached through ctypes in the library numpy has already loaded
(``openblas_set_num_threads`` and ``openblas_get_num_threads``, with the scipy-openblas
wheels' prefix and 64-bit-integer suffix). Where there is no such library (another BLAS,
Pyodide, no ctypes) ``matmul`` is ``np.matmul``. ``EMBER_NUMPY_BLAS_SPLIT=on`` turns the
rule off (every product on OpenBLAS's own choice).

The count is process-wide: two Python threads multiplying at once may see each other's setting
for one product (the results are the same either way; only the speed differs).

>>> import numpy as np
>>> a = np.ones((2, 3), np.float32)
>>> matmul(a, a.T).tolist()
[[3.0, 3.0], [3.0, 3.0]]
"""
from __future__ import annotations

import os

import numpy as np

# products with at least this many multiply-adds (per matrix of a stack) keep the threads
PARALLEL_MACS = 1 << 27
# OpenBLAS runs products up to 65536 * 4 multiply-adds on one thread itself
_OWN_SINGLE = 1 << 18

_api = None          # (get, set) ctypes functions; False when there are none


def _loaded_openblas() -> list:
    """Paths of the OpenBLAS libraries this process has mapped (Linux), else [] ."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def _find():
    """(get, set) of the loaded OpenBLAS's thread count, or False."""
    if os.environ.get("EMBER_NUMPY_BLAS_SPLIT", "") == "on":
        return False
    try:
        import ctypes
    except ImportError:
        return False
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", "_64", ""):
                try:
                    get = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                    put = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                except AttributeError:
                    continue
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return get, put
    return False


def api():
    """The (get, set) pair, looked up on first use (False when unavailable)."""
    global _api
    if _api is None:
        _api = _find()
    return _api


def macs(a_shape: tuple, b_shape: tuple) -> int:
    """Multiply-adds of one matrix product of ``a @ b`` (per matrix of a stack)."""
    m = a_shape[-2] if len(a_shape) > 1 else 1
    n = b_shape[-1] if len(b_shape) > 1 else 1
    return m * n * (a_shape[-1] if a_shape else 1)


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)``, on one BLAS thread when each product is mid-sized (see the
    module docstring)."""
    if _api is not False and _OWN_SINGLE < macs(a.shape, b.shape) < PARALLEL_MACS:
        fns = _api or api()
        if fns:
            get, put = fns
            n0 = get()
            if n0 > 1:
                put(1)
                try:
                    return np.matmul(a, b, out=out)
                finally:
                    put(n0)
    return np.matmul(a, b, out=out)
