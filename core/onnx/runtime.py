"""Load an ONNX model at run time and call it: ``ember.onnx.load``.

How a model is loaded (no ``onnx`` package, no numpy: this runs in Pyodide):

1. ``proto.parse_model`` decodes the protobuf; initializers become tensors (small integer and
   shape-like ones on the ``"python"`` device, the rest on the model's device).
2. The graph is *traced* once with placeholder inputs on a data-less ``"meta"`` device: every
   node runs its handler from the one op table (``ember.onnx.ops``), which checks attributes,
   dtypes and shapes now, at load time, so an unsupported op or attribute fails before the
   first call. Nodes whose inputs are all known run for real: constant subgraphs (the
   ``Shape -> Gather -> Concat -> Reshape`` chains exporters write) are folded once.
3. Graphs with symbolic dimensions (``batch``, ``seq``) are traced twice with different sizes;
   only values equal in both traces *and* computed from nothing an input gives (its values, its
   symbolic dims; ``_dependence``) are folded, so the model keeps working for any size.
   At run time, calls on constants only run once per set of arguments (``RunCtx.call``): no
   value derived from one call's inputs is reused for another.
4. ``model(...)`` runs the remaining nodes in order on the model's device.

>>> import ember, ember.onnx
>>> from ember.onnx.testing import tiny_model
>>> m = ember.onnx.load(tiny_model())               # y = relu(x + 1)
>>> m(ember.tensor([[-3.0, 0.5]])).tolist()
[[0.0, 1.5]]
>>> m.input_names, m.output_names
(['x'], ['y'])
"""
from __future__ import annotations

import os
import warnings
from math import prod

from ..backends import default_device, get_backend
from ..backends.meta import NeedsData  # noqa: F401  (raised by handlers via this module)
from ..errors import DTypeError, EmberError, OnnxError, ShapeError, UnsupportedOp
from ..tensor import Tensor
from ..tensor import from_numpy as _from_numpy
from ..tensor import tensor as _tensor
from . import proto
from .proto import EMBER_DTYPES as _EMBER_DTYPES
from .budget import Budget, estimate_work

FOLD_LIMIT = 1 << 22      # folded constants larger than this (elements) are left to run time
HOST_LIMIT = 64           # constants this small stay on the "python" device (shape arithmetic)
HOST = "python"
_MAX_VALUES = 1 << 16     # values a handler reads from a tensor input (shape, axes, pads, ...)


# ---- the meta device (ember.backends.meta): shapes and dtypes only ----------------------------

def meta_like(t: Tensor) -> Tensor:
    return t if t.device == "meta" else Tensor._wrap(None, t.shape, t.dtype, "meta")


class _DeviceMarker:
    """Passed as ``device=DEVICE`` by handlers that create tensors: the model's device."""

    def __repr__(self):
        return "DEVICE"


DEVICE = _DeviceMarker()
_REQUIRED = object()
_MISSING = object()
UNKNOWN = type("Unknown", (), {"__repr__": lambda s: "UNKNOWN"})()


def _tensors(args):
    for a in args:
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    yield b


def _map_tensors(args, f):
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(f(a))
        elif isinstance(a, (list, tuple)) and any(isinstance(b, Tensor) for b in a):
            out.append(type(a)(f(b) if isinstance(b, Tensor) else b for b in a))
        else:
            out.append(a)
    return out


# ---- what an op handler sees ------------------------------------------------------------------

class Ctx:
    """The context an op handler gets: the node's attributes, its opset, and ``call`` to run
    ember functions (the only way a handler computes, so the code generator can record it)."""

    tracing = False
    read_ids = None     # while tracing: ids of the tensors whose values a handler read

    def __init__(self, node, opset, device):
        self.node = node
        self.opset = opset
        self.device = device
        self.used = set()
        self.scope = {}         # the values visible to subgraphs (If/Loop/Scan bodies)
        self.opsets = {"ai.onnx": opset}
        self.budget = None      # the load's or the call's work budget (ember.onnx.budget)

    def iterations(self, n: int = 1, what: str = "iterations", body=None) -> bool:
        """Take ``n`` Loop/Scan iterations of subgraph ``body`` from the budget: False while
        tracing when they do not fit (the caller leaves the loop to run time), an OnnxError naming
        the node at run time."""
        if self.budget is None:
            self.budget = Budget()
        return self.budget.iterations(n, self.tracing, self.where(), what, len(body.nodes) if body is not None else 0)

    # subgraphs -----------------------------------------------------------------------------------
    def _subgraph_constant(self, t):
        return tensor_from_proto(t, const_device(t.dims, None, self.device), what=f"initializer {t.name!r}")

    def child(self, node, opset):
        """A context of the same kind for a node of a subgraph."""
        raise NotImplementedError

    def run_graph(self, g, bindings: dict):
        """Run subgraph ``g`` (a GraphProto attribute) with its inputs bound to ``bindings`` and
        the enclosing graph's values in scope; return its outputs as a tuple."""
        from collections import ChainMap
        from .ops import resolve

        local = dict(bindings)
        for t in g.initializers:
            local[t.name] = self._subgraph_constant(t)
        env = ChainMap(local, self.scope)     # what nested subgraphs see
        outer = self.scope
        rec = getattr(self, "recorder", None)
        for node in g.nodes:
            handler, opset = resolve(node, self.opsets)
            sub = self.child(node, opset)
            sub.scope = env
            sub.opsets = self.opsets
            sub.budget = self.budget
            ins = []
            for name in node.inputs:
                if not name:
                    ins.append(None)
                    continue
                v = local.get(name, _MISSING)       # (a plain dict first: Loop bodies run this a lot)
                if v is _MISSING:
                    v = outer.get(name, _MISSING)
                    if v is _MISSING:
                        raise OnnxError(f"{self.where()}: subgraph node {node.label} reads {name!r}, which is "
                                        f"not defined in the subgraph or the enclosing graph")
                    if rec is not None and isinstance(v, Tensor) and id(v) not in rec.known:
                        rec.known[id(v)] = (v, rec._v(name))       # an enclosing graph's value
                if v is UNKNOWN:
                    raise NeedsData(name)
                ins.append(v)
            if self.tracing:
                outs = run_handler(handler, sub, ins)
                sub.check_all_attributes_read()
            else:
                outs = run_checked(handler, sub, ins)
            for name, v in zip(node.outputs, outs):
                if name:
                    local[name] = v
        missing = [o.name for o in g.outputs if o.name not in env]
        if missing:
            raise OnnxError(f"{self.where()}: subgraph outputs {missing} are not produced")
        return tuple(env[o.name] for o in g.outputs)

    # attributes ----------------------------------------------------------------------------------
    def attr(self, name, default=_REQUIRED):
        self.used.add(name)
        a = self.node.attrs.get(name)
        if a is None or a.value is None:
            if a is not None and a.ref_attr_name:
                self.unsupported(f"attribute {name!r} refers to a function attribute ({a.ref_attr_name!r})")
            if default is _REQUIRED:
                raise OnnxError(f"{self.where()}: required attribute {name!r} is missing")
            return default
        return a.value

    def i(self, name, default=_REQUIRED) -> int:
        v = self.attr(name, default)
        if v is not None and not isinstance(v, int):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be an int, got {v!r}")
        return v

    def f(self, name, default=_REQUIRED) -> float:
        v = self.attr(name, default)
        if isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if v is not None and not isinstance(v, float):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be a float, got {v!r}")
        return v

    def s(self, name, default=_REQUIRED) -> str:
        v = self.attr(name, default)
        if v is not None and not isinstance(v, str):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be a string, got {v!r}")
        return v

    def ints_attr(self, name, default=_REQUIRED):
        v = self.attr(name, default)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, int) for x in v)):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be a list of ints, got {v!r}")
        return v

    def floats_attr(self, name, default=_REQUIRED):
        v = self.attr(name, default)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be a list of floats, got {v!r}")
        return None if v is None else [float(x) for x in v]

    def tensor_attr(self, name, default=_REQUIRED):
        """A TENSOR attribute as a tensor on the ``"python"`` device."""
        v = self.attr(name, default)
        if v is None or isinstance(v, Tensor):
            return v
        if not isinstance(v, proto.TensorProto):
            raise OnnxError(f"{self.where()}: attribute {name!r} must be a tensor")
        return tensor_from_proto(v, HOST, what=f"{self.where()}: attribute {name!r}")

    # values --------------------------------------------------------------------------------------
    def _values(self, t, what):
        if t.size > _MAX_VALUES:     # shapes, axes, pads, scales: a few values, never millions
            raise OnnxError(f"{self.where()}: {what} has {t.size:,} values (shape {t.shape}); at most "
                            f"{_MAX_VALUES:,} are read for it")
        if self.read_ids is not None:
            self.read_ids.add(id(t))
        if t.device == "meta":
            raise NeedsData(what)
        from .functional import flat_values
        return flat_values(t)

    def ints(self, t, what="input"):
        """The values of a (small, integer) tensor as a list of Python ints; None stays None."""
        if t is None:
            return None
        if t.dtype.kind not in "iub":
            raise OnnxError(f"{self.where()}: {what} must be an integer tensor, got {t.dtype.name}")
        return [int(v) for v in self._values(t, what)]

    def floats(self, t, what="input"):
        return None if t is None else [float(v) for v in self._values(t, what)]

    def scalar(self, t, what="input"):
        """The single value of a one-element tensor as a Python int/float/bool."""
        if t is None:
            return None
        if t.size != 1:
            raise OnnxError(f"{self.where()}: {what} must have one element, got shape {t.shape}")
        return self._values(t, what)[0]

    def wants(self, i: int) -> bool:
        """Whether the node asks for its output ``i`` (optional outputs may be omitted)."""
        return i < len(self.node.outputs) and self.node.outputs[i] != ""

    # errors --------------------------------------------------------------------------------------
    def where(self) -> str:
        return f"ONNX node {self.node.label} ({self.node.op_type}, opset {self.opset})"

    def unsupported(self, what: str):
        raise UnsupportedOp(f"{self.where()}: {what} is not supported by ember")

    def check_all_attributes_read(self):
        """UnsupportedOp if the node carries an attribute its handler never read: nothing a model
        asks for is silently ignored."""
        unused = set(self.node.attrs) - self.used
        if unused:
            raise UnsupportedOp(f"{self.where()}: attribute(s) {', '.join(sorted(unused))} not supported by ember")

    def check(self, cond, what: str):
        if not cond:
            raise OnnxError(f"{self.where()}: {what}")

    # computing -----------------------------------------------------------------------------------
    def _harmonize(self, args, kw):
        devs = {t.device for t in _tensors(args)} | {t.device for t in _tensors(kw.values())}
        if len(devs) > 1:
            target = "meta" if "meta" in devs else next(d for d in devs if d != HOST)
            if target != "meta" and len(devs - {HOST, target}) > 0:
                raise OnnxError(f"{self.where()}: inputs on several devices {sorted(devs)}")
            move = self._mover(target)
            args = _map_tensors(args, move)
            kw = dict(zip(kw, _map_tensors(list(kw.values()), move)))
        return args, kw

    def _mover(self, target):
        if target == "meta":
            return meta_like
        return lambda t: t if t.device == target else t.to(target)

    def call(self, fn, *args, **kw):
        raise NotImplementedError


class RunCtx(Ctx):
    """Run time: call the ember function on real tensors (constants moved once and cached)."""

    def __init__(self, node, opset, device, model):
        super().__init__(node, opset, device)
        self.model = model
        self.seq = 0

    def child(self, node, opset):
        return RunCtx(node, opset, self.device, self.model)

    def _subgraph_constant(self, t):
        # decoded once per model (a Loop body runs many times), and known as a constant
        key = ("init", id(t))
        v = self.model._folded.get(key)
        if v is None:
            v = self.model._folded[key] = super()._subgraph_constant(t)
            self.model._const_ids.add(id(v))
        return v

    def _mover(self, target):
        cache = self.model._moved
        consts = self.model._const_ids

        def move(t):
            if t.device == target:
                return t
            if id(t) in consts:
                key = (id(t), target)
                m = cache.get(key)
                if m is None:
                    m = cache[key] = t.to(target)
                return m
            return t.to(target)
        return move

    def call(self, fn, *args, **kw):
        self.seq += 1
        for k, v in kw.items():
            if v is DEVICE:
                kw[k] = self.device
        ts = list(_tensors(args)) + list(_tensors(kw.values()))
        consts = self.model._const_ids
        # A computation on constants only (a weight transpose inside Gemm) runs once. Its other
        # arguments are part of what it computes: a handler passes sizes and indices it read
        # from this call's inputs (Expand of a constant to Shape(x), Slice of a buffer up to the
        # sequence length) as plain numbers, so the result is reused only for the very same
        # function and arguments. The first set of arguments is kept; a call with others runs
        # (onnxruntime recomputes them on every run) and its result is no constant.
        if ts and all(id(t) in consts for t in ts):
            key = (id(self.node), self.seq)      # node objects live as long as the model
            sig = _call_signature(fn, args, kw, consts)
            hit = self.model._folded.get(key)
            if hit is not None:
                if sig is not None and hit[0] == sig:
                    return hit[1]
                args, kw = self._harmonize(args, kw)
                return fn(*args, **kw)
            args, kw = self._harmonize(args, kw)
            out = fn(*args, **kw)
            if sig is None:          # arguments that cannot be compared (a tensor held deeper)
                return out
            self.model._folded[key] = (sig, out)
            # a constant too (kept alive by _folded): a chain of them left to run time by the
            # load's folding budget runs once, not on every call
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, Tensor):
                    consts.add(id(t))
            return out
        args, kw = self._harmonize(args, kw)
        return fn(*args, **kw)


def _call_signature(fn, args, kw, consts):
    """What a call on constant tensors computes from, as a comparable value: the function,
    the constants by identity (they live as long as the model) and every other argument by
    type and value. None when an argument holds a tensor that is no known constant."""
    def freeze(v):
        if isinstance(v, Tensor):
            if id(v) not in consts:
                raise LookupError
            return ("T", id(v))
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, tuple(freeze(x) for x in v))
        if isinstance(v, dict):
            return ("dict", tuple((k, freeze(x)) for k, x in v.items()))
        if isinstance(v, slice):
            return ("slice", freeze(v.start), freeze(v.stop), freeze(v.step))
        return (type(v), v)     # 1, 1.0 and True are different arguments
    try:
        return (fn, freeze(args), freeze(kw))
    except LookupError:
        return None


class TraceCtx(Ctx):
    """Load time: placeholder (meta) inputs, real constants. A call on real tensors only is
    folded (computed now) unless its result would be larger than ``FOLD_LIMIT`` elements."""

    tracing = True

    def __init__(self, node, opset, device, recorder=None):
        super().__init__(node, opset, device)
        self.recorder = recorder
        self.read_ids = set()

    def child(self, node, opset):
        c = TraceCtx(node, opset, self.device, self.recorder)
        c.read_ids = self.read_ids          # a subgraph's reads are its node's
        return c

    def call(self, fn, *args, **kw):
        rec = self.recorder
        pending = rec.render_call(fn, args, kw) if rec is not None else None
        args, kw = self._harmonize(args, kw)
        is_meta = any(t.device == "meta" for t in _tensors(args)) or \
            any(t.device == "meta" for t in _tensors(kw.values()))
        if is_meta:
            out = fn(*args, **{k: ("meta" if v is DEVICE else v) for k, v in kw.items()})
        else:
            # Size check on shapes first, so a model asking for a huge constant cannot stall loading.
            try:
                probe = fn(*_map_tensors(args, meta_like),
                           **{k: ("meta" if v is DEVICE else v) for k, v in
                              zip(kw, _map_tensors(list(kw.values()), meta_like))})
            except NeedsData:
                probe = None
            outs = probe if isinstance(probe, (tuple, list)) else (probe,)
            outs = [t for t in outs if isinstance(t, Tensor)]
            if probe is not None and (sum(t.size for t in outs) > FOLD_LIMIT or not self._fold_fits(fn, args, kw, outs)):
                out = probe
            else:
                out = fn(*args, **{k: (self.device if v is DEVICE else v) for k, v in kw.items()})
        if rec is not None:
            rec.bind(pending, out)
        return out

    def _fold_fits(self, fn, args, kw, outs) -> bool:
        """Whether computing ``fn`` now fits the load's folding budget (by estimated work, on the
        device it would run on); what does not is left to run time."""
        if self.budget is None:
            self.budget = Budget()
        ins = list(_tensors(args)) + list(_tensors(kw.values()))
        devs = {t.device for t in ins}
        dev = next(iter(devs)) if len(devs) == 1 else self.device
        return self.budget.fold(estimate_work(fn, ins, outs), dev)


_ARITY: dict = {}


def _arity(handler):
    """(fewest, most or None) node inputs ``handler(ctx, *inputs)`` accepts; None if unknown."""
    try:
        return _ARITY[handler]
    except (KeyError, TypeError):
        pass
    import inspect

    try:
        params = list(inspect.signature(handler).parameters.values())[1:]   # after ctx
    except (TypeError, ValueError):
        res = None
    else:
        pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var = any(p.kind is p.VAR_POSITIONAL for p in params)
        res = (sum(1 for p in pos if p.default is p.empty), None if var else len(pos))
    try:
        _ARITY[handler] = res
    except TypeError:
        pass
    return res


def run_handler(handler, ctx, inputs):
    """Call ``handler`` and return a tuple with one value per node output. A node with more or
    fewer inputs than its op takes is an OnnxError naming the node (a malformed graph that the
    load-time checks did not see), never a bare TypeError from the call."""
    ar = _arity(handler)
    if ar is not None:
        lo, hi = ar
        n_in = len(inputs)
        while n_in > lo and inputs[n_in - 1] is None:   # trailing optional inputs left out
            n_in -= 1
        if n_in < lo or (hi is not None and len(inputs) > hi and any(v is not None for v in inputs[hi:])):
            want = f"{lo}" if hi == lo else (f"{lo} to {hi}" if hi is not None else f"at least {lo}")
            raise OnnxError(f"ONNX node {ctx.node.label}: {ctx.node.op_type} takes {want} inputs, "
                            f"the graph gives {len(inputs)}")
        if hi is not None and len(inputs) > hi:
            inputs = inputs[:hi]
    out = handler(ctx, *inputs)
    if isinstance(out, list):
        out = tuple(out)
    elif not isinstance(out, tuple):
        out = (out,)
    n = len(ctx.node.outputs)
    if len(out) < n:
        ctx.unsupported(f"output {n - 1} (the op gives {len(out)} outputs)")
    return out[:n]


_HANDLER_SLIPS = (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, RecursionError,
                  AttributeError, MemoryError)


def run_checked(handler, ctx, inputs):
    """``run_handler`` at run time: an ember error gets the node's name in front, and anything
    else a handler trips over on a malformed node (a bare TypeError, IndexError, ...) becomes an
    OnnxError naming the node; a bare MemoryError becomes a ResourceError."""
    from ..errors import ResourceError
    node = ctx.node
    try:
        return run_handler(handler, ctx, inputs)
    except NeedsData:
        raise
    except EmberError as e:
        if str(e).startswith("ONNX node "):
            raise
        try:
            err = type(e)(f"ONNX node {node.label} ({node.op_type}): {e}")
        except TypeError:          # an error class with a different constructor
            raise e from None
        raise err from e
    except MemoryError as e:
        raise ResourceError(f"ONNX node {node.label} ({node.op_type}, opset {ctx.opset}): out of memory "
                            f"({str(e) or 'MemoryError'})") from e
    except _HANDLER_SLIPS as e:
        raise OnnxError(f"ONNX node {node.label} ({node.op_type}, opset {ctx.opset}): invalid node "
                        f"({type(e).__name__}: {e})") from e


# ---- tensors from the file ------------------------------------------------------------------

def tensor_from_proto(tp, device, base_dir=None, external_data=None, what=None) -> Tensor:
    data, shape, dt = proto.tensor_bytes(tp, base_dir, external_data, what)
    t = Tensor._wrap(get_backend(device).from_bytes(data, shape, dt), shape, dt, device)
    if tp.data_type in proto.WIDENED:        # int8/int16/uint16 read as int32: remember the range
        from .quant import tag_narrow
        tag_narrow(t, tp.data_type)
    return t


def const_device(t_shape, dtype, device) -> str:
    """Where a constant lives: small ones on the host (they feed shape arithmetic and are moved
    to the device, once, when a device op needs them), the rest on the model's device."""
    return HOST if prod(t_shape) <= HOST_LIMIT else device


# ---- analysis: trace, fold, classify ----------------------------------------------------------

class Analysis:
    """What loading learned about a graph: constant values, the nodes left to run, and (for the
    code generator) how each node's calls render."""

    def __init__(self):
        self.consts = {}        # value name -> Tensor (folded or initializer)
        self.plan = []          # nodes to run at call time, in order
        self.trace = {}         # value name -> traced value (meta/real/UNKNOWN) from the main trace
        self.trace_b = None
        self.templates = {}     # node index -> rendered lines (codegen) or None (use generic form)
        self.symbols = {}       # symbol name -> value used in the main trace
        self.notes = []


def _symbol_sizes(graph, input_shapes, base):
    """Placeholder sizes for symbolic input dims: distinct small primes (so a shape comment can
    name them), ``base`` shifts them for the second trace."""
    names = []
    for vi in graph.inputs:
        if vi.name in input_shapes or vi.shape is None:
            continue
        for ax, d in enumerate(vi.shape):
            if not isinstance(d, int) or d < 0:
                key = d if isinstance(d, str) else f"{vi.name}:{ax}"
                if key not in names:
                    names.append(key)
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
    if base == "ones":
        return {n: 1 for n in names}
    if base == "ones+1":
        return {n: 2 for n in names}
    out = {}
    for i, n in enumerate(names):
        p = primes[i % len(primes)] + (i // len(primes)) * 53
        out[n] = p + (1 if base == "b" else 0)
    return out


def _input_meta(vi, sizes, input_shapes, what):
    if vi.name in input_shapes:
        shape = tuple(int(s) for s in input_shapes[vi.name])
    elif vi.shape is None:
        return UNKNOWN
    else:
        shape = tuple(d if isinstance(d, int) and d >= 0 else
                      sizes[d if isinstance(d, str) else f"{vi.name}:{ax}"] for ax, d in enumerate(vi.shape))
        if None in shape:
            return UNKNOWN
    if vi.kind != "tensor":
        raise UnsupportedOp(f"{what} {vi.name!r}: ONNX {vi.kind} values are not supported (tensors only)")
    if vi.elem_type == 0:
        return UNKNOWN
    dt = proto.ember_dtype(vi.elem_type, f"{what} {vi.name!r}")
    t = Tensor._wrap(None, shape, dt, "meta")
    if vi.elem_type in proto.WIDENED:
        from .quant import tag_narrow
        tag_narrow(t, vi.elem_type)
    return t


def _node_error(node, opset, e):
    where = f"ONNX node {node.label} ({node.op_type}, opset {opset})"
    msg = str(e)
    if msg.startswith("ONNX node "):
        return e
    if isinstance(e, UnsupportedOp):
        return UnsupportedOp(f"{where}: {msg}")
    return OnnxError(f"{where}: {type(e).__name__}: {msg}")


def trace(graph, consts, opsets, device, sizes, input_shapes, recorder=None, reuse=None, budget=None, reads=None):
    """Run every node once on placeholder inputs. Returns ``(env, ran)``: the value of every
    name (Tensor or UNKNOWN) and the indices of nodes whose handler ran to the end. ``reuse``
    (a previous trace's env) skips recomputing nodes whose inputs are the very same objects.
    ``reads`` (a dict) gets, per node index, the input names whose values its handler read."""
    from .ops import resolve

    env = dict(consts)
    for vi in graph.inputs:
        if vi.name not in consts:
            env[vi.name] = _input_meta(vi, sizes, input_shapes, "graph input")
    ran = set()
    for node in graph.nodes:
        handler, opset = resolve(node, opsets)
        ins = []
        for name in node.inputs:
            if name == "":
                ins.append(None)
            elif name not in env:
                raise OnnxError(f"ONNX node {node.label} ({node.op_type}): input {name!r} is not produced by "
                                f"any earlier node, initializer or graph input (the graph is not sorted, or "
                                f"the name is wrong)")
            else:
                ins.append(env[name])
        if any(v is UNKNOWN for v in ins):
            for name in node.outputs:
                env[name] = UNKNOWN
            if recorder is not None:
                recorder.generic(node)
            continue
        if reuse is not None and all(reuse[0].get(n) is v for n, v in zip(node.inputs, ins) if n) \
                and node.index in reuse[1]:
            for name in node.outputs:
                if name:
                    env[name] = reuse[0][name]
            ran.add(node.index)
            if recorder is not None:
                recorder.skip(node, ins, [env[n] if n else None for n in node.outputs])
            continue
        ctx = TraceCtx(node, opset, device, recorder)
        ctx.scope = env
        ctx.opsets = opsets
        ctx.budget = budget
        if recorder is not None:
            recorder.begin(node, ins)
        try:
            outs = run_handler(handler, ctx, ins)
        except NeedsData:
            for name in node.outputs:
                env[name] = UNKNOWN
            if recorder is not None:
                recorder.generic(node)
            continue
        except EmberError as e:
            raise _node_error(node, opset, e) from e
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError,
                RecursionError, MemoryError, AttributeError) as e:
            # A handler tripping over a malformed node: report it as a malformed model.
            raise OnnxError(f"ONNX node {node.label} ({node.op_type}, opset {opset}): invalid node "
                            f"({type(e).__name__}: {e})") from e
        ctx.check_all_attributes_read()
        if reads is not None and ctx.read_ids:
            reads[node.index] = {n for n, v in zip(node.inputs, ins) if n and id(v) in ctx.read_ids} | \
                {n for n in _subgraph_reads(_one_node_graph(node)) if id(env.get(n)) in ctx.read_ids}
        for name, v in zip(node.outputs, outs):
            if name:
                if v is None:
                    raise OnnxError(f"ONNX node {node.label} ({node.op_type}): output {name!r} is not produced")
                env[name] = v
        ran.add(node.index)
        if recorder is not None:
            recorder.end(node, outs)
    return env, ran


# ---- what depends on the inputs ----------------------------------------------------------------
#
# The two traces fold values equal at both placeholder sizes, which is not proof that they do not
# depend on the sizes: ``H // 8`` is 0 at H = 2 and H = 3, a comparison of the sequence length
# with 512 is False at both. So a value is folded only if, besides, nothing it is computed from
# comes from an input: an input's values, or a symbolic dimension of it (declared fixed dims
# are checked when the model is called, so they are constants). Shape arithmetic is followed
# element by element (``Shape(x)[2]`` of an input whose last dim is fixed folds; ``Shape(x)[0]``
# of a symbolic batch does not); every other op depends on all of its inputs.

_DEP_SHAPE_OPS = {"Identity", "Cast", "CastLike", "Unsqueeze", "Squeeze", "Reshape", "Flatten"}
_DEP_LIST_LIMIT = 64        # element-wise dependence kept for tensors this small (shape vectors)


def _dependence(graph, consts, input_shapes, env) -> dict:
    """Value name -> ``(values, dims)``: what of it depends on the graph inputs. ``values`` is
    False, True or a list of one flag per element; ``dims`` False, True (rank unknown too) or a
    tuple of one flag per axis. ``env``: the main trace's values (for sizes and constant indices)."""
    from .functional import flat_values

    dep = {name: (False, False) for name in consts}
    for vi in graph.inputs:
        if vi.name in consts:
            continue
        if vi.name in input_shapes:
            dims = False
        elif vi.shape is None:
            dims = True
        else:
            dims = tuple(not (isinstance(d, int) and d >= 0) for d in vi.shape)
        dep[vi.name] = (True, dims)

    def any_(f):
        return f is True or (isinstance(f, (list, tuple)) and any(f))

    def tainted(name):
        v, d = dep.get(name, (True, True))
        return any_(v) or any_(d)

    def size(name):
        t = env.get(name)
        return t.size if isinstance(t, Tensor) and t.size <= _DEP_LIST_LIMIT else None

    def as_list(name):
        v = dep.get(name, (True, True))[0]
        if isinstance(v, list):
            return v
        n = size(name)
        return None if n is None else [bool(v)] * n

    def ints(name):
        t = env.get(name)
        if not isinstance(t, Tensor) or t.device == "meta" or tainted(name) or t.size > _DEP_LIST_LIMIT \
                or t.dtype.kind not in "iu":
            return None
        return [int(a) for a in flat_values(t)]

    def attr(node, name, default):
        a = node.attrs.get(name)
        return default if a is None or a.value is None else a.value

    def rule(node, ins):
        """(values, dims) of the node's first output when a shape op is followed element by
        element; None: the generic rule."""
        op = node.op_type
        x = ins[0] if ins else ""
        others_fixed = not any(tainted(n) for n in ins[1:] if n)
        if op == "Shape":
            d = dep.get(x, (True, True))[1]
            if d is True:
                return None
            if d is False:
                return False, False
            r = len(d)
            lo, hi = attr(node, "start", 0), attr(node, "end", r)
            lo, hi = (lo + r if lo < 0 else lo), (hi + r if hi < 0 else hi)
            return list(d[max(0, min(lo, r)):max(0, min(hi, r))]), False
        if op == "Size":
            return [any_(dep.get(x, (True, True))[1])], False
        vals = as_list(x) if x else None
        if op in _DEP_SHAPE_OPS and vals is not None:
            fixed = others_fixed and not any_(dep.get(x, (True, True))[1])
            return vals, (False if fixed else True)
        if op == "Concat":
            parts = [as_list(n) for n in ins]
            t = env.get(x)
            if None in parts or not isinstance(t, Tensor) or t.ndim != 1:
                return None
            fixed = not any(any_(dep.get(n, (True, True))[1]) for n in ins)
            return [f for p in parts for f in p], (False if fixed else True)
        if op == "Gather" and vals is not None and len(ins) > 1 and attr(node, "axis", 0) in (0, -1):
            idx = ints(ins[1])
            t = env.get(x)
            if idx is None or not isinstance(t, Tensor) or t.ndim != 1 or any_(dep[x][1]):
                return None
            n = len(vals)
            if not all(-n <= i < n for i in idx):
                return None
            return [vals[i] for i in idx], False
        if op == "Slice" and vals is not None and len(ins) >= 3 and not any_(dep[x][1]):
            t = env.get(x)
            args = [ints(n) if n else None for n in (ins + ["", ""])[1:5]]
            if not isinstance(t, Tensor) or t.ndim != 1 or args[0] is None or args[1] is None \
                    or len(args[0]) != 1 or len(args[1]) != 1 or (args[3] and len(args[3]) != 1) \
                    or (ins[3:4] and ins[3] and args[2] not in ([0], [-1])):
                return None
            step = args[3][0] if args[3] else 1
            n = len(vals)
            lo, hi = args[0][0], args[1][0]
            if step == 0:
                return None
            return vals[slice(*slice(lo, hi, step).indices(n))], False
        return None

    for node in graph.nodes:
        ins = list(node.inputs)
        reads = _subgraph_reads(_one_node_graph(node))
        if not any(tainted(n) for n in ins if n) and not any(tainted(n) for n in reads):
            for o in node.outputs:
                if o:
                    dep[o] = (False, False)
            continue
        got = rule(node, ins) if not reads and (node.domain or "ai.onnx") in ("ai.onnx", "onnx") else None
        outs = [o for o in node.outputs if o]
        if got is not None and len(outs) == 1:
            dep[outs[0]] = got
            continue
        for o in outs:
            dep[o] = (True, True)
    return dep


def _depends_on_inputs(dep, name) -> bool:
    v, d = dep.get(name, (True, True))
    return any(x is True or (isinstance(x, (list, tuple)) and any(x)) for x in (v, d))


def _same(a, b) -> bool:
    if a is b:
        return True
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        return False
    if a.device == "meta" or b.device == "meta":
        return False
    return a.shape == b.shape and a.dtype is b.dtype and a._bytes() == b._bytes()


def analyze(graph, consts, opsets, device, input_shapes=None, recorder_factory=None, budget=None) -> Analysis:
    """Trace (twice when the inputs have symbolic dims), fold and classify: see the module doc.
    ``budget`` (ember.onnx.budget.Budget, one per load) bounds loop iterations and folded work."""
    input_shapes = input_shapes or {}
    budget = budget if budget is not None else Budget()
    an = Analysis()
    an.input_shapes = dict(input_shapes)
    sizes_a = _symbol_sizes(graph, input_shapes, "a")
    rec_a = recorder_factory() if recorder_factory else None
    reads = {}
    try:
        env_a, ran_a = trace(graph, consts, opsets, device, sizes_a, input_shapes, rec_a, budget=budget,
                             reads=reads)
    except OnnxError:
        if not sizes_a:
            raise
        # Some models only work for one size of a "symbolic" dim (often batch 1, or an exporter
        # baked the example's length into a reshape): try 1, then give up on placeholder sizes
        # and leave every node that depends on a symbolic input to run time (unchecked now; it
        # fails there, as in onnxruntime, if the sizes do not fit).
        sizes_a = _symbol_sizes(graph, input_shapes, "ones")
        rec_a = recorder_factory() if recorder_factory else None
        reads.clear()
        try:
            env_a, ran_a = trace(graph, consts, opsets, device, sizes_a, input_shapes, rec_a, budget=budget,
                                 reads=reads)
        except OnnxError:
            sizes_a = {k: None for k in sizes_a}
            rec_a = recorder_factory() if recorder_factory else None
            reads.clear()
            env_a, ran_a = trace(graph, consts, opsets, device, sizes_a, input_shapes, rec_a, budget=budget,
                                 reads=reads)
            an.notes.append("the graph does not trace with placeholder sizes for its symbolic input dims; "
                            "the nodes that depend on them are checked at run time only")
    an.symbols = sizes_a
    an.trace = env_a
    env_b, rec_b = None, None
    if sizes_a and None not in sizes_a.values():
        sizes_b = {k: v + 1 for k, v in sizes_a.items()}
        rec_b = recorder_factory() if recorder_factory else None
        try:
            env_b, _ = trace(graph, consts, opsets, device, sizes_b, input_shapes, rec_b, reuse=(env_a, ran_a),
                                 budget=budget)
        except (OnnxError, UnsupportedOp):
            env_b = {}
        an.trace_b = env_b

    dep = _dependence(graph, consts, input_shapes, env_a)
    an.dependence = dep

    def is_const(name):
        v = env_a.get(name)
        if not isinstance(v, Tensor) or v.device == "meta" or _depends_on_inputs(dep, name):
            return False
        return env_b is None or _same(v, env_b.get(name))

    for name, v in consts.items():
        an.consts[name] = v
    for node in graph.nodes:
        if node.index in ran_a and all(is_const(n) for n in node.outputs if n):
            for n in node.outputs:
                if n:
                    an.consts[n] = env_a[n]
        else:
            an.plan.append(node)
    # Drop nodes nothing needs (shape subgraphs whose consumers were all folded).
    needed = {vi.name for vi in graph.outputs}
    keep = []
    for node in reversed(an.plan):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(i for i in node.inputs if i)
            needed |= _subgraph_reads(_one_node_graph(node))
    an.plan = keep[::-1]
    if rec_a is not None:
        for node in an.plan:
            ta = rec_a.templates.get(node.index)
            tb = rec_b.templates.get(node.index) if rec_b is not None else ta
            if tb == "reused":
                tb = ta
            # a call that bakes in values read from something that depends on the inputs is
            # right for this trace only, even where both traces happened to give the same text
            baked = any(_depends_on_inputs(dep, n) for n in reads.get(node.index, ()))
            an.templates[node.index] = ta if ta is not None and ta == tb and not baked else None
        an.recorder = rec_a
    return an


# ---- the loaded model ------------------------------------------------------------------------

class Model:
    """A loaded ONNX model. Call it with the graph inputs, positionally or by name::

        y = model(x)                 # one output: a Tensor
        logits, probs = model(x)     # several outputs: a tuple, in graph order
        outs = model.run({"x": x})   # a dict output name -> Tensor

    Inputs may be ember Tensors (moved to the model's device), numpy arrays or nested lists
    (converted to the declared dtype). Declared fixed dimensions are checked (ShapeError).
    """

    def __init__(self, mp, device, base_dir=None, external_data=None, input_shapes=None, compile=True):
        self.device = device
        from ..plan import Compiled
        self._compiled = Compiled(self._execute) if compile else None
        self.notes = []
        g = mp.graph
        self.graph = g
        self.opsets = dict(mp.opset_import)
        if "ai.onnx" not in self.opsets:
            self.opsets["ai.onnx"] = 1 if mp.ir_version < 3 else 0
        if g.sparse_initializers:
            raise UnsupportedOp("ONNX graph: sparse initializers are not supported by ember")
        budget = Budget()
        if mp.functions:
            _inline_functions(mp)
        consts = {}
        for t in g.initializers:
            if t.data_type in (proto.DOUBLE, proto.BFLOAT16):
                self._note(f"initializer {t.name!r}: {proto.DTYPE_NAMES[t.data_type]} read as float32")
            dev = const_device(t.dims, None, device)
            consts[t.name] = tensor_from_proto(t, dev, base_dir, external_data,
                                               what=f"initializer {t.name!r}")
        for vi in list(g.inputs) + list(g.outputs):
            if vi.elem_type in (proto.DOUBLE, proto.BFLOAT16):
                self._note(f"{vi.name!r}: {proto.DTYPE_NAMES[vi.elem_type]} computed as float32")
            elif vi.elem_type in proto.WIDENED:
                self._note(f"{vi.name!r}: {proto.DTYPE_NAMES[vi.elem_type]} held as int32")
            elif vi.elem_type and vi.kind == "tensor":
                proto.ember_dtype(vi.elem_type, f"graph value {vi.name!r}")
        from .fuse import fuse_graph                # rewrites onnxruntime makes too
        fuse_graph(g, consts, protected={vi.name for vi in g.outputs} | _subgraph_reads(g),
                   opset=self.opsets.get("ai.onnx", 13) or 13)
        self.inputs = [vi for vi in g.inputs if vi.name not in consts]
        self.input_names = [vi.name for vi in self.inputs]
        self.output_names = [vi.name for vi in g.outputs]
        self.input_shapes = dict(input_shapes or {})
        an = analyze(g, consts, self.opsets, device, self.input_shapes, budget=budget)
        for msg in an.notes:
            self._note(msg)
        self.analysis = an
        self._consts = an.consts
        self._const_ids = {id(t) for t in an.consts.values()}
        self._moved = {}
        self._folded = {}
        self._plan = an.plan
        from .ops import resolve
        self._handlers = [resolve(n, self.opsets) for n in an.plan]
        produced = set(an.consts) | set(self.input_names) | {o for n in g.nodes for o in n.outputs}
        for name in self.output_names:
            if name not in produced:
                raise OnnxError(f"ONNX graph output {name!r} is not produced by any node, initializer or input")
        # the step after which each intermediate value is dead (freed to save memory)
        last = {}
        for i, n in enumerate(an.plan):
            for name in n.inputs:
                if name:
                    last[name] = i
        keep = set(self.output_names) | _subgraph_reads(g)
        self._free = [[] for _ in an.plan]
        for name, i in last.items():
            if name not in keep and name not in an.consts:
                self._free[i].append(name)

    def _note(self, msg):
        if msg not in self.notes:
            self.notes.append(msg)
            warnings.warn(f"ember.onnx: {msg}", stacklevel=3)

    def __repr__(self):
        return (f"<ember.onnx.Model {self.graph.name!r}: inputs {self.input_names}, outputs "
                f"{self.output_names}, {len(self._plan)} nodes to run on {self.device!r}>")

    def _feed(self, name, value, vi):
        dt = _EMBER_DTYPES.get(vi.elem_type) if vi.elem_type else None
        if value.__class__ is Tensor or isinstance(value, Tensor):
            t = value if value.device == self.device else value.to(self.device)
            if dt is not None and t.dtype is not dt:
                raise DTypeError(f"ONNX model input {name!r}: expected {dt.name}, got {t.dtype.name}; "
                                 f"cast it with .astype(ember.{dt.name})")
        elif hasattr(value, "__array_interface__") and hasattr(value, "dtype") and hasattr(value, "tobytes"):
            t = _from_numpy(value, device=self.device, dtype=dt)    # (what ember.tensor does with it)
        else:
            t = _tensor(value, dtype=dt, device=self.device)
        shape = self.input_shapes.get(name, vi.shape)
        if shape is not None:
            # declared fixed dimensions must match (symbolic and negative ones match anything)
            ts = t.shape
            ok = len(shape) == len(ts)
            if ok:
                for d, n in zip(shape, ts):
                    if d != n and isinstance(d, int) and d >= 0:
                        ok = False
                        break
            if not ok:
                shown = tuple(d if isinstance(d, int) else (d or "?") for d in shape)
                raise ShapeError(f"ONNX model input {name!r}: expected shape {shown}, got {t.shape}")
        if vi.elem_type in proto.WIDENED:            # an int8/int16/uint16 input, held as int32
            from .quant import tag_narrow
            tag_narrow(t, vi.elem_type)
        return t

    def run(self, feeds: dict) -> dict:
        """Run the model on ``feeds`` (input name -> value); returns output name -> Tensor."""
        names = self.input_names
        if len(feeds) != len(names) or any(n not in feeds for n in names):
            missing = [n for n in names if n not in feeds]
            if missing:
                raise OnnxError(f"ONNX model: missing input(s) {missing}; the model takes {names}")
            extra = [n for n in feeds if n not in names]
            if extra:
                raise OnnxError(f"ONNX model: unknown input(s) {extra}; the model takes {names}")
        feed = self._feed
        return self._run_fed(tuple([feed(vi.name, feeds[vi.name], vi) for vi in self.inputs]))

    def _run_fed(self, tensors: tuple) -> dict:
        if self._compiled is not None:   # replay the plan recorded for this input signature
            try:
                return self._compiled(*tensors)
            except EmberError as e:
                if str(e).startswith("ONNX node "):
                    raise
                # A kernel refused these values while replaying the plan (an index out of range):
                # run node by node to say which node it was.
                return self._execute(*tensors)
        return self._execute(*tensors)

    def stats(self) -> dict:
        """Execution-plan statistics (``ember.plan.Compiled.stats``): replays, captures, and
        for each input signature that runs eagerly, why. Empty when loaded with compile=False."""
        return self._compiled.stats() if self._compiled is not None else {}

    def _execute(self, *tensors) -> dict:
        """Run the graph node by node on the fed input tensors (what a plan records)."""
        env = dict(self._consts)
        for vi, t in zip(self.inputs, tensors):
            env[vi.name] = t
        budget = Budget()       # one per call: Loop/Scan iterations, nested loops included
        for step, (node, (handler, opset)) in enumerate(zip(self._plan, self._handlers)):
            ctx = RunCtx(node, opset, self.device, self)
            ctx.scope = env
            ctx.opsets = self.opsets
            ctx.budget = budget
            try:
                ins = [env[n] if n else None for n in node.inputs]
            except KeyError as e:
                raise OnnxError(f"ONNX node {node.label} ({node.op_type}): input {e.args[0]!r} is not "
                                f"produced by any earlier node, initializer or graph input") from None
            outs = run_checked(handler, ctx, ins)
            for name, v in zip(node.outputs, outs):
                if name:
                    env[name] = v
            for name in self._free[step]:
                env.pop(name, None)
        out = {}
        for name in self.output_names:
            v = env.get(name)
            if not isinstance(v, Tensor):
                raise OnnxError(f"ONNX graph output {name!r} is not produced (got {type(v).__name__})")
            out[name] = v if v.device == self.device else v.to(self.device)
        return out

    def __call__(self, *args, **kwargs):
        names = self.input_names
        if len(args) > len(names):
            raise OnnxError(f"ONNX model takes {len(names)} inputs {names}, got {len(args)}")
        if not kwargs and len(args) == len(names):
            # every input once, by position: nothing missing or unknown to look for
            feed = self._feed
            out = self._run_fed(tuple([feed(vi.name, v, vi) for vi, v in zip(self.inputs, args)]))
        else:
            feeds = dict(zip(names, args))
            for k, v in kwargs.items():
                if k in feeds:
                    raise OnnxError(f"ONNX model: input {k!r} given twice")
                feeds[k] = v
            out = self.run(feeds)
        outs = self.output_names
        if len(outs) == 1:
            return out[outs[0]]
        return tuple([out[n] for n in outs])


def _one_node_graph(node):
    g = proto.Graph()
    g.nodes = [node]
    return g


def _subgraph_reads(g) -> set:
    """Every value name read inside If/Loop/Scan bodies (they see the enclosing graph)."""
    out = set()
    for n in g.nodes:
        for a in n.attrs.values():
            graphs = [a.value] if isinstance(a.value, proto.Graph) else \
                [x for x in a.value if isinstance(x, proto.Graph)] if isinstance(a.value, list) else []
            for sg in graphs:
                for m in sg.nodes:
                    out.update(i for i in m.inputs if i)
                out |= _subgraph_reads(sg)
    return out


def _inline_functions(mp):
    """Replace calls of model-local functions (FunctionProto) by their bodies."""
    from .proto import Node
    funcs = {(f.domain, f.name): f for f in mp.functions}
    for f in mp.functions:
        for d, v in f.opset_import.items():
            key = "ai.onnx" if d == "" else d
            mp.opset_import.setdefault(key, v)
    counter = [0]
    from .budget import node_limit
    limit = node_limit(len(mp.graph.nodes) + sum(len(f.nodes) for f in mp.functions))
    made = [0]

    def expand(nodes, depth):
        if depth > 16:
            raise OnnxError("ONNX model: model-local functions nested deeper than 16 (recursive?)")
        out = []
        for n in nodes:
            f = funcs.get((n.domain, n.op_type))
            if f is None:
                out.append(n)
                continue
            counter[0] += 1
            made[0] += len(f.nodes)
            if made[0] > limit:
                raise OnnxError(f"ONNX model: inlining model-local function {f.name!r} (domain {f.domain!r}, called "
                                f"by node {n.label}) would make more than {limit:,} nodes (functions calling "
                                f"each other several times per level); refused. ember.onnx.set_limits("
                                f"inlined_nodes=N) raises the limit")
            prefix = f"__{f.name}_{counter[0]}__"
            ren = {}
            for formal, actual in zip(f.inputs, n.inputs):
                ren[formal] = actual
            for formal in f.inputs[len(n.inputs):]:
                ren[formal] = ""
            for formal, actual in zip(f.outputs, n.outputs):
                ren[formal] = actual
            attrs = dict(f.attribute_defaults)
            attrs.update(n.attrs)
            body = []
            for b in f.nodes:
                c = Node()
                c.op_type, c.domain, c.index = b.op_type, b.domain, b.index
                c.name = prefix + (b.name or str(b.index))
                c.inputs = [ren.get(x, prefix + x) if x else "" for x in b.inputs]
                c.outputs = [ren.get(x, prefix + x) if x else "" for x in b.outputs]
                c.attrs = {}
                for k, a in b.attrs.items():
                    if a.ref_attr_name:
                        if a.ref_attr_name in attrs:
                            r = attrs[a.ref_attr_name]
                            c.attrs[k] = proto.Attribute(k, r.type, r.value)
                    else:
                        c.attrs[k] = a
                body.append(c)
            out.extend(expand(body, depth + 1))
        return out

    nodes = expand(mp.graph.nodes, 0)
    for i, n in enumerate(nodes):
        n.index = i
    mp.graph.nodes = nodes


class _Standalone:
    """Stands in for a Model when one node runs on its own (generated code's onnxf.node)."""

    def __init__(self):
        self._const_ids = set()
        self._moved = {}
        self._folded = {}


def _attribute(name, value):
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return proto.Attribute(name, proto.A_INT, value)
    if isinstance(value, float):
        return proto.Attribute(name, proto.A_FLOAT, value)
    if isinstance(value, str):
        return proto.Attribute(name, proto.A_STRING, value)
    if isinstance(value, Tensor):
        return proto.Attribute(name, proto.A_TENSOR, value)
    if isinstance(value, (list, tuple)):
        value = list(value)
        if all(isinstance(v, int) for v in value):
            return proto.Attribute(name, proto.A_INTS, value)
        if all(isinstance(v, (int, float)) for v in value):
            return proto.Attribute(name, proto.A_FLOATS, [float(v) for v in value])
        if all(isinstance(v, str) for v in value):
            return proto.Attribute(name, proto.A_STRINGS, value)
    raise OnnxError(f"attribute {name!r}: cannot use a {type(value).__name__} as an ONNX attribute")


def run_node(op_type: str, inputs, attrs: dict, opset: int, outputs: int = 1):
    """Run one ONNX operator on tensors (what generated code's ``onnxf.node`` calls); returns a
    Tensor, or a tuple when ``outputs > 1``."""
    from .ops import resolve
    from .proto import Node

    node = Node()
    node.op_type = op_type
    node.name = f"{op_type} (generated code)"
    node.inputs = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node.outputs = [f"out{i}" for i in range(outputs)]
    node.attrs = {k: _attribute(k, v) for k, v in attrs.items()}
    handler, opset = resolve(node, {"ai.onnx": opset})
    devs = [t.device for t in inputs if isinstance(t, Tensor) and t.device != HOST]
    ctx = RunCtx(node, opset, devs[0] if devs else default_device(), _Standalone())
    out = run_handler(handler, ctx, list(inputs))
    return out[0] if outputs == 1 else tuple(out)


def read_model(model) -> tuple:
    """``(bytes, folder or None, stem)`` of a model given as a path or as bytes."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise OnnxError(f"ONNX model file {path!r} does not exist")
        with open(path, "rb") as fh:
            data = fh.read()
        return data, os.path.dirname(os.path.abspath(path)), os.path.splitext(os.path.basename(path))[0]
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), None, "model"
    raise TypeError(f"ember.onnx: expected a path or bytes, got {type(model).__name__}")


def load(model, device: str | None = None, *, base_dir=None, external_data=None,
         input_shapes: dict | None = None, compile: bool = True) -> Model:
    """Load an ONNX model (a path, or the file's bytes) for ``device`` and return a callable
    ``Model``. Needs neither the ``onnx`` package nor numpy.

    - ``base_dir``: folder of the external-data files when ``model`` is bytes (a path's folder
      is used otherwise); ``external_data``: ``{location: bytes}`` to give them directly (in the
      browser, fetched files).
    - ``input_shapes``: ``{input name: shape}`` fixes symbolic input dims (more folding).
    - ``compile``: record an execution plan on the first call for each input signature and
      replay it afterwards (``ember.compile``; on by default). Graphs whose Python-side work
      depends on tensor values (If/Loop on computed conditions) run eagerly for that
      signature; ``model.stats()`` says why.

    Raises ``UnsupportedOp`` (naming op, opset, node and what is missing) or ``OnnxError``
    (malformed file or graph) here, at load time.
    """
    device = device or default_device()
    get_backend(device)
    data, folder, _ = read_model(model)
    mp = proto.parse_model(data)
    base_dir = folder if base_dir is None else base_dir
    return Model(mp, device, base_dir=base_dir, external_data=external_data, input_shapes=input_shapes,
                 compile=compile)
