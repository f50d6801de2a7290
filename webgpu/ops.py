"""The webgpu kernel table: one entry per registry op (``ember.registry.OPS``).

Elementwise ops record lazy expressions (``fusion``). Movement ops are views where they can be
(reshape of a contiguous buffer, permute_dims, broadcast_to, slice: no copy, the next kernel reads
through the strides). Everything else dispatches a kernel from ``kernels/*.wgsl``.
"""
from __future__ import annotations

import math
import os
from math import prod

from .. import dtypes as _dt
from ..errors import IndexingError
from ..registry import OPS, Meta
from . import fusion, linalg, nn, quant
from .driver import grid_1d
from .fusion import GBuf, contiguous, contiguous_strides, realize, wgsl_type
from .replay import add_bounds, checked
from .runtime import f32_bits, pack_info

WG = 256


def info_words(words) -> tuple:
    """(uniform bytes, INFO template size in vec4s) for a list of u32/i32 words."""
    n = max(2, (len(words) + 3) // 4)
    return pack_info(words, n * 4), n


def dispatch_1d(rt, pipe, bufs, info, n):
    rt.dispatch(pipe, bufs, info, grid_1d((n + WG - 1) // WG, rt.max_groups))


def raw_dtype(dtype):
    """The dtype a kernel's raw output is labelled with: the same storage type as ``dtype``,
    except float16, whose f32 results still need rounding (a lazy cast does it)."""
    return _dt.float32 if dtype is _dt.float16 else dtype


def finish(rt, g: GBuf, out: Meta) -> GBuf:
    """Label a raw kernel result with the op's dtype (rounding float16 lazily)."""
    if g.dtype is out.dtype:
        return g
    if wgsl_type(g.dtype) == wgsl_type(out.dtype) and out.dtype is not _dt.float16:
        g.dtype = out.dtype
        return g
    return fusion.record(rt, "_cast", out, [g])


def value_bits(value, dtype) -> int:
    k = wgsl_type(dtype)
    if k == "f32":
        return f32_bits(float(value))
    v = int(value)
    return v & (0xFF if dtype is _dt.uint8 else 0xFFFFFFFF)


def view(g: GBuf, shape, strides, offset) -> GBuf:
    v = GBuf(g.rt, shape, g.dtype, storage=g.storage, offset=offset, strides=strides)
    v.bounds = g.bounds
    return v


# ---- elementwise -----------------------------------------------------------------------------

def _elementwise(rt, name):
    def kernel(out, *inputs, **attrs):
        return fusion.record(rt, name, out, [t._buf for t in inputs], tuple(sorted(attrs.items())))
    if name in ("add", "subtract"):
        plain, sign = kernel, 1 if name == "add" else -1

        def kernel(out, a, b, **attrs):   # noqa: F811
            g = plain(out, a, b, **attrs)
            if out.dtype in (_dt.int32, _dt.int64) and a._buf.bounds is not None and b._buf.bounds is not None:
                # index arithmetic (positions pos + arange(T)): its range stays known, so the
                # take that uses it needs no GPU read to check it
                g.bounds = add_bounds(a._buf.bounds, b._buf.bounds, sign)
            return g
    kernel.__name__ = f"webgpu_{name}"
    return kernel


def _with_consts(rt, name, consts):
    """An elementwise op whose scalar attributes become constant inputs (uniforms), so one
    pipeline serves every value."""
    def kernel(out, x, **attrs):
        args = [x._buf] + [fusion.const_buf(rt, (), v, dt) for v, dt in consts(x, out, **attrs)]
        return fusion.record(rt, name, out, args)
    return kernel


def _clip_consts(x, out, *, min=None, max=None):  # noqa: A002
    dt = out.dtype
    if dt.kind == "f":
        lo = -math.inf if min is None else float(min)
        hi = math.inf if max is None else float(max)
    else:
        info = {"i": (-(1 << 31), (1 << 31) - 1), "u": (0, 255)}[dt.kind]
        lo = info[0] if min is None else int(max_(min, info[0]))
        hi = info[1] if max is None else int(min_(max, info[1]))
    return [(lo, dt), (hi, dt)]


max_, min_ = max, min


def _clip(rt):
    inner = _with_consts(rt, "clip", _clip_consts)

    def kernel(out, x, *, min=None, max=None):  # noqa: A002
        ints = x.dtype.kind != "f"
        if ints and any(isinstance(b, float) and b != int(b) for b in (min, max) if b is not None):
            return OPS["clip"].decompose(x, min=min, max=max)._buf   # float bounds on ints
        return inner(out, x, min=min, max=max)
    return kernel


# ---- creation --------------------------------------------------------------------------------

def _arange(rt):
    def kernel(out, *, start, step, **_):
        n = out.shape[0]
        dt = raw_dtype(out.dtype)
        st = rt.alloc(n * 4)
        g = GBuf(rt, out.shape, dt, storage=st)
        if n:
            info, info_n = info_words([n, value_bits(start, dt), value_bits(step, dt)])
            pipe = rt.kernel("arange", T=wgsl_type(dt), INFO=info_n, WG=WG)
            dispatch_1d(rt, pipe, [(st.buf, 0, n * 4)], info, n)
            if out.dtype in (_dt.int32, _dt.int64):
                last = start + (n - 1) * step
                g.bounds = (min_(start, last), max_(start, last))
        return finish(rt, g, out)
    return kernel


def _full(rt):
    def kernel(out, *, value, **_):
        g = fusion.const_buf(rt, out.shape, value, out.dtype)
        if out.dtype in (_dt.int32, _dt.int64):      # (int64 is stored as int32: const_buf checks the range)
            g.bounds = (int(value), int(value))
        return g
    return kernel


# ---- movement --------------------------------------------------------------------------------

def reshape_strides(shape, strides, new_shape):
    """Strides that read a view of ``shape``/``strides`` as ``new_shape`` without a copy, or
    None when the view's axes cannot be regrouped (then the data must be made contiguous)."""
    if prod(new_shape) == 0:
        return contiguous_strides(new_shape)
    old = [(n, st) for n, st in zip(shape, strides) if n != 1]
    new = list(new_shape)
    out = [0] * len(new)
    oi = ni = 0
    while ni < len(new):
        if new[ni] == 1:
            ni += 1
            continue
        nj, oj = ni + 1, oi + 1
        np_, op_ = new[ni], old[oi][0]
        while np_ != op_:
            if np_ < op_:
                np_ *= new[nj]
                nj += 1
            else:
                op_ *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):        # the old axes of this group must nest
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        st = old[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            out[k] = st
            st *= new[k]
        ni, oi = nj, oj
    return tuple(out)


def _reshape(rt):
    def kernel(out, x, **_):
        g = x._buf
        bounds = g.bounds        # (the values, so their range, are the same: take needs no GPU read)
        if g.expr is not None and g.expr.kind == "const":
            c = fusion.const_buf(rt, out.shape, g.expr.value, g.dtype)
            c.bounds = bounds
            return c
        g = realize(g, wide=False)       # (views keep a float16 tensor's half storage)
        st = reshape_strides(g.shape, g.strides, out.shape)
        if st is None:
            g = contiguous(g, wide=False)
            st = contiguous_strides(out.shape)
        v = view(g, out.shape, st, g.offset)
        v.bounds = bounds
        return v
    return kernel


def _permute_dims(rt):
    def kernel(out, x, *, axes, **_):
        g = realize(x._buf, wide=False)
        return view(g, out.shape, [g.strides[a] for a in axes], g.offset)
    return kernel


def _broadcast_to(rt):
    def kernel(out, x, **_):
        g = x._buf
        if g.expr is not None and g.expr.kind == "const":
            return fusion.const_buf(rt, out.shape, g.expr.value, g.dtype)
        g = realize(g, wide=False)
        return view(g, out.shape, fusion.leaf_strides(g, out.shape), g.offset)
    return kernel


def _slice(rt):
    def kernel(out, x, *, slices, **_):
        g = x._buf
        if g.expr is not None and g.expr.kind == "const":
            return fusion.const_buf(rt, out.shape, g.expr.value, g.dtype)
        g = realize(g, wide=False)
        off = g.offset + sum(s[0] * st for s, st, n in zip(slices, g.strides, out.shape) if n)
        return view(g, out.shape, [s[2] * st for s, st in zip(slices, g.strides)], off)
    return kernel


def _concat(rt):
    def kernel(out, *xs, axis, **_):
        n = prod(out.shape)
        st = rt.alloc(n * 4)
        res = GBuf(rt, out.shape, out.dtype, storage=st)
        ost = contiguous_strides(out.shape)
        start = 0
        for t in xs:
            g = t._buf
            if g.size:
                if t.dtype is not out.dtype:
                    g = fusion.record(rt, "_cast", Meta(t.shape, out.dtype), [g])
                fusion.run_into(rt, g, st, start * ost[axis], ost)
            start += t.shape[axis]
        return res
    return kernel


def check_indices(rt, idx: GBuf, n: int, op: str, axis: int) -> None:
    """IndexingError unless every index is in [-n, n). Uses the bounds remembered at upload;
    computed indices are checked with a min/max reduction on the GPU (one small read)."""
    if idx.size == 0:
        return
    b = idx.bounds
    if b is None:
        lo = _reduce_value(rt, idx, 3)
        hi = _reduce_value(rt, idx, 2)
        b = idx.bounds = (lo, hi)

    def check(lo, hi):
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise IndexingError(f"{op}: index {bad} is out of range for axis {axis} with size {n}")
    checked(b, check)


def _reduce_value(rt, g: GBuf, op: int):
    from array import array

    m = Meta((), g.dtype)
    r = reduce_all(rt, m, g, op)
    raw = rt.read(r.storage, 4, r.offset * 4)
    a = array({"f32": "f", "i32": "i", "u32": "I"}[wgsl_type(g.dtype)])
    a.frombytes(raw)
    return a[0]


def _gather(rt, out, x: GBuf, idx: GBuf, axis: int, xs, is_, axis_size):
    n = prod(out.shape)
    st = rt.alloc(n * 4)
    g = GBuf(rt, out.shape, out.dtype, storage=st)
    if n:
        rank = len(out.shape)
        words = [n, axis_size, x.strides[axis], x.offset, idx.offset, 0, 0, 0]
        words += list(out.shape) + list(xs) + list(is_)
        info, info_n = info_words(words)
        pipe = rt.kernel("gather", T=wgsl_type(x.dtype), I=wgsl_type(idx.dtype), RANK=max(rank, 1),
                         INFO=info_n, WG=WG)
        dispatch_1d(rt, pipe, [(st.buf, 0, n * 4), (x.storage.buf, 0, x.storage.nbytes),
                               (idx.storage.buf, 0, idx.storage.nbytes)], info, n)
    return g


def _indexed(rt, name, strides_of):
    """take / take_along_axis: check the indices, then one gather kernel; ``strides_of(gx, gi,
    axis, out_rank)`` gives the x and index strides per output axis."""
    def kernel(out, x, indices, *, axis, **_):
        gx = realize(x._buf)
        gi = realize(indices._buf)
        n = gx.shape[axis]
        check_indices(rt, gi, n, name, axis)
        if prod(out.shape) == 0:
            return GBuf(rt, out.shape, out.dtype, storage=rt.alloc(0))
        if not out.shape:  # a 0-d result: gather one element, then view it as 0-d
            g = _gather(rt, Meta((1,), out.dtype), gx, gi, axis, [0], [0], n)
            return view(g, (), (), g.offset)
        xs, is_ = strides_of(gx, gi, axis, len(out.shape))
        return _gather(rt, out, gx, gi, axis, xs, is_, n)
    return kernel


def _take_strides(gx, gi, axis, rank):
    ni = len(gi.shape)
    xs = list(gx.strides[:axis]) + [0] * ni + list(gx.strides[axis + 1:])
    is_ = [0] * axis + list(gi.strides) + [0] * (len(gx.shape) - axis - 1)
    return xs, is_


def _along_strides(gx, gi, axis, rank):
    xs = [0 if (d == axis or gx.shape[d] == 1) else gx.strides[d] for d in range(rank)]
    is_ = [0 if gi.shape[d] == 1 else gi.strides[d] for d in range(rank)]
    return xs, is_


# ---- reductions ------------------------------------------------------------------------------

_REDUCE_OP = {"sum": 0, "prod": 1, "max": 2, "min": 3, "argmax": 2, "argmin": 3}


def _merge(shape, strides):
    """Drop size-1 axes and merge neighbours that are contiguous with each other."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    out = []
    for n, s in dims:
        if out and out[-1][1] == s * n:
            m, _ = out[-1]
            out[-1] = (m * n, s)
        else:
            out.append((n, s))
    return out


def _fusable_into_reduce(rt, g: GBuf):
    """The elementwise expression of lazy ``g`` as a ``fusion.Program`` the reduction can
    compute in place of loading ``g`` (saving a dispatch and a buffer: a loss's squared
    difference, a layer norm's or softmax's backward products), or None."""
    nd = g.expr
    if nd is None or not (nd.kind == "op" or (nd.kind == "leaf" and fusion.is_half(nd.buf))) or not fusion._FUSION[0]:
        return None
    order = fusion._post_order(nd)
    if any(x.kind == "mm" and x.buf is None for x in order):
        return None          # a pending matmul: let it run (and maybe fuse its own epilogue)
    prog = fusion.Program(nd, g.shape, None, order)
    if len(prog.leaves) + 2 > rt.max_storage or any(gb.storage.nbytes > rt.max_binding for gb in prog.leaves):
        return None
    return prog


def _fused_reduce_source(prog, base: int, params: dict) -> str:
    """reduce.wgsl with ``load`` computing ``prog``'s expression at the element's flat index
    (its inputs bound from binding 1, its uniform words from word ``base``)."""
    from .runtime import kernel_source, render

    bindings, lines, res = prog.code(base, 1)
    src = kernel_source("reduce")
    src = src.replace("@group(0) @binding(1) var<storage, read> x: array<{{T}}>;", "\n".join(bindings))
    src = src.replace("@binding(2) var<uniform> info", f"@binding({len(prog.leaves) + 1}) var<uniform> info")
    value_at = "fn value_at(i: u32) -> {{T}} {\n" + "\n".join(lines) + f"\n  return {res};\n}}\n"
    src = src.replace("fn load(o: u32, r: u32) -> {{A}} { return {{A}}(x[offset(o, r)]); }",
                      value_at + "fn load(o: u32, r: u32) -> {{A}} { return {{A}}(value_at(offset(o, r))); }")
    return render(src, params)


# Parallelism of a reduction (H100: a sum of (25, 576) over its leading axis, one thread per
# output looping over 25 rows, 3 workgroups, took 32 us; BatchNorm's statistics, 16 workgroups of
# 50,176 elements each, similar): lanes enough that each reads about ``PER_THREAD`` elements; where
# a lane would still read over twice ``PART_PER_THREAD``, the elements are split over up to
# ``MAX_PARTS`` parts (about ``TARGET_GROUPS`` workgroups in all), reduced by a second pass.
TARGET_GROUPS = 512
PER_THREAD = 4
PART_PER_THREAD = 16
MAX_PARTS = 64
# ``EMBER_WEBGPU_REDUCE_PARTS=0``: never in parts (one pass, for A/B timings on a GPU)
PARTS = os.environ.get("EMBER_WEBGPU_REDUCE_PARTS", "1") != "0"


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def reduce_layout(n_out: int, R: int, kdims, rdims, arg: bool = False, split: bool = True) -> tuple:
    """(entry, CX, CY, parts) of a reduction of ``R`` elements into each of ``n_out`` outputs with
    merged kept/reduced ``(size, stride)`` axes, CX outputs x CY lanes a workgroup: one output
    a workgroup (CX 1) for long rows, and rows of contiguous elements (a softmax's or layer
    norm's backward sums: neighbouring threads read neighbouring elements) with a lane per
    element up to WG (attention's 128-wide rows: two a workgroup); else lanes enough
    for a few elements each, and where the innermost kept axis is contiguous (a sum over
    leading axes) CX >= 32, so that neighbouring threads read whole lines. ``parts`` splits R
    over workgroups too where the outputs alone give too few of them."""
    contiguous_rows = bool(rdims) and rdims[-1][1] == 1
    column_like = bool(kdims) and kdims[-1][1] == 1
    per_wg = (R > 256 and n_out < 16384) or (R >= 64 and contiguous_rows and n_out <= (1 << 20))
    if arg:
        return ("arg_wg" if per_wg else "arg_rows"), WG, 1, 1
    if per_wg and not column_like:   # (rows shorter than WG: as many lanes as elements, several rows a workgroup)
        cy = min(WG, max(32, _pow2_at_least(R)))
    else:
        cy = min(_pow2_at_least((R + PER_THREAD - 1) // PER_THREAD), 8 if column_like else 64)
    cx = WG // cy
    groups = (n_out + cx - 1) // cx
    parts = 1
    if split and PARTS and R > 2 * cy * PART_PER_THREAD:
        parts = max(1, min(MAX_PARTS, (TARGET_GROUPS + groups - 1) // groups, R // (cy * PART_PER_THREAD)))
    return "cols", cx, cy, parts


def reduce_all(rt, out: Meta, g: GBuf, op: int, axes=None, arg=False, split=True, divisor: float = 1.0) -> GBuf:
    """Reduce view ``g`` over ``axes`` (None: all) with op code ``op``; raw result buffer. A
    lazy elementwise ``g`` is computed inside the reduction (it is not stored). A reduction with
    few outputs for its size runs in parts (``reduce_layout``), then reduces the parts. A float
    result is divided by ``divisor`` as it is written (a mean: no separate divide to realise)."""
    if g.expr is None and fusion.is_half(g):
        # read as a one-leaf expression: the reduction loads the f16 elements itself (no copy)
        g = GBuf(rt, g.shape, g.dtype, expr=fusion.Node("leaf", g.dtype, buf=g))
    prog = _fusable_into_reduce(rt, g)
    if prog is None:
        g = realize(g)
    nd = len(g.shape)
    axes = tuple(range(nd)) if axes is None else tuple(axes)
    kept = [d for d in range(nd) if d not in axes]
    kdims = _merge([g.shape[d] for d in kept], [g.strides[d] for d in kept])
    rdims = _merge([g.shape[d] for d in axes], [g.strides[d] for d in axes])
    n_out = prod(g.shape[d] for d in kept)
    R = prod(g.shape[d] for d in axes)
    dims = kdims + rdims or [(1, 0)]
    rank = len(dims)
    if arg:
        acc, odt = wgsl_type(g.dtype), "i32"
        res_dtype = _dt.int64
    else:
        acc = odt = wgsl_type(out.dtype)
        res_dtype = raw_dtype(out.dtype)
    if n_out == 0:
        return GBuf(rt, out.shape, res_dtype, storage=rt.alloc(0))
    entry, cx, cy, parts = reduce_layout(n_out, R, kdims, rdims, arg, split)
    st = rt.alloc(n_out * parts * 4)
    res = GBuf(rt, out.shape if parts == 1 else (parts, n_out), res_dtype, storage=st)
    last = parts == 1
    words = [n_out, R, op, len(kdims), g.offset, f32_bits(float(divisor) if last else 1.0), 0, 0]
    words += [n for n, _ in dims] + [s for _, s in dims]
    base = len(words)
    if prog is not None:
        words += prog.words()
    info, info_n = info_words(words)
    params = dict(T=wgsl_type(g.dtype), A=acc, O=odt, FLOAT=str(acc == "f32").lower(), RANK=rank, INFO=info_n,
                  WG=WG, CX=cx, CY=cy)
    if prog is None:
        pipe = rt.kernel("reduce", entry, **params)
        bufs = [(st.buf, 0, n_out * parts * 4), (g.storage.buf, 0, g.storage.nbytes)]
    else:
        # (the program's code depends on its own rank too: where its words start and lie)
        key = ("reduce_fused", entry, tuple(sorted(params.items())), len(prog.shape), prog.sig)
        pipe = rt.pipeline(key, lambda: _fused_reduce_source(prog, base, params), entry)
        bufs = [(st.buf, 0, n_out * parts * 4)] + [(gb.storage.buf, 0, gb.storage.nbytes) for gb in prog.leaves]
        rt.stats["fused_ops"] += prog.ops
    groups = n_out if entry == "arg_wg" else (n_out + cx - 1) // cx
    gx, gy, _ = grid_1d(groups, rt.max_groups)
    rt.dispatch(pipe, bufs, info, (gx, gy, parts))
    if parts == 1:
        return res
    # the parts: (parts, n_out), reduced over their leading axis by one more pass
    return reduce_all(rt, out, res, op, (0,), split=False, divisor=divisor)


def _reduce(rt, name):
    op = _REDUCE_OP[name]

    def kernel(out, x, *, axes, keepdims=False, dtype=None, **_):
        g = x._buf
        if g.size == 0:
            return fusion.const_buf(rt, out.shape, 0 if name == "sum" else 1, out.dtype)
        return finish(rt, reduce_all(rt, out, g, op, axes), out)
    return kernel


def _mean(rt):
    """mean as one reduction whose result is divided as it is written: a realised buffer, so
    the elementwise ops that broadcast it (a layer norm's backward) read it in place instead of
    realising the composite's lazy sum / count first."""
    def kernel(out, x, *, axes, keepdims=False):
        count = prod(x.shape[a] for a in axes)
        if x.dtype is not _dt.float32 or out.dtype is not _dt.float32 or count == 0 or x._buf.size == 0:
            return OPS["mean"].decompose(x, axes=axes, keepdims=keepdims)._buf
        return reduce_all(rt, out, x._buf, 0, axes, divisor=count)
    return kernel


def _argreduce(rt, name):
    op = _REDUCE_OP[name]

    def kernel(out, x, *, axis, keepdims=False, **_):
        g = reduce_all(rt, out, x._buf, op, (axis,), arg=True)
        if x.shape[axis]:
            # an index along the axis: its range is known, so a take/embedding of it (a decoded
            # token fed back as the next input) is checked without a read
            g.bounds = (0, x.shape[axis] - 1)
        return g
    return kernel


# ---- the table -------------------------------------------------------------------------------

def build_kernels(rt) -> dict:
    """Kernels for every op this backend implements, bound to runtime ``rt``."""
    k = {}
    for name in fusion.OPS_WGSL:
        if not name.startswith("_") and name not in ("leaky_relu", "clip"):
            k[name] = _elementwise(rt, name)
    k["leaky_relu"] = _with_consts(rt, "leaky_relu", lambda x, out, *, negative_slope: [(negative_slope, _dt.float32)])
    k["clip"] = _clip(rt)
    k["full"] = _full(rt)
    k["arange"] = _arange(rt)
    k["matmul"] = lambda out, a, b: linalg.matmul(rt, out, a, b)
    k["reshape"] = _reshape(rt)
    k["permute_dims"] = _permute_dims(rt)
    k["broadcast_to"] = _broadcast_to(rt)
    k["slice"] = _slice(rt)
    k["concat"] = _concat(rt)
    k["take"] = _indexed(rt, "take", _take_strides)
    k["take_along_axis"] = _indexed(rt, "take_along_axis", _along_strides)
    for name in ("sum", "prod", "max", "min"):
        k[name] = _reduce(rt, name)
    for name in ("argmax", "argmin"):
        k[name] = _argreduce(rt, name)
    k["mean"] = _mean(rt)
    k.update(nn.build_kernels(rt))
    k.update(quant.build_kernels(rt))   # quantized weights and the llama ops
    # only ops the registry knows (a kernel for an op that another helper renamed is dead code)
    return {n: _named(rt, n, f) for n, f in k.items() if n in OPS}


def _named(rt, name, f):
    """``f`` recording which op runs (``rt.op``), so a limit error names the op and its shape."""
    def kernel(out, *args, **kw):
        rt.op = (name, getattr(out, "shape", None))   # (multi-output kernels get a tuple)
        return f(out, *args, **kw)
    kernel.__name__ = getattr(f, "__name__", name)
    kernel.__wrapped__ = f
    return kernel
