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
from .runtime import kernel_source, pack_info, render

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
        self.rank = len(batch)
        abst = _batch_strides(a_bsh, a_bst, batch)
        bbst = _batch_strides(b_bsh, b_bst, batch)
        # rb128 loads 4 consecutive values as one vec4 where the whole row is 16-byte aligned
        a_vec = a_ks == 1 and all(v % 4 == 0 for v in [a_off, a_rs] + abst)
        b_vec = b_ns == 1 and all(v % 4 == 0 for v in [b_off, b_ks] + bbst)
        self.words = [M, N, K, self.nb, a_off, a_rs, a_ks, int(a_vec), b_off, b_ks, b_ns, int(b_vec)]
        self.words += list(batch) + abst + bbst
        self.key = autotune.shape_key("matmul", self.kind, (M, N, K, self.nb),
                                      (a_ks == 1, b_ns == 1, M % 64 == 0, N % 64 == 0, K % 16 == 0))

    def variant(self, storage) -> str:
        rt, M, N, K, kind = self.rt, self.M, self.N, self.K, self.kind
        v = autotune.forced("matmul")
        if v is not None and eligible(rt, v, M, N, K, kind):
            return v
        cands = {v: (lambda v=v: self._dispatch(v, storage, None, None))
                 for v in VARIANTS if eligible(rt, v, M, N, K, kind)}
        return autotune.choose(rt, self.key, cands, default_variant(rt, M, N, K, kind),
                               lambda: _read(rt, storage, self.size), _close)

    def launch(self, storage, prog, epi_words) -> None:
        """Dispatch into ``storage``; ``prog`` (a ``fusion.Program``) is the epilogue or None."""
        self._dispatch(self.variant(storage), storage, prog, epi_words)

    def _dispatch(self, variant, storage, prog, epi_words) -> None:
        rt = self.rt
        bufs = [(storage.buf, 0, max(4, self.size * 4)), (self.ga.storage.buf, 0, self.ga.storage.nbytes),
                (self.gb.storage.buf, 0, self.gb.storage.nbytes)]
        if variant == "rb128":
            bufs += bufs[1:3]   # A and B again, read as vec4 (A4, B4)
        words = list(self.words)
        epi, sig = None, None
        if prog is not None:
            base = len(words)
            words += epi_words
            epi, n_in = fusion.epilogue_source(prog, base, len(bufs))
            bufs += [(g.storage.buf, 0, g.storage.nbytes) for g in prog.leaves]
            sig = (prog.sig, base)
        else:
            T = self.kind if variant == "tiled" else "f32"
            epi = f"fn epilogue(acc: {T}, i: u32) -> {T} {{ return acc; }}"
        info_n = max(4, (len(words) + 3) // 4)
        params = {"RANK": self.rank, "INFO": info_n, "INFO_BINDING": len(bufs), "EPILOGUE": epi}
        if variant == "tiled":
            params["T"] = self.kind
        if variant == "sg":
            params["WG"] = 256
        name = f"matmul_{variant}"
        key = (name, tuple(sorted((k, v) for k, v in params.items() if k != "EPILOGUE")), sig)
        pipe = rt.pipeline(key, lambda: render(kernel_source(name), params))
        M, N, nb = self.M, self.N, self.nb
        if variant == "sg":
            grid = ((N + 7) // 8, M, nb)
        else:
            tm, tn = _TILES[variant]
            grid = ((N + tn - 1) // tn, (M + tm - 1) // tm, nb)
        rt.dispatch(pipe, bufs, pack_info(words, info_n * 4), grid)


def _read(rt, storage, n):
    from array import array

    raw = rt.read(storage, n * 4)
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
