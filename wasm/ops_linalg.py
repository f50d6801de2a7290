"""Linear-algebra kernels of the wasm backend on the SIMD module: matmul, linear, conv2d,
conv_transpose2d, max/avg pooling and a fused scaled_dot_product_attention (``kernels/gemm.c``,
``conv.c``, ``pool.c``, ``attention.c``). One call into the module per op.

Float32 runs in the module. Float16 tensors (stored as float32 rounded to half in this backend)
run the same float32 code and are rounded to half once at the end where the op can produce new
values (max pooling picks an existing value and needs no rounding). Everything else (integers,
bools, empty tensors) runs the python backend's kernel on the same buffers.

Which GEMM: the module's 4x8 microkernel reads B in packed panels of 8 columns. Packing costs a
pass over B, which a product with few rows cannot win back, so with at most ``SMALL_M`` rows
matmul reads B in place (only its last partial panel is packed) and linear takes dot products of
the input rows with the weight rows (never transposing the weight); with more rows B is packed
first. conv2d writes image patches straight into packed panels (im2col, a chunk of output
positions at a time), or with column stride 1 and output rows that fill the 8-lane tiles well
(``CONV_DIRECT``) reads a zero-padded copy of the planes in its 4x8 tile with no panels at all
(the same bits); it runs a 1x1 convolution as one GEMM on the input, and a depthwise one
directly; bias (and a fused relu) is added in the GEMM's store. Scratch memory (packed panels, im2col chunks,
attention scores) is one float32 buffer per runtime, allocated here in Python: the module owns
no memory, and every size table it gets is checked against the buffers here first.

>>> import ember
>>> x = ember.ones((2, 3), device="wasm")             # doctest: +SKIP  (needs the module)
>>> ember.linear(x, ember.ones((4, 3), device="wasm")).tolist()   # doctest: +SKIP
[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]
"""
from __future__ import annotations

import os
from array import array
from math import prod

from .. import dtypes as _dt
from ..backends import python as _py
from ..errors import BoundsError
from .fallback import PY
from .runtime import R, W

# gemm flags and modes of reading B (kernels/linalg.h)
BIAS_COL, BIAS_ROW, RELU, ACCUMULATE = 1, 2, 4, 8
CONV_IM2COL = 16       # conv2d_gemm: no direct form from the padded planes (linalg.h)
# conv2d_gemm's direct form (column stride 1, few wasted lanes: conv.c conv_direct_ok) reads the
# padded planes with no im2col; EMBER_WASM_CONV_DIRECT=0 (or this set False) keeps im2col + gemm.
# Same bits either way.
CONV_DIRECT = os.environ.get("EMBER_WASM_CONV_DIRECT", "1") != "0"
B_KN_DIRECT, B_KN_PACKED, B_NK_PACKED, B_NK_DOT = 0, 1, 2, 3
NR = 8                 # columns per packed panel
MR, KC, MC = 4, 384, 96  # the microkernel's rows, gemm's K and row blocks (GEMM_MR/KC/MC)
SMALL_M = 16           # at most this many rows: no packing (see the module docstring)
CHUNK_FLOATS = 1 << 18  # im2col chunk: about 1 MB of patches, written and used while in cache
CONV_PAD_MAX = 1 << 18  # conv2d_gemm's zero-padded copy of a group's planes, at most (linalg.h)

_F32, _F16 = _dt.float32, _dt.float16
_ZERO = array("f", [0.0])
_ONE = [0]   # the offset table of a single product


def _zeros(n: int) -> array:
    return _ZERO * n


def _panels(k: int, n: int) -> int:
    """Floats in the packed panels of a (k, n) B."""
    return -(-n // NR) * NR * k


def _apack(m: int, k: int) -> int:
    """Floats of scratch past the panels where gemm's packed modes pack a block of A's rows
    (kernels/linalg.h GEMM_APACK)."""
    return -(-min(m, MC) // MR) * MR * min(k, KC)


def _pad_floats(cg: int, stride, kernel, dilation, out_hw, pad) -> int:
    """Scratch floats past the panels that conv2d_gemm fills with a zero-padded copy of a group's
    planes (kernels/conv.c pad_floats: column stride 1 unless a plain 1x1 convolution; the rows
    and columns the taps reach, and 8 floats of slack either side)."""
    (sh, sw), (kh, kw), (dh, dw), (oh, ow) = stride, kernel, dilation, out_hw
    if sw != 1 or (kh == kw == 1 and sh == 1 and pad == (0, 0)):
        return 0
    n = cg * ((oh - 1) * sh + (kh - 1) * dh + 1) * (ow + (kw - 1) * dw)
    return 0 if n > CONV_PAD_MAX else n + 16


def _finish(buf: array, dtype) -> array:
    """The float32 result as the output dtype's buffer (float16: rounded to half)."""
    if dtype is _F16:
        return array("f", _dt.round_half(buf.tolist()))
    return buf


_FLOAT_TYPES = (_F32, _F16)   # (conv, pooling, linear and attention admit no others: their dtype rules)


class _Scratch:
    """One grow-only float32 buffer that kernels use for packed panels, im2col chunks and scores.
    ``span(n)`` is a W span of n floats starting on a 64-byte boundary (a cache line: the packed
    panels are the GEMM's most-read operand). Requests over ``KEEP_MAX`` floats get a buffer of
    their own that is dropped after the call, so one huge product does not leave its panels in
    Pyodide's heap for good."""

    KEEP_MAX = 1 << 22   # 16 MB
    PAD = 16             # floats of slack for the alignment

    def __init__(self):
        self.buf = _zeros(0)

    def span(self, n: int) -> W:
        buf = self.buf
        if len(buf) < n + self.PAD:
            if n > self.KEEP_MAX:
                buf = _zeros(n + self.PAD)
            else:
                buf = self.buf = _zeros(min(max(n, len(buf) * 3 // 2), self.KEEP_MAX) + self.PAD)
        off = (-buf.buffer_info()[0] // 4) % self.PAD
        return W(buf, n, off)


def _need(ok: bool, what: str) -> None:
    # The kernels trust their size tables; this is the check that they stay inside the buffers.
    if not ok:
        raise BoundsError(f"wasm linalg kernel: {what} would reach outside its buffer")


def kernels(rt) -> dict:
    scratch = _Scratch()
    call = rt.call

    def gemm(A, B, m, n, k, mode, aoffs=_ONE, bidx=_ONE, boffs=_ONE, bias=None, flags=0):
        """``len(aoffs)`` products C_i = A[aoffs[i]:] (m, k) @ B_{bidx[i]} (+ bias), one call; the
        distinct B matrices start at ``boffs``, as (k, n) for the KN modes or as (n, k) rows for the
        NK modes. Returns C (len(aoffs) * m * n floats, row-major). (Lean on purpose: it runs
        once per matmul/linear, where Python time is a real part of a small product's cost.)"""
        nb, nbb = len(aoffs), len(boffs)
        kn = mode <= B_KN_PACKED
        ldb = n if kn else k
        na, nbuf = len(A), len(B)
        if aoffs is _ONE:
            reach_a, reach_b = m * k, k * n
        else:
            reach_a, reach_b = max(aoffs) + m * k, max(boffs) + k * n
        if reach_a > na or reach_b > nbuf or (bias is not None and len(bias) < (n if flags & BIAS_COL else m)):
            _need(False, "A, B or bias")
        C = _ZERO * (nb * m * n)
        if mode == B_KN_DIRECT:
            size = nbb * k * NR if n % NR else 0
        elif mode == B_NK_DOT:
            size = 0
        else:
            size = nbb * (-(-n // NR) * NR * k) + _apack(m, k)
        prm = array("i", [m, n, k, k, ldb, n, flags, mode, nb, nbb, m * n, *aoffs, *bidx, *boffs])
        call("gemm", R(A, na), R(B, nbuf), scratch.span(size) if size else 0, W(C, len(C)),
             0 if bias is None else R(bias, len(bias)), R(prm, len(prm)))
        return C

    def matmul(out, a, b):
        if a.dtype not in _FLOAT_TYPES or 0 in out.shape or a.shape[-1] == 0:
            return PY["matmul"](out, a, b)
        M, K = a.shape[-2:]
        N = b.shape[-1]
        mode = B_KN_DIRECT if M <= SMALL_M else B_KN_PACKED
        if len(a.shape) == 2 and len(b.shape) == 2:
            C = gemm(a._buf, b._buf, M, N, K, mode)
            return _finish(C, out.dtype)
        batch = out.shape[:-2]
        nbA, nbB = prod(a.shape[:-2]), prod(b.shape[:-2])
        ia = _py.broadcast_index(a.shape[:-2], batch)
        if nbB == 1 and isinstance(ia, range):
            # one B for every batch and A's batches back to back: one product of nbA * M rows
            M2 = nbA * M
            C = gemm(a._buf, b._buf, M2, N, K, B_KN_DIRECT if M2 <= SMALL_M else B_KN_PACKED)
        else:
            ib = _py.broadcast_index(b.shape[:-2], batch)
            C = gemm(a._buf, b._buf, M, N, K, mode, [i * M * K for i in ia], list(ib),
                     [j * K * N for j in range(nbB)])
        return _finish(C, out.dtype)

    def linear(out, x, weight, bias=None):
        # the dtype rule admits float16 and float32 only: both are float32 buffers here
        N, K = weight.shape
        M = prod(x.shape[:-1])
        if M * N == 0 or K == 0:
            return _linear_small(out, M, N, bias)
        C = gemm(x._buf, weight._buf, M, N, K, B_NK_DOT if M <= SMALL_M else B_NK_PACKED,
                 bias=None if bias is None else bias._buf, flags=0 if bias is None else BIAS_COL)
        return _finish(C, out.dtype)

    def _linear_small(out, M, N, bias):
        # no products to take: M * N == 0, or K == 0 (then every output is its bias, or 0)
        if M * N == 0:
            return _zeros(0)
        return _finish(bias._buf * M if bias is not None else _zeros(M * N), out.dtype)

    # ---- conv2d ------------------------------------------------------------------------------

    def conv2d(out, x, weight, bias=None, *, stride, padding, dilation, groups, relu=False):
        """``relu``: max(y, 0) in the store (a conv followed by a relu, fused by ``plan_fuse``;
        NaN and -0.0 pass as ``relu`` passes them, so the bits are the two steps' bits)."""
        if 0 in out.shape or 0 in weight.shape[1:]:
            y = PY["conv2d"](out, x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                             groups=groups)
            return array(y.typecode, [0.0 if v < 0 else v for v in y]) if relu else y
        n, c, h, w = x.shape
        o, cg, kh, kw = weight.shape
        oh, ow = out.shape[2:]
        (pt, _), (pl, _) = padding
        K = cg * kh * kw
        chunk = max(NR, CHUNK_FLOATS // max(K, 1) // NR * NR)
        chunk = min(chunk, -(-oh * ow // NR) * NR)
        # one input channel per group; a single-channel image (c == 1) is faster as one GEMM
        depthwise = groups == c and c > 1 and cg == 1 and kh * kw > 1
        prm = array("i", [n, c, h, w, o, groups, kh, kw, stride[0], stride[1], pt, pl, dilation[0],
                          dilation[1], oh, ow, chunk, (BIAS_ROW if bias is not None else 0) | (RELU if relu else 0)
                          | (0 if CONV_DIRECT else CONV_IM2COL)])
        y = _zeros(n * o * oh * ow)
        # the spans below are exactly what the kernels touch for these sizes
        b = 0 if bias is None else R(bias._buf, o)
        if depthwise:
            call("conv2d_depthwise", R(x._buf, n * c * h * w), R(weight._buf, o * kh * kw), b,
                 W(y, len(y)), R(prm, len(prm)))
        else:
            size = _panels(K, chunk) + _pad_floats(cg, stride, (kh, kw), dilation, (oh, ow), (pt, pl))
            call("conv2d_gemm", R(x._buf, n * c * h * w), R(weight._buf, o * K), b, W(y, len(y)),
                 scratch.span(size), R(prm, len(prm)))
        return _finish(y, out.dtype)

    def conv_transpose2d(out, x, weight, bias=None, *, stride, padding, output_padding, dilation, groups):
        if 0 in out.shape or 0 in x.shape or 0 in weight.shape:
            return PY["conv_transpose2d"](out, x, weight, bias, stride=stride, padding=padding,
                                          output_padding=output_padding, dilation=dilation, groups=groups)
        n, c, h, w = x.shape
        _, og, kh, kw = weight.shape
        o, oh, ow = out.shape[1:]
        (pt, _), (pl, _) = padding
        cg, M = c // groups, og * kh * kw
        chunk = max(NR, CHUNK_FLOATS // M // NR * NR)
        chunk = min(chunk, -(-h * w // NR) * NR)
        prm = array("i", [n, c, h, w, o, groups, kh, kw, stride[0], stride[1], pt, pl, dilation[0],
                          dilation[1], oh, ow, chunk, 0])
        size = groups * M * cg + _panels(cg, chunk) + M * chunk
        y = _zeros(n * o * oh * ow)
        call("conv_transpose2d_gemm", R(x._buf, n * c * h * w), R(weight._buf, c * M),
             0 if bias is None else R(bias._buf, o), W(y, len(y)), scratch.span(size), R(prm, len(prm)))
        return _finish(y, out.dtype)

    # ---- pooling -----------------------------------------------------------------------------

    def _pool_prm(x, out, kernel_size, stride, padding, dilation, include):
        n, c, h, w = x.shape
        (pt, pb), (pl, pr) = padding
        return array("i", [n * c, h, w, kernel_size[0], kernel_size[1], stride[0], stride[1], pt, pl, pb, pr,
                           dilation[0], dilation[1], out.shape[2], out.shape[3], 1 if include else 0])

    def max_pool2d(out, x, *, kernel_size, stride, padding, dilation, ceil_mode):
        if x.dtype not in _FLOAT_TYPES or 0 in out.shape or 0 in x.shape:
            return PY["max_pool2d"](out, x, kernel_size=kernel_size, stride=stride, padding=padding,
                                    dilation=dilation, ceil_mode=ceil_mode)
        prm = _pool_prm(x, out, kernel_size, stride, padding, dilation, False)
        y = _zeros(prod(out.shape))
        call("max_pool2d_f32", R(x._buf, prod(x.shape)), W(y, len(y)), R(prm, len(prm)))
        return y   # float16 stays float16: the max is one of the inputs

    def avg_pool2d(out, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
        if 0 in out.shape or 0 in x.shape:
            return PY["avg_pool2d"](out, x, kernel_size=kernel_size, stride=stride, padding=padding,
                                    ceil_mode=ceil_mode, count_include_pad=count_include_pad)
        prm = _pool_prm(x, out, kernel_size, stride, padding, (1, 1), count_include_pad)
        y = _zeros(prod(out.shape))
        call("avg_pool2d_f32", R(x._buf, prod(x.shape)), W(y, len(y)), R(prm, len(prm)))
        return _finish(y, out.dtype)

    # ---- attention ---------------------------------------------------------------------------

    def sdpa(out, q, k, v, mask=None, *, is_causal, scale):
        ins = (q, k, v) if mask is None else (q, k, v, mask)
        L, E = q.shape[-2:]
        S, Ev = v.shape[-2:]
        if 0 in out.shape or S == 0 or E == 0:
            # empty shapes and the like: the op's decomposition, on this backend's kernels
            from ..registry import OPS
            return OPS["scaled_dot_product_attention"].decompose(*ins, is_causal=is_causal, scale=scale)._buf
        batch = out.shape[:-2]
        nb = prod(batch)
        offs = []   # per batch: q, k, v and mask offsets (broadcast batch dims repeat an offset)
        for t, span in ((q, L * E), (k, S * E), (v, S * Ev)):
            offs += [i * span for i in _py.broadcast_index(t.shape[:-2], batch)]
        mkind = msl = mss = 0
        marg = 0
        if mask is not None:
            ms = (1,) * (len(batch) + 2 - len(mask.shape)) + tuple(mask.shape)
            lm, sm = ms[-2:]
            offs += [i * lm * sm for i in _py.broadcast_index(ms[:-2], batch)]
            mkind = 1 if mask.dtype is _dt.bool_ else 2   # bool bytes, or float32 buffers
            msl, mss = (sm if lm != 1 else 0), (1 if sm != 1 else 0)
            marg = R(mask._buf, prod(ms))
        else:
            offs += [0] * nb
        _need(max(offs[:nb]) + L * E <= len(q._buf) and max(offs[nb:2 * nb]) + S * E <= len(k._buf)
              and max(offs[2 * nb:3 * nb]) + S * Ev <= len(v._buf), "q, k or v")
        prm = array("i", [L, S, E, Ev, nb, mkind, msl, mss, 1 if is_causal else 0, *offs])
        size = L * S + max(_panels(E, S), _panels(S, Ev))
        y = _zeros(nb * L * Ev)
        call("sdpa_f32", R(q._buf, len(q._buf)), R(k._buf, len(k._buf)), R(v._buf, len(v._buf)), marg,
             W(y, len(y)), scratch.span(size), R(prm, len(prm)), float(scale))
        return _finish(y, out.dtype)

    return {"matmul": matmul, "linear": linear, "conv2d": conv2d, "conv_transpose2d": conv_transpose2d,
            "max_pool2d": max_pool2d,
            "avg_pool2d": avg_pool2d, "scaled_dot_product_attention": sdpa}
