"""The allocation ceiling: no single tensor may need more bytes than ``max_tensor_bytes()``.

Every op's output is checked in ``registry.apply`` after its shape and dtype rules and before
any kernel (or decomposition) runs; creation functions and the weights loaders check what they
are about to build the same way. A tensor over the ceiling raises ``ResourceError`` (an
``EmberError`` and a ``MemoryError``) naming the op, the shape and the bytes, at once, instead
of a backend allocating until the process is killed.

The ceiling is, by default, a quarter of the memory this process may use: the machine's
physical memory, or less where a cgroup (container) limit or ``RLIMIT_AS`` says so; one op
usually holds its inputs, its output and temporaries at the same time. Inside Pyodide it is
1 GiB: wasm32 addresses at most 4 GB, shared by the interpreter, the inputs and the output.
``EMBER_MAX_TENSOR_BYTES`` (read at import: a byte count such as ``8000000000``, ``512MiB``,
``4G``; ``off`` for no ceiling) or ``ember.set_max_tensor_bytes(n)`` change it. The ``meta``
device (shapes only, no data) is never limited.

>>> import ember
>>> old = ember.set_max_tensor_bytes(1 << 20)
>>> try:
...     ember.zeros((1024, 1024))
... except ember.errors.ResourceError as e:
...     print(e.op, e.shape, e.nbytes)
full (1024, 1024) 4194304
>>> _ = ember.set_max_tensor_bytes(old)
"""
from __future__ import annotations

import operator
import os
import sys
from math import prod

from .errors import ResourceError, ShapeError

__all__ = ["check_alloc", "check_output", "check_shape", "max_tensor_bytes", "set_max_tensor_bytes",
           "default_max_tensor_bytes", "MAX_NDIM"]

PYODIDE_MAX_TENSOR_BYTES = 1 << 30
MAX_NDIM = 64            # numpy's limit; a 100,000-axis shape is refused, not looped over
_FALLBACK_MEMORY = 8 << 30  # when the platform does not say how much memory there is

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10 ** 3, "kib": 1 << 10, "m": 1 << 20, "mb": 10 ** 6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10 ** 9, "gib": 1 << 30, "t": 1 << 40, "tb": 10 ** 12,
          "tib": 1 << 40}


def _read_int(path: str):
    try:
        with open(path) as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int:
    """Bytes this process may use at most: physical memory, capped by a cgroup memory limit and
    by ``RLIMIT_AS`` where they are lower (or a fallback of 8 GiB when nothing says)."""
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    if not mem or mem <= 0:
        mem = _windows_memory() or _FALLBACK_MEMORY
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        n = _read_int(path)
        if n:
            mem = min(mem, n)
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            mem = min(mem, soft)
    except (ImportError, ValueError, OSError, AttributeError):
        pass
    return mem


def _windows_memory():
    if sys.platform != "win32":
        return None
    try:
        import ctypes

        class _Status(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                        ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                        ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                        ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                        ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]
        st = _Status()
        st.dwLength = ctypes.sizeof(st)
        return int(st.ullTotalPhys) if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)) else None
    except Exception:  # pragma: no cover - best effort
        return None


def default_max_tensor_bytes() -> int:
    """The ceiling used when nothing sets one (see the module docstring)."""
    if sys.platform == "emscripten":
        return PYODIDE_MAX_TENSOR_BYTES
    return max(available_memory() // 4, 1 << 26)


def parse_bytes(text: str):
    """``"512MiB"`` -> 536870912; ``"off"``/``"none"`` -> None (no ceiling). ValueError otherwise."""
    t = str(text).strip().lower().replace("_", "").replace(" ", "")
    if t in ("off", "none", "inf", "unlimited"):
        return None
    num = t.rstrip("kmgtib")
    unit = t[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"not a byte count: {text!r} (e.g. 8000000000, 512MiB, 4G, off)")
    try:
        value = float(num) * _UNITS[unit] if "." in num or "e" in num else int(num) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a byte count: {text!r} (e.g. 8000000000, 512MiB, 4G, off)") from None
    if value < 0 or value != value:
        raise ValueError(f"not a byte count: {text!r}")
    return int(value)


def _initial() -> int:
    env = os.environ.get("EMBER_MAX_TENSOR_BYTES")
    if env:
        try:
            n = parse_bytes(env)
        except ValueError as e:
            import warnings

            warnings.warn(f"EMBER_MAX_TENSOR_BYTES: {e}; using the default ceiling", stacklevel=2)
        else:
            return _UNLIMITED if n is None else n
    return default_max_tensor_bytes()


_UNLIMITED = 1 << 200  # "no ceiling": larger than any product of int64 dims times an itemsize
# [ceiling in bytes]: a list so the hot path reads one item and set_max_tensor_bytes rebinds nothing
_MAX = [0]
_MAX[0] = _initial()


def max_tensor_bytes():
    """The current ceiling in bytes (None when there is none)."""
    return None if _MAX[0] >= _UNLIMITED else _MAX[0]


def set_max_tensor_bytes(n):
    """Set the per-tensor ceiling to ``n`` bytes (an int, a string such as ``"4GiB"``, or None for
    no ceiling; ``"default"`` restores the default) and return the previous value, so a caller
    can put it back.

    >>> import ember
    >>> old = ember.set_max_tensor_bytes("64MiB")
    >>> ember.max_tensor_bytes()
    67108864
    >>> _ = ember.set_max_tensor_bytes(old)
    """
    old = max_tensor_bytes()
    if isinstance(n, str):
        n = default_max_tensor_bytes() if n.strip().lower() == "default" else parse_bytes(n)
    if n is None:
        _MAX[0] = _UNLIMITED
        return old
    if isinstance(n, bool) or not isinstance(n, int):
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"set_max_tensor_bytes: expected an int number of bytes, a string such as "
                            f"'4GiB', or None, not {type(n).__name__}") from None
    if n < 0:
        raise ValueError(f"set_max_tensor_bytes: {n} is negative")
    _MAX[0] = n
    return old


def _human(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def check_shape(op: str, shape) -> tuple:
    """``shape`` as a tuple of Python ints, or ShapeError: only integers (``operator.index``: not
    2.5, "3" or True), none negative, at most ``MAX_NDIM`` axes."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        shape = (shape,)
    out = []
    for s in shape:
        if isinstance(s, bool) or type(s).__name__ in ("bool_", "bool"):
            raise ShapeError(f"{op}: shape {tuple(shape)!r:.200} holds a bool; sizes must be integers")
        try:
            s = operator.index(s)
        except TypeError:
            raise ShapeError(f"{op}: shape {_short(shape)} holds {s!r:.50} ({type(s).__name__}); "
                             f"sizes must be integers") from None
        if s < 0:
            raise ShapeError(f"{op}: negative dimension {s} in shape {_short(shape)}")
        out.append(s)
        if len(out) > MAX_NDIM:
            raise ShapeError(f"{op}: shape has more than {MAX_NDIM} axes ({_len(shape)}); ember tensors "
                             f"have at most {MAX_NDIM}")
    return tuple(out)


def _len(shape):
    try:
        return len(shape)
    except TypeError:
        return "many"


def _short(shape) -> str:
    try:
        t = tuple(shape)
    except TypeError:
        return repr(shape)[:100]
    return repr(t) if len(t) <= 8 else f"({', '.join(map(repr, t[:8]))}, ... {len(t)} axes)"


def _refuse(op, shape, dtype, nbytes, what=None):
    limit = _MAX[0]
    shown = _short(shape)
    raise ResourceError(
        f"{op}: {what or 'the output'} of shape {shown} ({dtype.name}) needs {nbytes} bytes "
        f"({_human(nbytes)}), over the {limit}-byte ({_human(limit)}) ceiling for one tensor; nothing "
        f"was allocated. If this machine has the memory, raise it with ember.set_max_tensor_bytes(n) "
        f"or EMBER_MAX_TENSOR_BYTES", op=op, shape=tuple(shape), nbytes=nbytes, limit=limit)


def check_alloc(op: str, shape, dtype, what: str | None = None) -> int:
    """The bytes a tensor of ``shape`` and ``dtype`` needs; ResourceError (naming ``op``, the
    shape and the bytes) when that is over the ceiling, ShapeError when ``shape`` is not a
    sequence of non-negative integers."""
    n = prod(shape) if type(shape) is tuple else None
    if type(n) is not int or n < 0:
        shape = check_shape(op, shape)
        n = prod(shape)
    nbytes = n * dtype.itemsize
    if nbytes > _MAX[0]:
        _refuse(op, shape, dtype, nbytes, what)
    return nbytes


def check_output(op: str, shape, dtype, device=None) -> None:
    """``registry.apply``'s check of an op's output meta (one shape and dtype, or tuples of them
    for multi-output ops) before its kernel runs. The common case costs a ``prod``, a type check
    and a comparison."""
    if type(dtype) is tuple:
        for s, d in zip(shape, dtype):
            check_output(op, s, d, device)
        return
    try:
        n = prod(shape)
    except TypeError:   # None or another non-number among the sizes
        n = None
    if type(n) is not int:
        n = prod(check_shape(op, shape))   # raises for a float, str or other non-integer size
    if n * dtype.itemsize > _MAX[0] and device != "meta":
        _refuse(op, shape, dtype, n * dtype.itemsize)
