"""The ``cast`` op of the wasm backend (``kernels/cast.c``) between float32, int32, int64,
uint8 and bool, with the python backend's semantics (float -> int truncates and saturates, NaN
-> 0; int -> int wraps; -> bool is ``!= 0``). float16 (rounding) and same-dtype casts run the
python kernel."""
from __future__ import annotations

from array import array

from .. import dtypes as _dt
from .fallback import PY
from .runtime import R, W

CODES = {_dt.float32: 0, _dt.int32: 1, _dt.int64: 2, _dt.uint8: 3, _dt.bool_: 4}


def kernels(rt) -> dict:
    py = PY["cast"]
    call = rt.call
    zero = {dt: array(dt.typecode, [0]) for dt in CODES}

    def cast(out, x, **attrs):
        src, dst = CODES.get(x.dtype), CODES.get(out.dtype)
        if src is None or dst is None or src == dst:
            return py(out, x, **attrs)
        buf = x._buf
        n = len(buf)
        y = zero[out.dtype] * n
        if n and not call("cast", R(buf, n), src, W(y, n), dst, n):
            return py(out, x, **attrs)
        return y

    return {"cast": cast}
