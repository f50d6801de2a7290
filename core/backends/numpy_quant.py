"""Quantized-weight kernels of the numpy backend: ``dequantize``, ``qlinear`` and ``qembedding``
(``ember.ops.quant``), vectorised over all blocks through numpy views of the weight's bytes.

``qlinear`` never keeps a float copy of the weight: it decodes a few MB of rows at a time into
a scratch and multiplies them with BLAS. Results equal the reference (``ember.quant.FORMATS``):
every dequantized value is one float32 rounding of the exact value, as in ggml.

Where ``ember.native`` was built with the wasm backend's kernels (``wasm/kernels/quant.c``
compiled for this CPU through SIMDe, see ``ember.native``), the three ops call them instead
(``_native_*`` below): qlinear multiplies the weight's blocks as integers with an int16 copy of
the activation (within ~1e-5 of the float product, the same bits as the page's kernels
compute), dequantize and qembedding are bit-equal to the numpy paths. The rows of the output
are split over ``numpy_blas.parallel_for``'s threads in whole rows (the same bits on any number
of threads). ``ember.native.disabled()`` or ``EMBER_NATIVE=0`` runs the numpy paths.
"""
from __future__ import annotations

import os
import threading

import numpy as np

import ctypes

from .. import native
from ..errors import IndexingError, ShapeError
from ..quant import FORMATS, IQ4_VALUES, row_bytes
from ..quant import words as quant_words
from .numpy_blas import matmul, parallel_for, threads
from . import numpy_nn as _nn
from .numpy_nn import _addr, _address, _char_at
from .numpy_nn import team as _team

_F32 = np.float32


def _half(B, off: int):
    """The float16 at byte ``off`` of every block of ``B`` (blocks, nbytes) as (blocks, 1) float32."""
    return B[:, off:off + 2].view(np.float16).astype(_F32)


def _nibbles(qs):
    """(blocks, 16) bytes -> (blocks, 32) uint8: the low nibbles, then the high nibbles."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _d_f32(B):
    return B.view("<f4").astype(_F32, copy=False)


def _d_f16(B):
    return B.view("<f2").astype(_F32)


def _d_bf16(B):
    return (B.view("<u2").astype(np.uint32) << 16).view(_F32)


def _d_q8_0(B):
    return B[:, 2:].view(np.int8).astype(_F32) * _half(B, 0)


def _d_q4_0(B):
    q = _nibbles(B[:, 2:18]).view(np.int8) - np.int8(8)
    return q.astype(_F32) * _half(B, 0)


def _d_q4_1(B):
    return _nibbles(B[:, 4:20]).astype(_F32) * _half(B, 0) + _half(B, 2)


_BIT32 = np.arange(32, dtype=np.uint32)


def _d_q5_0(B):
    qh = np.ascontiguousarray(B[:, 2:6]).view("<u4")                    # (blocks, 1)
    high = ((qh >> _BIT32) & 1).astype(np.uint8) << 4                  # bit j -> element j
    q = (_nibbles(B[:, 6:22]) | high).view(np.int8) - np.int8(16)
    return q.astype(_F32) * _half(B, 0)


def _d_q5_1(B):
    qh = np.ascontiguousarray(B[:, 4:8]).view("<u4")
    high = ((qh >> _BIT32) & 1).astype(np.uint8) << 4
    return (_nibbles(B[:, 8:24]) | high).astype(_F32) * _half(B, 0) + _half(B, 2)


def _scales_mins_k4(s):
    """(blocks, 12) packed bytes -> (blocks, 8) 6-bit scales and (blocks, 8) 6-bit mins."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _k_nibbles(qs):
    """(blocks, 128) bytes -> (blocks, 8, 32): sub-block 2c is the low nibbles of bytes
    32c..32c+31, sub-block 2c+1 their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 8, 32)


def _k_out(B, q):
    d, dmin = _half(B, 0), _half(B, 2)
    sc, mn = _scales_mins_k4(B[:, 4:16])
    y = (d * sc)[:, :, None] * q.astype(_F32) - (dmin * mn)[:, :, None]
    return y.reshape(-1, 256)


def _d_q4_k(B):
    return _k_out(B, _k_nibbles(B[:, 16:144]))


_BIT8 = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)


def _d_q5_k(B):
    high = ((B[:, None, 16:48] >> _BIT8) & 1) << 4                      # bit s of qh[l] -> sub-block s
    return _k_out(B, _k_nibbles(B[:, 48:176]) | high)


_SHIFT6 = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)


def _d_q6_k(B):
    nb = B.shape[0]
    ql = B[:, :128].reshape(nb, 2, 1, 64)
    lo, hi = ql[..., :32], ql[..., 32:]
    nib = np.concatenate([lo & 15, hi & 15, lo >> 4, hi >> 4], axis=2)     # (nb, 2 halves, 4, 32)
    top = (B[:, 128:192].reshape(nb, 2, 1, 32) >> _SHIFT6) & 3
    q = ((nib | (top << 4)).view(np.int8) - np.int8(32)).astype(_F32)
    sc = B[:, 192:208].view(np.int8).astype(_F32).reshape(nb, 2, 4, 2, 1)    # 16 elements each
    y = (_half(B, 208).reshape(nb, 1, 1, 1, 1) * sc) * q.reshape(nb, 2, 4, 2, 16)
    return y.reshape(nb, 256)


def _d_q3_k(B):
    nb = B.shape[0]
    s = B[:, 96:108]
    low = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1)                  # scale g: byte g % 8
    high = ((s[:, None, 8:12] >> _SHIFT6[0]) & 3).reshape(nb, 16)                    # bits 2 (g // 4) of byte 8 + g % 4
    sc = ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(_F32)
    ql = (B[:, 32:96].reshape(nb, 2, 1, 32) >> _SHIFT6) & 3                       # (nb, h, j, l)
    hb = (B[:, None, 0:32] >> _BIT8) & 1                                          # bit 4h + j of hmask[l]
    q = ((ql.reshape(nb, 8, 32) | (hb << 2)).view(np.int8) - np.int8(4)).astype(_F32)
    y = (_half(B, 108) * sc).reshape(nb, 16, 1) * q.reshape(nb, 16, 16)
    return y.reshape(nb, 256)


def _d_q2_k(B):
    nb = B.shape[0]
    sc = B[:, :16]
    dl = (_half(B, 80) * (sc & 15).astype(_F32)).reshape(nb, 16, 1)
    ml = (_half(B, 82) * (sc >> 4).astype(_F32)).reshape(nb, 16, 1)
    q = ((B[:, 16:80].reshape(nb, 2, 1, 32) >> _SHIFT6) & 3).reshape(nb, 16, 16).astype(_F32)
    return (dl * q - ml).reshape(nb, 256)


_IQ4 = np.array(IQ4_VALUES, _F32)   # (np.take: ~1.3x faster than indexing with the nibble array)


def _d_iq4_nl(B):
    return np.take(_IQ4, _nibbles(B[:, 2:18])) * _half(B, 0)


_BIT16 = np.arange(0, 16, 2, dtype=np.uint16)


def _d_iq4_xs(B):
    nb = B.shape[0]
    sl = B[:, 4:8]
    low = np.stack([sl & 15, sl >> 4], axis=2).reshape(nb, 8)                  # nibble s % 2 of byte s // 2
    high = ((np.ascontiguousarray(B[:, 2:4]).view("<u2") >> _BIT16) & 3).astype(np.uint8)   # bits 2s of scales_h
    dl = _half(B, 0) * ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(_F32)          # (nb, 8)
    q = B[:, 8:136].reshape(nb, 8, 16)
    return (dl[:, :, None] * np.take(_IQ4, np.concatenate([q & 15, q >> 4], axis=2))).reshape(nb, 256)


DEQUANT = {"f32": _d_f32, "f16": _d_f16, "bf16": _d_bf16, "q8_0": _d_q8_0, "q4_0": _d_q4_0,
           "q4_1": _d_q4_1, "q5_0": _d_q5_0, "q5_1": _d_q5_1, "q4_k": _d_q4_k, "q5_k": _d_q5_k, "q6_k": _d_q6_k,
           "q2_k": _d_q2_k, "q3_k": _d_q3_k, "iq4_nl": _d_iq4_nl, "iq4_xs": _d_iq4_xs}


def _bytes(w):
    a = w._buf
    if _PARTS:
        pt = _PARTS.get(id(a))
        if pt is not None:      # (a parts weight, stack_rows: its bytes joined)
            return pt.joined()
    return a.view(np.uint8)


def dequantize_rows(raw, qtype: str, rows: int, k: int):
    """(rows * row_bytes,) uint8 -> (rows, k) float32."""
    fmt = FORMATS[qtype]
    if rows == 0 or k == 0:
        return np.zeros((rows, k), _F32)
    return DEQUANT[qtype](raw.reshape(-1, fmt.nbytes)).reshape(rows, k)


# ---- the wasm backend's kernels, compiled natively (ember.native) ---------------------------------
# quant.c's entry points (ember_wasm_ prefix, see core/native/wasm_kernels.h) with its parameter
# tables: q_linear (qtype, m, n, k), q_dequantize (qtype, n, k), q_embedding (qtype, count, n, k,
# idsize). Their offsets are int32 in C (the page's memory is 32-bit): a call gets at most
# _NATIVE_MAX_BYTES of weight (a row range of it, from its own pointer) and m * n, m * k under 2**31.

_P = ctypes.c_void_p
_NATIVE_SIGS = {"ember_wasm_q_linear": (_P, _P, _P, _P, _P), "ember_wasm_q_dequantize": (_P, _P, _P),
                "ember_wasm_q_embedding": (_P, _P, _P, _P)}
_NATIVE_MAX_BYTES = (1 << 31) - 1
_QERR = {-1: "does not know the format", -2: "got rows that are not whole blocks"}
# qlinear runs natively for m rows of x in [lo, hi] (else numpy's dequantize + BLAS), by measurement
# (notes/native-quant.md, 2 cores, alternating): the integer formats' int16 products (fused for
# m <= 3, decoded tiles above) beat dequantize + BLAS 3-18x for m <= 16; q8_0/q4_0/q4_1, whose
# numpy path is the faster _FastPlan, to m = 64 only (SmolLM2's k = 576 shapes: 1.0-1.6x at 64,
# 0.6-1.2x at 128-256), the other formats to m = 256 (1.0-1.4x there, 0.7-1.0x at 512); the float
# formats expand rows for quant.c's float GEMM, which wins only for few rows (f16 to 32: numpy's
# float16 cast is slow; bf16 to 16; f32 from 2 to 8: at m = 1 numpy's gemv on the weight in place
# is faster)
NATIVE_QLINEAR_M = {"f32": (2, 8), "bf16": (1, 16), "f16": (1, 32), "q8_0": (1, 64), "q4_0": (1, 64),
                    "q4_1": (1, 64)}
NATIVE_QLINEAR_MAX_M = 256   # the other integer formats'
# split a call over threads from this many weight bytes: parallel_for's hand-off costs ~20-40 us,
# more than the second core gives below (one row: q4_1 2048 x 2048, 2.6 MB: 247 -> 209 us; q8_0
# 49152 x 576: 1656 -> 897 us; q6_k 576 x 1536, 0.5 MB: 136 -> 158 us); one piece per thread
NATIVE_SPLIT_BYTES = 1 << 21
_NATIVE_PIECES = 1


def _native_fn(name: str):
    """quant.c's kernel ``name`` from ember.native, or None (not built, SIMDe absent, disabled)."""
    return native.kernel(name, ctypes.c_int32, *_NATIVE_SIGS[name])


def native_qlinear() -> bool:
    """Whether qlinear runs quant.c natively here (ember.native built with SIMDe, not disabled):
    results then carry its int16 activation's rounding, as the wasm backend's do."""
    return _native_fn("ember_wasm_q_linear") is not None


def scratch_floats(qtype: str, m: int, k: int) -> int:
    """Floats of scratch quant.c's ``q_linear`` needs for ``m`` rows of ``k`` (its layout; the
    same as ``ember.wasm.ops_quant.scratch_floats``)."""
    if FORMATS[qtype].block == 1:
        return 2 * 32 * k          # FLOAT_ROWS (32) float rows, and as many packed
    nb = k // 32
    return m * k // 2 + m * nb * 4 + 80 * nb + 4


def _native_fail(op: str, rc: int, qtype: str, n: int, k: int):
    raise ShapeError(f"{op}: the native kernel {_QERR.get(rc, f'failed ({rc})')} (qtype {qtype}, n={n}, k={k})")


def _row_pieces(n: int, rb: int, grain: int = 4, m: int = 1) -> list:
    """Row ranges [(r0, r1)] covering n rows of rb bytes: at most _NATIVE_MAX_BYTES each, one per
    thread and piece when the work (the bytes, times m rows of x) is large enough to split, cut at
    multiples of ``grain``."""
    total = n * rb
    want = threads() * _NATIVE_PIECES if total * m >= NATIVE_SPLIT_BYTES else 1
    pieces = max(want, -(-total // _NATIVE_MAX_BYTES))
    groups = -(-n // grain)
    pieces = max(1, min(pieces, groups))
    cuts = [min(n, groups * i // pieces * grain) for i in range(pieces + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _run_pieces(pieces: list, fn) -> None:
    if len(pieces) == 1:
        fn(*pieces[0])
    else:
        parallel_for(len(pieces), lambda i: fn(*pieces[i]))


_PRM: dict = {}   # parameter tables by value (read only by the kernels): (array, its address)


def _by_value(cache: dict, dtype, values: tuple) -> int:
    """The address of a ``dtype`` array holding ``values``, made once per distinct table and kept
    in ``cache`` (cleared past 4096 tables)."""
    p = cache.get(values)
    if p is None:
        if len(cache) > 4096:
            cache.clear()
        a = np.array(values, dtype)
        p = cache[values] = (a, a.ctypes.data)
    return p[1]


def _prm(*values) -> int:
    """The address of an int32 array holding ``values`` (made once per distinct table)."""
    return _by_value(_PRM, np.int32, values)


def _scratch_at(size: int) -> int:
    """The address of this thread's native scratch of at least ``size`` floats (kept, grown)."""
    got = getattr(_local, "native", None)
    if got is None or got[0].size < size:
        a = np.empty(max(size, 1 << 12), _F32)
        got = _local.native = (a, a.ctypes.data)
    return got[1]


def _native_qlinear(x2, raw, qtype: str, n: int, k: int):
    """(m, n) float32 = x2 @ dequantize(w).T through quant.c's q_linear (for the formats and m
    qdot.c covers, its AVX-512 / AVX2 code: the same bits), or None when it does not apply (no
    kernel, a format or size it leaves to numpy). A decode step makes ~200 of these calls: the
    one-piece case does no more Python than it must (~5-7 us a call)."""
    m = x2.shape[0]
    qd = _qdot_for(qtype, m, n, k)      # (where q_linear runs: the same bits)
    if qd is not None:
        return _native_qdot(qd, x2, raw, qtype, n, k)
    lo, hi = NATIVE_QLINEAR_M.get(qtype, (1, NATIVE_QLINEAR_MAX_M))
    f = FORMATS[qtype]
    if not lo <= m <= hi or m * max(n, k) >= 1 << 31 or k % f.block:
        return None
    fn = _native_fn("ember_wasm_q_linear")
    if fn is None:
        return None
    rb = k // f.block * f.nbytes
    if not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2)
    y = np.empty((m, n), _F32)
    sf = scratch_floats(qtype, m, k)
    w0, xp, gt = raw.ctypes.data, x2.ctypes.data, f.ggml_type
    if n * rb * m < NATIVE_SPLIT_BYTES:   # one call (n * rb < 2**31 then)
        rc = fn(w0, xp, y.ctypes.data, _scratch_at(sf), _prm(gt, m, n, k))
        if rc:
            _native_fail("qlinear", rc, qtype, n, k)
        return y

    def rows(r0: int, r1: int) -> None:
        out = y[0, r0:r1] if m == 1 else np.empty((m, r1 - r0), _F32)
        rc = fn(w0 + r0 * rb, xp, out.ctypes.data, _scratch_at(sf), _prm(gt, m, r1 - r0, k))
        if rc:
            _native_fail("qlinear", rc, qtype, n, k)
        if m > 1:
            y[:, r0:r1] = out

    _run_pieces(_row_pieces(n, rb, m=m), rows)
    return y


# qdot.c (ember_qdot_linear): the same products as quant.c's q_linear, bit for bit, with AVX-512
# (16 weight rows at once) or AVX2 (8) code instead of SIMD128 through SIMDe, for these formats and
# m <= NATIVE_QDOT_MAX_M rows of x (0: off, the benchmarks' A/B switch; 2-4 rows still beat the
# SIMDe tiles, 1.1-2.5x). Measured on a 2-core AVX-512 Xeon (notes/native-qdot.md has the
# scripts): one row, one thread, q4_1 1536 x 576 59 -> 34 us in cache, 114 -> 75 us with the weight
# out of L2 (as in a decode); SmolLM2-135M decode, alternating in one process, Q4_1 45 -> 62
# tok/s, Q4_K_M (q5_0 / q4_k / q6_k / q8_0) 40 -> 70 tok/s, the same greedy texts.
NATIVE_QDOT_MAX_M = 4
_QDOT_TYPES = frozenset(("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"))   # (by ggml type id)
_QDOT: list = [None, None, False]   # [the q_linear function it was looked up with, ember_qdot_linear or None,
#                                     whether that library takes q8_0 with int8 activations]

# q8_0 products with the activation rounded to int8 per block of 32 (qdot.c's QD_Q8_0_I8: VNNI
# vpdpbusd, llama.cpp's numerics) instead of int16 (quant.c's bits). Only on AVX-512 VNNI builds; the
# A/B switch is EMBER_QDOT_INT8 (read at import; 0 = off) or QDOT_INT8, checked on every call.
# Off by default: tests/test_native_qdot.py holds numpy_quant's q8_0 products to quant.c's bits.
# On the 2-core AVX-512 Xeon (notes/native-qdot.md, scripts in notes/native-qdot-int8-scripts):
# one thread, weight in L2 (hot.py) 576x576 15.2 -> 11.3 us, 3072x576 82.9 -> 66.0; 30 layers cold
# (cold.py) 11.4 -> 10.3 ms; SmolLM2-135M Q8_0 decode (ab_int8.py 6, load ~4) 41.1 -> 45.2 tok/s,
# the greedy text agreeing with llama.cpp's for the same 29 tokens either way.
QDOT_INT8 = os.environ.get("EMBER_QDOT_INT8", "0").strip() not in ("", "0")
_GT_Q8_0_I8 = 108


def _qdot_gt(f) -> int:
    """The qtype number ember_qdot_linear gets for format ``f``: q8_0's int8 path where it is on."""
    return _GT_Q8_0_I8 if f.ggml_type == 8 and QDOT_INT8 and _QDOT[2] else f.ggml_type


def _qdot_for(qtype: str, m: int, n: int, k: int):
    """qdot.c's ember_qdot_linear where it computes this product (its formats, m <= NATIVE_QDOT_MAX_M,
    and where _native_qlinear would run quant.c's q_linear: the same bits), else None."""
    if m > NATIVE_QDOT_MAX_M or qtype not in _QDOT_TYPES:
        return None
    lo, hi = NATIVE_QLINEAR_M.get(qtype, (1, NATIVE_QLINEAR_MAX_M))
    if not lo <= m <= hi or m * max(n, k) >= 1 << 31 or k % FORMATS[qtype].block:
        return None
    fn = _native_fn("ember_wasm_q_linear")
    if fn is None:
        return None
    return _QDOT[1] if _QDOT[0] is fn else _qdot_fn(fn)


def _qdot_fn(qlinear_fn):
    """qdot.c's ember_qdot_linear from the library that gave ``qlinear_fn``, or None (a build
    without AVX2 + F16C + BMI2 code); kept in _QDOT until the library changes (a lookup costs ~0.7 us)."""
    fn = native.kernel("ember_qdot_linear", ctypes.c_int64, _P, _P, _P, ctypes.c_int64, _P, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    isa = native.kernel("ember_qdot_isa", ctypes.c_int64)
    i8 = native.kernel("ember_qdot_i8", ctypes.c_int64)
    ok = fn is not None and isa is not None and isa() > 0
    _QDOT[:] = [qlinear_fn, fn if ok else None, bool(ok and i8 is not None and i8())]
    return _QDOT[1]


# products of at least this many weight bytes (times m rows of x) and 32 rows go over team.c's two
# threads (numpy_nn.Team, job 7: rows of w cut at multiples of 16, each output row computed as on
# one thread, so the same bits), in NATIVE_QDOT_TEAM_ITEMS items (a late or busy helper leaves them
# to the caller); 1 << 62: off (the A/B switch). The helper spins in C between a decode's products
# (~1 us to join, against parallel_for's 20-40 us), so medium products pay: measured on the 2-core
# AVX-512 Xeon, weights cycled out of L2 as in a decode, us one thread -> two (notes/native-qdot-
# threads-scripts/split.py 1 2 4, `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE EMBER_NATIVE=require`):
# q4_1 64x576 (22 KB) 10.0 -> 11.4, 128x576 (45 KB) 12.6 -> 12.8, 192x576 (68 KB) 15.4 -> 14.3,
# 576x576 30.1 -> 22.9, 1536x576 71.4 -> 44.8; m = 2: 96x576 (68 KB) 13.1 -> 13.4, 128x576 (90 KB)
# 15.1 -> 14.2; with the weight in cache two threads pay from ~200 KB. The 49152x576 q8_0 head
# (before: parallel_for, 2 pieces) 1596 -> 1474. SmolLM2-135M Q4_1 decode (ab_team.py, the bench's
# 207-token prompt, 128 new tokens, 6 rounds alternating, medians): 53.7 -> 62.7 tok/s (from 160 KB:
# 62.5), Q4_K_M 54.3 -> 61.9, the same tokens.
NATIVE_QDOT_TEAM_BYTES = 1 << 16
NATIVE_QDOT_TEAM_ITEMS = 2
_J_QDOT = 7
_QARGS: dict = {}   # team.c job 7's argument arrays by value: (array, its address)


def _qdot_args(*values) -> int:
    """The address of an int64 array holding ``values`` (team.c's J_QDOT arguments, made once each)."""
    return _by_value(_QARGS, np.int64, values)


def _qdot_on_team(job: int, x2, y, w0, qtype: str, n: int, k: int, count: int, extra: tuple = ()) -> bool:
    """Run team.c's qdot ``job`` (7: one weight at ``w0``, ``count`` = n rows; 8: ``count`` parts
    whose (address, rows) pairs are ``extra``) for x2 (contiguous) into y, where the product reaches
    NATIVE_QDOT_TEAM_BYTES (and 32 rows) and the team is free: True; False leaves it to the caller
    (no team, another thread using it, or too small)."""
    m = x2.shape[0]
    f = FORMATS[qtype]
    rb = k // f.block * f.nbytes
    if n * rb * m < NATIVE_QDOT_TEAM_BYTES or n < 32:
        return False
    tm = _team()
    if tm is None:
        return False
    sb = (_qdot_scratch_floats(m, k) * 4 + 63) & ~63     # (a thread's part of the scratch, whole lines)
    a = _qdot_args(_qdot_gt(f), m, count, k, rb, n, sb, *extra)
    rc = tm(job, a, _addr(x2), _addr(y), w0, _scratch_at(sb // 2), NATIVE_QDOT_TEAM_ITEMS)
    if rc is None:             # (another thread has the team)
        return False
    if rc:
        _native_fail("qlinear", rc, qtype, n, k)
    return True


def _qdot_scratch_floats(m: int, k: int) -> int:
    """ember_qdot_scratch_bytes for m rows of k, in floats."""
    return (m * k * 2 + m * (k // 32) * 16 + 3) // 4


def _native_qdot(fn, x2, raw, qtype: str, n: int, k: int):
    """(m, n) float32 = x2 @ dequantize(w).T through qdot.c (the same bits as q_linear), the rows
    of w split over team.c's two threads from NATIVE_QDOT_TEAM_BYTES, else (no team, or another
    thread using it) as _native_qlinear splits them (cut at multiples of 16: whole groups)."""
    m = x2.shape[0]
    if not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2)
    f = FORMATS[qtype]
    rb = k // f.block * f.nbytes
    y = np.empty((m, n), _F32)
    w0 = raw.ctypes.data
    if _qdot_on_team(_J_QDOT, x2, y, w0, qtype, n, k, n):     # (team.c's two threads)
        return y
    sf = _qdot_scratch_floats(m, k)
    xp, yp, gt = _addr(x2), _addr(y), _qdot_gt(f)   # (_addr: ~0.25 us where writable, not ~0.8)
    if n * rb * m < NATIVE_SPLIT_BYTES:   # (one call: no closure)
        rc = fn(w0, xp, yp, n, _scratch_at(sf), gt, m, n, k)
        if rc:
            _native_fail("qlinear", rc, qtype, n, k)
        return y

    def rows(r0: int, r1: int) -> None:
        rc = fn(w0 + r0 * rb, xp, yp + 4 * r0, n, _scratch_at(sf), gt, m, r1 - r0, k)
        if rc:
            _native_fail("qlinear", rc, qtype, n, k)

    _run_pieces(_row_pieces(n, rb, grain=16, m=m), rows)
    return y


def _team_of(lib, team_fn):
    """``team_fn()`` where ``lib`` is the caller's ``native.lib()``: for numpy_nn.team itself the same
    Team (or None), without team()'s second look-up of the library (0.9 -> 0.36 us); a stand-in
    (tests) is called."""
    if team_fn is not _nn.team:
        return team_fn()
    if threads() < 2:
        return None
    t = _nn._teams.get(id(lib))
    return t if t is not None and t.lib is lib else team_fn()


_F32D = np.dtype(np.float32)
_BUF_ERRORS = (TypeError, ValueError, BufferError)   # (ctypes' buffer export: read-only, not C-contiguous, empty)


def qlinear_call(qtype: str, n: int, k: int, shape):
    """``call(xb, wb)`` (numpy arrays: x's buffer, the weight's words) for a plan step's qlinear with
    output ``shape``: ``_qlinear``'s result bit for bit where it runs qdot.c as one team.c job or one
    call per weight or part (a decode step's products), else None (the caller runs _qlinear). What
    those paths decide (the kernel, the format's number, team.c's argument table, a parts weight's
    table, the weight's address) is made once per library, weight buffer and switch settings; a call
    checks x (float32, its size, C-contiguous: its address through ctypes' buffer export). SmolLM2-135M
    Q8_0's decode products, the weight in cache (medians of 3 runs): 960x576 (a parts weight) 18.4 ->
    14.9 us, 576x576 12.6 -> 10.7, 576x1536 24.8 -> 18.1."""
    shape = tuple(shape)
    f = FORMATS.get(qtype)
    m = int(np.prod(shape[:-1])) if shape else 0
    if f is None or not shape or shape[-1] != n or not n or not m or not k or k % f.block:
        return lambda xb, wb: None
    rb = k // f.block * f.nbytes
    size, work = m * k, n * rb * m
    kept = [None]   # (library, weight buffer, switches, prepared: None where this is no fast case)

    def prepare(wb):
        qd = _qdot_for(qtype, m, n, k)
        if qd is None:
            return None
        pt = _PARTS.get(id(wb)) if _PARTS else None
        gt = _qdot_gt(f)
        team = work >= NATIVE_QDOT_TEAM_BYTES and n >= 32
        sb = (_qdot_scratch_floats(m, k) * 4 + 63) & ~63
        if pt is not None:
            a = np.array((gt, m, len(pt.rows), k, rb, n, sb) + pt.flat, np.int64)
            return (qd, _J_QDOT_PARTS if team else 0, a, a.ctypes.data, None, pt.flat, gt, sb // 2,
                    _qdot_scratch_floats(m, k), work < NATIVE_SPLIT_BYTES)
        a = np.array((gt, m, n, k, rb, n, sb), np.int64)
        w0 = wb.view(np.uint8).ctypes.data
        return (qd, _J_QDOT if team else 0, a, a.ctypes.data, w0, (w0, n), gt, sb // 2,
                _qdot_scratch_floats(m, k), work < NATIVE_SPLIT_BYTES)

    def call(xb, wb):
        lib = native.lib()
        key = (QDOT_INT8, NATIVE_QDOT_MAX_M, NATIVE_QDOT_TEAM_BYTES, NATIVE_QDOT_TEAM_ITEMS, NATIVE_SPLIT_BYTES,
               _native_fn, _team)
        st = kept[0]
        if st is None or st[0] is not lib or st[1] is not wb or st[2] != key:
            st = kept[0] = (lib, wb, key, None if lib is None else prepare(wb))
        p = st[3]
        if p is None or xb.dtype is not _F32D or xb.size != size:
            return None
        try:
            xp = _address(_char_at(xb))
        except _BUF_ERRORS:
            return None
        fn, job, _, ap, w0, flat, gt, sh, sf, one = p
        y = np.empty(shape, _F32)
        yp = _address(_char_at(y))
        if job:
            tm = _team_of(lib, _team)
            rc = None if tm is None else tm(job, ap, xp, yp, w0, _scratch_at(sh), NATIVE_QDOT_TEAM_ITEMS)
            if rc is not None:
                if rc:
                    _native_fail("qlinear", rc, qtype, n, k)
                return y
        if not one:              # (split in pieces: _qlinear's way)
            return None
        _qdot_each(fn, flat, xp, yp, _scratch_at(sf), gt, m, n, k, qtype)
        return y
    return call


# ---- stacked weights: several products that read the same x as one (a layer's q/k/v, gate/up) -----
# ``stack_rows`` (llama.py calls it on device numpy) gives one QTensor for several weights of one
# format and row length: a view of their words where they lie back to back in one buffer (a GGUF
# map's tensors in file order: SmolLM2's ffn_gate and ffn_up), else a weight of "parts" (its words
# a zero-stride placeholder array, never a copy: a model loaded from a path keeps its weights as
# views of the map, issue 18) that qlinear multiplies part by part in one call and, from
# NATIVE_QDOT_TEAM_BYTES, one team.c job (kind 8: the rows of every part over both threads, x
# quantized by each thread per part) with every output row computed as the separate product
# computes it: the same bits. The other numpy kernels (dequantize, qembedding) read a parts weight
# through a joined copy. Decode of SmolLM2-135M: 211 products a token -> 121 (the figures:
# notes/native-decode-handoffs.md).
_J_QDOT_PARTS = 8
_PARTS: dict = {}   # id(placeholder words) -> _Parts (removed when the placeholder dies)


class _Parts:
    """A parts weight's pieces: each part's raw bytes (numpy uint8 views of its words), rows, and
    the flat (address, rows, ...) tuple team.c's job 8 takes."""

    __slots__ = ("raws", "rows", "flat", "__weakref__")

    def __init__(self, raws, rows):
        self.raws, self.rows = tuple(raws), tuple(rows)
        self.flat = tuple(v for r, n in zip(self.raws, self.rows) for v in (r.ctypes.data, n))

    def joined(self):
        """The parts' bytes back to back (a copy: for kernels other than qlinear)."""
        return np.concatenate(self.raws)


def _root(a):
    """The object that owns an array's memory (through views and memoryviews: a GGUF's map)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    while isinstance(a, memoryview) and a.obj is not None:
        a = a.obj
    return a


def stack_rows(ws):
    """One QTensor of the rows of ``ws`` (QTensors on device numpy, one format and row length, at
    least two) in order: a view where their words lie back to back in one buffer, else a parts
    weight (see above); None where they do not qualify (another device, format or row length)."""
    from ..quant import QTensor
    from ..tensor import Tensor

    if len(ws) < 2 or len({(t.qtype, t.k) for t in ws}) != 1 or any(t.data.device != "numpy" for t in ws):
        return None
    bufs = [t.data._buf for t in ws]
    if not all(isinstance(b, np.ndarray) and b.dtype == np.int32 and b.ndim == 1 and b.flags.c_contiguous
               for b in bufs):
        return None
    qtype, k, rows = ws[0].qtype, ws[0].k, [t.n for t in ws]
    if any(id(b) in _PARTS for b in bufs):
        return None
    rb = row_bytes(qtype, k)
    words = quant_words(qtype, sum(rows), k)
    root = _root(bufs[0])
    # (back to back: each part but the last whole words, so no padding between their rows)
    if all(n * rb % 4 == 0 and a.ctypes.data + n * rb == b.ctypes.data for a, b, n in zip(bufs, bufs[1:], rows)) \
            and all(_root(b) is root for b in bufs[1:]):
        # (one buffer, the parts in order: a view over them, keeping the first's base alive)
        data = np.lib.stride_tricks.as_strided(bufs[0], (words,), (4,), writeable=False)
    else:
        data = np.lib.stride_tricks.as_strided(np.zeros(1, np.int32), (words,), (0,), writeable=False)
        key = id(data)
        _PARTS[key] = _Parts([b.view(np.uint8)[:n * rb] for b, n in zip(bufs, rows)], rows)
        import weakref
        weakref.finalize(data, _PARTS.pop, key, None)
    return QTensor(Tensor._wrap(data, (words,), ws[0].data.dtype, "numpy"), qtype, (sum(rows), k))


def _native_qdot_parts(fn, x2, pt: _Parts, qtype: str, n: int, k: int):
    """(m, n) float32: the products of x2 with each part side by side, through qdot.c: one team.c
    job over every part's rows from NATIVE_QDOT_TEAM_BYTES, else part by part as _native_qdot."""
    m = x2.shape[0]
    if not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2)
    f = FORMATS[qtype]
    y = np.empty((m, n), _F32)
    if _qdot_on_team(_J_QDOT_PARTS, x2, y, None, qtype, n, k, len(pt.rows), pt.flat):
        return y
    xp, yp = _addr(x2), _addr(y)
    sf = _qdot_scratch_floats(m, k)
    if n * (k // f.block * f.nbytes) * m >= NATIVE_SPLIT_BYTES:   # (large parts: each split as _native_qdot splits it)
        return np.concatenate([_native_qdot(fn, x2, r, qtype, rows, k) for r, rows in zip(pt.raws, pt.rows)], axis=1)
    _qdot_each(fn, pt.flat, xp, yp, _scratch_at(sf), _qdot_gt(f), m, n, k, qtype)
    return y


def _qdot_each(fn, flat, xp: int, yp: int, sp: int, gt: int, m: int, n: int, k: int, qtype: str) -> None:
    """One thread: qdot.c over each (weight address, rows) pair of ``flat``, each call writing its
    columns of y (``n`` wide) after the ones before."""
    at = 0
    for i in range(0, len(flat), 2):
        rc = fn(flat[i], xp, yp + 4 * at, n, sp, gt, m, flat[i + 1], k)
        if rc:
            _native_fail("qlinear", rc, qtype, n, k)
        at += flat[i + 1]


def _native_dequantize(raw, qtype: str, n: int, k: int):
    """(n, k) float32 through quant.c's q_dequantize (bit-equal to the numpy path), or None."""
    fn = _native_fn("ember_wasm_q_dequantize")
    if fn is None or k >= 1 << 31 or k % FORMATS[qtype].block:
        return None
    rb = row_bytes(qtype, k)
    y = np.empty((n, k), _F32)
    gt = FORMATS[qtype].ggml_type

    def rows(r0: int, r1: int) -> None:
        prm = np.array([gt, r1 - r0, k], np.int32)
        rc = fn(raw[r0 * rb:].ctypes.data, y[r0:r1].ctypes.data, prm.ctypes.data)
        if rc:
            _native_fail("dequantize", rc, qtype, n, k)

    _run_pieces(_row_pieces(n, max(rb, 4 * k), grain=1), rows)   # (a piece's r * k floats: int32 too)
    return y


def _native_qembedding(flat, raw, qtype: str, n: int, k: int):
    """(len(flat), k) float32: rows ``flat`` (ids already checked) through quant.c's q_embedding."""
    rb = row_bytes(qtype, k)
    fn = _native_fn("ember_wasm_q_embedding")
    if fn is None or n * rb > _NATIVE_MAX_BYTES or flat.size * k >= 1 << 31 or k % FORMATS[qtype].block:
        return None
    ids = np.ascontiguousarray(flat, np.int64 if flat.dtype.itemsize == 8 else np.int32)
    y = np.empty((ids.size, k), _F32)
    prm = np.array([FORMATS[qtype].ggml_type, ids.size, n, k, ids.itemsize], np.int32)
    rc = fn(raw.ctypes.data, ids.ctypes.data, y.ctypes.data, prm.ctypes.data)
    if rc > 0:   # (the ids were checked before: only a changed buffer gets here)
        raise IndexingError(f"qembedding: id {int(ids[rc - 1])} is out of range for a {qtype} weight of {n} rows "
                            f"(ids must be in [0, {n}))")
    if rc:
        _native_fail("qembedding", rc, qtype, n, k)
    return y


def _dequantize(out, w, *, qtype, n, k, **_):
    raw = _bytes(w)[:n * row_bytes(qtype, k)]
    if n * k:
        y = _native_dequantize(raw, qtype, n, k)
        if y is not None:
            return y
    return dequantize_rows(raw, qtype, n, k)


# ---- qlinear ---------------------------------------------------------------------------------------
# x @ W.T without a float copy of W: the rows are decoded a chunk at a time into a per-thread
# scratch that stays in cache, and multiplied there with BLAS.
#
# q8_0, q4_0 and q4_1 (the weights of most GGUF models) take a faster route (_FastPlan). numpy
# pays per row of a 2-D operation and a block is only 18 to 34 bytes, so every step there is a
# flat pass over the chunk or a copy of one whole 16/32-byte item per block (_quants); the
# float16 scales are decoded with integer ops (_halves). For decoding (few rows of x) the quants
# stay unscaled: BLAS gives s[b, r] = sum_j q[r, b, j] * x[b, j] per block b of row r, and
# y[r] = sum_b d[r, b] * s[b, r] costs one multiply per block and token instead of one per
# weight (q4_1 adds sum_b m[r, b] * sum_j x[b, j]; q4_0's quants are stored offset by 8, so it
# subtracts 8 * sum_b d[r, b] * sum_j x[b, j]). For prompts (many rows of x) the chunk is scaled
# first and multiplied in one gemm.
#
# Measured on one core of a quiet machine (.cache is not kept; the figures are in the commit
# message): ~0.9 ns per weight for decoding, against ~0.05 for a float32 gemv of a weight kept
# in cache; the weight is never held as float, so the model stays at its file size.

CHUNK_BYTES = 1 << 21        # float32 scratch per chunk (generic path)
FAST_CHUNK_BYTES = 1 << 20   # float32 scratch per chunk (q8_0 / q4_0 / q4_1 path)
SMALL_M = 8                  # rows of x up to which the fast path scales after the product
PARALLEL_MIN = 1 << 22       # weights (n * k) from which qlinear splits the rows over threads
                             # (smaller ones lose what they gain to the GIL: ~30 numpy calls a chunk)


def _default_threads() -> int:
    """``EMBER_NUMPY_THREADS``, else the cores this process may run on (at most 4)."""
    env = os.environ.get("EMBER_NUMPY_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


THREADS = _default_threads()   # worker threads for one qlinear (numpy and BLAS release the GIL)

# qtype -> (bytes per block, offset of the quants, nibbles?) for the fast path
_FAST = {"q8_0": (34, 2, False), "q4_0": (18, 2, True), "q4_1": (20, 4, True)}
_V16, _V32 = np.dtype((np.void, 16)), np.dtype((np.void, 32))

_local = threading.local()


def _scratch(name: str, size: int, dtype=_F32):
    """A per-thread reusable buffer of at least ``size`` elements."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    b = bufs.get(name)
    if b is None or b.size < size:
        b = bufs[name] = np.empty(size, dtype)
    return b[:size]


_F16_SHIFT = np.int32(13)
_F16_MASK = np.int32(-0x70000000 - 1)      # 0x8FFFFFFF: the sign bit and the low 28 bits
_F16_SCALE = np.float32(2.0 ** 112)


def _halves(C, nbytes: int, off: int, count: int, name: str):
    """The float16 at byte ``off`` of each of ``count`` blocks in the flat chunk ``C``, as float32.

    numpy's own float16 cast costs ~1.5 ns a value here, as much as the rest of a decode step;
    integer ops do it in four flat passes: the half's bits sign-extended to 32 (sign in bits
    31..15) and shifted left 13 put the exponent and mantissa where float32 has them, clearing
    bits 28..30 leaves the sign alone, and 2**112 rebias the exponent (exact, subnormals
    included). Infinities and NaNs (exponent 31) come out finite and are redone the slow way."""
    h = np.ndarray((count,), dtype="<i2", buffer=C, offset=off, strides=(nbytes,))
    t = _scratch(name, count, np.int32)
    np.copyto(t, h, casting="unsafe")
    np.left_shift(t, _F16_SHIFT, out=t)
    np.bitwise_and(t, _F16_MASK, out=t)
    f = t.view(_F32)
    np.multiply(f, _F16_SCALE, out=f)
    if count and np.abs(f).max() >= 65536.0:   # an inf/NaN scale (a broken file): exact fallback
        np.copyto(f, h.view("<f2"), casting="unsafe")
    return f


def _quants(C, qtype: str, nblk: int):
    """The unscaled quants of the ``nblk`` blocks in the flat chunk ``C`` as float32, in element
    order (nblk * 32 values): int8 for q8_0, nibbles 0..15 for q4_0/q4_1.

    numpy pays per row of a 2-D operation, and a block's quants are only 16 or 32 bytes wide, so
    every step is a flat pass or a copy of whole 16/32-byte items (one per block): the quants
    are gathered out of the blocks as void items; for nibbles, the low halves come from the
    bytes as they are and the high halves from the chunk shifted right by 4 bits (a byte's high
    nibble lands in its low nibble), interleaved 16 bytes at a time, then masked."""
    nbytes, qoff, nib = _FAST[qtype]
    q = _scratch("q", nblk * 32)
    b = _scratch("b", nblk * 32, np.uint8)
    if not nib:
        src = np.ndarray((nblk,), dtype=_V32, buffer=C, offset=qoff, strides=(nbytes,))
        np.copyto(b.view(_V32), src)
        np.copyto(q, b.view(np.int8), casting="unsafe")
        return q
    size = C.size
    if size % 4 == 0 and C.ctypes.data % 4 == 0:   # shift four bytes per op
        sh = _scratch("sh", size // 4, np.uint32)
        np.right_shift(C.view(np.uint32), np.uint32(4), out=sh)
        sh = sh.view(np.uint8)
    else:
        sh = _scratch("sh8", size, np.uint8)
        np.right_shift(C, np.uint8(4), out=sh)
    items = b.view(_V16)
    np.copyto(items[0::2], np.ndarray((nblk,), dtype=_V16, buffer=C, offset=qoff, strides=(nbytes,)))
    np.copyto(items[1::2], np.ndarray((nblk,), dtype=_V16, buffer=sh, offset=qoff, strides=(nbytes,)))
    b32 = b.view(np.uint32)
    np.bitwise_and(b32, np.uint32(0x0F0F0F0F), out=b32)
    np.copyto(q, b, casting="unsafe")
    return q


class _FastPlan:
    """The x-side arrays of one fast qlinear call (shared by all chunks and threads)."""

    def __init__(self, qtype, x2, k):
        M = x2.shape[0]
        self.qtype, self.nb, self.M, self.k = qtype, k // 32, M, k
        self.nbytes = _FAST[qtype][0]
        self.small = M <= SMALL_M
        self.x = x2
        if self.small:   # (nb, M, 32): x of block b
            self.xb = np.ascontiguousarray(x2.reshape(M, self.nb, 32).transpose(1, 0, 2))
        self.xsum = x2.reshape(M, self.nb, 32).sum(axis=2) if qtype != "q8_0" else None   # (M, nb)

    def rows(self, raw, y, r0: int, r1: int) -> None:
        """y[:, r0:r1] for the rows r0..r1 of the weight (raw: all its bytes)."""
        nbytes, nb = self.nbytes, self.nb
        r = r1 - r0
        nblk = r * nb
        C = raw[r0 * nb * nbytes:r1 * nb * nbytes]
        d = _halves(C, nbytes, 0, nblk, "d")
        q = _quants(C, self.qtype, nblk)
        if self.small:
            s = matmul(self.xb, q.reshape(r, nb, 32).transpose(1, 2, 0))   # (nb, M, r)
            np.multiply(s, d.reshape(r, nb).T[:, None, :], out=s)
            yc = s.sum(axis=0)                                                # (M, r)
        else:
            q2 = q.reshape(nblk, 32)
            np.multiply(q2, d.reshape(nblk, 1), out=q2)
            yc = matmul(self.x, q.reshape(r, self.k).T)                               # (M, r)
        if self.qtype == "q4_1":
            yc += matmul(self.xsum, _halves(C, nbytes, 2, nblk, "m").reshape(r, nb).T)
        elif self.qtype == "q4_0":
            yc -= 8 * matmul(self.xsum, d.reshape(r, nb).T)
        y[:, r0:r1] = yc


_POOL: list = [None, 0, 0]   # executor, its threads, the process it belongs to


def _pool(threads: int):
    # a forked child inherits the executor but not its threads: it makes its own
    if _POOL[0] is None or _POOL[1] != threads or _POOL[2] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _POOL[:] = [ThreadPoolExecutor(threads, thread_name_prefix="ember-qlinear"), threads, os.getpid()]
    return _POOL[0]


def _fast_qlinear(qtype, x2, raw, n, k):
    plan = _FastPlan(qtype, x2, k)
    y = np.empty((x2.shape[0], n), _F32)
    step = max(2, FAST_CHUNK_BYTES // (4 * k)) // 2 * 2   # even: chunks start 4-byte aligned

    def run(a, b):
        for r0 in range(a, b, step):
            plan.rows(raw, y, r0, min(b, r0 + step))

    threads = min(THREADS, -(-n // step)) if n * k >= PARALLEL_MIN and plan.small else 1
    if threads <= 1:
        run(0, n)
    else:   # contiguous row ranges, one per thread, each a whole number of chunks
        per = -(-(-(-n // step)) // threads) * step
        futures = [_pool(threads).submit(run, a, min(n, a + per)) for a in range(per, n, per)]
        run(0, min(n, per))
        for f in futures:
            f.result()
    return y


def _qlinear(out, x, w, *, qtype, n, k, **_):
    xb = x._buf
    x2 = xb.reshape(-1, k).astype(_F32, copy=False)
    if n == 0 or x2.shape[0] == 0:
        return np.zeros(out.shape, _F32)
    wb = w._buf
    pt = _PARTS.get(id(wb)) if _PARTS else None
    m = x2.shape[0]
    qd = _qdot_for(qtype, m, n, k)     # (the decode's products: qdot.c without the layers between)
    if qd is not None:
        if pt is not None:
            return _native_qdot_parts(qd, x2, pt, qtype, n, k).reshape(out.shape)
        return _native_qdot(qd, x2, wb.view(np.uint8), qtype, n, k).reshape(out.shape)
    if pt is not None:          # (a parts weight, stack_rows: each part as its own product)
        return np.concatenate([_qlinear_raw(x2, r, qtype, rows, k) for r, rows in zip(pt.raws, pt.rows)],
                              axis=1).reshape(out.shape)
    return _qlinear_raw(x2, _bytes(w), qtype, n, k).reshape(out.shape)


def _qlinear_raw(x2, raw, qtype, n, k):
    """(m, n) float32 = x2 @ dequantize(raw's first n rows).T"""
    rb = row_bytes(qtype, k)
    yn = _native_qlinear(x2, raw[:n * rb], qtype, n, k)
    if yn is not None:
        return yn
    if qtype in _FAST:
        return _fast_qlinear(qtype, x2, raw[:n * rb], n, k)
    y = np.empty((x2.shape[0], n), _F32)
    step = max(1, CHUNK_BYTES // (4 * max(k, 1)))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        W = dequantize_rows(raw[r0 * rb:r1 * rb], qtype, r1 - r0, k)
        matmul(x2, W.T, out=y[:, r0:r1])
    return y


def _qembedding(out, ids, w, *, qtype, n, k, **_):
    rb = row_bytes(qtype, k)
    flat = ids._buf.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= n):
        bad = flat[(flat < 0) | (flat >= n)][0]
        raise IndexingError(f"qembedding: id {int(bad)} is out of range for a {qtype} weight of {n} rows "
                            f"(ids must be in [0, {n}))")
    if flat.size * k:
        y = _native_qembedding(flat, _bytes(w)[:n * rb], qtype, n, k)
        if y is not None:
            return y.reshape(out.shape)
    rows = _bytes(w)[:n * rb].reshape(n, rb)[flat]
    return dequantize_rows(rows.reshape(-1), qtype, flat.size, k).reshape(out.shape)


KERNELS = {
    "dequantize": _dequantize,
    "qlinear": _qlinear,
    "qembedding": _qembedding,
}
