"""matmul on webgpu: ten kernel variants, chosen per shape class by ``autotune``.

- ``tiled``: 16x16 shared-memory tiles, one output per thread; any dtype, the reference.
- ``rb32``, ``rb64``, ``rb128``: register-blocked float32 kernels generated from one template
  (``matmul_rb.wgsl``, its body written by ``render_rb``): 32x64, 64x64 and 128x128 output tiles,
  4x4, 4x4 and 8x8 outputs per thread in named vec4 registers, k tiles of 32, 16 and 16 in
  workgroup memory, vec4 global loads where aligned. Small tiles fill the GPU on mid-size
  products (a BERT layer's 512x384x384), large ones reuse more per load.
- ``sk``: split-K ``rb128`` for outputs too small to fill a large GPU (1024^2 gives 64 tiles of
  128^2 for an H200's 132 cores): k is cut into parts whose partial products a second kernel
  (``matmul_splitk.wgsl``) adds up, running the epilogue there.
- ``sg``: subgroup k-split for few rows (M <= 16), where the adapter has ``subgroups``.
- ``mv``: few rows (M <= 16) times a B stored along its columns (``x @ w`` with w (K, N), as
  ONNX MatMul weights are): threads read consecutive vec4s of B's rows, k split across the
  workgroup and summed in workgroup memory (``matmul_mv.wgsl``, body by ``render_mv``); an
  autotune candidate, not a default (see ``MatmulPlan.variant``).
- ``bare``, ``bare2``: the GEMM lab's bare kernel (``matmul_bare.py``: 128x128 tiles, 8x8 outputs a
  thread, k tiles of 16, no bounds checks, strides or batch offsets) for the one case it covers:
  one batch, A (M, K) and B (K, N) row-major and contiguous, their offsets aligned to a binding,
  M and N multiples of 128, K of 16 (``bare2``: split-K in 2 parts plus one reduction dispatch,
  K a multiple of 32, at most ``SPLIT_TARGET / 2`` output tiles). Bias / activation epilogues run
  in its stores (or in the reduction). Autotune candidates where eligible, not defaults;
  ``EMBER_WEBGPU_BARE=0`` takes them out (for A/Bs on a GPU).
- ``rbh``: rb128's tiling with half-precision math (``matmul_rb.wgsl`` with f16 elements, body by
  ``render_rb(half=True)``), for a float16 result of two half-stored operands only (``rt.half``):
  f16 tiles in workgroup memory, vec4<f16> multiply-adds summed in f16 within each k tile of 16,
  those sums added into f32 accumulators after the tile (so the f16 rounding error is a k tile's,
  never K's: ``_close``, ``tests/test_webgpu_f16_math.py``), the epilogue in f32. Packed f16 FMAs
  run at twice the fp32 rate on most GPUs; on lavapipe (f16 emulated on the CPU) it measured
  0.78x rb128 forced on the same half operands (1024^3: 12.6 against 16.1 GFLOP/s, medians of 7
  alternating rounds; ``tests/bench/bench_webgpu.py --f16`` has the rows). Every
  layout rb takes (strides, bounds, batches). An autotune candidate; ``EMBER_WEBGPU_F16_MATH=0``
  takes it out. f16 products past 65504 overflow where the f32 variants do not (autotune's check
  rejects rbh on such inputs; a forced rbh returns inf).

Operands are read through their strides (a transposed weight ``x @ w.T`` is not copied) and
batch axes broadcast through stride 0. float16 runs in f32 and is rounded at the end. Operands
in half storage (``fusion.is_half``) are read as ``f16`` and converted to f32 as they are loaded
(every variant but ``bare``/``bare2``: ``f16_io`` rewrites their bindings and loads), and a
float16 result goes into half storage through the epilogue (``f16(...)`` stores).
"""
from __future__ import annotations

import os
import re
import zlib
from math import prod

from .. import dtypes as _dt
from ..registry import Meta, broadcast_shapes
from . import autotune, fusion, matmul_bare
from .driver import grid_1d
from .fusion import GBuf, realize
from .runtime import env_on, kernel_source, pack_info, render

VARIANTS = ("tiled", "rb32", "rb64", "rb128", "sk", "sg", "mv", "bare", "bare2", "rbh")
# the register-blocked variants: (BM, BN, TM, TN, BK) = output tile, outputs per thread, k tile
# (threads: (BM / TM) * (BN / TN)). H100, `tests/bench/webgpu_gemm_lab.py` (`rb:` rows, PyTorch
# fp32 in the same run): rb128 41.2 TFLOP/s at 4096^3 (torch 51.7); rb32 17.6 us at 512x384x384
# (torch 17.6; rb128 62 us there: 12 workgroups).
RB = {"rb128": (128, 128, 8, 8, 16), "rb64": (64, 64, 4, 4, 16), "rb32": (32, 64, 4, 4, 32)}
# rbh: rb128's tiles with f16 multiply-adds, f16 sums over k tiles of 16 (matmul_rb.wgsl in f16; the error
# bound grows with BK: tests/test_webgpu_f16_math.py)
RBH = (128, 128, 8, 8, 16)
_TILES = {"tiled": (16, 16), "sk": RB["rb128"][:2], **{v: c[:2] for v, c in RB.items()}}   # (sk: split rb128)
# split-K: about this many workgroups (an H200 measured: 256 beat 512 at 1024^2, 0.62x against
# 0.47x of PyTorch), and no part shallower than 64
SPLIT_TARGET = 256
# the bare kernel's variants: split-K parts (H100, webgpu_gemm_lab: 4096^3 46.2 TFLOP/s against
# rb128's 44.1, 2048^3 45.5 against ~43; 1024^3 in 2 parts 38.9 against 34.0 autotuned)
BARE_PARTS = {"bare": 1, "bare2": 2}


def bare_enabled() -> bool:
    """``EMBER_WEBGPU_BARE=0`` (or off/false/no) takes ``bare`` and ``bare2`` out of the candidates."""
    return env_on("EMBER_WEBGPU_BARE")


def f16_math_enabled() -> bool:
    """``EMBER_WEBGPU_F16_MATH=0`` (or off/false/no) takes ``rbh`` (f16 multiply-adds) out of the
    candidates: float16 products then compute in f32 only (for A/Bs)."""
    return env_on("EMBER_WEBGPU_F16_MATH")


def bare_variants(M: int, N: int, K: int, kind: str) -> list:
    """The bare variants a product of this shape may take (the operands' layout aside:
    ``MatmulPlan.bare``): whole 128x128 tiles and k tiles of 16 (times the parts); ``bare2``
    only where the tiles alone leave a large GPU half idle, as ``sk``."""
    BM, BN, _, _, BK = matmul_bare.CONFIG
    if kind != "f32" or not bare_enabled() or M % BM or N % BN or K % BK or K == 0:
        return []
    out = ["bare"]
    if K % (BK * 2) == 0 and K >= 256 and (M // BM) * (N // BN) <= SPLIT_TARGET // 2:
        out.append("bare2")
    return out


def plan_key(kind: str, M: int, N: int, K: int, nb: int = 1, a_row: bool = True, b_row: bool = True,
             bare: int = 0) -> str:
    """The autotune key of a matmul: shape class, operand layouts, divisibility, and the number of
    bare variants among the candidates (only where there are some: other keys are unchanged, and
    a choice made without them is not reused once they are offered, nor one with them under
    ``EMBER_WEBGPU_BARE=0``)."""
    flags = (a_row, b_row, M % 64 == 0, N % 64 == 0, K % 16 == 0) + ((bare,) if bare else ())
    return autotune.shape_key("matmul", kind, (M, N, K, nb), flags)


def eligible(rt, variant: str, M: int, N: int, K: int, kind: str, f16_math: bool = False) -> bool:
    """Whether ``variant`` may compute an M x N x K product of ``kind`` (its operands' layout aside:
    ``MatmulPlan.variant``). ``rbh`` only with ``f16_math``: a float16 product of two half-stored
    operands (``MatmulPlan.rbh_ok``), never a float32 one."""
    if variant == "tiled":
        return True
    if kind != "f32":
        return False
    if variant == "rbh":
        return f16_math and bool(getattr(rt, "half", False)) and f16_math_enabled()
    if variant == "sg":
        return "subgroups" in rt.features and M <= 16
    if variant == "mv":          # (and B's layout: MatmulPlan.mv_ok)
        return M <= 16
    if variant == "sk":
        return K >= 256 and split_k(M, N, K) > 1
    if variant in BARE_PARTS:
        return variant in bare_variants(M, N, K, kind)
    return True


def split_k(M: int, N: int, K: int, nb: int = 1) -> int:
    """Parts of k for ``sk``: about ``SPLIT_TARGET`` workgroups of 128x128 when the output
    tiles alone are at most half that, each part at least 64 deep, at most 8 parts (the
    partial sums then take at most 8 x 128 x 128^2 floats, 64 MiB: within WebGPU's default
    binding limit)."""
    tiles = nb * ((M + 127) // 128) * ((N + 127) // 128)
    if tiles > SPLIT_TARGET // 2:
        return 1
    return max(1, min(8, SPLIT_TARGET // tiles, K // 64))


def default_variant(rt, M, N, K, kind) -> str:
    if kind != "f32":
        return "tiled"
    if M <= 16 and "subgroups" in rt.features:
        return "sg"
    if M >= 128 and N >= 128 and ((M + 127) // 128) * ((N + 127) // 128) >= 128:
        return "rb128"
    if M >= 64 and N >= 64 and ((M + 63) // 64) * ((N + 63) // 64) >= 128:
        return "rb64"
    if M >= 16 and N >= 32:
        return "rb32"
    return "tiled"


def _operand(g: GBuf, rows_axis_last: bool):
    """(view, offset, stride of axis -2, stride of axis -1, batch shape, batch strides)."""
    g = realize(g, wide=False)          # (the kernels read half storage too)
    if any(v < 0 for v in g.strides):   # a flipped view: the kernels index with u32
        g = fusion.contiguous(g, wide=False)
    sh, st = g.shape, g.strides
    if len(sh) == 1:
        # a vector: (1, K) for the left operand, (K, 1) for the right one
        return (g, g.offset, 0, st[0], (), ()) if rows_axis_last else (g, g.offset, st[0], 0, (), ())
    return g, g.offset, st[-2], st[-1], sh[:-2], st[:-2]


def _fold_rows(batch, abst, M: int, a_rs: int):
    """The row stride of A seen as ``prod(batch) * M`` rows, or None where its batch strides do
    not continue its rows evenly (a broadcast or sliced batch axis)."""
    rs = a_rs if M > 1 else None
    want = M * a_rs if M > 1 else None
    for n, st in zip(reversed(batch), reversed(abst)):
        if n == 1:
            continue
        if want is None:            # one row per batch: the innermost batch stride is the row stride
            rs, want = st, st
        if st != want or st <= 0:
            return None
        want = st * n
    return rs if rs is not None else a_rs


def _batch_strides(shape, strides, batch):
    pad = len(batch) - len(shape)
    out = []
    for d in range(len(batch)):
        if d < pad or shape[d - pad] == 1:
            out.append(0)
        else:
            out.append(strides[d - pad])
    return out


def matmul(rt, out: Meta, a, b) -> GBuf:
    """The webgpu kernel of the ``matmul`` op: a lazy tensor holding a ``MatmulPlan``, run at
    the next materialisation point, with the elementwise ops that consume it as its epilogue
    when nothing else needs its plain result (``fusion.lazy_matmul``)."""
    plan = MatmulPlan(rt, a._buf, b._buf, out)
    if plan.size == 0 or plan.K == 0:
        return fusion.const_buf(rt, out.shape, 0, out.dtype)
    g = fusion.lazy_matmul(rt, plan, plan.raw_dtype)
    if plan.raw_dtype is not out.dtype:
        return fusion.record(rt, "_cast", out, [g])
    return g


class MatmulPlan:
    """Everything one matmul dispatch needs, decided when the op is recorded; ``launch`` picks
    the variant (autotune) and dispatches it, optionally with an epilogue."""

    def __init__(self, rt, ga: GBuf, gb: GBuf, out: Meta):
        self.rt = rt
        ga, a_off, a_rs, a_ks, a_bsh, a_bst = _operand(ga, True)
        gb, b_off, b_ks, b_ns, b_bsh, b_bst = _operand(gb, False)
        self.ga, self.gb = ga, gb          # keep the operands alive until the launch
        self.half_a, self.half_b = fusion.is_half(ga), fusion.is_half(gb)
        # rbh (f16 multiply-adds): a float16 result of two half-stored operands only
        self.rbh_ok = bool(self.half_a and self.half_b and out.dtype is _dt.float16 and getattr(rt, "half", False)
                           and f16_math_enabled())
        M = 1 if len(ga.shape) == 1 else ga.shape[-2]
        K = ga.shape[-1]
        N = 1 if len(gb.shape) == 1 else gb.shape[-1]
        batch = broadcast_shapes(a_bsh, b_bsh, op="matmul")
        self.M, self.N, self.K, self.nb = M, N, K, prod(batch)
        self.shape = tuple(out.shape)
        self.size = self.nb * M * N
        self.kind = fusion.wgsl_type(out.dtype)
        self.raw_dtype = {"f32": _dt.float32, "i32": _dt.int32, "u32": _dt.uint8}[self.kind]
        self.epilogue_ok = self.kind == "f32"
        abst = _batch_strides(a_bsh, a_bst, batch)
        bbst = _batch_strides(b_bsh, b_bst, batch)
        rs = _fold_rows(batch, abst, M, a_rs) if batch and not any(bbst) else None
        if rs is not None:
            # one weight for every batch (x @ W of a linear layer on (batch, tokens, k)) and A's
            # row blocks evenly spaced: one product of nb * M rows (bigger tiles, no batch axis)
            M, a_rs, batch, abst, bbst = M * prod(batch), rs, (), [], []
            self.M, self.nb = M, 1
        self.rank = len(batch)
        # the rb kernels load 4 consecutive values as one vec4 where the whole row is 16-byte aligned
        a_vec = a_ks == 1 and all(v % 4 == 0 for v in [a_off, a_rs] + abst)
        b_vec = b_ns == 1 and all(v % 4 == 0 for v in [b_off, b_ks] + bbst)
        # sg reads A and B as vec4s where both run along k (x @ w.T with w row-major), every row
        # start 16-byte aligned and K a multiple of 4
        self.sg_vec4 = a_vec and K % 4 == 0 and b_ks == 1 and all(v % 4 == 0 for v in [b_off, b_ns] + bbst)
        # mv reads B as vec4s along its columns: every row start 16-byte aligned, N a multiple of 4
        self.mv_ok = b_vec and N % 4 == 0 and self.kind == "f32"
        self.words = [M, N, K, self.nb, a_off, a_rs, a_ks, int(a_vec), b_off, b_ks, b_ns, int(b_vec)]
        self.words += list(batch) + abst + bbst
        # the bare kernel: one batch, both operands row-major and contiguous (vec4 rows: K and N
        # are multiples of 16 and 128 there), bound from their offsets (binding-aligned)
        al = max(int(rt.limits["min_storage_buffer_offset_alignment"]) // 4, 4)
        self.bare = bare_variants(M, N, K, self.kind) if (
            self.nb == 1 and a_ks == 1 and a_rs == K and b_ns == 1 and b_ks == N
            and a_off % (al * 2 if self.half_a else al) == 0 and b_off % (al * 2 if self.half_b else al) == 0) else []
        # (operands in half storage: their own autotune keys, "f32:hw" = A half, B 4-byte)
        tkey = self.kind if not (self.half_a or self.half_b) else \
            f"{self.kind}:{'h' if self.half_a else 'w'}{'h' if self.half_b else 'w'}"
        if self.rbh_ok:       # rbh among the candidates: "f32:hhm" (a choice made without it is not reused)
            tkey += "m"
        self.key = plan_key(tkey, M, N, K, self.nb, a_ks == 1, b_ns == 1, len(self.bare))
        # the key of a product with an epilogue (never bare, see variant)
        self.key_epilogue = plan_key(tkey, M, N, K, self.nb, a_ks == 1, b_ns == 1, 0)

    def variant(self, storage, prog=None, epi_words=None) -> str:
        """The variant for this product into ``storage``, with epilogue ``prog`` (a
        ``fusion.Program``, its uniform words ``epi_words``) or None: forced, else autotune's."""
        rt, M, N, K, kind = self.rt, self.M, self.N, self.K, self.kind
        ok = [v for v in VARIANTS if eligible(rt, v, M, N, K, kind, self.rbh_ok) and (v != "mv" or self.mv_ok)
              and (v not in BARE_PARTS or v in self.bare)]
        v = autotune.forced("matmul")
        if v in ok:
            return v
        key = self.key
        timed_prog = None
        if prog is not None:
            # A product with an epilogue is timed WITH it, under a key of its own (the shape
            # class and the epilogue's structure): an epilogue changes the variants' order. H100,
            # BERT 32x128's FFN up (4096x1536x384 + bias + GELU): rb128 144 us without it (the
            # GEMM lab), 230 us with it, rb64 139 / 172; bare's epilogue form 62 us where rb64
            # takes ~45 (4096x384x384 + bias), so bare is a candidate again only because its
            # epilogue is timed. (An epilogue that reads the output's own buffer cannot run
            # twice: those products are timed without it and keep off bare, as before.)
            if any(g.storage is storage for g in prog.leaves):
                ok = [v for v in ok if v not in BARE_PARTS]
                key = self.key_epilogue
            else:
                key = f"{self.key}|e{zlib.crc32(repr(prog.sig).encode()):08x}"
                timed_prog = prog
        # a product of 1-4 rows reads each weight once: sg does that at the memory's speed where
        # B runs along k (H100, x @ w.T at 4096^2: 95% of HBM), and timing variants of a ~20 us
        # kernel against the host's sync is noise (autotune once picked a 10x slower one).
        # mv (B along its columns) is only a candidate of autotune for now: its first form ran
        # slower than sg on an H100 (BERT 1x16), the present one is not yet measured on a GPU,
        # and on CPU adapters (lavapipe) its barriers make it slower than sg at one row (1.9 vs
        # 1.0 ms at 1x384x384) though faster at 16 (9.0 vs 10.5 ms)
        if M <= 4 and "sg" in ok:
            return "sg"
        cands = {v: (lambda v=v: self._dispatch(v, storage, timed_prog, epi_words if timed_prog else None))
                 for v in ok}
        # a float16 product's candidates agree within f16 sums over a k tile (rbh), not f32 ones
        half = self.rbh_ok and "rbh" in ok
        return autotune.choose(rt, key, cands, default_variant(rt, M, N, K, kind),
                               lambda: _read(rt, storage, self.size), lambda x, y: _close(x, y, half))

    def needs_chunks(self) -> bool:
        """Whether the output or an operand's buffer passes one binding (``rt.max_binding``)."""
        mb = self.rt.max_binding
        return self.size * 4 > mb or self.ga.storage.nbytes > mb or self.gb.storage.nbytes > mb

    def launch(self, storage, prog, epi_words) -> None:
        """Dispatch into ``storage``; ``prog`` (a ``fusion.Program``) is the epilogue or None."""
        if self.needs_chunks():
            if prog is not None:   # fusion never builds one for a chunked matmul
                raise AssertionError("a chunked matmul takes no epilogue")
            self._launch_rows(storage)
            return
        self._dispatch(self.variant(storage, prog, epi_words), storage, prog, epi_words)

    def _launch_rows(self, storage) -> None:
        """The matmul in blocks, for outputs or operands larger than one binding: one batch at a
        time, by blocks of output rows, each block binding its rows of A and C and B's window;
        a right operand over one binding by blocks of columns too, each into a temporary that is
        then copied into its columns of C. Binding offsets are aligned to
        ``minStorageBufferOffsetAlignment``, the remainders go into the offset words. No
        autotune here: the default variant (split-K would need its own large buffer)."""
        rt, M, N, K, nb = self.rt, self.M, self.N, self.K, self.nb
        mb = rt.max_binding
        shape = self.shape
        A_el = max(int(rt.limits["min_storage_buffer_offset_alignment"]) // 4, 4)
        w = list(self.words)
        a_off, b_off, b_ks, b_ns = w[4], w[8], w[9], w[10]
        rank = self.rank
        batch, abst, bbst = w[12:12 + rank], w[12 + rank:12 + 2 * rank], w[12 + 2 * rank:12 + 3 * rank]
        if nb > 1 and (M * N) % A_el:
            raise rt.limit_error(max(self.size * 4, self.ga.storage.nbytes, self.gb.storage.nbytes),
                                 f"a batched matmul runs by row blocks only when each {M}x{N} output "
                                 f"starts at a {A_el * 4}-byte boundary", op="matmul", shape=shape)
        w[3] = 1
        w[12:12 + rank] = [1] * rank     # one batch per dispatch: its offsets go into the words
        cap = mb // 4 - A_el - 4         # elements of a window, alignment slack and rounding kept
        for z in range(nb):
            az, bz, rem = a_off, b_off, z
            for d in range(rank - 1, -1, -1):
                idx = rem % batch[d]
                rem //= batch[d]
                az += idx * abst[d]
                bz += idx * bbst[d]
            c0 = z * M * N
            if (K - 1) * b_ks + (N - 1) * b_ns < cap:
                self._row_blocks(storage, c0, az, bz, N, w, A_el)
                continue
            cols = (cap - 1 - (K - 1) * b_ks) // b_ns + 1 if b_ns > 0 else 0
            if cols < 1:
                raise rt.limit_error(((K - 1) * b_ks + 1) * 4, "one column of the right operand is larger "
                                     "than a binding", op="matmul", shape=shape)
            # a power of two (or a multiple of the alignment) keeps the row blocks of C aligned
            cols = cols // A_el * A_el if cols >= A_el else 1 << (cols.bit_length() - 1)
            from .fusion import run_into

            for n0 in range(0, N, cols):
                nc = min(N, n0 + cols) - n0
                tmp = rt.alloc(M * nc * 4, "matmul column block")
                self._row_blocks(tmp, 0, az, bz + n0 * b_ns, nc, w, A_el)
                run_into(rt, GBuf(rt, (M, nc), self.raw_dtype, storage=tmp), storage, c0 + n0, (N, 1))

    def _row_blocks(self, storage, c0, az, bz, Nc, w, A_el) -> None:
        """Rows of one batch's output, ``Nc`` columns wide from C element ``c0`` (aligned), in
        blocks that fit a binding; B's columns start at element ``bz``."""
        rt, M, K = self.rt, self.M, self.K
        a_rs, a_ks, b_ks, b_ns = w[5], w[6], w[9], w[10]
        cap = rt.max_binding // 4 - A_el - 4

        def window(g, lo, hi):             # (byte offset, byte size, element remainder)
            base, size = fusion.binding_window(g.storage, lo, hi, A_el * 4)
            return base * fusion.elem_bytes(g.storage), size, lo - base

        bw = window(self.gb, bz, bz + (K - 1) * b_ks + (Nc - 1) * b_ns)
        # rows per block: C's block start ((c0 + r0 * Nc) elements) must stay aligned
        from math import gcd

        step = A_el // gcd(Nc, A_el)
        rows = min(M, cap // max(Nc, 1), (cap - (K - 1) * a_ks) // max(a_rs, 1) + 1)
        rows = rows // step * step if rows < M else M
        if rows < 1:
            raise rt.limit_error(max(Nc, K) * 4, "one row of the output or of A is larger than a binding",
                                 op="matmul", shape=self.shape)
        variant = default_variant(rt, rows, Nc, K, self.kind)
        variant = "rb128" if variant == "sk" else variant
        r0 = 0
        while r0 < M:
            r1 = min(M, r0 + rows)
            aw = window(self.ga, az + r0 * a_rs, az + (r1 - 1) * a_rs + (K - 1) * a_ks)
            words = list(w)
            words[0] = r1 - r0
            words[1] = Nc
            words[4] = aw[2]
            words[8] = bw[2]
            if words[7] and aw[2] % 4:
                words[7] = 0
            if words[11] and bw[2] % 4:
                words[11] = 0
            out = (storage.buf, (c0 + r0 * Nc) * 4, max(4, (r1 - r0) * Nc * 4))
            ops = [(self.ga.storage.buf, aw[0], aw[1]), (self.gb.storage.buf, bw[0], bw[1])]
            self._dispatch(variant, None, None, None, out=out, ops=ops, words=words, M=r1 - r0, nb=1, N=Nc)
            r0 = r1

    def _dispatch(self, variant, storage, prog, epi_words, out=None, ops=None, words=None, M=None, nb=None,
                  N=None) -> None:
        rt = self.rt
        if variant in BARE_PARTS:      # (never for row blocks: _row_blocks takes default variants)
            self._dispatch_bare(BARE_PARTS[variant], storage, prog, epi_words)
            return
        out_half = storage is not None and storage.half
        if out is None:
            out = (storage.buf, 0, max(4, fusion.storage_bytes(self.size, out_half)))
            ops = [(self.ga.storage.buf, 0, self.ga.storage.nbytes), (self.gb.storage.buf, 0, self.gb.storage.nbytes)]
        M = self.M if M is None else M
        N = self.N if N is None else N
        nb = self.nb if nb is None else nb
        split = split_k(M, N, self.K, nb) if variant == "sk" else 1
        if split > 1:
            # pass 1 writes split planes of partial sums, pass 2 adds them and runs the epilogue
            part = rt.alloc(split * self.size * 4, "split-K partial sums")
            pbuf = (part.buf, 0, split * self.size * 4)
            self._record("rb128", [pbuf] + ops + ops, None, None, split, ((N + 127) // 128, (M + 127) // 128, nb * split))
            n_groups = (self.size + 255) // 256
            self._record("splitk", [out, pbuf], prog, epi_words, split, grid_1d(n_groups, rt.max_groups),
                         out_half=out_half)
            return
        bufs = [out] + ops
        if variant in RB or variant in ("sk", "rbh") or (variant == "sg" and self.sg_vec4 and words is None):
            bufs += ops   # A and B again, read as vec4 (A4, B4)
        if variant == "sg":
            grid = ((N + 7) // 8, M, nb)
        elif variant == "mv":
            cols = 4 * mv_columns(M, N, self.K, nb)
            grid = ((N + cols - 1) // cols, (M + MV_ROWS - 1) // MV_ROWS, nb)
        else:
            tm, tn = RBH[:2] if variant == "rbh" else _TILES[variant]
            grid = ((N + tn - 1) // tn, (M + tm - 1) // tm, nb)
        self._record("rb128" if variant == "sk" else variant, bufs, prog, epi_words, 1, grid, words, out_half)

    def _dispatch_bare(self, parts: int, storage, prog, epi_words) -> None:
        """The bare kernel over whole tiles: C (vec4s), A and B bound from their offsets, the
        sizes (M, N, K, k per part) as the uniform. In parts: planes of partial sums, then
        ``render_reduce``'s kernel adds them (and runs the epilogue)."""
        rt, M, N, K, size = self.rt, self.M, self.N, self.K, self.size
        BM, BN = matmul_bare.CONFIG[:2]
        sa, sb, a_off, b_off = self.ga.storage, self.gb.storage, self.words[4], self.words[8]
        ea, eb = fusion.elem_bytes(sa), fusion.elem_bytes(sb)
        ops = [(sa.buf, a_off * ea, sa.nbytes - a_off * ea), (sb.buf, b_off * eb, sb.nbytes - b_off * eb)]
        oh = storage.half
        out = (storage.buf, 0, fusion.storage_bytes(size, oh))
        grid = (N // BN, M // BM, parts)
        dims = [M, N, K, K // parts]
        if parts == 1:
            self._record_bare("matmul_bare", [out] + ops, dims, prog, epi_words, grid, oh)
            return
        part = rt.alloc(parts * size * 4, "split-K partial sums")
        pbuf = (part.buf, 0, parts * size * 4)
        self._record_bare("matmul_bare", [pbuf] + ops, dims, None, None, grid)
        self._record_bare("matmul_bare_reduce", [out, pbuf], [size // 4, parts, 0, 0], prog, epi_words,
                          grid_1d((size // 4 + 255) // 256, rt.max_groups), oh)

    def _record_bare(self, name: str, bufs, words, prog, epi_words, grid, out_half=False) -> None:
        """One dispatch of ``matmul_bare`` or its reduction; an epilogue's inputs are bound after
        ``bufs``, its words follow ``words`` (4 of them), the uniform comes last. Half operands
        and a half output as in ``f16_io``."""
        rt = self.rt
        ha, hb = (self.half_a, self.half_b) if name == "matmul_bare" else (False, False)
        sig, base, first = None, len(words), len(bufs)
        if prog is not None:
            words = words + list(epi_words)
            bufs = bufs + [(g.storage.buf, 0, g.storage.nbytes) for g in prog.leaves]
            sig = (prog.sig, base, len(prog.shape))
        info_n = (len(words) + 3) // 4

        def source():   # WGSL generated on a pipeline-cache miss only
            epi = None if prog is None else fusion.epilogue_source(prog, base, first)[0]
            if name == "matmul_bare":
                src = matmul_bare.render_bare(*matmul_bare.CONFIG, epilogue=epi, info=info_n, info_binding=len(bufs))
                return f16_io(src, ha, hb, out_half)
            return f16_io(matmul_bare.render_reduce(epi, info_n, len(bufs)), False, False, out_half, out="O")
        pipe = rt.pipeline((name, matmul_bare.CONFIG, info_n, len(bufs), sig, ha, hb, out_half), source)
        rt.dispatch(pipe, bufs, pack_info(words, info_n * 4), grid)

    def _record(self, variant, bufs, prog, epi_words, split, grid, words=None, out_half=False) -> None:
        rt = self.rt
        # operands in half storage (not the split-K sum pass, which reads the partial sums only)
        # (rbh: its template reads f16 itself)
        ha, hb = (False, False) if variant in ("splitk", "rbh") else (self.half_a, self.half_b)
        v4 = variant == "sg" and self.sg_vec4 and words is None     # (not for chunked calls)
        words = list(self.words if words is None else words)
        sig = None
        if prog is not None:
            base, first = len(words), len(bufs)
            words += epi_words
            bufs = bufs + [(g.storage.buf, 0, g.storage.nbytes) for g in prog.leaves]
            sig = (prog.sig, base, len(prog.shape))

            def epilogue():   # WGSL generated on a pipeline-cache miss only
                return fusion.epilogue_source(prog, base, first)[0]
        else:
            T = self.kind if variant == "tiled" else "f32"

            def epilogue():
                return f"fn epilogue(acc: {T}, i: u32) -> {T} {{ return acc; }}"
        info_n = max(4, (len(words) + 3) // 4)
        params = {"RANK": self.rank, "INFO": info_n, "INFO_BINDING": len(bufs)}
        if variant == "tiled":
            params["T"] = self.kind
        if variant == "sg":
            params["WG"] = 256
            if v4:
                params["V4DECL"] = ("@group(0) @binding(3) var<storage, read> A4: array<vec4<f32>>;\n"
                                    "@group(0) @binding(4) var<storage, read> B4: array<vec4<f32>>;\n"
                                    "fn a4(i: u32) -> vec4<f32> { return A4[i]; }\n"
                                    "fn b4(i: u32) -> vec4<f32> { return B4[i]; }")
            else:
                params["V4DECL"] = ("fn a4(i: u32) -> vec4<f32> { return vec4<f32>(0.0); }\n"
                                    "fn b4(i: u32) -> vec4<f32> { return vec4<f32>(0.0); }")
            params["V4"] = "true" if v4 else "false"
        if variant in RB or variant in ("splitk", "rbh"):
            params["SPLIT"] = split
        if variant in RB:
            params.update(rb_layout(RB[variant], words))
        if variant == "rbh":
            params.update(rb_layout(RBH, words), CONFIG="x".join(map(str, RBH)))
        if variant == "mv":
            params.update(MR=min(MV_ROWS, words[0]), CW=mv_columns(words[0], words[1], words[2], self.nb))
        name = f"matmul_{variant}"
        key = (name, tuple(sorted(params.items())), sig, ha, hb, out_half)

        def source():
            full = {**params, "EPILOGUE": epilogue()}
            if variant in RB or variant == "rbh":
                src = render_rb(RBH if variant == "rbh" else RB[variant], full, variant == "rbh")
            else:
                src = render_mv(full) if variant == "mv" else render(kernel_source(name), full)
            return f16_io(src, ha, hb, out_half)
        pipe = rt.pipeline(key, source)
        rt.dispatch(pipe, bufs, pack_info(words, info_n * 4), grid)


def f16_io(src: str, half_a: bool, half_b: bool, half_c: bool, out: str = "C") -> str:
    """A matmul kernel's WGSL with operand A / B bound as ``f16`` (half storage) and converted
    to f32 where loaded (``A[i]`` -> ``f32(A[i])``, ``A4[i]`` -> ``vec4<f32>(A4[i])``; the
    bindings may be scalars or vec4s), and the output (``out``) as ``f16`` written through
    ``f16(...)`` (``vec4<f16>(...)`` where it is vec4s). The kernels keep computing in f32; only
    the storage differs. ValueError where a binding is not there to rewrite."""
    for name, on in (("A", half_a), ("B", half_b)):
        if not on:
            continue
        found = False
        for n in (name, name + "4"):
            for t in ("f32", "vec4<f32>"):
                decl = f"var<storage, read> {n}: array<{t}>;"
                if decl in src:
                    found = True
                    src = src.replace(decl, decl.replace("f32", "f16"))
                    src = re.sub(rf"\b{n}\[([^\[\]]*)\]", rf"{t}({n}[\1])", src)
        if not found:
            raise ValueError(f"matmul kernel: no {name} binding to read as f16")
    if half_c:
        for t in ("f32", "vec4<f32>"):
            decl = f"var<storage, read_write> {out}: array<{t}>;"
            if decl in src:
                src = src.replace(decl, decl.replace("f32", "f16"))
                return re.sub(rf"\b{out}\[([^\[\]\n]*)\] = ([^;\n]*);", rf"{out}[\1] = {t.replace('f32', 'f16')}(\2);", src)
        raise ValueError(f"matmul kernel: no {out} binding to write as f16")
    return src


def rb_layout(config: tuple, words) -> dict:
    """The template constants of ``matmul_rb`` that the info ``words`` decide: each operand's
    contiguous axis and vec4 alignment, and FULL (M, N whole tiles, K whole k tiles: no bounds
    checks). Compile-time, so a pipeline has no branch on them."""
    BM, BN, _, _, BK = config
    M, N, K = words[0], words[1], words[2]
    return {"AROW": str(words[6] == 1).lower(), "AVEC": str(words[7] == 1).lower(),
            "BROW": str(words[10] == 1).lower(), "BVEC": str(words[11] == 1).lower(),
            "FULL": str(M % BM == 0 and N % BN == 0 and K % BK == 0).lower(),
            "CVEC": str(N % 4 == 0).lower()}


def _rb_loads(config: tuple, T: int, arow: bool, brow: bool) -> tuple:
    """The global loads of one k tile for thread t of ``matmul_rb``: (setup, fetch, put) WGSL.
    setup runs once before the k loop and fixes each of the thread's vec4 loads: its element
    offset at k = 0 (pa/pb), the row or column and k it stands for (bounds), and where it goes in
    workgroup memory; fetch (with ``{k}`` = the tile's first k) adds k to the offsets and loads
    into registers ga/gb; put stores them into the tiles As[k][row / 4] and Bs[k][column / 4].
    A along k (``arow``) puts one row's 4 k as scalars into 4 rows of As, else 4 rows at one k
    as a vec4; B the other way round."""
    BM, BN, _, _, BK = config
    setup, fetch, put = [], [], []
    for i in range(BM * BK // 4 // T):
        e = f"(t + {i * T}u)"
        if arow:     # vec4 e = 4 k of row e / (BK / 4)
            setup.append(f"let sa{i} = {e} / {BK // 4}u; let ka{i} = ({e} % {BK // 4}u) * 4u; "
                         f"let ra{i} = row0 + sa{i}; let pa{i} = offs.x + ra{i} * u(5u) + ka{i};")
            fetch.append(f"ga{i} = load_a4(pa{i} + {{k}}, ra{i}, {{k}} + ka{i}, M, K);")
            put.append(" ".join(f"As[ka{i} + {q}u][sa{i} >> 2u][sa{i} & 3u] = ga{i}.{'xyzw'[q]};" for q in range(4)))
        else:        # vec4 e = rows 4 (e % (BM / 4)).. at k e / (BM / 4)
            setup.append(f"let sa{i} = {e} % {BM // 4}u; let ka{i} = {e} / {BM // 4}u; "
                         f"let ra{i} = row0 + sa{i} * 4u; let pa{i} = offs.x + ra{i} * u(5u) + ka{i} * u(6u);")
            fetch.append(f"ga{i} = load_a_rows(pa{i} + ({{k}}) * u(6u), ra{i}, {{k}} + ka{i}, M, K);")
            put.append(f"As[ka{i}][sa{i}] = ga{i};")
    for i in range(BK * BN // 4 // T):
        e = f"(t + {i * T}u)"
        if brow:     # vec4 e = columns 4 (e % (BN / 4)).. at k e / (BN / 4)
            setup.append(f"let sb{i} = {e} % {BN // 4}u; let kb{i} = {e} / {BN // 4}u; "
                         f"let cl{i} = col0 + sb{i} * 4u; let pb{i} = offs.y + kb{i} * u(9u) + cl{i};")
            fetch.append(f"gb{i} = load_b4(pb{i} + ({{k}}) * u(9u), cl{i}, {{k}} + kb{i}, N, K);")
            put.append(f"Bs[kb{i}][sb{i}] = gb{i};")
        else:        # vec4 e = 4 k of column e / (BK / 4)
            setup.append(f"let sb{i} = {e} / {BK // 4}u; let kb{i} = ({e} % {BK // 4}u) * 4u; "
                         f"let cl{i} = col0 + sb{i}; let pb{i} = offs.y + kb{i} * u(9u) + cl{i} * u(10u);")
            fetch.append(f"gb{i} = load_b_ks(pb{i} + ({{k}}) * u(9u), cl{i}, {{k}} + kb{i}, N, K);")
            put.append(" ".join(f"Bs[kb{i} + {q}u][sb{i} >> 2u][sb{i} & 3u] = gb{i}.{'xyzw'[q]};" for q in range(4)))
    return setup, " ".join(fetch), " ".join(put)


def mv_columns(M: int, N: int, K: int, nb: int = 1) -> int:
    """vec4 columns per workgroup of ``mv``: fewer (more threads on each column's k) as k grows,
    and fewer still until the product has about 128 workgroups (an H100 has 132 cores; a BERT
    layer's 16x384x384 as 12 workgroups of 8 columns took 26 us)."""
    cw = 16 if K <= 256 else 8 if K <= 1024 else 4
    groups = nb * ((M + MV_ROWS - 1) // MV_ROWS)
    while cw > 1 and groups * ((N + 4 * cw - 1) // (4 * cw)) < 128:
        cw //= 2
    return cw


MV_ROWS = 4     # output rows per mv workgroup (row groups are workgroup y)


def render_mv(params: dict) -> str:
    """``matmul_mv.wgsl`` with main's body written in for ``params["MR"]`` rows (up to
    ``MV_ROWS``, from row0 = workgroup y * MV_ROWS): named accumulators, the k loop four rows of
    B at a time, the tree sums of the k groups."""
    MR, KG = params["MR"], 256 // params["CW"]
    acc = [f"acc{m}" for m in range(MR)]

    def step(n):         # n rows of B at k, k + KG, ...; each accumulator adds them in k order
        loads = " ".join(f"let w{i} = B4[b0 + (k + {i * KG}u) * bs];" for i in range(n))
        sums = [f"{a} = {a}" + "".join(f" + A[ak + r{m} * rs + {i * KG}u * ks] * w{i}" for i in range(n)) + ";"
                for m, a in enumerate(acc)]
        return [f"      {loads} let ak = offs.x + k * ks;"] + ["      " + x for x in sums]

    body = ["  " + " ".join(f"var {a} = vec4<f32>();" for a in acc),
            # this workgroup's rows (a last group past M reads row M - 1 again and stores nothing)
            "  " + " ".join(f"let r{m} = min(row0 + {m}u, M - 1u);" for m in range(MR)),
            "  if (on) {", "    var k = kg;",
            f"    for (; k + {3 * KG}u < K; k = k + {4 * KG}u) {{", *step(4), "    }",
            f"    for (; k < K; k = k + {KG}u) {{", *step(1), "    }", "  }"]
    for g in range(0, MR, 4):
        rows = range(g, min(MR, g + 4))
        body.append("  " + " ".join(f"red[{j * 256}u + t] = acc{m};" for j, m in enumerate(rows)) + " workgroupBarrier();")
        s = KG // 2
        while s >= 1:
            adds = " ".join(f"red[{j * 256}u + t] = red[{j * 256}u + t] + red[{j * 256 + s * params['CW']}u + t];"
                            for j in range(len(rows)))
            body.append(f"  if (kg < {s}u) {{ {adds} }} workgroupBarrier();")
            s //= 2
        stores = " ".join(f"if (row0 + {m}u < M) {{ let v = red[{j * 256}u + t]; let at = wg.z * M * N + (row0 + {m}u) * N + col; "
                          "C[at] = epilogue(v.x, at); C[at + 1u] = epilogue(v.y, at + 1u); "
                          "C[at + 2u] = epilogue(v.z, at + 2u); C[at + 3u] = epilogue(v.w, at + 3u); }"
                          for j, m in enumerate(rows))
        body.append(f"  if (kg == 0u && on) {{ {stores} }}")
    return render(kernel_source("matmul_mv"), dict(params, ROWS=MV_ROWS, BODY="\n".join(body)))


def render_rb(config: tuple, params: dict, half: bool = False) -> str:
    """``matmul_rb.wgsl`` for ``config`` (BM, BN, TM, TN, BK: a value of ``RB``) with main's body
    written in: named accumulators, the k tile's steps fully unrolled (Naga keeps loops as loops;
    unrolled, every shared-memory row index is a constant), the stores (bounds-checked unless
    FULL). ``half``: ``rbh`` (``RBH``; ``matmul_rb.wgsl`` with f16 elements): f16 loads and tiles, each k tile's products
    summed in f16 registers (``h`` = the first product, then ``h + a * b``), which are added into
    the f32 accumulators after the tile."""
    BM, BN, TM, TN, BK = config
    H = "f16" if half else "f32"
    TX, TY = BN // TN, BM // TM
    T = TX * TY
    LA, LB = BM * BK // 4 // T, BK * BN // 4 // T
    acc = [f"c{r}_{j}" for r in range(TM) for j in range(TN // 4)]
    setup, fetch, put = _rb_loads(config, T, params["AROW"] == "true", params["BROW"] == "true")
    body = [f"  let tx = t % {TX}u; let ty = t / {TX}u;",
            "  _ = &A; _ = &B; _ = &A4; _ = &B4;   // bound in every layout, whether or not its loads use them",
            "  " + " ".join(f"var {c} = vec4<f32>();" for c in acc),
            "  " + " ".join([f"var ga{i}: vec4<{H}>;" for i in range(LA)] + [f"var gb{i}: vec4<{H}>;" for i in range(LB)]),
            *("  " + line for line in setup),
            "  " + fetch.format(k="kbeg"), "  " + put, "  workgroupBarrier();",
            f"  for (var k0 = kbeg; k0 < kend; k0 = k0 + {BK}u) {{",
            f"    let more = k0 + {BK}u < kend;",
            "    if (more) { " + fetch.format(k=f"k0 + {BK}u") + " }"]
    if half:      # this tile's f16 partial sums (the first step assigns them)
        body.append("    " + " ".join(f"var h{r}_{j}: vec4<f16>;" for r in range(TM) for j in range(TN // 4)))
    for k in range(BK):      # one k step: TM / 4 + TN / 4 vector loads, TM * TN FMAs
        loads = [f"let a{i} = As[{k}][ty + {i * TY}u];" for i in range(TM // 4)]
        loads += [f"let b{j} = Bs[{k}][tx + {j * TX}u];" for j in range(TN // 4)]
        body.append("    { " + " ".join(loads))
        for r in range(TM):
            # c + a * b, not fma(): measured faster on an H200 (the driver fuses it anyway)
            a = f"a{r // 4}.{'xyzw'[r % 4]}"
            if not half:
                body.append("      " + " ".join(f"c{r}_{j} = c{r}_{j} + {a} * b{j};" for j in range(TN // 4)))
            elif k == 0:
                body.append("      " + " ".join(f"h{r}_{j} = {a} * b{j};" for j in range(TN // 4)))
            else:
                body.append("      " + " ".join(f"h{r}_{j} = h{r}_{j} + {a} * b{j};" for j in range(TN // 4)))
        body.append("    }")
    if half:      # the tile's sums into the f32 accumulators
        body += ["    " + " ".join(f"c{r}_{j} = c{r}_{j} + vec4<f32>(h{r}_{j});" for j in range(TN // 4))
                 for r in range(TM)]
    body += ["    workgroupBarrier();", "    if (more) { " + put + " }", "    workgroupBarrier();", "  }",
             "  let cb = wg.z * M * N;"]
    for i in range(TM // 4):
        for q in range(4):
            r = i * 4 + q
            stores = " ".join(f"store4(cb + row * N, col0 + (tx + {j * TX}u) * 4u, N, c{r}_{j});" for j in range(TN // 4))
            body.append(f"  {{ let row = row0 + (ty + {i * TY}u) * 4u + {q}u; if (FULL || row < M) {{ {stores} }} }}")
    full = dict(params, BM=BM, BN=BN, BK=BK, BM4=BM // 4, BN4=BN // 4, T=T, BODY="\n".join(body),
                **_rb_edges(params))
    return render(kernel_source("matmul_rb"), dict(full, ET=H))


def _rb_edges(params: dict) -> dict:
    """C's element type and store4 of ``matmul_rb``. Where N % 4 == 0 (CVEC) every group of 4
    columns a thread stores is in range or not as a whole (columns start at multiples of 4), so
    C is bound as vec4s and written with one vec4 store (the epilogue still sees each element and
    its flat index). ``EMBER_WEBGPU_RB_PLAIN=1`` (or params["PLAIN"]: the GEMM lab) keeps the
    scalar stores (the previous kernel, for GPU A/Bs)."""
    if params.get("CVEC") == "true" and not params.get("PLAIN", bool(os.environ.get("EMBER_WEBGPU_RB_PLAIN"))):
        return {"CT": "vec4<f32>",
                "STORE4": "  let i = base + col;\n"
                          "  if (FULL || col < N) { C[i / 4u] = vec4<f32>(epilogue(v.x, i), epilogue(v.y, i + 1u), "
                          "epilogue(v.z, i + 2u), epilogue(v.w, i + 3u)); }"}
    return {"CT": "f32",
            "STORE4": "  let i = base + col;\n"
                      "  if (FULL || col < N) { C[i] = epilogue(v.x, i); }\n"
                      "  if (FULL || col + 1u < N) { C[i + 1u] = epilogue(v.y, i + 1u); }\n"
                      "  if (FULL || col + 2u < N) { C[i + 2u] = epilogue(v.z, i + 2u); }\n"
                      "  if (FULL || col + 3u < N) { C[i + 3u] = epilogue(v.w, i + 3u); }"}


def _read(rt, storage, n):
    from array import array

    if storage.half:
        import struct

        return struct.unpack(f"<{n}e", rt.read(storage, fusion.storage_bytes(n, True))[:2 * n])
    raw = rt.read(storage, n * 4)
    a = array("f")
    a.frombytes(raw)
    return a


def _close(x, y, half: bool = False) -> bool:
    """Same values up to f32 summation-order differences (a strided sample of at most 64k;
    non-finite reference values are skipped): each within 1e-3 of the largest reference value.

    ``half`` (a float16 product with ``rbh`` among the candidates): up to f16 sums over ``RBH``'s
    k tile of BK. There a value's error is about 2^-11 * sqrt(BK) of the result's typical size
    (each tile's f16 sum, itself ~sqrt(BK) products, has a rounding error of about 2^-11 of it;
    the K / BK tiles' errors add up at random, as the tiles' values do), and a worst case of
    (BK + 1) * 2^-11 of sum |a||b|. So the root mean square of the differences must be within
    2 * sqrt(BK) * 2^-11 of the reference's (BK 16: 0.39%), and each difference within 16 *
    sqrt(BK) * 2^-11 of the largest reference value (3.1%): a kernel that drops one k tile of 16
    out of 4096 is off by ~6% in rms, a wrong index by ~100%. An inf or NaN where the reference
    is finite (an f16 overflow) fails both."""
    if len(x) != len(y):
        return False
    step = max(1, len(y) // 65536)
    pairs = [(p, q) for p, q in zip(x[::step], y[::step]) if q - q == 0]
    scale = max((abs(q) for _, q in pairs), default=0.0) or 1.0
    if not half:
        return all(abs(p - q) <= 1e-3 * scale for p, q in pairs)
    r = 2.0 ** -11 * RBH[4] ** 0.5
    if not all(abs(p - q) <= 16 * r * scale for p, q in pairs):
        return False
    n = max(1, len(pairs))
    err2 = sum((p - q) ** 2 for p, q in pairs) / n
    ref2 = sum(q * q for _, q in pairs) / n
    return err2 <= (2 * r) ** 2 * ref2
