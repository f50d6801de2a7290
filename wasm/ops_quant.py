"""Quantized-weight and language-model kernels of the wasm backend: ``qlinear``, ``dequantize``,
``qembedding`` (``kernels/quant.c``) and ``rms_norm``, ``rope``, ``attention_cached``
(``kernels/llm.c``). One call into the module per op.

Why qlinear looks the way it does (measured in Node 20 on this 2-core AMD EPYC, SmolLM2-135M's
shapes: Q4_1 layers, the Q8_0 head of 49152 x 576; ``tests/bench/bench_wasm.py --qlinear``):

- Decoding is matrix-vector products over ~96 MB of weights per token, so the weight is read
  once, in its blocks, never expanded. The activation row is quantized first, per block of 32,
  to **int16** (not llama.cpp's int8): SIMD128's only integer dot product is
  ``i32x4.dot_i16x8_s`` (int16 x int16, pairs summed into int32), so int16 costs nothing over
  int8 and keeps the result within ~1e-5 (relative to sum |x w|) of the float product.
- Nibbles are not widened byte by byte: 16 bytes of a Q4 block read as 8 int16 lanes give the
  32 values as four int16 vectors with one mask or shift each (``v & 15``, ``v >> 8 & 15``,
  ``v >> 4 & 15``, ``v >> 12``); the activation is stored in the matching order (even, odd,
  even + 16, odd + 16), so a block costs one load, 7 bit operations and 4 dot products.
  Q8_0 the same way with arithmetic shifts.
- Four weight rows run together: their four int32 sums are transposed into one vector, so the
  four rows' half-precision scales are converted (a bit trick, exact for every half; a group
  whose scales hold inf/NaN is redone with the slower branch that handles them) and applied as
  one vector per block.
- Offsets (Q4_1's min, Q4_0's -8, the K-quant mins) are applied to the float sums of the
  activation block, not to the quantized values: one vector multiply-add per block, and exact.
- V8 does not prefetch for wasm and the hardware prefetcher lost track of four interleaved
  row streams: the Q8_0 head ran at ~5 GB/s. Reading one byte per cache line a few rows ahead
  (clamped to the weight) doubled it; the fused kernel does that.
- Prompts (more than ``FUSED_MAX_M`` = 3 rows in quant.c), q2_k, q3_k, q5_k and q6_k decode four weight
  rows at a time into a small int16 tile (with per-block float scales) and run every activation
  row against it: the weight is decoded once per call instead of once per row (Q4_1 1536 x 576
  with 37 rows: 18.5 GMAC/s, against 13 for one row fused and ~12 for the float GEMM). Same
  integer sums and the same float operations in the same order as the fused paths, so a row of
  x gives the same bits whatever M is (a prompt and the decode of the same token agree exactly).
  q4_k has a fused path too (8.9 against 6.3 GMAC/s tiled); q5_k and q6_k fused ran slower than
  their tiles.
- The float formats (f32, f16, bf16) expand ``FLOAT_ROWS`` rows at a time into scratch and use
  the float GEMM of ``gemm.c`` (no activation quantization there).
- Relaxed SIMD (``i32x4.relaxed_dot_i8x16_i7x16_add``) would double the dot rate in Chromium,
  but Debian's clang 14 cannot emit it and Node 20 needs a flag; it would also need a second
  module and a loader that picks one. Left for later: this module is the one that always runs.

Scratch (the activation's int16 copy and scales, the decoded tile, float rows) is one float32
buffer per runtime owned here; its size depends on shapes only (``scratch_floats``), never on
tensor values. Data-dependent checks happen in C: an id outside ``[0, n)`` (``qembedding``) and
``pos + T > C`` (``attention_cached``, which reads ``pos`` from its tensor when it runs, so a
replayed plan sees each step's position) return an error code that the wrappers here turn into
the python kernels' typed errors.

>>> import ember
>>> from ember import quant
>>> w = quant.QTensor.quantize(ember.ones((3, 32)), "q8_0", device="wasm")   # doctest: +SKIP
>>> quant.linear(ember.ones((1, 32), device="wasm"), w).tolist()              # doctest: +SKIP
[[32.0, 32.0, 32.0]]
"""
from __future__ import annotations

from array import array
import struct
from math import prod

from .. import dtypes as _dt
from ..errors import BoundsError, IndexingError, ShapeError
from ..ops.llm import check_pos
from ..quant import FORMATS, row_bytes
from .ops_linalg import _Scratch
from .fallback import PY
from .runtime import R, W

# formats the module knows (ggml type numbers, as in quant.c)
KNOWN = frozenset(("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k",
                   "q4_k", "q5_k", "q6_k", "iq4_xs"))
FLOAT_FORMATS = frozenset(("f32", "f16", "bf16"))
FLOAT_ROWS = 32                 # quant.c FLOAT_ROWS
QERR_QTYPE, QERR_SHAPE = -1, -2
AC_ERR_POS = 1
MODES = {"pairs": 0, "halves": 1}

_F32 = _dt.float32
_ZERO = array("f", [0.0])


def scratch_floats(qtype: str, m: int, k: int) -> int:
    """Floats of scratch ``q_linear`` uses for ``m`` rows of ``k`` (quant.c's layout).

    >>> scratch_floats("q4_1", 1, 576)
    1804
    """
    if qtype in FLOAT_FORMATS:
        return 2 * FLOAT_ROWS * k
    nb = k // 32
    return m * k // 2 + m * nb * 4 + 80 * nb + 4


def _fail(op: str, rc: int, qtype: str, shape) -> None:
    what = {QERR_QTYPE: "does not know the format", QERR_SHAPE: "got rows that are not whole blocks"}
    raise ShapeError(f"{op}: the wasm kernel {what.get(rc, f'failed ({rc})')} (qtype {qtype}, {shape})")


def kernels(rt) -> dict:
    scratch = _Scratch()
    call = rt.call
    params = {}   # parameter tables by value: one array per shape, kept (a replayed plan points at it)

    def prm(*values):
        p = params.get(values)
        if p is None:
            if len(params) > 4096:
                params.clear()
            p = params[values] = array("i", values)
        return R(p, len(values))

    def _weight(w, qtype, n, k):
        need = n * row_bytes(qtype, k)
        if len(w._buf) * 4 < need:
            raise BoundsError(f"wasm quant kernel: a {qtype} weight of {n} x {k} needs {need} bytes, its words "
                              f"hold {len(w._buf) * 4}")
        return R(w._buf, len(w._buf))

    # ---- quantized weights -----------------------------------------------------------------------

    def qlinear(out, x, w, *, qtype, n, k, **attrs):
        m = prod(x.shape[:-1])
        xb = x._buf
        if qtype not in KNOWN or xb.typecode != "f" or m * n * k == 0:
            return PY["qlinear"](out, x, w, qtype=qtype, n=n, k=k, **attrs)
        y = _ZERO * (m * n)
        rc = call("q_linear", _weight(w, qtype, n, k), R(xb, m * k), W(y, m * n),
                  scratch.span(scratch_floats(qtype, m, k)), prm(FORMATS[qtype].ggml_type, m, n, k))
        if rc:
            _fail("qlinear", rc, qtype, f"n={n}, k={k}")
        return y

    def dequantize(out, w, *, qtype, n, k, **attrs):
        if qtype not in KNOWN or n * k == 0:
            return PY["dequantize"](out, w, qtype=qtype, n=n, k=k, **attrs)
        y = _ZERO * (n * k)
        rc = call("q_dequantize", _weight(w, qtype, n, k), W(y, n * k), prm(FORMATS[qtype].ggml_type, n, k))
        if rc:
            _fail("dequantize", rc, qtype, f"n={n}, k={k}")
        return y

    def qembedding(out, ids, w, *, qtype, n, k, **attrs):
        ib = ids._buf
        count = prod(ids.shape)
        if qtype not in KNOWN or ib.typecode not in ("i", "q") or count * k == 0:
            return PY["qembedding"](out, ids, w, qtype=qtype, n=n, k=k, **attrs)
        y = _ZERO * (count * k)
        rc = call("q_embedding", _weight(w, qtype, n, k), R(ib, count), W(y, count * k),
                  prm(FORMATS[qtype].ggml_type, count, n, k, ib.itemsize))
        if rc > 0:
            i = ib[rc - 1]
            raise IndexingError(f"qembedding: id {i} is out of range for a {qtype} weight of {n} rows "
                                f"(ids must be in [0, {n}))")
        if rc:
            _fail("qembedding", rc, qtype, f"n={n}, k={k}")
        return y

    # ---- language-model ops ----------------------------------------------------------------------

    def rms_norm(out, x, w, *, eps, **attrs):
        n = x.shape[-1] if x.shape else 0
        rows = prod(x.shape[:-1])
        if x.dtype is not _F32 or w.dtype is not _F32 or n * rows == 0:
            return PY["rms_norm"](out, x, w, eps=eps, **attrs)
        y = _ZERO * (rows * n)
        call("rms_norm_f32", R(x._buf, rows * n), R(w._buf, n), W(y, rows * n), rows, n, float(eps))
        return y

    def rope(out, x, cos, sin, *, mode, **attrs):
        T, H, D = x.shape
        if (x.dtype is not _F32 or cos.dtype is not _F32 or sin.dtype is not _F32 or mode not in MODES
                or T * H * D == 0):
            return PY["rope"](out, x, cos, sin, mode=mode, **attrs)
        half = D // 2
        y = _ZERO * (T * H * D)
        call("rope_f32", R(x._buf, T * H * D), R(cos._buf, T * half), R(sin._buf, T * half), W(y, T * H * D),
             T, H, D, MODES[mode])
        return y

    def attention_cached(out, q, k, v, kc, vc, pos, *, scale, window=0, softcap=0.0, **attrs):
        T, hq, d = q.shape
        C, hkv, _ = kc.shape
        if d % 4 or T * hq * d == 0 or pos._buf.typecode != "i":
            return PY["attention_cached"](out, q, k, v, kc, vc, pos, scale=scale, window=window, softcap=softcap,
                                          **attrs)
        cap_bits = struct.unpack("<i", struct.pack("<f", softcap))[0]
        y = _ZERO * (T * hq * d)
        rc = call("attention_cached_f32", R(q._buf, T * hq * d), R(k._buf, T * hkv * d), R(v._buf, T * hkv * d),
                  W(kc._buf, C * hkv * d), W(vc._buf, C * hkv * d), R(pos._buf, 1), W(y, len(y)),
                  scratch.span((hq // hkv) * (C + 1)), prm(T, hq, hkv, d, C, window, cap_bits), float(scale))
        if rc:
            check_pos(int(pos._buf[0]), T, C)   # raises the python kernel's ShapeError
            raise ShapeError(f"attention_cached: the wasm kernel failed ({rc})")
        return y

    return {"qlinear": qlinear, "dequantize": dequantize, "qembedding": qembedding,
            "rms_norm": rms_norm, "rope": rope, "attention_cached": attention_cached}
