"""Lazy elementwise fusion.

Every webgpu tensor holds a ``GBuf``: either *realised* (a pooled GPU ``Storage`` plus an
element offset and strides, so reshapes, transposes, slices and broadcasts are views that copy
nothing) or *lazy* (an expression ``Node`` over realised leaves and scalar constants). Elementwise
ops (unary, binary, where, casts, and ``full`` constants) only build nodes. At a materialisation
point (a non-elementwise kernel needs its input, a read, or the expression grows past the limits
below) ``realize`` generates ONE WGSL kernel for the whole expression from ``kernels/fused.wgsl``
and dispatches it once.

>>> import math, ember                                   # doctest: +SKIP
>>> x = ember.ones((1 << 20,), device="webgpu")          # doctest: +SKIP
>>> ember.webgpu.reset_stats()                           # doctest: +SKIP
>>> y = x * ((x / math.sqrt(2)).erf() + 1) / 2; _ = y.sum()   # doctest: +SKIP
>>> ember.webgpu.stats()["fused_kernels"]                # doctest: +SKIP
1

Limits that end a chain: more distinct inputs than a kernel may bind (``max_storage - 1``),
more than ``MAX_NODES`` ops, or a lazy input broadcast to a larger shape (it is realised first so
its work is not repeated for every broadcast copy; scalar constants are exempt).
``EMBER_FUSION=off`` (or ``ember.webgpu.set_fusion(False)``) realises every op at once.

The generated kernel's cache key is its structure: output rank and dtype, each input's storage
type and whether it is read contiguously, and each op with its dtype. Shapes, strides, offsets
and constant values are uniforms.
"""
from __future__ import annotations

import os
from math import prod

from .. import dtypes as _dt
from ..errors import DTypeError, UnsupportedOp
from .runtime import f32_bits, kernel_source, pack_info, render

MAX_NODES = 64
WG = 256

_FUSION = [os.environ.get("EMBER_FUSION", "on").lower() not in ("off", "0", "false", "no")]


def set_fusion(enabled: bool) -> bool:
    """Turn lazy elementwise fusion on or off; returns the previous setting."""
    old = _FUSION[0]
    _FUSION[0] = bool(enabled)
    return old


def fusion_enabled() -> bool:
    return _FUSION[0]


# ---- storage types ----------------------------------------------------------------------------

def wgsl_type(dtype) -> str:
    """The WGSL type a dtype is stored as: every element is 4 bytes on the GPU."""
    k = dtype.kind
    if k == "f":
        return "f32"
    if k == "i":
        return "i32"
    return "u32"


def contiguous_strides(shape) -> tuple:
    st = []
    acc = 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


class GBuf:
    """A webgpu tensor's buffer (see the module docstring). ``offset``/``strides`` count
    elements (4 bytes each)."""

    __slots__ = ("storage", "offset", "strides", "expr", "shape", "dtype", "rt")

    def __init__(self, rt, shape, dtype, storage=None, offset=0, strides=None, expr=None):
        self.rt = rt
        self.shape = tuple(shape)
        self.dtype = dtype
        self.storage = storage
        self.offset = offset
        self.strides = contiguous_strides(shape) if strides is None else tuple(strides)
        self.expr = expr

    @property
    def size(self) -> int:
        return prod(self.shape)

    def is_contiguous(self) -> bool:
        if self.expr is not None:
            return False
        acc = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != acc:
                return False
            acc *= n
        return True

    def __repr__(self):
        state = "lazy" if self.expr is not None else f"offset={self.offset} strides={self.strides}"
        return f"<GBuf {self.shape} {self.dtype.name} {state}>"


class Node:
    """An expression node: ``leaf`` (a realised GBuf), ``const`` (a scalar) or ``op``."""

    __slots__ = ("kind", "name", "dtype", "args", "value", "buf", "attrs")

    def __init__(self, kind, dtype, name=None, args=(), value=None, buf=None, attrs=()):
        self.kind = kind
        self.dtype = dtype
        self.name = name
        self.args = tuple(args)
        self.value = value
        self.buf = buf
        self.attrs = attrs


def const_buf(rt, shape, value, dtype) -> GBuf:
    """A lazy tensor of ``shape`` filled with ``value`` (no GPU work until used)."""
    _const_bits(value, dtype)  # range check now, not at the first use
    return GBuf(rt, shape, dtype, expr=Node("const", dtype, value=value))


def _count(root):
    seen = set()
    leaves = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.kind == "leaf":
            leaves.add(id(n.buf))
        stack.extend(n.args)
    return len(seen), len(leaves)


def record(rt, name: str, out, inputs, attrs=()) -> GBuf:
    """Record elementwise op ``name`` on input GBufs; returns a lazy GBuf of ``out`` (Meta)."""
    if name not in OPS_WGSL:
        raise UnsupportedOp(f"webgpu: no elementwise code for op {name!r}")

    def arg_of(g):
        if g.expr is not None:
            if g.expr.kind == "const" or g.shape == out.shape:
                return g.expr
            realize(g)
        return Node("leaf", g.dtype, buf=g)

    node = Node("op", out.dtype, name=name, args=[arg_of(g) for g in inputs], attrs=attrs)
    nodes, leaves = _count(node)
    if nodes > MAX_NODES or leaves > rt.max_storage - 1:
        for g in inputs:
            if g.expr is not None and g.expr.kind != "const":
                realize(g)
        node = Node("op", out.dtype, name=name, args=[arg_of(g) for g in inputs], attrs=attrs)
    g = GBuf(rt, out.shape, out.dtype, expr=node)
    if not _FUSION[0]:
        realize(g)
    return g


def realize(g: GBuf) -> GBuf:
    """Run the lazy expression of ``g`` (one dispatch) and make ``g`` a plain buffer."""
    if g.expr is None:
        return g
    rt = g.rt
    n = g.size
    storage = rt.alloc(n * 4)
    if n:
        _run(rt, g.expr, g.shape, g.dtype, storage)
    g.storage = storage
    g.offset = 0
    g.strides = contiguous_strides(g.shape)
    g.expr = None
    return g


def contiguous(g: GBuf) -> GBuf:
    """``g`` itself when it is a contiguous buffer, else a contiguous copy (one dispatch)."""
    if g.expr is None and g.is_contiguous():
        return g
    if g.expr is None:
        c = GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g))
        return realize(c)
    return realize(g)


def leaf_strides(g: GBuf, out_shape) -> tuple:
    """Strides that read ``g`` broadcast to ``out_shape`` (0 on broadcast axes)."""
    r = len(out_shape)
    pad = r - len(g.shape)
    st = []
    for d in range(r):
        if d < pad:
            st.append(0)
        else:
            n = g.shape[d - pad]
            st.append(0 if n == 1 else g.strides[d - pad])
    return tuple(st)


def _run(rt, root, shape, dtype, storage) -> None:
    rank = len(shape)
    n = prod(shape)
    leaves: list = []        # GBufs
    leaf_ids: dict = {}
    leaf_direct: list = []
    consts: list = []
    sig: list = []
    ids: dict = {}           # id(node) -> expression index
    body: list = []
    ops = 0

    order = []               # post-order over the DAG, iteratively (no recursion limit)
    stack = [(root, False)]
    seen = set()
    while stack:
        nd, done = stack.pop()
        if done:
            order.append(nd)
            continue
        if id(nd) in seen:
            continue
        seen.add(id(nd))
        stack.append((nd, True))
        for a in reversed(nd.args):
            if id(a) not in seen:
                stack.append((a, False))

    for nd in order:
        if id(nd) in ids:
            continue
        k = len(sig)
        ids[id(nd)] = k
        if nd.kind == "leaf":
            gb = nd.buf
            j = leaf_ids.get(id(gb))
            if j is None:
                j = len(leaves)
                leaf_ids[id(gb)] = j
                leaves.append(gb)
                leaf_direct.append(gb.shape == tuple(shape) and gb.is_contiguous())
            sig.append(("L", j, wgsl_type(gb.dtype), leaf_direct[j]))
        elif nd.kind == "const":
            c = len(consts)
            consts.append((nd.value, nd.dtype))
            sig.append(("C", c, wgsl_type(nd.dtype)))
        else:
            ops += 1
            sig.append(("O", nd.name, nd.dtype.name, tuple(a.dtype.name for a in nd.args),
                        tuple(ids[id(a)] for a in nd.args), nd.attrs))
    sig.append(("R", ids[id(root)]))

    # info words: n, out shape, per leaf: offset (+ strides when strided), constants
    words = [n] + list(shape)
    leaf_word = []
    for j, gb in enumerate(leaves):
        leaf_word.append(len(words))
        words.append(gb.offset)
        if not leaf_direct[j]:
            words.extend(leaf_strides(gb, shape))
    const_word = []
    for value, dt in consts:
        const_word.append(len(words))
        words.append(_const_bits(value, dt))
    info_n = max(1, (len(words) + 3) // 4)
    key = ("fused", rank, dtype.name, tuple(sig))
    pipe = rt.pipeline(key, lambda: _source(sig, rank, dtype, leaves, leaf_direct, leaf_word,
                                            const_word, info_n))
    bufs = [(storage.buf, 0, max(4, n * 4))]
    for gb in leaves:
        st = gb.storage
        bufs.append((st.buf, 0, st.nbytes))
    groups = (n + WG - 1) // WG
    from .driver import grid_1d

    rt.stats["fused_kernels"] += 1
    rt.stats["fused_ops"] += ops
    rt.dispatch(pipe, bufs, pack_info(words, info_n * 4), grid_1d(groups, rt.max_groups))


def _const_bits(value, dt) -> int:
    if dt.kind == "f":
        v = float(value)
        if dt is _dt.float16:
            from ..tensor import _round_half

            v = _round_half([v])[0]
        return f32_bits(v)
    if dt is _dt.bool_:
        return 1 if value else 0
    v = int(value)
    if dt is _dt.uint8:
        return v & 0xFF
    if not -(1 << 31) <= v < (1 << 31):
        raise DTypeError(f"webgpu: the {dt.name} constant {v} does not fit the GPU's 32-bit "
                         f"integers (int64 is stored as int32 on webgpu)")
    return v & 0xFFFFFFFF


def _source(sig, rank, dtype, leaves, leaf_direct, leaf_word, const_word, info_n) -> str:
    bindings = []
    for j, gb in enumerate(leaves):
        bindings.append(f"@group(0) @binding({j + 1}) var<storage, read> in{j}: array<{wgsl_type(gb.dtype)}>;")
    lines = []
    if not all(leaf_direct):
        # multi-index of output element i, innermost axis last
        lines.append("  var rem = i;")
        for d in range(rank - 1, -1, -1):
            lines.append(f"  let d{d} = i32(rem % u({1 + d}u)); rem = rem / u({1 + d}u);")
    for k, e in enumerate(sig[:-1]):
        if e[0] == "L":
            j = e[1]
            w = leaf_word[j]
            if leaf_direct[j]:
                idx = f"u({w}u) + i"
            else:
                terms = " + ".join(f"d{d} * s({w + 1 + d}u)" for d in range(rank)) or "0"
                idx = f"u32(s({w}u) + {terms})"
            lines.append(f"  let v{k} = in{j}[{idx}];")
        elif e[0] == "C":
            t = e[2]
            w = const_word[e[1]]
            val = {"f32": f"bitcast<f32>(u({w}u))", "i32": f"s({w}u)", "u32": f"u({w}u)"}[t]
            lines.append(f"  let v{k} = {val};")
        else:
            _, name, out_name, in_names, args, attrs = e
            expr = OPS_WGSL[name]([f"v{a}" for a in args], [_dt.get(x) for x in in_names],
                                  _dt.get(out_name), attrs)
            lines.append(f"  let v{k} = {_wrap(expr, _dt.get(out_name))};")
    lines.append(f"  out[i] = v{sig[-1][1]};")
    return render(kernel_source("fused"), {
        "OUT_T": wgsl_type(dtype), "BINDINGS": "\n".join(bindings), "INFO_BINDING": len(leaves) + 1,
        "INFO": info_n, "HELPERS": kernel_source("elementwise"), "WG": WG, "BODY": "\n".join(lines)})


def _wrap(expr: str, dt) -> str:
    """Keep a result inside its dtype, as a cast would: float16 rounds, uint8 wraps."""
    if dt is _dt.float16:
        return f"round_f16({expr})"
    if dt is _dt.uint8:
        return f"(({expr}) & 0xffu)"
    return expr


# ---- elementwise op code ----------------------------------------------------------------------
# name -> fn(args: list[str], in_dtypes, out_dtype, attrs) -> WGSL expression in the storage
# type of out_dtype. Inputs arrive in their own storage types, so mixed dtypes are converted.

def convert(x: str, src, dst) -> str:
    """WGSL converting value ``x`` stored as ``src`` dtype into ``dst``'s storage type, with
    numpy's cast semantics (float -> int truncates; anything -> bool is != 0)."""
    ts, td = wgsl_type(src), wgsl_type(dst)
    if dst is _dt.bool_:
        if src is _dt.bool_:
            return x
        zero = {"f32": "0.0", "i32": "0", "u32": "0u"}[ts]
        return f"select(0u, 1u, {x} != {zero})"
    if ts == td:
        return x
    if td == "f32":
        return f"f32({x})"
    if td == "i32":
        if ts == "f32":
            return f"i32(trunc({x}))"
        return f"i32({x})"
    # u32 (uint8): wrap like a C cast of the integer value
    if ts == "f32":
        return f"(bitcast<u32>(i32(trunc({x}))) & 0xffu)"
    return f"(bitcast<u32>({x}) & 0xffu)"


def _same(args, ins, out):
    """Arguments converted to the output's storage type."""
    return [convert(a, d, out) for a, d in zip(args, ins)]


def _common(args, ins):
    """Arguments converted to their promoted dtype (for comparisons)."""
    t = ins[0]
    for d in ins[1:]:
        t = _dt.result_type(t, d)
    return [convert(a, d, t) for a, d in zip(args, ins)], t


def _arith(op, bool_op=None):
    def f(args, ins, out, attrs):
        a, b = _same(args, ins, out)
        if out is _dt.bool_ and bool_op:
            return f"({a} {bool_op} {b})"
        return f"({a} {op} {b})"
    return f


def _float_unary(fn):
    def f(args, ins, out, attrs):
        (a,) = _same(args, ins, out) if out.kind == "f" else [convert(args[0], ins[0], _dt.float32)]
        return fn.format(a)
    return f


def _compare(op):
    def f(args, ins, out, attrs):
        (a, b), _ = _common(args, ins)
        return f"select(0u, 1u, {a} {op} {b})"
    return f


OPS_WGSL: dict = {
    "add": _arith("+", "|"),
    "multiply": _arith("*", "&"),
    "subtract": _arith("-"),
    "exp": _float_unary("exp({})"),
}
