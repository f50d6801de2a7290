"""The numpy backend's matrix products and its one parallel loop, made for a shared machine.

OpenBLAS (numpy's BLAS in its wheels) splits every GEMM above ~2**18 multiply-adds across all
its threads, statically: a split GEMM waits for its slowest thread. On a loaded machine (two
cores shared with other processes) that thread is often not scheduled for milliseconds, so a
network of mid-sized products (a CNN's convolutions at batch 1, a small transformer's linears)
ran 5-25x slower on two threads than on one. So here:

- ``matmul`` runs products below ``PARALLEL_MACS`` multiply-adds on one OpenBLAS thread (the
  count is restored after: the user's own numpy is left as it was). Products of a matrix (or a
  C-contiguous stack of rows) by a matrix with at least ``SPLIT_MACS`` multiply-adds are cut
  into blocks of rows that ``parallel_for`` hands out;
- ``parallel_for(n, fn)`` runs ``fn(i)`` for every i < n on the calling thread and on helper
  threads (as many as OpenBLAS was given, less one), each item taken by whichever thread is
  free (work-sharing, not a static split). A helper that gets no core takes no item and the
  caller runs them all, so a loaded machine costs about what one thread does and an idle one
  gets the second core. numpy releases the GIL in its loops and BLAS calls, so items that are
  large numpy operations (a block of a product, an im2col band, a chunk of GELU) overlap.

A block of rows is computed by the same kernel over the same summed axis as the whole (blocks
have at least 64 rows, above OpenBLAS's small-matrix kernels), so results are the same bits on
any number of threads (tested) where the BLAS does that: ``split_same_bits`` checks it once per
process on two products (on an AMD EPYC with AVX-512 under OPENBLAS_CORETYPE=Haswell a block of
rows differed from the whole product in the last bit), and products are not split where it fails.

OpenBLAS's thread count is reached through ctypes in the library numpy has already loaded
(``openblas_set_num_threads`` and ``openblas_get_num_threads``, with the scipy-openblas
wheels' prefix and 64-bit-integer suffix). Where there is no such library (another BLAS,
Pyodide, no ctypes) ``matmul`` is ``np.matmul`` and ``parallel_for`` a plain loop.
``EMBER_NUMPY_BLAS_SPLIT=on`` turns all of this off (every product on OpenBLAS's own choice,
loops on one thread); ``EMBER_NUMPY_THREADS=N`` caps the threads ``parallel_for`` uses (1: no
helper threads).

The OpenBLAS count is process-wide: two Python threads multiplying at once may see each
other's setting for one product (only the speed differs).

>>> import numpy as np
>>> a = np.ones((2, 3), np.float32)
>>> matmul(a, a.T).tolist()
[[3.0, 3.0], [3.0, 3.0]]
>>> out = []
>>> parallel_for(3, out.append)
>>> sorted(out)
[0, 1, 2]
"""
from __future__ import annotations

import itertools
import os
import threading

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


class _Job:
    """``fn(i)`` for i in range(n), items claimed one at a time by whoever runs ``work``."""

    __slots__ = ("fn", "n", "next", "busy", "error")

    def __init__(self, fn, n):
        self.fn, self.n = fn, n
        self.next = itertools.count()      # next() is atomic under the GIL
        self.busy = threading.Lock()       # held by a helper while it claims and runs items
        self.error = None

    def work(self):
        while True:
            i = next(self.next)
            if i >= self.n:
                return
            self.fn(i)


class _Helper:
    """A daemon thread that joins the calling thread's current job when it gets a core."""

    def __init__(self):
        self.cv = threading.Condition()
        self.job = None
        self.gen = 0
        threading.Thread(target=self._loop, daemon=True, name="ember-numpy-helper").start()

    def post(self, job):
        with self.cv:
            self.job = job
            self.gen += 1
            self.cv.notify()

    def clear(self, job):
        """Forget ``job`` (its arrays) once the caller is done with it."""
        with self.cv:
            if self.job is job:
                self.job = None

    def _loop(self):
        _local.inside = True                    # (loops inside an item run serially here)
        seen = 0
        while True:
            with self.cv:
                while self.gen == seen:
                    self.cv.wait()
                seen, job = self.gen, self.job
            if job is None:
                continue
            with job.busy:
                try:
                    job.work()
                except BaseException as exc:    # handed to the caller, which re-raises it
                    job.error = exc
                    job.n = 0                   # (no more items for anyone)
            job = None


def _forget_helpers():
    """In a forked child the helper threads are gone (and their locks may be held): start anew."""
    global _helpers_lock
    _helpers.clear()
    _helpers_lock = threading.Lock()


_helpers: list = []
_helpers_lock = threading.Lock()
_local = threading.local()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _cap() -> int:
    try:
        return max(1, int(os.environ.get("EMBER_NUMPY_THREADS", "8")))
    except ValueError:
        return 8


_CAP = _cap()


def threads() -> int:
    """How many threads a parallel loop may use: OpenBLAS's count (1 without OpenBLAS control),
    at most ``EMBER_NUMPY_THREADS``."""
    fns = _api if _api is not None else api()
    return min(_CAP, max(1, fns[0]())) if fns else 1


def parallel_for(n: int, fn) -> None:
    """``fn(i)`` for every i in range(n), on this thread and up to ``threads() - 1`` helper
    threads, each item claimed by whoever is free (see the module docstring). OpenBLAS runs on
    one thread meanwhile (the loop is the parallelism); a loop inside an item runs serially.
    The first exception an item raises is raised here once every thread has stopped."""
    t = threads() if n > 1 and not getattr(_local, "inside", False) else 1
    if t <= 1:
        for i in range(n):
            fn(i)
        return
    get, put = _api
    n0 = get()
    job = _Job(fn, n)
    with _helpers_lock:
        while len(_helpers) < t - 1:
            _helpers.append(_Helper())
        helpers = _helpers[:t - 1]
    put(1)
    _local.inside = True
    try:
        for h in helpers:
            h.post(job)
        try:
            job.work()
        except BaseException:
            job.n = 0
            raise
        finally:
            with job.busy:      # a helper still inside an item finishes it first
                pass
            for h in helpers:
                h.clear(job)
    finally:
        _local.inside = False
        put(n0)
    if job.error is not None:
        raise job.error


# products (of a matrix or C-contiguous rows, by a matrix) with at least this many multiply-adds
# are cut into blocks of rows run by parallel_for, when more than one thread is allowed
SPLIT_MACS = 1 << 23
# rows of a block at least, blocks per thread at most. Blocks are rows only, of balanced sizes:
# OpenBLAS (SkylakeX and Haswell kernels) gave the whole product's bits for every row block of
# 64 rows or more in 856 random products of 2**23+ multiply-adds; blocks of 8-32 rows (its
# small-matrix kernels) and blocks of columns of any width often did not
_MIN_ROWS = 64
_BLOCKS_PER_THREAD = 2


_SAME_BITS: list = []


def split_same_bits() -> bool:
    """Whether this BLAS gives a block of rows the bits of the same rows of the whole product (float32
    and float64; ``_split``'s blocks for two threads, on one BLAS thread each), probed once per process."""
    if not _SAME_BITS:
        fns = _api or api()
        ok = bool(fns)
        if ok:
            get, put = fns
            n0 = get()
            put(1)
            try:
                rng = np.random.default_rng(0)
                for dt in (np.float32, np.float64):
                    for m, k, n in ((256, 128, 512), (301, 333, 97)):
                        a = rng.standard_normal((m, k)).astype(dt)
                        b = rng.standard_normal((k, n)).astype(dt)
                        ok = ok and np.array_equal(_split(a, b, None, 2), np.matmul(a, b))
            finally:
                put(n0)
        _SAME_BITS.append(ok)
    return _SAME_BITS[0]


def _split(a, b, out, t):
    """``a @ b`` (2-D) as blocks of rows on ``t`` threads, or None when it does not split."""
    m = a.shape[0]
    pieces = min(_BLOCKS_PER_THREAD * t, m // _MIN_ROWS)
    if pieces < 2:
        return None
    y = np.empty((m, b.shape[1]), np.result_type(a, b)) if out is None else out
    if y.shape != (m, b.shape[1]) or y.dtype != np.result_type(a, b):
        return None
    cuts = [m * i // pieces for i in range(pieces + 1)]
    parallel_for(pieces, lambda i: np.matmul(a[cuts[i]:cuts[i + 1]], b, out=y[cuts[i]:cuts[i + 1]]))
    return y


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)``: mid-sized products on one BLAS thread, large products of a
    matrix (or C-contiguous rows) by a matrix in blocks over this thread and helpers (see the
    module docstring)."""
    if _api is False:
        return np.matmul(a, b, out=out)
    k = macs(a.shape, b.shape)
    # a stack of rows by one matrix splits as one product of all the rows
    total = k * (a.size // max(1, a.shape[-2] * a.shape[-1])) if b.ndim == 2 and a.ndim > 2 else k
    if total <= _OWN_SINGLE:
        return np.matmul(a, b, out=out)
    fns = _api or api()
    if not fns:
        return np.matmul(a, b, out=out)
    get, put = fns
    n0 = get()
    if n0 <= 1:
        return np.matmul(a, b, out=out)
    if total >= SPLIT_MACS and _CAP > 1 and b.ndim == 2 and a.ndim >= 2 and a.shape[-1] == b.shape[0] \
            and a.dtype == b.dtype and a.dtype.kind == "f" and not getattr(_local, "inside", False) \
            and split_same_bits():
        a2 = a if a.ndim == 2 else a.reshape(-1, a.shape[-1]) if a.flags.c_contiguous else None
        o2 = out if out is None or out.ndim == 2 else out.reshape(-1, out.shape[-1]) \
            if out.flags.c_contiguous else None
        if a2 is not None and (out is None or o2 is not None):
            y = _split(a2, b, o2, min(_CAP, n0))
            if y is not None:
                return y.reshape(a.shape[:-1] + (b.shape[1],)) if out is None else out
    if k >= PARALLEL_MACS:
        return np.matmul(a, b, out=out)
    put(1)
    try:
        return np.matmul(a, b, out=out)
    finally:
        put(n0)
