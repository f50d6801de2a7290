"""numpy kernels of the language-model ops (``ember.ops.llm``), tested against the python ones.

``attention_cached`` writes the new keys/values into the caches in place (they are state the
caller owns) and attends over the filled rows only, one key/value head group at a time: one
``(T * group, D) @ (D, n)`` product per group instead of a masked pass over the whole cache.

Where ``ember.native`` was built with the wasm backend's kernels (``wasm/kernels/llm.c`` compiled
for this CPU through SIMDe, see ``ember.native``), the three ops call them instead (``_native_*``
below), with the wasm backend's argument layout (``ember.wasm.ops_quant``): rms_norm and rope in
float64 from the float32 inputs, one rounding per result (rope's results are the python
specification's bit for bit; the numpy paths round in float32 at every step), attention in
float32 with its own exp (within ~1e-6 relative of the numpy path). A SmolLM2 decode step makes
~150 such calls of a few microseconds each, so each runs on one thread (no split over
``parallel_for``, whose hand-off costs more). ``ember.native.disabled()`` or ``EMBER_NATIVE=0`` runs the numpy paths.

One new token (a decode step's attention_cached) runs ember.native's own ``attn.c`` instead of
llm.c: AVX-512 / AVX vectors (not SIMD128 through SIMDe), prefetched cache rows, and units of (key/
value head, 64 rows) over team.c's two threads, merged as partial softmaxes. SmolLM2-135M Q4_1 at
position 211, in the replayed decode step (notes/native-decode-attn.md, op_ab.py): 98 -> 55 us a
layer (61 on one thread). ``EMBER_LLM_NATIVE_ATTN=0`` keeps llm.c (the A/B switch).
"""
from __future__ import annotations

import ctypes
import os
import struct

import numpy as np

from .. import native
from ..errors import ShapeError
from ..ops.llm import check_pos
from .numpy_blas import matmul
from .numpy_nn import _addr, _address, _char_at
from .numpy_nn import team as _team
from .numpy_quant import _BUF_ERRORS, _F32D, _prm, _scratch_at, _team_of   # (the native kernels' parameter
#                                         tables, per-thread scratch, team; ctypes' buffer-export failures)


def _f32(t):
    a = t._buf
    return a if a.dtype == np.float32 else a.astype(np.float32)


# ---- the wasm backend's kernels, compiled natively (ember.native) ---------------------------------
# llm.c's entry points (ember_wasm_ prefix, see core/native/wasm_kernels.h). Their offsets are int32
# in C (the page's memory is 32-bit): an array of 2**31 elements or more runs the numpy path.

_P, _I = ctypes.c_void_p, ctypes.c_int32
_NATIVE_SIGS = {
    "ember_wasm_rms_norm_f32": (None, (_P, _P, _P, _I, _I, ctypes.c_double)),     # x, w, y, rows, n, eps
    "ember_wasm_rope_f32": (None, (_P, _P, _P, _P, _I, _I, _I, _I)),             # x, cos, sin, y, T, H, D, mode
    # q, k, v, k_cache, v_cache, pos, out, scratch, prm (T, Hq, Hkv, D, C, window, softcap's bits), scale
    "ember_wasm_attention_cached_f32": (_I, (_P,) * 9 + (ctypes.c_float,)),
    # attn.c (ember.native's own, no SIMDe): a, q, k, v, part, out / a, k, v, part, out / ()
    "ember_attn_decode": (ctypes.c_int64, (_P,) * 6),
    "ember_attn_decode_merge": (ctypes.c_int64, (_P,) * 5),
    "ember_attn_decode_chunk": (ctypes.c_int64, ()),
    # glu.c: g, u, y, rows, n, ldg, ldu, ldy
    "ember_silu_mul": (ctypes.c_int64, (_P,) * 3 + (ctypes.c_int64,) * 5),
    # rmsnorm.c: a, b, w, s, y, rows, n, eps
    "ember_add_rms_norm": (ctypes.c_int64, (_P,) * 5 + (ctypes.c_int64, ctypes.c_int64, ctypes.c_double)),
}
_MODES = {"pairs": 0, "halves": 1}   # llm.c's rope modes
# attention_cached runs natively for one new token at any position, for T > 1 tokens at position p
# while T (4p + T) <= NATIVE_ATTENTION_WORK, else the numpy path (notes/native-llm.md, 2 cores,
# alternating; SmolLM2's heads 9/3/64): the kernel's cost grows with the rows it attends,
# T (p + T/2) rows at ~0.1 ns per multiply-add (scores and values); the numpy path's BLAS products
# are 3-4x cheaper per score from ~8 query rows on (a decode step: native 1.3-2x at every position to 1900; T = 2 at
# p = 1000 0.97x, T = 16 at p = 100 0.79x, T = 8 at p = 100 1.0x, a first chunk of 64 1.15x, of 96 1.0x)
NATIVE_ATTENTION_WORK = 4096
_LIMIT = 1 << 31
# One new token (a decode step) runs attn.c instead: units of (key/value head, 64 cache rows) split
# over team.c's two threads (job 9) from NATIVE_ATTN_TEAM_FLOATS floats of keys read (rows x Hkv x
# D), then one merge of the chunks' partial softmaxes (the same bits on one thread or two).
# EMBER_LLM_NATIVE_ATTN=0 (read at import; or set NATIVE_ATTN_DECODE) keeps llm.c's one-thread kernel
# for every T (the A/B switch).
NATIVE_ATTN_DECODE = os.environ.get("EMBER_LLM_NATIVE_ATTN", "1") != "0"
NATIVE_ATTN_TEAM_FLOATS = 1 << 13
NATIVE_ATTN_TEAM_ITEMS = 2
_J_ATTN_DECODE = 9   # (team.c's J_ATTN_DECODE)
_F32_BITS: dict = {}
_DECODE: dict = {}   # id(ember_attn_decode) -> (it, its merge, its chunk rows): one lookup a call


def _native_fn(name: str):
    """llm.c's kernel ``name`` from ember.native, or None (not built, SIMDe absent, disabled)."""
    restype, argtypes = _NATIVE_SIGS[name]
    return native.kernel(name, restype, *argtypes)


def native_llm() -> bool:
    """Whether rms_norm, rope and attention_cached run llm.c natively here."""
    return _native_fn("ember_wasm_attention_cached_f32") is not None


def _c32(t):
    """t's buffer as a C-contiguous float32 array (a copy only where it is not one already)."""
    return np.ascontiguousarray(t._buf, dtype=np.float32)




def _native_rms_norm(x, w, eps: float):
    fn = _native_fn("ember_wasm_rms_norm_f32")
    shape = x.shape
    n = shape[-1]
    rows = x._buf.size // n if n else 0
    if fn is None or rows * n == 0 or rows * n >= _LIMIT:
        return None
    a, g = _c32(x), _c32(w)
    y = np.empty(shape, np.float32)
    fn(_addr(a), _addr(g), _addr(y), rows, n, eps)
    return y


def _native_rope(x, cos, sin, mode: str):
    fn = _native_fn("ember_wasm_rope_f32")
    T, H, D = x.shape
    if fn is None or mode not in _MODES or T * H * D == 0 or T * H * D >= _LIMIT:
        return None
    a, c, s = _c32(x), _c32(cos), _c32(sin)
    y = np.empty((T, H, D), np.float32)
    fn(_addr(a), _addr(c), _addr(s), _addr(y), T, H, D, _MODES[mode])
    return y


def _bits(x: float) -> int:
    """x's float32 bits as an int (kept per value: a model has one scale)."""
    b = _F32_BITS.get(x)
    if b is None:
        b = _F32_BITS[x] = struct.unpack("<i", struct.pack("<f", x))[0]
    return b


def _native_attn_decode(q, k, v, kb, vb, p0: int, scale: float, window: int, cap: int):
    """attn.c for one query row (T = 1; the caller checked the caches, the sizes and the position):
    (1, Hq, D) float32 with k, v written into the caches' row p0, or None without the kernel."""
    one = _native_fn("ember_attn_decode")
    if one is None:
        return None
    got = _DECODE.get(id(one))
    if got is None or got[0] is not one:   # (ctypes functions are not hashable: by id, checked)
        got = _DECODE[id(one)] = (one, _native_fn("ember_attn_decode_merge"), _native_fn("ember_attn_decode_chunk")())
    _, merge, ch = got
    _, hq, d = q.shape
    hkv = kb.shape[1]
    lo = p0 + 1 - window if window and p0 + 1 > window else 0
    n = p0 + 1 - lo
    units = hkv * ((n + ch - 1) // ch)
    try:
        sb = _bits(scale)
    except OverflowError:   # (a scale past float32: llm.c's or numpy's rule)
        return None
    a = np.array([hq, hkv, d, hkv * d, lo, n, units, _addr(kb), _addr(vb), sb, cap], np.int64)
    ap = _addr(a)
    qa, ka, va = _c32(q), _c32(k), _c32(v)   # (kept: a copy must live through the calls)
    qp, kp, vp = _addr(qa), _addr(ka), _addr(va)
    part = _scratch_at(units * (hq // hkv) * (d + 2))
    y = np.empty((1, hq, d), np.float32)
    if units > 1 and n * hkv * d >= NATIVE_ATTN_TEAM_FLOATS:
        tm = _team()
        rc = None if tm is None else tm(_J_ATTN_DECODE, ap, qp, kp, vp, part, NATIVE_ATTN_TEAM_ITEMS)
        if rc is not None:     # (None: another thread has the team)
            if not rc:
                rc = merge(ap, kp, vp, part, _addr(y))
    else:
        rc = None
    if rc is None:
        rc = one(ap, qp, kp, vp, part, _addr(y))
    if rc:
        raise ShapeError(f"attention_cached: the native kernel failed ({rc}) for q {tuple(q.shape)}, "
                         f"caches {tuple(kb.shape)}, position {p0}")
    return y


def _native_attention(q, k, v, kc, vc, pos, scale: float, window: int, softcap: float, p0: int):
    """llm.c's attention_cached_f32 (writes k, v into the caches, then attends), or for one new
    token attn.c's (``_native_attn_decode``), or None where neither applies: a prompt chunk past
    NATIVE_ATTENTION_WORK, D not a multiple of 4 (llm.c's vectors), caches that are not writable
    C-contiguous float32 (written in place: the numpy path raises for a read-only one), sizes past
    int32."""
    T, hq, d = q.shape
    C, hkv, _ = kc.shape
    kb, vb = kc._buf, vc._buf
    cap = 0
    if softcap:   # the kernel takes softcap's float32 bits (> 0: on)
        try:
            cap = struct.unpack("<i", struct.pack("<f", softcap))[0]
        except OverflowError:
            return None
        if not 0 < cap < 0x7F800000:   # 0 or inf in float32: left to the numpy path's rule
            return None
    if (d % 4 or T * hq * d == 0 or (T > 1 and T * (4 * p0 + T) > NATIVE_ATTENTION_WORK)
            or C * hkv * d >= _LIMIT or T * hq * d >= _LIMIT
            or not (kb.dtype == np.float32 and vb.dtype == np.float32 and kb.flags.c_contiguous
                    and vb.flags.c_contiguous and kb.flags.writeable and vb.flags.writeable)):
        return None
    if T == 1 and NATIVE_ATTN_DECODE:
        y = _native_attn_decode(q, k, v, kb, vb, p0, scale, window if window < C else 0, cap)
        if y is not None:
            return y
    fn = _native_fn("ember_wasm_attention_cached_f32")
    if fn is None:
        return None
    qa, ka, va = _c32(q), _c32(k), _c32(v)
    pa = np.ascontiguousarray(pos._buf, dtype=np.int32)
    group = hq // hkv
    y = np.empty((T, hq, d), np.float32)
    # a window of at least C rows never cuts a row off: none
    rc = fn(_addr(qa), _addr(ka), _addr(va), _addr(kb), _addr(vb), _addr(pa), _addr(y), _scratch_at(group * (C + 1)),
            _prm(T, hq, hkv, d, C, window if window < C else 0, cap), scale)
    if rc:
        check_pos(int(pa.reshape(-1)[0]), T, C)   # the kernel checks only what check_pos did: never here
        raise ShapeError(f"attention_cached: the native kernel failed ({rc}) for q {tuple(q.shape)}, "
                         f"caches {tuple(kc.shape)}, position {p0}")
    return y


# silu(g) * u as one native pass (glu.c) where numpy_plan finds a silu step read only by a multiply
# (a SwiGLU feed-forward): SmolLM2-135M's decode step, 30 x 1536 floats, ~28 us (silu) + ~3 us
# (multiply) a layer -> see notes/native-decode-attn.md. EMBER_LLM_NATIVE_GLU=0 (read at import; or
# set NATIVE_SILU_MUL, checked each run) runs the two recorded steps (the A/B switch).
NATIVE_SILU_MUL = os.environ.get("EMBER_LLM_NATIVE_GLU", "1") != "0"


def _rows_of(a):
    """(rows, n, row stride in floats) of a float32 array whose rows (the last axis) are contiguous
    and evenly spaced, else None."""
    if a.dtype != np.float32 or a.ndim == 0:
        return None
    n = a.shape[-1]
    st = a.strides
    if st[-1] != 4 and a.shape[-1] > 1:
        return None
    if a.ndim == 1:
        return 1, n, n
    if a.ndim == 2 and st[0] >= 0 and st[0] % 4 == 0:
        return a.shape[0], n, st[0] // 4
    if a.flags.c_contiguous:
        return a.size // n, n, n
    return None


def silu_mul_kernel():
    """glu.c's ember_silu_mul, or None (no library, disabled, or NATIVE_SILU_MUL off: numpy_plan
    then does not fuse)."""
    return _native_fn("ember_silu_mul") if NATIVE_SILU_MUL else None


def native_silu_mul(g, u):
    """silu(g) * u for float32 arrays of one shape (numpy, rows contiguous: slices of one product's
    output are) through glu.c: a new array; None where it does not apply (NATIVE_SILU_MUL off, no
    kernel, other dtypes, shapes or layouts): the caller runs silu then multiply."""
    if not NATIVE_SILU_MUL or g.shape != u.shape or g.size == 0:
        return None
    fn = _native_fn("ember_silu_mul")
    rg, ru = _rows_of(g), _rows_of(u)
    if fn is None or rg is None or ru is None or g.size >= _LIMIT:
        return None
    y = np.empty(g.shape, np.float32)
    fn(_addr(g), _addr(u), _addr(y), rg[0], rg[1], rg[2], ru[2], rg[1])   # (_addr: views too)
    return y


# x + o and the rms_norm of it in one native call (rmsnorm.c: llm.c's rms_norm bits) where
# numpy_plan finds a float32 add read by the rms_norm after it (a decoder layer's residual, twice a
# layer). EMBER_LLM_NATIVE_ADD_NORM=0 (read at import; or set NATIVE_ADD_RMS_NORM, checked each run)
# runs the two recorded steps.
NATIVE_ADD_RMS_NORM = os.environ.get("EMBER_LLM_NATIVE_ADD_NORM", "1") != "0"


def add_rms_norm_kernel():
    """rmsnorm.c's ember_add_rms_norm where llm.c's rms_norm runs too (the same bits), else None
    (no library, disabled, NATIVE_ADD_RMS_NORM off: numpy_plan then does not fuse)."""
    if not NATIVE_ADD_RMS_NORM or _native_fn("ember_wasm_rms_norm_f32") is None:
        return None
    return _native_fn("ember_add_rms_norm")


def native_add_rms_norm(a, b, w, eps: float):
    """(a + b, rms_norm(a + b, w, eps)) as float32 arrays of a's shape through rmsnorm.c (the bits
    of numpy's add, then llm.c's rms_norm), or None where it does not apply (switch off, no
    kernel, shapes, dtypes or layouts it leaves to the recorded steps)."""
    if not NATIVE_ADD_RMS_NORM or a.shape != b.shape or a.ndim == 0 or a.size == 0 or a.size >= _LIMIT:
        return None
    n = a.shape[-1]
    if (a.dtype != np.float32 or b.dtype != np.float32 or w.dtype != np.float32 or w.shape != (n,)
            or not (a.flags.c_contiguous and b.flags.c_contiguous and w.flags.c_contiguous)):
        return None
    fn = _native_fn("ember_add_rms_norm")   # (llm.c's presence was checked when the plan fused)
    if fn is None:
        return None
    s = np.empty(a.shape, np.float32)
    y = np.empty(a.shape, np.float32)
    fn(_addr(a), _addr(b), _addr(w), _addr(s), _addr(y), a.size // n, n, eps)
    return s, y


# ---- prepared calls: one plan step's checks made when the plan is built -------------------------
# numpy_plan binds a decode step's rope, attention_cached, silu * mul and add + rms_norm to these:
# what a step's shapes and attributes decide is worked out once; a call checks only what can change
# between runs (the library, the A/B switches, the arrays' dtypes, shapes and layouts, a constant's
# buffer) and takes the addresses of C-contiguous writable arrays through ctypes' buffer export, which
# fails for any other layout (then the general function runs, with its own checks). The same kernels
# with the same arguments: the same bits. SmolLM2-135M Q8_0's decode step, per op with its data in
# cache (medians of 3 runs, 2-core Xeon): add_rms_norm 6.1 -> 3.8 us, silu_mul 4.6 -> 3.5, rope 4.5
# -> 3.6, attention_cached at position 230 14.7 -> 12.4 (notes/numpy-decode-overhead.md).

_ARGS = struct.Struct("<3q")                        # attn.c's (lo, n, units) at byte 32 of its arguments


def _kept(slot: list, key):
    """``slot[0]`` when its first item is ``key`` (by identity), else None."""
    st = slot[0]
    return st if st is not None and st[0] is key else None


def add_rms_norm_call(shape, eps: float):
    """``call(a, b, w)``: ``native_add_rms_norm(a, b, w, eps)`` for arrays of ``shape`` (a plan step's),
    its answer bit for bit (None included), with w's checks and address made once per buffer."""
    shape = tuple(shape)
    n = shape[-1] if shape else 0
    size = int(np.prod(shape)) if shape else 1
    if not shape or not n or not size or size >= _LIMIT:
        return lambda a, b, w: native_add_rms_norm(a, b, w, eps)
    rows = size // n
    kept = [None]   # (the library, its ember_add_rms_norm, the weight buffer, its address)

    def call(a, b, w):
        if not NATIVE_ADD_RMS_NORM:
            return None
        lib = native.lib()
        st = kept[0]
        if st is None or st[0] is not lib or st[2] is not w:
            fn = _native_fn("ember_add_rms_norm")
            if fn is None:
                return None
            if not (w.dtype == np.float32 and w.shape == (n,) and w.flags.c_contiguous):
                return native_add_rms_norm(a, b, w, eps)
            st = kept[0] = (lib, fn, w, w.ctypes.data)
        if a.dtype is not _F32D or b.dtype is not _F32D or a.shape != shape or b.shape != shape:
            return native_add_rms_norm(a, b, w, eps)
        try:
            pa, pb = _address(_char_at(a)), _address(_char_at(b))
        except _BUF_ERRORS:
            return native_add_rms_norm(a, b, w, eps)
        s = np.empty(shape, np.float32)
        y = np.empty(shape, np.float32)
        st[1](pa, pb, st[3], _address(_char_at(s)), _address(_char_at(y)), rows, n, eps)
        return s, y
    return call


def silu_mul_call(shape):
    """``call(g, u)``: ``native_silu_mul(g, u)`` for arrays of ``shape``, its answer bit for bit."""
    shape = tuple(shape)
    n = shape[-1] if shape else 0
    size = int(np.prod(shape)) if shape else 1
    if not shape or not n or not size or size >= _LIMIT:
        return native_silu_mul
    rows = size // n
    kept = [None]   # (the library, its ember_silu_mul)

    def call(g, u):
        if not NATIVE_SILU_MUL:
            return None
        lib = native.lib()
        st = kept[0]
        if st is None or st[0] is not lib:
            st = kept[0] = (lib, _native_fn("ember_silu_mul"))
        fn = st[1]
        if fn is None:
            return None
        if g.dtype is not _F32D or u.dtype is not _F32D or g.shape != shape or u.shape != shape:
            return native_silu_mul(g, u)
        try:   # (C-contiguous: _rows_of's (rows, n, n))
            pg, pu = _address(_char_at(g)), _address(_char_at(u))
        except _BUF_ERRORS:
            return native_silu_mul(g, u)
        y = np.empty(shape, np.float32)
        fn(pg, pu, _address(_char_at(y)), rows, n, n, n, n)
        return y
    return call


def rope_call(shape, mode: str):
    """``call(x, cos, sin)``: ``_native_rope`` for an x of ``shape`` (T, H, D): the rope of llm.c, or
    None where it does not run (the caller then runs the kernel, which tries it and then numpy)."""
    T, H, D = shape
    if mode not in _MODES or T * H * D == 0 or T * H * D >= _LIMIT:
        return lambda x, cos, sin: None
    shape, md = (T, H, D), _MODES[mode]
    kept = [None]   # (the library, its ember_wasm_rope_f32)

    def call(x, cos, sin):
        lib = native.lib()
        st = kept[0]
        if st is None or st[0] is not lib:
            st = kept[0] = (lib, _native_fn("ember_wasm_rope_f32"))
        fn = st[1]
        if fn is None or x.dtype is not _F32D or cos.dtype is not _F32D or sin.dtype is not _F32D \
                or x.shape != shape:
            return None
        try:
            px, pc, ps = _address(_char_at(x)), _address(_char_at(cos)), _address(_char_at(sin))
        except _BUF_ERRORS:
            return None
        y = np.empty(shape, np.float32)
        fn(px, pc, ps, _address(_char_at(y)), T, H, D, md)
        return y
    return call


def attention_cached_call(qshape, cshape, scale: float, window: int = 0, softcap: float = 0.0):
    """``call(q, k, v, kc, vc, pos)`` (numpy arrays; the caches written in place): for one new token
    (``qshape`` (1, Hq, D), caches of ``cshape`` (C, Hkv, D)), ``_attention_cached``'s result through
    attn.c as ``_native_attn_decode`` makes it (the position checked as check_pos does), the caches'
    checks and addresses made once per buffer; None where that path does not run (the caller then runs
    the kernel): T > 1, a softcap or a scale llm.c's rules leave to numpy, the switch off, another
    library or stand-ins (tests), other dtypes, shapes or layouts, a team that another thread holds."""
    T, hq, d = qshape
    C, hkv, dk = cshape
    none = lambda *a: None   # noqa: E731
    cap = 0
    if softcap:
        try:
            cap = struct.unpack("<i", struct.pack("<f", softcap))[0]
        except OverflowError:
            return none
        if not 0 < cap < 0x7F800000:
            return none
    try:
        sb = _bits(scale)
    except OverflowError:
        return none
    if T != 1 or d % 4 or hq * d == 0 or dk != d or not hkv or hq % hkv or C * hkv * d >= _LIMIT \
            or hq * d >= _LIMIT:
        return none
    win = window if window < C else 0
    qs, ks = (1, hq, d), (1, hkv, d)
    group = hq // hkv
    kept = [None]   # (the library, k cache, v cache, one, merge, chunk rows, team-or-None maker, template)
    fns = (_native_fn, _native_attn_decode, _team)

    def call(q, k, v, kc, vc, pos):
        if not NATIVE_ATTN_DECODE or (_native_fn, _native_attn_decode, _team) != fns:
            return None
        lib = native.lib()
        st = kept[0]
        if st is None or st[0] is not lib or st[1] is not kc or st[2] is not vc:
            if lib is None or not all(c.dtype == np.float32 and c.shape == (C, hkv, d) and c.flags.c_contiguous
                                      and c.flags.writeable for c in (kc, vc)):
                return None
            one = _native_fn("ember_attn_decode")
            if one is None:
                return None
            merge, ch = _native_fn("ember_attn_decode_merge"), _native_fn("ember_attn_decode_chunk")()
            tmpl = np.array([hq, hkv, d, hkv * d, 0, 0, 0, _addr(kc), _addr(vc), sb, cap], np.int64).tobytes()
            st = kept[0] = (lib, kc, vc, one, merge, ch, tmpl)
        p0 = int(pos.item(0))
        check_pos(p0, 1, C)
        if q.dtype is not _F32D or k.dtype is not _F32D or v.dtype is not _F32D \
                or q.shape != qs or k.shape != ks or v.shape != ks:
            return None
        try:
            qp, kp, vp = _address(_char_at(q)), _address(_char_at(k)), _address(_char_at(v))
        except _BUF_ERRORS:
            return None
        _, _, _, one, merge, ch, tmpl = st
        lo = p0 + 1 - win if win and p0 + 1 > win else 0
        n = p0 + 1 - lo
        units = hkv * ((n + ch - 1) // ch)
        a = bytearray(tmpl)
        _ARGS.pack_into(a, 32, lo, n, units)
        ap = _address(_char_at(a))
        part = _scratch_at(units * group * (d + 2))
        y = np.empty(qs, np.float32)
        rc = None
        if units > 1 and n * hkv * d >= NATIVE_ATTN_TEAM_FLOATS:
            tm = _team_of(lib, _team)
            rc = None if tm is None else tm(_J_ATTN_DECODE, ap, qp, kp, vp, part, NATIVE_ATTN_TEAM_ITEMS)
            if rc is not None and not rc:
                rc = merge(ap, kp, vp, part, _address(_char_at(y)))
        if rc is None:
            rc = one(ap, qp, kp, vp, part, _address(_char_at(y)))
        if rc:
            raise ShapeError(f"attention_cached: the native kernel failed ({rc}) for q {qs}, "
                             f"caches {tuple(kc.shape)}, position {p0}")
        return y
    return call


def _rms_norm(out, x, w, *, eps):
    y = _native_rms_norm(x, w, eps)
    if y is not None:
        return y
    a = _f32(x)
    ms = np.einsum("...i,...i->...", a, a)[..., None]
    ms /= np.float32(a.shape[-1])
    ms += np.float32(eps)
    return (a / np.sqrt(ms)) * _f32(w)


def _rope(out, x, cos, sin, *, mode):
    y = _native_rope(x, cos, sin, mode)
    if y is not None:
        return y
    a = _f32(x)
    T, H, D = a.shape
    c = _f32(cos)[:, None, :]
    s = _f32(sin)[:, None, :]
    y = np.empty_like(a)
    if mode == "pairs":
        x0, x1 = a[..., 0::2], a[..., 1::2]
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
    else:
        h = D // 2
        x0, x1 = a[..., :h], a[..., h:]
        y[..., :h] = x0 * c - x1 * s
        y[..., h:] = x0 * s + x1 * c
    return y


def _attention_cached(out, q, k, v, kc, vc, pos, *, scale, window=0, softcap=0.0):
    T, hq, d = q.shape
    C, hkv, _ = kc.shape
    p0 = int(pos._buf.reshape(-1)[0])
    check_pos(p0, T, C)
    y = _native_attention(q, k, v, kc, vc, pos, scale, window, softcap, p0)
    if y is not None:
        return y
    kb, vb = kc._buf, vc._buf
    kb[p0:p0 + T] = k._buf
    vb[p0:p0 + T] = v._buf
    n = p0 + T
    group = hq // hkv
    qa = _f32(q).reshape(T, hkv, group, d)
    res = np.empty((T, hkv, group, d), dtype=np.float32)
    # causal: query t sees rows 0..p0+t
    # a sliding window: query t sees rows p0+t-window+1..p0+t (the rows before the first query's
    # window are never read)
    lo = max(0, p0 + 1 - window) if window else 0
    mask = None
    if T > 1:
        j = np.arange(lo, n)[None, :]
        last = (p0 + np.arange(T))[:, None]
        mask = j > last                                                   # (T, n - lo)
        if window:
            mask |= j <= last - window
        mask = np.repeat(mask, group, axis=0)                              # (T*group, n) in t-major order
    for g in range(hkv):
        qg = qa[:, g].reshape(T * group, d)                                # rows (t, head in group)
        s = matmul(qg, kb[lo:n, g, :].T)
        s *= np.float32(scale)
        if softcap:
            s = np.tanh(s / np.float32(softcap)) * np.float32(softcap)
        if mask is not None:
            s[mask] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        res[:, g] = matmul(s, vb[lo:n, g, :]).reshape(T, group, d)
    return res.reshape(T, hq, d)


KERNELS = {
    "rms_norm": _rms_norm,
    "rope": _rope,
    "attention_cached": _attention_cached,
}
