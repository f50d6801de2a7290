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

A matmul is lazy too: the elementwise ops that consume it (bias, activation, residual) become
its *epilogue*, computed in the matmul kernel's store (``fn epilogue`` in the matmul kernels), so
``gelu(x @ w.T + b)`` is one dispatch. This happens only when nothing else can still need the
plain product (the tensor it returned and the other lazy tensors built on it are gone);
otherwise the matmul runs on its own first and is read like any other input.

Limits that end a chain: more distinct inputs than a kernel may bind (``max_storage - 1``),
more than ``MAX_NODES`` ops, or a lazy input broadcast to a larger shape (it is realised first so
its work is not repeated for every broadcast copy; scalar constants are exempt).
``EMBER_FUSION=off`` (or ``ember.webgpu.set_fusion(False)``) realises every op at once.

The generated kernel's cache key is its structure: output rank, dtype and storage (half or not),
each input's storage type and whether it is read contiguously, and each op with its dtype.
Shapes, strides, offsets and constant values are uniforms.

Half storage (``Runtime.half``, see ``ember.webgpu.backend``): a leaf in half storage is bound as
``array<f16>`` and widened as it is loaded; a float16 expression realised with ``wide=False``
(views, reads, fusion's own boundaries) is stored as ``f16(v)`` (exact: ``v`` is already
rounded to half precision by ``round_f16``). ``realize``/``contiguous``/``dense`` default to
``wide=True``: the hand-written kernels that call them get 4-byte buffers, so none of them reads
half storage as f32.
"""
from __future__ import annotations

import os
import weakref
from math import prod

from .. import dtypes as _dt
from ..errors import DTypeError, UnsupportedOp
from .runtime import env_on, f32_bits, kernel_source, pack_info, render

MAX_NODES = 64
WG = 256

_FUSION = [env_on("EMBER_FUSION")]
# A matmul whose epilogue would compute a transcendental (gelu, erf, tanh, exp, sigmoid, silu) runs
# plain and the expression (bias and all) as its own pass: on an H100 (2026-12-07, BERT 32x128's
# FFN up, 4096x1536x384 + bias + GELU) the product with that epilogue took 196 us, the plain product
# 127 and the pass 32; BERT forwards 12.46 / 2.00 / 1.19 ms against 13.00 / 2.07 / 1.36 at 32x128 /
# 8x64 / 1x16 (tests/bench/bench_bert_gpu.py). EMBER_WEBGPU_HEAVY_EPILOGUE=1 keeps them in the epilogue.
_HEAVY_OFF = not env_on("EMBER_WEBGPU_HEAVY_EPILOGUE", default=False)
_HEAVY = {"gelu", "erf", "tanh", "exp", "sigmoid", "silu"}


def set_fusion(enabled: bool) -> bool:
    """Turn lazy elementwise fusion on or off; returns the previous setting."""
    old = _FUSION[0]
    _FUSION[0] = bool(enabled)
    return old


def fusion_enabled() -> bool:
    return _FUSION[0]


# ---- storage types ----------------------------------------------------------------------------

def wgsl_type(dtype) -> str:
    """The WGSL type a dtype's values are computed in (and stored as, in 4-byte storage; a
    float16 tensor in half storage holds ``f16``: see ``storage_type``)."""
    k = dtype.kind
    if k == "f":
        return "f32"
    if k == "i":
        return "i32"
    return "u32"


def is_half(g) -> bool:
    """Whether realised ``g`` lies in half storage (2-byte ``f16`` elements)."""
    st = g.storage
    return st is not None and st.half


def storage_type(g) -> str:
    """The WGSL element type of realised ``g``'s storage: ``f16`` for half storage, else the
    4-byte ``wgsl_type`` of its dtype."""
    return "f16" if is_half(g) else wgsl_type(g.dtype)


def storage_bytes(n: int, half: bool) -> int:
    """Bytes ``n`` elements take (half storage: 2 each, rounded up to a 4-byte word)."""
    return (2 * n + 3) // 4 * 4 if half else 4 * n


def elem_bytes(st) -> int:
    """Bytes one element of Storage ``st`` takes: 2 in half storage, else 4."""
    return 2 if st.half else 4


def binding_window(st, lo: int, hi: int, align: int) -> tuple:
    """(first element, bytes) of a binding of Storage ``st`` that covers its elements ``lo..hi``:
    the start aligned down to ``align`` bytes (a multiple of 4), the size rounded up to 16 bytes
    and kept inside the buffer."""
    es = elem_bytes(st)
    a = align // es
    base = lo // a * a
    return base, min(((hi + 1 - base) * es + 15) // 16 * 16, st.nbytes - base * es)


def contiguous_strides(shape) -> tuple:
    st = []
    acc = 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


class GBuf:
    """A webgpu tensor's buffer (see the module docstring). ``offset``/``strides`` count
    elements (4 bytes each, 2 in half storage: ``storage.half``)."""

    __slots__ = ("storage", "offset", "strides", "expr", "shape", "dtype", "rt", "bounds", "__weakref__")

    def __init__(self, rt, shape, dtype, storage=None, offset=0, strides=None, expr=None):
        self.rt = rt
        self.bounds = None  # (min, max) of an integer tensor when known (checked index uploads)
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
    """An expression node: ``leaf`` (a realised GBuf), ``const`` (a scalar), ``op`` (an
    elementwise op) or ``mm`` (a pending matmul: ``value`` is its plan, ``buf`` its result once
    it has run, ``attrs`` weak references to the tensor it returned and to the lazy tensors
    built on it)."""

    __slots__ = ("kind", "name", "dtype", "args", "value", "buf", "attrs", "bounds")

    def __init__(self, kind, dtype, name=None, args=(), value=None, buf=None, attrs=()):
        self.kind = kind
        self.dtype = dtype
        self.name = name
        self.args = tuple(args)
        self.value = value
        self.buf = buf
        self.attrs = attrs
        # ``record``'s (nodes, leaves, pending matmul nodes) of the expression, counting shared
        # subexpressions once per use: an upper bound that saves walking the graph on every op
        self.bounds = None


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
        if n.kind == "leaf" or (n.kind == "mm" and n.buf is not None):
            leaves.add(id(n.buf))
        stack.extend(n.args)
    return len(seen), len(leaves)


def _bounds(node) -> tuple:
    """(nodes, leaves, pending mm nodes) of ``node``'s expression, from its arguments' bounds:
    at least the exact counts of ``_count``, without walking the graph."""
    n, leaves, mms = 1, 0, ()
    for a in node.args:
        b = a.bounds
        if b is None:
            if a.kind == "leaf":
                b = (1, 1, ())
            elif a.kind == "const":
                b = (1, 0, ())
            elif a.kind == "mm":
                b = (1, 1, () if a.buf is not None else (a,))
            else:    # an expression built elsewhere: walk it once
                sub = _post_order(a)
                b = (len(sub), sum(1 for x in sub if x.kind in ("leaf", "mm")),
                     tuple(x for x in sub if x.kind == "mm" and x.buf is None))
        n += b[0]
        leaves += b[1]
        if b[2]:
            mms = b[2] if not mms else mms + tuple(x for x in b[2] if all(x is not y for y in mms))
    return n, leaves, mms


def record(rt, name: str, out, inputs, attrs=()) -> GBuf:
    """Record elementwise op ``name`` on input GBufs; returns a lazy GBuf of ``out`` (Meta)."""
    if name not in OPS_WGSL:
        raise UnsupportedOp(f"webgpu: no elementwise code for op {name!r}")

    def arg_of(g):
        if g.expr is not None:
            if g.expr.kind == "const" or g.shape == out.shape or _inline_broadcast(g, out.shape):
                return g.expr
            realize(g, wide=False)
        return Node("leaf", g.dtype, buf=g)

    node = Node("op", out.dtype, name=name, args=[arg_of(g) for g in inputs], attrs=attrs)
    nodes, leaves, mms = node.bounds = _bounds(node)
    if nodes > MAX_NODES or leaves > rt.max_storage - 1:
        nodes, leaves = _count(node)      # the bound says maybe: count exactly
        if nodes > MAX_NODES or leaves > rt.max_storage - 1:
            for g in inputs:
                if g.expr is not None and g.expr.kind != "const":
                    realize(g, wide=False)
            node = Node("op", out.dtype, name=name, args=[arg_of(g) for g in inputs], attrs=attrs)
            node.bounds = _bounds(node)
        mms = node.bounds[2]
    g = GBuf(rt, out.shape, out.dtype, expr=node)
    for nd in mms:
        if nd.buf is None:
            nd.attrs[1].append(weakref.ref(g))
    if not _FUSION[0]:
        realize(g, wide=False)
    return g


# A lazy operand broadcast to a larger shape is realised first, so that its work is not repeated
# for every broadcast copy, unless its expression is this small (a row statistic's
# rsqrt(var + eps), a where over row maxima) and runs no matmul: recomputing a few ops per element
# costs less than a dispatch of its own that writes the operand and the read back.
INLINE_BROADCAST_NODES = int(os.environ.get("EMBER_WEBGPU_INLINE_BROADCAST", "6"))   # 0: off (A/B)


def _inline_broadcast(g: GBuf, shape) -> bool:
    """Whether lazy ``g`` may be read broadcast to ``shape`` as its own expression: a small
    elementwise one without a pending matmul, whose shape broadcasts to ``shape`` (its leaves
    are then read with the strides of ``shape``: broadcasting right-aligned composes)."""
    nd = g.expr
    if nd.kind != "op" or nd.bounds is None or len(g.shape) > len(shape):
        return False
    nodes, _, mms = nd.bounds
    if nodes > INLINE_BROADCAST_NODES or mms:
        return False
    return all(a == 1 or a == b for a, b in zip(g.shape[::-1], tuple(shape)[::-1]))


def realize(g: GBuf, wide: bool = True) -> GBuf:
    """Run the lazy expression of ``g`` (one dispatch) and make ``g`` a plain buffer.

    ``wide`` (the default, for the hand-written kernels): the buffer returned holds 4-byte
    elements. A lazy ``g`` is computed into 4-byte storage in place; a float16 ``g`` already in
    half storage is left as it is and a 4-byte contiguous copy of it returned (one fused
    dispatch). ``wide=False`` (views, fusion, reads): a lazy float16 ``g`` goes into half
    storage where ``rt.half`` is on. Either way ``g``'s values are the same."""
    nd = g.expr
    if nd is None:
        return _widened(g) if wide and is_half(g) else g
    if nd.kind == "mm" and nd.buf is not None:   # already run for another expression
        src = nd.buf
        g.storage, g.offset, g.strides, g.expr = src.storage, src.offset, src.strides, None
        return _widened(g) if wide and is_half(g) else g
    rt = g.rt
    n = g.size
    half = not wide and g.dtype is _dt.float16 and rt.half and nd.kind != "mm"
    storage = rt.alloc(storage_bytes(n, half), half=half)
    if n:
        if nd.kind == "mm":
            nd.value.launch(storage, None, None)
        else:
            _run(rt, nd, g.shape, g.dtype, storage)
    g.storage = storage
    g.offset = 0
    g.strides = contiguous_strides(g.shape)
    g.expr = None
    if nd.kind == "mm":
        nd.buf = g
    return g


def _widened(g: GBuf) -> GBuf:
    """A contiguous copy of half-stored ``g`` in 4-byte storage (one fused dispatch)."""
    return realize(GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g)))


def contiguous(g: GBuf, wide: bool = True) -> GBuf:
    """``g`` itself when it is a contiguous buffer, else a contiguous copy (one dispatch).
    ``wide``: as ``realize``'s (the buffer returned has 4-byte elements)."""
    if g.expr is None and g.is_contiguous() and not (wide and is_half(g)):
        return g
    if g.expr is None:
        c = GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g))
        c.bounds = g.bounds
        return realize(c, wide)
    return realize(g, wide)


def dense(g: GBuf, wide: bool = True) -> GBuf:
    """``g`` as a contiguous buffer starting at element 0 (for kernels that take no offset).
    ``wide``: as ``realize``'s."""
    g = realize(g, wide)  # in place: a lazy tensor used twice (a weight, say) is computed once
    if g.offset == 0 and g.is_contiguous():
        return g
    return realize(GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g)), wide)


ROW = "row"     # Program.leaf_direct's third value: a contiguous vector along the output's last axis


def _leaf_form(g: GBuf, shape) -> object:
    """How a fused kernel reads input ``g`` broadcast to ``shape``: True, element i (same shape,
    contiguous); ROW, element ``i % shape[-1]`` (a vector along the last axis broadcast over the
    others: a bias; only its offset word is written); False, through strides."""
    if tuple(g.shape) == tuple(shape) and g.is_contiguous():
        return True
    if len(shape) >= 2 and shape[-1] > 1 and leaf_strides(g, shape) == (0,) * (len(shape) - 1) + (1,):
        return ROW
    return False


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


def run_into(rt, g: GBuf, storage, offset: int, strides) -> None:
    """Write the values of ``g`` (lazy or a view) into ``storage`` at element ``offset`` with
    element ``strides`` (a region of a larger buffer: concat, pad)."""
    expr = g.expr if g.expr is not None else Node("leaf", g.dtype, buf=g)
    if g.size:
        _run(rt, expr, g.shape, g.dtype, storage, (offset, tuple(strides)))


class Program:
    """An expression compiled against an output shape: its structural signature (the pipeline
    cache key), its input buffers, constants, and the WGSL that computes it at flat output
    index ``i``. ``acc``: an ``mm`` node whose value arrives as the variable ``acc`` (a matmul
    epilogue) instead of being read."""

    def __init__(self, root, shape, acc=None, order=None):
        self.shape = tuple(shape)
        self.leaves: list = []
        self.leaf_direct: list = []
        self.consts: list = []
        self.ops = 0
        leaf_ids: dict = {}
        ids: dict = {}
        sig: list = []
        for nd in (_post_order(root) if order is None else order):
            k = len(sig)
            ids[id(nd)] = k
            if nd is acc:
                sig.append(("A",))
            elif nd.kind == "leaf" or nd.kind == "mm":
                gb = nd.buf
                j = leaf_ids.get(id(gb))
                if j is None:
                    j = len(self.leaves)
                    leaf_ids[id(gb)] = j
                    self.leaves.append(gb)
                    self.leaf_direct.append(_leaf_form(gb, self.shape))
                sig.append(("L", j, storage_type(gb), self.leaf_direct[j]))
            elif nd.kind == "const":
                self.consts.append((nd.value, nd.dtype))
                sig.append(("C", len(self.consts) - 1, wgsl_type(nd.dtype)))
            else:
                self.ops += 1
                sig.append(("O", nd.name, nd.dtype.name, tuple(a.dtype.name for a in nd.args),
                            tuple(ids[id(a)] for a in nd.args), nd.attrs))
        self.result = ids[id(root)]
        self.sig = tuple(sig)

    def words(self, out_view=None) -> list:
        """Uniform words: n, output shape, [output view], per input its offset (+ strides when
        it is not read contiguously), the constants. Records where each starts."""
        shape = self.shape
        words = [prod(shape)] + list(shape)
        if out_view is not None:
            words.append(out_view[0])
            words.extend(out_view[1])
        self.leaf_word = []
        for j, gb in enumerate(self.leaves):
            self.leaf_word.append(len(words))
            words.append(gb.offset)
            if self.leaf_direct[j] is False:     # (True and ROW: the offset word alone)
                words.extend(leaf_strides(gb, shape))
        self.const_word = []
        for value, dt in self.consts:
            self.const_word.append(len(words))
            words.append(_const_bits(value, dt))
        return words

    def code(self, base: int, first_binding: int, strided_out: bool = False, chunk_word=None):
        """(binding declarations, statements computing v<k>, name of the result) with the
        uniform words starting at word ``base`` and the inputs at ``first_binding``.
        ``chunk_word``: the word holding the first output element of this chunk (a chunked
        run: ``i`` counts from the chunk's start, strided inputs index by the global element)."""
        rank = len(self.shape)
        bindings = [f"@group(0) @binding({first_binding + j}) var<storage, read> in{j}: array<{storage_type(gb)}>;"
                    for j, gb in enumerate(self.leaves)]
        lines = []
        full = strided_out or any(f is False for f in self.leaf_direct)
        if full:
            # multi-index of output element i, innermost last
            lines.append("  var rem = i;" if chunk_word is None else f"  var rem = i + u({base + chunk_word}u);")
            for d in range(rank - 1, -1, -1):
                lines.append(f"  let d{d} = i32(rem % u({base + 1 + d}u)); rem = rem / u({base + 1 + d}u);")
        elif ROW in self.leaf_direct:
            # only row vectors are broadcast: the last index alone (one remainder, where the full
            # multi-index costs a division and a remainder per axis, e.g. a bias in an epilogue)
            i0 = "i" if chunk_word is None else f"(i + u({base + chunk_word}u))"
            lines.append(f"  let d{rank - 1} = i32({i0} % u({base + rank}u));")
        for k, e in enumerate(self.sig):
            if e[0] == "A":
                lines.append(f"  let v{k} = acc;")
            elif e[0] == "L":
                j = e[1]
                w = base + self.leaf_word[j]
                if self.leaf_direct[j] is ROW:
                    idx = f"u32(s({w}u) + d{rank - 1})"
                elif self.leaf_direct[j]:
                    idx = f"u({w}u) + i"
                else:
                    terms = " + ".join(f"d{d} * s({w + 1 + d}u)" for d in range(rank)) or "0"
                    idx = f"u32(s({w}u) + {terms})"
                load = f"in{j}[{idx}]"
                lines.append(f"  let v{k} = f32({load});" if e[2] == "f16" else f"  let v{k} = {load};")
            elif e[0] == "C":
                w = base + self.const_word[e[1]]
                val = {"f32": f"bitcast<f32>(u({w}u))", "i32": f"s({w}u)", "u32": f"u({w}u)"}[e[2]]
                lines.append(f"  let v{k} = {val};")
            else:
                _, name, out_name, in_names, args, attrs = e
                expr = OPS_WGSL[name]([f"v{a}" for a in args], [_dt.get(x) for x in in_names],
                                      _dt.get(out_name), attrs)
                lines.append(f"  let v{k} = {_wrap(expr, _dt.get(out_name))};")
        return bindings, lines, f"v{self.result}"


def _post_order(root) -> list:
    """The nodes of an expression DAG, each once, inputs before users. Recursive (twice as fast
    as the explicit stack on the small expressions fusion builds); a very deep one falls back
    to ``_post_order_stack``, which gives the same order."""
    order: list = []
    try:
        _visit(root, set(), order.append)
    except RecursionError:
        return _post_order_stack(root)
    return order


def _visit(nd, seen, append) -> None:
    # (a module function, not a closure: a self-referencing closure is a reference cycle that
    # would keep the expression's buffers alive until the garbage collector runs, and the
    # pool's reuse of buffers, hence the cached bind groups, would depend on when it does)
    seen.add(id(nd))
    if nd.kind != "mm" or nd.buf is None:
        for a in nd.args:
            if id(a) not in seen:
                _visit(a, seen, append)
    append(nd)


def _post_order_stack(root) -> list:
    """``_post_order`` with an explicit stack (no recursion)."""
    order = []
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
        args = () if nd.kind == "mm" and nd.buf is not None else nd.args
        for a in reversed(args):
            if id(a) not in seen:
                stack.append((a, False))
    return order


def _run(rt, root, shape, dtype, storage, out_view=None) -> None:
    n = prod(shape)
    order = _post_order(root)     # (running pending matmuls first leaves the node set as it is)
    acc = _prepare_matmuls(root, shape, dtype, out_view, order)
    prog = Program(root, shape, acc, order)
    words = prog.words(out_view)
    if acc is not None:
        acc.value.launch(storage, prog, words)     # the matmul, with this expression as epilogue
        rt.stats["fused_epilogues"] += 1
        rt.stats["fused_ops"] += prog.ops
        return
    mb = rt.max_binding
    half = storage.half
    nb = max(4, storage_bytes(n, half))
    if (nb if out_view is None else storage.nbytes) > mb or any(gb.storage.nbytes > mb for gb in prog.leaves):
        _run_chunked(rt, prog, words, shape, dtype, storage, out_view)
        return
    info_n = max(1, (len(words) + 3) // 4)
    key = ("fused", len(shape), dtype.name, prog.sig, out_view is not None, half)
    pipe = rt.pipeline(key, lambda: _source(prog, dtype, info_n, out_view is not None, half=half))
    bufs = [(storage.buf, 0, storage.nbytes if out_view is not None else nb)]
    bufs += [(gb.storage.buf, 0, gb.storage.nbytes) for gb in prog.leaves]
    from .driver import grid_1d

    rt.stats["fused_kernels"] += 1
    rt.stats["fused_ops"] += prog.ops
    rt.dispatch(pipe, bufs, pack_info(words, info_n * 4), grid_1d((n + WG - 1) // WG, rt.max_groups))


def _digits(x: int, shape) -> list:
    out = []
    for n in reversed(shape):
        out.append(x % n)
        x //= n
    return out[::-1]


def _leaf_range(gb, st, shape, s: int, e: int) -> tuple:
    return _range(gb.offset, st, shape, s, e)


def _range(offset: int, st, shape, s: int, e: int) -> tuple:
    """(lowest, highest) element that output elements [s, e) touch at ``offset`` + strides
    ``st``: the axes before the first one whose index changes over the range are fixed, that
    one spans its two end indices, the ones after it their whole extent."""
    lo = hi = offset
    a, b = _digits(s, shape), _digits(e - 1, shape)
    varying = False
    for d, n in enumerate(shape):
        if varying:
            i0, i1 = 0, n - 1
        else:
            i0, i1 = a[d], b[d]
            varying = i0 != i1
        x, y = i0 * st[d], i1 * st[d]
        lo += min(x, y)
        hi += max(x, y)
    return lo, hi


def _run_chunked(rt, prog, words, shape, dtype, storage, out_view) -> None:
    """Run an elementwise kernel whose output or inputs pass ``rt.max_binding`` in chunks of the
    output: each chunk binds the window of every buffer it touches (offsets aligned to
    ``minStorageBufferOffsetAlignment``; the rest of the offset goes into the uniforms)."""
    from .driver import grid_1d

    n = prod(shape)
    mb = rt.max_binding
    align = max(int(rt.limits["min_storage_buffer_offset_alignment"]), 16)   # bytes
    half = storage.half
    A = align // elem_bytes(storage)   # elements: chunks of the output start at aligned offsets
    cap = mb // 4                                     # elements one binding may hold
    strided = [None if prog.leaf_direct[j] is True else leaf_strides(gb, shape) for j, gb in enumerate(prog.leaves)]

    def windows(s, e):
        out = []
        for j, gb in enumerate(prog.leaves):
            if strided[j] is None:
                lo, hi = gb.offset + s, gb.offset + e - 1
            else:
                lo, hi = _leaf_range(gb, strided[j], shape, s, e)
            base, size = binding_window(gb.storage, lo, hi, align)
            out.append((base, size, (gb.offset + s if strided[j] is None else gb.offset) - base))
        if out_view is None:
            out.append((s, max(4, storage_bytes(e - s, half)), 0))
        else:       # a region of a larger buffer (concat, pad): the window the chunk writes
            lo, hi = _range(out_view[0], out_view[1], shape, s, e)
            base, size = binding_window(storage, lo, hi, align)
            out.append((base, size, out_view[0] - base))
        return out

    chunk = max((cap - A) // A * A, A)
    plan = []
    s = 0
    while s < n:
        e = min(n, s + chunk)
        win = windows(s, e)
        if any(w[1] > mb for w in win):
            if chunk <= A:
                big = max(w[1] for w in win)
                raise rt.limit_error(big, "a tensor read or written through strides spans more than one binding")
            chunk = max(chunk // 2 // A * A, A)
            continue
        plan.append((s, e, win))
        s = e
    chunk_word = len(words)
    info_n = max(1, (len(words) + 1 + 3) // 4)
    strided_out = out_view is not None
    key = ("fused", len(shape), dtype.name, prog.sig, strided_out, "chunked", half)
    pipe = rt.pipeline(key, lambda: _source(prog, dtype, info_n, strided_out, chunk_word, half))
    for s, e, win in plan:
        w = list(words)
        w[0] = e - s
        for j, (_, _, off) in enumerate(win[:-1]):
            w[prog.leaf_word[j]] = off
        if strided_out:
            w[1 + len(shape)] = win[-1][2]
        w.append(s)
        base, size, _ = win[-1]
        bufs = [(storage.buf, base * elem_bytes(storage), size)]
        bufs += [(gb.storage.buf, base * elem_bytes(gb.storage), size)
                 for gb, (base, size, _) in zip(prog.leaves, win)]
        rt.stats["fused_kernels"] += 1
        rt.stats["fused_ops"] += prog.ops
        rt.dispatch(pipe, bufs, pack_info(w, info_n * 4), grid_1d((e - s + WG - 1) // WG, rt.max_groups))


def _prepare_matmuls(root, shape, dtype, out_view, nodes=None):
    """The pending matmul (``mm`` node) of ``root`` that can run with ``root`` as its epilogue,
    after running every other pending matmul of it on its own (their results become inputs).
    A matmul fuses only when nothing else can still need its plain result: the tensor it
    returned and every other lazy tensor built on it are gone (else fusing would compute it
    twice)."""
    nodes = _post_order(root) if nodes is None else nodes
    pending = [nd for nd in nodes if nd.kind == "mm" and nd.buf is None]
    if not pending:
        return None
    inputs = {id(nd.buf) for nd in nodes if nd.kind == "leaf"}
    fuse = None
    if (len(pending) == 1 and _FUSION[0] and out_view is None and wgsl_type(dtype) == "f32"
            and pending[0].value.epilogue_ok and tuple(pending[0].value.shape) == tuple(shape)
            and len(inputs) + 5 <= pending[0].value.rt.max_storage
            and not pending[0].value.needs_chunks()
            and all(nd.buf.storage.nbytes <= pending[0].value.rt.max_binding
                    for nd in nodes if nd.kind == "leaf")):
        nd = pending[0]
        owner = nd.attrs[0]()
        others = [g for g in (r() for r in nd.attrs[1]) if g is not None and g.expr is not root]
        if owner is None and not others and nd is not root and not (
                _HEAVY_OFF and any(n.kind not in ("leaf", "mm", "const") and n.name in _HEAVY for n in nodes)):
            fuse = nd
    for nd in pending:
        if nd is not fuse:
            materialize(nd)
    return fuse


def materialize(nd) -> GBuf:
    """Run a pending matmul node on its own; its result becomes an ordinary input."""
    if nd.buf is None:
        owner = nd.attrs[0]()
        if owner is not None and owner.expr is nd:
            realize(owner)                       # sets nd.buf
        else:
            plan = nd.value
            st = plan.rt.alloc(prod(plan.shape) * 4)
            plan.launch(st, None, None)
            nd.buf = GBuf(plan.rt, plan.shape, nd.dtype, storage=st)
    return nd.buf


def lazy_matmul(rt, plan, dtype) -> GBuf:
    """A tensor whose value is ``plan`` (a matmul, ``ember.webgpu.linalg``), run at the next
    materialisation point, possibly with the elementwise ops that consume it as its epilogue."""
    nd = Node("mm", dtype, name="matmul", value=plan)
    g = GBuf(rt, plan.shape, dtype, expr=nd)
    nd.attrs = (weakref.ref(g), [])          # (the returned tensor, the lazy tensors built on it)
    return g


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


def _source(prog: Program, dtype, info_n: int, strided_out: bool, chunk_word=None, half=False) -> str:
    bindings, lines, res = prog.code(0, 1, strided_out, chunk_word)
    if half:       # (the value is a float16 one already, so the narrowing is exact)
        res = f"f16({res})"
    if strided_out:
        w = 1 + len(prog.shape)
        terms = "".join(f" + d{d} * s({w + 1 + d}u)" for d in range(len(prog.shape)))
        lines.append(f"  out[u32(s({w}u){terms})] = {res};")
    else:
        lines.append(f"  out[i] = {res};")
    return render(kernel_source("fused"), {
        "OUT_T": "f16" if half else wgsl_type(dtype), "BINDINGS": "\n".join(bindings), "INFO_BINDING": len(prog.leaves) + 1,
        "INFO": info_n, "HELPERS": kernel_source("elementwise"), "WG": WG, "BODY": "\n".join(lines)})


def epilogue_source(prog: Program, base: int, first_binding: int) -> tuple:
    """(WGSL for a matmul kernel's ``{{EPILOGUE}}``, number of extra bindings): the expression
    ``prog`` as ``fn epilogue(acc, i)``, its inputs bound from ``first_binding``."""
    bindings, lines, res = prog.code(base, first_binding)
    fn = "fn epilogue(acc: f32, i: u32) -> f32 {\n" + "\n".join(lines) + f"\n  return {res};\n}}"
    return "\n".join(bindings) + "\n" + kernel_source("elementwise") + "\n" + fn, len(prog.leaves)


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
    ember's cast rules (float -> int truncates and saturates, NaN -> 0; int -> int wraps;
    anything -> bool is != 0, NaN included)."""
    ts, td = wgsl_type(src), wgsl_type(dst)
    if dst is _dt.bool_:
        if src is _dt.bool_:
            return x
        if ts == "f32":
            return f"select(0u, 1u, ne_f32({x}, 0.0))"
        zero = {"i32": "0", "u32": "0u"}[ts]
        return f"select(0u, 1u, {x} != {zero})"
    if ts == td:
        return x
    if td == "f32":
        return f"f32({x})"
    if td == "i32":
        return f"f32_to_i32({x})" if ts == "f32" else f"i32({x})"
    # u32 (uint8)
    if ts == "f32":
        return f"f32_to_u8({x})"
    return f"(bitcast<u32>({x}) & 0xffu)"


def _conv_all(args, ins, dt):
    return [convert(a, d, dt) for a, d in zip(args, ins)]


def _promoted(ins):
    t = ins[0]
    for d in ins[1:]:
        t = _dt.result_type(t, d)
    return t


def _by_type(f32=None, i32=None, u32=None, *, inputs="out"):
    """An op whose code depends on the storage type: ``inputs`` says which dtype the arguments
    are converted to first ("out": the output's, "promoted": the inputs' common one, "float":
    float32 for ints)."""
    table = {"f32": f32, "i32": i32, "u32": u32}

    def f(args, ins, out, attrs):
        if inputs == "out":
            dt = out
        elif inputs == "float":
            dt = out if out.kind == "f" else _dt.float32
        else:
            dt = _promoted(ins)
        code = table[wgsl_type(dt)]
        if code is None:
            raise UnsupportedOp(f"webgpu: no {wgsl_type(dt)} code for this op")
        cv = _conv_all(args, ins, dt)
        return code.format(*cv, **dict(attrs))
    return f


def _float(code):
    return _by_type(f32=code, inputs="float")


def _compare(op, fop=None):
    fop = fop or f"({{0}} {op} {{1}})"
    return _by_type(f32=f"select(0u, 1u, {fop})", i32=f"select(0u, 1u, ({{0}} {op} {{1}}))",
                    u32=f"select(0u, 1u, ({{0}} {op} {{1}}))", inputs="promoted")


def _where(args, ins, out, attrs):
    c, a, b = args
    return f"select({convert(b, ins[2], out)}, {convert(a, ins[1], out)}, {c} != 0u)"


def _cast(args, ins, out, attrs):
    return convert(args[0], ins[0], out)


def _gelu(args, ins, out, attrs):
    x = convert(args[0], ins[0], _dt.float32)
    return f"gelu_tanh_f32({x})" if dict(attrs).get("approximate") == "tanh" else f"gelu_f32({x})"


OPS_WGSL: dict = {
    "cast": _cast,
    "_cast": _cast,
    "negative": _by_type("(-{0})", "(-{0})", "(0u - {0})"),
    "abs": _by_type("abs({0})", "abs({0})", "{0}"),
    "exp": _float("exp_f32({0})"),
    "log": _float("log_f32({0})"),
    "sqrt": _float("sqrt_f32({0})"),
    "sin": _float("sin_f32({0})"),
    "cos": _float("cos_f32({0})"),
    "tanh": _float("tanh_f32({0})"),
    "erf": _float("erf_f32({0})"),
    "sign": _by_type("sign_f32({0})", "sign_i32({0})", "select(0u, 1u, {0} > 0u)"),
    "floor": _by_type("floor({0})", "{0}", "{0}"),
    "ceil": _by_type("ceil({0})", "{0}", "{0}"),
    "round": _by_type("round({0})", "{0}", "{0}"),   # WGSL round() is half-to-even, like numpy
    "isnan": _by_type("select(0u, 1u, is_nan({0}))", "0u", "0u", inputs="promoted"),
    "isinf": _by_type("select(0u, 1u, is_inf({0}))", "0u", "0u", inputs="promoted"),
    "isfinite": _by_type("select(1u, 0u, is_inf({0}) || is_nan({0}))", "1u", "1u", inputs="promoted"),
    "logical_not": _by_type(u32="(1u - {0})"),
    "add": _by_type("({0} + {1})", "({0} + {1})", "({0} + {1})"),
    "subtract": _by_type("({0} - {1})", "({0} - {1})", "({0} - {1})"),
    "multiply": _by_type("({0} * {1})", "({0} * {1})", "({0} * {1})"),
    "divide": _float("div_f32({0}, {1})"),
    "floor_divide": _by_type("floordiv_f32({0}, {1})", "floordiv_i32({0}, {1})",
                             "select({0} / max({1}, 1u), 0u, {1} == 0u)"),
    "remainder": _by_type("mod_f32({0}, {1})", "mod_i32({0}, {1})", "select({0} % max({1}, 1u), 0u, {1} == 0u)"),
    "pow": _by_type("pow_f32({0}, {1})", "pow_i32({0}, {1})", "pow_u32({0}, {1})"),
    "maximum": _by_type("max_f32({0}, {1})", "max({0}, {1})", "max({0}, {1})"),
    "minimum": _by_type("min_f32({0}, {1})", "min({0}, {1})", "min({0}, {1})"),
    "equal": _compare("=="),
    "not_equal": _compare("!=", "ne_f32({0}, {1})"),
    "less": _compare("<"),
    "less_equal": _compare("<="),
    "greater": _compare(">"),
    "greater_equal": _compare(">="),
    "logical_and": _by_type(u32="({0} & {1})"),
    "logical_or": _by_type(u32="({0} | {1})"),
    "logical_xor": _by_type(u32="({0} ^ {1})"),
    "where": _where,
    # composites whose decomposition would take several nodes (or lose accuracy)
    "reciprocal": _float("div_f32(1.0, {0})"),
    "rsqrt": _float("div_f32(1.0, sqrt_f32({0}))"),
    "square": _by_type("({0} * {0})", "({0} * {0})", "({0} * {0})"),
    # relu keeps NaN; written so no compiler can turn it into fmax(x, 0), which drops NaN
    # (an NVIDIA Vulkan driver did)
    "relu": _by_type("select({0}, 0.0, bitcast<i32>({0}) < 0 && !is_nan({0}))", "max({0}, 0)", "{0}"),
    "leaky_relu": _float("select({0}, {0} * {1}, {0} < 0.0)"),
    "sigmoid": _float("sigmoid_f32({0})"),
    "silu": _float("({0} * sigmoid_f32({0}))"),
    "gelu": _gelu,
    "clip": _by_type("min_f32(max_f32({0}, {1}), {2})", "min(max({0}, {1}), {2})", "min(max({0}, {1}), {2})"),
}
