"""matmul on webgpu: four kernel variants, chosen per shape class by ``autotune``.

- ``tiled``: 16x16 shared-memory tiles, one output per thread; any dtype, the reference.
- ``rb64``: 64x64 tiles, 4x4 outputs per thread in named vec4 registers (float32).
- ``rb128``: 128x128 tiles, 8x8 outputs per thread in 16 named vec4 registers, vec4 global loads
  where aligned (float32).
- ``sg``: subgroup k-split for few rows (M <= 16), where the adapter has ``subgroups``.

Operands are read through their strides (a transposed weight ``x @ w.T`` is not copied) and
batch axes broadcast through stride 0. float16 runs in f32 and is rounded at the end.
"""
from __future__ import annotations

from math import prod

from .. import dtypes as _dt
from ..registry import Meta, broadcast_shapes
from . import autotune, fusion
from .fusion import GBuf, realize
from .runtime import pack_info

VARIANTS = ("tiled", "rb64", "rb128", "sg")
_TILES = {"tiled": (16, 16), "rb64": (64, 64), "rb128": (128, 128)}


def eligible(rt, variant: str, M: int, N: int, K: int, kind: str) -> bool:
    if variant == "tiled":
        return True
    if kind != "f32":
        return False
    if variant == "sg":
        return "subgroups" in rt.features and M <= 16
    return True


def default_variant(rt, M, N, K, kind) -> str:
    if kind != "f32":
        return "tiled"
    if M <= 16 and "subgroups" in rt.features:
        return "sg"
    if M >= 128 and N >= 128:
        return "rb128"
    if M >= 32 and N >= 32:
        return "rb64"
    return "tiled"


def _operand(g: GBuf, rows_axis_last: bool):
    """(view, offset, stride of axis -2, stride of axis -1, batch shape, batch strides)."""
    realize(g)
    if any(v < 0 for v in g.strides):   # a flipped view: the kernels index with u32
        g = fusion.contiguous(g)
    sh, st = g.shape, g.strides
    if len(sh) == 1:
        # a vector: (1, K) for the left operand, (K, 1) for the right one
        return (g, g.offset, 0, st[0], (), ()) if rows_axis_last else (g, g.offset, st[0], 0, (), ())
    return g, g.offset, st[-2], st[-1], sh[:-2], st[:-2]


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
    ga, gb = a._buf, b._buf
    ga, a_off, a_rs, a_ks, a_bsh, a_bst = _operand(ga, True)
    gb, b_off, b_ks, b_ns, b_bsh, b_bst = _operand(gb, False)
    M = 1 if ga.shape.__len__() == 1 else ga.shape[-2]
    K = ga.shape[-1]
    N = 1 if len(gb.shape) == 1 else gb.shape[-1]
    batch = broadcast_shapes(a_bsh, b_bsh, op="matmul")
    nb = prod(batch)
    kind = fusion.wgsl_type(out.dtype)
    raw_dtype = {"f32": _dt.float32, "i32": _dt.int32, "u32": _dt.uint8}[kind]
    storage = rt.alloc(nb * M * N * 4)
    g = GBuf(rt, out.shape, raw_dtype, storage=storage)
    if nb * M * N:
        rank = len(batch)
        abst = _batch_strides(a_bsh, a_bst, batch)
        bbst = _batch_strides(b_bsh, b_bst, batch)
        # rb128 loads 4 consecutive values as one vec4 where the whole row is 16-byte aligned
        a_vec = a_ks == 1 and all(v % 4 == 0 for v in [a_off, a_rs] + abst)
        b_vec = b_ns == 1 and all(v % 4 == 0 for v in [b_off, b_ks] + bbst)
        words = [M, N, K, nb, a_off, a_rs, a_ks, int(a_vec), b_off, b_ks, b_ns, int(b_vec)]
        words += list(batch) + abst + bbst
        info_n = max(4, (len(words) + 3) // 4)
        info = pack_info(words, info_n * 4)
        bufs = [(storage.buf, 0, max(4, nb * M * N * 4)), (ga.storage.buf, 0, ga.storage.nbytes),
                (gb.storage.buf, 0, gb.storage.nbytes)]

        def launcher(variant):
            def launch():
                _launch(rt, variant, kind, rank, info_n, bufs, info, M, N, nb)
            return launch

        if K == 0:
            return fusion.const_buf(rt, out.shape, 0, out.dtype)
        if True:
            variant = autotune.forced("matmul")
            if variant is None or not eligible(rt, variant, M, N, K, kind):
                default = default_variant(rt, M, N, K, kind)
                cands = {v: launcher(v) for v in VARIANTS if eligible(rt, v, M, N, K, kind)}
                key = autotune.shape_key("matmul", kind, (M, N, K, nb),
                                         (a_ks == 1, b_ns == 1, M % 64 == 0, N % 64 == 0, K % 16 == 0))
                variant = autotune.choose(rt, key, cands, default, lambda: _read(rt, g),
                                          lambda x, y: _close(x, y))
            _launch(rt, variant, kind, rank, info_n, bufs, info, M, N, nb)
    if raw_dtype is not out.dtype:
        return fusion.record(rt, "_cast", out, [g])
    return g


def _launch(rt, variant, kind, rank, info_n, bufs, info, M, N, nb):
    if variant == "sg":
        pipe = rt.kernel("matmul_sg", RANK=rank, INFO=info_n, WG=256)
        grid = ((N + 7) // 8, M, nb)
    else:
        params = {"RANK": rank, "INFO": info_n}
        if variant == "tiled":
            params["T"] = kind
        pipe = rt.kernel(f"matmul_{variant}", **params)
        tm, tn = _TILES[variant]
        grid = ((N + tn - 1) // tn, (M + tm - 1) // tm, nb)
        if variant == "rb128":
            bufs = bufs + bufs[1:3]   # A and B again, read as vec4 (A4, B4)
    rt.dispatch(pipe, bufs, info, grid)


def _read(rt, g):
    from array import array

    raw = rt.read(g.storage, g.size * 4)
    a = array("f")
    a.frombytes(raw)
    return a


def _close(x, y) -> bool:
    """Same values up to f32 summation-order differences (a strided sample of at most 64k;
    non-finite reference values are skipped)."""
    if len(x) != len(y):
        return False
    step = max(1, len(y) // 65536)
    ys = [v for v in y[::step] if v - v == 0]
    scale = max((abs(v) for v in ys), default=0.0) or 1.0
    return all(abs(p - q) <= 1e-3 * scale for p, q in zip(x[::step], y[::step]) if q - q == 0)
